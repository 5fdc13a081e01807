"""A window kept open for hours must not keep what the user has closed.

Found by a soak test (thousands of tokens at Qwen3-Next's 48 x 512 geometry, traces opened
and closed now and then): every trace window, once closed, stayed alive in the main
window's list with its whole trace (masks and router inputs of every token: ~130 MB for
540 tokens there) and ~600 widgets.
"""

from __future__ import annotations

import gc
import weakref
from typing import Any

import pytest
from gui_helpers import send
from PySide6.QtWidgets import QApplication


def test_a_closed_trace_window_is_freed_with_its_trace(window: Any, qtbot: Any,
                                                       dialogs: Any,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from moescope.gui.traces import session_traces
    from moescope.gui.traces.trace_window import TraceWindow
    from moescope.util import memory

    released: list[bool] = []
    monkeypatch.setattr(session_traces, "release_freed_memory",
                        lambda: released.append(memory.release_freed_memory()))
    send(qtbot, window, "Hello", max_tokens=6)
    assert window.trace_path is not None
    qtbot.wait(50)
    widgets_before = len(QApplication.allWidgets())
    for _ in range(2):  # the second one too: nothing accumulates
        with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
            window.open_trace(window.trace_path)
        trace_window = opened.args[0]
        assert window.trace_windows == [trace_window]
        trace = weakref.ref(trace_window.reopened)
        trace_window.close()  # hidden at once; freed once its what-if's worker has ended
        assert not trace_window.isVisible()
        qtbot.waitUntil(lambda: window.trace_windows == [], timeout=30_000)
        del trace_window, opened
        qtbot.waitUntil(lambda: not window._trace_openers)
        qtbot.waitUntil(lambda t=trace: gc.collect() >= 0 and t() is None, timeout=3000)
        # no trace window's widget is left (other tests' windows may be freed meanwhile,
        # so the count can only be compared one way)
        qtbot.waitUntil(lambda: not any(isinstance(w, TraceWindow)
                                        for w in QApplication.topLevelWidgets()))
        assert len(QApplication.allWidgets()) <= widgets_before
    # and its memory handed back to the system, once per window (glibc: malloc_trim)
    qtbot.waitUntil(lambda: len(released) == 2, timeout=3000)
    assert released == [True, True]
    assert not dialogs.shown


def test_closed_notices_and_about_boxes_are_freed(make_window: Any, qtbot: Any) -> None:
    """A notice (a save failure, a trace that stopped recording) and the About box are
    made anew each time: closed, they must go, not pile up as hidden children."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QMessageBox

    from moescope.gui.dialogs.about import AboutDialog

    w = make_window()
    qtbot.wait(20)
    widgets_before = len(QApplication.allWidgets())
    for i in range(3):
        w.notify("Something happened", f"number {i}")
        w._notice_boxes[-1].done(0)
    QTimer.singleShot(0, lambda: w.findChild(AboutDialog).reject())
    w.show_about()  # modal: returns once the timer closed it
    qtbot.wait(20)  # deferred deletes
    assert not w.findChildren(QMessageBox) and not w.findChildren(AboutDialog)
    assert len(QApplication.allWidgets()) <= widgets_before  # others may be freed meanwhile
    assert len(w.notices) == 3 and not w._notice_boxes
