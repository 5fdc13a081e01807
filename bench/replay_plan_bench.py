"""The batch replay's kept plan (``moecache_replay_plan``, issue 18) against a batch that
validates and packs the trace itself, side by side.

    .venv/bin/python bench/replay_plan_bench.py TRACE [--against LIB] [--rounds 3] [--reps 3]

On ``TRACE`` (e.g. ``moescope_testing.traces.synthetic_trace(path, n_tokens=2000)``), each
round runs one process per core library, alternating (this checkout's, then ``--against``'s,
e.g. main's ``build/native/libmoecache.so``, through ``MOESCOPE_NATIVE_LIB``); each process
measures the CPU time (best of ``--reps``) of

* making the plan (2 threads), and its bytes per row;
* 8 policies at 128 slots on 1 thread (the issue's layer-decision rate), with the plan kept
  and with the batch preparing the trace itself (``moecache_replay_batch_ctl``);
* one ``exact`` configuration at 128 slots on 1 thread, both ways: what a call costs
  beyond its decisions.

The ranking is made before, once, in every case. Prints the best of the rounds per library
and measure, as a Markdown table. The machine is shared: say what ``uptime`` said.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))
sys.path.insert(0, str(REPO / "bench"))

from replay_bench import cpu_best  # noqa: E402 (bench/ on the path)

POLICIES = ["exact", "quality-first", "speed-first", "cache-prior", "psr", "substitute-all",
            "threshold", "first-choice"]


def child(path: Path, reps: int) -> dict[str, float]:
    """One library's measures (seconds of CPU, bytes a row)."""
    from moescope.cache import native

    if os.environ.get("MOESCOPE_BENCH_ONLY_LIB"):  # that library alone, no build/native
        native._repo_build_dir = lambda: Path("/nonexistent")  # type: ignore[assignment]
    from moescope.cache.batch import CReplayConfig, ReplayPlan, c_policy, has_plan, replay_batch
    from moescope.cache.policy import Policy
    from moescope.sim.replay import Routing, native_trace
    from moescope.trace import read_trace

    routing = Routing.from_trace(read_trace(path))
    ct, keep = native_trace(routing, routing.substitute_ranking(threads=2))
    eight = [CReplayConfig(policy=c_policy(Policy.preset(p)), slots=128) for p in POLICIES]
    one = eight[:1]
    out: dict[str, float] = {"rows": routing.n_rows}
    out["eight_fresh"] = cpu_best(lambda: replay_batch(ct, eight, threads=1), reps)
    out["one_fresh"] = cpu_best(lambda: replay_batch(ct, one, threads=1), reps + 2)
    if has_plan():
        out["plan_make"] = cpu_best(lambda: ReplayPlan.make(ct, threads=2), reps)
        plan = ReplayPlan.make(ct, threads=2)
        assert plan is not None
        out["plan_bytes"] = plan.nbytes / routing.n_rows
        a, _ = replay_batch(ct, eight, threads=1, plan=plan)
        b, _ = replay_batch(ct, eight, threads=1)
        assert a.tobytes() == b.tobytes(), "the kept plan's results differ"
        out["eight_kept"] = cpu_best(lambda: replay_batch(ct, eight, threads=1, plan=plan),
                                     reps)
        out["one_kept"] = cpu_best(lambda: replay_batch(ct, one, threads=1, plan=plan),
                                   reps + 2)
    del keep
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--against", type=Path, default=None,
                    help="another core library (e.g. main's build/native/libmoecache.so)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(child(args.trace, args.reps)))
        return 0
    mine = REPO / "build" / "native" / "libmoecache.so"
    libs = {"this checkout": mine, **({"against": args.against} if args.against else {})}
    best: dict[str, dict[str, float]] = {name: {} for name in libs}
    for _ in range(args.rounds):
        for name, lib in libs.items():
            env = {**os.environ, "MOESCOPE_NATIVE_LIB": str(lib),
                   "MOESCOPE_BENCH_ONLY_LIB": "1"}
            got = json.loads(subprocess.run(
                [sys.executable, __file__, str(args.trace), "--child", "--reps", str(args.reps)],
                env=env, check=True, capture_output=True, text=True).stdout)
            for key, value in got.items():
                best[name][key] = min(best[name].get(key, float("inf")), value)
    rows = int(best["this checkout"]["rows"])
    print(f"trace {args.trace.name}: {rows:,} rows; CPU best of {args.reps} reps x "
          f"{args.rounds} rounds; libraries: " + ", ".join(f"{k} = {v}" for k, v in libs.items()))
    print()
    print("| measure | " + " | ".join(libs) + " |")
    print("|---|" + "---|" * len(libs))

    def line(label: str, key: str, fmt) -> None:  # type: ignore[no-untyped-def]
        cells = [fmt(best[n][key]) if key in best[n] else "-" for n in libs]
        print(f"| {label} | " + " | ".join(cells) + " |")

    def rate(n_cfg: int):  # type: ignore[no-untyped-def]
        return lambda s: (f"{s * 1e3:.1f} ms = {rows * n_cfg / s / 1e6:.2f} M "
                          f"layer-decisions/s ({s / (rows * n_cfg) * 1e9:.0f} ns each)")

    line("replay plan, once per trace (2 threads)", "plan_make", lambda s: f"{s * 1e3:.1f} ms")
    line("kept plan, bytes a row", "plan_bytes", lambda b: f"{b:,.0f} B")
    line("8 policies x 128 slots, 1 thread, batch prepares the trace", "eight_fresh", rate(8))
    line("8 policies x 128 slots, 1 thread, plan kept", "eight_kept", rate(8))
    line("1 exact config x 128 slots, 1 thread, batch prepares the trace", "one_fresh",
         rate(1))
    line("1 exact config x 128 slots, 1 thread, plan kept", "one_kept", rate(1))
    m = best["this checkout"]
    if "eight_kept" in m:
        print()
        print(f"this checkout: per call, the kept plan saves "
              f"{(m['one_fresh'] - m['one_kept']) * 1e3:.1f} ms "
              f"({(m['one_fresh'] - m['one_kept']) / rows * 1e9:.0f} ns a row); "
              f"8 policies {m['eight_fresh'] / m['eight_kept']:.2f}x, one config "
              f"{m['one_fresh'] / m['one_kept']:.2f}x faster with it")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
