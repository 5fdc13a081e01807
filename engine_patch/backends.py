"""Which backend MoEScope's engine is built for, and the CMake flags of each build.

Split from the build itself (``engine_patch/builder.py``) because it is the part that looks
at the machine: MOESCOPE_BACKEND=auto picks CUDA when nvcc and an NVIDIA driver are present
(architectures from the compute capability the driver reports), else Vulkan when glslc and
a Vulkan device other than a software one are present, else the CPU. The probes are
parameters so tests can fake a machine. Standard library only: the GPU check imports this
on a machine with nothing else installed.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

PROBE_SCRIPT = Path(__file__).resolve().parent / "build_engine.py"  # --probe-vulkan
BACKENDS = ("cpu", "cuda", "vulkan")
VULKAN_PACKAGES = "mesa-vulkan-drivers glslc libvulkan-dev spirv-headers"


class BuildError(RuntimeError):
    """A build step failed; the message says what to do."""


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


def run_text(cmd: list[str]) -> str | None:
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
        out = run([sys.executable, str(PROBE_SCRIPT), "--probe-vulkan"])
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
                   run: Callable[[list[str]], str | None] = run_text,
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
