"""How much of a model must sit in host memory, from its header: the KV cache and the
experts per layer a RAM tier starts with when the whole model does not fit."""

from __future__ import annotations

from moescope.model.gguf_info import ModelInfo
from moescope.util.memory_limit import memory_available

AUTO_RAM_BUDGET = "auto"
"""``ram_budget`` that keeps every expert in RAM when the model fits the memory this
process may use (:mod:`moescope.util.memory_limit`: cgroup limits included), else a RAM
tier of what fits (:func:`ram_start_experts`). The front ends' default: without it a
model larger than RAM is read by page faults, at a few tokens a minute, or does not load.
Also a live RAM budget (``/ram auto``, the window's Auto), chosen again from the memory
available then."""


AUTO_CHANGE_MARK = " (auto)"
"""How a live RAM-tier change that auto chose ends (``ram=12 (auto)``): the window says
its note (``LoadedModel.ram_note``) in the status bar for those."""


def is_auto(budget: str | None) -> bool:
    """``budget`` asks for :data:`AUTO_RAM_BUDGET` (any case, spaces around)."""
    return budget is not None and budget.strip().lower() == AUTO_RAM_BUDGET


RESERVE = 256 << 20
"""Memory kept out of a RAM tier's estimate: llama.cpp's compute buffers, the disk reads'
staging and the app itself (measured: about 45 MiB beyond the model's own bytes for a small
model on the CPU build; a 30B model's compute buffer at 4k context is a few hundred)."""

DEFAULT_CONTEXT = 4096
"""A session's context length in tokens when none is chosen, capped at the model's own:
the window's Open and Get models dialogs, ``generate``, ``chat``, ``serve``, ``info`` and
``pull`` alike, so their memory figures agree."""


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


def ram_start_experts(info: ModelInfo, n_ctx: int, available: int | None = None,
                      slot_bytes: int = 0) -> int:
    """Experts per layer to keep in RAM at first: all of them when the whole model fits in
    the memory ``available`` (default: what this process may take now), else what fits in
    80% of what is left after the rest of the model, the KV cache, ``slot_bytes`` (expert
    slots in host memory: a CPU build's) and :data:`RESERVE` (at least top-k: one token's
    experts)."""
    row = sum(info.bytes_per_expert[layer] for layer in info.moe_layers)
    free = memory_available() if available is None else available
    if row <= 0 or host_bytes_needed(info, n_ctx, slot_bytes) <= free:
        return info.n_expert
    rest = info.non_expert_bytes + kv_cache_bytes(info, n_ctx) + max(0, slot_bytes) + RESERVE
    return max(info.top_k, min(info.n_expert, int(0.8 * (free - rest)) // row))


def host_bytes_needed(info: ModelInfo, n_ctx: int, slot_bytes: int = 0,
                      ram_expert_bytes: int | None = None) -> int:
    """Host memory the model takes: its non-expert weights, ``ram_expert_bytes`` of
    experts kept in RAM (default: every expert; a RAM tier keeps fewer, the rest stay in
    the file), the KV cache for ``n_ctx`` tokens, ``slot_bytes`` of slots in host memory
    and :data:`RESERVE` (working buffers). The one accounting of "RAM needed": ``moescope
    info``, the fit the Open dialog and ``pull`` show (:mod:`moescope.display.fit`) and
    the RAM tier ``auto`` chooses all use it."""
    experts = info.total_expert_bytes if ram_expert_bytes is None else \
        max(0, min(ram_expert_bytes, info.total_expert_bytes))
    return info.non_expert_bytes + experts + kv_cache_bytes(info, n_ctx) + \
        max(0, slot_bytes) + RESERVE
