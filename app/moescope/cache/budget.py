"""Turn a VRAM budget ("12GiB", "25%") into expert slots per MoE layer.

The expert cache gives every MoE layer the same number of slots (the papers' setting:
"~25% of experts resident" means 25% in every layer). A budget in bytes therefore buys
``floor(budget / sum_l bytes_per_expert[l])`` slots per layer; a percentage is a fraction
of all routed-expert bytes. The result is clamped to ``[top_k, n_expert]``: fewer slots than
experts routed per token cannot hold one token's selection, and more than ``n_expert`` slots
are wasted. Clamping is reported, not raised, so a UI can show why the slider stopped;
only a slot count asked for in so many words that exceeds the expert count is an error.

Units: ``B``, ``KiB MiB GiB TiB`` (and ``K M G T``) are powers of 1024, ``KB MB GB TB``
powers of 1000, ``N%`` is a share of the expert bytes, and ``N slots`` is slots per layer.
A bare whole number is always slots per layer ("16" is 16 slots, never 16 bytes, whatever
the model); a size needs its unit (``3000000000B``), and a bare decimal (``4.7``) is
refused rather than guessed at.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import TYPE_CHECKING

from moescope.util.errors import BudgetError

if TYPE_CHECKING:
    from moescope.model.gguf_info import ModelInfo

_UNITS: dict[str, int] = {
    "b": 1,
    "k": 2**10, "ki": 2**10, "kib": 2**10, "kb": 10**3,
    "m": 2**20, "mi": 2**20, "mib": 2**20, "mb": 10**6,
    "g": 2**30, "gi": 2**30, "gib": 2**30, "gb": 10**9,
    "t": 2**40, "ti": 2**40, "tib": 2**40, "tb": 10**12,
}
_BUDGET = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*|%)\s*$", re.IGNORECASE)
_SLOTS = ("slot", "slots")


@dataclass(frozen=True)
class Budget:
    """A parsed budget: either absolute bytes or a fraction of the model's expert bytes."""

    text: str
    n_bytes: int | None = None
    fraction: Fraction | None = None
    slots: int | None = None
    """``N slots`` or a bare ``N``: slots per layer, whatever they cost."""

    @property
    def is_fraction(self) -> bool:
        return self.fraction is not None

    def resolve(self, total_expert_bytes: int) -> int:
        """Bytes this budget stands for, given the model's total routed-expert bytes."""
        if self.fraction is not None:
            return math.floor(self.fraction * total_expert_bytes)
        if self.n_bytes is None:
            raise BudgetError(f"budget {self.text!r} is in slots: plan it for a model")
        return self.n_bytes


def parse_budget(text: str) -> Budget:
    """Parse ``"12GiB"``, ``"512 MiB"``, ``"1.5G"``, ``"3000000000B"``, ``"25%"``,
    ``"16 slots"`` or ``"16"`` (slots).

    Raises :class:`BudgetError` with a one-line explanation for anything else, for zero or
    negative budgets, for percentages above 100 and for a bare decimal.
    """
    if not text.strip():
        raise BudgetError("the budget is empty: give a size like 12GiB, a share of the "
                          "experts like 25%, or slots per layer like 16")
    m = _BUDGET.match(text) if len(text) <= 64 else None
    if m is None:
        shown = text if len(text) <= 64 else text[:60] + "..."
        raise BudgetError(
            f"cannot read budget {shown!r}: use a size like 12GiB, 512MiB, 3000000000B, "
            f"a share of the experts like 25%, or slots per layer like 16"
        )
    number, unit = Fraction(m.group(1)), m.group(2).lower()
    if unit == "":
        if "." in m.group(1):
            raise BudgetError(
                f"budget {text.strip()!r} has no unit: say {m.group(1)}GiB, {m.group(1)}%, "
                f"or a whole number of slots per layer like 16")
        unit = "slots"
    if unit == "%":
        if not 0 < number <= 100:
            raise BudgetError(f"budget {text.strip()!r} must be a percentage in (0, 100]")
        return Budget(text=text.strip(), fraction=number / 100)
    if unit in _SLOTS:
        if number.denominator != 1 or number <= 0:
            raise BudgetError(f"budget {text.strip()!r}: slots per layer must be a whole "
                              f"number of at least 1")
        return Budget(text=text.strip(), slots=int(number))
    if unit not in _UNITS:
        raise BudgetError(
            f"unknown unit {m.group(2)!r} in budget {text.strip()!r}: use B, KiB, MiB, GiB, "
            f"TiB (or KB, MB, GB, TB), % of the experts, or slots"
        )
    n_bytes = math.floor(number * _UNITS[unit])
    if n_bytes <= 0:
        raise BudgetError(f"budget {text.strip()!r} must be more than zero bytes")
    return Budget(text=text.strip(), n_bytes=n_bytes)


