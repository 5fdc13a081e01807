"""The context meter's words (moescope.display.context_meter): short numbers for contexts
of a million tokens and more, never wider than the meter's least width."""

from __future__ import annotations

import pytest

from moescope.display.context_meter import (
    EMPTY,
    EMPTY_SHORT,
    LEAST_WIDTH_TEXTS,
    compact_tokens,
    exact_text,
    meter_texts,
)


@pytest.mark.parametrize(("n", "text"), [
    (0, "0"), (512, "512"), (4096, "4096"), (9_999, "9999"), (10_000, "10k"),
    (32_768, "33k"), (262_144, "262k"), (999_499, "999k"), (999_999, "1.0M"),
    (1_048_576, "1.0M"), (1_500_000, "1.5M"), (9_960_000, "10M"), (128_000_000, "128M"),
    (1_000_000_000, "1.0G"), (-5, "0")])
def test_compact_tokens(n: int, text: str) -> None:
    assert compact_tokens(n) == text


def test_meter_forms_widest_first_and_the_short_ones_fit_the_least_width() -> None:
    assert meter_texts(0, 0) == [EMPTY, EMPTY_SHORT]
    assert meter_texts(262_144, 1_048_576) == [
        "context 262144 / 1048576", "262144 / 1048576", "context 262k / 1.0M",
        "262k / 1.0M"]
    assert meter_texts(5_000_000, 1_048_576)[-1] == "1.0M / 1.0M"  # used capped
    longest = max(len(t) for t in LEAST_WIDTH_TEXTS)
    for n in (9_999, 10_000, 999_499, 10**6, 9_949_999, 999_999_999, 10**9 - 1):
        assert len(meter_texts(n, n)[-1]) <= longest


def test_exact_text() -> None:
    assert exact_text(262_144, 1_048_576) == (
        "262,144 of 1,048,576 tokens of context in use (25%)")
    assert "No model" in exact_text(0, 0)
