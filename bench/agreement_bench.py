"""Does a policy change the answer? Greedy continuations of held-out text, against Exact.

For each prompt (windows of the held-out end of the demo model's corpus) every policy
continues it greedily from an empty expert cache at the same budget
(``moescope.engine.compare``); each continuation is set against Exact's, which equals the
unpatched engine's. Reported per policy: how many tokens stay identical to Exact's (median
and mean), the share of positions that agree, how many continuations are identical, and
the substituted gate mass per token. Perplexity (``moescope eval``) says how much a policy
costs on average; this says how often a user would see a different answer.

    .venv/bin/python bench/agreement_bench.py --prompts 24 --tokens 48 --budget 25%
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

DEFAULT_TEXT = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
POLICIES = "exact,quality-first,speed-first,cache-prior,psr"


def prompts(text: str, count: int, chars: int = 240, tail: int = 12_000) -> list[str]:
    """``count`` windows of ``chars`` characters from the last ``tail`` characters (the
    held-out part), each starting at a line."""
    held = text[-tail:]
    step = max(1, (len(held) - chars) // count)
    out = []
    for i in range(count):
        start = held.find("\n", i * step) + 1
        out.append(held[start:start + chars])
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", type=Path, default=None, help="GGUF (default: demo model)")
    parser.add_argument("--text", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=48)
    parser.add_argument("--budget", default="25%")
    parser.add_argument("--policies", default=POLICIES)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()

    from moescope.engine import Engine
    from moescope.engine.compare import compare_policies
    from moescope.util.resources import demo_model_path

    model = args.model or demo_model_path()
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    engine = Engine()
    engine.load(model, budget=args.budget, policy=policies[0], n_threads=args.threads)
    rows: dict[str, list[tuple[int, float, bool, float]]] = {p: [] for p in policies}
    texts = prompts(args.text.read_text(encoding="utf-8"), args.prompts)
    try:
        for n, prompt in enumerate(texts, 1):
            result = compare_policies(engine, prompt, policies, max_tokens=args.tokens)
            for a in result.answers:
                rows[a.policy].append((a.same_prefix, a.agreement, a.identical,
                                       a.cache.mass_per_token))
            print(f"prompt {n}/{len(texts)}", file=sys.stderr)
    finally:
        engine.close()
    slots = args.budget
    print(f"{model.name}, budget {slots}, {len(texts)} prompts from the held-out end of "
          f"{args.text.name}, {args.tokens} greedy tokens each, every policy from an empty "
          "cache; Exact is the reference")
    print("| policy | same start, median | same start, mean | agreement | identical | "
          "mass/token |")
    print("|---|---:|---:|---:|---:|---:|")
    for policy, r in rows.items():
        same = [x[0] for x in r]
        print(f"| {policy} | {statistics.median(same):.0f} | {statistics.mean(same):.1f} | "
              f"{statistics.mean(x[1] for x in r):.0%} | {sum(x[2] for x in r)}/{len(r)} | "
              f"{statistics.mean(x[3] for x in r):.3f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
