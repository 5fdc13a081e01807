"""A fresh look at the window as a new user (2026-12-03): at 1024x700 and 12 pt the live
plots sat below the Cache tab's fold, the RAM row showed no value, a model opened through
the Open dialog showed the RAM budget's Auto unticked although Auto chose it, and the
Compare dialog's notes stayed at three lines in a tall dialog. Real window, real engine:
the demo model, or the tiny synthetic one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gui_helpers import load, send
from PySide6.QtCore import QRect, QSize

from moescope.cache.budget import format_bytes
from moescope.gui.widgets.screen_fit import WINDOW_FRAME

SMALL = QSize(1024, 700)


def _in_window(widget: Any, rect: QRect) -> QRect:
    """``rect`` (in ``widget``'s coordinates) in its window's."""
    top_left = widget.mapTo(widget.window(), rect.topLeft())
    return QRect(top_left, rect.size())


def _plot_rect(window: Any, key: str) -> QRect:
    """The per-token plot ``key``'s box (title and curve) in the window's coordinates."""
    view = window.cache_panel.time_plots
    box = view.plots[key].sceneBoundingRect()
    origin = view.graphics.mapFromScene(box.topLeft())
    return _in_window(view.graphics, QRect(origin, box.size().toSize()))


def _seen(widget: Any) -> QRect:
    """The part of a scroll area's viewport on screen, in the window's coordinates."""
    return _in_window(widget, widget.rect())


def _key_plots_in_view(window: Any) -> bool:
    seen = _seen(window.cache_scroll.viewport()).intersected(
        _seen(window.cache_panel.time_plots.scroll.viewport()))
    return all(seen.contains(_plot_rect(window, key)) for key in ("mass", "tokens_per_s"))


def test_the_live_plots_show_without_scrolling_at_1024x700_and_12_points(
        make_window: Any, font_pt: Any, qtbot: Any, demo: Path) -> None:
    """The Cache tab scrolled and its per-token plots were all below its fold: the
    substituted mass and tokens/s, the plots a user watches while chatting. A preset's
    greyed parameter rows fold away in a window that short, the heatmap's title line and
    the stats line's third line with them; Custom brings the rows back, and a large
    window shows them as before."""
    window = make_window()
    load(qtbot, window, demo)
    font_pt(window, 12)
    window.resize(SMALL - WINDOW_FRAME)
    qtbot.waitUntil(lambda: window.size() == SMALL - WINDOW_FRAME, timeout=5_000)
    send(qtbot, window, "Recite some Shakespeare.", max_tokens=24)
    panel = window.cache_panel
    panel.draw(force=True)
    controls = window.controls
    qtbot.waitUntil(lambda: not controls.details_shown(), timeout=5_000)
    qtbot.waitUntil(lambda: _key_plots_in_view(window), timeout=5_000)
    assert not window.cache_scroll.scrolls()  # the whole panel in view
    assert not any(controls.form.isRowVisible(row) for row in controls.detail_rows)
    # nothing else went: the policy, both budgets, the audit; the heatmap's rows
    for widget in (controls.policy_combo, controls.budget, controls.budget_label,
                   controls.ram_budget, controls.ram_label, controls.audit):
        assert widget.isVisible() and widget.height() >= widget.minimumSizeHint().height()
    heat = panel.heatmap
    assert heat.graphics.height() >= heat.graphics.minimumHeight()
    assert heat.legend.geometry().top() > heat.graphics.geometry().bottom()
    # the cache controls gave their room up: the plots have it
    assert window.right_split.sizes()[0] <= controls.sizeHint().height() + 2
    controls.select_policy("custom")  # to set θ, β, bonus, prefetch: they show
    qtbot.waitUntil(lambda: all(controls.form.isRowVisible(r) for r in controls.detail_rows),
                    timeout=5_000)
    assert controls.theta.isVisible() and controls.theta.isEnabled()
    controls.select_policy("quality-first")
    qtbot.waitUntil(lambda: not controls.details_shown(), timeout=5_000)
    window.resize(QSize(1920, 1080) - WINDOW_FRAME)  # a large screen: as it was
    qtbot.waitUntil(lambda: controls.details_shown() and controls.theta.isVisible(),
                    timeout=5_000)
    assert heat.title.isVisible()
    qtbot.waitUntil(lambda: _key_plots_in_view(window), timeout=5_000)
    font_pt(window, 0)


@pytest.mark.parametrize("screen", [QSize(1366, 768), QSize(1280, 720)])
def test_the_live_plots_show_on_a_laptop_screen_at_the_first_start(
        make_window: Any, qtbot: Any, demo: Path, screen: QSize) -> None:
    """At the first start on a 1366x768 laptop the heatmap took its rows' height and the
    plots the rest: the tokens/s plot was cut at the window's bottom. The heatmap gives
    way to the first plots, at the load and when the window is resized."""
    from moescope.gui.main_window import first_size

    window = make_window()
    window.resize(first_size(screen - WINDOW_FRAME))
    qtbot.wait(100)
    load(qtbot, window, demo)
    qtbot.waitUntil(lambda: _key_plots_in_view(window), timeout=5_000)
    heat = window.cache_panel.heatmap
    assert heat.graphics.height() >= heat.graphics.minimumHeight()
    window.resize(window.width(), window.height() - 40)  # shorter: the heatmap gives way
    qtbot.waitUntil(lambda: _key_plots_in_view(window), timeout=5_000)


def test_the_ram_row_shows_what_it_keeps_in_ram(window: Any, qtbot: Any) -> None:
    """The RAM budget's row said nothing of its value (only the slider's tooltip and the
    Memory tab did). It shows the bytes of experts kept in RAM beside the slider, which
    keeps a usable width; they follow the slider, and the tooltip says the whole."""
    controls = window.controls
    m = window.model
    label = controls.ram_label
    assert label.isVisible()
    assert label.text() == format_bytes(m.n_expert * m.slot_row_bytes)
    assert "every expert in RAM" in label.toolTip()
    half = m.n_expert // 2
    window.request_ram_budget(half)
    qtbot.waitUntil(lambda: window.model.ram_slots_per_layer == half, timeout=10_000)
    qtbot.waitUntil(lambda: label.text() == format_bytes(half * m.slot_row_bytes),
                    timeout=5_000)
    assert "read from disk" in label.toolTip()
    slider = controls.ram_budget
    assert slider.width() >= 40
    assert not slider.geometry().intersects(label.geometry())
    assert label.fontMetrics().horizontalAdvance(label.text()) <= label.width()


def test_a_model_opened_through_the_open_dialog_shows_auto_ticked(
        make_window: Any, qtbot: Any, monkeypatch: Any, tiny_moe: Path) -> None:
    """The Open dialog sent the RAM figure Auto had chosen (or none, all in RAM), and the
    window's Auto showed unticked although the user chose nothing. The dialog has Auto
    too: ticked, it asks the load for auto, and the window's box shows it ticked; a
    budget the user sets unticks it in both."""
    from moescope.gui.dialogs.open_model import OpenModelDialog

    moves = iter([False, True])

    def accept(dialog: OpenModelDialog) -> int:
        own = next(moves)
        assert dialog.ram_auto.isChecked()
        assert dialog.request().ram_budget == "auto"
        if own:
            dialog.ram_budget.setValue(dialog.info.n_expert // 2)
            assert not dialog.ram_auto.isChecked()
            assert dialog.request().ram_budget.endswith("B")
            dialog.ram_auto.setChecked(True)  # back to Auto's own figure
            assert dialog.ram_budget.value() == dialog.info.n_expert
            dialog.ram_budget.setValue(dialog.info.n_expert // 2)
        return OpenModelDialog.DialogCode.Accepted

    monkeypatch.setattr(OpenModelDialog, "exec", accept)
    window = make_window()
    with qtbot.waitSignal(window.modelLoaded, timeout=30_000):
        window.prepare_open(tiny_moe)
    assert window.controls.ram_auto.isChecked()
    assert window.model.ram_slots_per_layer in (0, window.model.n_expert)  # all in RAM
    with qtbot.waitSignal(window.modelLoaded, timeout=30_000):
        window.prepare_open(tiny_moe)
    assert not window.controls.ram_auto.isChecked()
    assert window.model.ram_slots_per_layer == window.model.n_expert // 2


def test_the_compare_dialogs_notes_grow_where_it_has_room(window: Any, qtbot: Any) -> None:
    """The notes above the table were held to three lines (the rest scrolled) however tall
    the dialog. They show whole where the table and the answer keep their room, and go
    back to three lines in a short dialog."""
    send(qtbot, window, "hi", max_tokens=8)
    dialog = window.open_compare_dialog()
    assert dialog is not None
    status = dialog.status_area
    dialog.status.setText(" ".join(["A long note on what the comparison measured."] * 30))
    dialog.resize(900, 1000)
    qtbot.waitUntil(lambda: dialog.size() == QSize(900, 1000), timeout=5_000)
    # every line of both notes at the width they have (their scroll bars reach nothing
    # more than a label's rounding)
    qtbot.waitUntil(lambda: all(a.height() >= a.whole_px() for a in (status,
                                                                     dialog.intro_area)),
                    timeout=5_000)
    assert status.height() >= status.whole_px() > status.lines_px(3)
    assert dialog.table.height() >= dialog.table.minimumHeight()
    dialog.resize(900, 420)  # short: three lines, the rest scrolls
    qtbot.waitUntil(lambda: status.height() <= status.lines_px(3) + 1, timeout=5_000)
    assert status.whole_px() > status.height() and status.clipped()
    assert dialog.results.height() >= dialog.results.minimumSizeHint().height()
    dialog.reject()


def test_a_short_window_keeps_the_numbers_in_the_stats_lines_view(
        make_window: Any, font_pt: Any, qtbot: Any, demo: Path) -> None:
    """At 1024x700 and 12 pt the stats line's first part (the policy, the slots, the token,
    the TTFT) wrapped onto both lines it has and the numbers of the last tokens (hit rate,
    mass, tokens/s) were only in its tooltip. In a short window the numbers come first."""
    window = make_window()
    load(qtbot, window, demo)
    font_pt(window, 12)
    window.resize(SMALL - WINDOW_FRAME)
    send(qtbot, window, "Recite some Shakespeare.", max_tokens=24)
    panel = window.cache_panel
    qtbot.waitUntil(lambda: panel.heatmap.title.isHidden(), timeout=5_000)
    panel.draw(force=True)
    summary = panel.summary
    qtbot.waitUntil(lambda: "tok/s" in summary.text(), timeout=5_000)
    shown = " ".join(summary.shown_lines())
    for part in ("last ", "hit ", "mass/token", "tok/s"):
        assert part in shown, (part, summary.shown_lines())
    assert summary.height() <= summary.minimumSizeHint().height() + 1  # two lines
    window.resize(QSize(1920, 1080) - WINDOW_FRAME)  # room: the usual order, every line
    qtbot.waitUntil(lambda: not panel.heatmap.title.isHidden(), timeout=5_000)
    panel.draw(force=True)
    qtbot.waitUntil(lambda: summary.text().startswith("now: "), timeout=5_000)
    font_pt(window, 0)
