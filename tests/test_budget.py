"""A VRAM budget becomes a uniform number of expert slots per MoE layer, within [top_k,
n_expert], and every budget string either parses or fails with one clear message."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from moescope.cache.budget import format_bytes, parse_budget, plan_for_model, plan_slots
from moescope.model.gguf_info import read_model_info
from moescope.util.errors import BudgetError

GiB = 2**30
MiB = 2**20


@pytest.mark.parametrize(
    ("text", "n_bytes"),
    [("12GiB", 12 * GiB), ("512MiB", 512 * MiB), ("512 MiB", 512 * MiB), ("12gib", 12 * GiB),
     ("1.5G", 3 * GiB // 2), ("64K", 65536), ("1TiB", 2**40), ("3000000000B", 3_000_000_000),
     ("1GB", 10**9), ("250MB", 250 * 10**6), ("4096B", 4096), (" 2 GiB ", 2 * GiB)],
)
def test_sizes_parse_to_bytes(text: str, n_bytes: int) -> None:
    budget = parse_budget(text)
    assert budget.n_bytes == n_bytes and not budget.is_fraction


@pytest.mark.parametrize(
    ("text", "fraction"),
    [("25%", Fraction(1, 4)), ("100%", Fraction(1)), ("12.5%", Fraction(1, 8)),
     ("0.5 %", Fraction(1, 200))],
)
def test_percentages_parse_to_exact_fractions(text: str, fraction: Fraction) -> None:
    assert parse_budget(text).fraction == fraction


@pytest.mark.parametrize(
    "text", ["", "   ", "abc", "-1GiB", "0", "0%", "0GiB", "150%", "100.1%", "12XB", "1e9",
             "12 Gib x", "GiB", "%", "16.0", "4.7", ".5", "1" * 5000],
)
def test_bad_budgets_raise_one_line_budget_error(text: str) -> None:
    with pytest.raises(BudgetError) as err:
        parse_budget(text)
    assert "\n" not in str(err.value)


def test_25_percent_of_128_experts_is_exactly_32_slots() -> None:
    plan = plan_slots("25%", n_expert=128, top_k=8, bytes_per_expert=[1000] * 16)
    assert plan.slots_per_layer == 32
    assert plan.residency == 0.25
    assert not plan.clamped
    assert plan.bytes_used == 32 * 1000 * 16


def test_a_byte_budget_buys_whole_slots_in_every_layer() -> None:
    row = 3 * 1000  # three MoE layers of 1000-byte experts
    assert plan_slots(f"{10 * row}B", n_expert=64, top_k=4,
                      bytes_per_expert=[1000] * 3).slots_per_layer == 10
    assert plan_slots(f"{10 * row - 1}B", n_expert=64, top_k=4,
                      bytes_per_expert=[1000] * 3).slots_per_layer == 9


def test_layers_with_different_expert_sizes_share_one_slot_count() -> None:
    plan = plan_slots("10000B", n_expert=32, top_k=2, bytes_per_expert=[1000, 1500, 2500])
    assert plan.slots_per_layer == 2  # 10000 // 5000
    assert plan.slot_row_bytes == 5000 and plan.n_moe_layers == 3


def test_too_small_a_budget_is_clamped_up_to_top_k_with_a_reason() -> None:
    plan = plan_slots("1KiB", n_expert=128, top_k=8, bytes_per_expert=[10_000] * 4)
    assert plan.slots_per_layer == 8
    assert plan.clamped
    assert "top-k" in plan.message
    assert plan.bytes_used == 8 * 40_000


def test_too_large_a_budget_is_clamped_down_to_all_experts() -> None:
    plan = plan_slots("1TiB", n_expert=16, top_k=2, bytes_per_expert=[100] * 2)
    assert plan.slots_per_layer == 16 and plan.fits_all and plan.clamped
    assert "all 16 experts" in plan.message


def test_100_percent_fits_all_without_clamping() -> None:
    plan = plan_slots("100%", n_expert=16, top_k=2, bytes_per_expert=[100] * 2)
    assert plan.fits_all and not plan.clamped


def test_planning_needs_experts() -> None:
    with pytest.raises(BudgetError):
        plan_slots("1GiB", n_expert=0, top_k=0, bytes_per_expert=[])
    with pytest.raises(BudgetError):
        plan_slots("1GiB", n_expert=8, top_k=9, bytes_per_expert=[10])


def test_plan_for_a_real_model_file(tiny_moe: Path) -> None:
    info = read_model_info(tiny_moe)
    plan = plan_for_model(info, "50%")
    assert plan.slots_per_layer == info.n_expert // 2
    assert plan.bytes_used == info.total_expert_bytes // 2


@given(
    n_expert=st.integers(1, 512),
    data=st.data(),
    bytes_per_expert=st.lists(st.integers(1, 10**7), min_size=1, max_size=64),
    budget=st.integers(1, 10**12),
)
def test_slots_are_within_bounds_and_use_at_most_the_budget_unless_clamped_up(
    n_expert: int, data: st.DataObject, bytes_per_expert: list[int], budget: int,
) -> None:
    top_k = data.draw(st.integers(1, n_expert))
    plan = plan_slots(f"{budget}B", n_expert=n_expert, top_k=top_k,
                      bytes_per_expert=bytes_per_expert)
    row = sum(bytes_per_expert)
    assert top_k <= plan.slots_per_layer <= n_expert
    assert plan.bytes_used == plan.slots_per_layer * row
    if not plan.clamped:
        assert plan.bytes_used <= budget < plan.bytes_used + row
    elif plan.slots_per_layer == top_k and top_k < n_expert:
        assert budget < top_k * row
    more = plan_slots(f"{budget + row}B", n_expert=n_expert, top_k=top_k,
                      bytes_per_expert=bytes_per_expert)
    assert more.slots_per_layer >= plan.slots_per_layer  # monotonic in the budget


@given(percent=st.integers(1, 100), n_expert=st.integers(1, 512))
def test_whole_percentages_give_floor_of_the_exact_share(percent: int, n_expert: int) -> None:
    plan = plan_slots(f"{percent}%", n_expert=n_expert, top_k=1, bytes_per_expert=[7, 11])
    assert plan.slots_per_layer == max(1, percent * n_expert // 100)


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (1023, "1023 B"), (1024, "1.00 KiB"), (6528, "6.38 KiB"),
     (3 * GiB // 2, "1.50 GiB"), (100 * MiB, "100.0 MiB")],
)
def test_format_bytes(n: int, text: str) -> None:
    assert format_bytes(n) == text


def test_slots_per_layer_read_the_same_everywhere() -> None:
    """"16 slots", or any bare whole number, is slots per layer (the window's budget box
    always read it so; the CLI read a bare 16 as 16 bytes and then clamped it to top-k); a
    unit is never slots."""
    kw = {"n_expert": 64, "top_k": 4, "bytes_per_expert": [1000, 3000]}
    for text in ("16 slots", "16slots", "16 SLOTS", "16", " 16 "):
        plan = plan_slots(text, **kw)
        assert plan.slots_per_layer == 16 and not plan.clamped, text
        assert plan.budget_bytes == plan.bytes_used == 16 * 4000
    assert plan_slots("64", **kw).slots_per_layer == 64 and not plan_slots("64", **kw).clamped
    assert plan_slots("16B", **kw).slots_per_layer == 4  # bytes, said so
    low = plan_slots("2 slots", **kw)
    assert low.slots_per_layer == 4 and low.clamped and "top-k = 4" in low.message
    for bad in ("0 slots", "1.5 slots"):
        with pytest.raises(BudgetError, match="whole number"):
            plan_slots(bad, **kw)
    with pytest.raises(BudgetError, match="in slots"):
        parse_budget("8 slots").resolve(10**9)


@pytest.mark.parametrize("text", ["65", "100 slots", "3000000000"])
def test_more_slots_than_experts_is_an_error_naming_the_maximum(text: str) -> None:
    """On a 64-expert model "64" meant 64 slots but "65" meant 65 bytes (clamped to 4
    slots), and "3000000000" was bytes: one rule now, and a mistake says the limit."""
    with pytest.raises(BudgetError, match="at most 64 slots") as err:
        plan_slots(text, n_expert=64, top_k=4, bytes_per_expert=[1000, 3000])
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("text", "says"), [
    ("16.0", "no unit"), ("4.7", "say 4.7GiB, 4.7%"), ("", "empty"), ("  ", "empty")])
def test_a_bare_decimal_or_an_empty_budget_asks_for_a_unit(text: str, says: str) -> None:
    """"16.0" and "4.7" were read as bytes (16 bytes: clamped to top-k, without a word),
    and an empty budget was taken as no budget."""
    with pytest.raises(BudgetError, match=says):
        parse_budget(text)
