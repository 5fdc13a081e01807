"""Trace format v2 and the native batch replay at Qwen3-Next's geometry (issue 18).

    .venv/bin/python bench/replay_bench.py [--tokens 10000] [--read-tokens 400] [--reps 3]

Synthesizes traces with ``moescope_testing.traces.synthetic_trace`` (48 MoE layers x 512
experts, top-10, f32 router inputs, PSR predictions on every row, rows decided by the real
core) and measures, as medians of ``--reps``:

* bytes on disk per token, version 1 (JSON Lines), version 2 (Arrow IPC stream) and
  version 2 compacted to Parquet (``moescope.trace.parquet_format``), and the compaction's
  time per token;
* ``read_trace`` time per token for each (the same tokens; read once first to warm up),
  wall clock (median) and CPU time (best of at least 3), and CPU time with every event row
  read (``Trace.events()``: version 2 lays them out when first read); with
  ``Routing.from_trace`` too (a Parquet trace decodes its probabilities there);
* the shared substitute ranking (``Routing.substitute_ranking``, once per trace, 2 threads)
  and the kept replay plan (``Routing.replay_plan``, once per trace, 2 threads: the rows
  validated and packed for the replay loop), with the plan's bytes per row;
* replay layer-decisions per second on one core (8 policies, one thread), wall clock and
  CPU time (best of the reps), the ranking and the plan already made;
* an 8-policy x 6-budget what-if (``moescope.sim.sweep`` with the ``pcie4`` cost model)
  over the ``--tokens`` trace on 2 threads, with and without laying out the routing,
  ranking it and making its plan;
* the window's what-if (``whatif_model.compute``: the same grid plus the recorded point,
  from the trace, routing laid out and ranked inside, progress polled at 20 Hz) as one
  watched batch, beside the pattern the window used before (one sweep per budget, then the
  recorded point), alternating, wall (median) and CPU (mean) of ``--reps`` each, on a
  thread beside a 5 ms heartbeat that needs the GIL (as the window's event loop does: its
  gaps say how responsive the window stays); the batch's threads are one per core
  (``nproc``).

Prints a Markdown table for docs/benchmarks.md. The machine is shared: timings are
wall-clock medians and vary with the neighbours' load.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

from moescope.display import whatif_model  # noqa: E402
from moescope.sim import cost_model  # noqa: E402
from moescope.sim.replay import Routing, native_trace, replay_many  # noqa: E402
from moescope.sim.sweep import RECORDED, sweep  # noqa: E402
from moescope.trace import read_trace  # noqa: E402
from moescope.trace.parquet_format import compact  # noqa: E402
from moescope_testing.traces import synthetic_trace  # noqa: E402

POLICIES = ["exact", "quality-first", "speed-first", "cache-prior", "psr", "substitute-all",
            "threshold", "first-choice"]
BUDGETS = ["5%", "10%", "12.5%", "25%", "50%", "100%"]


def timed(fn, reps: int) -> tuple[float, object]:  # type: ignore[no-untyped-def]
    times, out = [], None
    for _ in range(reps):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def cpu_best(fn, reps: int) -> float:  # type: ignore[no-untyped-def]
    """The least CPU time of ``reps`` calls: on a shared machine, what the neighbours'
    load inflates least."""
    best = float("inf")
    for _ in range(reps):
        t = time.process_time()
        fn()
        best = min(best, time.process_time() - t)
    return best


def per_budget(trace, cost_name: str) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """The window's what-if before one batch: a sweep per budget (progress between them),
    then the recorded point (and exact at its budget); returns (configurations, progress
    calls)."""
    cost = cost_model(cost_name, trace)
    routing = Routing.from_trace(trace)
    rows, calls = [], 0
    for budget in BUDGETS:
        rows.extend(sweep(trace, POLICIES, [budget], cost, routing=routing).rows)
        calls += 1
    rows.extend(sweep(trace, [RECORDED, "exact"], [RECORDED], cost, routing=routing).rows)
    return len(rows), calls + 1


def one_batch(trace, routing=None) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """The window's what-if now (``whatif_model.compute``; ``routing``: the one its worker
    kept from an earlier sweep); returns (configurations, progress calls)."""
    calls = []
    result = whatif_model.compute(trace, "pcie4", POLICIES, BUDGETS,
                                  progress=lambda d, t: calls.append(d) is None,
                                  routing=routing)
    return len(result.rows) + 2, len(calls)


def window_whatif(trace, reps: int) -> list[tuple[str, str]]:  # type: ignore[no-untyped-def]
    """The two patterns alternating, ``reps`` runs each."""
    walls: dict[str, list[float]] = {"batch": [], "budgets": [], "kept": []}
    cpus: dict[str, list[float]] = {"batch": [], "budgets": [], "kept": []}
    counts: dict[str, tuple[int, int]] = {}
    def prepare() -> Routing:  # what the trace window's worker does at open
        routing = Routing.from_trace(trace)
        routing.prepare()
        return routing

    tp, kept = timed(prepare, reps)
    gaps: dict[str, list[float]] = {"batch": [], "budgets": [], "kept": []}
    for _ in range(reps):
        for name, fn in (("budgets", lambda: per_budget(trace, "pcie4")),
                         ("batch", lambda: one_batch(trace)),
                         ("kept", lambda: one_batch(trace, kept))):
            t, c = time.perf_counter(), time.process_time()
            worker = threading.Thread(target=lambda n=name, f=fn: counts.__setitem__(n, f()))
            worker.start()
            beat = time.perf_counter()
            while worker.is_alive():  # the window's event loop: a 5 ms timer needing the GIL
                time.sleep(0.005)
                now = time.perf_counter()
                gaps[name].append(now - beat)
                beat = now
            worker.join()
            walls[name].append(time.perf_counter() - t)
            cpus[name].append(time.process_time() - c)
    out = [("the trace window's preparation at open, on its what-if worker (layout, "
            "ranking, plan)", f"{tp:.2f} s wall")]
    for name, label in (("budgets", "window's what-if before: a sweep per budget + recorded"),
                        ("batch", "window's what-if, nothing prepared: compute, one watched "
                                  "batch"),
                        ("kept", "same, prepared at open (or a later sweep: the worker's "
                                 "routing, ranking and plan kept)")):
        w, c = statistics.median(walls[name]), statistics.mean(cpus[name])
        g = sorted(gaps[name])
        out.append((f"{label} ({counts[name][0]} configurations, {counts[name][1]} progress "
                    "calls)",
                    f"{w:.2f} s wall, {c:.2f} s CPU; a 5 ms heartbeat beside it: p99 "
                    f"{g[int(0.99 * (len(g) - 1))] * 1e3:.0f} ms, max {g[-1] * 1e3:.0f} ms"))
    ratio = statistics.median(walls["budgets"]) / statistics.median(walls["batch"])
    out.append(("window's what-if, before / now (wall)", f"{ratio:.2f}x"))
    return out


def probs_bytes(path: Path) -> int:
    """The compressed bytes of a Parquet trace's probabilities column."""
    import pyarrow.parquet as pq

    md = pq.ParquetFile(path).metadata
    return sum(md.row_group(g).column(j).total_compressed_size
               for g in range(md.num_row_groups) for j in range(md.num_columns)
               if md.row_group(g).column(j).path_in_schema.startswith("probs."))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000)
    ap.add_argument("--read-tokens", type=int, default=400)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--no-big-parquet", action="store_true",
                    help="skip compacting and reading the --tokens trace as Parquet")
    args = ap.parse_args()
    work = args.dir or Path(tempfile.mkdtemp(prefix="moescope-replay-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    n = args.read_tokens
    v1 = synthetic_trace(work / "read.jsonl", n_tokens=n)
    v2 = synthetic_trace(work / "read.arrows", n_tokens=n)
    rows = []
    rows.append(("bytes on disk per token, v1 JSONL", f"{v1.stat().st_size / n:,.0f} B"))
    rows.append(("bytes on disk per token, v2 Arrow", f"{v2.stat().st_size / n:,.0f} B"))
    read_trace(v1)
    read_trace(v2)
    t1, _ = timed(lambda: read_trace(v1), args.reps)
    t2, _ = timed(lambda: read_trace(v2), args.reps)
    rows.append((f"read_trace per token ({n} tokens), v1", f"{t1 / n * 1e3:.3f} ms"))
    rows.append((f"read_trace per token ({n} tokens), v2", f"{t2 / n * 1e3:.3f} ms"))
    rows.append(("read speed-up v2 vs v1", f"{t1 / t2:.1f}x"))
    c1 = cpu_best(lambda: read_trace(v1), max(args.reps, 3))
    c2 = cpu_best(lambda: read_trace(v2), max(args.reps, 3))
    rows.append((f"read_trace CPU per token ({n} tokens, best of {max(args.reps, 3)}), v1 / v2",
                 f"{c1 / n * 1e3:.3f} / {c2 / n * 1e3:.3f} ms = {c1 / c2:.1f}x"))
    # v2 lays its event rows out when first read: opening and reading them all
    e1 = cpu_best(lambda: read_trace(v1).events(), max(args.reps, 3))
    e2 = cpu_best(lambda: read_trace(v2).events(), max(args.reps, 3))
    rows.append((f"read_trace + Trace.events() CPU per token ({n} tokens), v1 / v2",
                 f"{e1 / n * 1e3:.3f} / {e2 / n * 1e3:.3f} ms = {e1 / e2:.1f}x"))

    # the compacted form (issue 18, Parquet): the same tokens, compacted from the stream
    c0 = time.process_time()
    tc, v3 = timed(lambda: compact(v2, work / "read.parquet"), 1)
    cc = time.process_time() - c0
    assert isinstance(v3, Path)
    rows.append(("bytes on disk per token, v2 Parquet (compacted)",
                 f"{v3.stat().st_size / n:,.0f} B ({probs_bytes(v3) / n:,.0f} B of it "
                 f"probabilities)"))
    rows.append((f"compaction per token ({n} tokens, stream -> Parquet)",
                 f"{tc / n * 1e3:.3f} ms wall, {cc / n * 1e3:.3f} ms CPU"))
    read_trace(v3)
    t3, _ = timed(lambda: read_trace(v3), args.reps)
    c3 = cpu_best(lambda: read_trace(v3), max(args.reps, 3))
    rows.append((f"read_trace per token ({n} tokens), Parquet: wall / CPU vs v1",
                 f"{t3 / n * 1e3:.3f} ms / {c3 / n * 1e3:.3f} ms = {c1 / c3:.1f}x v1 CPU"))
    e3 = cpu_best(lambda: read_trace(v3).events(), max(args.reps, 3))
    rows.append((f"read_trace + Trace.events() CPU per token ({n} tokens), Parquet",
                 f"{e3 / n * 1e3:.3f} ms = {e1 / e3:.1f}x v1"))
    for name, path in (("v2 stream", v2), ("Parquet", v3)):
        tr_, tt = timed(lambda p=path: Routing.from_trace(read_trace(p)), args.reps)
        c0 = time.process_time()
        Routing.from_trace(read_trace(path))
        cr = time.process_time() - c0
        rows.append((f"read_trace + Routing.from_trace per token ({n} tokens), {name}",
                     f"{tr_ / n * 1e3:.3f} ms wall, {cr / n * 1e3:.3f} ms CPU "
                     f"(incl. decoding the probabilities)"))
        del tt

    big = synthetic_trace(work / "big.arrows", n_tokens=args.tokens)
    rows.append((f"bytes on disk per token, v2 ({args.tokens} tokens)",
                 f"{big.stat().st_size / args.tokens:,.0f} B"))
    tr, trace = timed(lambda: read_trace(big), 1)
    rows.append((f"read_trace, {args.tokens} tokens, v2", f"{tr:.2f} s"))
    tl, routing = timed(lambda: Routing.from_trace(trace), 1)  # type: ignore[arg-type]
    rows.append(("Routing.from_trace (layout for the replay)", f"{tl:.2f} s"))
    if not args.no_big_parquet:
        tcb, bigp = timed(lambda: compact(big, work / "big.parquet"), 1)
        assert isinstance(bigp, Path)
        rows.append((f"compaction, {args.tokens} tokens",
                     f"{tcb:.2f} s wall ({tcb / args.tokens * 1e3:.2f} ms a token); "
                     f"{bigp.stat().st_size / args.tokens:,.0f} B a token"))
        trp, tracep = timed(lambda: read_trace(bigp), 1)
        rows.append((f"read_trace, {args.tokens} tokens, Parquet", f"{trp:.2f} s"))
        tlp, _ = timed(lambda: Routing.from_trace(tracep), 1)  # type: ignore[arg-type]
        rows.append(("Routing.from_trace, Parquet (decodes the probabilities, 4 threads "
                     "at most)", f"{tlp:.2f} s"))
        del tracep
    assert isinstance(routing, Routing)
    c0 = time.process_time()
    tk, _ = timed(lambda: routing.substitute_ranking(threads=2), 1)
    ck = time.process_time() - c0
    rows.append(("substitute ranking, once per trace (2 threads)",
                 f"{tk:.2f} s wall, {ck:.2f} s CPU"))
    ct, keep = native_trace(routing, routing.substitute_ranking())
    c0 = time.process_time()
    tp, plan = timed(lambda: routing.replay_plan(ct, threads=2), 1)
    cp = time.process_time() - c0
    del keep
    plan_bytes = plan.nbytes / routing.n_rows if plan is not None else 0.0  # type: ignore[attr-defined]
    rows.append(("replay plan, once per trace (2 threads)",
                 f"{tp:.2f} s wall, {cp:.2f} s CPU; kept: {plan_bytes:,.0f} B a row "
                 f"({plan_bytes * routing.n_rows / 2**20:,.0f} MiB; the probabilities "
                 f"{routing.probs.nbytes / routing.n_rows:,.0f} B a row)"))
    one_core = [(p, 128) for p in POLICIES]
    t1c, _ = timed(lambda: replay_many(routing, one_core, threads=1), args.reps)
    c1c = cpu_best(lambda: replay_many(routing, one_core, threads=1), args.reps)
    decisions = routing.n_rows * len(one_core)
    rows.append(("replay, 8 policies at 128 slots, 1 thread (ranking and plan kept)",
                 f"{t1c:.2f} s = {decisions / t1c / 1e6:.2f} M layer-decisions/s wall; "
                 f"{c1c:.2f} s = {decisions / c1c / 1e6:.2f} M/s CPU"))
    cost = cost_model("pcie4", trace)  # type: ignore[arg-type]
    c0 = time.process_time()
    tw, result = timed(lambda: sweep(trace, POLICIES, BUDGETS, cost, routing=routing,  # type: ignore[arg-type]
                                     threads=2), args.reps)
    cw = (time.process_time() - c0) / args.reps
    rows.append((f"what-if 8 policies x 6 budgets, {args.tokens} tokens, 2 threads (ranking "
                 "and plan kept)",
                 f"{tw:.2f} s wall ({routing.n_rows * 48 / tw / 1e6:.1f} M layer-decisions/s), "
                 f"{cw:.2f} s CPU"))
    rows.append(("same, including the ranking and the plan", f"{tw + tk + tp:.2f} s"))
    rows.append(("same, including Routing.from_trace, the ranking and the plan",
                 f"{tw + tk + tp + tl:.2f} s"))
    rows.extend(window_whatif(trace, args.reps))
    print(f"trace: {args.tokens} tokens x 48 layers x 512 experts, top-10, f32 router "
          f"inputs, PSR predictions (32 ranks) on every row; files in {work}")
    print()
    print("| measure | result |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    del result
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
