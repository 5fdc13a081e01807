"""The what-if (a cost model over a trace) and Compare policies (real answers timed on this
machine) can rank PSR differently: on the demo model, CPU only, pcie4 put PSR above Exact
(1.03x) and calibrated first of all (1.03x), while Compare measured it at 0.70x Exact; the
decode waited 0.44 ms a token for its prefetches. Both now say why where they are shown:
the what-if names what its cost model assumes about prefetches, Compare that it measures
this machine, where prefetches take CPU time and are waited for."""

from __future__ import annotations

from typing import Any

from gui_helpers import send
from PySide6.QtCore import Qt

from moescope.display.whatif_model import status_text, status_tooltip
from moescope.gui.dialogs.compare import COLUMNS, MEASURED_NOTE, PREFETCH_NOTE
from moescope.gui.traces.trace_window import TraceWindow
from moescope.sim import cost_model
from moescope.trace import read_trace


def test_the_whatif_says_what_its_cost_model_assumes_about_prefetches(
        qtbot: Any, trace_window: TraceWindow, trace_path: Any) -> None:
    view = trace_window.whatif
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        trace_window.tabs.setCurrentWidget(view)
    assert "psr" in view.policies()
    compute = cost_model("pcie4").compute_for(read_trace(trace_path).header.model) * 1e3
    text = view.status.text()
    assert (f"PSR's prefetches are priced as background copies on a copy stream of their "
            f"own: the pcie4 model hides them under its {compute:.3f} ms of compute per "
            "token, charges only what is longer, and models no wait for them.") in text
    assert "Compare policies (main window) times real answers on this machine" in text
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        view.set_policies(["quality-first"])  # no prefetching row: nothing to explain
    assert "prefetches" not in view.status.text()


def _compare(window: Any, qtbot: Any, *checked: str) -> Any:
    dialog = window.open_compare_dialog()
    for i in range(dialog.policies.count()):
        item = dialog.policies.item(i)
        key = item.data(Qt.ItemDataRole.UserRole)
        item.setCheckState(Qt.CheckState.Checked if key in checked else Qt.CheckState.Unchecked)
    dialog.max_tokens.setValue(8)
    with qtbot.waitSignal(window.client.worker.compareFinished, timeout=60_000):
        qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.result is not None, timeout=10_000)
    return dialog


def test_compare_says_it_measures_this_machine_where_psr_answered(
        window: Any, qtbot: Any) -> None:
    send(qtbot, window, "Tell me about the sea.", max_tokens=4)
    dialog = _compare(window, qtbot, "psr")
    assert [a.policy for a in dialog.result.answers] == ["exact", "psr"]
    # the short note under the run, the whole of it on the tok/s header (the notes above
    # the table were cut at 12 pt on 1366x768)
    assert dialog.status.text().endswith(PREFETCH_NOTE)
    header = dialog.table.horizontalHeaderItem(COLUMNS.index("tok/s"))
    assert header.toolTip().endswith(MEASURED_NOTE)
    assert "PSR's prefetches, hidden under compute there, take this machine's CPU" in \
        header.toolTip()
    dialog.reject()
    dialog = _compare(window, qtbot, "speed-first")  # nothing prefetched: no note
    assert PREFETCH_NOTE not in dialog.status.text()
    dialog.reject()


def test_the_whole_note_can_be_read_in_a_small_trace_window(
        qtbot: Any, trace_window: TraceWindow) -> None:
    """At 500x400 the note under the cost model picker (eight lines there) was given five:
    a word-wrapped label cut at its top and bottom, its tooltip explaining the numbers
    without repeating them, so the rest could not be read at all. It scrolls now, and is
    whole, with no scroll bar, where the window has room."""
    view = trace_window.whatif
    trace_window.resize(500, 400)
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        trace_window.tabs.setCurrentWidget(view)
    note = view.status
    assert note.text() == status_text(view.result)
    qtbot.waitUntil(lambda: note.height() >= note.heightForWidth(note.width())
                    and note.visibleRegion().boundingRect().height() < note.height(),
                    timeout=5_000)  # the label has room for every line, some out of view
    assert note.heightForWidth(note.width()) > 5 * note.fontMetrics().lineSpacing()
    area = view.status_area
    bar = area.verticalScrollBar()
    qtbot.waitUntil(bar.isVisible, timeout=5_000)  # and a scroll bar reaches them
    assert bar.maximum() == note.height() - area.viewport().height()
    assert area.viewport().height() >= 3 * note.fontMetrics().lineSpacing()
    assert view.plot.height() >= view.plot.minimumSizeHint().height()
    bar.setValue(bar.maximum())  # the last line in view
    assert note.visibleRegion().boundingRect().bottom() == note.height() - 1
    trace_window.resize(980, 760)
    qtbot.waitUntil(lambda: not bar.isVisible(), timeout=5_000)
    assert area.height() >= note.heightForWidth(note.width())
    assert note.toolTip() == status_tooltip(view.result)
