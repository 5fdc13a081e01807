#!/usr/bin/env python3
"""Decode speed of a model larger than the memory it may use (issue 16): stock
llama-cpp-python (memory map, cache off) against MoEScope's policies with the RAM tier, at a
memory limit and without one, side by side in one run.

The limit is a memory cgroup (v1 ``memory.limit_in_bytes`` or v2 ``memory.max``; page cache
included, as on a machine with that much RAM); each variant runs in its own child process
moved into the group, so one variant's page cache never helps the next (the page cache is
dropped before each limited variant). Each child loads the model once, decodes ``--warmup``
tokens untimed, then decodes ``--tokens`` tokens greedily ``--runs`` times (the expert
cache emptied before each) and reports the median tok/s, MB read from disk per token and
the disk read rate it achieved over the decode (prefill excluded). The disk's own
sequential read rate (O_DIRECT, 8 MiB reads) is printed beside it. The runs without the
limit start with the model file in the page cache (read once before them), as on a machine
with RAM to spare; MoEScope runs there with the RAM tier off (today's behaviour), so
"ratio" is each variant's speed at the limit against its own speed with enough RAM.

Threads: one by default. ggml's CPU backend synchronises its threads with OpenMP barriers
that spin; on a machine whose cores are shared with other jobs, two threads on two busy
cores waste most of their time spinning while the other thread is descheduled (stock fell
from ~17 to ~1-2 tok/s here, MoEScope alike). Children run with ``OMP_WAIT_POLICY=passive``
so a larger ``--threads`` degrades less on a busy machine.

"Stock" is this engine with the cache off and no host-experts layout: the code path of
llama-cpp-python 0.3.36 (the patch adds nothing to it), experts read by page faults on the
memory map.

Needs root (to make the cgroup). Usage:
    sudo .venv/bin/python bench/disk_bench.py [--model M.gguf] [--limit-mb 1000]
        [--tokens 24] [--runs 3] [--budget 20%] [--ram-budget 8slots]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
POLICIES = ("exact", "quality-first", "speed-first", "psr")
NO_AHEAD = "+noahead"  # a policy name with this suffix runs with the read-ahead off
PROMPT = "Hi"  # short: the prompt is read through the memory map (prefill), decode is timed


# ----------------------------------------------------------------------------- cgroups
def _cgroup_root() -> tuple[str, Path]:
    """("v1", memory controller mount) or ("v2", unified mount)."""
    mounts = Path("/proc/mounts").read_text().splitlines()
    for line in mounts:
        _dev, where, fstype, opts, *_ = line.split()
        if fstype == "cgroup" and "memory" in opts.split(","):
            return "v1", Path(where)
    for line in mounts:
        _dev, where, fstype, *_ = line.split()
        if fstype == "cgroup2":
            return "v2", Path(where)
    raise SystemExit("no memory cgroup controller is mounted (see `mount | grep cgroup`)")


class MemoryLimit:
    """A memory cgroup with a byte limit; ``join(pid)`` moves a process into it."""

    def __init__(self, limit_bytes: int) -> None:
        self.kind, root = _cgroup_root()
        self.path = root / f"moescope-disk-bench-{os.getpid()}"
        self.path.mkdir()
        if self.kind == "v1":
            (self.path / "memory.limit_in_bytes").write_text(str(limit_bytes))
            with_swap = self.path / "memory.memsw.limit_in_bytes"
            if with_swap.exists():
                with_swap.write_text(str(limit_bytes))
        else:
            (self.path / "memory.max").write_text(str(limit_bytes))
            (self.path / "memory.swap.max").write_text("0")

    def procs_file(self) -> str:
        return str(self.path / "cgroup.procs")

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.kind == "v1" else "memory.peak"
        try:
            return int((self.path / name).read_text().split()[0])
        except (OSError, ValueError):
            return 0

    def reset_peak(self) -> None:
        if self.kind == "v1":
            with contextlib.suppress(OSError):
                (self.path / "memory.max_usage_in_bytes").write_text("0")

    def close(self) -> None:
        for _ in range(50):
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.1)


def drop_page_cache() -> None:
    """Start every variant cold, as after a reboot (root only; best effort)."""
    os.sync()
    with contextlib.suppress(OSError):
        Path("/proc/sys/vm/drop_caches").write_text("3\n")


def warm_page_cache(path: Path) -> None:
    """Read the whole file once (buffered) so the runs without a limit find it in RAM."""
    with open(path, "rb", buffering=0) as f:
        while f.read(8 << 20):
            pass


def sequential_read_mb_s(path: Path, limit: int = 1 << 30) -> float:
    """The disk's sequential read rate: O_DIRECT 8 MiB reads of the model file (the page
    cache dropped first, so a file system without O_DIRECT still reads from disk)."""
    import mmap

    drop_page_cache()
    flags = os.O_RDONLY | getattr(os, "O_DIRECT", 0)
    try:
        fd = os.open(path, flags)
    except OSError:
        fd = os.open(path, os.O_RDONLY)
    buf = mmap.mmap(-1, 8 << 20)
    total = 0
    t0 = time.perf_counter()
    try:
        while total < limit:
            n = os.readv(fd, [buf])
            if n <= 0:
                break
            total += n
    finally:
        os.close(fd)
    return total / 1e6 / (time.perf_counter() - t0)


# ----------------------------------------------------------------------------- one variant
def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Runs inside the cgroup: load, decode ``runs`` times, report."""
    from moescope.engine import Engine, Sampling

    e = Engine()
    t0 = time.perf_counter()
    kw: dict[str, Any] = dict(n_ctx=256, n_threads=spec["threads"])
    if spec["policy"] == "stock":
        e.load(spec["model"], cache=False, host_experts=False, **kw)
    else:
        from moescope.sim.sweep import parse_policy

        policy = parse_policy(spec["policy"].split("+")[0])  # a preset or preset:key=value
        e.load(spec["model"], budget=spec["budget"], policy=policy,
               ram_budget=spec["ram_budget"], **kw)
    load_s = time.perf_counter() - t0
    if spec["warmup"] > 0:
        for _ in e.generate(PROMPT, Sampling(max_tokens=spec["warmup"], temperature=0.0)):
            pass
    runs = []
    for _ in range(spec["runs"]):
        e.clear_cache()
        n, first, last = 0, 0.0, 0.0
        disk = 0
        before: dict[str, int] = {}
        for tok in e.generate(PROMPT, Sampling(max_tokens=spec["tokens"], temperature=0.0)):
            now = time.perf_counter()
            if n == 0:  # prefill and the first token done: the decode starts here
                first = now
                before = e.timings() if e.cache else {}
            else:
                disk += tok.cache.bytes_disk
            last = now
            n += 1
        after = e.timings() if e.cache else {}
        decode_s = last - first
        read = after.get("disk_bytes", 0) - before.get("disk_bytes", 0)
        runs.append({"tok_s": (n - 1) / decode_s if n > 1 and decode_s > 0 else 0.0,
                     "tokens": n, "decode_s": decode_s,
                     "disk_mb_per_token": disk / 1e6 / max(n - 1, 1),
                     "read_mb_s": read / 1e6 / decode_s if decode_s > 0 else 0.0,
                     "disk_s": (after.get("disk_us", 0) - before.get("disk_us", 0)) / 1e6,
                     "wait_s": (after.get("wait_us", 0) - before.get("wait_us", 0)) / 1e6})
    out = {"load_s": load_s, "runs": runs,
           "disk_experts": bool(e.model and e.model.disk_experts),
           "ram_slots": e.ram_slots_per_layer if e.cache else 0,
           "slots": e.slots_per_layer}
    e.close()
    return out


