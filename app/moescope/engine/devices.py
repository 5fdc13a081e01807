"""The devices llama.cpp's ggml sees, with their memory: where the expert slots will land.

NVML (:mod:`moescope.util.gpu`) only knows NVIDIA GPUs; a Vulkan build on an AMD or Intel
card, or on an integrated GPU, reached the window as "GPU memory, not measured". ggml itself
answers for every backend it was built with (``ggml_backend_dev_memory``: the Vulkan
backend's memory budget, CUDA's free memory), and says whether a GPU is integrated: an
integrated GPU's memory is the machine's RAM, so slots there count against RAM, as on a CPU
build. llama.cpp offloads to the discrete GPUs, and to integrated ones only when there is no
discrete GPU (``llama_model_load``'s device list), so :func:`slot_device` picks the same one.

Reading this loads the engine's library (and a GPU backend initialises its driver: tens to
hundreds of milliseconds, once per process); a CPU build never needs to (:func:`slot_device`
answers None without loading anything).
"""

from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moescope.engine.backend import engine_build

# enum ggml_backend_dev_type (ggml-backend.h)
_KINDS = {0: "cpu", 1: "gpu", 2: "igpu", 3: "accel"}
MAX_DEVICES = 64
"""Devices read at most (a bound on what the library answers)."""

_lock = threading.Lock()
_ggml: Any = None
_state = "unknown"  # "unknown" | "ok" | "absent"


@dataclass(frozen=True)
class Device:
    name: str
    """ggml's name ("Vulkan0", "CUDA0", "CPU")."""
    description: str
    """The driver's name for it ("AMD Radeon RX 7900 XTX (RADV NAVI31)")."""
    kind: str
    """"gpu" (discrete), "igpu" (integrated: its memory is the host's), "cpu", "accel"."""
    free: int
    total: int

    @property
    def host_memory(self) -> bool:
        """Its memory is the machine's RAM (an integrated GPU, or the CPU)."""
        return self.kind in ("igpu", "cpu", "accel")


def _library() -> Any:
    """libggml.so beside the libllama.so ``llama_cpp`` loaded (the same copy), with the
    device functions declared; None where it cannot be had."""
    global _ggml, _state
    with _lock:
        if _state == "unknown":
            _state = "absent"
            try:
                from llama_cpp import llama_cpp as low

                lib = ctypes.CDLL(str(Path(low._lib._name).parent / "libggml.so"))
                vp, size = ctypes.c_void_p, ctypes.c_size_t
                for name, res, args in (
                        ("ggml_backend_dev_count", size, []),
                        ("ggml_backend_dev_get", vp, [size]),
                        ("ggml_backend_dev_name", ctypes.c_char_p, [vp]),
                        ("ggml_backend_dev_description", ctypes.c_char_p, [vp]),
                        ("ggml_backend_dev_type", ctypes.c_int, [vp]),
                        ("ggml_backend_dev_memory", None,
                         [vp, ctypes.POINTER(size), ctypes.POINTER(size)])):
                    fn = getattr(lib, name)
                    fn.restype, fn.argtypes = res, args
                from moescope.engine.engine import _quiet_stderr

                with _quiet_stderr():  # a GPU backend lists its devices as it starts
                    lib.ggml_backend_dev_count()
                _ggml, _state = lib, "ok"
            except (ImportError, OSError, AttributeError, TypeError):
                pass
        return _ggml


def _text(raw: bytes | None) -> str:
    return " ".join((raw or b"").decode("utf-8", errors="replace").split())[:200]


def ggml_devices() -> list[Device]:
    """Every device the engine's ggml has, with its memory now ([] when the engine's library
    cannot be loaded)."""
    lib = _library()
    if lib is None:
        return []
    out: list[Device] = []
    for i in range(min(int(lib.ggml_backend_dev_count()), MAX_DEVICES)):
        dev = lib.ggml_backend_dev_get(i)
        if not dev:
            continue
        free, total = ctypes.c_size_t(0), ctypes.c_size_t(0)
        lib.ggml_backend_dev_memory(dev, ctypes.byref(free), ctypes.byref(total))
        t = max(0, int(total.value))
        out.append(Device(name=_text(lib.ggml_backend_dev_name(dev)),
                          description=_text(lib.ggml_backend_dev_description(dev)),
                          kind=_KINDS.get(int(lib.ggml_backend_dev_type(dev)), "other"),
                          free=min(max(0, int(free.value)), t) if t else max(0, int(free.value)),
                          total=t))
    return out


def slot_device(backend: str | None = None) -> Device | None:
    """The device llama.cpp puts the layers (and so the expert slots) on when asked to
    offload: the first discrete GPU, else the first integrated one; None on a CPU build or
    where the build sees no GPU (slots in RAM). ``backend``: the build's (default: the
    installed engine's)."""
    if (backend if backend is not None else engine_build().backend) == "cpu":
        return None
    devices = ggml_devices()
    for kind in ("gpu", "igpu"):
        for d in devices:
            if d.kind == kind:
                return d
    return None
