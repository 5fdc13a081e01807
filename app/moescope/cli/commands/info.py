"""``moescope info MODEL.gguf [--budget 12GiB|25%] [--json]``.

Answers "will this model work with my GPU, and how much of it stays resident?" from the
GGUF header alone: the MoE layers, experts per layer and top-k, the bytes one expert takes
in each layer (per tensor and ggml type), the expert and non-expert totals, and for a
budget the slots per layer it buys.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import Any

from moescope.cache.budget import BudgetPlan, format_bytes, parse_budget, plan_for_model
from moescope.cli.options import add_ctx_argument, check_ctx, path_arg
from moescope.model.gguf_info import ModelInfo, read_model_info
from moescope.model.reasoning import thinking_choices
from moescope.model.sampling_defaults import EXTRA_KEYS, describe, model_sampling, unapplied
from moescope.util.errors import one_line
from moescope.util.words import plural


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``info`` subcommand."""
    p = subparsers.add_parser(
        "info",
        help="show a model's experts and what a VRAM budget buys (reads the header only)",
        description="Show a GGUF model's Mixture-of-Experts layout without loading it.",
    )
    p.add_argument("model", type=path_arg, metavar="MODEL.gguf", help="path to a GGUF model")
    p.add_argument(
        "--budget", metavar="SIZE|PCT",
        help="VRAM for expert slots: 12GiB, 512MiB, 3000000000B (a size needs a unit), "
             "25%% of the experts, or 16 (slots per layer)",
    )
    add_ctx_argument(p)  # the KV cache the memory line prices
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the model summary; user errors propagate as MoEScopeError (exit 2)."""
    budget = parse_budget(args.budget) if args.budget is not None else None  # before I/O
    check_ctx(args)
    info = read_model_info(args.model)
    plan = plan_for_model(info, budget) if budget is not None else None
    from moescope.engine.backend import backend_text, engine_build

    build = engine_build()
    memory = _memory(info, args.budget or DEFAULT_FIT_BUDGET, args.ctx)
    if args.json:
        out: dict[str, Any] = info.to_dict()
        if plan is not None:
            out["budget"] = _plan_dict(plan)
        out["memory"] = memory
        print(json.dumps(out, indent=2))
    else:
        print(format_info(info, plan, engine=backend_text(build),
                          memory=_memory_line(memory)))
    return 0


DEFAULT_FIT_BUDGET = "25%"
"""The VRAM budget the memory line prices where ``--budget`` is not given (the default
of ``generate``, ``chat``, ``serve``, ``pull`` and the Open dialog)."""


def _memory(info: ModelInfo, budget: str, n_ctx: int) -> dict[str, Any]:
    """What loading would keep in RAM by default (``--ram-budget auto``) here, now: the
    fit's :attr:`~moescope.display.fit.FitEstimate.ram_needed` at ``budget`` and ``n_ctx``
    (the Open dialog's and ``pull``'s figure: weights, the KV cache, the slots where this
    engine puts them in host memory, working buffers)."""
    from moescope.display.fit import estimate_fit
    from moescope.engine.engine import auto_ram_budget
    from moescope.util.memory_limit import memory_limit

    limit = memory_limit()
    fit = estimate_fit(info, budget, n_ctx)
    n_ctx = fit.n_ctx
    slot_bytes = 0 if fit.slots_on_gpu else fit.vram_needed
    need = fit.ram_needed
    tier = auto_ram_budget(info, n_ctx, available=limit.available,
                           slot_bytes=slot_bytes)[0] if info.is_moe else None
    return {"n_ctx": n_ctx, "needs_bytes": need, "available_bytes": limit.available,
            "cgroup": limit.group, "cgroup_limit_bytes": limit.group_limit,
            "ram_experts_per_layer": int(tier) if tier is not None else info.n_expert}


def _memory_line(m: dict[str, Any]) -> str:
    where = f" (memory cgroup {m['cgroup']}: limit {format_bytes(m['cgroup_limit_bytes'])})" \
        if m["cgroup"] is not None else ""
    head = (f"needs about {format_bytes(m['needs_bytes'])} with a {m['n_ctx']}-token context "
            f"and working buffers; {format_bytes(m['available_bytes'])} available{where}")
    return head + (": every expert in RAM by default"
                   if m["needs_bytes"] <= m["available_bytes"] else
                   f": by default {plural(m['ram_experts_per_layer'], 'expert')} per layer "
                   f"{'stays' if m['ram_experts_per_layer'] == 1 else 'stay'} in RAM, "
                   f"the others are read from the file (--ram-budget auto)")


def format_info(info: ModelInfo, plan: BudgetPlan | None = None, engine: str = "",
                memory: str = "") -> str:
    """The human-readable report, one fact per line; ``engine`` is the installed engine's
    backend line (a budget means little without knowing where the slots would go);
    ``memory`` what loading would keep in RAM here."""
    rows: list[tuple[str, str]] = [
        ("model", f"{info.file_name} ({format_bytes(info.file_size)}"
                  + (f" in {len(info.parts)} files)" if info.parts else ")")),
        ("architecture", info.architecture + (f" ({info.name})" if info.name else "")),
        ("layers", _layers_line(info)),
        ("experts", f"{info.n_expert} per layer, top-{info.top_k} routed per token"
                    + (f", {info.n_expert_shared} shared" if info.n_expert_shared else "")),
    ]
    layer_groups = _group_layers_by_layout(info)
    for layers, first in layer_groups:
        label = "per expert" if len(layer_groups) == 1 else f"per expert, {_ranges(layers)}"
        tensors = info.expert_tensors[first]
        parts = ", ".join(
            f"{t.kind}{'' if t.part == 'weight' else ' ' + t.part} "
            f"{format_bytes(t.bytes_per_expert)} {t.ggml_type}"
            for t in tensors
        )
        by_type = ", ".join(
            f"{ty} {format_bytes(n)}" for ty, n in info.expert_bytes_by_type(first).items()
        )
        rows.append((label, f"{format_bytes(info.bytes_per_expert[first])} per layer"))
        rows.append(("  tensors", parts))
        rows.append(("  by type", by_type))
    rows += [
        ("expert bytes", f"{format_bytes(info.total_expert_bytes)} "
                         f"({plural(len(info.moe_layers), 'layer')} x "
                         f"{plural(info.n_expert, 'expert')})"),
        ("non-expert", format_bytes(info.non_expert_bytes)),
        ("metadata", f"sha256:{info.metadata_sha256}"),
    ]
    template = info.metadata.get("tokenizer.chat_template")
    choices = thinking_choices(template if isinstance(template, str) else None)[1:]
    if choices:
        rows.append(("thinking", f"chat template switch: {'/'.join(choices)} "
                                 "(moescope chat --thinking, GUI: Chat settings)"))
    if recommended := describe(model_sampling(info.metadata)):
        rows.append(("sampling", f"{recommended} (the model's recommendation: what "
                                 "generate, chat, serve and the window use unless told)"))
    if recommended := describe({k: v for k, v in model_sampling(
            info.metadata, extra=True).items() if k in EXTRA_KEYS}):
        rows.append(("sampling+", f"{recommended} (the model's recommendation: what "
                                  "generate, chat and serve use unless told; not the "
                                  "window)"))
    if ignored := unapplied(info.metadata):
        rows.append(("not applied", f"{ignored} (recommended by the model; MoEScope's "
                                    "sampler keeps its own)"))
    if plan is not None:
        rows += [
            (f"budget {plan.budget.text}",
             f"{plan.slots_per_layer} slots per layer of {plan.n_expert} "
             f"({plan.residency:.1%} resident), {format_bytes(plan.bytes_used)} of expert slots"),
        ]
        if plan.clamped:
            rows.append(("  note", plan.message))
    if memory:
        rows.append(("memory", memory))
    if engine:
        rows.append(("engine", engine))
    width = max(len(k) for k, _ in rows)
    # the file's own strings (its name, its tensors' kinds) are the file's author's: a
    # general.name holding an ESC sequence recoloured the terminal, one with a newline
    # printed a line of its choosing ("moescope: error: ...")
    return "\n".join(f"{k.ljust(width)}  {one_line(v)}" for k, v in rows)


def _layers_line(info: ModelInfo) -> str:
    text = f"{info.n_layers} (MoE: {_ranges(info.moe_layers)}"
    if info.dense_layers:
        text += f"; dense: {_ranges(info.dense_layers)}"
    if info.nextn_layers:
        text += (f"; multi-token prediction: {_ranges(info.nextn_layers)}, "
                 f"{format_bytes(info.nextn_bytes)}, not loaded")
    return text + ")"


def _group_layers_by_layout(info: ModelInfo) -> list[tuple[list[int], int]]:
    """MoE layers grouped by identical expert layout: usually a single group."""
    groups: dict[tuple[Any, ...], list[int]] = {}
    for layer in info.moe_layers:
        key = tuple((t.kind, t.part, t.ggml_type, t.bytes_per_expert)
                    for t in info.expert_tensors[layer])
        groups.setdefault(key, []).append(layer)
    return [(layers, layers[0]) for layers in groups.values()]


def _ranges(layers: Iterable[int]) -> str:
    """``[0, 1, 2, 5, 7, 8]`` -> ``"0-2, 5, 7-8"``."""
    out: list[str] = []
    items = sorted(layers)
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        out.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ", ".join(out) if out else "none"


def _plan_dict(plan: BudgetPlan) -> dict[str, Any]:
    return {
        "text": plan.budget.text, "budget_bytes": plan.budget_bytes,
        "slots_per_layer": plan.slots_per_layer, "residency": plan.residency,
        "bytes_used": plan.bytes_used, "clamped": plan.clamped, "message": plan.message,
    }
