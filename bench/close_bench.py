"""How long does closing a session's Parquet trace make the window wait?

The window records to a journal (an Arrow stream) and compacts it to Parquet when the
session closes (a new chat, a model load, quit). Before, closing waited for the
compaction (``ParquetTraceWriter.close``); now it waits only for the end record and the
journal's close (``close_journal``) and hands the compaction to the background
``Compactor``. Both variants close the same session (a synthetic trace at Qwen3-Next's
geometry, 48 MoE layers x 512 experts, top-10, f32 router inputs, written token by token
to a fresh journal, untimed), alternated, ``--reps`` times each; medians and the ratio.
The background compaction's own time is reported too (it still costs that CPU, off the
user's path).

    .venv/bin/python bench/close_bench.py --tokens 2000 --reps 3
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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2000)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    if not 1 <= args.tokens <= 20_000 or not 1 <= args.reps <= 20:
        parser.error("--tokens 1..20000, --reps 1..20")

    from moescope.trace import read_trace
    from moescope.trace.compactor import Compactor
    from moescope.trace.parquet_format import ParquetTraceWriter
    from moescope_testing.traces import synthetic_trace

    waited: dict[str, list[float]] = {"close (compacts, before)": [],
                                      "close_journal (now)": []}
    background: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        src = read_trace(synthetic_trace(work / "src.arrows", n_tokens=args.tokens))
        tokens = list(src.tokens)
        for rep in range(args.reps):
            order = list(waited) if rep % 2 == 0 else list(reversed(waited))
            for variant in order:
                path = work / f"{rep}-{len(variant)}.parquet"
                writer = ParquetTraceWriter(path, src.header)
                for record in tokens:
                    writer.write_token(record)
                if variant.startswith("close ("):
                    t0 = time.perf_counter()
                    writer.close(stop_reason="bench")
                    waited[variant].append(time.perf_counter() - t0)
                else:
                    compactor = Compactor()
                    t0 = time.perf_counter()
                    if writer.close_journal(stop_reason="bench"):
                        compactor.submit(writer)
                    t1 = time.perf_counter()
                    compactor.wait()
                    waited[variant].append(t1 - t0)
                    background.append(time.perf_counter() - t1)
                assert path.exists() and len(read_trace(path).tokens) == len(tokens)
                path.unlink()

    before = statistics.median(waited["close (compacts, before)"])
    print(f"{args.tokens} tokens at Qwen3-Next geometry (48 x 512, top-10, f32 router "
          f"inputs), {args.reps} reps each, alternated; medians")
    print("| what the window waits for at close | wall (median) | per token | vs before |")
    print("|---|---:|---:|---:|")
    for variant, times in waited.items():
        m = statistics.median(times)
        print(f"| {variant} | {m * 1e3:.1f} ms | {m / args.tokens * 1e6:.2f} us | "
              f"{before / m:.0f}x less |" if m < before else
              f"| {variant} | {m * 1e3:.1f} ms | {m / args.tokens * 1e6:.2f} us | 1x |")
    b = statistics.median(background)
    print(f"| (compaction in the background, not waited for) | {b * 1e3:.1f} ms | "
          f"{b / args.tokens * 1e6:.2f} us | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
