"""What a trace's first what-if pays before it decides anything (issue 18), side by side:
the layout (``Routing.from_trace``), the substitute ranking (``moecache_rank_rows``) and the
kept replay plan, for this checkout against another.

    .venv/bin/python bench/prepare_bench.py TRACE [--against-app DIR --against-lib LIB]
                                                  [--rounds 3] [--reps 3]

On ``TRACE`` (e.g. ``moescope_testing.traces.synthetic_trace(path, n_tokens=10000)``) each
round runs one process per checkout, alternating: this one (``app/`` and
``build/native/libmoecache.so``), then ``--against-app`` (an ``app/`` folder, e.g. main's
from ``git archive``) with ``--against-lib`` (its core library). Each process measures,
CPU time best of ``--reps`` and wall time median:

* ``read_trace`` then ``Routing.from_trace`` (the layout alone timed: the probabilities
  joined into one array, the rows grouped into calls), each rep on a fresh read;
* ``rank_rows`` over the layout on 2 threads (the once-per-trace ranking);
* ``ReplayPlan.make`` on 2 threads with that ranking (the kept plan);
* with ``--whatif``, the first what-if a window shows (``whatif_model.compute``: 8
  policies x 6 budgets and the recorded point, ``pcie4``), once per round on a fresh read:
  the layout, ranking and plan included.

The ranking's and the layout's arrays must be byte-identical across checkouts (checked by
digest). Prints the best of the rounds as a Markdown table. The machine is shared: say what
``uptime`` said.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def measure(fn, reps: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    """(least CPU seconds, median wall seconds) of ``reps`` calls."""
    cpus, walls = [], []
    for _ in range(reps):
        c, w = time.process_time(), time.perf_counter()
        fn()
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
    return min(cpus), statistics.median(walls)


def child(path: Path, app: Path, reps: int) -> dict[str, object]:
    """One checkout's measures (seconds) and its results' digests."""
    sys.path.insert(0, str(app))
    from moescope.cache import native

    native._repo_build_dir = lambda: Path("/nonexistent")  # type: ignore[assignment]
    from moescope.cache.batch import ReplayPlan, rank_rows
    from moescope.sim.replay import Routing, native_trace
    from moescope.trace import read_trace

    cpus, walls = [], []
    routing = None
    for _ in range(reps):
        trace = read_trace(path)
        routing = None  # the last layout freed before the next is made
        c, w = time.process_time(), time.perf_counter()
        routing = Routing.from_trace(trace)
        cpus.append(time.process_time() - c)
        walls.append(time.perf_counter() - w)
        del trace
    assert routing is not None
    out: dict[str, object] = {"rows": routing.n_rows, "experts": int(routing.probs.shape[1]),
                              "layout_cpu": min(cpus), "layout_wall": statistics.median(walls)}
    out["rank_cpu"], out["rank_wall"] = measure(
        lambda: rank_rows(routing.probs, routing.ids, threads=2), reps)
    ranking = rank_rows(routing.probs, routing.ids, threads=2)
    assert ranking is not None
    digest = hashlib.sha256()
    for a in (*ranking, routing.ids, routing.weights, routing.call_start, routing.call_stop,
              routing.call_step, routing.call_layer, routing.token_calls):
        digest.update(a.tobytes())
    out["digest"] = digest.hexdigest()[:16]
    routing.ranking = ranking
    ct, keep = native_trace(routing, ranking)
    out["plan_cpu"], out["plan_wall"] = measure(lambda: ReplayPlan.make(ct, threads=2), reps)
    del keep
    return out


def first_whatif(path: Path) -> dict[str, object]:
    """The window's first what-if from a fresh read (CPU and wall seconds)."""
    from moescope.display import whatif_model
    from moescope.trace import read_trace

    trace = read_trace(path)
    c, w = time.process_time(), time.perf_counter()
    whatif_model.compute(trace, "pcie4")
    return {"whatif_cpu": time.process_time() - c, "whatif_wall": time.perf_counter() - w}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--against-app", type=Path, default=None)
    ap.add_argument("--against-lib", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--whatif", action="store_true", help="time the first what-if too")
    ap.add_argument("--child", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        out = child(args.trace, args.child, args.reps)
        if args.whatif:  # after the preparation's arrays are freed
            out.update(first_whatif(args.trace))
        print(json.dumps(out))
        return 0
    checkouts = {"this checkout": (REPO / "app", REPO / "build" / "native" / "libmoecache.so")}
    if args.against_app is not None and args.against_lib is not None:
        checkouts["against"] = (args.against_app, args.against_lib)
    best: dict[str, dict[str, object]] = {name: {} for name in checkouts}
    walls: dict[str, dict[str, list[float]]] = {name: {} for name in checkouts}
    for _ in range(args.rounds):
        for name, (app, lib) in checkouts.items():
            env = {**os.environ, "MOESCOPE_NATIVE_LIB": str(lib), "OPENBLAS_NUM_THREADS": "1"}
            command = [sys.executable, __file__, str(args.trace), "--child", str(app),
                       "--reps", str(args.reps), *(["--whatif"] if args.whatif else [])]
            got = json.loads(subprocess.run(command, env=env, check=True, capture_output=True,
                                            text=True).stdout)
            for key, value in got.items():
                if key.endswith("_wall"):
                    walls[name].setdefault(key, []).append(float(value))  # type: ignore[arg-type]
                elif key.endswith("_cpu"):
                    best[name][key] = min(float(best[name].get(key, float("inf"))),  # type: ignore[arg-type]
                                          float(value))  # type: ignore[arg-type]
                else:
                    best[name][key] = value
    digests = {str(b["digest"]) for b in best.values()}
    assert len(digests) == 1, f"the checkouts' layouts or rankings differ: {best}"
    mine = best["this checkout"]
    print(f"trace {args.trace.name}: {mine['rows']:,} rows x {mine['experts']} experts; CPU "
          f"best of {args.reps} reps x {args.rounds} rounds, wall median of the rounds' "
          f"medians; " + ", ".join(f"{k} = {a} + {b}" for k, (a, b) in checkouts.items()))
    print()
    names = list(checkouts)
    print("| once per trace | " + " | ".join(names) + (" | ratio |" if len(names) > 1 else " |"))
    print("|---|" + "---|" * (len(names) + (1 if len(names) > 1 else 0)))
    for label, key in (("Routing.from_trace (layout)", "layout"),
                       ("substitute ranking, 2 threads", "rank"),
                       ("replay plan, 2 threads", "plan"),
                       *([("first what-if, 8 x 6 + recorded, everything included",
                           "whatif")] if args.whatif else [])):
        cells, cpu = [], []
        for n in names:
            c = float(best[n][f"{key}_cpu"])  # type: ignore[arg-type]
            w = statistics.median(walls[n][f"{key}_wall"])
            cpu.append(c)
            cells.append(f"{c:.3f} s CPU, {w:.3f} s wall")
        ratio = [f"{cpu[1] / cpu[0]:.2f}x CPU"] if len(names) > 1 else []
        print(f"| {label} | " + " | ".join(cells + ratio) + " |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
