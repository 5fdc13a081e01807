"""The window without a mouse, and through a screen reader: Alt+letters that do what they
underline, Esc and Delete where a keyboard user expects them, the focus after each action,
and a name (and value) for every control the focus reaches."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from gui_helpers import send
from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractSpinBox,
    QApplication,
    QLabel,
    QMenuBar,
    QMessageBox,
    QTabBar,
    QTabWidget,
    QWidget,
)

from moescope.gui.dialogs.shortcuts import shortcut_rows

ALT = Qt.KeyboardModifier.AltModifier


def _mnemonics(top: QWidget) -> dict[str, list[str]]:
    """Every Alt+letter active in ``top`` as it is shown now: menu titles, tabs, buttons
    and labels with a buddy (what Qt registers as a shortcut), by letter."""
    found: dict[str, list[str]] = {}

    def add(text: str, what: str) -> None:
        m = re.search(r"&([^&])", text.replace("&&", ""))
        if m:
            found.setdefault(m.group(1).upper(), []).append(what)

    for w in top.findChildren(QWidget):
        if w.window() is not top or not w.isVisibleTo(top):
            continue
        if isinstance(w, QAbstractButton):
            add(w.text(), f"button {w.text()!r}")
        elif isinstance(w, QLabel) and w.buddy() is not None:
            add(w.text(), f"label {w.text()!r}")
        elif isinstance(w, QTabBar):
            for i in range(w.count()):
                add(w.tabText(i), f"tab {w.tabText(i)!r}")
        elif isinstance(w, QMenuBar):
            for action in w.actions():
                add(action.text(), f"menu {action.text()!r}")
    return found


def _shared(top: QWidget) -> dict[str, list[str]]:
    return {k: v for k, v in _mnemonics(top).items() if len(v) > 1}


def _activate(qtbot: Any, window: QWidget) -> None:
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=5_000)


def test_no_alt_letter_is_shared_in_the_main_window(make_window: Any, qtbot: Any) -> None:
    """A shared Alt+letter only moves the focus between its owners: Alt+P did not press
    Stop (the Policy label had P), Alt+A did not press Answer now (the Cache menu had A),
    Alt+C opened neither the Chat menu nor the Cache tab."""
    window = make_window()
    view = window.chat_view
    view.stop_button.setEnabled(True)
    view.answer_now_button.setVisible(True)  # as while a thinking model thinks
    for tab in range(window.right_tabs.count()):
        window.right_tabs.setCurrentIndex(tab)
        assert _shared(window) == {}, window.right_tabs.tabText(tab)
    letters = _mnemonics(window)
    assert letters["A"] == ["button '&Answer now'"]  # README: Answer now (Alt+A)
    assert letters["C"] == ["menu '&Chat'"]


def test_alt_letters_press_stop_and_answer_now(window: Any, qtbot: Any) -> None:
    _activate(qtbot, window)
    view = window.chat_view
    view.stop_button.setEnabled(True)
    view.answer_now_button.setVisible(True)
    view.input.setFocus()
    with qtbot.waitSignal(view.stopRequested, timeout=2_000):
        qtbot.keyClick(view.input, Qt.Key.Key_P, ALT)
    with qtbot.waitSignal(view.answerNowRequested, timeout=2_000):
        qtbot.keyClick(view.input, Qt.Key.Key_A, ALT)
    view.set_generating(False)


def test_alt_v_reaches_the_budget_slider_and_sliders_say_their_values(window: Any,
                                                                       qtbot: Any) -> None:
    """The VRAM budget label's buddy was the row holding slider and box (no focus): Alt+V
    did nothing. A slider's own value is a bare step (15 for θ 0.15, 16 for 16 slots)."""
    _activate(qtbot, window)
    c = window.controls
    window.chat_view.input.setFocus()
    qtbot.keyClick(window.chat_view.input, Qt.Key.Key_V, ALT)
    assert c.budget.hasFocus(), QApplication.focusWidget()
    assert c.budget.accessibleDescription() == c.budget_label.text()
    assert "slots/layer" in c.budget.accessibleDescription()
    c.budget.setValue(c.budget.value() + 1)
    assert c.budget.accessibleDescription() == c.budget_label.text()
    assert c.theta.accessibleDescription() == "0.15"
    assert c.bonus.accessibleDescription() == c.bonus_label.text()
    for control in (c.theta, c.beta, c.bonus, c.budget, c.prefetch_mode):
        label = c.form.labelForField(control.parentWidget())
        assert label.buddy() is control, label.text()


def test_open_model_budget_label_reaches_its_slider(qtbot: Any, tiny_moe: Path) -> None:
    from moescope.gui.dialogs.open_model import OpenModelDialog
    from moescope.model.gguf_info import read_model_info

    dialog = OpenModelDialog(read_model_info(tiny_moe, require_moe=False))
    qtbot.addWidget(dialog)
    dialog.show()
    _activate(qtbot, dialog)
    assert _shared(dialog) == {}
    dialog.n_ctx.setFocus()
    qtbot.keyClick(dialog.n_ctx, Qt.Key.Key_B, ALT)
    assert dialog.budget.hasFocus(), QApplication.focusWidget()


