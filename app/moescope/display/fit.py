"""Will it fit? The estimate shown before a model is loaded, from its header alone.

Users of every local-chat app ask for this (LM Studio's load estimate, textgen's "estimated
VRAM"), and MoE estimates are where the others go wrong: here all experts live in host RAM
and only ``slots_per_layer`` of them per layer take VRAM, so RAM and VRAM are priced
separately. No Qt here: the dialog formats what this computes.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from moescope.cache.budget import BudgetPlan, format_bytes, plan_for_model
from moescope.model.gguf_info import ModelInfo
from moescope.util.gpu import gpu_status


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
            ("Expert weights (host RAM)", format_bytes(self.expert_bytes)),
            ("KV cache (f16, estimate)", format_bytes(self.kv_bytes)),
        ]
        if self.plan is not None:
            p = self.plan
            rows += [
                ("Slots per layer", f"{p.slots_per_layer} of {p.n_expert} "
                                    f"({p.residency:.1%} resident, top-k {p.top_k})"),
                ("Expert slots (VRAM)", format_bytes(p.bytes_used)),
            ]
        else:
            rows.append(("Expert cache", "off: dense model (no routed experts)"))
        rows += [
            ("RAM needed", f"{format_bytes(self.ram_needed)} "
                           f"({format_bytes(self.ram_available)} available)"),
            ("GPU", self.gpu),
        ]
        return rows

    def warnings(self) -> list[str]:
        out = []
        if not self.fits_ram:
            out.append(f"needs {format_bytes(self.ram_needed)} of RAM but only "
                       f"{format_bytes(self.ram_available)} is available")
        if not self.fits_vram and self.vram_free is not None:
            out.append(f"expert slots need {format_bytes(self.vram_needed)} of VRAM but only "
                       f"{format_bytes(self.vram_free)} is free: choose a smaller budget")
        if self.plan is not None and self.plan.clamped:
            out.append(self.plan.message)
        return out


def kv_cache_bytes(info: ModelInfo, n_ctx: int) -> int:
    """K and V in f16 for every layer: 2 x layers x ctx x kv_heads x head_dim x 2 bytes."""
    md, arch = info.metadata, info.architecture
    heads_kv = md.get(f"{arch}.attention.head_count_kv") or md.get(
        f"{arch}.attention.head_count") or 1
    if isinstance(heads_kv, list | tuple):
        heads_kv = max(heads_kv) if heads_kv else 1
    key_len = md.get(f"{arch}.attention.key_length")
    val_len = md.get(f"{arch}.attention.value_length")
    if key_len is None or val_len is None:
        heads = md.get(f"{arch}.attention.head_count") or 1
        if isinstance(heads, list | tuple):
            heads = max(heads) if heads else 1
        per_head = (info.n_embd or 0) // max(int(heads), 1)
        key_len = key_len or per_head
        val_len = val_len or per_head
    return int(info.n_layers * n_ctx * int(heads_kv) * (int(key_len) + int(val_len)) * 2)


def estimate_fit(info: ModelInfo, budget: str, n_ctx: int = 2048) -> FitEstimate:
    """The numbers for ``info`` at ``budget`` (``"25%"``, ``"12GiB"``, bytes)."""
    plan = plan_for_model(info, budget) if info.is_moe else None
    gpu = gpu_status()
    kv = kv_cache_bytes(info, n_ctx)
    slots = plan.bytes_used if plan else 0
    host = info.non_expert_bytes + info.total_expert_bytes + kv
    # without an NVIDIA GPU the "VRAM" slots are host memory too
    ram_needed = host + (slots if gpu is None else 0)
    return FitEstimate(
        model_name=info.name or info.file_name, is_moe=info.is_moe,
        non_expert_bytes=info.non_expert_bytes, expert_bytes=info.total_expert_bytes,
        kv_bytes=kv, plan=plan, ram_needed=ram_needed,
        ram_available=int(psutil.virtual_memory().available),
        vram_needed=slots, vram_free=gpu.free if gpu else None,
        gpu=(f"{gpu.name}: {format_bytes(gpu.free)} VRAM free of {format_bytes(gpu.total)}"
             if gpu else "no NVIDIA GPU: expert slots in RAM"))
