"""The main window on a small laptop screen (1024x700): it never grows by itself while a
chat runs, it fits 1024 px wide with a 10 pt font, and the plots' change markers keep
their labels apart; the Compare dialog fits too, at 9 to 12 pt, and the cache panel's
small print follows the font size. Real window, real engine, tiny model."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from gui_helpers import send
from PySide6.QtCore import QPoint, QSize
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import (
    QApplication,
    QLabel,
    QPushButton,
    QStyle,
    QStyleOptionComboBox,
    QWidget,
)

from moescope.gui.main_window import first_size
from moescope.gui.widgets.screen_fit import WINDOW_FRAME

SMALL = QSize(1024, 700)


@pytest.mark.parametrize("pt", [0, 10, 11])
def test_the_window_fits_1024_pixels_wide_at_10_points(make_window: Any, font_pt: Any,
                                                       qtbot: Any, pt: float) -> None:
    """At 10 pt the window could not be narrower than 1046 px: the chat buttons and a
    130 px context meter, the cache controls' margins. Thinking, Answer now appeared
    beside Regenerate and Edit last and made it ~90 px wider still. At 11 pt it was
    1088 px: the chat list's Rename and Delete side by side (176 px) and a meter sized
    for six-digit numbers; they go one under the other, and the meter's short form."""
    window = make_window()
    font_pt(window, pt)
    qtbot.wait(50)
    room = SMALL.width() - WINDOW_FRAME.width()
    assert window.minimumSizeHint().width() <= room
    view = window.chat_view
    view.set_context(131_072, 131_072)  # a long context's numbers
    view.set_generating(True)
    view._show_answer_now(True)  # as while a thinking model thinks
    qtbot.wait(50)
    assert view.answer_now_button.isVisible() and view.stop_button.isEnabled()
    assert window.minimumSizeHint().width() <= room
    window.resize(window.minimumSizeHint().width(), 650)
    qtbot.waitUntil(lambda: window.width() <= room, timeout=5_000)
    bar = view.context_bar
    assert bar.text() in (f"{131_072} / {131_072}", f"context {131_072} / {131_072}",
                          "131k / 131k", "context 131k / 131k")
    assert bar.fontMetrics().horizontalAdvance(bar.text()) <= bar.width()
    chats = window.chat_list
    buttons = (chats.new_button, chats.rename_button, chats.delete_button)
    qtbot.waitUntil(lambda: all(b.width() >= b.sizeHint().width() for b in buttons),
                    timeout=5_000)  # the buttons laid out again for the narrow list
    assert all(b.isVisible() for b in buttons)
    assert chats.rename_button.geometry().bottom() < chats.delete_button.geometry().top()
    view.set_generating(False)
    assert not view.answer_now_button.isVisible() and view.regenerate_button.isVisible()


