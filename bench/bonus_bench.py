"""How large may Cache-Prior's routing bonus be? Perplexity and waits across many windows.

The routing bonus (paper 2) trades quality for fewer waits, and how much depends on the
model: calibrate it on yours. Every policy scores the same held-out windows of text
(teacher-forced, one token at a time so the cache governs each, each window from an empty
cache); the table pools the windows: perplexity change against Exact with a bootstrap 95%
interval over windows (so the noise of one window does not pass for an effect), the share
of expert calls substituted, and the bytes copied on the critical path per token.

    .venv/bin/python bench/bonus_bench.py --windows 12 --budgets 25%,50%
    .venv/bin/python bench/bonus_bench.py --model Qwen3-Next-80B-A3B-Q4_K_M.gguf \
        --text my_notes.txt --windows 4 --budgets 25%

Bonuses are in gate-weight units (the units of θ): ``cache-prior:bonus=0.1`` lets a
resident expert take a miss's place when its gate weight would be within 0.1 of the miss's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

DEFAULT_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
POLICIES = ("exact,quality-first,cache-prior:bonus=0.05,cache-prior:bonus=0.1,"
            "cache-prior:bonus=0.15,cache-prior:bonus=0.2,cache-prior:bonus=0.3,"
            "psr:bonus=0.1,psr:bonus=0.2")


def windows(tokens: list[int], count: int, length: int) -> list[list[int]]:
    """``count`` non-overlapping windows of ``length`` tokens from the end of ``tokens``."""
    usable = min(count, len(tokens) // length)
    start = len(tokens) - usable * length
    return [tokens[start + i * length:start + (i + 1) * length] for i in range(usable)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: demo model)")
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT,
                        help="text to score; windows are taken from its end (held out for "
                             "the demo model)")
    parser.add_argument("--tail-chars", type=int, default=100_000,
                        help="only the last N characters of the text are tokenized")
    parser.add_argument("--windows", type=int, default=12)
    parser.add_argument("--window-tokens", type=int, default=0,
                        help="tokens per window (default: the model's context)")
    parser.add_argument("--budgets", default="25%")
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    from moescope.cache.policy import Policy
    from moescope.engine import Engine
    from moescope.engine.evaluate import RunSpec, change_interval, run_one
    from moescope.sim.sweep import parse_policy
    from moescope.util.resources import demo_model_path

    model = args.model or demo_model_path()
    policies = [parse_policy(p) or Policy.preset("exact")
                for p in args.policies.split(",") if p.strip()]
    if not policies or not policies[0].exact:
        policies.insert(0, Policy.preset("exact"))
    budgets = [b.strip() for b in args.budgets.split(",") if b.strip()]
    engine = Engine()
    engine.load(model, budget=budgets[0], policy="exact", n_threads=args.threads)
    text = args.text.read_text(encoding="utf-8")[-args.tail_chars:]
    length = args.window_tokens or engine.n_ctx
    chunks = windows(engine.tokenize(text[text.find("\n") + 1:]), args.windows, length)
    if not chunks:
        parser.error(f"the text has fewer than {length} tokens")
    print(f"{model.name}: {len(chunks)} windows x {length - 1} scored tokens, "
          f"each from an empty cache", file=sys.stderr)

    print("| policy | budget | perplexity Δ vs exact [95% CI over windows] | substituted "
          "| fetched/tok (critical path) | vs exact |")
    print("|---|---|---|---:|---:|---:|")
    for budget in budgets:
        results = {}
        for policy in policies:
            runs = [run_one(engine, chunk, RunSpec(policy, budget)) for chunk in chunks]
            nll = np.concatenate([r.nll for r in runs])
            calls = sum(r.selections for r in runs)
            subst = sum(r.substitutions for r in runs) / max(calls, 1)
            fetched = float(np.mean([r.bytes_sync.mean() for r in runs]))
            results[policy.name or "custom"] = (nll, subst, fetched)
            print(f"  {policy.name} @ {budget}: done", file=sys.stderr)
        base_nll, _, base_bytes = results[policies[0].name or "custom"]
        for policy in policies:
            nll, subst, fetched = results[policy.name or "custom"]
            change, lo, hi = change_interval(nll, base_nll, block=length - 1)  # windows
            print(f"| {policy.name} | {budget} | {change:+.2f}% [{lo:+.2f}, {hi:+.2f}] | "
                  f"{subst:.1%} | {fetched / 1024:.1f} KiB | "
                  f"{fetched / base_bytes if base_bytes else float('nan'):.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
