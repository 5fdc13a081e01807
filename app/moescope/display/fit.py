"""Will it fit? The estimate shown before a model is loaded, from its header alone.

Users of every local-chat app ask for this (LM Studio's load estimate, textgen's "estimated
VRAM"), and MoE estimates are where the others go wrong: here all experts live in host RAM
and only ``slots_per_layer`` of them per layer take VRAM, so RAM and VRAM are priced
separately. With a RAM budget below the experts (the RAM tier), the experts beyond it stay
in the model file and are read from disk on demand: three tiers, each with its speed. Where
the slots land depends on the engine's build (:mod:`moescope.engine.backend`) and the GPU
its ggml sees (:mod:`moescope.engine.devices`: a Vulkan build's AMD or Intel card is measured
there, NVML only knows NVIDIA's; an integrated GPU's slots are priced as RAM), not on whether
NVML sees an NVIDIA GPU.
No Qt here: the dialog formats what this computes.
"""

from __future__ import annotations

from dataclasses import dataclass

from moescope.cache.budget import BudgetPlan, format_bytes, plan_for_model
from moescope.engine.backend import NAMES, engine_build
from moescope.engine.devices import Device, slot_device
from moescope.model.gguf_info import ModelInfo
from moescope.model.ram_fit import RESERVE, host_bytes_needed, kv_cache_bytes
from moescope.util.gpu import gpu_status
from moescope.util.memory_limit import memory_limit

SPEED_SLOTS = "a hit computes at once"
SPEED_RAM = "a miss in RAM waits for a copy (about 80 µs per 2 MB over PCIe, less on a CPU build)"
SPEED_DISK = ("a miss on disk waits for a read (about 1 ms per 2 MB at 2 GB/s): about ten "
              "times a copy from RAM, so quality-first substitutes more of those")


@dataclass(frozen=True)
class FitEstimate:
    model_name: str
    is_moe: bool
    non_expert_bytes: int
    expert_bytes: int
    kv_bytes: int
    plan: BudgetPlan | None
    ram_needed: int
    ram_available: int
    vram_needed: int
    vram_free: int | None
    gpu: str
    backend: str = "cpu"
    """The engine build's backend ("cpu", "cuda", "vulkan"; "" unknown)."""
    slots_on_gpu: bool = False
    """The slots go to GPU memory (a CUDA build with a GPU, or a Vulkan build)."""
    ram_plan: BudgetPlan | None = None
    """The RAM tier's plan (experts per layer kept in RAM); None: every expert in RAM."""
    n_ctx: int = 0
    """The context the KV cache is priced for (the one asked for, at most the model's)."""
    working_bytes: int = RESERVE
    """llama.cpp's compute buffers, the disk reads' staging and the app (an estimate),
    counted in :attr:`ram_needed` as ``moescope info`` counts them."""

    @property
    def ram_expert_bytes(self) -> int:
        """Expert bytes kept in RAM (all of them without a RAM tier)."""
        if self.ram_plan is None or self.ram_plan.fits_all:
            return self.expert_bytes
        return min(self.expert_bytes, self.ram_plan.bytes_used)

    @property
    def disk_expert_bytes(self) -> int:
        """Expert bytes left in the file and read on demand."""
        return self.expert_bytes - self.ram_expert_bytes

    def _slots_where(self) -> str:
        if not self.slots_on_gpu:
            return "RAM" + (" (CPU build)" if self.backend == "cpu" else "")
        if self.vram_free is None:
            return f"GPU memory ({NAMES.get(self.backend, self.backend)}; free memory not measured)"
        return "VRAM"

    def placement(self) -> list[tuple[str, str]]:
        """(label, value) rows: where each part lands and what that means for speed."""
        if self.plan is None:
            return []
        p = self.plan
        rows = [("Expert slots", f"{format_bytes(p.bytes_used)} in {self._slots_where()}: "
                                 f"{p.slots_per_layer} of {p.n_expert} per layer; "
                                 f"{SPEED_SLOTS}")]
        if self.disk_expert_bytes:
            assert self.ram_plan is not None
            rows += [
                ("Experts in RAM", f"{format_bytes(self.ram_expert_bytes)} (RAM tier, "
                                   f"{self.ram_plan.slots_per_layer} of {p.n_expert} per "
                                   f"layer); {SPEED_RAM}"),
                ("Experts on disk", f"{format_bytes(self.disk_expert_bytes)} stay in the "
                                    f"model file; {SPEED_DISK}. Loads in seconds."),
            ]
        else:
            rows += [("Experts in RAM", f"all {format_bytes(self.expert_bytes)}; {SPEED_RAM}"),
                     ("Experts on disk", "none (set a RAM budget below the experts to leave "
                                         "some in the file)")]
        return rows

    @property
    def fits_ram(self) -> bool:
        return self.ram_needed <= self.ram_available

    @property
    def fits_vram(self) -> bool:
        return self.vram_free is None or self.vram_needed <= self.vram_free

    def lines(self) -> list[tuple[str, str]]:
        """(label, value) rows for the dialog."""
        rows = [
            ("Model", self.model_name),
            ("Non-expert weights", format_bytes(self.non_expert_bytes)),
            ("Expert weights (host RAM)", format_bytes(self.expert_bytes)
             if not self.disk_expert_bytes else
             f"{format_bytes(self.expert_bytes)} ({format_bytes(self.ram_expert_bytes)} in "
             f"RAM, the rest read from disk)"),
            ("KV cache (f16, estimate)", format_bytes(self.kv_bytes)
             + (f" for {self.n_ctx} tokens" if self.n_ctx else "")),
        ]
        if self.plan is not None:
            p = self.plan
            rows += [
                ("Slots per layer", f"{p.slots_per_layer} of {p.n_expert} "
                                    f"({p.residency:.1%} resident, top-k {p.top_k})"),
                *self.placement(),  # its "Expert slots" row gives their bytes and place
            ]
        else:
            rows.append(("Expert cache", "off: dense model (no routed experts)"))
        rows += [
            ("RAM needed", f"{format_bytes(self.ram_needed)} with the KV cache and "
                           f"{format_bytes(self.working_bytes)} of working buffers "
                           f"({format_bytes(self.ram_available)} available)"),
            ("GPU", self.gpu),
        ]
        return rows

    def warnings(self) -> list[str]:
        out = []
        if not self.fits_ram:
            out.append(f"needs {format_bytes(self.ram_needed)} of RAM but only "
                       f"{format_bytes(self.ram_available)} is available"
                       + (": choose a RAM budget below the experts, the rest are read from "
                          "disk" if self.plan is not None else ""))
        if not self.fits_vram and self.vram_free is not None:
            out.append(f"expert slots need {format_bytes(self.vram_needed)} of VRAM but only "
                       f"{format_bytes(self.vram_free)} is free: choose a smaller budget")
        if self.plan is not None and self.plan.clamped:
            out.append(self.plan.message)
        return out


