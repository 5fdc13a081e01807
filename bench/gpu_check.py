#!/usr/bin/env python3
"""GPU check: build the patched engine with CUDA and prove the speedups, in one run.

What it does, on a GPU machine with no network (``bash bench/gpu_check.sh``):

1. checks ``bundle/`` (``make gpu-bundle``: trimmed, patched llama-cpp-python source and
   wheels) against the repository, unpacks it and installs the wheels whose packages do
   not import;
2. starts writing the synthetic model in the background (``moescope_testing.synth``,
   preset ``qwen3-30b-a3b-like``: hidden 2048, 128 experts, top-8, expert width 768,
   q4_0 experts; ``--layers`` of the real 48, printed with the results);
3. builds libllama + ggml with CUDA for sm_90 only (CMake + ninja, all cores), with the
   build in build/gpu-check so that a rerun on the same machine only relinks;
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

Internal sub-commands (run in child processes): ``_synth``, ``_bandwidth``, ``_config``.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _common import (
    ARCHIVE_NAME,
    BUNDLE_DIR,
    GPU_LEAN_FLAGS,
    GPU_PRESENT_IMPORTS,
    GPU_WHEELS,
    REPO,
    WHEELS_DIRNAME,
    Clock,
    gpu_cmake_args,
    load_build_engine,
    read_manifest,
    sha256_file,
    source_key,
)

PRESET = "qwen3-30b-a3b-like"
FULL_LAYERS = 48
# 16 of the 48 layers: the model (5.5 GiB) is written during the CUDA build, and five
# configurations fit in the ~2 minutes the build leaves of an 8-minute run. Ratios hardly
# depend on depth (every layer costs the same); --layers 48 when the build is cached.
DEFAULT_LAYERS = 16
DEFAULT_DEADLINE_S = 480
# The dry run's model: the preset's layout, shrunk (64 experts so that 25% = 16 slots >=
# top-8, q4_0 experts as on the GPU).
DRY_OVERRIDES: dict[str, Any] = dict(n_layers=2, n_embd=256, n_head=4, n_head_kv=2,
                                     head_dim=64, n_expert=64, top_k=8, n_ff_exp=128,
                                     n_ff=512, vocab_size=512, ctx=1024)
PROMPTS = (
    "The history of the expert cache begins with a question about memory.",
    "Once upon a time, in a small town by the sea, there lived a",
    "Explain why copying weights over PCIe is slower than reading them from VRAM.",
)
FORCED_PROMPT = [1]  # one token: governed by the cache at any budget (no prefill path)
CONFIGS: dict[str, dict[str, Any]] = {
    "reference": {"label": "cache off, all experts in VRAM", "cache": False},
    "stock": {"label": "stock llama.cpp, -ot exps=CPU", "cache": False, "stock": True},
    "exact": {"label": "MoEScope exact @25%", "cache": True, "policy": "exact"},
    "quality-first": {"label": "MoEScope quality-first @25%", "cache": True,
                      "policy": "quality-first"},
    "speed-first": {"label": "MoEScope speed-first @25%", "cache": True,
                    "policy": "speed-first"},
    # paper 2: routing bonus + prefetch of the next layer's predicted experts (copies
    # overlap compute); last, so a short deadline drops it before the paper-1 targets
    "psr": {"label": "MoEScope psr @25%", "cache": True, "policy": "psr"},
    # the Vulkan build on the same GPU (AMD/Intel users' engine): built only where glslc and
    # the Vulkan headers are installed and the GPU has a Vulkan driver, else a skipped row
    "vulkan": {"label": "MoEScope exact @25%, Vulkan", "cache": True, "policy": "exact",
               "backend": "vulkan"},
}
TARGET_QUALITY_VS_EXACT = 2.5
TAG = "gpu-check"


# =============================================================================== children
def cmd_synth(argv: list[str]) -> int:
    """Write (or reuse) the benchmark model; print one JSON line describing it."""
    ap = argparse.ArgumentParser(prog="gpu_check.py _synth")
    ap.add_argument("--dir", type=Path, required=True)
    ap.add_argument("--layers", type=int, required=True)
    ap.add_argument("--expert-type", default="q4_0")
    ap.add_argument("--small", action="store_true")
    ap.add_argument("--json", type=Path, required=True)
    a = ap.parse_args(argv)
    from moescope_testing import ensure_synth_model, estimate_file_bytes, preset

    overrides = dict(DRY_OVERRIDES) if a.small else {}
    overrides.update(n_layers=a.layers, expert_type=a.expert_type)
    spec = preset(PRESET, "qwen3moe", **overrides)
    t0 = time.perf_counter()
    path = ensure_synth_model(a.dir, spec)
    info = {"path": str(path), "seconds": round(time.perf_counter() - t0, 1),
            "bytes": path.stat().st_size, "estimated_bytes": estimate_file_bytes(spec),
            "preset": PRESET, "arch": spec.arch, "n_layers": spec.n_layers,
            "full_layers": FULL_LAYERS, "n_embd": spec.n_embd, "n_expert": spec.n_expert,
            "top_k": spec.top_k, "n_ff_exp": spec.n_ff_exp, "expert_type": spec.expert_type,
            "vocab_size": spec.vocab_size, "small": a.small}
    a.json.write_text(json.dumps(info, indent=2))
    print(json.dumps(info), flush=True)
    return 0


def _timed_copies(copy: Any, sync: Any, reps: int) -> float:
    sync()
    t0 = time.perf_counter()
    for _ in range(reps):
        copy()
    sync()
    return time.perf_counter() - t0


def cmd_bandwidth(argv: list[str]) -> int:
    """Host-to-device copy bandwidth, pinned and pageable (numpy memcpy with --host)."""
    ap = argparse.ArgumentParser(prog="gpu_check.py _bandwidth")
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--chunk-bytes", type=int, default=2048 * 768 * 18 // 32)  # q4_0 matrix
    ap.add_argument("--big-bytes", type=int, default=256 * 2**20)
    ap.add_argument("--host", action="store_true", help="no GPU: host memcpy only")
    a = ap.parse_args(argv)
    sizes = {"expert_matrix": a.chunk_bytes, f"{a.big_bytes / 2**20:.0f}MiB": a.big_bytes}
    out: dict[str, Any] = {"sizes": sizes, "gbps": {}}
    if a.host:
        import numpy as np

        out["backend"] = "numpy host-to-host memcpy (dry run, no GPU)"
        for label, n in sizes.items():
            src = np.ones(n, dtype=np.uint8)
            dst = np.empty_like(src)
            reps = max(3, min(500, (1 << 30) // n))
            np.copyto(dst, src)
            secs = _timed_copies(lambda s=src, d=dst: np.copyto(d, s), lambda: None, reps)
            out["gbps"][f"pageable_{label}"] = round(n * reps / secs / 1e9, 2)
    else:
        import torch

        dev = torch.device("cuda")
        out["backend"] = f"torch {torch.__version__}, {torch.cuda.get_device_name(dev)}"
        for label, n in sizes.items():
            dst = torch.empty(n, dtype=torch.uint8, device=dev)
            reps = max(5, min(400, (4 << 30) // n))
            for kind in ("pinned", "pageable"):
                src = torch.ones(n, dtype=torch.uint8, pin_memory=(kind == "pinned"))
                # like ggml_backend_tensor_set: one async copy, then wait for it
                dst.copy_(src, non_blocking=True)
                secs = _timed_copies(
                    lambda s=src, d=dst: (d.copy_(s, non_blocking=True),
                                          torch.cuda.current_stream().synchronize()),
                    torch.cuda.synchronize, reps)
                out["gbps"][f"{kind}_{label}"] = round(n * reps / secs / 1e9, 2)
    a.json.write_text(json.dumps(out, indent=2))
    print("  bandwidth: " + ", ".join(f"{k} {v} GB/s" for k, v in out["gbps"].items()),
          flush=True)
    return 0


_KEEP_ALIVE: list[Any] = []


@contextlib.contextmanager
def experts_in_host_memory(pattern: bytes = b"exps") -> Iterator[None]:
    """Load models as llama.cpp's ``-ot exps=CPU`` does: a NULL-terminated
    ``llama_model_tensor_buft_override`` array mapping tensors that match ``pattern`` to
    the CPU buffer type, set on the model params just before llama_model_load_from_file
    (llama-cpp-python's Llama has no argument for it and declares the field c_void_p)."""
    import ctypes

    from llama_cpp import llama_cpp as low

    class BuftOverride(ctypes.Structure):
        _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]

    cpu_buft = low._lib.ggml_backend_cpu_buffer_type  # libggml-base, via libllama's deps
    cpu_buft.restype = ctypes.c_void_p
    cpu_buft.argtypes = []
    overrides = (BuftOverride * 2)()
    overrides[0].pattern = pattern
    overrides[0].buft = cpu_buft()
    _KEEP_ALIVE.append(overrides)  # the model keeps a copy of the params
    original = low.llama_model_load_from_file

    def load(path_model: bytes, params: Any) -> Any:
        params.tensor_buft_overrides = ctypes.addressof(overrides)
        return original(path_model, params)

    low.llama_model_load_from_file = load
    try:
        yield
    finally:
        low.llama_model_load_from_file = original


