#!/usr/bin/env python3
"""Build MoEScope's engine: llama-cpp-python 0.3.36 with our patches and the native core.

Why a script and not a vendored copy: the repo carries no third-party source. We download
the pinned sdist with pip, check its sha256, apply ``engine_patch/*.patch`` in order, copy
``native/`` (the expert-cache core) into the llama.cpp tree so it is compiled into libllama,
and build a wheel. The wheel is cached under a key hashed from every input (sdist hash,
patches, native sources, build flags, this script), so a second ``make test`` reuses it.

Incremental rebuilds: the patched tree is synced file-by-file into one working directory per
flavour (cpu/cuda/vulkan), keeping unchanged files' mtimes, and scikit-build-core reuses one
CMake build directory, so a change to the native core recompiles a handful of files, not 200.

Backends: MOESCOPE_BACKEND=auto (default) picks CUDA when nvcc and an NVIDIA driver are
present (architectures from the compute capability the driver reports), else Vulkan when
glslc and a Vulkan device other than a software one are present, else the CPU; the choice
and its reason are printed and written next to the installed libllama (moescope_build.json)
so the app can show them.

Usage: build_engine.py [--venv .venv] [--backend auto|cpu|cuda|vulkan] [--configure-only]
                       [--print-key] [--print-backend] [--lib-dir]
Environment: MOESCOPE_CACHE (default ~/.cache/moescope), MOESCOPE_BACKEND, MOESCOPE_CUDA=1
(same as MOESCOPE_BACKEND=cuda), CMAKE_CUDA_ARCHITECTURES (default: the GPUs' compute
capabilities, else "86;89;90"), CUBLAS_ROOT (a folder with include/ and lib/ of cuBLAS when
the CUDA toolkit lacks it), MOESCOPE_CCACHE=0 (ggml uses ccache when installed; this stops it).
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

REPO = Path(__file__).resolve().parents[1]
PATCH_DIR = REPO / "engine_patch"
NATIVE_DIR = REPO / "native"
BUILDER_VERSION = "1"  # bump to invalidate every cached wheel
BACKENDS = ("cpu", "cuda", "vulkan")
BUILD_INFO = "moescope_build.json"  # beside libllama.so: backend and why (read by the app)
VULKAN_PACKAGES = "mesa-vulkan-drivers glslc libvulkan-dev spirv-headers"
T0 = time.monotonic()


class BuildError(RuntimeError):
    """A build step failed; the message says what to do."""


def step(msg: str) -> None:
    """Print one build step with the elapsed time, so slow steps are visible in CI logs."""
    print(f"[engine {time.monotonic() - T0:6.1f}s] {msg}", flush=True)


def read_lock() -> dict[str, str]:
    lock: dict[str, str] = {}
    for line in (PATCH_DIR / "sdist.lock").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            lock[key.strip()] = value.strip()
    return lock


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def cache_root() -> Path:
    return Path(os.environ.get("MOESCOPE_CACHE", Path.home() / ".cache" / "moescope"))


STOCK = False  # --stock: only the build patches (no slot cache), for the benchmark


def patches(backend: str = "cpu") -> list[Path]:
    """The patches of one backend's build: a ``-vulkan-`` patch only for Vulkan (so the other
    builds' cache keys do not change with it); only ``-build-`` patches for --stock."""
    found = sorted(PATCH_DIR.glob("*.patch"))
    found = [p for p in found if backend == "vulkan" or "-vulkan-" not in p.name]
    return [p for p in found if "-build-" in p.name] if STOCK else found


def native_sources() -> list[Path]:
    """The core's sources as compiled into libllama: headers and .cpp files, flat."""
    files = sorted(NATIVE_DIR.glob("include/*.h")) + sorted(NATIVE_DIR.glob("src/*.h"))
    return files + sorted(NATIVE_DIR.glob("src/*.cpp"))


def check_tools(backend: str) -> None:
    """Fail early with the Debian package to install, instead of a CMake backtrace."""
    needs = {"cmake": "cmake", "c++": "g++ (build-essential)", "patch": "patch",
             "ninja": "ninja-build"}
    for tool, package in needs.items():
        if shutil.which(tool) is None:
            raise BuildError(f"'{tool}' not found: install it, e.g. `sudo apt-get install "
                             f"{package.split()[0]}` ({package})")
    if backend == "cuda" and shutil.which("nvcc") is None:
        raise BuildError("the CUDA backend needs 'nvcc' on PATH: install the CUDA "
                         "toolkit (nvidia-cuda-toolkit or NVIDIA's cuda-toolkit package)")
    if backend == "vulkan":
        missing = vulkan_build_missing()
        if missing:
            raise BuildError(f"the Vulkan backend needs {', '.join(missing)}: `sudo apt-get "
                             f"install {VULKAN_PACKAGES}`")


