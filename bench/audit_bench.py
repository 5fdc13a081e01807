"""Do audits measure what substitution costs? Audit estimate vs teacher-forced perplexity.

On held-out verse (the end of tinyshakespeare, outside the demo model's training split) and
held-out Python (``shutil.py`` of this interpreter's stdlib: the demo model was trained on
``__future__.py`` ... ``pprint.py``), every policy and budget scores the same windows
teacher-forced, one token at a time, each window from an empty cache. In the same run every
Nth step is audited (exact pass into scratch slots, its KV cell removed, then the policy's
pass), so both numbers come from one decode of the text:

- the *audit estimate*: ``exp(mean KL(exact || policy)) - 1`` over the audited steps, with
  the t interval the window shows;
- ``moescope eval``'s *perplexity change*: policy NLL against Exact's on every token, with
  a bootstrap interval over blocks of 64 tokens (``evaluate.change_interval``).

Then Pearson r across the policy x text (x budget) points, and the decode overhead of audits
at N = 16 and 32 against off (generation, median of reps, interleaved).

    .venv/bin/python bench/audit_bench.py --windows 2 --budgets 25%,50% --every 4
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import sysconfig
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

VERSE = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
PYTHON = Path(sysconfig.get_paths()["stdlib"]) / "shutil.py"
POLICIES = "quality-first,speed-first,cache-prior,psr"


def windows(tokens: list[int], count: int, length: int) -> list[list[int]]:
    """``count`` non-overlapping windows of ``length`` tokens from the end of ``tokens``."""
    usable = min(count, len(tokens) // length)
    start = len(tokens) - usable * length
    return [tokens[start + i * length:start + (i + 1) * length] for i in range(usable)]


def forced_run(engine: Any, tokens: list[int], policy: Any, budget: str,
               every: int, totals: Any = None) -> tuple[np.ndarray, list[Any], float]:
    """Teacher-force ``tokens`` under ``policy`` from an empty cache (as ``run_one``):
    per-token NLL of ``tokens[1:]``, the audits of every ``every``-th step, seconds.

    ``policy`` may be the quality guard (a ``GuardSpec``): then audits run at its own
    period and its controller moves the policy between tokens, as the engine does while
    generating. ``totals`` (a ``CacheTotals``), when given, adds up the run's rows."""
    from llama_cpp import llama_cpp as low

    from moescope.cache.audit import compare
    from moescope.cache.guard import GuardController, GuardSpec
    from moescope.cache.totals import CacheTotals
    from moescope.engine import bindings
    from moescope.engine.evaluate import _nll

    guard = None
    if isinstance(policy, GuardSpec):
        guard = GuardController(policy)
        every, policy = policy.every, guard.policy
    engine.set_budget(budget)
    engine.set_policy(policy)
    engine.set_audit(every)
    engine.cache.clear()
    llm = engine._llm
    llm.reset()
    llm._ctx.kv_cache_clear()
    n_vocab = llm.n_vocab()
    engine.drain_events()
    nll = np.zeros(len(tokens) - 1)
    audits = []
    t0 = time.perf_counter()
    for i, tok in enumerate(tokens[:-1]):
        exact = None
        if every and i > 0 and i % every == 0:  # i = 0 follows an empty cache: all misses
            exact = bindings.audit_decode(llm, int(tok), int(llm.n_tokens))
        llm.eval([int(tok)])
        logits = np.ctypeslib.as_array(low.llama_get_logits_ith(engine._ctx, -1),
                                       shape=(n_vocab,))
        rows = engine.drain_events()
        nll[i] = _nll(logits, int(tokens[i + 1]))
        if totals is not None:
            totals.add(CacheTotals.from_events(rows, tokens=1))
        if exact is not None:
            mass = float(rows["substituted_mass"].astype(np.float64).sum())
            audits.append(compare(exact, logits, int(tokens[i + 1]), mass))
            new = guard.observe(audits[-1].kl) if guard is not None else None
            if new is not None:
                engine.set_policy(new)  # from the next token, as the engine does
    engine.set_audit(0)
    return nll, audits, time.perf_counter() - t0