def test_escape_cancels_a_load(held_load: Any, qtbot: Any, tiny_moe: Path) -> None:
    """Esc (Chat ▸ Stop) stopped only answers; a load could be cancelled only by reaching
    the status bar's Cancel button."""
    window, release, steps = held_load
    _activate(qtbot, window)
    assert window.load_model(str(tiny_moe))
    qtbot.waitUntil(lambda: bool(steps))
    window.chat_view.input.setFocus()
    qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Escape)
    assert window.model_label.text() == "Cancelling…"
    qtbot.waitUntil(lambda: not window.loading, timeout=30_000)
    assert window.model is None
    release.set()


def test_cancel_by_keyboard_leaves_the_focus_in_the_message_box(held_load: Any, qtbot: Any,
                                                                 tiny_moe: Path) -> None:
    """The Cancel button, pressed with Space, is disabled then hidden: the focus went to
    the next widget in the chain, the chat search box at the other end of the window."""
    window, release, steps = held_load
    _activate(qtbot, window)
    assert window.load_model(str(tiny_moe))
    qtbot.waitUntil(lambda: bool(steps))
    window.cancel_load_button.setFocus()
    qtbot.keyClick(window.cancel_load_button, Qt.Key.Key_Space)
    assert window.chat_view.input.hasFocus(), QApplication.focusWidget()
    qtbot.waitUntil(lambda: not window.loading, timeout=30_000)
    assert window.chat_view.input.hasFocus(), QApplication.focusWidget()
    release.set()


def test_delete_key_in_the_chat_list_asks_and_no_is_the_default(
        window: Any, qtbot: Any, monkeypatch: Any) -> None:
    """Delete in the chat list did nothing; the question's default button was Yes, so an
    Enter pressed once too often deleted the chat."""
    asked: list[tuple[Any, ...]] = []

    def question(*args: Any) -> QMessageBox.StandardButton:
        asked.append(args)
        return QMessageBox.StandardButton.Yes

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    _activate(qtbot, window)
    send(qtbot, window, "first", max_tokens=2)
    window.chat.new_chat()
    send(qtbot, window, "second", max_tokens=2)
    chats = window.chat_list
    chats.list.setFocus()
    qtbot.keyClick(chats.list, Qt.Key.Key_Down)  # arrows select chats
    assert window.chat_view.title.text() == "first"
    qtbot.keyClick(chats.list, Qt.Key.Key_Delete)
    (args,) = asked
    assert args[-1] == QMessageBox.StandardButton.No
    assert chats.titles() == ["second"]
    # Delete in a text box deletes text, never a chat
    window.chat_view.input.setPlainText("ab")
    window.chat_view.input.setFocus()
    qtbot.keyClick(window.chat_view.input, Qt.Key.Key_Delete)
    assert len(asked) == 1
    rows = dict(shortcut_rows([*window.actions(), *chats.list.actions()], window))
    assert rows["Delete chat (in the chat list)"] == "Del"  # Help ▸ Keyboard shortcuts
    # the labels that jump to their control are listed too (Qt keeps no action for them)
    assert rows["Go to RAM budget"] == "Alt+U" and rows["Go to Quality audit"] == "Alt+Q"
    assert rows["Go to Policy"] == "Alt+O" and rows["Go to VRAM budget"] == "Alt+V"


def test_new_chat_puts_the_keyboard_in_the_message_box(window: Any, qtbot: Any) -> None:
    """After Ctrl+N in the chat list, typing went to the list's type-ahead search."""
    _activate(qtbot, window)
    window.chat_list.list.setFocus()
    qtbot.keyClick(window.chat_list.list, Qt.Key.Key_N, Qt.KeyboardModifier.ControlModifier)
    assert window.chat_view.input.hasFocus(), QApplication.focusWidget()
    window.chat_list.new_button.setFocus()
    qtbot.keyClick(window.chat_list.new_button, Qt.Key.Key_Space)
    assert window.chat_view.input.hasFocus(), QApplication.focusWidget()


def _unnamed_focus_stops(top: QWidget) -> list[str]:
    """Widgets the Tab key reaches with nothing for a screen reader to say."""
    out = []
    for w in top.findChildren(QWidget):
        if (w.window() is not top or not w.isVisibleTo(top) or w.focusProxy() is not None
                or not w.focusPolicy() & Qt.FocusPolicy.TabFocus):
            continue
        if isinstance(w.parent(), QAbstractSpinBox):
            continue  # a spin box's own editor: the box is named
        text = w.text() if isinstance(w, QAbstractButton) else ""
        if not (w.accessibleName() or text):
            out.append(f"{type(w).__name__} in {type(w.parent()).__name__}")
    return out


