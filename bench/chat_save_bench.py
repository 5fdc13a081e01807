"""What does saving each token of a chat answer cost the decode thread?

The window's answer is appended to the chat database on the decode thread, one committed
statement per token before the next is decoded (``AnswerWriter``), so a killed process
loses at most the token in flight. Each append rewrites the answer's row, so its cost grows
with the answer; this measures it per token at points along a long answer, with the
window's own connection open on the same database (WAL, ``synchronous=NORMAL``) as in the
app, and reports medians, the 99th percentile and the worst (a WAL checkpoint lands on the
writer now and then). Tokens are 4 characters, about an English token. A second table
decodes a synthetic model with the demo's geometry (6 x 64, top-4: hundreds of tokens a
second here, so a per-token cost shows) with and without saving each token, the variants
round-robin, medians of ``--reps`` runs.

    .venv/bin/python bench/chat_save_bench.py --reps 5 --tokens 4000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

TOKEN = "word"
PROMPT = "The quick brown fox jumps over the lazy dog and keeps on running."
VARIANTS = ("not saved", "saved per token (AnswerWriter)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=4000)
    parser.add_argument("--decode-tokens", type=int, default=200)
    parser.add_argument("--models", type=Path, default=Path(tempfile.gettempdir())
                        / "moescope-recording-bench")
    args = parser.parse_args()
    reps = max(1, min(args.reps, 100))
    tokens = max(100, min(args.tokens, 100_000))

    from moescope.session.store import AnswerWriter, ChatStore

    marks = sorted({100, tokens // 4, tokens // 2, tokens})
    per_rep: list[list[float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        store = ChatStore(Path(tmp) / "chats.sqlite3")  # the window's connection
        chat = store.create_chat("bench")
        writer = AnswerWriter(store.path)
        for _ in range(reps):
            answer = store.add_message(chat.id, "assistant", "", "generating")
            times = []
            for _ in range(tokens):
                t0 = time.perf_counter()
                writer.append(answer.id, TOKEN)
                times.append(time.perf_counter() - t0)
            per_rep.append(times)
            assert store.messages(chat.id)[-1].content == TOKEN * tokens
        writer.close()
        store.close()
    print("| tokens into the answer | median µs/token | p99 µs/token | worst ms |")
    print("|---:|---:|---:|---:|")
    start = 0
    for mark in marks:
        window = [t for times in per_rep for t in times[start:mark]]
        window.sort()
        p99 = window[min(len(window) - 1, int(len(window) * 0.99))]
        print(f"| {start + 1}-{mark} | {statistics.median(window) * 1e6:.0f} | "
              f"{p99 * 1e6:.0f} | {window[-1] * 1e3:.1f} |")
        start = mark
    decode(reps, max(10, min(args.decode_tokens, 900)), args.models)
    return 0


def decode(reps: int, tokens: int, models: Path) -> None:
    """Decode rate with and without each token saved, side by side."""
    from moescope.engine import Engine, Sampling
    from moescope.session.store import AnswerWriter, ChatStore
    from moescope_testing.synth import SynthSpec, ensure_synth_model

    spec = SynthSpec(arch="qwen3moe", n_layers=6, n_expert=64, top_k=4, n_embd=64,
                     n_ff_exp=32, expert_type="q8_0", ctx=1024)
    engine = Engine()
    engine.load(ensure_synth_model(models, spec), budget="25%", policy="quality-first",
                n_ctx=1024)
    sampling = Sampling(temperature=0.0, max_tokens=tokens, seed=0)
    rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
    with tempfile.TemporaryDirectory() as tmp:
        store = ChatStore(Path(tmp) / "chats.sqlite3")
        chat = store.create_chat("bench")
        writer = AnswerWriter(store.path)
        for rep in range(reps):
            for variant in VARIANTS[rep % 2:] + VARIANTS[:rep % 2]:
                engine.clear_cache()
                answer = store.add_message(chat.id, "assistant", "", "generating")
                save = variant != "not saved"
                n, t0 = 0, time.perf_counter()
                for stats in engine.generate(PROMPT, sampling):
                    n += 1
                    if save:
                        writer.append(answer.id, stats.text)
                rates[variant].append(n / (time.perf_counter() - t0))
        writer.close()
        store.close()
    engine.close()
    base = statistics.median(rates[VARIANTS[0]])
    print(f"\nDecoding {tokens} tokens, demo geometry (6 x 64, top-4), quality-first 25%:\n")
    print("| variant | tok/s (median) | vs not saved |")
    print("|---|---:|---:|")
    for variant in VARIANTS:
        rate = statistics.median(rates[variant])
        print(f"| {variant} | {rate:.1f} | {rate / base:.2f}x |")


if __name__ == "__main__":
    sys.exit(main())
