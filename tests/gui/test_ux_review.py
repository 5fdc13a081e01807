"""What a first-time user sees: focus after sending, a window that fits a small screen,
greyed controls that say why, a shortcuts list without a scroll bar, empty states that
explain themselves."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import send
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication, QCheckBox

SMALL_SCREEN_WIDTH = 1024


def _activate(qtbot: Any, window: Any) -> None:
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=5_000)


def test_clicking_send_leaves_the_keyboard_in_the_message_box(window: Any,
                                                               qtbot: Any) -> None:
    """Send is disabled while the answer streams; Qt would pass its focus to the next
    widget in the chain, the cache policy box, where the user's next arrow key changed
    the policy."""
    _activate(qtbot, window)
    view = window.chat_view
    window.chat_settings.max_tokens.setValue(8)
    view.input.setPlainText("Hi")
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000):
        qtbot.mouseClick(view.send_button, Qt.MouseButton.LeftButton)
        assert window.chat.generating
        assert view.input.hasFocus(), QApplication.focusWidget()
    assert view.input.hasFocus(), QApplication.focusWidget()
    assert not window.controls.policy_combo.hasFocus()
    # Regenerate, clicked, also gives the keyboard back to the box
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000):
        qtbot.mouseClick(view.regenerate_button, Qt.MouseButton.LeftButton)
    assert view.input.hasFocus(), QApplication.focusWidget()


def test_the_window_fits_a_1024_pixel_screen_even_with_a_long_chat_title(
        window: Any, qtbot: Any) -> None:
    """The heatmap legend (one row of six entries), the chat title and the status bar's
    model line used to set the window's minimum width: 1360 pixels."""
    send(qtbot, window, "Hi", max_tokens=4)
    window.chat.rename(window.chat.chat_id, "A very long title " * 12)
    window.model_label.setText("Qwen3-Next-80B-A3B-Instruct-Q4_K_M-00001-of-00002 · " * 3)
    qtbot.wait(50)
    assert window.minimumSizeHint().width() <= SMALL_SCREEN_WIDTH
    window.resize(SMALL_SCREEN_WIDTH, 700)
    qtbot.waitUntil(lambda: window.width() <= SMALL_SCREEN_WIDTH, timeout=5_000)
    title = window.chat_view.title
    assert title.text() == "A very long title " * 12 or title.text().startswith("A very")
    assert title.elided().endswith("…") and title.toolTip() == title.text()
    # the legend wraps instead of overlapping the heatmap
    legend = window.cache_panel.heatmap.legend
    assert legend.height() >= legend.layout().heightForWidth(legend.width())


def test_the_first_start_fits_the_screen_and_a_saved_size_is_kept(
        make_window: Callable[..., Any], qtbot: Any) -> None:
    """The first start opened 1380x860 whatever the screen: on a 1366x768 laptop the
    message box's bottom and the status bar were below the screen's edge, on a 1024x700
    one the message box and Send too."""
    from PySide6.QtCore import QSize

    from moescope.gui.main_window import DEFAULT_SIZE, first_size
    from moescope.gui.widgets.screen_fit import WINDOW_FRAME

    assert first_size(QSize(2560, 1400)) == DEFAULT_SIZE
    assert first_size(QSize(1366, 740)) == QSize(1366, 740) - WINDOW_FRAME
    assert first_size(QSize(1024, 700)) == QSize(1024, 700) - WINDOW_FRAME
    window = make_window()  # offscreen: an 800x800 screen, smaller than the default
    available = window.screen().availableGeometry()
    assert window.size() == DEFAULT_SIZE  # what the first start showed before
    window.fit_to_screen()
    # the free area, or the window's minimum where the screen is narrower still
    fitted = (available.size() - WINDOW_FRAME).expandedTo(window.minimumSizeHint())
    assert fitted.height() < DEFAULT_SIZE.height()
    qtbot.waitUntil(lambda: window.size() == fitted, timeout=5_000)
    assert window.geometry().top() >= available.top()
    saved = QSize(fitted.width(), 700)  # the user's own size, saved at close: kept
    window.resize(saved)
    qtbot.waitUntil(lambda: window.size() == saved, timeout=5_000)
    window.close()
    again = make_window()
    again.fit_to_screen()
    qtbot.wait(50)
    assert again.size() == saved