def gpu_memory_used_mib() -> int | None:
    """nvidia-smi's memory.used of GPU 0, None without one."""
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used",
                              "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=20, check=False).stdout
        return int(out.split()[0])
    except (OSError, ValueError, IndexError, subprocess.SubprocessError):
        return None


def cmd_config(argv: list[str]) -> int:
    """Load one configuration, warm up, time decode runs, optionally forced logits."""
    ap = argparse.ArgumentParser(prog="gpu_check.py _config")
    ap.add_argument("--name", choices=tuple(CONFIGS), required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--json", type=Path, required=True)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--budget", default="25%")
    ap.add_argument("--n-gpu-layers", type=int, default=-1)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--thread-sweep", default="", help="comma list (stock): keep the best")
    ap.add_argument("--host-experts", action="store_true",
                    help="reference only: experts in plain host buffers (CPU dry run)")
    ap.add_argument("--forced", type=int, default=0, help="teacher-forced tokens (0: none)")
    ap.add_argument("--logits", type=Path, help="save forced logits here (.npy)")
    ap.add_argument("--reference-logits", type=Path, help="compare forced logits with these")
    a = ap.parse_args(argv)
    cfg = CONFIGS[a.name]
    import numpy as np
    from llama_cpp import llama_cpp as low

    from moescope.engine import Engine, Sampling

    label = "cache off, host experts (ref)" if a.host_experts else cfg["label"]
    result: dict[str, Any] = {"name": a.name, "label": label, "tokens": a.tokens,
                              "budget": a.budget if cfg["cache"] else None}
    mem0 = gpu_memory_used_mib()
    e = Engine()
    t0 = time.perf_counter()
    guard = experts_in_host_memory() if cfg.get("stock") else contextlib.nullcontext()
    with guard:
        e.load(a.model, budget=a.budget, policy=cfg.get("policy", "exact"),
               n_gpu_layers=a.n_gpu_layers, n_ctx=max(1024, a.tokens + 256),
               n_threads=a.threads, cache=cfg["cache"],
               host_experts=True if cfg["cache"] else a.host_experts)
    result["load_s"] = round(time.perf_counter() - t0, 2)
    mem1 = gpu_memory_used_mib()
    result["gpu_mem_mib"] = mem1 - mem0 if mem0 is not None and mem1 is not None else None
    result["slots_per_layer"] = e.slots_per_layer
    result["expert_buffer"] = e.model.expert_buffer if e.model else ""
    result["engine_version"] = __import__("llama_cpp").__version__
    print(f"  {a.name}: loaded in {result['load_s']} s"
          + (f", {e.slots_per_layer} slots/layer" if cfg["cache"] else ""), flush=True)

    def one_run(prompt: str, tokens: int) -> dict[str, Any]:
        if e.cache is not None:
            e._lib.llama_moe_cache_reset_timings(e._ctx)
            e.cache.reset_stats()  # per-run prefetch counters
        sampling = Sampling(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0,
                            repeat_penalty=1.0, max_tokens=tokens, seed=0)
        for _ in e.generate(prompt, sampling):
            pass
        ans = e.last_answer
        c = ans.cache
        run: dict[str, Any] = {"tok_s": ans.tokens_per_second, "n_tokens": ans.n_tokens,
                               "stop": ans.stop_reason, "ttft_s": ans.time_to_first_token_s}
        if e.cache is not None:
            t = e.timings()
            n = max(1, ans.n_tokens)
            run.update(hit_rate=c.hit_rate, substituted=c.substituted_fraction,
                       mass_per_token=c.mass_per_token,
                       fetched_mb_per_token=c.fetched_mb_per_token,
                       sync_copy_ms_per_token=t["sync_copy_us"] / 1000 / n,
                       route_ms_per_token=t["route_us"] / 1000 / n,
                       wait_ms_per_token=t["wait_us"] / 1000 / n,
                       async_copies_per_token=t["n_async"] / n)
            stats = e.layer_stats().values()
            pre = sum(s.prefetches for s in stats)
            if pre:
                run.update(prefetches_per_token=pre / n,
                           prefetch_accuracy=sum(s.prefetch_hits for s in stats) / pre)
        return run

    # Decode a fixed count, as llama-bench's tg128 does: an end-of-generation token is
    # decoded like any other (a synthetic model has no reason to stop). Should the Engine
    # stop anyway, the warm-up (which also fills the cache) picks the first prompt that
    # decodes the full warm-up count.
    if hasattr(e, "_is_eog"):
        e._is_eog = lambda token: False  # type: ignore[method-assign]
    warm_tokens = min(a.tokens, 64)
    prompt = PROMPTS[0]
    for candidate in PROMPTS:
        warm = one_run(candidate, warm_tokens)
        prompt = candidate
        if warm["n_tokens"] >= warm_tokens:
            break
    result["prompt"] = prompt
    sweep = [int(x) for x in a.thread_sweep.split(",") if x] or [a.threads]
    by_threads: dict[int, list[dict[str, Any]]] = {}
    for threads in sweep:
        if len(sweep) > 1:
            low.llama_set_n_threads(e._ctx, threads, max(threads, a.threads))
            one_run(prompt, min(32, a.tokens))
        by_threads[threads] = [one_run(prompt, a.tokens) for _ in range(max(1, a.runs))]
        med = statistics.median(r["tok_s"] for r in by_threads[threads])
        print(f"  {a.name}: {threads} threads: {med:.2f} tok/s (runs: "
              + ", ".join(f"{r['tok_s']:.2f}" for r in by_threads[threads]) + ")", flush=True)
    best = max(by_threads, key=lambda t: statistics.median(r["tok_s"] for r in by_threads[t]))
    runs = by_threads[best]
    result.update(threads=best, runs=runs,
                  tok_s=statistics.median(r["tok_s"] for r in runs),
                  n_tokens=min(r["n_tokens"] for r in runs),
                  sweep={str(t): statistics.median(r["tok_s"] for r in rs)
                         for t, rs in by_threads.items()})
    for key in ("hit_rate", "substituted", "mass_per_token", "fetched_mb_per_token",
                "sync_copy_ms_per_token", "route_ms_per_token", "wait_ms_per_token",
                "async_copies_per_token", "prefetches_per_token", "prefetch_accuracy"):
        if key in runs[-1]:
            result[key] = statistics.median(r[key] for r in runs)

    if a.forced > 0 and a.logits is not None:
        n_vocab = e._llm.n_vocab()
        forced = [(7 + 7919 * i) % n_vocab for i in range(a.forced)]
        logits = e.forced_logits(FORCED_PROMPT, forced)
        np.save(a.logits, logits)
        result["forced_tokens"] = a.forced
        result["logits_finite"] = bool(np.isfinite(logits).all())
        if a.reference_logits is not None and a.reference_logits.exists():
            ref = np.load(a.reference_logits)
            diff = np.abs(logits.astype(np.float64) - ref.astype(np.float64))
            result["max_abs_diff"] = float(diff.max())
            result["bitwise_equal"] = bool(np.array_equal(logits, ref))
            result["top1_agreement"] = float(np.mean(logits.argmax(1) == ref.argmax(1)))
    e.close()
    a.json.write_text(json.dumps(result, indent=2))
    return 0


