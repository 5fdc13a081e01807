"""Helpers shared by the GPU check (bench/gpu_check.py) and its bundle builder
(bench/make_gpu_bundle.py), over the engine's builder (``engine_patch.builder``, imported
as a package). Standard library only: the GPU machine runs these before any third-party
package is on the path.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # bench/ scripts run with only bench/ on the path
    sys.path.insert(0, str(REPO))

from engine_patch import backends, builder  # noqa: E402 (needs REPO on the path)

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


def source_key() -> str:
    """Hash of what the engine's source is made of: the pinned sdist, the patches and the
    native core. A bundle whose key differs from the repo's is stale."""
    h = hashlib.sha256()
    h.update(f"sdist={builder.read_lock()['sha256']}\n".encode())
    for path in builder.patches("vulkan") + builder.native_sources():  # every patch
        h.update(f"\n{path.relative_to(REPO)}\n".encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def gpu_cmake_args(archs: str = "90", native_cpu: bool = True) -> list[str]:
    """CMake flags of the GPU check's CUDA build: build_engine's, for one CUDA architecture."""
    args = [a for a in backends.cmake_args("cpu") if not a.startswith("-DGGML_NATIVE=")]
    args.append(f"-DGGML_NATIVE={'ON' if native_cpu else 'OFF'}")
    return args + backends.cuda_args(archs) + list(GPU_LEAN_FLAGS)


def lean_cmake_args(backend: str) -> list[str]:
    """CMake flags of the GPU check's CPU-only (dry run --build, bundle check) and Vulkan
    builds: build_engine's for that backend, lean, without CUDA."""
    return [*backends.cmake_args(backend), *GPU_LEAN_FLAGS, "-DGGML_CUDA=OFF"]


def read_manifest(bundle: Path) -> dict[str, Any]:
    path = bundle / MANIFEST_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} not found: run `make gpu-bundle` first")
    data: dict[str, Any] = json.loads(path.read_text())
    return data


def sha256_file(path: Path) -> str:
    """The engine build's own hashing, so bundle and wheel cache agree by construction."""
    return builder.sha256_file(path)


class Clock:
    """Elapsed time since a start (the shell script's, when it passes one)."""

    def __init__(self, start: float | None = None) -> None:
        self.start = start if start is not None else time.time()

    def elapsed(self) -> float:
        return time.time() - self.start

    def say(self, tag: str, msg: str) -> None:
        print(f"[{tag} {self.elapsed():6.1f}s] {msg}", flush=True)


def extract_tar(tar: tarfile.TarFile, dest: Path,
                members: list[tarfile.TarInfo] | None = None) -> None:
    """``builder.extract_tar`` for the bench scripts, which also unpack a chosen subset of
    members: Python's "tar" filter, or, where Python predates it (3.10.12 / 3.11.4; Debian
    12 ships 3.11.2, and the GPU machine's python3 may be older still), every member that
    would land outside ``dest`` (or is not a file, folder or link) refused first. Mirrored,
    not imported: ``builder.py`` is an input of the engine's cache key, and a change to it
    rebuilds every engine."""
    if hasattr(tarfile, "tar_filter"):
        tar.extractall(dest, members=members, filter="tar")
        return
    chosen = tar.getmembers() if members is None else members
    root = dest.resolve()

    def inside(path: Path) -> bool:
        return path == root or root in path.parents

    for member in chosen:
        target = (root / member.name).resolve()
        link = None
        if member.issym():
            link = (target.parent / member.linkname).resolve()
        elif member.islnk():
            link = (root / member.linkname).resolve()
        if (not inside(target) or (link is not None and not inside(link))
                or not (member.isfile() or member.isdir() or member.issym() or member.islnk())):
            raise builder.BuildError(f"{tar.name}: refusing to unpack {member.name!r} (leaves "
                                     f"the folder or is not a file, folder or link)")
        member.mode &= 0o755
    tar.extractall(dest, members=chosen)  # every member checked above
