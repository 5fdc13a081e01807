"""A new user's session with the desktop window (session 15, helper "win"): what they met
on the demo model at 1366x768 and 1024x700, each as it was found. Real window, real
engine, tiny model, Qt offscreen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import click_link, load, send
from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QApplication, QDialogButtonBox, QInputDialog, QLineEdit

from moescope.gui import theme
from moescope.gui.chat.message_actions import action_href


@pytest.fixture
def window(make_window: Any, qtbot: Any, demo: Path) -> Iterator[Any]:
    """The window with the demo model; the default font and theme again afterwards (both
    are the application's, shared by later tests)."""
    w = make_window()
    load(qtbot, w, demo, budget="25%", policy="quality-first", n_ctx=512)
    yield w
    app = QApplication.instance()
    if isinstance(app, QApplication):
        theme.apply_theme(app, "system", 0)


def test_the_window_starts_with_nothing_on_stderr(make_window: Any, qtbot: Any,
                                                  qtlog: Any, demo: Path) -> None:
    """Every start printed "libpyside: addMetaMethod: Cannot add dynamic method
    setToolTip(QString) … to QStatusBar" (the status bar's message connected straight to
    setToolTip, which is no slot); the tooltip still shows a clipped message whole."""
    w = make_window()
    load(qtbot, w, demo, budget="25%", policy="quality-first", n_ctx=512)
    w.statusBar().showMessage("Trace exported to /a/long/path.parquet")
    assert w.statusBar().toolTip() == "Trace exported to /a/long/path.parquet"
    warnings = [r.message for r in qtlog.records if "libpyside" in r.message
                or "Cannot add dynamic method" in r.message]
    assert warnings == []


def test_preferences_keep_their_automatic_texts_whole_at_a_larger_font(
        window: Any, qtbot: Any) -> None:
    """Font size 11 pt, Apply: the dialog stayed at its old size and its spin boxes showed
    "utomatic (half the cores: 1)" and "tomatic (all on a GPU build)" (their minimum
    width was measured once, in the old font)."""
    dialog = window.show_preferences()
    qtbot.waitExposed(dialog)
    dialog.font_pt.setValue(14)
    dialog.apply_button.click()
    QApplication.processEvents()
    assert QApplication.font().pointSizeF() == 14
    for spin in (dialog.threads, dialog.gpu_layers):
        edit = spin.lineEdit()
        qtbot.waitUntil(lambda e=edit: e.fontMetrics().horizontalAdvance(e.text())
                        < e.width(), timeout=5000)
    dialog.buttons.button(QDialogButtonBox.StandardButton.Cancel).click()


def test_a_trace_window_opens_with_nothing_on_stderr(trace_window: Any, qtlog: Any) -> None:
    """The trace window's status bar had the same connection, and the same warning."""
    trace_window.statusBar().showMessage("Exported to /a/long/path.json")
    assert trace_window.statusBar().toolTip() == "Exported to /a/long/path.json"
    assert [r.message for r in qtlog.records if "Cannot add dynamic method" in r.message] \
        == []


def test_export_after_a_comparison_names_the_chats_trace(window: Any, qtbot: Any,
                                                          dialogs: Any) -> None:
    """Chat, Cache ▸ Compare policies, then File ▸ Export trace: "This session has
    recorded no token yet", with a 158-token answer on screen, as if it were lost. The
    comparison had ended the trace (it is kept); the message now names where."""
    send(qtbot, window, "To be", max_tokens=6)
    chat_trace = window.trace_path
    assert chat_trace is not None
    dialog = window.open_compare_dialog()
    for i in range(dialog.policies.count()):
        item = dialog.policies.item(i)
        item.setCheckState(Qt.CheckState.Checked if item.data(Qt.ItemDataRole.UserRole)
                           == "speed-first" else Qt.CheckState.Unchecked)
    dialog.max_tokens.setValue(4)
    with qtbot.waitSignal(window.client.worker.compareFinished, timeout=60_000):
        qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.result is not None, timeout=10_000)
    dialog.reject()
    qtbot.waitUntil(lambda: window.trace_path != chat_trace, timeout=10_000)
    window.export_trace_action.trigger()
    shown = dialogs.texts("critical")
    assert len(shown) == 1 and str(chat_trace) in shown[0]
    assert "Comparing policies ended" in shown[0]


