"""Do audits measure what substitution costs? Audit estimate vs teacher-forced perplexity.

On held-out verse (the end of tinyshakespeare, outside the demo model's training split) and
held-out Python (``shutil.py`` of this interpreter's stdlib: the demo model was trained on
``__future__.py`` ... ``pprint.py``), every policy and budget scores the same windows
teacher-forced, one token at a time, each window from an empty cache. In the same run every
Nth step is audited (exact pass into scratch slots, its KV cell removed, then the policy's
pass), so both numbers come from one decode of the text:

- the *audit estimate* that matches teacher-forced text (``AuditEstimate.matched``, the
  tokens being given): ``exp(mean(log p_exact(x) - log p_policy(x))) - 1`` of the text's
  next tokens over the audited steps, with its t interval; beside it the *KL estimate*
  ``exp(mean KL(exact || policy)) - 1``, what the window shows for the model's own answers;
- ``moescope eval``'s *perplexity change*: policy NLL against Exact's on every token, with
  a bootstrap interval over blocks of 64 tokens (``evaluate.change_interval``).

Then agreement and Pearson r across the policy x text (x budget) points, and the decode
overhead of audits at N = 16 and 32 against off (teacher-forced, median of reps,
interleaved).

    .venv/bin/python bench/audit_bench.py --windows 16 --budgets 25%,50% --every 4 --sampled
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
               every: int, totals: Any = None, steps: list[int] | None = None,
               step_seconds: list[tuple[float, bool]] | None = None
               ) -> tuple[np.ndarray, list[Any], float]:
    """Teacher-force ``tokens`` under ``policy`` from an empty cache (as ``run_one``, through
    the same ``evaluate.forced_steps``): per-token NLL of ``tokens[1:]``, the audits of
    every ``every``-th step (their tokens given: ``AuditRecord.given``), seconds.

    ``policy`` may be the quality guard (a ``GuardSpec``): then audits run at its own
    period and its controller moves the policy between tokens, as the engine does while
    generating (from the audited KL, as there). ``totals`` (a ``CacheTotals``), when given,
    adds up the run's rows; ``steps``, when given, gets the index into the NLL array of
    each audit; ``step_seconds``, when given, each step's seconds (its audit and the
    audit's comparison included) and whether it was audited."""
    from moescope.cache.audit import compare
    from moescope.cache.guard import GuardController, GuardSpec
    from moescope.cache.totals import CacheTotals
    from moescope.engine.evaluate import _nll, forced_steps

    guard = None
    if isinstance(policy, GuardSpec):
        guard = GuardController(policy)
        every, policy = policy.every, guard.policy
    engine.set_budget(budget)
    engine.set_policy(policy)
    engine.set_audit(every)
    engine.cache.clear()
    nll = np.zeros(len(tokens) - 1)
    audits = []
    t0 = last = time.perf_counter()
    for i, logits, rows, _dt, exact in forced_steps(engine, tokens[:-1], audit_every=every):
        nll[i] = _nll(logits, int(tokens[i + 1]))
        if totals is not None:
            totals.add(CacheTotals.from_events(rows, tokens=1))
        if exact is not None:
            mass = float(rows["substituted_mass"].astype(np.float64).sum())
            audits.append(compare(exact, logits, int(tokens[i + 1]), mass, given=True))
            if steps is not None:
                steps.append(i)
            new = guard.observe(audits[-1].kl) if guard is not None else None
            if new is not None:
                engine.set_policy(new)  # from the next token, as the engine does
        if step_seconds is not None:
            now = time.perf_counter()
            step_seconds.append((now - last, exact is not None))
            last = now
    engine.set_audit(0)
    return nll, audits, time.perf_counter() - t0