# =============================================================================== driver
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
        self.be = load_build_engine()
        self.report: dict[str, Any] = {"mode": "dry-run" if self.dry else "gpu",
                                       "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
                                       "phases": {}, "errors": []}
        self.src_root: Path | None = None
        self.lib_dir: Path | None = None
        self.vulkan_lib_dir: Path | None = None  # the Vulkan row's build, when there is one
        self.vulkan_skipped = "a GPU run only"
        self.pydeps = self.work / "pydeps"
        self.extra_ld: list[str] = []
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

    def host_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {"python": platform.python_version(),
                                "cpus": os.cpu_count(), "platform": platform.platform()}
        with contextlib.suppress(OSError):
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    info["cpu"] = line.split(":", 1)[1].strip()
                    break
        with contextlib.suppress(OSError, ValueError, IndexError):
            mem = Path("/proc/meminfo").read_text().split("\n", 1)[0]
            info["mem_gib"] = round(int(mem.split()[1]) / 2**20, 1)
        if shutil.which("nvidia-smi"):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                info["gpu"] = subprocess.run(
                    ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                     "--format=csv,noheader"], capture_output=True, text=True,
                    timeout=20).stdout.strip()
        if shutil.which("nvcc"):
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True,
                                     timeout=20).stdout.strip().splitlines()
                info["nvcc"] = out[-2] if len(out) >= 2 else ""
        return info

    # ------------------------------------------------------------------ bundle
    def unpack_bundle(self, bundle: Path) -> None:
        t0 = time.time()
        try:
            manifest = read_manifest(bundle)
        except FileNotFoundError as err:
            raise SystemExit(f"[{TAG}] ERROR: {err} (and send it along: carry bundle/)") from err
        want = source_key(self.be)
        self.report["bundle"] = {"dir": str(bundle), "source_key": manifest["source_key"],
                                 "repo_source_key": want, "created": manifest["created"],
                                 "bytes": manifest["total_bytes"]}
        if manifest["source_key"] != want:
            msg = (f"bundle {bundle} was made from other patches/native sources "
                   f"({manifest['source_key']}, repository {want}): run `make gpu-bundle`")
            if not self.args.allow_stale:
                raise SystemExit(f"[{TAG}] ERROR: {msg} (or pass --allow-stale)")
            self.say(f"WARNING: {msg}")
        archive = bundle / ARCHIVE_NAME
        digest = sha256_file(archive)
        if digest != manifest["archive"]["sha256"]:
            raise SystemExit(f"[{TAG}] ERROR: {archive} does not match its manifest")
        dest = self.work / "src"
        stamp = dest / ".archive-sha256"
        root = dest / manifest["archive"]["top"]
        if not (stamp.exists() and stamp.read_text() == digest and root.is_dir()):
            shutil.rmtree(dest, ignore_errors=True)
            dest.mkdir(parents=True)
            with tarfile.open(archive) as tar:
                tar.extractall(dest, filter="tar")
            stamp.write_text(digest)
        for need in ("llama_cpp/llama_cpp.py", "vendor/llama.cpp/src/moescope/moecache.h",
                     "vendor/llama.cpp/src/llama-moe-cache.cpp"):
            if not (root / need).exists():
                raise SystemExit(f"[{TAG}] ERROR: the bundle lacks {need}")
        self.src_root = root
        self.say(f"bundle ok: source key {want}, unpacked in {root}")
        self.install_wheels(bundle)
        self.phase("bundle", t0)

    def install_wheels(self, bundle: Path) -> None:
        """pip install --no-index the bundle's wheels whose packages do not import."""
        missing = [(mod, req) for mod, req in GPU_WHEELS
                   if importlib.util.find_spec(mod) is None
                   and not (self.pydeps / mod).exists()]
        absent = [m for m in GPU_PRESENT_IMPORTS if importlib.util.find_spec(m) is None]
        if absent:
            raise SystemExit(f"[{TAG}] ERROR: this Python lacks {', '.join(absent)}")
        if not missing:
            return
        wheels_dir = bundle / WHEELS_DIRNAME
        files = []
        for mod, req in missing:
            name = req.split("==")[0].lower().replace("-", "_")
            found = [w for w in wheels_dir.glob("*.whl")
                     if w.name.split("-")[0].lower().replace("-", "_") == name]
            if not found:
                raise SystemExit(f"[{TAG}] ERROR: {mod} does not import and the bundle has "
                                 f"no wheel for {req}: run `make gpu-bundle` with network")
            files.append(str(found[0]))
        self.say(f"installing {', '.join(m for m, _ in missing)} from the bundle's wheels")
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                        "--no-deps", "--no-compile", "--target", str(self.pydeps), *files],
                       check=True)

    # ------------------------------------------------------------------ build
    def build(self, cuda: bool = True) -> None:
        """CMake + ninja: libllama and ggml with CUDA for sm_90 (``cuda=False``: CPU only,
        the dry run's --build check of the bundle); logs in build.log."""
        t0 = time.time()
        assert self.src_root is not None
        build_dir = self.work / "cmake-build"
        log = self.work / "build.log"
        cpus = self.args.jobs or os.cpu_count() or 4
        if cuda:
            try:
                args = gpu_cmake_args(self.args.cuda_arch,
                                      native_cpu=not self.args.portable_cpu, be=self.be)
            except self.be.BuildError as err:
                raise SystemExit(f"[{TAG}] ERROR: {err}") from err
            toolkit = self.be.cuda_toolkit_root()
            cublas = self.be.find_cublas_root(toolkit)
            self.extra_ld = [str(d) for d in (
                *(([cublas / "lib", cublas / "lib64"]) if cublas else []),
                toolkit / "lib64", toolkit / "lib") if d.is_dir()]
            self.say(f"configuring ({toolkit}, cuBLAS {cublas or 'from the toolkit'})")
        else:
            args = [*self.be.cmake_args("cpu"), *GPU_LEAN_FLAGS, "-DGGML_CUDA=OFF"]
            self.say("configuring (CPU only)")
        self.report["build"] = {"cmake_args": args, "dir": str(build_dir), "jobs": cpus}
        with log.open("w") as f:
            f.write("cmake " + " ".join(args) + "\n")
            f.flush()
            rc = subprocess.run(["cmake", "-S", str(self.src_root), "-B", str(build_dir),
                                 "-G", "Ninja", "-Wno-dev", *args],
                                stdout=f, stderr=subprocess.STDOUT).returncode
            if rc != 0:
                self.fail_build(log, "CMake configuration failed")
            self.say(f"building libllama + ggml{'-cuda' if cuda else ''} with ninja -j{cpus}")
            proc = subprocess.Popen(["ninja", "-C", str(build_dir), f"-j{cpus}", "llama"],
                                    stdout=f, stderr=subprocess.STDOUT)
            while True:
                try:
                    rc = proc.wait(timeout=30)
                    break
                except subprocess.TimeoutExpired:
                    self.say(f"  {last_progress_line(log)}")
        if rc != 0:
            self.fail_build(log, "the CUDA build failed")
        lib_dir = build_dir / "bin"
        for name in ("libllama.so", "libggml-base.so", *(["libggml-cuda.so"] if cuda else [])):
            if not (lib_dir / name).exists():
                self.fail_build(log, f"{name} is missing after the build")
        self.lib_dir = lib_dir
        self.phase("build", t0)
        self.report["build"]["seconds"] = self.report["phases"]["build"]
        self.say(f"engine built in {self.report['phases']['build']:.0f} s: {lib_dir}")

    def build_vulkan(self) -> None:
        """The Vulkan build of the same tree, for the ``vulkan`` row; a missing toolchain or
        driver (or a failed build) only skips that row, the CUDA results stand."""
        assert self.src_root is not None
        if "vulkan" not in self.args.configs.split(","):
            self.vulkan_skipped = "not asked for"
            return
        missing = self.be.vulkan_build_missing()
        devices = self.be.vulkan_devices(self.be._run_text, shutil.which)
        hardware = [n for n, kind in devices if not kind.endswith("_CPU")]
        if missing or not hardware:
            self.vulkan_skipped = (f"needs {', '.join(missing)}" if missing
                                   else "no Vulkan driver for the GPU")
            return
        t0 = time.time()
        build_dir = self.work / "cmake-build-vulkan"
        log = self.work / "build-vulkan.log"
        cpus = self.args.jobs or os.cpu_count() or 4
        args = [*self.be.cmake_args("vulkan"), *GPU_LEAN_FLAGS, "-DGGML_CUDA=OFF"]
        self.say(f"building the Vulkan engine for {hardware[0]} with ninja -j{cpus}")
        with log.open("w") as f:
            rc = subprocess.run(["cmake", "-S", str(self.src_root), "-B", str(build_dir),
                                 "-G", "Ninja", "-Wno-dev", *args],
                                stdout=f, stderr=subprocess.STDOUT).returncode
            if rc == 0:
                rc = subprocess.run(["ninja", "-C", str(build_dir), f"-j{cpus}", "llama"],
                                    stdout=f, stderr=subprocess.STDOUT).returncode
        lib_dir = build_dir / "bin"
        if rc != 0 or not (lib_dir / "libggml-vulkan.so").exists():
            self.vulkan_skipped = f"the Vulkan build failed (log: {log})"
            self.report["errors"].append(self.vulkan_skipped)
            return
        self.vulkan_lib_dir = lib_dir
        self.phase("build_vulkan", t0)
        self.say(f"Vulkan engine built in {self.report['phases']['build_vulkan']:.0f} s")

    def fail_build(self, log: Path, msg: str) -> None:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-60:])
        print(tail, flush=True)
        self.report["errors"].append(msg)
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            data = log.read_bytes()[-4_000_000:]
            (self.out / "gpu_check_build.log").write_bytes(data)
        self.write_report()
        raise SystemExit(f"[{TAG}] ERROR: {msg} (log: {log})")

    def installed_lib_dir(self) -> Path | None:
        spec = importlib.util.find_spec("llama_cpp")
        if spec is None or not spec.submodule_search_locations:
            return None
        for loc in spec.submodule_search_locations:
            if (Path(loc) / "lib" / "libllama.so").exists():
                return Path(loc) / "lib"
        return None

    # ------------------------------------------------------------------ children
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
    def summarize(self, model: dict[str, Any], bw: dict[str, Any],
                  results: dict[str, dict[str, Any]]) -> list[str]:
        def tok(name: str) -> float | None:
            r = results.get(name, {})
            return r.get("tok_s") if r.get("tok_s") else None

        stock, exact = tok("stock"), tok("exact")
        rows = []
        for name, r in results.items():
            t = tok(name)
            rows.append({
                "config": name, "label": r.get("label", name), "tok_s": t,
                "vs_stock": t / stock if t and stock else None,
                "vs_exact": t / exact if t and exact else None,
                "hit_rate": r.get("hit_rate"), "substituted": r.get("substituted"),
                "mass_per_token": r.get("mass_per_token"),
                "fetched_mb_per_token": r.get("fetched_mb_per_token"),
                "sync_copy_ms_per_token": r.get("sync_copy_ms_per_token"),
                "gpu_mem_mib": r.get("gpu_mem_mib"), "threads": r.get("threads"),
                "n_tokens": r.get("n_tokens"),
                "max_abs_diff": r.get("max_abs_diff"),
                "bitwise_equal": r.get("bitwise_equal"),
                "top1_agreement": r.get("top1_agreement"),
                "status": r.get("error") or r.get("skipped") or "ok"})
        self.report["rows"] = rows
        quality = tok("quality-first")
        verdict: dict[str, Any] = {
            "quality_vs_exact": quality / exact if quality and exact else None,
            "quality_vs_exact_target": TARGET_QUALITY_VS_EXACT,
            "quality_vs_stock": quality / stock if quality and stock else None,
            "exact_max_abs_diff": results.get("exact", {}).get("max_abs_diff"),
            "exact_bitwise_equal": results.get("exact", {}).get("bitwise_equal"),
        }
        verdict["quality_meets_2_5x_exact"] = (
            verdict["quality_vs_exact"] >= TARGET_QUALITY_VS_EXACT
            if verdict["quality_vs_exact"] is not None else None)
        verdict["quality_beats_stock"] = (verdict["quality_vs_stock"] > 1.0
                                          if verdict["quality_vs_stock"] is not None else None)
        self.report["verdict"] = verdict

        lines = []
        gbps = bw.get("gbps", {})
        if gbps:
            lines.append(f"copy bandwidth ({bw.get('backend', '?')}): " + ", ".join(
                f"{k} {v:.1f} GB/s" for k, v in gbps.items()))
        buffers = sorted({r.get("expert_buffer") for r in results.values()
                          if r.get("expert_buffer")})
        if buffers:
            lines.append("experts in host memory: " + ", ".join(
                f"{b} ({'pinned' if b.endswith('_Host') else 'pageable'})" for b in buffers))
        psr = results.get("psr", {})
        if psr.get("prefetch_accuracy") is not None:
            lines.append(f"psr: {psr['prefetches_per_token']:.1f} prefetches/token, "
                         f"{psr['prefetch_accuracy']:.0%} of them routed to")
        if verdict["exact_max_abs_diff"] is not None:
            lines.append(
                f"exactness: exact vs {results['reference'].get('label')}: max |dlogit| = "
                f"{verdict['exact_max_abs_diff']:.3g}"
                f" ({'bitwise equal' if verdict['exact_bitwise_equal'] else 'NOT bitwise equal'},"
                f" {self.args.forced} teacher-forced tokens)")

        def yes(v: bool | None) -> str:
            return "n/a" if v is None else ("PASS" if v else "MISS")

        if verdict["quality_vs_exact"] is not None:
            lines.append(f"target quality-first >= {TARGET_QUALITY_VS_EXACT}x exact: "
                         f"{verdict['quality_vs_exact']:.2f}x "
                         f"{yes(verdict['quality_meets_2_5x_exact'])}")
        if verdict["quality_vs_stock"] is not None:
            lines.append(f"target quality-first faster than stock: "
                         f"{verdict['quality_vs_stock']:.2f}x "
                         f"{yes(verdict['quality_beats_stock'])}")
        where = "CPU, DRY RUN (numbers mean nothing)" if self.dry else (
            self.report["host"].get("gpu", "GPU").split(",")[0])
        lines.append("")
        lines.append(
            f"GPU check [{where}]: {PRESET} synthetic model, {model['n_layers']} of "
            f"{FULL_LAYERS} layers, {model['n_expert']} experts top-{model['top_k']} "
            f"(hidden {model['n_embd']}, width {model['n_ff_exp']}, {model['expert_type']}),"
            f" decode {self.args.tokens} tokens, median of {self.args.runs} runs")
        head = (f"{'configuration':30s} {'tok/s':>8s} {'vs stock':>9s} {'vs exact':>9s} "
                f"{'hit':>5s} {'subst':>6s} {'VRAM':>7s} {'max|dlogit|':>11s}")
        lines.append(head)
        lines.append("-" * len(head))

        def f(v: float | None, spec: str, suffix: str = "") -> str:
            width = int("".join(c for c in spec.split(".")[0] if c.isdigit()) or 0)
            text = "-" if v is None else format(v, spec).strip() + suffix
            return text.rjust(width + len(suffix))

        for row in rows:
            if row["status"] != "ok":
                lines.append(f"{row['label']:30s} {row['status']}")
                continue
            mem = row["gpu_mem_mib"]
            diff = ("ref" if row["config"] == "reference"
                    else f(row["max_abs_diff"], ".3g"))
            lines.append(
                f"{row['label']:30s} {f(row['tok_s'], '8.2f')} "
                f"{f(row['vs_stock'], '8.2f', 'x')} {f(row['vs_exact'], '8.2f', 'x')} "
                f"{f(row['hit_rate'], '5.0%')} {f(row['substituted'], '6.1%')} "
                f"{f(mem / 1024 if mem is not None else None, '6.1f', 'G')} {diff:>11s}")
        return lines

    def write_report(self) -> None:
        text = json.dumps(self.report, indent=2, default=str)
        (self.work / "gpu_check.json").write_text(text)
        if self.out is not None:
            self.out.mkdir(parents=True, exist_ok=True)
            (self.out / "gpu_check.json").write_text(text)

    # ------------------------------------------------------------------ main
    def run(self) -> int:
        a = self.args
        self.report["host"] = self.host_info()
        self.report["args"] = {k: (str(v) if isinstance(v, Path) else v)
                               for k, v in vars(a).items()}
        self.say(f"{'dry run (CPU)' if self.dry else 'GPU run'}; work dir {self.work}")
        bundle = a.bundle or (None if self.dry else BUNDLE_DIR)
        if bundle is not None:
            self.unpack_bundle(bundle)
        synth, info, slog = self.start_synth()
        try:
            if self.dry and a.build:
                if self.src_root is None:
                    raise SystemExit(f"[{TAG}] ERROR: --build needs --bundle")
                self.build(cuda=False)
            elif self.dry:
                if self.src_root is not None:  # the archive's llama_cpp, installed library
                    self.lib_dir = self.installed_lib_dir()
                    if self.lib_dir is None:
                        raise SystemExit(f"[{TAG}] ERROR: no installed engine (make engine)")
            else:
                self.build()
                self.build_vulkan()
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
        lines = self.summarize(model, bw, results)
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


def last_progress_line(log: Path) -> str:
    """The latest ninja "[n/m] ..." line of the build log (shortened)."""
    try:
        with log.open("rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 8192))
            lines = f.read().decode(errors="replace").splitlines()
    except OSError:
        return "building"
    for line in reversed(lines):
        if line.startswith("["):
            return line[:110]
    return "building"


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
