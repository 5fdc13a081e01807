"""The trace window's what-if view: a recorded session replayed at other budgets and
policies, with the simulator's own numbers, computed without blocking the event loop."""

from __future__ import annotations

import dataclasses
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PySide6.QtCore import QPointF, QTimer

from moescope.display import whatif_model
from moescope.display.whatif_model import BUDGETS, COLUMNS, POLICIES, cell_text
from moescope.gui.traces.trace_window import TraceWindow
from moescope.gui.traces.whatif_view import WhatIfView
from moescope.sim import cost_model, sweep
from moescope.sim.sweep import RECORDED
from moescope.trace import read_trace


def _open_whatif(qtbot: Any, window: TraceWindow) -> WhatIfView:
    """Switch to the what-if tab (which starts the sweep) and wait for its result."""
    view = window.whatif
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        window.tabs.setCurrentWidget(view)
    return view


def test_the_points_are_the_simulators_sweep(qtbot: Any, trace_window: TraceWindow,
                                             trace_path: Path) -> None:
    view = _open_whatif(qtbot, trace_window)
    trace = read_trace(trace_path)
    cost = cost_model("pcie4")
    expected = sweep(trace, POLICIES, BUDGETS, cost)
    assert view.result is not None
    assert view.result.rows == expected.rows
    assert len(view.result.rows) == len(POLICIES) * len(BUDGETS)
    recorded = sweep(trace, [RECORDED, "exact"], [RECORDED], cost).rows[0]
    assert recorded.policy == RECORDED and recorded.slots is None
    # the table names the budget and slots the session ran at (it never resized)
    assert {t.slots_per_layer for t in trace.tokens} == {trace.header.slots_per_layer}
    recorded = dataclasses.replace(recorded, budget=trace.header.budget,
                                   slots=trace.header.slots_per_layer)
    assert view.result.recorded == recorded

    # the table shows every point, the recorded one last
    points = [*expected.rows, recorded]
    assert view.table.rowCount() == len(points)
    for r, row in enumerate(points):
        assert [view.table.item(r, c).text() for c in range(len(COLUMNS))] == \
            [cell_text(row, key) for key, _ in COLUMNS]
    # one curve per policy across the budgets, in budget order, plus the recorded star
    for policy in POLICIES:
        rows = [r for r in expected.rows if r.policy == policy]
        x, y = view.curves[policy].getData()
        np.testing.assert_array_equal(x, [r.mass_per_token for r in rows])
        np.testing.assert_array_equal(y, [r.est_ms_per_token for r in rows])
    star_x, star_y = view.recorded_item.getData()
    assert (star_x[0], star_y[0]) == (recorded.mass_per_token, recorded.est_ms_per_token)
    legend = {label.text for _, label in view.legend.items}
    assert set(POLICIES) | {"recorded session"} <= legend


def test_exact_substitutes_nothing_and_substituting_is_faster_at_25_percent(
        qtbot: Any, trace_window: TraceWindow) -> None:
    view = _open_whatif(qtbot, trace_window)
    assert view.result is not None
    rows = {(r.policy, r.budget): r for r in view.result.rows}
    for budget in BUDGETS:
        assert rows["exact", budget].mass_per_token == 0.0
        assert rows["exact", budget].substituted_pct == 0.0
    exact = rows["exact", "25%"]
    for policy in ("quality-first", "speed-first", "substitute-all"):
        row = rows[policy, "25%"]
        assert row.mass_per_token > 0, policy
        assert row.est_ms_per_token < exact.est_ms_per_token, policy
        assert row.speedup_vs_exact is not None and row.speedup_vs_exact > 1, policy


def test_picking_a_cost_model_recomputes_with_it(qtbot: Any, trace_window: TraceWindow,
                                                 trace_path: Path) -> None:
    view = _open_whatif(qtbot, trace_window)
    trace = read_trace(trace_path)
    names = [view.cost.itemData(i) for i in range(view.cost.count())]
    assert names == ["pcie4", "pcie5", "calibrated"]
    # recorded from the engine, so the trace has timings to fit
    assert view.cost.model().item(names.index("calibrated")).isEnabled()
    routing = view._worker.routing  # laid out and ranked by the first sweep, then kept
    assert routing is not None and routing.ranking is not None
    for name in ("pcie5", "calibrated"):
        with qtbot.waitSignal(view.sweepFinished, timeout=15_000) as blocker:
            view.cost.setCurrentIndex(names.index(name))
        assert blocker.args[0].cost_name == name
        assert view.result is not None
        assert view.result.rows == sweep(trace, POLICIES, BUDGETS, cost_model(name, trace)).rows
        assert view._worker.routing is routing


def test_hovering_a_point_describes_it(qtbot: Any, trace_window: TraceWindow) -> None:
    view = _open_whatif(qtbot, trace_window)
    assert view.result is not None
    target = next(r for r in view.result.rows if (r.policy, r.budget) == ("speed-first", "25%"))
    vb = view.plot.getPlotItem().vb
    qtbot.waitUntil(lambda: vb.width() > 0)
    vb.autoRange(padding=0.1)
    at = vb.mapViewToScene(QPointF(target.mass_per_token, target.est_ms_per_token))
    view._hover(at)
    assert view.hovered is not None
    assert view.hovered.est_ms_per_token == target.est_ms_per_token
    assert "ms" in view.plot.toolTip() and view.hovered.policy in view.plot.toolTip()
    view._hover(QPointF(-1e6, -1e6))
    assert view.hovered is None and view.plot.toolTip() == ""


