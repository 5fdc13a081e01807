"""The batch replay's decision loop, natively, two revisions of the core side by side
(issue 18).

    .venv/bin/python bench/replay_loop_bench.py [--tokens 2000] [--against REV] [--reps 3]

Makes a synthetic trace at Qwen3-Next's geometry (``moescope_testing.traces.synthetic_trace``:
48 MoE layers x 512 experts, top-10, PSR predictions of 32 ranks), lays it out and ranks it
(``Routing``), and dumps the arrays the core reads. Builds bench/native/replay_harness.cpp
with the core's sources of this checkout and, with ``--against``, of that git revision
(``git archive``), each like CMake's Release build (``-O3 -DNDEBUG``). Then, for every
policy and budget of the what-if grid (8 presets x 26/51/64/128/256/512 slots), runs the
builds alternately: CPU nanoseconds per layer-decision, best of ``--reps``, one thread, the
replay plan made beforehand (no Python, no packing); and the 8-policy batch at 128 slots
(the issue's one-core figure). Each pair must give the same results (the harness's check
sum), or the script fails.

With ``--count``, instead of timing, counts each configuration's work under valgrind
(``callgrind --branch-sim=yes``, the loop alone: ``--toggle-collect``
``'moecache_core::replay_fast*'``): instructions and mispredicted conditional branches
(callgrind's simple predictor: it also counts most exits of a loop) per layer-decision.
Both are deterministic, so a change can be judged on a host whose timings move by a
quarter from one run to the next; neither is the time (session 13: masks instead of a
branch cost ~10% more instructions and were faster), so a change is then timed.
``--slots`` and ``--policies`` pick part of the grid.

Prints Markdown tables for docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

import numpy as np  # noqa: E402

from moescope.sim.replay import Routing, native_trace  # noqa: E402
from moescope.trace import read_trace  # noqa: E402
from moescope_testing.traces import bench_trace  # noqa: E402

POLICIES = ["exact", "quality-first", "speed-first", "cache-prior", "psr", "substitute-all",
            "threshold", "first-choice"]
SLOTS = [26, 51, 64, 128, 256, 512]


def dump(routing: Routing, out: Path) -> dict[str, int]:
    """The routing's arrays as the core reads them, one raw file each."""
    ct, keep = native_trace(routing, routing.substitute_ranking(threads=2))
    rows, k, e = ct.n_rows, ct.top_k, ct.n_experts
    spec: dict[str, tuple[int, Any]] = {
        "expert_bytes": (ct.n_layers, np.int64), "probs": (rows * e, np.float32),
        "ids": (rows * k, np.int32), "weights": (rows * k, np.float32),
        "next_layer": (rows, np.int32), "predicted": (rows * ct.pred_width, np.int32),
        "call_step": (ct.n_calls, np.int64), "call_layer": (ct.n_calls, np.int32),
        "call_start": (ct.n_calls, np.int64), "call_stop": (ct.n_calls, np.int64),
        "token_calls": (ct.n_tokens + 1, np.int64), "ranks": (rows * 64, np.uint16),
        "rank_counts": (rows, np.uint8), "selected_probs": (rows * k, np.float32)}
    for name, (n, dtype) in spec.items():
        size = n * np.dtype(dtype).itemsize
        address = getattr(ct, name)
        data = ctypes.string_at(address, size) if address and size else b""
        (out / f"{name}.bin").write_bytes(data)
    del keep
    meta = {"n_layers": ct.n_layers, "n_experts": e, "top_k": k, "pred_width": ct.pred_width,
            "n_rows": rows}
    (out / "meta.json").write_text(json.dumps(meta))
    return meta


def build(native: Path, out: Path) -> Path:
    """The harness against the core's sources under ``native`` (a checkout's native/)."""
    cxx = shutil.which("c++") or shutil.which("g++")
    if cxx is None:
        raise SystemExit("no C++ compiler (c++ or g++) on PATH")
    sources = sorted(str(p) for p in (native / "src").glob("*.cpp"))
    subprocess.run([cxx, "-O3", "-DNDEBUG", "-std=c++17", "-pthread",
                    f"-I{native / 'include'}", f"-I{native / 'src'}",
                    str(REPO / "bench" / "native" / "replay_harness.cpp"), *sources,
                    "-o", str(out)], check=True)
    return out


def revision_native(rev: str, work: Path) -> Path:
    """native/ of git revision ``rev``, unpacked under ``work``."""
    archive = work / "rev.tar"
    subprocess.run(["git", "-C", str(REPO), "archive", "-o", str(archive), rev, "native"],
                   check=True)
    with tarfile.open(archive) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4
            tar.extractall(work / "rev", filter="data")
        else:  # our own repository's archive
            tar.extractall(work / "rev")
    return work / "rev" / "native"


def run(exe: Path, data: Path, meta: dict[str, int], policies: str, slots: int,
        reps: int) -> tuple[float, str]:
    out = subprocess.run([str(exe), str(data), str(meta["n_layers"]), str(meta["n_experts"]),
                          str(meta["top_k"]), str(meta["pred_width"]), policies, str(slots),
                          str(reps)], check=True, capture_output=True, text=True).stdout
    m = re.search(r"ns_per_row=([0-9.]+) check=(-?[0-9]+)", out)
    if m is None:
        raise SystemExit(f"{exe}: unexpected output {out!r}")
    return float(m.group(1)), m.group(2)