def vulkan_build_missing(which: Any = shutil.which, exists: Any = os.path.exists) -> list[str]:
    """What a Vulkan build lacks here: the shader compiler and the headers ggml needs."""
    missing = []
    if which("glslc") is None:
        missing.append("glslc")
    includes = ("/usr/include", "/usr/local/include")
    if not any(exists(f"{inc}/vulkan/vulkan.hpp") for inc in includes):
        missing.append("the Vulkan headers (libvulkan-dev)")
    if not any(exists(f"{inc}/spirv/unified1/spirv.hpp") for inc in includes):
        missing.append("spirv-headers")
    return missing


class BackendChoice(NamedTuple):
    """The engine backend to build, why, and (CUDA) the architectures to compile for."""

    backend: str
    reason: str
    archs: str | None = None


def requested_backend(environ: Mapping[str, str]) -> str:
    """$MOESCOPE_BACKEND (auto, cpu, cuda, vulkan); MOESCOPE_CUDA=1 still means cuda."""
    value = environ.get("MOESCOPE_BACKEND", "").strip().lower()
    if not value:
        return "cuda" if environ.get("MOESCOPE_CUDA") == "1" else "auto"
    if value not in ("auto", *BACKENDS):
        raise BuildError(f"MOESCOPE_BACKEND={value!r} is not one of auto, cpu, cuda, vulkan")
    return value


def _run_text(cmd: list[str]) -> str | None:
    """A probe command's stdout, None when it is missing, fails or hangs."""
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout if proc.returncode == 0 else None


def nvidia_gpus(run: Callable[[list[str]], str | None]) -> list[tuple[str, str]]:
    """(name, compute capability) of each GPU the NVIDIA driver reports, e.g. ("NVIDIA
    H200", "9.0"); empty without a driver or GPU."""
    out = run(["nvidia-smi", "--query-gpu=name,compute_cap", "--format=csv,noheader"])
    gpus = []
    for line in (out or "").splitlines():
        name, _, cap = line.rpartition(",")
        cap = cap.strip()
        major, _, minor = cap.partition(".")
        if name.strip() and major.isdigit() and minor.isdigit() and len(cap) <= 6:
            gpus.append((name.strip(), cap))
    return gpus


VK_DEVICE_TYPES = {0: "PHYSICAL_DEVICE_TYPE_OTHER", 1: "PHYSICAL_DEVICE_TYPE_INTEGRATED_GPU",
                   2: "PHYSICAL_DEVICE_TYPE_DISCRETE_GPU", 3: "PHYSICAL_DEVICE_TYPE_VIRTUAL_GPU",
                   4: "PHYSICAL_DEVICE_TYPE_CPU"}


def vulkan_devices(run: Callable[[list[str]], str | None],
                   which: Callable[[str], str | None]) -> list[tuple[str, str]]:
    """(name, type) of each Vulkan device: `vulkaninfo --summary` when installed, else a
    tiny probe of libvulkan in a child process (a broken driver may crash or hang)."""
    if which("vulkaninfo") is not None:
        out = run(["vulkaninfo", "--summary"])
    else:
        out = run([sys.executable, str(Path(__file__).resolve()), "--probe-vulkan"])
    devices, kind = [], ""
    for line in (out or "").splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "deviceType":
            kind = value.strip()
        elif key.strip() == "deviceName" and kind:
            devices.append((value.strip(), kind))
            kind = ""
    return devices


