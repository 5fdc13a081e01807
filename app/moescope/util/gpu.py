"""What the NVIDIA driver says about GPU memory (pynvml), or that there is no such GPU.

Optional by design: on a machine without an NVIDIA driver every function returns None
and the window says "no NVIDIA GPU: expert slots in RAM" instead of failing.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from typing import Any

_lock = threading.Lock()
_handle: Any = None
_state = "unknown"  # "unknown" | "ok" | "absent"


@dataclass(frozen=True)
class GpuStatus:
    name: str
    total: int
    used: int
    free: int
    process_used: int | None
    """VRAM used by this process (None when the driver does not say)."""


def _init() -> Any:
    global _handle, _state
    with _lock:
        if _state == "unknown":
            try:
                import pynvml

                pynvml.nvmlInit()
                _handle = pynvml.nvmlDeviceGetHandleByIndex(0)
                _state = "ok"
            except Exception:
                _state = "absent"
        return _handle if _state == "ok" else None


def gpu_status() -> GpuStatus | None:
    """Memory of GPU 0, or None when there is no NVIDIA GPU or driver."""
    handle = _init()
    if handle is None:
        return None
    import pynvml

    try:
        mem = pynvml.nvmlDeviceGetMemoryInfo(handle)
        name = pynvml.nvmlDeviceGetName(handle)
        name = name.decode() if isinstance(name, bytes) else str(name)
        mine: int | None = None
        try:
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
            pid = os.getpid()
            mine = sum(int(p.usedGpuMemory or 0) for p in procs if p.pid == pid)
        except Exception:
            mine = None
        return GpuStatus(name=name, total=int(mem.total), used=int(mem.used),
                         free=int(mem.free), process_used=mine)
    except Exception:
        return None


def gpu_description() -> str:
    status = gpu_status()
    if status is None:
        return "no NVIDIA GPU: expert slots in RAM"
    return f"{status.name}, {status.free / 2**30:.1f} GiB free of {status.total / 2**30:.1f} GiB"
