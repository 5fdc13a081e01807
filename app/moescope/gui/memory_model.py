"""RAM (psutil) and VRAM (pynvml) of this process and of the whole system, over time.

Sampled about once a second by the cache panel (cheap system calls); the display timer
draws it with the other plots. VRAM columns stay NaN without an NVIDIA GPU.
"""

from __future__ import annotations

import time

import psutil

from moescope.gui.gpu import GpuStatus, gpu_status
from moescope.gui.ring import RingBuffer

GIB = float(2**30)
MEMORY_COLUMNS = ("t", "ram_process", "ram_system", "vram_process", "vram_system")


class MemoryModel:
    """The last ``capacity`` samples, in GiB, x = seconds since the window opened."""

    def __init__(self, capacity: int = 600) -> None:
        self.samples = RingBuffer(MEMORY_COLUMNS, capacity)
        self._t0 = time.monotonic()
        self._process = psutil.Process()
        self.ram_total = psutil.virtual_memory().total / GIB
        self.gpu: GpuStatus | None = None
        self.dirty = False

    def sample(self) -> None:
        vm = psutil.virtual_memory()
        try:
            rss = self._process.memory_info().rss / GIB
        except psutil.Error:
            rss = float("nan")
        self.gpu = gpu_status()
        g = self.gpu
        self.samples.append({
            "t": time.monotonic() - self._t0,
            "ram_process": rss,
            "ram_system": (vm.total - vm.available) / GIB,
            "vram_process": (g.process_used / GIB if g and g.process_used is not None
                             else float("nan")),
            "vram_system": g.used / GIB if g else float("nan"),
        })
        self.dirty = True

    def summary(self) -> str:
        s = self.samples
        if s.count == 0:
            return ""
        ram = (f"RAM: this process {s.last('ram_process'):.2f} GiB · system "
               f"{s.last('ram_system'):.1f} / {self.ram_total:.1f} GiB")
        g = self.gpu
        if g is None:
            vram = "VRAM: no NVIDIA GPU (expert slots in RAM)"
        else:
            mine = (f"this process {g.process_used / GIB:.2f} GiB · "
                    if g.process_used is not None else "")
            vram = f"VRAM: {mine}system {g.used / GIB:.1f} / {g.total / GIB:.1f} GiB"
        return f"{ram}\n{vram}"
