"""The substitute ranking (``moecache_rank_rows``) of two core libraries side by side, at
the expert counts of common MoE models.

    .venv/bin/python bench/rank_bench.py --against LIB [--rows-512 100000] [--reps 3]

For each expert count (64, 128, 160, 256, 384, 512), softmax rows of random logits (a
per-expert popularity plus noise, as ``moescope_testing.traces.synthetic_trace`` makes them;
as many rows as 100,000 rows of 512 experts hold) are ranked on one thread by this
checkout's ``build/native/libmoecache.so`` and by ``--against`` (e.g. main's), alternating;
CPU time per row, best of ``--reps``. The two rankings must be identical. The machine is
shared: say what ``uptime`` said.
"""

from __future__ import annotations

import argparse
import ctypes
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
TOP_K = 8


def load(path: Path) -> ctypes.CDLL:
    lib = ctypes.CDLL(str(path))
    f = lib.moecache_rank_rows
    f.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32,
                  ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                  ctypes.c_void_p]
    f.restype = ctypes.c_int32
    return lib


def rank(lib: ctypes.CDLL, probs: np.ndarray, ids: np.ndarray) -> tuple[float, tuple]:  # type: ignore[type-arg]
    rows, n = probs.shape
    ranks = np.zeros((rows, 64), np.uint16)
    counts = np.zeros(rows, np.uint8)
    selected = np.zeros((rows, TOP_K), np.float32)
    c = time.process_time()
    code = lib.moecache_rank_rows(probs.ctypes.data, ids.ctypes.data, rows, n, TOP_K, 1,
                                  ranks.ctypes.data, counts.ctypes.data, selected.ctypes.data)
    spent = time.process_time() - c
    assert code == 0
    return spent, (ranks, counts, selected)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", type=Path, required=True)
    ap.add_argument("--rows-512", type=int, default=100_000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    libs = {"this checkout": load(REPO / "build" / "native" / "libmoecache.so"),
            "against": load(args.against)}
    rng = np.random.default_rng(1)
    print(f"one thread, CPU best of {args.reps}; against = {args.against}")
    print()
    print("| experts | rows | this checkout | against | ratio |")
    print("|---:|---:|---:|---:|---:|")
    for n in (64, 128, 160, 256, 384, 512):
        rows = args.rows_512 * 512 // n
        logits = rng.normal(0, 1.5, (rows, n)).astype(np.float32) + \
            rng.normal(0, 1, n).astype(np.float32)
        probs = np.exp(logits - logits.max(axis=1, keepdims=True))
        probs = np.ascontiguousarray(probs / probs.sum(axis=1, keepdims=True), np.float32)
        ids = np.ascontiguousarray(np.argsort(-probs, axis=1)[:, :TOP_K], np.int32)
        best: dict[str, float] = {}
        got: dict[str, tuple] = {}  # type: ignore[type-arg]
        for _ in range(args.reps):
            for name, lib in libs.items():
                spent, got[name] = rank(lib, probs, ids)
                best[name] = min(best.get(name, float("inf")), spent)
        assert all(np.array_equal(a, b) for a, b in zip(*got.values(), strict=True)), n
        mine, other = best["this checkout"], best["against"]
        print(f"| {n} | {rows:,} | {mine / rows * 1e9:.0f} ns a row | "
              f"{other / rows * 1e9:.0f} ns | {other / mine:.2f}x |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
