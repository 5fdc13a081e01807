"""Opening a trace never freezes the window: a long session's trace takes seconds to read,
so it is read on a thread, with a progress dialog that can cancel it, while the chat goes
on; closing the window mid-read stops the reader."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import send

from moescope.gui.traces.trace_opener import TraceOpener


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, threading.Event]]:
    """Hold every reader at its first progress report until ``release`` is set (or it is
    cancelled), so a test can act while a trace is being read."""
    events = {"started": threading.Event(), "release": threading.Event()}
    report = TraceOpener._report

    def gated(self: TraceOpener, done: int, total: int) -> bool:
        events["started"].set()
        while not self.cancelled and not events["release"].is_set():
            time.sleep(0.005)
        return report(self, done, total)

    monkeypatch.setattr(TraceOpener, "_report", gated)
    yield events
    events["release"].set()


def test_the_chat_goes_on_while_a_trace_is_read(window: Any, qtbot: Any, dialogs: Any,
                                                trace_path: Path,
                                                gate: dict[str, threading.Event]) -> None:
    opener = window.open_trace(trace_path)
    steps: list[int] = []
    opener.progressed.connect(lambda done, _total: steps.append(done))  # any thread: fine
    qtbot.waitUntil(gate["started"].is_set)
    assert opener.isRunning()
    answer = send(qtbot, window, "Hello while the trace loads.", max_tokens=5)
    assert answer.n_tokens == 5 and not window.trace_windows
    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        gate["release"].set()
    assert opened.args[0].path == trace_path and window.trace_windows == [opened.args[0]]
    assert steps[-1] == 1000 and steps == sorted(steps)  # read to the end, in order
    qtbot.waitUntil(lambda: not window._trace_openers)
    assert not dialogs.shown


def test_cancel_stops_the_read_and_opens_nothing(window: Any, qtbot: Any, dialogs: Any,
                                                 trace_path: Path,
                                                 gate: dict[str, threading.Event]) -> None:
    opened: list[Any] = []
    window.traceOpened.connect(opened.append)
    opener = window.open_trace(trace_path)
    qtbot.waitUntil(gate["started"].is_set)
    from PySide6.QtWidgets import QPushButton

    window._trace_openers[opener].findChild(QPushButton).click()  # the dialog's Cancel
    qtbot.waitUntil(lambda: not window._trace_openers, timeout=10_000)
    qtbot.wait(50)
    assert not opened and not window.trace_windows and not dialogs.shown


def test_closing_the_window_mid_read_stops_the_reader(make_window: Any, qtbot: Any,
                                                      trace_path: Path,
                                                      gate: dict[str, threading.Event]) -> None:
    window = make_window()
    opener = window.open_trace(trace_path)
    qtbot.waitUntil(gate["started"].is_set)
    window.close()
    assert opener.isFinished() and not window.trace_windows


def test_the_window_numbers_are_worked_out_on_the_reading_thread(
        window: Any, qtbot: Any, dialogs: Any, trace_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The cache panel's accounting and the cost models' calibration (0.4 s of a
    10,000-token trace) run where the trace is read; the window only draws them."""
    from moescope.display import trace_io
    from moescope.gui.traces import trace_opener

    threads: list[threading.Thread] = []
    real = trace_io.account

    def account(reopened: trace_io.ReopenedTrace) -> trace_io.ReopenedTrace:
        threads.append(threading.current_thread())
        return real(reopened)

    monkeypatch.setattr(trace_opener, "account", account)
    from moescope.gui.traces import trace_window as trace_window_module

    # the window would account a trace the opener had not
    monkeypatch.setattr(trace_window_module, "account",
                        lambda _r: pytest.fail("accounted on the GUI thread"))
    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        window.open_trace(trace_path)
    trace_window = opened.args[0]
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    cache = trace_window.reopened.cache
    assert trace_window.panel.model is cache
    assert cache.time.total == len(trace_window.tokens) > 0
    assert cache.uses.sum() > 0 and trace_window.whatif.cost.count() > 0
    qtbot.waitUntil(lambda: not window._trace_openers)
    assert not dialogs.shown