def count(exe: Path, data: Path, meta: dict[str, int], policy: str, slots: int,
          work: Path) -> tuple[float, float, str]:
    """(instructions, mispredicted conditional branches) per layer-decision of one
    configuration's loop under callgrind's branch simulation, and the harness's check."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("--count needs valgrind on PATH")
    out_file = work / "callgrind.out"
    out = subprocess.run([valgrind, "--tool=callgrind", "--branch-sim=yes",
                          f"--callgrind-out-file={out_file}",
                          "--toggle-collect=moecache_core::replay_fast*", str(exe), str(data),
                          str(meta["n_layers"]), str(meta["n_experts"]), str(meta["top_k"]),
                          str(meta["pred_width"]), policy, str(slots), "1"],
                         check=True, capture_output=True, text=True).stdout
    m = re.search(r"check=(-?[0-9]+)", out)
    events = totals = None
    for line in out_file.read_text().splitlines():
        if line.startswith("events:"):
            events = line.split()[1:]
        elif line.startswith(("summary:", "totals:")):
            totals = [int(x) for x in line.split()[1:]]
    out_file.unlink()
    if m is None or events is None or totals is None:
        raise SystemExit(f"{exe}: no callgrind totals")
    got = dict(zip(events, totals, strict=False))
    rows = meta["n_rows"]
    return got["Ir"] / rows, got["Bcm"] / rows, m.group(1)


def table_head(title: str, columns: list[str]) -> None:
    """A table's title line and its Markdown head: a row per budget, a column each."""
    print(title)
    print()
    print("| slots | " + " | ".join(columns) + " |")
    print("|---" * (len(columns) + 1) + "|")


def count_grid(builds: dict[str, Path], data: Path, meta: dict[str, int],
               policies: list[str], slots_list: list[int], work: Path) -> None:
    names = list(builds)
    table_head(f"{meta['n_rows']:,} rows; per layer-decision, instructions, mispredicted "
               f"conditional branches (callgrind --branch-sim=yes); cells: {' / '.join(names)}",
               policies)
    for slots in slots_list:
        cells = []
        for policy in policies:
            got = {name: count(exe, data, meta, policy, slots, work)
                   for name, exe in builds.items()}
            if len({check for _, _, check in got.values()}) != 1:
                raise SystemExit(f"{policy} at {slots} slots: the builds' results differ")
            cells.append(" / ".join(f"{got[n][0]:.0f}, {got[n][1]:.1f}" for n in names))
        print(f"| {slots} | " + " | ".join(cells) + " |")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=2000)
    ap.add_argument("--against", default=None, help="a git revision to compare with")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    ap.add_argument("--count", action="store_true",
                    help="count instructions and mispredicted branches (valgrind) instead "
                         "of timing")
    ap.add_argument("--slots", default=",".join(map(str, SLOTS)),
                    help="budgets in slots, comma-separated (--count)")
    ap.add_argument("--policies", default=",".join(POLICIES),
                    help="presets, comma-separated (--count)")
    args = ap.parse_args()
    work, trace_path = bench_trace(args.dir, args.tokens, "moescope-loop-bench-")
    data = work / "routing"
    data.mkdir(exist_ok=True)
    meta = dump(Routing.from_trace(read_trace(trace_path)), data)
    builds = {"this checkout": build(REPO / "native", work / "harness_new")}
    if args.against:
        builds = {args.against: build(revision_native(args.against, work), work / "harness_old"),
                  **builds}
    if args.count:
        count_grid(builds, data, meta, args.policies.split(","),
                   [int(x) for x in args.slots.split(",")], work)
        return 0
    names = list(builds)
    table_head(f"{args.tokens} tokens, {meta['n_rows']:,} rows; ns per layer-decision, CPU, "
               f"best of {args.reps}, one thread, plan kept; cells: {' / '.join(names)}",
               [*POLICIES, "mean"])
    totals = dict.fromkeys(names, 0.0)
    for slots in SLOTS:
        cells, means = [], dict.fromkeys(names, 0.0)
        for policy in POLICIES:
            got = {name: run(exe, data, meta, policy, slots, args.reps)
                   for name, exe in builds.items()}
            if len({check for _, check in got.values()}) != 1:
                raise SystemExit(f"{policy} at {slots} slots: the builds' results differ")
            for name in names:
                means[name] += got[name][0] / len(POLICIES)
                totals[name] += got[name][0] / len(POLICIES) / len(SLOTS)
            cells.append(" / ".join(f"{got[name][0]:.0f}" for name in names))
        print(f"| {slots} | " + " | ".join(cells) + " | "
              + " / ".join(f"{means[name]:.0f}" for name in names) + " |")
    print()
    print("what-if grid, mean ns a decision: " + " / ".join(
        f"{totals[name]:.0f} ({1e3 / totals[name]:.2f} M/s)" for name in names))
    batch = {name: run(exe, data, meta, ",".join(POLICIES), 128, args.reps)
             for name, exe in builds.items()}
    if len({check for _, check in batch.values()}) != 1:
        raise SystemExit("the 8-policy batch's results differ between the builds")
    print("8 policies at 128 slots in one batch: " + " / ".join(
        f"{batch[name][0]:.0f} ns ({1e3 / batch[name][0]:.2f} M/s)" for name in names))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
