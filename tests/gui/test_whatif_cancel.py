"""The what-if on a long trace: one native batch whose progress moves the bar while it runs,
and which a newer request or a closed window stops within the configurations it was
replaying (the batch's cancel), leaving the numbers identical to a direct sweep.

The trace is synthetic (``moescope_testing.traces.synthetic_trace``: routing decided by the
real core) and long enough that its sweep takes a while; nothing asserts a duration.

A stop may reach the worker after its batch's last layer: the batch polls its progress 20
times a second, and once the trace is prepared its replays take about that long (624 of 624
in full suites, 2026-12-03 and 2026-12-04, as the loop got faster). These tests assert what
the user sees: the sweep ends cancelled, with no result or the newer one. That a cancel
stops the native batch within the configurations it is running is asserted where a test
can poll every half millisecond: tests/native/test_replay_control.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moescope.display import whatif_model
from moescope.display.whatif_model import BUDGETS, WhatIfResult
from moescope.gui.traces.trace_window import TraceWindow
from moescope.sim import cost_model, sweep
from moescope.sim.sweep import RECORDED
from moescope.trace import read_trace
from moescope_testing.traces import synthetic_trace


def assert_direct_sweep(view: Any, path: Path) -> None:
    """The view's last result is a direct sweep's of the trace at ``path`` (pcie4)."""
    trace = read_trace(path)
    assert view.result is not None
    assert view.result.rows == sweep(trace, view.policies(), BUDGETS,
                                     cost_model("pcie4", trace)).rows


@pytest.fixture
def sweep_prepares(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first sweep lays the trace out and plans it itself (a new view's worker does
    not prepare them ahead), so these tests see that preparation from the sweep."""
    from moescope.gui.traces.whatif_view import WhatIfView

    monkeypatch.setattr(WhatIfView, "prepare_ahead", False)


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_trace(tmp_path_factory.mktemp("whatif-long") / "long.arrows",
                           n_tokens=6000, n_layers=24, n_expert=128, top_k=8, slots=32)


class Spy:
    """Wraps ``whatif_model.compute``: how each call ended, and the last progress each
    reported before it ended."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.ends: list[str] = []
        self.last: list[tuple[int, int]] = []
        real = whatif_model.compute

        def compute(*args: Any, progress: Any = None, **kwargs: Any) -> WhatIfResult:
            seen = [(0, 0)]

            def watched(done: int, total: int) -> bool:
                seen[0] = (done, total)
                return bool(progress(done, total))

            try:
                result = real(*args, progress=watched, **kwargs)
            except whatif_model.Cancelled:
                self.ends.append("cancelled")
                raise
            finally:
                self.last.append(seen[0])
            self.ends.append("finished")
            return result

        # the view calls compute through its module's name
        from moescope.gui.traces import whatif_view
        monkeypatch.setattr(whatif_view, "compute", compute)


def running(open_trace_window: Callable[[Path], TraceWindow], trace: Path,
            monkeypatch: pytest.MonkeyPatch) -> tuple[Spy, TraceWindow, Any, list[Any]]:
    """A trace window whose what-if view is shown (its sweep starts), with a spy on
    ``compute`` and a list collecting the view's finished sweeps."""
    spy = Spy(monkeypatch)
    window = open_trace_window(trace)
    view = window.whatif
    finished: list[Any] = []
    view.sweepFinished.connect(finished.append)
    window.tabs.setCurrentWidget(view)
    return spy, window, view, finished


def first_progress(qtbot: Any, view: Any) -> None:
    """Waits for the running sweep to report work done (the batch is then mid-run)."""
    moved: list[int] = []
    view._worker.progress.connect(lambda _g, done, _t: moved.append(done))
    qtbot.waitUntil(lambda: any(moved), timeout=30_000)


def test_the_bar_moves_with_the_batch_and_the_result_is_the_direct_sweeps(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path) -> None:
    window = open_trace_window(long_trace)
    view = window.whatif
    values: list[tuple[int, int]] = []
    view.progress.valueChanged.connect(lambda v: values.append((v, view.progress.maximum())))
    with qtbot.waitSignal(view.sweepFinished, timeout=60_000):
        window.tabs.setCurrentWidget(view)
    total = (len(view.policies()) * len(BUDGETS) + 2) * 24
    inside = [v for v, m in values if m == total and 0 < v < total]
    assert inside, f"the bar never showed the batch mid-way: {values}"
    trace = read_trace(long_trace)
    cost = cost_model("pcie4", trace)
    assert view.result is not None
    assert view.result.rows == sweep(trace, view.policies(), BUDGETS, cost).rows
    assert view.result.recorded == whatif_model.with_recorded_budget(
        sweep(trace, [RECORDED, "exact"], [RECORDED], cost).rows[0], trace)


