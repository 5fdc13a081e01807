"""What a grammar (JSON output) costs per token on a large vocabulary: the same answers
without a grammar, with ``json_object``'s and with a schema's, the grammar masking every
token of the vocabulary ("full") or the likeliest first ("top-first", the default), side
by side in one run. Medians over ``--repeats`` answers: decode tokens/s and the mask's
milliseconds per token.

The model is a tiny synthetic MoE whose vocabulary is ``--vocab`` tokens of real text
(``moescope_testing.vocab.build_wide_vocab``: Qwen3's 151,936 by default), so the
grammar's work is a real model's while the model's own is negligible; greedy decoding.

    PYTHONPATH=app python bench/grammar_bench.py [--vocab 151936] [--tokens 60]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

from moescope.engine import Engine, Sampling  # noqa: E402
from moescope.engine.grammar import json_object_grammar, schema_grammar  # noqa: E402
from moescope_testing import ensure_wide_vocab_model  # noqa: E402

ASK = [{"role": "user", "content": "Write some Python code."}]
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"},
                                           "age": {"type": "integer"}},
          "required": ["name", "age"]}


def run(e: Engine, grammar: str | None, top_first: bool, tokens: int) -> dict[str, Any]:
    g = e.compile_grammar(grammar) if grammar else None
    mask_s: list[float] = []
    if g is not None:
        g.top_first = top_first
        inner = g.mask

        def timed(ids: Any, logits: Any) -> Any:
            t = time.perf_counter()
            out = inner(ids, logits)
            mask_s.append(time.perf_counter() - t)
            return out

        g.mask = timed  # type: ignore[method-assign]
    stamps = [time.perf_counter() for _ in e.generate(
        ASK, Sampling(temperature=0, max_tokens=tokens, grammar=g))]
    decode = (len(stamps) - 1) / (stamps[-1] - stamps[0]) if len(stamps) > 1 else 0.0
    return {"n": len(stamps), "tok_s": decode,
            "mask_ms": statistics.median(mask_s) * 1e3 if mask_s else 0.0,
            "top": g.top_steps if g else 0, "full": g.full_steps if g else 0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--vocab", type=int, default=151_936)
    ap.add_argument("--tokens", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--models", default=str(Path(tempfile.gettempdir()) / "moescope-bench"))
    args = ap.parse_args()
    e = Engine()
    e.load(ensure_wide_vocab_model(args.models, args.vocab), policy="exact", n_ctx=1024,
           n_threads=args.threads)
    variants = [("no grammar", None, True),
                ("json_object, full", json_object_grammar(), False),
                ("json_object, top-first", json_object_grammar(), True),
                ("schema, full", schema_grammar(SCHEMA), False),
                ("schema, top-first", schema_grammar(SCHEMA), True)]
    run(e, None, True, 4)  # warm up
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in variants}
    for _ in range(args.repeats):  # interleaved: drift hits every variant alike
        for name, grammar, top in variants:
            rows[name].append(run(e, grammar, top, args.tokens))
    e.close()
    print(f"vocabulary {args.vocab} tokens, greedy, {args.tokens} tokens at most, "
          f"medians of {args.repeats}")
    print(f"{'variant':<24}{'tokens':>7}{'tok/s':>9}{'mask ms/tok':>13}{'top/full':>10}")
    for name, _, _ in variants:
        r = rows[name]
        med = {k: statistics.median(x[k] for x in r) for k in ("n", "tok_s", "mask_ms")}
        print(f"{name:<24}{med['n']:>7.0f}{med['tok_s']:>9.1f}{med['mask_ms']:>13.2f}"
              f"{r[-1]['top']:>5}/{r[-1]['full']:<4}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