def test_the_trace_and_get_models_windows_fit_a_small_screen(
        window: Any, qtbot: Any, open_trace_window: Callable[[Path], Any],
        trace_path: Path) -> None:
    """The trace window opened 980x760 and *Get models* 1100x560 whatever the screen: on
    a 1366x768 laptop the trace window's bottom was below the screen's edge, on 1024x700
    *Get models* reached past its right edge (offscreen, the screen is 800x800)."""
    from moescope.gui.hub.window import show_get_models
    from moescope.gui.widgets.screen_fit import WINDOW_FRAME

    area = window.screen().availableGeometry()
    room = area.size() - WINDOW_FRAME
    window.move(area.right() - 200, area.bottom() - 200)  # placed over it: kept on screen
    trace = open_trace_window(trace_path)
    hub = show_get_models(window)
    for w in (trace, hub):
        fitted = room.expandedTo(w.minimumSizeHint())
        qtbot.waitUntil(lambda w=w, fitted=fitted: w.width() <= fitted.width()
                        and w.height() <= fitted.height(), timeout=5_000)
    assert trace.height() < 760 and hub.width() < 1100
    for w in (trace, hub):
        frame = w.frameGeometry()
        assert area.contains(frame.topLeft()) and area.contains(frame.bottomRight()), frame
    hub.close()
    # a second trace opened from the first goes below and right of it, on the screen (here,
    # where a trace window fills the 800x800 screen, that is where the first is)
    trace.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is trace, timeout=5_000)
    second = open_trace_window(trace_path)
    frame = second.frameGeometry()
    assert area.contains(frame.topLeft()) and area.contains(frame.bottomRight()), frame


def test_get_models_closes_from_the_keyboard(window: Any, qtbot: Any) -> None:
    """Neither Esc nor Ctrl+W closed *Get models* (the trace window took both)."""
    from moescope.gui.hub.window import show_get_models

    for key, modifier in ((Qt.Key.Key_W, Qt.KeyboardModifier.ControlModifier),
                          (Qt.Key.Key_Escape, Qt.KeyboardModifier.NoModifier)):
        hub = show_get_models(window)
        hub.activateWindow()
        qtbot.waitUntil(lambda hub=hub: QApplication.activeWindow() is hub, timeout=5_000)
        qtbot.keyClick(hub.search, key, modifier)  # where the window puts the keyboard
        qtbot.waitUntil(lambda hub=hub: not hub.isVisible(), timeout=5_000)


def test_a_presets_greyed_controls_say_why(window: Any) -> None:
    from moescope.gui.controls.cache_controls import CUSTOM_ONLY_TIP

    c = window.controls
    assert c.policy_combo.currentData() == "quality-first"
    for widget in (c.theta, c.beta, c.bonus, c.prefetch_mode):
        assert not widget.isEnabled()
        assert CUSTOM_ONLY_TIP in widget.toolTip()
        name = c.form.labelForField(widget.parentWidget())
        assert not name.isEnabled() and name.toolTip() == CUSTOM_ONLY_TIP
    c.policy_combo.setCurrentIndex(c.policy_combo.findData("custom"))
    for widget in (c.theta, c.beta, c.bonus, c.prefetch_mode):
        assert widget.isEnabled() and CUSTOM_ONLY_TIP not in widget.toolTip()
        assert c.form.labelForField(widget.parentWidget()).isEnabled()
    assert c.beta.toolTip().startswith("Background admission")  # its own tip, once


def test_the_shortcuts_list_shows_every_row_and_answer_now(window: Any, qtbot: Any) -> None:
    dialog = window.show_shortcuts()
    qtbot.waitExposed(dialog)
    rows = {dialog.table.item(r, 0).text(): dialog.table.item(r, 1).text()
            for r in range(dialog.table.rowCount())}
    assert "Alt+A" in rows.values()  # README: "Answer now (Alt+A)"
    assert not dialog.table.verticalScrollBar().isVisible()
    assert not dialog.table.horizontalScrollBar().isVisible()
    dialog.close()


