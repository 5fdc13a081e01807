"""The GPU check's child processes (``gpu_check.py _synth | _bandwidth | _config``).

Each runs in its own process so that every configuration loads the engine fresh (one
libllama per process, its own CUDA context and memory figure) and so that the driver, which
needs only the standard library, never imports the engine, numpy or PyTorch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from gpu_check_configs import CONFIGS, DRY_OVERRIDES, FORCED_PROMPT, FULL_LAYERS, PRESET, PROMPTS


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
