"""RAM (psutil) and VRAM (pynvml, else ggml's) of this process and of the whole system.

Sampled about once a second by the cache panel (cheap system calls); the display timer
draws it with the other plots. VRAM columns stay NaN without a GPU holding the slots. It
also names where the experts live in host memory (:func:`expert_memory`), which decides how
fast a fetch can copy: the engine reports llama.cpp's buffer name once, at load.
"""

from __future__ import annotations

import time

import psutil

from moescope.display.ring import RingBuffer
from moescope.engine.backend import engine_build
from moescope.engine.devices import slot_device
from moescope.util.gpu import GpuStatus, gpu_status
from moescope.util.memory_limit import MemoryLimit, memory_limit

GIB = float(2**30)

PINNED_TIP = (
    "The experts are in pinned (page-locked) host memory: every fetch copies to VRAM by "
    "DMA at full PCIe speed. Costs: a slower load, and the RAM is not shared with the "
    "page cache.")
PAGEABLE_TIP = (
    "The experts are in pageable host memory{how}: a copy to VRAM is staged through a "
    "driver bounce buffer, slower than from pinned memory (full PCIe speed). With layers "
    "offloaded to a GPU (CUDA build) MoEScope loads them into pinned memory. On a CPU-only "
    "build the slots are RAM too, and pinning does not apply.")


def expert_memory(buffer: str) -> tuple[str, str]:
    """``(text, tooltip)`` for llama.cpp's expert buffer name; ``("", "")`` when unknown.

    ``*_Host`` buffers (``CUDA_Host``) are the GPU backend's pinned memory; ``CPU_Mapped``
    is the memory-mapped GGUF file; ``CPU`` is ordinary RAM the weights were read into.
    """
    if not buffer:
        return "", ""
    if buffer.endswith("_Host"):
        return f"pinned ({buffer})", PINNED_TIP
    if buffer.endswith("_Mapped"):
        return "pageable (mmap)", PAGEABLE_TIP.format(how=" (the model file, memory-mapped)")
    if buffer == "CPU":
        return "pageable (RAM)", PAGEABLE_TIP.format(how=" (read into RAM)")
    return buffer, f"The experts are in llama.cpp's {buffer} buffer."


def device_status(backend: str | None = None) -> GpuStatus | None:
    """The memory of the GPU the engine's ggml puts the slots on (a Vulkan build's AMD or
    Intel card, which NVML does not see), as :func:`gpu_status` would give it, without this
    process's share (ggml does not say); None without one. ``backend``: the build's, as
    :func:`slot_device` takes it (default: read from the installed engine's record)."""
    dev = slot_device(backend)
    if dev is None or dev.total <= 0:
        return None
    return GpuStatus(name=dev.description or dev.name, total=dev.total,
                     used=max(0, dev.total - dev.free), free=dev.free, process_used=None)


MEMORY_COLUMNS = ("t", "ram_process", "ram_system", "vram_process", "vram_system")


class MemoryModel:
    """The last ``capacity`` samples, in GiB, x = seconds since the window opened."""

    def __init__(self, capacity: int = 600, limit: MemoryLimit | None = None) -> None:
        self.samples = RingBuffer(MEMORY_COLUMNS, capacity)
        self.limit = limit if limit is not None else memory_limit()
        """The memory cgroup limit over this process, if one binds (a container, a systemd
        slice): the summary names it, since the system's totals would mislead."""
        self._t0 = time.monotonic()
        self._process = psutil.Process()
        self.ram_total = psutil.virtual_memory().total / GIB
        self.gpu: GpuStatus | None = None
        self.expert_buffer = ""
        """llama.cpp's buffer holding the experts (``ModelSummary.expert_buffer``)."""
        self.slots_on_device = False
        """The slots are in a GPU's memory that NVML cannot see (e.g. a Vulkan build): its
        memory is then ggml's figure for that device (:func:`device_status`)."""
        self.dirty = False
        self._backend: str | None = None
        """The engine build's backend, read from its record once (it cannot change while
        the window runs), not at every sample."""

    def sample(self) -> None:
        vm = psutil.virtual_memory()
        try:
            rss = self._process.memory_info().rss / GIB
        except psutil.Error:
            rss = float("nan")
        self.gpu = gpu_status()
        if self.gpu is None and self.slots_on_device:
            if self._backend is None:
                self._backend = engine_build().backend
            self.gpu = device_status(self._backend)
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
        lim = self.limit
        if lim.group is not None and lim.group_limit is not None:
            ram += (f" · limit {lim.group_limit / GIB:.1f} GiB (memory cgroup "
                    f"{lim.group})")
        g = self.gpu
        if g is None:
            vram = ("VRAM: not measured without an NVIDIA GPU (expert slots on the GPU)"
                    if self.slots_on_device else "VRAM: no NVIDIA GPU (expert slots in RAM)")
        else:
            mine = (f"this process {g.process_used / GIB:.2f} GiB · "
                    if g.process_used is not None else "")
            vram = f"VRAM: {mine}system {g.used / GIB:.1f} / {g.total / GIB:.1f} GiB"
        return f"{ram}\n{vram}"