def probe_vulkan_ctypes() -> list[tuple[str, str]]:
    """Enumerate Vulkan devices through libvulkan.so.1 (vkCreateInstance, then each
    device's properties); empty when there is no loader or no device."""
    import ctypes

    try:
        lib = ctypes.CDLL("libvulkan.so.1")
    except OSError:
        return []

    class AppInfo(ctypes.Structure):
        _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p),
                    ("pApplicationName", ctypes.c_char_p), ("applicationVersion", ctypes.c_uint32),
                    ("pEngineName", ctypes.c_char_p), ("engineVersion", ctypes.c_uint32),
                    ("apiVersion", ctypes.c_uint32)]

    class InstanceInfo(ctypes.Structure):
        _fields_ = [("sType", ctypes.c_int), ("pNext", ctypes.c_void_p),
                    ("flags", ctypes.c_uint32), ("pApplicationInfo", ctypes.POINTER(AppInfo)),
                    ("enabledLayerCount", ctypes.c_uint32),
                    ("ppEnabledLayerNames", ctypes.c_void_p),
                    ("enabledExtensionCount", ctypes.c_uint32),
                    ("ppEnabledExtensionNames", ctypes.c_void_p)]

    app = AppInfo(0, None, b"moescope-probe", 1, None, 0, (1 << 22) | (2 << 12))
    info = InstanceInfo(1, None, 0, ctypes.pointer(app), 0, None, 0, None)
    instance = ctypes.c_void_p()
    lib.vkCreateInstance.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    if lib.vkCreateInstance(ctypes.byref(info), None, ctypes.byref(instance)) != 0:
        return []
    lib.vkEnumeratePhysicalDevices.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    lib.vkGetPhysicalDeviceProperties.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    lib.vkDestroyInstance.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    count = ctypes.c_uint32(0)
    lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), None)
    handles = (ctypes.c_void_p * min(count.value, 64))()
    count.value = len(handles)
    lib.vkEnumeratePhysicalDevices(instance, ctypes.byref(count), handles)
    found = []
    for handle in handles[:count.value]:
        props = ctypes.create_string_buffer(4096)  # VkPhysicalDeviceProperties is ~820 bytes
        lib.vkGetPhysicalDeviceProperties(handle, props)
        kind = int.from_bytes(props.raw[16:20], "little")
        name = props.raw[20:276].split(b"\0")[0].decode(errors="replace")
        found.append((name, VK_DEVICE_TYPES.get(kind, "PHYSICAL_DEVICE_TYPE_OTHER")))
    lib.vkDestroyInstance(instance, None)
    return found


def choose_backend(requested: str = "auto",
                   run: Callable[[list[str]], str | None] = _run_text,
                   which: Callable[[str], str | None] = shutil.which,
                   exists: Callable[[str], bool] = os.path.exists,
                   environ: Mapping[str, str] = os.environ) -> BackendChoice:
    """The backend to build and a one-line reason. ``requested`` "auto": CUDA when nvcc and
    an NVIDIA driver with a GPU are present, else Vulkan when the Vulkan build tools and a
    hardware Vulkan device are present (a software device such as lavapipe computes on the
    CPU: no faster, so not chosen), else the CPU. The probes are parameters for tests."""
    gpus = nvidia_gpus(run) if which("nvidia-smi") is not None else []
    caps = sorted({cap.replace(".", "") for _, cap in gpus}, key=int)
    archs = None if environ.get("CMAKE_CUDA_ARCHITECTURES") else (";".join(caps) or None)
    if requested == "cpu":
        return BackendChoice("cpu", "MOESCOPE_BACKEND=cpu")
    if requested == "cuda":
        return BackendChoice("cuda", "MOESCOPE_BACKEND=cuda", archs)
    if requested == "vulkan":
        return BackendChoice("vulkan", "MOESCOPE_BACKEND=vulkan")
    notes = []
    nvcc = which("nvcc") is not None
    if gpus and nvcc:
        names = ", ".join(sorted({name for name, _ in gpus}))
        return BackendChoice("cuda", f"{names} (compute capability "
                             f"{', '.join(sorted({c for _, c in gpus}))}) and nvcc found", archs)
    if gpus:
        notes.append(f"{gpus[0][0]} found but no nvcc (install the CUDA toolkit for a CUDA "
                     "build)")
    elif nvcc:
        notes.append("nvcc found but no NVIDIA driver or GPU")
    devices = vulkan_devices(run, which) if which("vulkaninfo") or exists(
        "/usr/lib/x86_64-linux-gnu/libvulkan.so.1") or exists("/usr/lib64/libvulkan.so.1") \
        else []
    hardware = [name for name, kind in devices if not kind.endswith("_CPU")]
    if hardware:
        missing = vulkan_build_missing(which, exists)
        if not missing:
            return BackendChoice("vulkan", f"Vulkan GPU {hardware[0]} and glslc found")
        notes.append(f"Vulkan GPU {hardware[0]} found, but a Vulkan build needs "
                     f"{', '.join(missing)} (apt-get install {VULKAN_PACKAGES})")
    elif devices:
        notes.append(f"only a software Vulkan device ({devices[0][0].split(' (')[0]})")
    reason = "no GPU found" if not (gpus or hardware) else "no usable GPU toolchain"
    return BackendChoice("cpu", "; ".join([reason, *notes]))


