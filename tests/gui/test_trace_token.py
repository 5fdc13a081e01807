"""A reopened trace's heatmap at any of its tokens: the token slider draws where each
expert was after that token and what its rows did, as the live window drew it then."""

from __future__ import annotations

from typing import Any

import numpy as np
from PySide6.QtCore import Qt

from moescope.session.snapshots import CELL_LABELS, cell_states


def test_the_slider_draws_the_heatmap_at_the_chosen_token(trace_window: Any,
                                                          qtbot: Any) -> None:
    window = trace_window
    tokens, reopened = window.tokens, window.reopened
    panel, slider = window.panel, window.token_slider
    n = len(tokens)
    assert n > 10 and slider.isVisible() and slider.value() == n - 1  # the last at first
    last_image = panel.heatmap.image.image.copy()
    rows_of = panel.model.rows_of
    seen = set()
    for i in (0, n // 2, n - 2):
        slider.setValue(i)
        resident = reopened.resident(i)
        want = cell_states(resident, tokens[i].events, rows_of)
        np.testing.assert_array_equal(panel.heatmap.image.image, want, err_msg=str(i))
        assert f"token {tokens[i].step}" in panel.heatmap.title.text()
        assert window.token_label.text() == f"token {tokens[i].step} of {tokens[-1].step}"
        seen.add(want.tobytes())
    assert len(seen) > 1  # the tokens differ: the slider moved the drawing
    slider.setFocus()
    qtbot.keyClick(slider, Qt.Key.Key_End)  # back to the last: the live window's last frame
    assert slider.value() == n - 1 and panel.model.shown is None
    np.testing.assert_array_equal(panel.heatmap.image.image, last_image)
    want = cell_states(tokens[-1].resident, tokens[-1].events, rows_of)
    np.testing.assert_array_equal(last_image, want)
    # what the hover says of a cell: the state drawn at the chosen token
    i = next(i for i in range(n) if reopened.resident(i).any())
    slider.setValue(i)
    cells = cell_states(reopened.resident(i), tokens[i].events, rows_of)
    for row, expert in np.argwhere(reopened.resident(i))[:3]:
        label = CELL_LABELS[int(cells[row, expert])]
        assert label in panel.model.tooltip(int(row), int(expert)).splitlines()[1]
    assert tokens[i].resident is None  # the tokens are left as read (bits kept apart)
    # beside the tabs, for the Plots tab only
    window.tabs.setCurrentWidget(window.whatif)
    assert not slider.isVisible()
    window.tabs.setCurrentWidget(panel)
    assert slider.isVisible()


def test_a_click_in_a_plot_shows_that_tokens_heatmap(trace_window: Any, qtbot: Any) -> None:
    """Clicking a spike in the per-token plots shows the heatmap at that token, and a
    dashed line marks it in every plot."""
    from PySide6.QtCore import QPointF

    window = trace_window
    tokens, plots = window.tokens, window.panel.time_plots
    window.resize(980, 760)
    qtbot.waitExposed(window)
    plots.graphics.show()
    target = len(tokens) // 3
    plot = plots.plots["mass"]
    low, high = plot.vb.viewRange()[1]
    scene = plot.vb.mapViewToScene(QPointF(tokens[target].step, (low + high) / 2))
    point = plots.graphics.mapFromScene(scene)
    qtbot.mouseClick(plots.graphics.viewport(), Qt.MouseButton.LeftButton, pos=point)
    qtbot.waitUntil(lambda: window.token_slider.value() == target, timeout=5_000)
    assert f"token {tokens[target].step}" in window.panel.heatmap.title.text()
    assert all(line.isVisible() and line.value() == tokens[target].step
               for line in plots.cursor_lines)
    window.token_slider.setValue(len(tokens) - 1)  # the last: no mark
    assert not any(line.isVisible() for line in plots.cursor_lines)
