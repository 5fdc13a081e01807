"""Helpers shared by the GPU check (bench/gpu_check.py) and its bundle builder
(bench/make_gpu_bundle.py). Standard library only: the GPU machine runs these before any
third-party package is on the path.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import time
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[1]
BUNDLE_DIR = REPO / "bundle"
ARCHIVE_NAME = "llama_cpp_python-moescope-src.tar.gz"
MANIFEST_NAME = "manifest.json"
WHEELS_DIRNAME = "wheels"
BUNDLE_LIMIT_BYTES = 60 * 2**20

# Python packages the GPU machine may lack, as (import name, pip requirement). The engine's
# own Python package (llama_cpp) comes from the archive; torch, numpy and jinja2 are there.
GPU_WHEELS: tuple[tuple[str, str], ...] = (
    ("gguf", "gguf==0.19.0"),
    ("diskcache", "diskcache==5.6.3"),
    ("yaml", "PyYAML==6.0.2"),
    ("tqdm", "tqdm==4.67.1"),
)
GPU_PRESENT_IMPORTS: tuple[str, ...] = ("numpy", "jinja2", "typing_extensions")

# Flags of the GPU check's CUDA build on top of build_engine's: CPU code for the machine
# it runs on (stock llama.cpp's CPU expert kernels get the best ISA there, as a user's
# default build would), and nothing the check does not load. FlashAttention kernels are
# compiled out (our Engine and llama-cpp-python's default keep flash_attn off; with
# GGML_CUDA_FA=OFF the CUDA backend reports FLASH_ATTN_EXT unsupported, so nothing can
# pick them), which turns 37 heavy template instances into empty ones.
GPU_LEAN_FLAGS: tuple[str, ...] = (
    "-DGGML_CUDA_FA=OFF",
    "-DGGML_CUDA_FA_ALL_QUANTS=OFF",
    "-DGGML_CUDA_NCCL=OFF",
    "-DLLAMA_BUILD_COMMON=OFF",
    "-DLLAMA_BUILD_MTMD=OFF",
    "-DGGML_BUILD_TESTS=OFF",
    "-DGGML_BUILD_EXAMPLES=OFF",
    "-DLLAMA_CURL=OFF",
)


def load_build_engine() -> ModuleType:
    """engine_patch/build_engine.py as a module (its lock, patch list and CUDA flags)."""
    name = "moescope_build_engine"
    path = REPO / "engine_patch" / "build_engine.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def source_key(be: ModuleType | None = None) -> str:
    """Hash of what the engine's source is made of: the pinned sdist, the patches and the
    native core. A bundle whose key differs from the repo's is stale."""
    be = be or load_build_engine()
    h = hashlib.sha256()
    h.update(f"sdist={be.read_lock()['sha256']}\n".encode())
    for path in be.patches("vulkan") + be.native_sources():  # the bundle has every patch
        h.update(f"\n{path.relative_to(REPO)}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def gpu_cmake_args(archs: str = "90", native_cpu: bool = True,
                   be: ModuleType | None = None) -> list[str]:
    """CMake flags of the GPU check's build: build_engine's, for one CUDA architecture."""
    be = be or load_build_engine()
    args = [a for a in be.cmake_args("cpu") if not a.startswith("-DGGML_NATIVE=")]
    args.append(f"-DGGML_NATIVE={'ON' if native_cpu else 'OFF'}")
    return args + be.cuda_args(archs) + list(GPU_LEAN_FLAGS)


def read_manifest(bundle: Path) -> dict[str, Any]:
    path = bundle / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `make gpu-bundle` first")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def sha256_file(path: Path) -> str:
    """The engine build's own hashing, so bundle and wheel cache agree by construction."""
    digest: str = load_build_engine().sha256_file(path)
    return digest


class Clock:
    """Elapsed time since a start (the shell script's, when it passes one)."""

    def __init__(self, start: float | None = None) -> None:
        self.start = start if start is not None else time.time()

    def elapsed(self) -> float:
        return time.time() - self.start

    def say(self, tag: str, msg: str) -> None:
        print(f"[{tag} {self.elapsed():6.1f}s] {msg}", flush=True)
