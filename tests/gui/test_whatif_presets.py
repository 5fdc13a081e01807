"""The what-if view and paper 2: cache-prior and psr are swept by default, any preset can be
picked, and psr is offered only when the trace kept the predictions it replays."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest

from moescope.display.policy_choices import POLICY_TIPS
from moescope.display.whatif_model import (
    BUDGETS,
    POLICIES,
    default_policies,
    has_predictions,
    preset_choices,
)
from moescope.gui.traces.trace_window import TraceWindow
from moescope.gui.traces.whatif_view import WhatIfView
from moescope.sim import cost_model, sweep
from moescope.trace import read_trace


def test_cache_prior_and_psr_are_swept_by_default(qtbot: Any, trace_window: TraceWindow,
                                                  trace_path: Path) -> None:
    view = trace_window.whatif
    for name in ("cache-prior", "psr"):
        action = view.policy_actions[name]
        assert action.isChecked() and action.isEnabled(), name
        assert action.toolTip() == POLICY_TIPS[name]
    assert not view.policy_actions["exact"].isEnabled()  # the reference is always in
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        trace_window.tabs.setCurrentWidget(view)
    result = view.result
    assert result is not None and result.policies == POLICIES
    trace = read_trace(trace_path)
    assert result.rows == sweep(trace, POLICIES, BUDGETS, cost_model("pcie4")).rows
    assert {"cache-prior", "psr"} <= set(view.curves)
    assert {"cache-prior", "psr"} <= {label.text for _, label in view.legend.items}
    rows = {(r.policy, r.budget): r for r in result.rows}
    # psr replays the recorded predictions: its prefetches turn misses into hits
    assert rows["psr", "25%"].hit_rate > rows["cache-prior", "25%"].hit_rate
    assert not any("PSR predictions" in w for w in result.warnings)


def test_picking_presets_resweeps_with_them(qtbot: Any, trace_window: TraceWindow,
                                           trace_path: Path) -> None:
    view = trace_window.whatif
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        trace_window.tabs.setCurrentWidget(view)
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000) as blocker:
        view.set_policies(["threshold", "psr"])
    result = blocker.args[0]
    assert result.policies == ("exact", "psr", "threshold")  # menu order, reference first
    assert view.table.rowCount() == 3 * len(BUDGETS) + 1
    assert set(view.curves) == {"exact", "psr", "threshold"}
    # one click in the menu sweeps again, with that preset added
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000) as blocker:
        view.policy_actions["first-choice"].trigger()
    assert "first-choice" in blocker.args[0].policies
    with pytest.raises(ValueError):
        view.set_policies(["no-such-policy"])


def test_psr_is_offered_only_with_recorded_predictions(qtbot: Any, trace_path: Path) -> None:
    trace = read_trace(trace_path)
    assert has_predictions(trace)
    assert all(reason is None for reason in preset_choices(trace).values())
    for token in trace.tokens:  # as a trace recorded before PSR would be
        token.routes = {k: dataclasses.replace(r, predicted=None, next_layer=-1)
                        for k, r in token.routes.items()}
    assert not has_predictions(trace)
    reasons = preset_choices(trace)
    assert reasons["psr"] is not None and "predictions" in reasons["psr"]
    assert reasons["cache-prior"] is None
    assert default_policies(trace) == tuple(p for p in POLICIES if p != "psr")
    view = WhatIfView(trace)
    qtbot.addWidget(view)
    psr = view.policy_actions["psr"]
    assert not psr.isEnabled() and not psr.isChecked()
    assert "predictions" in psr.toolTip()
    assert view.shutdown()