def sampled(engine: Any, prompts: list[list[int]], length: int, seed: int
            ) -> list[list[int]]:
    """Text from the exact model itself: each prompt continued to ``length`` tokens by
    sampling Exact's next-token distribution at temperature 1 (numpy, fixed seed). On such
    text KL(exact || policy) is by definition the expected teacher-forced NLL change of a
    step, so it separates what the audit measures from how a held-out text departs from
    the model."""
    from llama_cpp import llama_cpp as low

    from moescope.cache.audit import _log_softmax
    from moescope.cache.policy import Policy

    rng = np.random.default_rng(seed)
    engine.set_policy(Policy.preset("exact"))
    engine.set_audit(0)
    llm = engine._llm
    n_vocab = llm.n_vocab()
    out = []
    for prompt in prompts:
        engine.cache.clear()
        llm.reset()
        llm._ctx.kv_cache_clear()
        toks = list(prompt)
        llm.eval([int(t) for t in toks])
        while len(toks) < length:
            logits = np.ctypeslib.as_array(low.llama_get_logits_ith(engine._ctx, -1),
                                           shape=(n_vocab,))
            p = np.exp(_log_softmax(logits))
            toks.append(int(rng.choice(n_vocab, p=p / p.sum())))
            llm.eval([toks[-1]])
        engine.drain_events()
        out.append(toks)
    return out


def _mean_ci(values: np.ndarray) -> str:
    """``+1.23% [0.45, 2.01]``: exp(mean) - 1 with the 95% t interval of the mean."""
    from moescope.cache.audit import t_quantile

    mean = float(values.mean())
    half = t_quantile(0.975, values.size - 1) * float(values.std(ddof=1)) / math.sqrt(
        values.size) if values.size >= 2 else 0.0
    return (f"{100 * math.expm1(mean):+.2f}% [{100 * math.expm1(mean - half):+.2f}, "
            f"{100 * math.expm1(mean + half):+.2f}]")


def decompose(name: str, label: str, budget: str, audits: list[Any], steps: list[int],
              nll: np.ndarray, base: np.ndarray) -> str:
    """Where the audit and eval part, on the audited steps: eval's per-token change
    ``(nll - base)[s]`` = step (``logp_exact - logp_policy`` of the text's token, both
    given the policy's KV: the measured estimate's terms) + drift (Exact's log-probability
    on its own KV minus on the policy's). The step term's expectation under the exact
    output is the KL; on real text it differs by how the text departs from the model's own
    distribution."""
    step = np.array([a.log_ratio for a in audits])
    ev = (nll - base)[np.array(steps, dtype=np.int64)]
    return (f"| {name} | {label} | {budget} | {_mean_ci(step)} | "
            f"{_mean_ci(ev)} | {_mean_ci(ev - step)} |")


def _interval(c: Any) -> str:
    """``+1.23% [+0.45, +2.01]`` from a ``CostInterval``."""
    return f"{100 * c.cost:+.2f}% [{100 * c.low:+.2f}, {100 * c.high:+.2f}]"


def _agree(change: float, lo: float, hi: float, c: Any) -> str:
    """``both``: each estimate inside the other's interval; ``overlap``; ``no``."""
    a_lo, a_mid, a_hi = 100 * c.low, 100 * c.cost, 100 * c.high
    if lo <= a_mid <= hi and a_lo <= change <= a_hi:
        return "both"
    return "overlap" if max(lo, a_lo) <= min(hi, a_hi) else "no"


def overhead(engine: Any, tokens: list[int], budget: str, policy: str,
             reps: int) -> dict[int, tuple[float, float, float, float, float]]:
    """Teacher-forced decoding of ``tokens`` (a fixed count, unlike generation, which may
    end early) with audits off, every 32 and every 16, interleaved, ``reps`` times:
    ``{N: (median tokens/s over the reps, median ms of a plain step, of an audited step,
    mean ms of a plain step, of an audited step)}``. The per-step medians shrug off the
    other jobs of a shared machine, which a whole run's rate does not; the means say
    whether audits have a tail the medians miss."""
    from moescope.cache.policy import Policy

    speeds: dict[int, list[float]] = {0: [], 32: [], 16: []}
    steps: dict[int, list[tuple[float, bool]]] = {k: [] for k in speeds}
    for _ in range(reps):
        for every in speeds:
            _, _, seconds = forced_run(engine, tokens, Policy.preset(policy), budget, every,
                                       step_seconds=steps[every])
            speeds[every].append((len(tokens) - 1) / seconds)

    def ms(every: int, audited: bool, how: Any = statistics.median) -> float:
        picked = [dt for dt, a in steps[every] if a == audited]
        return 1e3 * how(picked) if picked else float("nan")

    return {k: (statistics.median(v), ms(k, False), ms(k, True),
                ms(k, False, statistics.fmean), ms(k, True, statistics.fmean))
            for k, v in speeds.items()}