def cmake_args(backend: str = "cpu", archs: str | None = None) -> list[str]:
    """Flags: portable CPU code, and nothing we do not load (tools, tests, mtmd, common)."""
    args = [
        "-DGGML_NATIVE=OFF",
        "-DLLAVA_BUILD=OFF",
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_TOOLS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_SERVER=OFF",
        "-DLLAMA_BUILD_APP=OFF",
        "-DLLAMA_OPENSSL=OFF",
        "-DCMAKE_BUILD_TYPE=Release",
    ]
    if backend == "cuda":
        args += cuda_args(archs)
    elif backend == "vulkan":
        args += ["-DGGML_VULKAN=ON"]
    if os.environ.get("MOESCOPE_CCACHE") == "0":
        args += ["-DGGML_CCACHE=OFF"]  # ggml uses ccache by itself when it is installed
    return args


def cuda_args(archs: str | None = None) -> list[str]:
    """The CUDA part of the flags: backend on, target architectures, toolkit workarounds.

    ``archs`` defaults to $CMAKE_CUDA_ARCHITECTURES, else "86;89;90" (bench/gpu_check.py
    passes "90" for the H200 check)."""
    archs = archs or os.environ.get("CMAKE_CUDA_ARCHITECTURES", "86;89;90")
    return ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={archs}",
            *cuda_toolkit_workarounds()]


def cuda_toolkit_root() -> Path:
    """The CUDA toolkit that `nvcc` belongs to.

    $CUDAToolkit_ROOT / $CUDA_HOME / $CUDA_PATH first; then the folder above the real
    `nvcc`, following a wrapper script such as ``exec /usr/local/cuda-13.0/bin/nvcc "$@"``
    (our CI machine's /usr/local/bin/nvcc); /usr/local/cuda last."""
    import re

    def is_toolkit(path: Path) -> bool:
        return (path / "include" / "cuda_runtime.h").exists() or any(
            path.glob("targets/*/include/cuda_runtime.h"))

    for var in ("CUDAToolkit_ROOT", "CUDA_HOME", "CUDA_PATH"):
        value = os.environ.get(var)
        if value and is_toolkit(Path(value)):
            return Path(value)
    nvcc = shutil.which("nvcc")
    if nvcc:
        real = Path(os.path.realpath(nvcc))
        if is_toolkit(real.parents[1]):
            return real.parents[1]
        with real.open("rb") as f:
            head = f.read(4096)
        if head.startswith(b"#!"):
            for match in re.finditer(rb"(/[^\s\"']+)/bin/nvcc", head):
                root = Path(match.group(1).decode(errors="replace"))
                if is_toolkit(root):
                    return root
    return Path("/usr/local/cuda")


def nvcc_major() -> int | None:
    """The major version of the `nvcc` on PATH (13 for "release 13.0"), None if unknown."""
    import re

    try:
        out = subprocess.run(["nvcc", "--version"], capture_output=True, text=True,
                             timeout=60, check=False).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    match = re.search(r"release (\d+)\.", out)
    return int(match.group(1)) if match else None


def find_cublas_root(toolkit: Path) -> Path | None:
    """Where cuBLAS is when the toolkit lacks it: None if the toolkit has it; else
    $CUBLAS_ROOT; else a pip-installed ``nvidia-cublas`` (PyTorch brings one) in this
    Python's site-packages, preferring the folder of nvcc's major version (nvidia/cu13).
    Raises :class:`BuildError` when there is none."""
    if any((toolkit / inc / "cublas_v2.h").exists()
           for inc in ("include", "targets/x86_64-linux/include", "targets/sbsa-linux/include")):
        return None
    env = os.environ.get("CUBLAS_ROOT")
    if env:
        return Path(env)
    found: list[Path] = []
    for entry in sys.path:
        base = Path(entry or ".") / "nvidia"
        if base.is_dir():
            found += [h.parents[1] for h in sorted(base.glob("*/include/cublas_v2.h"))]
    if not found:
        raise BuildError(
            f"the CUDA toolkit at {toolkit} has no cuBLAS (cublas_v2.h). Install it "
            "(cuda-libraries-dev), or unpack the PyPI wheel `nvidia-cublas` and set "
            "CUBLAS_ROOT to its nvidia/cu13 folder (see docs/building.md)")
    major = nvcc_major()
    found.sort(key=lambda root: root.name not in (f"cu{major}", "cublas"))
    return found[0]