def overhead(engine: Any, tokens: list[int], budget: str, policy: str,
             reps: int) -> dict[int, float]:
    """Median decode tokens/s of teacher-forced decoding of ``tokens`` (a fixed count,
    unlike generation, which may end early) with audits off, every 32 and every 16,
    interleaved."""
    from moescope.cache.policy import Policy

    speeds: dict[int, list[float]] = {0: [], 32: [], 16: []}
    for _ in range(reps):
        for every in speeds:
            _, _, seconds = forced_run(engine, tokens, Policy.preset(policy), budget, every)
            speeds[every].append((len(tokens) - 1) / seconds)
    return {k: statistics.median(v) for k, v in speeds.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: demo model)")
    parser.add_argument("--verse", type=Path, default=VERSE)
    parser.add_argument("--python", type=Path, default=PYTHON)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--budgets", default="25%")
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--every", type=int, default=4, help="audit period for the estimate")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reps", type=int, default=3, help="overhead: reps per variant")
    parser.add_argument("--skip-overhead", action="store_true")
    parser.add_argument("--only-overhead", action="store_true")
    args = parser.parse_args()

    from moescope.cache.audit import AuditEstimate
    from moescope.cache.guard import GuardSpec, parse_guard
    from moescope.cache.policy import Policy
    from moescope.cache.totals import CacheTotals
    from moescope.engine import Engine
    from moescope.engine.evaluate import change_interval, pearson
    from moescope.sim.sweep import parse_policy
    from moescope.util.resources import demo_model_path

    model = args.model or demo_model_path()
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    policies = [parse_guard(p) or parse_policy(p) or Policy.preset("exact")
                for p in args.policies.split(",") if p.strip()]
    engine = Engine()
    engine.load(model, budget=budgets[0], policy="exact", n_threads=args.threads)
    length = engine.n_ctx if engine.n_ctx <= 512 else 512
    texts = {
        "verse": args.verse.read_text(encoding="utf-8")[-60_000:],
        "python": args.python.read_text(encoding="utf-8"),
    }
    print(f"{model.name}: {args.windows} windows x {length - 1} tokens per text, audits "
          f"every {args.every}, threads {args.threads}", file=sys.stderr)
    print("| text | policy | budget | eval Δppl [95% CI] | audit estimate [95% CI] | "
          "audits | greedy differs | mass/tok | fetched MB/tok (waited) |")
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    points: list[tuple[float, float]] = []
    for name, text in ({} if args.only_overhead else texts).items():
        chunks = windows(engine.tokenize(text[text.find("\n") + 1:]), args.windows, length)
        for budget in budgets:
            base = np.concatenate([forced_run(engine, c, Policy.preset("exact"), budget, 0)[0]
                                   for c in chunks])
            for policy in policies:
                nll_parts, audits = [], []
                totals = CacheTotals()
                for chunk in chunks:
                    nll, aud, _ = forced_run(engine, chunk, policy, budget, args.every, totals)
                    nll_parts.append(nll)
                    audits += aud
                nll = np.concatenate(nll_parts)
                change, lo, hi = change_interval(nll, base, block=64)
                est = AuditEstimate.from_records(audits)
                assert est is not None
                points.append((change, 100 * est.cost))
                label = (f"guard {100 * policy.target:g}% ({policy.base})"
                         if isinstance(policy, GuardSpec) else policy.name)
                n = max(1, totals.tokens)
                print(f"| {name} | {label} | {budget} | {change:+.2f}% [{lo:+.2f}, "
                      f"{hi:+.2f}] | +{100 * est.cost:.2f}% [{100 * est.low:.2f}, "
                      f"{100 * est.high:.2f}] | {est.n} | {est.greedy_differs} | "
                      f"{est.mean_mass:.3f} | "
                      f"{(totals.bytes_sync + totals.bytes_async) / n / 1e6:.3f} "
                      f"({totals.bytes_sync / n / 1e6:.3f}) |", flush=True)
    if points:
        xs, ys = zip(*points, strict=True)
        r = pearson(xs, ys)
        print(f"\nPearson r (eval Δppl vs audit estimate) over {len(points)} points: "
              f"{r:.3f}" if not math.isnan(r) else "\nPearson r: undefined")
    if not args.skip_overhead:
        chunk = windows(engine.tokenize(texts["verse"]), 1, length)[0]
        speeds = overhead(engine, chunk, budgets[0], "quality-first", args.reps)
        print(f"\nDecode speed, teacher-forced, quality-first @ {budgets[0]}, "
              f"{length - 1} tokens, median of {args.reps}: " + ", ".join(
                  f"{'off' if k == 0 else f'N={k}'} {v:.1f} tok/s"
                  + (f" ({v / speeds[0]:.2f}x)" if k else "") for k, v in speeds.items()))
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