def test_empty_states_say_what_is_missing(make_window: Callable[..., Any]) -> None:
    window = make_window()
    bar = window.chat_view.context_bar
    assert bar.text() == "no model loaded"  # not "context 0 / 1"


def test_an_empty_trace_says_so_instead_of_blank_plots(
        open_trace_window: Callable[[Path], Any], trace_path: Path, tmp_path: Path) -> None:
    header = trace_path.read_text(encoding="utf-8").splitlines()[0]
    empty = tmp_path / "empty.jsonl"
    empty.write_text(header + "\n", encoding="utf-8")
    window = open_trace_window(empty)
    assert window.empty_label.isVisible() and "no tokens" in window.empty_label.text()
    assert not window.tabs.isTabEnabled(1)  # no what-if sweep of nothing
    full = open_trace_window(trace_path)
    assert not full.empty_label.isVisible() and full.tabs.isTabEnabled(1)


@pytest.mark.parametrize("scheme", ["dark", "light"])
def test_ticked_and_unticked_boxes_both_show_a_box(qtbot: Any, scheme: str) -> None:
    """Fusion's unticked box was the colour of the ground; a ticked one must keep its box
    (and show its tick) once the unticked one is styled, in both schemes (the light one's
    tick was drawn in the dark scheme's text colour: white on white)."""
    from moescope.gui import theme
    from moescope.gui.app import create_app
    from moescope.gui.theme import indicator_qss

    app = create_app([])
    before = theme._choice
    theme.apply_theme(app, scheme)
    try:
        _boxes_show(qtbot, app, indicator_qss)
    finally:
        theme.apply_theme(app, before)


def _boxes_show(qtbot: Any, app: Any, indicator_qss: Any) -> None:
    assert indicator_qss() in app.styleSheet()
    assert Path(indicator_qss().split('url("')[1].split('")')[0]).is_file()  # the tick
    images = {}
    for ticked in (False, True):
        box = QCheckBox("x")
        box.setChecked(ticked)
        qtbot.addWidget(box)
        box.show()
        images[ticked] = box.grab().toImage()
    for image in images.values():
        ground = image.pixelColor(image.width() - 1, image.height() // 2)
        indicator = [image.pixelColor(x, y) for x in range(16) for y in range(image.height())]
        assert any(abs(p.lightness() - ground.lightness()) > 40 for p in indicator)
    # the tick: a ticked box differs clearly from an unticked one inside the box
    inside = [(x, y) for x in range(4, 12) for y in range(4, images[True].height() - 4)]
    assert any(abs(images[True].pixelColor(x, y).lightness()
                   - images[False].pixelColor(x, y).lightness()) > 80 for x, y in inside)


def test_a_window_opened_from_one_of_its_kind_is_cascaded(qtbot: Any) -> None:
    """Trace windows have no parent: each was centred on the screen, a second one exactly
    over the first."""
    from PySide6.QtCore import QSize
    from PySide6.QtWidgets import QWidget

    from moescope.gui.widgets.screen_fit import CASCADE_PX, resize_within_screen

    class Pane(QWidget):
        pass

    first = Pane()
    qtbot.addWidget(first)
    resize_within_screen(first, QSize(200, 150))
    first.show()
    first.move(100, 100)
    first.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is first, timeout=5_000)
    second = Pane()
    qtbot.addWidget(second)
    resize_within_screen(second, QSize(200, 150))
    assert (second.x(), second.y()) == (first.x() + CASCADE_PX, first.y() + CASCADE_PX)


def test_get_models_fits_at_the_budget_last_used(window: Any) -> None:
    """*Get models* priced every file at 25% whatever budget the window used."""
    from moescope.gui.hub.window import show_get_models

    window.remember_setting(None, "budget", "37.5%")
    hub = show_get_models(window)
    assert hub.budget.text() == "37.5%"
    hub.close()