def cuda_toolkit_workarounds() -> list[str]:
    """Flags for toolkits without cuBLAS or the libcuda stub (our CI machine has neither)."""
    root = cuda_toolkit_root()
    extra: list[str] = []
    cublas = find_cublas_root(root)
    if cublas is not None:
        inc = cublas / "include"
        libs = [d for d in (cublas / "lib", cublas / "lib64") if d.is_dir()]
        blas = sorted(p for d in libs for p in d.glob("libcublas.so*"))
        blas_lt = sorted(p for d in libs for p in d.glob("libcublasLt.so*"))
        if not (inc / "cublas_v2.h").exists() or not blas or not blas_lt:
            raise BuildError(f"CUBLAS_ROOT={cublas} needs include/cublas_v2.h and "
                             "lib/libcublas.so* + lib/libcublasLt.so*")
        extra += [f"-DCUDA_cublas_LIBRARY={blas[0]}",
                  f"-DCUDA_cublasLt_LIBRARY={blas_lt[0]}",
                  f"-DCMAKE_CUDA_FLAGS=-I{inc}", f"-DCMAKE_CXX_FLAGS=-I{inc}"]
    # CUDA VMM links libcuda.so; CMake finds the toolkit's stub or an unversioned system
    # libcuda.so, never the driver's libcuda.so.1 alone. Without one, use the legacy pool.
    linkable = [*root.glob("lib*/stubs/libcuda.so"), *root.glob("targets/*/lib/stubs/libcuda.so"),
                *root.glob("lib*/libcuda.so"), Path("/usr/lib/x86_64-linux-gnu/libcuda.so"),
                Path("/usr/lib64/libcuda.so"), Path("/usr/lib/libcuda.so")]
    if not any(p.exists() for p in linkable):
        extra.append("-DGGML_CUDA_NO_VMM=ON")
    return extra


def cache_key(sdist_sha: str, backend: str = "cpu", archs: str | None = None) -> str:
    """Hash of everything that changes the wheel's bytes (ccache does not)."""
    h = hashlib.sha256()
    h.update(f"builder={BUILDER_VERSION}\nsdist={sdist_sha}\nstock={STOCK}\n".encode())
    h.update(Path(__file__).read_bytes())
    h.update((PATCH_DIR / "build-requirements.txt").read_bytes())
    for path in patches(backend) + native_sources():
        h.update(f"\n{path.relative_to(REPO)}\n".encode())
        h.update(path.read_bytes())
    flags = [a for a in cmake_args(backend, archs) if not a.startswith("-DGGML_CCACHE")]
    h.update("\n".join(flags).encode())
    return h.hexdigest()[:16]


def fetch_sdist(lock: dict[str, str], cache: Path, pip: Path | None = None) -> Path:
    """The pinned sdist, hash-checked; a damaged cached copy (an interrupted copy, a bad
    disk) is downloaded again. ``pip``: the build venv's, whose scikit-build-core prepares
    the sdist's metadata (no isolated env to fetch, no pip traceback about the backend)."""
    dest = cache / "sdist"
    sdist = dest / lock["filename"]
    digest = sha256_file(sdist) if sdist.exists() else None
    if digest is not None and digest != lock["sha256"]:
        step(f"cached {sdist.name} is damaged (sha256 mismatch); downloading it again")
        sdist.unlink()
        digest = None
    if digest is None:
        step(f"downloading {lock['name']}=={lock['version']} sdist with pip")
        dest.mkdir(parents=True, exist_ok=True)
        pip = pip or build_env(cache) / "bin" / "pip"
        proc = subprocess.run(
            [str(pip), "download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation",
             "--quiet", f"{lock['name']}=={lock['version']}", "-d", str(dest)], check=False)
        if proc.returncode != 0 or not sdist.exists():
            raise BuildError(
                f"could not download {lock['name']}=={lock['version']} (pip's message above): "
                f"check the network or proxy (PIP_INDEX_URL), or put {lock['filename']} "
                f"(sha256 {lock['sha256']}) into {dest}/, then run make again")
        digest = sha256_file(sdist)
    if digest != lock["sha256"]:
        sdist.unlink()
        raise BuildError(f"{sdist.name}: sha256 {digest} does not match the pinned "
                         f"{lock['sha256']} (engine_patch/sdist.lock); the file was removed "
                         "(if this repeats, your package index serves a different file)")
    step(f"sdist verified: {sdist.name} sha256 {digest[:12]}...")
    return sdist


def apply_patches(tree: Path, backend: str = "cpu") -> None:
    """Apply every patch in order; a failure names the patch, the file and the hunk."""
    for patch in patches(backend):
        cmd = ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i",
               str(patch)]
        dry = subprocess.run([*cmd, "--dry-run"], cwd=tree, capture_output=True, text=True)
        if dry.returncode != 0:
            raise BuildError(f"patch {patch.name} does not apply:\n{dry.stdout}{dry.stderr}")
        subprocess.run(cmd, cwd=tree, check=True, capture_output=True)
        step(f"applied {patch.name}")


