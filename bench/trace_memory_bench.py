"""How much memory does a reopened long trace hold?

A synthetic trace at Qwen3-Next's cache geometry (48 MoE layers x 512 experts, top-10, f32
router inputs: ``moescope_testing.traces.synthetic_trace``), as the window's recording
stream (``.arrows``) and as a finished session (``.parquet``), is reopened as the trace
window does (``reopen`` then ``account``) in a fresh process for each measurement, and
then its probabilities are joined as the what-if's preparation does. Reported: the
process's anonymous resident memory (after ``malloc_trim``: what it really keeps) and its
mapped file pages, medians of ``--reps``. ``--against DIR`` runs the same measurements
with another checkout's ``app`` (e.g. a ``git worktree`` of an older commit) beside, in
alternation.

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/trace_memory_bench.py --tokens 10000 \\
        --against /tmp/before
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

CHILD = r"""
import ctypes, gc, json, sys, time
sys.path.insert(0, sys.argv[1])

def rss():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(("RssAnon", "RssFile")):
                name, value = line.split(":")
                out[name] = int(value.split()[0]) / 1024
    return out

from moescope.display.trace_io import account, reopen
base = rss()
t = time.perf_counter()
reopened = account(reopen(sys.argv[2]))
seconds = time.perf_counter() - t
opened = rss()
t = time.perf_counter()
reopened.trace.columns.probs
joined_s = time.perf_counter() - t
joined = rss()
print(json.dumps({"base": base, "opened": opened, "joined": joined, "seconds": seconds,
                  "joined_s": joined_s, "tokens": len(reopened.tokens)}))
"""


def measure(app: Path, trace: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(app), str(trace)], check=True,
                         capture_output=True, text=True).stdout
    r = json.loads(out.strip().splitlines()[-1])
    return {"anon": r["opened"]["RssAnon"] - r["base"]["RssAnon"],
            "file": r["opened"]["RssFile"] - r["base"]["RssFile"],
            "joined_anon": r["joined"]["RssAnon"] - r["base"]["RssAnon"],
            "seconds": r["seconds"], "joined_s": r["joined_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/moescope-trace-memory"))
    ap.add_argument("--against", type=Path, default=None,
                    help="another checkout whose app/ to measure beside this one")
    args = ap.parse_args()
    sys.path.insert(0, str(REPO / "app"))
    from moescope.trace.parquet_format import compact
    from moescope_testing.traces import bench_trace

    _, stream = bench_trace(args.dir, args.tokens, "moescope-trace-memory-")
    parquet = stream.with_suffix(".parquet")
    if not parquet.exists():
        compact(stream, parquet)
    builds = {"this": REPO / "app"}
    if args.against is not None:
        builds = {"before": args.against / "app", **builds}
    results: dict[tuple[str, str], list[dict[str, float]]] = {}
    for _ in range(args.reps):
        for trace in (stream, parquet):
            for name, app in builds.items():
                results.setdefault((trace.suffix, name), []).append(measure(app, trace))

    def med(rows: list[dict[str, float]], key: str) -> float:
        return statistics.median(r[key] for r in rows)

    print(f"trace: {args.tokens} tokens x 48 layers x 512 experts, top-10; medians of "
          f"{args.reps}, each in a fresh process")
    print()
    print("| file | build | reopened: anonymous MB | mapped file MB | reopen + account s | "
          "probabilities joined: anonymous MB |")
    print("|---|---|---|---|---|---|")
    for (suffix, name), rows in results.items():
        print(f"| {suffix} | {name} | {med(rows, 'anon'):,.0f} | {med(rows, 'file'):,.0f} | "
              f"{med(rows, 'seconds'):.2f} | {med(rows, 'joined_anon'):,.0f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