def test_a_newer_request_stops_the_running_batch(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    spy, _window, view, _ = running(open_trace_window, long_trace, monkeypatch)
    first_progress(qtbot, view)
    with qtbot.waitSignal(view.sweepFinished, timeout=60_000) as blocker:
        view.start("pcie5")
    assert blocker.args[0].cost_name == "pcie5"
    assert spy.ends == ["cancelled", "finished"]
    stopped_at, total = spy.last[0]
    assert 0 < stopped_at <= total  # mid-run or not: see the module's note


def test_closing_the_window_stops_the_batch_and_joins_its_thread(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    spy, window, view, finished = running(open_trace_window, long_trace, monkeypatch)
    first_progress(qtbot, view)
    window.close()  # the worker's next poll cancels the batch, then its thread ends
    assert not view.running
    qtbot.waitUntil(lambda: not view._thread.isRunning(), timeout=30_000)
    assert spy.ends == ["cancelled"]
    stopped_at, total = spy.last[0]
    assert 0 < stopped_at <= total  # mid-run or not: see the module's note
    qtbot.wait(50)
    assert finished == []


def test_stop_stops_the_batch_and_replay_sweeps_again(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from PySide6.QtCore import Qt

    spy, window, view, finished = running(open_trace_window, long_trace, monkeypatch)
    assert view.stop_button.isVisible() and view.stop_button.text() == "&Stop"
    first_progress(qtbot, view)
    qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    assert not view.running and not view.progress.isVisible()
    assert view.stop_button.text() == "&Replay" and "Stopped" in view.status.text()
    qtbot.waitUntil(lambda: spy.ends == ["cancelled"], timeout=30_000)
    stopped_at, total = spy.last[0]
    assert 0 < stopped_at <= total  # mid-run or not: see the module's note
    qtbot.wait(50)
    assert finished == [] and view.result is None
    # showing the view again does not undo the stop
    window.tabs.setCurrentWidget(window.panel)
    window.tabs.setCurrentWidget(view)
    assert not view.running and view.stop_button.text() == "&Replay"
    # the same button replays; the result is the direct sweep's
    with qtbot.waitSignal(view.sweepFinished, timeout=60_000):
        qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    assert spy.ends == ["cancelled", "finished"] and not view.stop_button.isVisible()
    assert_direct_sweep(view, long_trace)


def test_the_first_sweep_says_what_it_prepares_on_a_busy_bar_and_a_later_one_does_not(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        sweep_prepares: None) -> None:
    """Laying the trace out and planning the replay come before the batch's first layer:
    the status line says which, over a busy bar (not a bar stuck at 0%), and the replay's
    own line comes back with its first layer. A later sweep reuses both and says neither."""
    from PySide6.QtCore import QObject, Slot

    from moescope.gui.traces.whatif_view import LAYOUT_TEXT, PLAN_TEXT, status_text

    window = open_trace_window(long_trace)
    view = window.whatif
    seen: list[tuple[str, int]] = []
    replaying: list[str] = []

    class Recorder(QObject):
        """Queued after the view's own slots (connected later), on the GUI thread."""

        @Slot(int, str)
        def prepared(self, _generation: int, _text: str) -> None:
            seen.append((view.status.text(), view.progress.maximum()))

        @Slot(int, int, int)
        def progressed(self, _generation: int, done: int, _total: int) -> None:
            if done > 0 and not replaying:
                replaying.append(view.status.text())

    recorder = Recorder()
    view._worker.preparing.connect(recorder.prepared)
    view._worker.progress.connect(recorder.progressed)
    with qtbot.waitSignal(view.sweepFinished, timeout=60_000):
        window.tabs.setCurrentWidget(view)
    assert seen == [(LAYOUT_TEXT, 0), (PLAN_TEXT, 0)]
    assert replaying and replaying[0].startswith("Replaying the trace under")
    assert view.result is not None and view.status.text() == status_text(view.result)

    seen.clear()
    with qtbot.waitSignal(view.sweepFinished, timeout=60_000):
        view.start("pcie5")
    assert seen == []


class Held:
    """Holds the worker inside the first sweep's layout (``Routing.from_trace``) until
    released, so that a Stop, a newer request or a close lands during the preparation."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import threading

        from moescope.sim import Routing

        self.entered = threading.Event()
        self.release = threading.Event()
        real = Routing.from_trace

        def from_trace(cls: type, trace: Any) -> Any:
            self.entered.set()
            self.release.wait(30)
            return real(trace)

        monkeypatch.setattr(Routing, "from_trace", classmethod(from_trace))


def test_stop_while_the_first_sweep_prepares_stays_stopped_and_replay_sweeps(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch, sweep_prepares: None) -> None:
    """Stop during the layout: the bar goes and the button replays at once; the stale
    sweep's later preparation and progress change nothing; Replay then sweeps."""
    from PySide6.QtCore import Qt

    from moescope.gui.traces.whatif_view import LAYOUT_TEXT, status_text

    held = Held(monkeypatch)
    spy, _window, view, finished = running(open_trace_window, long_trace, monkeypatch)
    qtbot.waitUntil(lambda: held.entered.is_set() and view.status.text() == LAYOUT_TEXT,
                    timeout=30_000)
    assert view.progress.isVisible() and view.progress.maximum() == 0
    qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    stopped = view.status.text()
    assert not view.running and not view.progress.isVisible() and "Stopped" in stopped
    held.release.set()
    qtbot.waitUntil(lambda: spy.ends == ["cancelled"], timeout=60_000)
    qtbot.wait(50)
    assert finished == [] and view.status.text() == stopped
    assert not view.progress.isVisible() and view.stop_button.text() == "&Replay"
    with qtbot.waitSignal(view.sweepFinished, timeout=60_000):
        qtbot.mouseClick(view.stop_button, Qt.MouseButton.LeftButton)
    assert spy.ends == ["cancelled", "finished"]
    assert view.result is not None and view.status.text() == status_text(view.result)
    assert not view.progress.isVisible() and not view.stop_button.isVisible()


def test_a_newer_request_while_the_first_sweep_prepares_keeps_the_bar_busy(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch, sweep_prepares: None) -> None:
    """Picking another cost model while the first sweep lays the trace out: the worker still
    has the layout, ranking and plan to make (the stale sweep makes them, then stops at its
    first report) before the new sweep's first layer, so its bar is busy, not at 0%, and the
    status names that preparation (which the new sweep reuses)."""
    from PySide6.QtCore import QObject, Slot

    from moescope.gui.traces.whatif_view import LAYOUT_TEXT, PLAN_TEXT

    held = Held(monkeypatch)
    try:
        _spy, _window, view, _ = running(open_trace_window, long_trace, monkeypatch)
        qtbot.waitUntil(lambda: held.entered.is_set() and view.status.text() == LAYOUT_TEXT,
                        timeout=30_000)
        seen: list[tuple[str, int]] = []

        class Recorder(QObject):
            """Queued after the view's own slots (connected later), on the GUI thread."""

            @Slot(int, str)
            def prepared(self, _generation: int, _text: str) -> None:
                seen.append((view.status.text(), view.progress.maximum()))

        recorder = Recorder()
        view._worker.preparing.connect(recorder.prepared)
        view.start("pcie5")
        assert view.progress.isVisible() and view.progress.maximum() == 0, \
            (view.progress.minimum(), view.progress.maximum(), view.status.text())
    finally:
        held.release.set()
    with qtbot.waitSignal(view.sweepFinished, timeout=60_000) as blocker:
        pass
    assert blocker.args[0].cost_name == "pcie5"
    # the abandoned sweep's planning (it may stop before, then this sweep's own), named
    assert seen and all(s == (PLAN_TEXT, 0) for s in seen), seen


def test_closing_the_window_while_the_first_sweep_prepares_joins_its_thread(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch, sweep_prepares: None) -> None:
    held = Held(monkeypatch)
    spy, window, view, finished = running(open_trace_window, long_trace, monkeypatch)
    qtbot.waitUntil(held.entered.is_set, timeout=30_000)
    held.release.set()
    window.close()
    assert not view.running
    qtbot.waitUntil(lambda: not view._thread.isRunning(), timeout=30_000)
    assert spy.ends in ([], ["cancelled"])
    qtbot.wait(50)
    assert finished == []


def test_the_window_prepares_the_first_sweep_while_it_shows_its_plots(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path) -> None:
    """Opening the window starts laying the trace out and planning its replay on the
    what-if's worker; shown later, the What-if tab's first sweep replays at once (it says
    no preparation) and its numbers are a direct sweep's."""
    from PySide6.QtCore import QObject, Slot

    window = open_trace_window(long_trace)
    view = window.whatif
    assert window.tabs.currentWidget() is not view and view.result is None
    qtbot.waitUntil(lambda: view._worker.routing is not None
                    and view._worker.routing.plan is not None, timeout=60_000)
    assert not view.running  # prepared, not swept
    seen: list[str] = []

    class Recorder(QObject):
        @Slot(int, str)
        def prepared(self, _generation: int, text: str) -> None:
            seen.append(text)

    recorder = Recorder()
    view._worker.preparing.connect(recorder.prepared)
    with qtbot.waitSignal(view.sweepFinished, timeout=60_000):
        window.tabs.setCurrentWidget(view)
    assert seen == []
    assert_direct_sweep(view, long_trace)


def test_closing_the_window_while_it_prepares_joins_its_thread(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    held = Held(monkeypatch)
    window = open_trace_window(long_trace)
    view = window.whatif
    qtbot.waitUntil(held.entered.is_set, timeout=30_000)  # the preparation's layout
    held.release.set()
    window.close()
    assert not view.running and view.result is None
    qtbot.waitUntil(lambda: not view._thread.isRunning(), timeout=30_000)


def test_closing_the_window_while_it_prepares_does_not_wait_for_the_step_in_flight(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The GUI thread waited (about 0.8 s at 10,000 tokens) for the preparation's step in
    flight before a closed window went. Now the window hides at once, and ``closed`` (its
    owner then frees it) comes once the worker's thread has ended."""
    held = Held(monkeypatch)
    window = open_trace_window(long_trace)
    view = window.whatif
    closed: list[Any] = []
    window.closed.connect(closed.append)
    qtbot.waitUntil(held.entered.is_set, timeout=30_000)  # the worker is inside the layout
    window.close()  # returns while the worker is still held there
    assert not window.isVisible() and view._thread.isRunning() and closed == []
    qtbot.wait(50)
    assert closed == []  # not freed while its thread runs
    held.release.set()
    qtbot.waitUntil(lambda: closed == [window], timeout=30_000)
    assert not view._thread.isRunning()
    window.close()  # again: nothing more
    qtbot.wait(50)
    assert closed == [window]


def test_quitting_joins_a_closed_trace_windows_ending_thread(
        qtbot: Any, make_window: Callable[[], Any], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The main window closing (the app quitting) joins the what-if threads of trace
    windows that are closed but still ending: no QThread outlives its window."""
    import threading

    held = Held(monkeypatch)
    main = make_window()
    with qtbot.waitSignal(main.traceOpened, timeout=60_000) as opened:
        main.open_trace(long_trace)
    trace_window = opened.args[0]
    qtbot.waitUntil(held.entered.is_set, timeout=30_000)
    trace_window.close()
    assert trace_window.whatif._thread.isRunning() and trace_window in main.trace_windows
    threading.Timer(0.2, held.release.set).start()
    main.close()  # joins it
    assert not trace_window.whatif._thread.isRunning()


def test_closing_the_window_while_it_lays_the_trace_out_ranks_and_plans_nothing(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Closing a trace window just after opening it waited, on the GUI thread, for the
    whole preparation ahead (layout, ranking, plan): 2.2-2.6 s for a 10,000-token trace of
    Qwen3-Next's shape on two busy cores, 0.02 s without it. Closed during the layout, the
    worker now stops there: no ranking, no plan."""
    import threading

    from moescope.sim import Routing

    release = threading.Event()
    views: list[Any] = []
    real = Routing.from_trace

    def from_trace(cls: type, trace: Any) -> Any:
        release.wait(30)
        routing = real(trace)
        views[0]._worker.latest = -1  # the window closed meanwhile, as shutdown() says
        return routing

    monkeypatch.setattr(Routing, "from_trace", classmethod(from_trace))
    window = open_trace_window(long_trace)
    view = window.whatif
    views.append(view)
    release.set()
    window.close()
    qtbot.waitUntil(lambda: not view._thread.isRunning(), timeout=30_000)
    assert view.result is None
    routing = view._worker.routing
    assert routing is not None and routing.ranking is None and routing.plan is None


def test_a_sweep_asked_for_while_the_window_prepares_says_so_then_replays(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """What-if shown while the preparation ahead still runs: the status names that
    preparation over a busy bar (not "Replaying" while nothing replays yet), then the
    replay's line, then the result."""
    from moescope.gui.traces.whatif_view import AHEAD_TEXT, status_text

    held = Held(monkeypatch)
    try:
        window = open_trace_window(long_trace)
        view = window.whatif
        qtbot.waitUntil(held.entered.is_set, timeout=30_000)
        window.tabs.setCurrentWidget(view)
        assert view.running and view.status.text() == AHEAD_TEXT
        assert view.progress.isVisible() and view.progress.maximum() == 0
    finally:
        held.release.set()
    with qtbot.waitSignal(view.sweepFinished, timeout=60_000):
        pass
    assert view.result is not None and view.status.text() == status_text(view.result)
    assert_direct_sweep(view, long_trace)


def test_a_worker_that_ends_before_the_close_listens_still_frees_the_window(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], long_trace: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The worker's thread ending between the close's look and its listening for the end
    left ``closed`` unsaid: the window was never freed (a fresh clone's CI, loaded)."""
    window = open_trace_window(long_trace)
    view = window.whatif
    real = view.stop_thread

    def late() -> bool:  # the thread ends just after stop_thread looked at it
        real()
        view._thread.wait(30_000)
        return False

    monkeypatch.setattr(view, "stop_thread", late)
    closed: list[Any] = []
    window.closed.connect(closed.append)
    window.close()
    qtbot.waitUntil(lambda: closed == [window], timeout=5_000)
    qtbot.wait(50)
    assert closed == [window]  # once