def sync_tree(src: Path, dst: Path) -> int:
    """Make dst equal to src, touching only files whose bytes differ (keeps mtimes)."""
    changed = 0
    seen: set[Path] = set()
    for path in src.rglob("*"):
        rel = path.relative_to(src)
        seen.add(rel)
        target = dst / rel
        if path.is_dir() and not path.is_symlink():
            target.mkdir(parents=True, exist_ok=True)
            continue
        if target.exists() and not path.is_symlink() and target.stat().st_size == \
                path.stat().st_size and target.read_bytes() == path.read_bytes():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.exists() or target.is_symlink():
            target.unlink()
        shutil.copy2(path, target, follow_symlinks=False)
        changed += 1
    for path in sorted(dst.rglob("*"), reverse=True):
        if path.relative_to(dst) not in seen:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink()
            changed += 1
    return changed


def prepare_tree(sdist: Path, lock: dict[str, str], work: Path, key: str,
                 backend: str = "cpu") -> Path:
    """Unpack, patch, add the core, stamp the version; sync into the stable work tree."""
    with tempfile.TemporaryDirectory(prefix="moescope-engine-") as tmp:
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="tar")
        tree = Path(tmp) / f"llama_cpp_python-{lock['version']}"
        shutil.rmtree(tree / "vendor" / "llama.cpp" / ".git", ignore_errors=True)
        apply_patches(tree, backend)
        core_dir = tree / "vendor" / "llama.cpp" / "src" / "moescope"
        core_dir.mkdir()
        for path in native_sources():
            shutil.copy2(path, core_dir / path.name)
        init = tree / "llama_cpp" / "__init__.py"
        init.write_text(init.read_text().replace(
            f'__version__ = "{lock["version"]}"',
            f'__version__ = "{lock["version"]}+{"stock" if STOCK else "moescope"}.{key}"'))
        work.mkdir(parents=True, exist_ok=True)
        changed = sync_tree(tree, work)
    step(f"patched tree ready in {work} ({changed} files changed)")
    return work


def build_env(cache: Path) -> Path:
    """A private venv with the pinned build backend (for --no-build-isolation reuse)."""
    reqs = PATCH_DIR / "build-requirements.txt"
    env = cache / "buildenv"
    stamp = env / "requirements.sha256"
    want = sha256_file(reqs)
    if not stamp.exists() or stamp.read_text() != want:
        step("creating the build environment (scikit-build-core)")
        shutil.rmtree(env, ignore_errors=True)
        if subprocess.run([sys.executable, "-m", "venv", str(env)], check=False).returncode:
            raise BuildError(f"could not create the build venv {env}: install python3-venv "
                             "(`sudo apt-get install python3-venv`), then run make again")
        if subprocess.run([str(env / "bin" / "pip"), "install", "--quiet", "-r", str(reqs)],
                          check=False).returncode:
            raise BuildError("could not install the build backend (engine_patch/"
                             "build-requirements.txt; pip's message above): check the "
                             "network or proxy (PIP_INDEX_URL), then run make again")
        stamp.write_text(want)
    return env