_FIND = object()


def estimate_fit(info: ModelInfo, budget: str, n_ctx: int = 2048,
                 ram_budget: str | None = None, backend: str | None = None,
                 device: Device | object | None = _FIND) -> FitEstimate:
    """The numbers for ``info`` at ``budget`` (``"25%"``, ``"12GiB"``, bytes) and, with
    ``ram_budget``, a RAM tier of that size (experts beyond it read from disk). ``backend``
    defaults to the installed engine's build, ``device`` to the GPU its ggml would put the
    slots on (:func:`moescope.engine.devices.slot_device`; None: no GPU, slots in RAM).

    ``ram_needed`` is :func:`moescope.model.ram_fit.host_bytes_needed`, as ``moescope
    info`` says it: the weights kept in RAM, the KV cache for ``n_ctx`` (at most the
    model's context, as the engine loads it), slots in host memory and working
    buffers."""
    plan = plan_for_model(info, budget) if info.is_moe else None
    ram_plan = plan_for_model(info, ram_budget) if plan is not None and ram_budget else None
    gpu = gpu_status()
    build = engine_build().backend if backend is None else backend
    dev = (slot_device(build) if build in ("cuda", "vulkan") else None) \
        if device is _FIND else device
    assert dev is None or isinstance(dev, Device)
    slots_on_gpu = build != "cpu" and dev is not None and not dev.host_memory
    if info.context_length:
        n_ctx = min(n_ctx, info.context_length)
    kv = kv_cache_bytes(info, n_ctx)
    slots = plan.bytes_used if plan else 0
    experts_in_ram = info.total_expert_bytes
    if ram_plan is not None and not ram_plan.fits_all:
        experts_in_ram = min(info.total_expert_bytes, ram_plan.bytes_used)
    ram_needed = host_bytes_needed(info, n_ctx, 0 if slots_on_gpu else slots, experts_in_ram)
    free: int | None = None
    name = NAMES.get(build, build)
    if build == "cpu" or not build:
        where = "CPU build: expert slots in RAM" + (
            f" ({gpu.name} is not used by a CPU build)" if gpu is not None else "")
    elif dev is None:
        where = f"no GPU seen by the {name} build: expert slots in RAM"
    elif dev.host_memory:
        where = (f"{dev.description or dev.name} (integrated GPU, {name}): expert slots in "
                 f"the memory it shares with the CPU, counted as RAM")
    elif gpu is not None and build == "cuda":
        free = gpu.free
        where = f"{gpu.name}: {format_bytes(gpu.free)} VRAM free of {format_bytes(gpu.total)}"
    else:
        free = dev.free if dev.total > 0 else None
        where = (f"{dev.description or dev.name} ({name}): " +
                 (f"{format_bytes(dev.free)} free of {format_bytes(dev.total)}"
                  if free is not None else "free memory not reported"))
    return FitEstimate(
        model_name=info.name or info.file_name, is_moe=info.is_moe,
        non_expert_bytes=info.non_expert_bytes, expert_bytes=info.total_expert_bytes,
        kv_bytes=kv, plan=plan, ram_needed=ram_needed,
        ram_available=memory_limit().available,
        vram_needed=slots, vram_free=free, gpu=where,
        backend=build, slots_on_gpu=slots_on_gpu, ram_plan=ram_plan, n_ctx=n_ctx)
