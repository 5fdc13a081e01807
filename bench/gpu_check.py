#!/usr/bin/env python3
"""GPU check: build the patched engine with CUDA and prove the speedups, in one run.

What it does, on a GPU machine with no network (``bash bench/gpu_check.sh``):

1. checks ``bundle/`` (``make gpu-bundle``: trimmed, patched llama-cpp-python source and
   wheels) against the repository, unpacks it and installs the wheels whose packages do
   not import;
2. starts writing the synthetic model in the background (``moescope_testing.synth``,
   preset ``qwen3-30b-a3b-like``: hidden 2048, 128 experts, top-8, expert width 768,
   q4_0 experts; ``--layers`` of the real 48, printed with the results);
3. builds libllama + ggml with CUDA for sm_90 only, through the engine builder's own
   CMake + ninja build (``engine_patch.builder.cmake_build``, all cores), in
   build/gpu-check so that a rerun on the same machine only relinks;
4. measures host-to-device copy bandwidth, pinned and pageable (PyTorch), for one expert
   matrix and for 256 MiB;
5. measures decode tokens/s (greedy, ``--tokens`` tokens, median of ``--runs`` runs after
   a warm-up run), every configuration in its own process, non-expert weights on the GPU:

   * ``reference``   cache off, every expert in VRAM: the upper bound, and the reference
                     logits for exactness;
   * ``stock``       stock llama.cpp with the experts in host memory, as ``-ot exps=CPU``
                     does it: ``tensor_buft_overrides = {{"exps", CPU buffer type}}``
                     built with ctypes (llama-cpp-python declares the field c_void_p).
                     The loader then puts the experts in the CPU's extra buffer types
                     (CPU_REPACK) and the CPU computes them, exactly as stock llama.cpp
                     does; with the cache off, our patch is inert (no route op in the
                     graph, loader unchanged), so this *is* stock behaviour without a
                     second CUDA build. ``llama_moe_set_host_experts(true)`` would instead
                     keep plain, unrepacked experts: slower CPU kernels, an unfair
                     baseline. The thread count is swept and the best kept;
   * ``exact``, ``quality-first``, ``speed-first``  MoEScope's expert cache at 25%
                     residency (slots in VRAM, experts in host memory);
   * ``vulkan``      ``exact`` on a second, Vulkan build of the same tree (the engine AMD
                     and Intel users get), when the machine has glslc, the Vulkan headers
                     and a Vulkan driver for the GPU; otherwise a skipped row saying what
                     was missing. Its max |dlogit| is against the CUDA reference (other
                     kernels: close, not bitwise);

6. checks exactness on the GPU: teacher-forced logits of ``exact`` (and of the other
   policies, for reference) against the ``reference`` run: max abs difference, top-1
   agreement;
7. prints a short table last and writes JSON (and the table) under ``$OUT`` when set.

``--dry-run`` runs the same driver on a CPU machine: no build (the installed engine is
used; with ``--bundle`` the archive's Python package is imported with the installed
library, as on the GPU machine), a small model, few tokens, bandwidth of host memcpy.
tests/bench/test_gpu_check_dry_run.py runs it in ``make test``.

The parts: this file is the driver (standard library only: the machine's python3 runs it);
``gpu_check_configs.py`` the model and configurations, ``gpu_check_prepare.py`` the bundle
and the builds, ``gpu_check_children.py`` the child processes (internal sub-commands
``_synth``, ``_bandwidth``, ``_config``), ``gpu_check_report.py`` the verdict and table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import BUNDLE_DIR, REPO, Clock, builder
from gpu_check_children import cmd_bandwidth, cmd_config, cmd_synth
from gpu_check_configs import (
    CONFIGS,
    DEFAULT_DEADLINE_S,
    DEFAULT_LAYERS,
    DRY_OVERRIDES,
    FULL_LAYERS,
    PRESET,
    TAG,
)
from gpu_check_prepare import (
    build_engine,
    build_vulkan,
    host_info,
    install_wheels,
    installed_lib_dir,
    unpack_bundle,
)
from gpu_check_report import RunShape, summarize


class Check:
    """The orchestrating parent: standard library only (the machine's python3)."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.dry = bool(args.dry_run)
        self.clock = Clock(float(os.environ.get("GPU_CHECK_T0") or time.time()))
        self.work: Path = (args.work or REPO / "build" / "gpu-check"
                           / ("dry-run" if self.dry else "cuda")).resolve()
        self.work.mkdir(parents=True, exist_ok=True)
        self.out = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
        self.report: dict[str, Any] = {"mode": "dry-run" if self.dry else "gpu",
                                       "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                       "phases": {}, "errors": []}
        self.src_root: Path | None = None
        self.lib_dir: Path | None = None
        self.vulkan_lib_dir: Path | None = None  # the Vulkan row's build, when there is one
        self.vulkan_skipped = "a GPU run only"
        self.pydeps = self.work / "pydeps"
        self.extra_ld: list[str] = []
        self.jobs = args.jobs or os.cpu_count() or 4
        self.layers = args.layers or (DRY_OVERRIDES["n_layers"] if self.dry
                                      else DEFAULT_LAYERS)

    def say(self, msg: str) -> None:
        self.clock.say(TAG, msg)

    def label(self, name: str) -> str:
        if name == "reference" and self.dry:
            return "cache off, host experts (ref)"  # CPU: the exactness tests' reference
        return str(CONFIGS[name]["label"])

    def phase(self, name: str, t0: float) -> None:
        self.report["phases"][name] = round(time.time() - t0, 1)

    # ------------------------------------------------------------------ environment
    def child_env(self, engine: bool = True) -> dict[str, str]:
        """The children's environment: the archive's llama_cpp, the app, the installed
        wheels; with ``engine``, the built libraries and the CUDA/cuBLAS library folders
        (left out for the PyTorch bandwidth child, which brings its own)."""
        env = dict(os.environ)
        paths = [str(self.src_root)] if self.src_root else []
        paths += [str(REPO / "app")]
        if self.pydeps.is_dir():
            paths.append(str(self.pydeps))
        if env.get("PYTHONPATH"):
            paths.append(env["PYTHONPATH"])
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PYTHONUNBUFFERED"] = "1"
        if not engine:
            return env
        if self.lib_dir is not None:
            env["LLAMA_CPP_LIB_PATH"] = str(self.lib_dir)
            env["MOESCOPE_NATIVE_LIB"] = str(self.lib_dir / "libllama.so")
        ld = [str(self.lib_dir)] if self.lib_dir else []
        ld += self.extra_ld
        if env.get("LD_LIBRARY_PATH"):
            ld.append(env["LD_LIBRARY_PATH"])
        if ld:
            env["LD_LIBRARY_PATH"] = os.pathsep.join(ld)
        return env

    # ------------------------------------------------------------------ prepare
    def prepare_bundle(self) -> None:
        """The bundle, on a GPU run (or a dry run given --bundle): checked, unpacked, its
        wheels installed where a package does not import."""
        bundle = self.args.bundle or (None if self.dry else BUNDLE_DIR)
        if bundle is None:
            return
        t0 = time.time()
        self.src_root, self.report["bundle"] = unpack_bundle(
            bundle, self.work, self.args.allow_stale, self.say)
        install_wheels(bundle, self.pydeps, self.say)
        self.phase("bundle", t0)

    def prepare_engine(self) -> None:
        """The engine: built from the bundle on the GPU (CUDA, then Vulkan), or CPU only for
        a dry run's --build; else the installed one."""
        if self.dry and self.args.build:
            if self.src_root is None:
                raise SystemExit(f"[{TAG}] ERROR: --build needs --bundle")
            self.build(cuda=False)
        elif self.dry:
            if self.src_root is not None:  # the archive's llama_cpp, installed library
                self.lib_dir = installed_lib_dir()
                if self.lib_dir is None:
                    raise SystemExit(f"[{TAG}] ERROR: no installed engine (make engine)")
        else:
            self.build()
            self.build_vulkan()

    def build(self, cuda: bool = True) -> None:
        assert self.src_root is not None
        a = self.args
        try:
            built = build_engine(self.src_root, self.work, cuda=cuda, cuda_arch=a.cuda_arch,
                                 portable_cpu=a.portable_cpu, jobs=self.jobs, say=self.say)
        except builder.BuildError as err:
            self.fail_build(self.work / "build.log", str(err))
        self.lib_dir, self.extra_ld = built.lib_dir, built.extra_ld
        self.report["build"] = {"cmake_args": built.cmake_args, "dir": str(built.lib_dir.parent),
                                "jobs": self.jobs, "seconds": built.seconds}
        self.report["phases"]["build"] = built.seconds
        self.say(f"engine built in {built.seconds:.0f} s: {built.lib_dir}")

    def build_vulkan(self) -> None:
        """The ``vulkan`` row's engine; a missing toolchain or driver, or a failed build,
        only skips that row."""
        assert self.src_root is not None
        if "vulkan" not in self.args.configs.split(","):
            self.vulkan_skipped = "not asked for"
            return
        try:
            built = build_vulkan(self.src_root, self.work, self.jobs, self.say)
        except builder.BuildError as err:
            self.vulkan_skipped = f"the Vulkan build failed: {err}"
            self.report["errors"].append(self.vulkan_skipped)
            return
        if isinstance(built, str):
            self.vulkan_skipped = built
            return
        self.vulkan_lib_dir = built.lib_dir
        self.report["phases"]["build_vulkan"] = built.seconds
        self.say(f"Vulkan engine built in {built.seconds:.0f} s")

    def fail_build(self, log: Path, msg: str) -> NoReturn:
        if log.exists():
            print("\n".join(log.read_text(errors="replace").splitlines()[-60:]), flush=True)
        self.report["errors"].append(msg)
        if self.out is not None and log.exists():
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "gpu_check_build.log").write_bytes(log.read_bytes()[-4_000_000:])
        self.write_report()
        raise SystemExit(f"[{TAG}] ERROR: {msg}")

    def child(self, argv: list[str], timeout: float, engine: bool = True,
              lib_dir: Path | None = None) -> int:
        cmd = [sys.executable, str(Path(__file__).resolve()), *argv]
        env = self.child_env(engine)
        if lib_dir is not None:  # another backend's libraries (the Vulkan row)
            env["LLAMA_CPP_LIB_PATH"] = str(lib_dir)
            env["MOESCOPE_NATIVE_LIB"] = str(lib_dir / "libllama.so")
            env["LD_LIBRARY_PATH"] = os.pathsep.join(
                [str(lib_dir), env.get("LD_LIBRARY_PATH", "")])
        try:
            return subprocess.run(cmd, env=env, timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            self.report["errors"].append(f"{argv[0]} timed out after {timeout:.0f} s")
            return 124

    def start_synth(self) -> tuple[subprocess.Popen[bytes], Path, Path]:
        models = self.work / "models"
        models.mkdir(exist_ok=True)
        info = self.work / "model.json"
        info.unlink(missing_ok=True)
        log = self.work / "synth.log"
        argv = ["_synth", "--dir", str(models), "--layers", str(self.layers),
                "--expert-type", self.args.expert_type, "--json", str(info)]
        if self.dry:
            argv.append("--small")
        self.say(f"writing the model in the background ({PRESET}, {self.layers} of "
                 f"{FULL_LAYERS} layers, {self.args.expert_type} experts)")
        with log.open("w") as f:
            proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), *argv],
                                    env=self.child_env(), stdout=f, stderr=subprocess.STDOUT)
        return proc, info, log

    def wait_synth(self, proc: subprocess.Popen[bytes], info: Path, log: Path) -> dict[str, Any]:
        t0 = time.time()
        rc = proc.wait()
        if rc != 0 or not info.exists():
            print(log.read_text(errors="replace")[-4000:], flush=True)
            raise SystemExit(f"[{TAG}] ERROR: writing the model failed ({rc})")
        model: dict[str, Any] = json.loads(info.read_text())
        self.phase("wait_model", t0)
        self.say(f"model ready: {Path(model['path']).name} ({model['bytes'] / 2**30:.2f} GiB,"
                 f" written in {model['seconds']} s)")
        return model

    def bandwidth(self, model: dict[str, Any]) -> dict[str, Any]:
        t0 = time.time()
        path = self.work / "bandwidth.json"
        path.unlink(missing_ok=True)
        chunk = model["n_embd"] * model["n_ff_exp"] * (18 if model["expert_type"] == "q4_0"
                                                       else 34) // 32
        argv = ["_bandwidth", "--json", str(path), "--chunk-bytes", str(chunk)]
        if self.dry:
            argv += ["--host", "--big-bytes", str(16 * 2**20)]
        rc = self.child(argv, timeout=180, engine=False)
        self.phase("bandwidth", t0)
        if rc != 0 or not path.exists():
            self.report["errors"].append("bandwidth measurement failed")
            return {}
        data: dict[str, Any] = json.loads(path.read_text())
        return data

    def run_configs(self, model: dict[str, Any]) -> dict[str, dict[str, Any]]:
        results: dict[str, dict[str, Any]] = {}
        ref_logits = self.work / "logits-reference.npy"
        ref_logits.unlink(missing_ok=True)
        cpus = os.cpu_count() or 2
        threads = self.args.threads or (1 if self.dry else max(1, cpus // 2))
        sweep = ("" if self.dry else ",".join(str(t) for t in sorted({max(1, cpus // 2), cpus})))
        durations: list[float] = []
        t_start = time.time()
        for name in self.args.configs.split(","):
            if name not in CONFIGS:
                raise SystemExit(f"[{TAG}] ERROR: unknown configuration {name}")
            runs = self.args.runs
            left = self.args.deadline - self.clock.elapsed() if self.args.deadline else 1e9
            typical = statistics.median(durations) if durations else 0.0
            if left < 20:
                self.say(f"{name}: skipped, out of time ({left:.0f} s left)")
                results[name] = {"name": name, "label": self.label(name),
                                 "skipped": "out of time"}
                continue
            if runs > 1 and typical and left < 1.5 * typical:
                runs = 1
                self.say(f"{name}: {left:.0f} s left, 1 timed run instead of {self.args.runs}")
            if CONFIGS[name].get("backend") == "vulkan" and self.vulkan_lib_dir is None:
                self.say(f"{name}: skipped ({self.vulkan_skipped})")
                results[name] = {"name": name, "label": self.label(name),
                                 "skipped": f"skipped: {self.vulkan_skipped}"}
                continue
            out = self.work / f"config-{name}.json"
            out.unlink(missing_ok=True)
            argv = ["_config", "--name", name, "--model", model["path"], "--json", str(out),
                    "--tokens", str(self.args.tokens), "--runs", str(runs),
                    "--n-gpu-layers", "0" if self.dry else "-1", "--threads", str(threads),
                    "--forced", str(self.args.forced)]
            if name == "stock" and sweep and runs > 1:
                argv += ["--thread-sweep", sweep]
            if name == "reference" and self.dry:
                argv.append("--host-experts")
            if name != "stock" and self.args.forced > 0:
                logits = ref_logits if name == "reference" else self.work / f"logits-{name}.npy"
                argv += ["--logits", str(logits)]
                if name != "reference":
                    argv += ["--reference-logits", str(ref_logits)]
            t0 = time.time()
            self.say(f"{name}: {self.label(name)}")
            rc = self.child(argv, timeout=max(60.0, min(600.0, left + 60)),
                            lib_dir=self.vulkan_lib_dir if CONFIGS[name].get("backend")
                            else None)
            durations.append(time.time() - t0)
            if rc != 0 or not out.exists():
                self.say(f"{name}: FAILED (exit {rc})")
                self.report["errors"].append(f"configuration {name} failed (exit {rc})")
                results[name] = {"name": name, "label": self.label(name),
                                 "error": f"exit {rc}"}
                continue
            results[name] = json.loads(out.read_text())
            self.report["configs"] = results
            self.write_report()  # partial results survive a kill at the time limit
        self.phase("configs", t_start)
        return results

    # ------------------------------------------------------------------ summary
    def write_report(self) -> None:
        text = json.dumps(self.report, indent=2, default=str)
        (self.work / "gpu_check.json").write_text(text)
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "gpu_check.json").write_text(text)

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        a = self.args
        self.report["host"] = host_info()
        self.report["args"] = {k: (str(v) if isinstance(v, Path) else v)
                               for k, v in vars(a).items()}
        self.say(f"{'dry run (CPU)' if self.dry else 'GPU run'}; work dir {self.work}")
        self.prepare_bundle()
        synth, info, slog = self.start_synth()
        try:
            self.prepare_engine()
        except BaseException:
            synth.kill()
            raise
        model = self.wait_synth(synth, info, slog)
        self.report["model"] = model
        self.write_report()
        bw = self.bandwidth(model)
        self.report["bandwidth"] = bw
        results = self.run_configs(model)
        self.report["configs"] = results
        shape = RunShape(a.tokens, a.runs, a.forced, self.dry,
                         self.report["host"].get("gpu", "GPU"))
        summary = summarize(model, bw, results, shape)
        self.report["rows"], self.report["verdict"] = summary.rows, summary.verdict
        lines = summary.lines
        self.report["elapsed_s"] = round(self.clock.elapsed(), 1)
        self.report["table"] = lines
        self.write_report()
        text = "\n".join(lines) + "\n"
        (self.work / "gpu_check_table.txt").write_text(text)
        if self.out is not None:
            (self.out / "gpu_check_table.txt").write_text(text)
        self.say(f"done in {self.clock.elapsed():.0f} s; JSON: "
                 f"{(self.out or self.work) / 'gpu_check.json'}")
        print("\n" + text, end="", flush=True)
        return 1 if self.report["errors"] else 0



def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="bench/gpu_check.sh",
        description="Build the patched engine with CUDA and measure MoEScope's speedups.")
    ap.add_argument("--dry-run", action="store_true",
                    help="CPU machine: no build, small model, few tokens (for tests)")
    ap.add_argument("--bundle", type=Path, default=None,
                    help="bundle folder (default bundle/ on a GPU run; none in a dry run)")
    ap.add_argument("--allow-stale", action="store_true",
                    help="use a bundle made from other patches (warns)")
    ap.add_argument("--work", type=Path, default=None,
                    help="work folder (default build/gpu-check/{cuda,dry-run})")
    ap.add_argument("--layers", type=int, default=0,
                    help=f"model layers (default {DEFAULT_LAYERS} of {FULL_LAYERS}; 2 in a "
                         "dry run)")
    ap.add_argument("--expert-type", choices=("q4_0", "q8_0"), default="q4_0")
    ap.add_argument("--tokens", type=int, default=0, help="decoded tokens (128; dry 16)")
    ap.add_argument("--runs", type=int, default=0, help="timed runs per config (3; dry 2)")
    ap.add_argument("--forced", type=int, default=-1,
                    help="teacher-forced tokens for exactness (32; dry 8; 0 = skip)")
    ap.add_argument("--threads", type=int, default=0,
                    help="CPU threads (default: half the cores; 1 in a dry run)")
    ap.add_argument("--configs", default=",".join(CONFIGS),
                    help="comma list, in order (default: all)")
    ap.add_argument("--deadline", type=float, default=-1,
                    help="seconds from the start for everything, build included: later "
                         f"configs get 1 run, or are skipped (default {DEFAULT_DEADLINE_S};"
                         " dry run: none)")
    ap.add_argument("--build", action="store_true",
                    help="dry run: build the engine (CPU only) from --bundle instead of "
                         "using the installed one (minutes: checks the archive compiles)")
    ap.add_argument("--jobs", type=int, default=0, help="build jobs (default: all cores)")
    ap.add_argument("--cuda-arch", default="90", help="CMAKE_CUDA_ARCHITECTURES (90)")
    ap.add_argument("--portable-cpu", action="store_true",
                    help="GGML_NATIVE=OFF for the CPU code (default: native)")
    a = ap.parse_args(argv)
    dry = a.dry_run
    a.tokens = a.tokens or (16 if dry else 128)
    a.runs = a.runs or (2 if dry else 3)
    a.forced = a.forced if a.forced >= 0 else (8 if dry else 32)
    a.deadline = a.deadline if a.deadline >= 0 else (0 if dry else DEFAULT_DEADLINE_S)
    return a


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    children = {"_synth": cmd_synth, "_bandwidth": cmd_bandwidth, "_config": cmd_config}
    if argv and argv[0] in children:
        return children[argv[0]](argv[1:])
    return Check(parse_args(argv)).run()


if __name__ == "__main__":
    sys.exit(main())