def build_wheel(tree: Path, cache: Path, args: list[str], configure_only: bool,
                flavour: str) -> Path:
    env = build_env(cache)
    build_dir = cache / "build" / flavour
    out = cache / f"tmp-wheel-{os.getpid()}"
    shutil.rmtree(out, ignore_errors=True)
    if configure_only:
        step(f"configuring only ({flavour}): cmake {' '.join(args)}")
        build_dir.mkdir(parents=True, exist_ok=True)
        subprocess.run(["cmake", "-S", str(tree), "-B", str(build_dir / "configure-only"),
                        "-G", "Ninja", *args], check=True)
        step("CMake configuration succeeded")
        return build_dir
    environ = dict(os.environ)
    environ["CMAKE_ARGS"] = " ".join(args)
    environ.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", str(os.cpu_count() or 2))
    first = {"cuda": "~20-45 min", "vulkan": "~15-25 min"}.get(flavour.split("-")[0], "~3-4 min")
    step(f"building the {flavour} wheel (first build {first} on 2 cores; incremental later)")
    log = cache / f"build-{flavour}.log"
    try:
        with log.open("w") as f:
            proc = subprocess.run(
                [str(env / "bin" / "pip"), "wheel", "--no-deps", "--no-build-isolation",
                 "-C", f"build-dir={build_dir}", "-C", "cmake.verbose=false",
                 "-w", str(out), str(tree)],
                env=environ, stdout=f, stderr=subprocess.STDOUT, check=False)
    except BaseException:  # Ctrl+C: no half-copied wheel left behind
        shutil.rmtree(out, ignore_errors=True)
        raise
    if proc.returncode != 0:
        shutil.rmtree(out, ignore_errors=True)  # a half-copied wheel would fill the disk
        text = log.read_text(errors="replace")
        if "No space left on device" in text:
            raise BuildError(no_space(cache, log))
        tail = "".join(text.splitlines(True)[-40:])
        raise BuildError(f"wheel build failed (full log: {log}):\n{tail}")
    wheels = list(out.glob("*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"expected one wheel in {out}, found {wheels}")
    return wheels[0]


def no_space(cache: Path, log: Path | None = None) -> str:
    where = f" (log: {log})" if log else ""
    return (f"no space left on device while building the engine{where}: free about 1 GB "
            f"under {cache} and {tempfile.gettempdir()} (or set MOESCOPE_CACHE to a bigger "
            "disk), then run make again")


def wheel_ok(path: Path) -> bool:
    """A complete wheel with the engine in it, not a truncated or damaged copy (~0.2 s)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip() is None and any(
                n.endswith("/libllama.so") for n in zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def sweep_tmp_wheels(cache: Path) -> None:
    """Remove tmp-wheel-<pid> folders of builds that were killed (each can hold ~14 MB);
    only old ones, in case the cache is shared with another machine (pids differ there)."""
    for tmp in cache.glob("tmp-wheel-*"):
        pid = tmp.name.rpartition("-")[2]
        if not pid.isdigit() or time.time() - tmp.stat().st_mtime < 12 * 3600:
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(tmp, ignore_errors=True)
        except OSError:
            pass  # alive, another user's


def install(wheel: Path, venv: Path, key: str) -> None:
    """Install into the project venv unless this exact build is already there."""
    marker = venv / "moescope-engine.key"
    if marker.exists() and marker.read_text().strip() == key:
        step(f"engine {key} already installed in {venv}")
        return
    step(f"installing {wheel.name} into {venv}")
    subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
                    "--no-deps", "--force-reinstall", str(wheel)], check=True)
    marker.write_text(key + "\n")


def unpack(wheel: Path, site: Path) -> Path:
    """The wheel's files under ``site`` (whole, or not there), executables kept runnable."""
    if not (site / "llama_cpp").is_dir():
        import zipfile

        part = site.with_name(f"{site.name}.part-{os.getpid()}")
        shutil.rmtree(part, ignore_errors=True)
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(part)
        for so in (part / "llama_cpp" / "lib").glob("*.so*"):
            so.chmod(0o755)
        shutil.rmtree(site, ignore_errors=True)
        part.rename(site)
    return site


def installed_lib_dir(venv: Path) -> Path | None:
    """llama_cpp/lib of the venv's installed engine (found without importing it)."""
    out = subprocess.run(
        [str(venv / "bin" / "python"), "-c",
         "import importlib.util as u; s = u.find_spec('llama_cpp'); "
         "print(s.submodule_search_locations[0] if s else '')"],
        capture_output=True, text=True, check=False).stdout.strip()
    return Path(out) / "lib" if out else None


def write_build_info(lib_dir: Path, choice: BackendChoice, key: str) -> None:
    """Which backend this libllama was built for and why, for the app's About and memory
    view (rewritten on every run: the reason belongs to this machine, not to the wheel)."""
    info = {"backend": choice.backend, "reason": choice.reason, "key": key,
            "cuda_architectures": choice.archs or ""}
    target = lib_dir / BUILD_INFO
    if target.is_symlink():
        target.unlink()
    tmp = target.with_suffix(f".tmp-{os.getpid()}")
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    tmp.replace(target)


def _lock(cache: Path, flavour: str) -> Any:
    """Hold an exclusive lock on this flavour's build directory until the process exits
    (or the handle is closed); flavour "shared" guards the sdist and the build venv, which
    every flavour uses."""
    import fcntl

    cache.mkdir(parents=True, exist_ok=True)
    handle = (cache / f"build-{flavour}.lock").open("w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        step(f"another {flavour} engine build is running; waiting for it")
        fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=None,
                        help="install the wheel into this venv")
    parser.add_argument("--backend", choices=("auto", *BACKENDS), default=None,
                        help="default: $MOESCOPE_BACKEND, else auto (cuda when "
                             "MOESCOPE_CUDA=1)")
    parser.add_argument("--cuda", action="store_true", help="same as --backend cuda")
    parser.add_argument("--configure-only", action="store_true",
                        help="stop after CMake configuration (checks the CUDA path)")
    parser.add_argument("--print-key", action="store_true")
    parser.add_argument("--print-backend", action="store_true",
                        help="print the backend auto-selection would build, and why")
    parser.add_argument("--lib-dir", action="store_true",
                        help="unpack the wheel and print its lib folder, for "
                             "LLAMA_CPP_LIB_PATH (a second backend beside the venv's)")
    parser.add_argument("--probe-vulkan", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--stock", action="store_true",
                        help="build llama-cpp-python without the slot-cache patch (for "
                             "bench/engine_bench.py) and print a folder to put on PYTHONPATH")
    args = parser.parse_args(argv)
    global STOCK
    STOCK = args.stock
    try:
        if args.probe_vulkan:
            for name, kind in probe_vulkan_ctypes():
                print(f"deviceType = {kind}\ndeviceName = {name}")
            return 0
        requested = "cuda" if args.cuda else args.backend or requested_backend(os.environ)
        choice = choose_backend(requested)
        if args.print_backend:
            print(f"{choice.backend}: {choice.reason}")
            return 0
        lock = read_lock()
        cache = cache_root()
        if args.print_key:
            print(cache_key(lock["sha256"], choice.backend, choice.archs))
            return 0
        step(f"backend: {choice.backend} ({choice.reason})")
        check_tools(choice.backend)
        key = cache_key(lock["sha256"], choice.backend, choice.archs)
        flavour = choice.backend + ("-stock" if args.stock else "")
        cached = cache / "wheels" / key
        wheels = list(cached.glob("*.whl")) if cached.exists() else []
        build_lock = _lock(cache, flavour)  # noqa: F841 (held until exit) one build per flavour at a time (CI, helpers, make)
        if not wheels:
            wheels = list(cached.glob("*.whl")) if cached.exists() else []  # built meanwhile
        sweep_tmp_wheels(cache)
        if wheels and not args.configure_only and not wheel_ok(wheels[0]):
            step(f"cached wheel {wheels[0].name} is damaged; removing it and rebuilding")
            shutil.rmtree(cached)
            wheels = []
        if wheels and not args.configure_only:
            step(f"reusing cached {flavour} wheel {key} ({wheels[0].name})")
            wheel = wheels[0]
        else:
            with _lock(cache, "shared"):
                sdist = fetch_sdist(lock, cache, build_env(cache) / "bin" / "pip")
            tree = prepare_tree(sdist, lock, cache / "src" / flavour, key, choice.backend)
            flags = cmake_args(choice.backend, choice.archs)
            built = build_wheel(tree, cache, flags, args.configure_only, flavour)
            if args.configure_only:
                return 0
            cached.mkdir(parents=True, exist_ok=True)
            wheel = cached / built.name
            shutil.move(str(built), wheel)
            shutil.rmtree(built.parent, ignore_errors=True)
            (cached / "manifest.json").write_text(json.dumps({
                "key": key, "flavour": flavour, "sdist_sha256": lock["sha256"],
                "patches": [p.name for p in patches(choice.backend)], "cmake_args": flags,
                "built_at": time.strftime("%Y-%m-%dT%H:%M:%S"),
                "seconds": round(time.monotonic() - T0, 1)}, indent=2))
            step(f"built and cached {wheel}")
        if args.stock or args.lib_dir:
            site = unpack(wheel, cache / ("stock" if args.stock else "unpacked") / key)
            if args.stock:
                step("stock llama_cpp unpacked; put this folder on PYTHONPATH:")
                print(site)
                return 0
            lib_dir = site / "llama_cpp" / "lib"
            write_build_info(lib_dir, choice, key)
            step("engine libraries unpacked; point LLAMA_CPP_LIB_PATH at:")
            print(lib_dir)
            return 0
        if args.venv is not None:
            install(wheel, args.venv, key)
            lib_dir = installed_lib_dir(args.venv)
            if lib_dir is not None:
                write_build_info(lib_dir, choice, key)
        step("done")
        return 0
    except BuildError as err:
        print(f"[engine] ERROR: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        print(f"[engine] ERROR: command failed ({err.returncode}): {err.cmd}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("\n[engine] interrupted: run make again to resume (a build continues where "
              "it stopped)", file=sys.stderr)
        return 130
    except OSError as err:
        msg = no_space(cache_root()) if err.errno == errno.ENOSPC else str(err)
        print(f"[engine] ERROR: {msg}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