@dataclass(frozen=True)
class BudgetPlan:
    """How many expert slots each MoE layer gets for a budget, and why."""

    budget: Budget
    budget_bytes: int
    slots_per_layer: int
    n_expert: int
    top_k: int
    n_moe_layers: int
    slot_row_bytes: int  # bytes of one slot in every MoE layer together
    bytes_used: int
    clamped: bool
    message: str

    @property
    def residency(self) -> float:
        """Fraction of each layer's experts that are resident (slots / n_expert)."""
        return self.slots_per_layer / self.n_expert

    @property
    def fits_all(self) -> bool:
        return self.slots_per_layer == self.n_expert


def plan_slots(budget: Budget | str, *, n_expert: int, top_k: int,
               bytes_per_expert: Sequence[int]) -> BudgetPlan:
    """Slots per layer for ``budget``; ``bytes_per_expert`` has one entry per MoE layer.

    Kept independent of :class:`ModelInfo` so the engine and simulator can plan for
    hypothetical models too.
    """
    b = parse_budget(budget) if isinstance(budget, str) else budget
    if n_expert <= 0 or not bytes_per_expert:
        raise BudgetError("a budget needs a model with routed experts")
    if not 0 < top_k <= n_expert:
        raise BudgetError(f"top-k {top_k} must be between 1 and n_expert {n_expert}")
    row = sum(bytes_per_expert)
    if row <= 0:
        raise BudgetError("the model's experts have no bytes")
    total = row * n_expert
    slots_asked = b.slots
    if slots_asked is not None and slots_asked > n_expert:
        raise BudgetError(f"budget {b.text!r}: {slots_asked} slots per layer is more than "
                          f"the model's {n_expert} experts (at most {n_expert} slots, or "
                          f"100%)")
    if slots_asked is not None:  # "16 slots", or a bare 16
        budget_bytes = slots_asked * row
        fitting = slots_asked
    elif b.fraction is not None:
        # Exact rational arithmetic: 25% of 128 experts is 32 slots, never 31.
        budget_bytes = math.floor(b.fraction * total)
        fitting = math.floor(b.fraction * n_expert)
    else:
        assert b.n_bytes is not None
        budget_bytes = b.n_bytes
        fitting = budget_bytes // row
    slots = min(max(fitting, top_k), n_expert)
    clamped = slots != fitting
    used = slots * row
    if slots_asked is not None and fitting < top_k:
        message = (f"{fitting} slot(s) per layer cannot hold one token's top-k = {top_k} "
                   f"experts; using {top_k} slots ({format_bytes(used)})")
    elif fitting < top_k:
        message = (
            f"budget {b.text} ({format_bytes(budget_bytes)}) holds only {fitting} expert(s) "
            f"per layer; using the minimum of top-k = {top_k} slots "
            f"({format_bytes(used)})"
        )
    elif fitting > n_expert:
        message = (
            f"budget {b.text} ({format_bytes(budget_bytes)}) exceeds all experts "
            f"({format_bytes(total)}); all {n_expert} experts per layer are resident"
        )
    else:
        message = (
            f"{slots} of {n_expert} experts per layer resident ({slots / n_expert:.1%}), "
            f"{format_bytes(used)} of budget {b.text} ({format_bytes(budget_bytes)})"
        )
    return BudgetPlan(
        budget=b, budget_bytes=budget_bytes, slots_per_layer=slots, n_expert=n_expert,
        top_k=top_k, n_moe_layers=len(bytes_per_expert), slot_row_bytes=row, bytes_used=used,
        clamped=clamped, message=message,
    )


def plan_for_model(info: ModelInfo, budget: Budget | str) -> BudgetPlan:
    """Slots per layer for ``budget`` on a model read by ``read_model_info``."""
    return plan_slots(
        budget, n_expert=info.n_expert, top_k=info.top_k,
        bytes_per_expert=[info.bytes_per_expert[layer] for layer in info.moe_layers],
    )


def format_bytes(n: int) -> str:
    """Human-readable binary size: ``"512 B"``, ``"6.4 KiB"``, ``"1.50 GiB"``."""
    if n < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024.0
        if value < 1024.0 or unit == "PiB":
            return f"{value:.2f} {unit}" if value < 10 else f"{value:.1f} {unit}"
    raise AssertionError("unreachable")
