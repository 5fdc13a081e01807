#!/usr/bin/env python3
"""Check the demo GGUF in llama.cpp against the PyTorch reference that trained it.

Why: the demo model is only useful if llama.cpp computes exactly the network we trained. The
training script (packaging/train_demo_model.py) writes ``reference_logits.npz``: logits of its
PyTorch qwen3moe, run on the weights *read back from the GGUF*, for held-out Shakespeare,
held-out Python and a sequence with a topic switch. This script runs the same tokens through
llama-cpp-python and reports greedy (argmax) agreement and logit differences, checks that
llama.cpp tokenizes text like the trained tokenizer, and records samples for the model card.

Needs llama_cpp and numpy only (no torch), e.g.::

    /work/main/.venv/bin/python packaging/verify_demo_model.py \\
        --reference /work/demo-train/reference_logits.npz --json /work/demo-train/verify.json
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = REPO_ROOT / "resources" / "models" / "moescope-demo-qwen3moe.gguf"


def compare_logits(llm: Any, ref: np.lib.npyio.NpzFile) -> dict[str, dict[str, float]]:
    """Teacher-forced logits of llama.cpp vs the reference, per reference sequence."""
    out: dict[str, dict[str, float]] = {}
    names = [k.removeprefix("logits_") for k in ref.files if k.startswith("logits_")]
    for name in names:
        tokens = ref[f"tokens_{name}"].astype(int).tolist()
        want = ref[f"logits_{name}"]
        llm.reset()
        llm.eval(tokens)
        got = np.asarray(llm.scores[: len(tokens)], dtype=np.float32)
        diff = np.abs(got - want)
        agree = got.argmax(-1) == want.argmax(-1)
        # Top-5 overlap: a softer agreement measure that is robust to near-ties.
        top_got = np.argsort(-got, -1)[:, :5]
        top_want = np.argsort(-want, -1)[:, :5]
        overlap = np.mean([len(set(a) & set(b)) / 5 for a, b in zip(top_got, top_want,
                                                                     strict=True)])
        ref_lp = want - np.logaddexp.reduce(want, -1, keepdims=True)
        got_lp = got - np.logaddexp.reduce(got, -1, keepdims=True)
        nxt = np.asarray(tokens[1:])
        rows = np.arange(len(nxt))
        out[name] = {
            "tokens": len(tokens),
            "argmax_agreement": float(agree.mean()),
            "top5_overlap": float(overlap),
            "max_abs_diff": float(diff.max()),
            "mean_abs_diff": float(diff.mean()),
            "logit_range": float(want.max() - want.min()),
            "nll_reference": float(-ref_lp[rows, nxt].mean()),
            "nll_llama_cpp": float(-got_lp[rows, nxt].mean()),
        }
    return out


def generate(llm: Any, prompt: str, n: int, temperature: float, seed: int) -> str:
    """Plain completion; temperature 0 is greedy."""
    res = llm.create_completion(
        prompt, max_tokens=n, temperature=temperature, top_k=0 if temperature else 1,
        top_p=1.0, min_p=0.0, repeat_penalty=1.0, seed=seed,
    )
    return prompt + res["choices"][0]["text"]


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=str(DEFAULT_MODEL))
    ap.add_argument("--reference", required=True, help="reference_logits.npz from training")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)

    import llama_cpp

    llm = llama_cpp.Llama(
        model_path=args.model, n_ctx=512, n_batch=512, logits_all=True, n_threads=args.threads,
        seed=0, verbose=False,
    )
    ref = np.load(args.reference)
    result: dict[str, Any] = {"llama_cpp_version": llama_cpp.__version__}
    result["logits"] = compare_logits(llm, ref)
    for name, row in result["logits"].items():
        print(f"{name:12s} " + "  ".join(f"{k}={v:.4g}" for k, v in row.items()))

    tok_check = {}
    for name in ("shakespeare", "python"):
        text = str(ref[f"text_{name}"])
        want = ref[f"hf_tokens_{name}"].astype(int).tolist()
        got = llm.tokenize(text.encode(), add_bos=False, special=False)
        tok_check[name] = {"tokens": len(want), "identical": got == want,
                           "detok_roundtrip": llm.detokenize(got).decode() == text}
    result["tokenizer"] = tok_check
    print("tokenizer:", tok_check)

    samples = []
    for prompt in ("ROMEO:", "def ", "import ", "KING RICHARD III:\n"):
        for temp, seed in ((0.0, 0), (0.8, 1)):
            llm.reset()
            text = generate(llm, prompt, 120, temp, seed)
            samples.append({"prompt": prompt, "temperature": temp, "seed": seed, "text": text})
            print(f"--- {prompt!r} T={temp}\n{text}\n")
    result["samples"] = samples

    chats = []
    for question in ("Write some Python code.", "Recite some Shakespeare."):
        llm.reset()
        res = llm.create_chat_completion(
            messages=[{"role": "user", "content": question}], max_tokens=120, temperature=0.0,
            top_k=1, repeat_penalty=1.0, seed=0,
        )
        answer = res["choices"][0]["message"]["content"]
        chats.append({"user": question, "assistant": answer,
                      "finish_reason": res["choices"][0]["finish_reason"]})
        print(f"--- chat {question!r}\n{answer}\n")
    result["chat"] = chats
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