def test_every_focus_stop_has_a_name(window: Any, qtbot: Any) -> None:
    """The heatmap's and plots' graphics views take the focus but were nameless; the cache
    statistics line (hit rate, tokens/s) was not reachable by keyboard at all."""
    for tab in range(window.cache_panel.tabs.count()):
        window.cache_panel.tabs.setCurrentIndex(tab)
        for side in range(window.right_tabs.count()):
            window.right_tabs.setCurrentIndex(side)
            assert _unnamed_focus_stops(window) == []
    summary = window.cache_panel.summary
    assert summary.focusPolicy() & Qt.FocusPolicy.TabFocus and summary.accessibleName()
    assert window.cache_panel.heatmap.graphics.accessibleDescription().startswith(
        "Expert cache")


def _unnamed_tabs(top: QWidget) -> list[str]:
    """Tab widgets and tab bars in ``top`` with no name, and tabs with no tooltip."""
    out = []
    for w in [top, *top.findChildren(QWidget)]:
        if isinstance(w, QTabWidget | QTabBar) and not w.accessibleName().strip():
            out.append(f"{type(w).__name__} in {type(w.parent()).__name__}")
        if isinstance(w, QTabWidget):
            for i in range(w.count()):
                bar = w.tabBar()
                if not w.tabToolTip(i) or not bar.accessibleTabName(i):
                    out.append(f"tab {w.tabText(i)!r} of {w.accessibleName()!r}")
                assert "&" not in bar.accessibleTabName(i)
    return out


def test_every_tab_bar_has_a_name_and_every_tab_a_tooltip(
        window: Any, qtbot: Any, open_trace_window: Any, trace_path: Path) -> None:
    """The tab bars (the side panels', the cache plots', a trace window's) had no
    accessible name: a screen reader said "tab bar" and nothing of which; most tabs had
    no tooltip. Walks the real main window, a trace window, Preferences and Get models."""
    from moescope.gui.hub.window import show_get_models

    assert window.findChildren(QTabBar) and window.findChildren(QTabWidget)
    assert _unnamed_tabs(window) == []
    assert window.right_tabs.tabBar().accessibleName() == "Side panels tabs"
    assert window.right_tabs.tabBar().accessibleTabName(1) == "Chat settings"
    trace = open_trace_window(trace_path)
    assert trace.findChildren(QTabBar) and _unnamed_tabs(trace) == []
    for dialog in (window.show_preferences(), show_get_models(window)):
        assert _unnamed_tabs(dialog) == [], type(dialog).__name__
        dialog.close()


def test_the_trace_window_closes_from_the_keyboard(open_trace_window: Any, trace_path: Path,
                                                   qtbot: Any) -> None:
    """A window with no menu and no Close button: only the mouse (or the window manager)
    closed it. Its Plots tab and the What-if Policies button shared Alt+P."""
    for key, modifier in ((Qt.Key.Key_Escape, Qt.KeyboardModifier.NoModifier),
                          (Qt.Key.Key_W, Qt.KeyboardModifier.ControlModifier)):
        tw = open_trace_window(trace_path)
        _activate(qtbot, tw)
        tw.tabs.setCurrentIndex(1)
        assert _shared(tw) == {}
        assert _unnamed_focus_stops(tw) == []
        with qtbot.waitSignal(tw.closed, timeout=5_000):
            qtbot.keyClick(tw, key, modifier)
        assert not tw.isVisible()


def test_closing_a_trace_window_gives_the_keyboard_back(window: Any, qtbot: Any) -> None:
    """The trace window closed, no window was active: the keys went nowhere."""
    send(qtbot, window, "Hi", max_tokens=3)
    _activate(qtbot, window)
    window.chat_view.input.setFocus()
    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as blocker:
        window.open_trace(window.trace_path)
    tw = blocker.args[0]
    _activate(qtbot, tw)
    with qtbot.waitSignal(tw.closed, timeout=5_000):
        qtbot.keyClick(tw, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=5_000)
    assert window.chat_view.input.hasFocus(), QApplication.focusWidget()


def test_compare_run_by_keyboard_keeps_the_focus_on_its_controls(window: Any,
                                                                 qtbot: Any) -> None:
    """Run, pressed with Space, is disabled while it runs: the focus fell to the empty
    table, past the Stop button next to it. Esc closes the dialog, the keyboard back in
    the message box."""
    send(qtbot, window, "Hi", max_tokens=3)
    _activate(qtbot, window)
    window.chat_view.input.setFocus()
    qtbot.keyClick(window.chat_view.input, Qt.Key.Key_P,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    from moescope.gui.dialogs.compare import CompareDialog

    (dialog,) = [d for d in window.findChildren(CompareDialog) if d.isVisible()]
    _activate(qtbot, dialog)
    assert _shared(dialog) == {} and _unnamed_focus_stops(dialog) == []
    dialog.max_tokens.setValue(4)
    dialog.run_button.setFocus()
    with qtbot.waitSignal(window.client.worker.compareFinished, timeout=60_000):
        qtbot.keyClick(dialog.run_button, Qt.Key.Key_Space)
        assert dialog.stop_button.hasFocus(), QApplication.focusWidget()
    qtbot.waitUntil(lambda: dialog.result is not None, timeout=10_000)
    assert dialog.table.hasFocus(), QApplication.focusWidget()  # the results
    qtbot.keyClick(dialog.table, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not dialog.isVisible())
    assert window.focusWidget() is window.chat_view.input
