"""What the GPU check needs before it measures: the machine's description, the bundle
(checked against the repository, unpacked, its wheels installed where a package does not
import) and the engine's libraries, built from the bundle's tree by the engine builder's
own CMake + ninja build (``engine_patch.builder.cmake_build``) with the GPU check's flags.

Standard library only, like the driver: it runs on the GPU machine's bare python3.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

from _common import (
    ARCHIVE_NAME,
    GPU_PRESENT_IMPORTS,
    GPU_WHEELS,
    WHEELS_DIRNAME,
    backends,
    builder,
    extract_tar,
    gpu_cmake_args,
    lean_cmake_args,
    read_manifest,
    sha256_file,
    source_key,
)
from gpu_check_configs import TAG

Say = Callable[[str], None]


def host_info() -> dict[str, Any]:
    """Python, CPU, memory, GPU and nvcc of this machine, for the report."""
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


# ---------------------------------------------------------------------------- bundle
def unpack_bundle(bundle: Path, work: Path, allow_stale: bool,
                  say: Say) -> tuple[Path, dict[str, Any]]:
    """The bundle's patched source tree (unpacked under ``work/src`` once per archive) and
    what the report says about the bundle. Refuses a bundle made from other patches or
    native sources unless ``allow_stale``."""
    try:
        manifest = read_manifest(bundle)
    except FileNotFoundError as err:
        raise SystemExit(f"[{TAG}] ERROR: {err} (and send it along: carry bundle/)") from err
    want = source_key()
    report = {"dir": str(bundle), "source_key": manifest["source_key"],
              "repo_source_key": want, "created": manifest["created"],
              "bytes": manifest["total_bytes"]}
    if manifest["source_key"] != want:
        msg = (f"bundle {bundle} was made from other patches/native sources "
               f"({manifest['source_key']}, repository {want}): run `make gpu-bundle`")
        if not allow_stale:
            raise SystemExit(f"[{TAG}] ERROR: {msg} (or pass --allow-stale)")
        say(f"WARNING: {msg}")
    archive = bundle / ARCHIVE_NAME
    digest = sha256_file(archive)
    if digest != manifest["archive"]["sha256"]:
        raise SystemExit(f"[{TAG}] ERROR: {archive} does not match its manifest")
    dest = work / "src"
    stamp = dest / ".archive-sha256"
    root = dest / manifest["archive"]["top"]
    if not (stamp.exists() and stamp.read_text() == digest and root.is_dir()):
        shutil.rmtree(dest, ignore_errors=True)
        dest.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            extract_tar(tar, dest)
        stamp.write_text(digest)
    for need in ("llama_cpp/llama_cpp.py", "vendor/llama.cpp/src/moescope/moecache.h",
                 "vendor/llama.cpp/src/llama-moe-cache.cpp"):
        if not (root / need).exists():
            raise SystemExit(f"[{TAG}] ERROR: the bundle lacks {need}")
    say(f"bundle ok: source key {want}, unpacked in {root}")
    return root, report


def install_wheels(bundle: Path, pydeps: Path, say: Say) -> None:
    """pip install --no-index the bundle's wheels whose packages do not import."""
    missing = [(mod, req) for mod, req in GPU_WHEELS
               if importlib.util.find_spec(mod) is None and not (pydeps / mod).exists()]
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
    say(f"installing {', '.join(m for m, _ in missing)} from the bundle's wheels")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index",
                    "--no-deps", "--no-compile", "--target", str(pydeps), *files], check=True)


def installed_lib_dir() -> Path | None:
    """llama_cpp/lib of the engine this Python imports (the dry run's, from make engine)."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return None
    for loc in spec.submodule_search_locations:
        if (Path(loc) / "lib" / "libllama.so").exists():
            return Path(loc) / "lib"
    return None


# ---------------------------------------------------------------------------- builds
class Built(NamedTuple):
    """An engine built from the bundle: where its libraries are and what it took."""

    lib_dir: Path
    extra_ld: list[str]  # cuBLAS and CUDA runtime folders the children need to load it
    cmake_args: list[str]
    log: Path
    seconds: float


def build_engine(src_root: Path, work: Path, *, cuda: bool, cuda_arch: str,
                 portable_cpu: bool, jobs: int, say: Say) -> Built:
    """libllama + ggml from the bundle's tree into ``work/cmake-build`` (a rerun on the same
    machine only relinks): CUDA for ``cuda_arch`` with the machine's CPU ISA (unless
    ``portable_cpu``), or CPU only (``cuda=False``: the dry run's check that the bundle
    compiles). Raises :class:`builder.BuildError`, naming the log."""
    t0 = time.time()
    extra_ld: list[str] = []
    if cuda:
        args = gpu_cmake_args(cuda_arch, native_cpu=not portable_cpu)
        toolkit = backends.cuda_toolkit_root()
        cublas = backends.find_cublas_root(toolkit)
        extra_ld = [str(d) for d in (
            *(([cublas / "lib", cublas / "lib64"]) if cublas else []),
            toolkit / "lib64", toolkit / "lib") if d.is_dir()]
        say(f"configuring ({toolkit}, cuBLAS {cublas or 'from the toolkit'})")
    else:
        args = lean_cmake_args("cpu")
        say("configuring (CPU only)")
    say(f"building libllama + ggml{'-cuda' if cuda else ''} with ninja -j{jobs}")
    log = work / "build.log"
    expect = ("libllama.so", "libggml-base.so", *(["libggml-cuda.so"] if cuda else []))
    lib_dir = builder.cmake_build(src_root, work / "cmake-build", args, log, jobs=jobs,
                                  expect=expect, progress=lambda line: say(f"  {line}"))
    return Built(lib_dir, extra_ld, args, log, round(time.time() - t0, 1))


def build_vulkan(src_root: Path, work: Path, jobs: int, say: Say) -> Built | str:
    """The Vulkan build of the same tree, for the ``vulkan`` row, or why there is none (no
    glslc or headers, no Vulkan driver for the GPU). A failed build raises
    :class:`builder.BuildError`; the caller only skips the row, the CUDA results stand."""
    missing = backends.vulkan_build_missing()
    devices = backends.vulkan_devices(backends.run_text, shutil.which)
    hardware = [n for n, kind in devices if not kind.endswith("_CPU")]
    if missing or not hardware:
        return f"needs {', '.join(missing)}" if missing else "no Vulkan driver for the GPU"
    t0 = time.time()
    args = lean_cmake_args("vulkan")
    log = work / "build-vulkan.log"
    say(f"building the Vulkan engine for {hardware[0]} with ninja -j{jobs}")
    lib_dir = builder.cmake_build(src_root, work / "cmake-build-vulkan", args, log, jobs=jobs,
                                  expect=("libllama.so", "libggml-vulkan.so"),
                                  progress=lambda line: say(f"  vulkan {line}"))
    return Built(lib_dir, [], args, log, round(time.time() - t0, 1))