def run_variant(spec: dict[str, Any], limit: MemoryLimit | None) -> dict[str, Any]:
    if limit:
        drop_page_cache()
    procs = limit.procs_file() if limit else None
    if limit:
        limit.reset_peak()

    def enter() -> None:
        if procs:
            with open(procs, "w") as f:
                f.write(str(os.getpid()))

    with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
        cmd = [sys.executable, __file__, "--child", json.dumps(spec), "--out", out.name]
        env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
        if spec["policy"].endswith(NO_AHEAD):
            env["MOESCOPE_READAHEAD"] = "0"
        proc = subprocess.run(cmd, preexec_fn=enter, capture_output=True, text=True,
                              timeout=spec["timeout"], check=False, env=env)
        if proc.returncode != 0:
            tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
            return {"error": f"exit {proc.returncode}: " + " | ".join(tail)}
        result: dict[str, Any] = json.loads(Path(out.name).read_text())
    if limit:
        result["peak_mb"] = limit.peak_bytes() / 1e6
    return result


# ----------------------------------------------------------------------------- main
def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None,
                   help="GGUF (default: a 2.7 GB synthetic qwen3moe, 12 layers x 128 experts "
                        "of 1.67 MB, top-8, written once under --workdir)")
    p.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "disk-bench")
    p.add_argument("--limit-mb", type=int, default=1000)
    p.add_argument("--tokens", type=int, default=24)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--budget", default="20%", help="expert slots (default 20%%)")
    p.add_argument("--ram-budget", default="8 slots",
                   help="RAM tier at the limit (default 8 slots: one token's top-k)")
    p.add_argument("--threads", type=int, default=1,
                   help="decode threads (default 1: see the module docstring)")
    p.add_argument("--warmup", type=int, default=4, help="untimed tokens after load")
    p.add_argument("--policies", default=",".join(POLICIES),
                   help=f"comma-separated; a name ending in {NO_AHEAD} (e.g. exact{NO_AHEAD}) "
                        "runs that policy with the disk read-ahead off")
    p.add_argument("--timeout", type=int, default=900, help="seconds per variant")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(child(json.loads(args.child))))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("disk_bench needs root to make a memory cgroup")
    if args.runs < 3:
        raise SystemExit("--runs must be at least 3 (medians)")
    if not (1 <= args.tokens <= 4096 and 0 <= args.warmup <= 4096 and 1 <= args.threads <= 256
            and 64 <= args.limit_mb <= 10**7):
        raise SystemExit("--tokens 1-4096, --warmup 0-4096, --threads 1-256, --limit-mb 64-1e7")
    model = args.model
    if model is None:
        from moescope_testing.synth import ensure_synth_model, preset

        args.workdir.mkdir(parents=True, exist_ok=True)
        model = ensure_synth_model(args.workdir, preset("copy-bound", "qwen3moe", n_layers=12))
    size = model.stat().st_size
    limit_bytes = args.limit_mb * 10**6
    print(f"model   {model.name}: {size / 1e9:.2f} GB ({size / limit_bytes:.1f}x the "
          f"{args.limit_mb} MB limit)")
    seq = sequential_read_mb_s(model)
    print(f"disk    sequential read {seq:.0f} MB/s (O_DIRECT, 8 MiB reads, page cache dropped)")
    print(f"decode  {args.tokens} tokens greedy x {args.runs} runs per variant (median), "
          f"slots {args.budget}, RAM tier at the limit {args.ram_budget}, "
          f"{args.threads} threads")
    variants = ["stock", *[s for s in args.policies.split(",") if s and s != "stock"]]
    results: dict[str, dict[str, Any]] = {}
    for limited in (True, False):
        limit = MemoryLimit(limit_bytes) if limited else None
        if not limited:
            warm_page_cache(model)
        try:
            for name in variants:
                spec = {"model": str(model), "policy": name, "budget": args.budget,
                        "ram_budget": args.ram_budget if limited else None,
                        "tokens": args.tokens, "runs": args.runs, "threads": args.threads,
                        "warmup": args.warmup,
                        "timeout": args.timeout}
                key = f"{name}@{'limit' if limited else 'free'}"
                t0 = time.perf_counter()
                results[key] = run_variant(spec, limit)
                results[key]["wall_s"] = time.perf_counter() - t0
                print(f"  {key:24s} done in {results[key]['wall_s']:.0f} s", flush=True)
        finally:
            if limit:
                limit.close()
    print()
    header = ["variant", f"tok/s @{args.limit_mb}MB", "runs", "tok/s free", "runs", "ratio",
              "disk MB/tok", "read MB/s", "of seq.", "reading %", "peak MB", "load s"]
    rows = []
    for name in variants:
        lim, free = results[f"{name}@limit"], results[f"{name}@free"]
        if "error" in lim or "error" in free:
            rows.append([name, lim.get("error", "")[:60], free.get("error", "")[:60]])
            continue
        med = statistics.median(r["tok_s"] for r in lim["runs"])
        med_free = statistics.median(r["tok_s"] for r in free["runs"])
        read = statistics.median(r["read_mb_s"] for r in lim["runs"])
        disk = statistics.median(r["disk_mb_per_token"] for r in lim["runs"])
        busy = statistics.median(r["disk_s"] / r["decode_s"] if r["decode_s"] > 0 else 0.0
                                 for r in lim["runs"])
        mine = name != "stock"
        rows.append([name, f"{med:.2f}", "/".join(f"{r['tok_s']:.1f}" for r in lim["runs"]),
                     f"{med_free:.1f}", "/".join(f"{r['tok_s']:.1f}" for r in free["runs"]),
                     f"{med / med_free:.0%}" if med_free else "-",
                     f"{disk:.1f}" if mine else "(faults)",
                     f"{read:.0f}" if mine else "-",
                     f"{read / seq:.0%}" if mine and seq else "-",
                     f"{busy:.0%}" if mine else "-",
                     f"{lim.get('peak_mb', 0):.0f}", f"{lim['load_s']:.1f}"])
    widths = [max(len(str(r[i])) for r in [header, *rows] if i < len(r))
              for i in range(len(header))]
    print("ratio: tok/s at the limit / tok/s free; read MB/s: bytes read from the file per "
          "second of decode; reading %: time in reads / decode time")
    for r in [header, *rows]:
        print("  ".join(str(c).rjust(w) if i else str(c).ljust(w)
                        for i, (c, w) in enumerate(zip(r, widths, strict=False))))
    if args.json:
        args.json.write_text(json.dumps({"model": str(model), "size": size,
                                         "limit_mb": args.limit_mb, "seq_mb_s": seq,
                                         "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