def test_rename_shows_the_whole_title_and_keeps_the_edit(window: Any, qtbot: Any) -> None:
    """Chat ▸ Rename chat… (F2) on a chat named after its first message: the box was
    ~190 px wide and showed "ode that sorts a list and pri…"; now the whole title is in
    view, and what the user types there becomes the title."""
    text = "Write some Python code that sorts a list and prints it in reverse"
    send(qtbot, window, text, max_tokens=3)
    title = window.store.chat(window.chat.chat_id).title
    seen: list[tuple[int, int]] = []

    def in_the_dialog() -> None:
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, QInputDialog)
        edit = dialog.findChild(QLineEdit)
        seen.append((edit.width(), edit.fontMetrics().horizontalAdvance(title)))
        qtbot.keyClick(edit, Qt.Key.Key_End)
        qtbot.keyClicks(edit, " (mine)")
        qtbot.keyClick(edit, Qt.Key.Key_Return)

    QTimer.singleShot(0, in_the_dialog)
    qtbot.keyClick(window, Qt.Key.Key_F2)
    assert seen and seen[0][0] > seen[0][1], seen
    assert window.store.chat(window.chat.chat_id).title == title + " (mine)"


def test_copy_says_it_copied(window: Any, qtbot: Any) -> None:
    """The Copy link under a message and Ctrl+Shift+C put the text on the clipboard and
    showed nothing: a new user clicked Copy again and again. The status bar now says so."""
    send(qtbot, window, "To be", max_tokens=4)
    clipboard = QGuiApplication.clipboard()
    clipboard.clear()
    click_link(qtbot, window.chat_view, action_href("copy", 1))
    assert clipboard.text() == window.store.messages(window.chat.chat_id)[1].content
    assert window.statusBar().currentMessage() == \
        "Answer copied to the clipboard (as Markdown)."
    window.statusBar().clearMessage()
    click_link(qtbot, window.chat_view, action_href("copy", 0))
    assert window.statusBar().currentMessage() == "Message copied to the clipboard."
    window.statusBar().clearMessage()
    window.chat_view.copy_answer_action.trigger()  # Ctrl+Shift+C
    assert window.statusBar().currentMessage() == \
        "Answer copied to the clipboard (as Markdown)."


def test_open_model_shows_every_fit_line_whole(window: Any, qtbot: Any, demo: Path) -> None:
    """File ▸ Open model… on the demo model: the fit's "Experts in RAM" line ("…a miss in
    RAM waits for a copy (about 80 µs per 2 MB over PCIe, less c") and "Expert slots" were
    cut at the dialog's right edge (its width is 520 px; those lines are wider)."""
    from moescope.gui.dialogs.open_model import OpenModelDialog

    cut: list[str] = []
    seen: list[int] = []

    def in_the_dialog() -> None:
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, OpenModelDialog)
        form = dialog.estimate_form
        for i in range(form.rowCount()):
            value = form.itemAt(i, form.ItemRole.FieldRole).widget()
            seen.append(i)
            needed = value.heightForWidth(value.width()) if value.wordWrap() \
                else value.fontMetrics().height()
            if (value.sizeHint().width() > value.width() and not value.wordWrap()) \
                    or value.height() < needed:
                cut.append(value.text())
        dialog.reject()

    QTimer.singleShot(0, in_the_dialog)
    window.prepare_open(demo)
    assert seen and cut == []


def test_serve_api_refusal_speaks_of_the_panels_fields(window: Any) -> None:
    """File ▸ Serve API… with another machine's address and no key: the refusal named the
    command line's "--host", "--api-key" and "--insecure-no-api-key", none of which the
    panel has; it now names its API key field."""
    window.serve.show_panel()
    panel = window.serve.panel
    panel.host.setText("0.0.0.0")
    panel.key.clear()
    panel.button.click()
    assert not window.serve.serving
    error = panel.error.text()
    assert "API key" in error and "--" not in error, error


def test_escape_cancels_the_edit_of_a_message(window: Any, qtbot: Any) -> None:
    """Edit last, then Esc: the box stayed in Resend mode with the edited text, so the next
    Send would still have replaced the message and its answer. Esc now cancels the edit
    and gives the box back what it held before (a draft the user had begun)."""
    send(qtbot, window, "To be", max_tokens=4)
    view = window.chat_view
    view.input.setPlainText("a draft")
    assert window.chat.edit_last()
    assert view.editing_position is not None and view.input.toPlainText() == "To be"
    assert view.send_button.text() == "Re&send"
    window.activateWindow()
    qtbot.keyClick(view.input, Qt.Key.Key_Escape)
    assert view.editing_position is None and view.send_button.text() == "&Send"
    assert view.input.toPlainText() == "a draft"
    n = len(window.chat.store.messages(window.chat.chat_id))
    qtbot.keyClick(view.input, Qt.Key.Key_Escape)  # nothing to cancel: nothing changes
    assert view.input.toPlainText() == "a draft"
    assert len(window.chat.store.messages(window.chat.chat_id)) == n


def test_a_trace_windows_title_names_the_session_not_its_file(trace_window: Any) -> None:
    """The title was the file's raw name ("Trace: 20261202-…parquet.journal.arrows"); it
    is now the session as the sessions list names it: model and when it was recorded."""
    title = trace_window.windowTitle()
    model = trace_window.reopened.model.name
    assert model and title.startswith(f"Trace: {model} · 20") and title.endswith(" — MoEScope")
    assert trace_window.path.name not in title
