"""The long fuzz campaign: thousands of generated GGUF files, traces and argument vectors
against ``moescope info``, ``generate``, ``chat`` and ``replay``.

The default tests (``tests/fuzz``) draw a few hundred inputs from the same Hypothesis
strategies (:mod:`moescope_testing.fuzzgen`); this script draws ``--n`` files (GGUF and
traces, alternating) plus ``--args`` argument vectors, split over ``--jobs`` shards, each
with its own fork worker (:class:`moescope_testing.forkrun.ForkRunner`: one child per
input, under address-space, CPU and wall limits). Every GGUF file goes through ``info``,
every ``--generate-every``-th also through ``generate --n 1`` (the model-load path); every
trace through ``replay``. It prints one row per (input kind, command) with the count of
each outcome (``ok``, one-line ``error``, and the failures: ``bad-error``, ``traceback``,
``abort``, ``hang``, ``memory``), and saves every failing input with its command and
stderr under ``--out`` for reproduction. Exit status 1 if anything failed.

    .venv/bin/python bench/fuzz_campaign.py --n 10000 --args 1000 --jobs 2
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import shutil
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

from moescope_testing.forkrun import ACCEPTABLE, OUTCOMES  # noqa: E402


def _shard(job: dict[str, Any]) -> dict[str, Any]:
    """One shard: its own worker, Hypothesis seed and scratch folder."""
    from hypothesis import HealthCheck, Phase, given, seed, settings
    from hypothesis import strategies as st

    from moescope_testing import fuzzgen
    from moescope_testing.forkrun import ForkRunner

    out = Path(job["out"])
    models, traces = fuzzgen.make_bases(Path(job["bases"]))
    gguf_bases = [fuzzgen.read_doc(m) for m in models]
    trace_bases = [fuzzgen.read_trace_doc(t) for t in traces]
    counts: Counter[tuple[str, str, str]] = Counter()
    seconds: Counter[str] = Counter()
    failures: list[str] = []
    step = {"i": 0}
    runner = ForkRunner(timeout=job["timeout"], cpu_seconds=job["cpu"],
                        scratch=job["scratch"])
    runner.start()
    work = runner.scratch

    def record(kind: str, argv: list[str], files: list[Path]) -> None:
        r = runner.run(argv, cwd=work)
        outcome = r.outcome
        counts[(kind, argv[0], outcome)] += 1
        seconds[argv[0]] += r.seconds
        if outcome in ACCEPTABLE:
            return
        name = f"{outcome}-{kind}-{job['shard']}-{step['i']}"
        dest = out / name
        dest.mkdir(parents=True, exist_ok=True)
        for f in files:
            if f.exists():
                shutil.copy(f, dest / f.name)
        (dest / "run.json").write_text(json.dumps({
            "argv": argv, "returncode": r.returncode, "signal": r.signal,
            "timed_out": r.timed_out, "seconds": r.seconds, "max_rss": r.max_rss,
            "stderr": r.stderr[-4000:]}, indent=1), encoding="utf-8")
        failures.append(name)

    n_gguf = job["n"] // 2
    n_trace, n_args = job["n"] - n_gguf, job["args"]

    def given_n(n: int, salt: int) -> Any:
        """Hypothesis over ``n`` examples: generation only (a failure is counted and
        kept, never shrunk), no database, this shard's seed."""
        def wrap(test: Any) -> Any:
            return settings(max_examples=max(n, 1), database=None, deadline=None,
                            phases=[Phase.generate],
                            suppress_health_check=list(HealthCheck))(
                seed(job["seed"] * 1000 + salt)(given(st.data())(test)))
        return wrap

    def tick() -> None:
        step["i"] += 1
        if job["progress"] and step["i"] % 500 == 0:
            print(f"  shard {job['shard']}: {step['i']} inputs", file=sys.stderr, flush=True)

    @given_n(n_gguf, 1)
    def gguf_one(data: st.DataObject) -> None:
        tick()
        kind, raw = data.draw(fuzzgen.gguf_files(gguf_bases))
        path = work / "input.gguf"
        path.write_bytes(raw)
        budget = ["--budget", "25%"] if data.draw(st.booleans()) else []
        record(kind, ["info", path.name, *budget], [path])
        if data.draw(st.integers(0, job["generate_every"] - 1)) == 0:
            record(kind, ["generate", path.name, "--n", "1", "--prompt", "Hi"], [path])

    @given_n(n_trace, 2)
    def trace_one(data: st.DataObject) -> None:
        tick()
        kind, raw, suffix = data.draw(fuzzgen.trace_files(trace_bases))
        path = work / f"input{suffix}"
        for old in work.glob("input.jsonl*"):
            old.unlink()
        path.write_bytes(raw)
        extra = ["--tokens-csv", "tokens.csv"] if data.draw(st.integers(0, 9)) == 0 else []
        record(kind, ["replay", path.name, *extra], [path])

    @given_n(n_args, 3)
    def args_one(data: st.DataObject) -> None:
        tick()
        argv = data.draw(fuzzgen.cli_args(str(data.draw(st.sampled_from(models))),
                                          str(data.draw(st.sampled_from(traces)))))
        record("args", argv, [])

    try:
        for run, n in ((gguf_one, n_gguf), (trace_one, n_trace), (args_one, n_args)):
            if n:
                run()
    finally:
        runner.close()
    return {"counts": [[*k, v] for k, v in counts.items()], "failures": failures,
            "seconds": dict(seconds), "inputs": step["i"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=10_000,
                    help="generated GGUF and trace files in all (default 10000)")
    ap.add_argument("--args", type=int, default=1000,
                    help="generated argument vectors in all (default 1000)")
    ap.add_argument("--jobs", type=int, default=2, help="shards in parallel (default 2)")
    ap.add_argument("--seed", type=int, default=14, help="Hypothesis seed of shard 0")
    ap.add_argument("--generate-every", type=int, default=8,
                    help="also run generate --n 1 on every N-th GGUF file (default 8)")
    ap.add_argument("--timeout", type=float, default=60.0,
                    help="wall seconds per run before it counts as a hang (default 60)")
    ap.add_argument("--cpu", type=int, default=30, help="CPU seconds per run (default 30)")
    ap.add_argument("--out", type=Path, default=REPO / "build" / "fuzz",
                    help="folder for failing inputs and summary.json (default build/fuzz)")
    args = ap.parse_args(argv)
    if args.n < 0 or args.args < 0 or not 1 <= args.jobs <= 64:
        ap.error("--n and --args must be >= 0 and --jobs in 1..64")
    args.out.mkdir(parents=True, exist_ok=True)
    bases = args.out / "bases"
    from moescope_testing import fuzzgen

    fuzzgen.make_bases(bases)  # once, before the shards read them
    jobs = [{"shard": s, "seed": args.seed + s, "out": str(args.out), "bases": str(bases),
             "scratch": str(args.out), "timeout": args.timeout, "cpu": args.cpu,
             "generate_every": args.generate_every, "progress": True,
             "n": args.n // args.jobs + (s < args.n % args.jobs),
             "args": args.args // args.jobs + (s < args.args % args.jobs)}
            for s in range(args.jobs)]
    start = time.monotonic()
    with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
        results = pool.map(_shard, jobs)
    wall = time.monotonic() - start
    counts: Counter[tuple[str, str, str]] = Counter()
    seconds: Counter[str] = Counter()
    failures: list[str] = []
    for r in results:
        for kind, command, outcome, n in r["counts"]:
            counts[(kind, command, outcome)] += n
        seconds.update(r["seconds"])
        failures += r["failures"]
    rows = sorted({(k, c) for k, c, _ in counts})
    head = f"{'input':<13} {'command':<9}" + "".join(f"{o:>10}" for o in OUTCOMES)
    print(head)
    print("-" * len(head))
    for kind, command in rows:
        print(f"{kind:<13} {command:<9}"
              + "".join(f"{counts[(kind, command, o)]:>10}" for o in OUTCOMES))
    total = Counter()
    for (_, _, o), n in counts.items():
        total[o] += n
    print("-" * len(head))
    print(f"{'all runs':<23}" + "".join(f"{total[o]:>10}" for o in OUTCOMES))
    print(f"\n{args.n} generated files (GGUF and traces) and {args.args} argument vectors, "
          f"{sum(total.values())} runs in {wall:.0f} s on {args.jobs} shards; "
          f"child seconds: " + ", ".join(f"{c} {s:.0f}" for c, s in sorted(seconds.items())))
    bad = sum(total[o] for o in OUTCOMES if o not in ACCEPTABLE)
    print(f"failures: {bad}" + (f" (inputs saved under {args.out})" if bad else ""))
    (args.out / "summary.json").write_text(json.dumps({
        "files": args.n, "args": args.args, "wall_s": wall,
        "counts": [[*k, v] for k, v in sorted(counts.items())], "failures": failures},
        indent=1), encoding="utf-8")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