def test_a_running_chat_never_makes_the_window_taller(window: Any, qtbot: Any) -> None:
    """At 1024x700 the window grew by itself, 10-25 px: the stats line wrapped onto a
    third and fourth line, the heatmap legend gained a row for the RAM tier, the Memory
    tab lines (where the experts live, the tiers) were added to the plots' minimum."""
    size = first_size(SMALL)
    window.resize(size)
    qtbot.waitUntil(lambda: window.size() == size, timeout=5_000)
    panel = window.cache_panel
    least = window.minimumSizeHint().height()
    send(qtbot, window, "hi", max_tokens=12)
    panel.draw(force=True)
    window.request_ram_budget(window.model.n_expert // 2)  # the RAM tier row appears
    qtbot.waitUntil(lambda: panel.model.ram_slots_per_layer > 0, timeout=10_000)
    window.controls.audit.setCurrentIndex(window.controls.audit.findData(8))
    send(qtbot, window, "tell me more", max_tokens=24)
    for tab in range(panel.tabs.count()):  # each tab drawn, its lines set
        panel.tabs.setCurrentIndex(tab)
        panel.draw(force=True)
        qtbot.wait(20)
    assert "RAM tier" in panel.summary.text()
    assert all(s.isVisibleTo(panel.heatmap.legend) for s in panel.heatmap.tier_swatches)
    assert panel.memory_view.tiers_label.isVisibleTo(panel.memory_view)
    long_text = " · ".join(["a long stats line part"] * 40)
    panel.summary.setText(long_text + "\n" + long_text)
    qtbot.wait(100)
    # never taller (shorter, where the cache controls' preset rows folded away)
    assert window.minimumSizeHint().height() <= least
    assert window.size() == size
    # the stats line still shows what fits, and the whole of it on hover where cut
    assert panel.summary.clipped()
    assert panel.summary.toolTip().endswith(long_text + "\n" + long_text)


def test_change_markers_one_token_apart_keep_their_labels_apart(window: Any,
                                                                qtbot: Any) -> None:
    """Two changes one token apart drew their labels over each other: the rows were a
    share of the plot's height (12 px apart in a 62 px plot) while a label is ~16 px
    tall, and the widths were guessed at 6.5 px a character."""
    send(qtbot, window, "hi", max_tokens=40)
    window.resize(first_size(SMALL))
    qtbot.wait(100)
    model = window.cache_panel.model
    last = model.latest.step
    changes = [(last - 12, "policy speed-first"), (last - 11, "slots 8 (50%)"),
               (last - 10, "policy quality-first"), (last - 3, "RAM 8"),
               (last - 2, "policy psr"), (last - 1, "slots 4 (25%)")]
    for step, label in changes:
        model.add_marker(step, label)
    window.cache_panel.draw(force=True)
    plots = window.cache_panel.time_plots
    view = plots.plots["mass"].vb.sceneBoundingRect()
    shown = []
    for marker, lines in plots._marker_items:
        label = lines[0].label
        if label.isVisible():
            shown.append((marker.label, label.sceneBoundingRect()))
    # the first at least: in this short window the plots are compact (COMPACT_PLOT_PX,
    # the first two per-token plots whole without scrolling) and hold one row of labels;
    # the others keep their lines, and the tooltip names them
    assert len(shown) >= 1, shown
    if not plots.compact:
        assert len(shown) >= 2, shown  # the first two at least: nothing before them
    for (a, ra), (b, rb) in itertools.combinations(shown, 2):
        assert not ra.intersects(rb), (a, ra, b, rb)
    for text, rect in shown:
        assert view.contains(rect), (text, rect, view)
    # a label left out is still named: its line stays and the tooltip lists it
    tip = plots.graphics.toolTip()
    assert all(f"token {step}: {label}" in tip for step, label in changes)


@pytest.mark.parametrize("pt", [10, 11, 12, 14])
def test_a_context_of_a_million_tokens_fits_the_meter(make_window: Any, font_pt: Any,
                                                      qtbot: Any, pt: float) -> None:
    """At 1M tokens of context the meter read "1048576 / 1048576" in room for six-digit
    numbers: clipped at the window's least width. It says "1.0M" (and "262k") there now,
    with the exact numbers in its tooltip, and the long form where the row has room."""
    window = make_window()
    font_pt(window, pt)
    qtbot.wait(50)
    view, bar = window.chat_view, window.chat_view.context_bar
    window.resize(window.minimumSizeHint().width(), 650)
    qtbot.waitUntil(lambda: window.width() == window.minimumSizeHint().width(),
                    timeout=5_000)
    assert bar.text() in ("no model loaded", "no model")  # never cut either
    assert bar.fontMetrics().horizontalAdvance(bar.text()) + 8 <= bar.width()
    for used, n_ctx, words in ((262_144, 1_048_576, "262k / 1.0M"),
                               (1_048_576, 1_048_576, "1.0M / 1.0M"),
                               (2_000_000, 10_485_760, "2.0M / 10M")):
        view.set_context(used, n_ctx)
        qtbot.wait(20)
        assert bar.text().endswith(words), (bar.text(), words)
        assert bar.fontMetrics().horizontalAdvance(bar.text()) + 8 <= bar.width()
        assert f"{used:,} of {n_ctx:,} tokens" in bar.toolTip()
    view.set_context(131_072, 131_072)  # the least width has room for short numbers only
    assert bar.text().endswith("131k / 131k") and "131,072 of 131,072" in bar.toolTip()
    window.resize(window.minimumSizeHint().width() + 600, 650)
    view.set_context(262_144, 1_048_576)
    qtbot.waitUntil(lambda: bar.text() == "context 262144 / 1048576", timeout=5_000)
    assert bar.fontMetrics().horizontalAdvance(bar.text()) <= bar.width()


def test_a_long_stats_line_squeezes_no_plot_at_the_least_size(window: Any,
                                                              qtbot: Any) -> None:
    """At the window's least size after a chat, the stats line above the heatmap wrapped
    to four lines and took them: its layout gave it every wrapped line and the splitter
    below less than its minimum, so the heatmap's legend was drawn over its "expert" axis
    (22 px of overlap at 888x623, the demo model on Xvfb). It keeps its two lines there,
    the rest in its tooltip, and shows every line where the window has room."""
    panel = window.cache_panel
    heat, summary = panel.heatmap, panel.summary
    panel.draw(force=True)
    qtbot.wait(300)  # the panel's own labels set: the text below stays
    long_text = " · ".join(["a stats line part"] * 40)
    summary.setText(long_text + "\n" + long_text)
    least = window.minimumSizeHint()
    window.resize(least)
    qtbot.waitUntil(lambda: window.size() == least, timeout=5_000)
    qtbot.wait(100)
    assert heat.legend.geometry().top() > heat.graphics.geometry().bottom()
    assert heat.height() >= heat.minimumSizeHint().height()
    assert panel.splitter.height() >= panel.splitter.minimumSizeHint().height()
    assert summary.clipped() and summary.toolTip().endswith(long_text + "\n" + long_text)
    window.resize(least.width(), least.height() + 400)
    qtbot.waitUntil(lambda: not summary.clipped(), timeout=5_000)
    assert heat.legend.geometry().top() > heat.graphics.geometry().bottom()


def test_the_chat_stays_where_the_user_was_when_the_window_narrows(window: Any,
                                                                   qtbot: Any) -> None:
    """Narrowing the window wraps the transcript's lines again and makes it taller; the
    scroll bar kept its value, so a user reading the end of the chat was left some lines
    above it, and one reading further up saw other lines under the same value. The end
    stays in view at the end, and the line at the top stays at the top above it."""
    window.resize(first_size(QSize(1366, 768)))
    words = " ".join(f"word{i}" for i in range(60))
    for n in range(3):
        send(qtbot, window, f"Message {n}: {words}", max_tokens=30)
    view = window.chat_view.transcript
    bar = view.verticalScrollBar()
    qtbot.waitUntil(lambda: bar.maximum() > 0 and bar.value() == bar.maximum(),
                    timeout=5_000)
    window.resize(window.minimumSizeHint().width(), window.height())
    qtbot.waitUntil(lambda: view.width() < 500, timeout=5_000)
    qtbot.wait(50)
    assert bar.value() == bar.maximum(), (bar.value(), bar.maximum())  # still at the end
    window.resize(first_size(QSize(1366, 768)))
    qtbot.waitUntil(lambda: view.width() > 500, timeout=5_000)
    qtbot.wait(50)
    assert bar.value() == bar.maximum()
    bar.setSliderPosition(bar.maximum() // 2)  # reading further up, as a drag would
    bar.triggerAction(bar.SliderAction.SliderMove)
    top = view.cursorForPosition(QPoint(0, 0)).block()
    text = top.text()
    window.resize(window.minimumSizeHint().width(), window.height())
    qtbot.waitUntil(lambda: view.width() < 500, timeout=5_000)
    qtbot.wait(50)
    assert 0 < bar.value() < bar.maximum()
    # the block at the top of the view before is still there (maybe by a line or two)
    shown = view.cursorForPosition(QPoint(0, 0)).block()
    assert shown.text() == text, (shown.text()[:40], text[:40])


def test_the_window_fits_700_pixels_tall_at_11_points(font_pt: Any, window: Any,
                                                      qtbot: Any) -> None:
    """At 11 pt the window was 658 px tall at least, and 673 px at 1008 px wide (the
    heatmap legend a row taller in the narrower panel), a 1024x700 screen's work area
    652: the style's 11 px above and below the cache controls' rows, the group box's
    title already above them, and 6 px above and below the right-hand column. Every
    control and the budget's line keep their room."""
    font_pt(window, 11)
    qtbot.wait(50)
    room = SMALL - WINDOW_FRAME
    send(qtbot, window, "hi", max_tokens=8)
    window.resize(room)
    qtbot.waitUntil(lambda: window.size() == room, timeout=5_000)
    qtbot.wait(100)
    assert window.minimumSizeHint().height() <= room.height()
    assert window.size() == room  # it did not grow past the screen by itself
    controls = window.controls
    form = controls.form
    for row in range(form.rowCount()):
        if not form.isRowVisible(row):  # a preset's parameters, folded in a short window
            field = form.itemAt(row, form.ItemRole.FieldRole).widget()
            assert field in controls.detail_rows and not controls.details_shown()
            continue
        for role in (form.ItemRole.LabelRole, form.ItemRole.FieldRole):
            item = form.itemAt(row, role)
            if item is None or item.widget() is None:
                continue
            widget = item.widget()
            assert widget.isVisible()
            assert widget.height() >= widget.minimumSizeHint().height(), (row, role)
    label = controls.budget_label
    assert "slots/layer" in label.text()
    assert label.height() >= label.heightForWidth(label.width())  # the whole line
    panel = window.cache_panel
    assert panel.splitter.height() >= panel.splitter.minimumSizeHint().height()
    assert panel.heatmap.height() >= panel.heatmap.minimumSizeHint().height()
    font_pt(window, 0)  # here: the window is closed before the fixture ends, its chat gone


def test_a_clamped_budgets_note_does_not_grow_the_window_past_700_pixels(
        font_pt: Any, window: Any, qtbot: Any) -> None:
    """A typed budget below top-k adds a note under the slider: two more lines, and the
    window's least height went to about 672 px at 11 pt, growing the window past a
    1024x700 screen's bottom by itself. The line now keeps one line at least: the note
    shows where the column has room, and in the line's tooltip where it has not."""
    font_pt(window, 11)
    qtbot.wait(50)
    room = SMALL - WINDOW_FRAME
    window.resize(room)
    qtbot.waitUntil(lambda: window.size() == room, timeout=5_000)
    controls = window.controls
    top_k = window.model.top_k
    controls.budget.setValue(8)
    qtbot.waitUntil(lambda: window.model.slots_per_layer == 8, timeout=10_000)
    controls.budget_entry.setText(str(top_k - 1))
    controls.apply_typed_budget()
    qtbot.waitUntil(lambda: window.model.slots_per_layer == top_k, timeout=10_000)
    qtbot.wait(100)
    label = controls.budget_label
    assert f"using {top_k} slots" in label.text()  # the note is there
    assert window.minimumSizeHint().height() <= room.height()
    assert window.size() == room  # it did not grow past the screen by itself
    shown = " ".join(label.shown_lines())
    assert "slots/layer" in shown  # the budget itself stays in sight
    if label.clipped():
        assert label.text() in label.toolTip() and shown.endswith("…")
    font_pt(window, 0)  # here: the window is closed before the fixture ends, its chat gone


def test_the_window_fits_1024_pixels_wide_at_12_points(font_pt: Any, window: Any,
                                                       qtbot: Any) -> None:
    """At 12 pt the window was 1037 px wide at least: the cache controls' audit row,
    "every 64 tokens" beside "guard ≤ 10.0%", and the policy menu as wide as its longest
    entry. Where the column is narrow the guard's box says "≤ 1.0%" and the menu ends a
    long entry in "…" (whole in its list), so the chat's buttons set the width: every
    control keeps its room, and the usual entry, Quality-first's, is whole."""
    font_pt(window, 12)
    qtbot.wait(50)
    room = QSize(1024, 768) - WINDOW_FRAME
    assert window.minimumSizeHint().width() <= room.width()
    window.resize(room)
    qtbot.waitUntil(lambda: window.size() == room, timeout=5_000)
    qtbot.wait(100)
    assert window.minimumSizeHint().height() <= room.height()
    controls = window.controls
    form = controls.form
    for row in range(form.rowCount()):
        item = form.itemAt(row, form.ItemRole.FieldRole)
        if not form.isRowVisible(row):  # a preset's parameters, folded in a short window
            assert item.widget() in controls.detail_rows and not controls.details_shown()
            continue
        if item is not None and item.widget() is not None:
            widget = item.widget()
            assert widget.isVisible()
            assert widget.width() >= widget.minimumSizeHint().width(), row
    guard, audit, combo = controls.guard_target, controls.audit, controls.policy_combo
    assert guard.prefix() in ("≤ ", "guard ≤ ")
    for box in (guard, audit):
        assert box.isVisible() and box.width() >= box.minimumSizeHint().width()
    line = guard.lineEdit()
    assert line.fontMetrics().horizontalAdvance(line.text()) <= line.width()
    assert combo.currentData() == "quality-first"
    option = QStyleOptionComboBox()
    combo.initStyleOption(option)
    field = combo.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, option,
                                         QStyle.SubControl.SC_ComboBoxEditField, combo)
    assert combo.fontMetrics().horizontalAdvance(combo.currentText()) <= field.width()
    window.resize(window.minimumSizeHint().width(), room.height())
    qtbot.waitUntil(lambda: guard.prefix() == "≤ " and line.fontMetrics()
                    .horizontalAdvance(line.text()) <= line.width(), timeout=5_000)
    assert guard.width() >= guard.minimumSizeHint().width()
    window.resize(1350, 720)  # a wide window: the guard's word again
    qtbot.waitUntil(lambda: guard.prefix() == "guard ≤ " and line.fontMetrics()
                    .horizontalAdvance(line.text()) <= line.width(), timeout=5_000)
    font_pt(window, 0)  # here: the window is closed before the fixture ends, its chat gone


def _cut_widgets(top: Any) -> list[str]:
    """The visible labels, buttons, check boxes and spin boxes in ``top`` narrower or
    shorter than their text needs (a word-wrapped label: shorter than its lines at its
    width, unless it is in a scroll area whose bar reaches the rest)."""
    from PySide6.QtWidgets import (
        QAbstractButton,
        QAbstractSpinBox,
        QLabel,
        QScrollArea,
    )

    cut = []
    for widget in top.findChildren(QWidget):
        if not widget.isVisible() or widget.width() <= 0:
            continue
        if isinstance(widget, QLabel) and widget.text():
            area = widget.parentWidget().parentWidget() if widget.parentWidget() else None
            if widget.wordWrap():
                if isinstance(area, QScrollArea) and area.widget() is widget:
                    bar = area.verticalScrollBar()
                    if bar.maximum() > bar.minimum() and not bar.isVisible():
                        cut.append(f"{widget.text()[:40]!r}: no scroll bar to its end")
                elif widget.height() < widget.heightForWidth(widget.width()):
                    cut.append(f"{widget.text()[:40]!r}: {widget.height()} px tall")
            else:
                hint = widget.sizeHint()
                if hint.width() > widget.width() or hint.height() > widget.height():
                    cut.append(f"{widget.text()[:40]!r}: {widget.size()} < {hint}")
        elif isinstance(widget, QAbstractButton) and widget.text():
            hint = widget.minimumSizeHint().expandedTo(widget.sizeHint()) \
                if not isinstance(widget, QPushButton) else widget.minimumSizeHint()
            if hint.width() > widget.width() or hint.height() > widget.height():
                cut.append(f"{widget.text()!r}: {widget.size()} < {hint}")
        elif isinstance(widget, QAbstractSpinBox):
            hint = widget.minimumSizeHint()
            if hint.width() > widget.width() or hint.height() > widget.height():
                cut.append(f"{widget.accessibleName()}: {widget.size()} < {hint}")
    return cut


def _rows_in_view(table: Any) -> int:
    """The table's rows whole in its viewport."""
    height = table.viewport().height()
    return sum(1 for r in range(table.rowCount())
               if table.rowViewportPosition(r) >= 0
               and table.rowViewportPosition(r) + table.rowHeight(r) <= height)


@pytest.mark.parametrize("pt", [9, 10, 11, 12])
def test_the_compare_dialog_fits_1024x700_at_9_to_12_points(font_pt: Any, window: Any,
                                                          qtbot: Any, pt: int) -> None:
    """At 12 pt on a 1024x700 screen the Compare dialog's two notes took five lines each
    (all their lines: a word-wrapped label in a box layout), the policy list was held to
    150 px (seven and a half of nine policies), and the table under them showed one row
    and a half of four; its 900x640 took no account of the screen's work area. The notes
    ask for three lines and scroll the rest, the list is four rows at least and all where
    there is room, the table and the answer share a splitter, and the table is given the
    height of its rows after a run. At the screen's room and at the dialog's least size,
    nothing is cut and the table shows two rows at least."""
    font_pt(window, pt)
    qtbot.wait(50)
    assert QApplication.font().pointSizeF() == pt
    send(qtbot, window, "Tell me about the sea.", max_tokens=8)
    room = SMALL - WINDOW_FRAME
    dialog = window.open_compare_dialog()
    assert dialog is not None and dialog.isVisible()
    assert dialog.font().pointSizeF() == pt
    assert dialog.policies.height() >= 4 * dialog.policies.sizeHintForRow(0)
    dialog.max_tokens.setValue(8)
    with qtbot.waitSignal(window.client.worker.compareFinished, timeout=60_000):
        dialog.run()
    qtbot.waitUntil(lambda: dialog.result is not None, timeout=10_000)
    table = dialog.table
    assert table.rowCount() == 4  # Exact and the three policies checked at first
    least = dialog.minimumSizeHint()
    assert least.width() <= room.width() and least.height() <= room.height(), least
    for size in (room, None):
        if size is None:  # the least size: the notes' least height follows their width
            for _ in range(3):
                dialog.resize(dialog.minimumSizeHint())
                qtbot.wait(50)
            assert dialog.width() <= room.width() and dialog.height() <= room.height()
        else:
            dialog.resize(size)
            qtbot.waitUntil(lambda s=size: dialog.size() == s, timeout=5_000)
        qtbot.wait(100)  # the table fitted to its rows again at this size
        assert _cut_widgets(dialog) == [], (size, _cut_widgets(dialog))
        for area in (dialog.intro_area, dialog.status_area):
            assert area.height() >= area.minimumSizeHint().height()
        assert _rows_in_view(table) >= (4 if size == room else 2), size
        assert dialog.answer.height() >= 3 * dialog.answer.fontMetrics().lineSpacing()
        parts = [dialog.intro_area, dialog.policies, dialog.status_area, dialog.results]
        for a, b in itertools.pairwise(parts):
            assert a.geometry().bottom() < b.geometry().top(), (a, b)
    dialog.reject()
    font_pt(window, 0)  # here: the window is closed before the fixture ends, its chat gone


@pytest.mark.parametrize("pt", [9, 11, 12])
def test_the_cache_panels_small_print_follows_the_font_size_at_1024x700(
        font_pt: Any, window: Any, qtbot: Any, pt: int) -> None:
    """The cache panel's stats line, heatmap legend, Memory lines, plot titles and legends
    and the budget's line stayed at 8 pt (7 pt) whatever the font size (the smallest print
    at 12 pt): at a point under the font they made the window 37 px taller than a
    1024x700 screen's work area at 11 pt. They follow the font now, and the panel scrolls
    where the window is shorter than it: the window fits, nothing in the panel is
    squeezed, the budget's line is whole."""
    font_pt(window, pt)
    qtbot.wait(50)
    small = max(8.0, pt - 1.0)
    assert QApplication.font().pointSizeF() == pt
    room = SMALL - WINDOW_FRAME
    send(qtbot, window, "hi", max_tokens=8)
    window.resize(room)
    qtbot.waitUntil(lambda: window.size() == room, timeout=5_000)
    panel = window.cache_panel
    for tab in range(panel.tabs.count()):
        panel.tabs.setCurrentIndex(tab)
        panel.draw(force=True)
        qtbot.wait(20)
    panel.tabs.setCurrentIndex(0)
    qtbot.wait(100)
    assert window.minimumSizeHint().height() <= room.height()
    assert window.minimumSizeHint().width() <= room.width()
    assert window.size() == room  # it did not grow past the screen by itself
    memory = panel.memory_view
    small_print = [panel.summary, memory.label, memory.tiers_label, memory.backend_label,
                   window.controls.budget_label,
                   *(t for t in panel.heatmap.legend.findChildren(QLabel)
                     if t.objectName() == "legendText")]
    assert len(small_print) >= 5 + 6
    for label in small_print:
        label.ensurePolished()
        # the style sheet's size in points comes back through pixels (10 pt: 10.25)
        assert abs(label.font().pointSizeF() - small) < 0.5, (label.objectName(),
                                                            label.font().pointSizeF())
    line = QFontMetrics(panel.summary.font()).height()
    for view in (panel.time_plots, panel.layer_bars, memory):
        for plot in view.plots.values():
            size = plot.titleLabel.opts["size"]
            assert size.endswith("pt") and abs(float(size[:-2]) - small) < 0.5, size
    for plot in memory.plots.values():  # "process", "system": a point under the titles
        names = plot.legend.items
        assert names
        for _, name in names:
            size = name.opts["size"]
            assert abs(float(size[:-2]) - (small - 1)) < 0.5, size
    title_row = panel.time_plots.plots["mass"].layout.rowMaximumHeight(0)
    assert title_row >= line  # the title row grew with its text
    # the legend's labels whole, and drawn below the heatmap, not over its axis
    heat = panel.heatmap
    assert _cut_widgets(heat.legend) == []
    assert heat.legend.geometry().top() > heat.graphics.geometry().bottom()
    assert heat.height() >= heat.minimumSizeHint().height()
    assert panel.splitter.height() >= panel.splitter.minimumSizeHint().height()
    # the panel keeps its least height; where the window is shorter, its bottom scrolls
    scroll = window.cache_scroll
    assert panel.height() >= panel.minimumSizeHint().height()
    bar = scroll.verticalScrollBar()
    hidden = panel.height() - scroll.viewport().height()
    assert bar.maximum() == max(0, hidden)
    assert bar.isVisible() == (hidden > 0)
    label = window.controls.budget_label
    assert label.height() >= label.heightForWidth(label.width())  # the whole line
    font_pt(window, 0)  # here: the window is closed before the fixture ends, its chat gone
    qtbot.wait(50)
    system = QApplication.font().pointSizeF()
    assert abs(panel.summary.font().pointSizeF() - max(8.0, system - 1)) < 0.5


@pytest.mark.parametrize("pt", [9, 12])
def test_the_per_layer_charts_keep_their_y_labels_apart(font_pt: Any, window: Any,
                                                       qtbot: Any, pt: int) -> None:
    """At 12 pt pyqtgraph's own ticks put five labels (0, 0.05 … 0.20) over each other on
    each per-layer chart's 40 px axis. The charts label 0, half and top where the labels
    are a line of the axis font apart, else 0 and top, and again when the chart's height
    changes."""
    font_pt(window, pt)
    qtbot.wait(50)
    send(qtbot, window, "hi", max_tokens=16)
    window.resize(SMALL - WINDOW_FRAME)
    panel = window.cache_panel
    bars = panel.layer_bars
    panel.tabs.setCurrentWidget(bars)
    panel.draw(force=True)
    qtbot.wait(100)
    for key, plot in bars.plots.items():
        labels = bars.y_tick_labels(key)
        line = QFontMetrics(plot.getAxis("left").font()).height()
        assert labels and labels[0] == "0", (key, labels)
        # centred on their ticks, evenly spaced: a line apart at least
        assert (len(labels) - 1) * line <= plot.vb.height(), (key, labels, plot.vb.height())
    tall = bars.graphics.minimumHeight() * 3
    bars.graphics.setMinimumHeight(tall)  # taller charts: the half-way label too
    qtbot.waitUntil(lambda: all(len(bars.y_tick_labels(k)) == 3 for k in bars.plots),
                    timeout=5_000)
    font_pt(window, 0)  # here: the window is closed before the fixture ends, its chat gone


def test_the_cache_controls_grow_for_a_larger_font_but_keep_a_dragged_height(
        font_pt: Any, window: Any, qtbot: Any) -> None:
    """The right-hand splitter kept the cache controls at the height of the first show's
    font: at 11 pt the budget's line, wrapped onto two lines, was cut to one. They get the
    height they want when it grows; a height the user dragged them to stays while what
    they show changes (a new budget's line)."""
    window.resize(SMALL - WINDOW_FRAME)
    qtbot.wait(100)
    split, controls = window.right_split, window.controls
    least = controls.minimumSizeHint().height()
    dragged = least + 2
    split.setSizes([dragged, sum(split.sizes()) - dragged])  # as a drag of the border
    split.splitterMoved.emit(dragged, 1)
    qtbot.wait(50)
    assert split.sizes()[0] == dragged
    controls.budget.setValue(controls.budget.value() + 1)  # a new line under the slider
    qtbot.waitUntil(lambda: window.model.slots_per_layer == controls.budget.value(),
                    timeout=10_000)
    qtbot.wait(100)
    assert split.sizes()[0] == dragged
    font_pt(window, 12)
    window.resize(window.minimumSizeHint().width(), (SMALL - WINDOW_FRAME).height())
    label = controls.budget_label
    qtbot.waitUntil(lambda: label.heightForWidth(label.width())
                    > label.fontMetrics().lineSpacing() * 1.5, timeout=5_000)  # two lines
    qtbot.waitUntil(lambda: split.sizes()[0] >= controls.sizeHint().height(), timeout=5_000)
    assert label.height() >= label.heightForWidth(label.width())  # the whole line
    font_pt(window, 0)  # here: the window is closed before the fixture ends, its chat gone


def test_a_larger_font_keeps_the_heatmaps_rows_their_height(font_pt: Any, window: Any,
                                                            qtbot: Any) -> None:
    """The heatmap is fitted to its rows at each load; a larger font size afterwards grew
    its legend's lines (the small print follows the font) inside the same splitter share,
    and the rows lost that height: six layers in 50 px at 12 pt on a 1440x900 screen. It
    is fitted again at the new size."""
    window.resize(first_size(QSize(1440, 900)))
    panel = window.cache_panel
    heat = panel.heatmap
    qtbot.wait(100)
    panel.fit_heatmap()  # as at a load in a window of this size
    qtbot.waitUntil(lambda: heat.height() == heat.sizeHint().height(), timeout=5_000)
    rows = heat.graphics.height()
    font_pt(window, 12)
    qtbot.waitUntil(lambda: heat.height() == heat.sizeHint().height(), timeout=5_000)
    assert heat.legend.height() > 0 and heat.graphics.height() >= rows
    font_pt(window, 0)  # here: the window is closed before the fixture ends
