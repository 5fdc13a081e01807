"""Compare policies at 12 pt on the demo model (new-user review, window rev 5): after a
run the notes were 2.5-line scroll boxes cut mid-sentence, a column needed a sideways
scroll, and "vs Exact" set a 9-token Exact answer against 64-token ones ("2.60×") with
the only caveat in the cut-off note. Real window, real engine, Qt offscreen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gui_helpers import load, send
from PySide6.QtCore import Qt

from moescope.gui.dialogs.compare import COLUMNS, LENGTH_NOTE, OPTIONAL_COLUMNS
from moescope.gui.widgets.screen_fit import WINDOW_FRAME


@pytest.fixture
def window(make_window: Any, qtbot: Any, demo: Path, font_pt: Any) -> Any:
    w = make_window()
    load(qtbot, w, demo, budget="25%", policy="quality-first", n_ctx=512)
    font_pt(w, 12)
    send(qtbot, w, "Recite some Shakespeare.", max_tokens=8, timeout=60_000)
    return w


def _run(window: Any, qtbot: Any, tokens: int, score: bool = False) -> Any:
    dialog = window.open_compare_dialog()
    assert dialog is not None
    dialog.max_tokens.setValue(tokens)
    dialog.score.setChecked(score)
    with qtbot.waitSignal(window.client.worker.compareFinished, timeout=120_000):
        qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.result is not None, timeout=10_000)
    qtbot.wait(100)  # the notes and the table fitted
    return dialog


def _cell(dialog: Any, row: int, column: str) -> str:
    return dialog.table.item(row, COLUMNS.index(column)).text()


def test_speed_ups_over_different_lengths_are_marked_and_said(
        window: Any, qtbot: Any, font_pt: Any) -> None:
    dialog = _run(window, qtbot, 64)
    result = dialog.result
    ref = result.reference
    lengths = [len(a.token_ids) for a in result.answers]
    assert len(set(lengths)) > 1, lengths  # the demo's Exact ends before 64 tokens here
    for r, a in enumerate(result.answers):
        assert _cell(dialog, r, "Tokens") == str(len(a.token_ids))
        if r:
            marked = _cell(dialog, r, "vs Exact").endswith("×*")
            assert marked == (len(a.token_ids) != len(ref.token_ids))
    # the caveat is in the first lines of the note, in view without scrolling
    status = dialog.status.text().split("\n")
    assert status[1] == LENGTH_NOTE
    area = dialog.status_area
    assert area.height() >= min(area.whole_px(), area.lines_px(3)) - 1
    dialog.reject()
    # below the shortest answer every answer has the same length: nothing to mark
    dialog = _run(window, qtbot, 4)
    assert {len(a.token_ids) for a in dialog.result.answers} == {4}
    assert not any(_cell(dialog, r, "vs Exact").endswith("*")
                   for r in range(dialog.table.rowCount()))
    assert LENGTH_NOTE not in dialog.status.text()
    dialog.reject()
    font_pt(window, 0)  # here: the window is closed before the fixture ends


def test_the_table_and_its_intro_need_no_scrolling_at_12pt(window: Any, qtbot: Any,
                                                           font_pt: Any) -> None:
    """Columns no row has a value for (no audits, the chat not scored) are hidden, the
    dialog grows to its columns where the screen has room, and the intro is whole."""
    dialog = _run(window, qtbot, 16)
    table = dialog.table
    for name in OPTIONAL_COLUMNS:
        assert table.isColumnHidden(COLUMNS.index(name))
    # every column in view, or the dialog as wide as the screen lets it be (offscreen's
    # screen is 800 px)
    most = dialog.screen().availableGeometry().width() - WINDOW_FRAME.width()
    assert table.horizontalHeader().length() <= table.viewport().width() \
        or dialog.width() == most
    intro = dialog.intro_area
    qtbot.waitUntil(lambda: intro.height() >= intro.whole_px() - 1, timeout=5_000)
    dialog.reject()
    # scored: the chat's perplexity column is there
    send(qtbot, window, "And the ships?", max_tokens=8, timeout=60_000)
    dialog = _run(window, qtbot, 4, score=True)
    assert not dialog.table.isColumnHidden(COLUMNS.index("Chat perplexity"))
    dialog.reject()
    font_pt(window, 0)  # here: the window is closed before the fixture ends