def audit_parts(engine: Any, tokens: list[int], budget: str, policy: str, every: int,
                reps: int) -> dict[str, float]:
    """Median ms of each part of a teacher-forced step, audited or not, over ``reps`` runs:
    the loop of ``evaluate.forced_steps`` plus ``compare``, with a clock around each call,
    to see whether an audit costs more than its extra decode."""
    from llama_cpp import llama_cpp as low

    from moescope.cache.audit import compare
    from moescope.cache.policy import Policy
    from moescope.engine import bindings

    parts: dict[str, list[float]] = {}

    def clock(name: str, t0: float) -> float:
        now = time.perf_counter()
        parts.setdefault(name, []).append(now - t0)
        return now

    llm = engine._llm
    n_vocab = llm.n_vocab()
    for _ in range(reps):
        engine.set_budget(budget)
        engine.set_policy(Policy.preset(policy))
        engine.set_audit(every)
        engine.cache.clear()
        llm.reset()
        llm._ctx.kv_cache_clear()
        engine.drain_events()
        for i, tok in enumerate(tokens[:-1]):
            audited = i > 0 and i % every == 0
            t = time.perf_counter()
            exact = None
            if audited:
                exact = bindings.audit_decode(llm, int(tok), int(llm.n_tokens))
                t = clock("audit pass (bindings.audit_decode)", t)
            llm.eval([int(tok)])
            t = clock("policy pass (Llama.eval)" + (", after an audit" if audited else ""), t)
            logits = np.ctypeslib.as_array(low.llama_get_logits_ith(engine._ctx, -1),
                                           shape=(n_vocab,))
            rows = engine.drain_events()
            t = clock("logits and event rows", t)
            if exact is not None:
                compare(exact, logits, int(tokens[i + 1]),
                        float(rows["substituted_mass"].sum()), given=True)
                clock(f"compare (KL and log-probabilities, {n_vocab} tokens)", t)
    engine.set_audit(0)
    return {k: 1e3 * statistics.median(v) for k, v in parts.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: demo model)")
    parser.add_argument("--verse", type=Path, default=VERSE)
    parser.add_argument("--python", type=Path, default=PYTHON)
    parser.add_argument("--windows", type=int, default=2)
    parser.add_argument("--budgets", default="25%")
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--sampled", action="store_true",
                        help="also score text sampled from the exact model (prompted with "
                        "each verse window's first 32 tokens)")
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
    print("| text | policy | budget | eval Δppl [95% CI] | audit, matched [95% CI] | agree "
          "| KL estimate [95% CI] | agree (KL) | greedy differs | mass/tok "
          "| fetched MB/tok (waited) |")
    print("|---|---|---|---|---|---|---|---|---:|---:|---:|")
    points: dict[str, list[tuple[float, float, float]]] = {}
    decomposed: list[str] = []
    agree: dict[str, int] = {}
    agree_kl: dict[str, int] = {}
    n_audits = 0
    corpora = {name: windows(engine.tokenize(text[text.find("\n") + 1:]), args.windows,
                             length) for name, text in texts.items()}
    if args.sampled:
        corpora["sampled"] = sampled(engine, [c[:32] for c in corpora["verse"]], length, 0)
    for name, chunks in ({} if args.only_overhead else corpora).items():
        for budget in budgets:
            base = np.concatenate([forced_run(engine, c, Policy.preset("exact"), budget, 0)[0]
                                   for c in chunks])
            for policy in policies:
                nll_parts, audits, steps = [], [], []
                totals = CacheTotals()
                offset = 0
                for chunk in chunks:
                    at: list[int] = []
                    nll, aud, _ = forced_run(engine, chunk, policy, budget, args.every, totals,
                                             at)
                    nll_parts.append(nll)
                    audits += aud
                    steps += [offset + i for i in at]
                    offset += len(nll)
                nll = np.concatenate(nll_parts)
                change, lo, hi = change_interval(nll, base, block=64)
                est = AuditEstimate.from_records(audits)
                assert est is not None and est.source == "given"
                n_audits = est.n
                points.setdefault(name, []).append(
                    (change, 100 * est.cost, 100 * est.kl.cost))
                matched = _agree(change, lo, hi, est.matched)
                with_kl = _agree(change, lo, hi, est.kl)
                agree[matched] = agree.get(matched, 0) + 1
                agree_kl[with_kl] = agree_kl.get(with_kl, 0) + 1
                label = (f"guard {100 * policy.target:g}% ({policy.base})"
                         if isinstance(policy, GuardSpec) else policy.name)
                n = max(1, totals.tokens)
                print(f"| {name} | {label} | {budget} | {change:+.2f}% [{lo:+.2f}, "
                      f"{hi:+.2f}] | {_interval(est.matched)} | {matched} | "
                      f"{_interval(est.kl)} | {with_kl} | {est.greedy_differs} | "
                      f"{est.mean_mass:.3f} | "
                      f"{(totals.bytes_sync + totals.bytes_async) / n / 1e6:.3f} "
                      f"({totals.bytes_sync / n / 1e6:.3f}) |", flush=True)
                decomposed.append(decompose(name, label, budget, audits, steps, nll, base))
    if points:
        every_point = [p for ps in points.values() for p in ps]

        def r_text(ps: list[tuple[float, float, float]], k: int) -> str:
            r = pearson([p[0] for p in ps], [p[k] for p in ps])
            return "undefined" if math.isnan(r) else f"{r:.3f}"

        print(f"\n{n_audits} audits per point (the audited tokens are the text's: the "
              "matched estimate is the measured one, exp(mean(log p_exact - log p_policy)) "
              "- 1).")
        for k, what in ((1, "matched audit estimate"), (2, "KL estimate")):
            print(f"Pearson r (eval Δppl vs {what}): {r_text(every_point, k)} over all "
                  f"{len(every_point)} points; " + ", ".join(
                      f"{name} {r_text(ps, k)}" for name, ps in points.items()))
        for what, counts in (("matched", agree), ("KL", agree_kl)):
            print(f"Agreement ({what}): " + ", ".join(
                f"{k} {counts.get(k, 0)}" for k in ("both", "overlap", "no"))
                + f" of {len(every_point)}")
        print("\nOn the audited steps only (each as exp(mean) - 1, %, 95% t interval): the "
              "step's own NLL change on the text's token, given the policy's past "
              "(log p_exact - log p_policy of the true next token, same two passes: the "
              "matched estimate); eval's NLL change on the same steps; drift = eval - step "
              "(Exact's own output on its own KV against on the policy's KV).\n")
        print("| text | policy | budget | step Δ on text (matched) | eval Δ, same steps "
              "| drift |")
        print("|---|---|---|---|---|---|")
        print("\n".join(decomposed))
    if not args.skip_overhead:
        chunk = windows(engine.tokenize(texts["verse"]), 1, length)[0]
        speeds = overhead(engine, chunk, budgets[0], "quality-first", args.reps)
        off, plain, *_ = speeds[0]
        print(f"\nDecode speed, teacher-forced, quality-first @ {budgets[0]}, "
              f"{length - 1} tokens, median of {args.reps}: " + ", ".join(
                  f"{'off' if k == 0 else f'N={k}'} {v:.1f} tok/s"
                  + (f" ({v / off:.2f}x)" if k else "") for k, (v, *_) in speeds.items()))
        print("Median step: " + ", ".join(
            f"{'off' if k == 0 else f'N={k}'} {p:.3f} ms"
            + (f", audited {a:.3f} ms (an audit +{a - p:.3f} ms = "
               f"{(a - p) / plain:.2f} steps off)" if k else "")
            for k, (_, p, a, *_) in speeds.items()))
        print("Mean step: " + ", ".join(
            f"{'off' if k == 0 else f'N={k}'} {p:.3f} ms" + (f", audited {a:.3f} ms" if k else "")
            for k, (*_, p, a) in speeds.items()))
        parts = audit_parts(engine, chunk, budgets[0], "quality-first", 16, args.reps)
        print(f"Parts of a step, audits every 16, median of {args.reps} runs: " + ", ".join(
            f"{k} {v:.3f} ms" for k, v in parts.items()))
    engine.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
