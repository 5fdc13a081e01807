"""The what-if table's recorded point names the budget and slots the session ran at, unless
the session resized its cache on the way."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from moescope.display.whatif_model import cell_text, with_recorded_budget
from moescope.sim import cost_model, sweep
from moescope.sim.sweep import RECORDED
from moescope.trace import read_trace
from moescope_testing.traces import synthetic_trace


def test_the_recorded_point_says_its_budget_unless_the_session_resized(tmp_path: Path) -> None:
    trace = read_trace(synthetic_trace(tmp_path / "t.arrows", n_tokens=6))
    h = trace.header
    row = sweep(trace, [RECORDED], [RECORDED], cost_model("pcie4")).rows[0]
    assert row.slots is None and cell_text(row, "slots") == "recorded"

    shown = with_recorded_budget(row, trace)
    assert (shown.budget, shown.slots) == (h.budget, h.slots_per_layer)
    assert cell_text(shown, "slots") == str(h.slots_per_layer)
    assert dataclasses.replace(shown, budget=row.budget, slots=None) == row  # nothing else

    tokens = list(trace.tokens)
    tokens[3] = dataclasses.replace(tokens[3], slots_per_layer=h.slots_per_layer + 1)
    resized = dataclasses.replace(trace, tokens=tokens)
    assert with_recorded_budget(row, resized) == row  # a resize: "recorded" stays