def test_controls_have_accessible_names(trace_window: TraceWindow) -> None:
    view = trace_window.whatif
    for widget in (view, view.cost, view.progress, view.stop_button, view.plot, view.table):
        assert widget.accessibleName(), widget


def test_the_event_loop_stays_responsive_while_the_sweep_runs(
        qtbot: Any, trace_window: TraceWindow, monkeypatch: pytest.MonkeyPatch) -> None:
    """The sweep (one batch for every point) is slowed by 600 ms: on the GUI thread that
    would stall the heartbeat for as long; off it, the heartbeat keeps ticking and progress
    arrives, from none to all of the batch's work."""
    sweep_threads: set[int] = set()

    def slow_sweep(*args: Any, **kwargs: Any) -> Any:
        sweep_threads.add(threading.get_ident())
        time.sleep(0.6)
        return sweep(*args, **kwargs)

    monkeypatch.setattr(whatif_model, "sweep", slow_sweep)
    view = trace_window.whatif
    beats: list[float] = []
    heartbeat = QTimer()
    heartbeat.setInterval(5)
    heartbeat.timeout.connect(lambda: beats.append(time.perf_counter()))
    progress: list[tuple[int, int]] = []
    view._worker.progress.connect(lambda _g, done, total: progress.append((done, total)))
    heartbeat.start()
    started = time.perf_counter()
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        trace_window.tabs.setCurrentWidget(view)
        assert view.running and view.progress.isVisible()
    elapsed = time.perf_counter() - started
    heartbeat.stop()

    # one sweep call for the grid and the recorded point, off the GUI thread
    assert threading.get_ident() not in sweep_threads and len(sweep_threads) == 1
    assert elapsed >= 0.6
    gaps = np.diff(beats)
    assert len(gaps) > 20
    assert gaps.max() < 0.6, "the event loop stalled for as long as the sweep"
    assert np.median(gaps) < 0.05
    total = (len(POLICIES) * len(BUDGETS) + 2) * view.trace.header.model.n_layers
    done = [d for d, _ in progress]
    assert progress[0] == (0, total) and progress[-1] == (total, total)
    assert {t for _, t in progress} == {total} and done == sorted(done)
    assert not view.running and not view.progress.isVisible()


def test_the_controls_stay_put_when_a_sweep_starts_and_ends(
        qtbot: Any, trace_window: TraceWindow, monkeypatch: pytest.MonkeyPatch) -> None:
    """The progress bar and Stop show only while a sweep runs, but keep their room when
    hidden: a sweep that ends while the pointer heads for Stop must not slide Policies
    (or a widened cost box) under it."""
    def slow_sweep(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)
        return sweep(*args, **kwargs)

    monkeypatch.setattr(whatif_model, "sweep", slow_sweep)
    view = trace_window.whatif
    trace_window.resize(1000, 700)

    def places() -> list[Any]:
        return [w.geometry() for w in (view.cost, view.policy_button)]

    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        trace_window.tabs.setCurrentWidget(view)
        assert view.running and view.stop_button.isVisible()
        qtbot.wait(50)
        running = places()
    qtbot.wait(50)
    assert not view.stop_button.isVisible() and places() == running


def test_closing_the_window_mid_sweep_stops_its_thread(
        qtbot: Any, trace_window: TraceWindow, monkeypatch: pytest.MonkeyPatch) -> None:
    def slow_sweep(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.1)
        return sweep(*args, **kwargs)

    monkeypatch.setattr(whatif_model, "sweep", slow_sweep)
    view = trace_window.whatif
    finished: list[Any] = []
    view.sweepFinished.connect(finished.append)
    trace_window.tabs.setCurrentWidget(view)
    assert view.running
    trace_window.close()  # abandons the sweep (at once: it is asleep); the thread ends
    assert not view.running
    qtbot.waitUntil(lambda: not view._thread.isRunning(), timeout=30_000)
    qtbot.wait(50)
    assert finished == []


def test_the_status_says_which_times_are_modelled_and_which_measured(
        qtbot: Any, trace_window: TraceWindow, trace_path: Path) -> None:
    """"Measured while recording: 3.41 ms/token" beside pcie4 estimates of 0.1 ms/token,
    with nothing saying they are different machines, read as a 30x contradiction."""
    view = _open_whatif(qtbot, trace_window)
    trace = read_trace(trace_path)
    assert view.result is not None and view.result.cost_name == "pcie4"
    measured = view.result.recorded_ms_per_token
    assert measured is not None  # recorded from the engine: it has wall times
    text = view.status.text()
    assert "modelled for the pcie4 cost model's hardware, not this machine" in text
    assert cost_model("pcie4").describe(trace.header.model) in text
    assert "RTX 3090-class" in text
    assert f"Measured on the machine that recorded the trace: {measured:.3f} ms/token." \
        in text
    assert "pcie4" in view.status.toolTip() and "not for this machine" in view.status.toolTip()

    names = [view.cost.itemData(i) for i in range(view.cost.count())]
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        view.cost.setCurrentIndex(names.index("calibrated"))
    text = view.status.text()
    assert "modelled for the machine that recorded the trace (fitted to its timings)" in text
    assert "not this machine" not in text and f"{measured:.3f} ms/token" in text
    assert "fitted to the copy" in view.status.toolTip()
