"""The stats line's label, given fewer lines than its text needs (the cache panel at
11 pt on a 1024x700 screen), shows whole lines, the last ending in "…", not a line cut
across its middle; the whole text stays in its tooltip."""

from __future__ import annotations

from typing import Any

from moescope.gui.widgets.wrapped_label import WrappedLabel

TEXT = ("quality-first · 12/48 slots per layer · hit 71% · substituted mass 0.031 per token · "
        "tokens/s 23.4 · TTFT 0.41 s · RAM tier 96/512 · disk 1.2 MB/token · quality cost "
        "+0.42% expected on the model's own text [0.10 to 0.81%] · 12 audits")


def test_a_cut_text_shows_whole_lines_and_ends_in_an_ellipsis(qtbot: Any) -> None:
    label = WrappedLabel(TEXT, lines=2)
    qtbot.addWidget(label)
    label.setToolTip("What the numbers mean.")
    spacing = label.fontMetrics().lineSpacing()
    label.setFixedSize(260, int(spacing * 2.6))  # two lines and a part of a third
    label.show()
    qtbot.waitExposed(label)
    label.setText(TEXT)  # the tooltip follows the size it has now
    assert label.clipped()
    shown = label.shown_lines()
    assert len(shown) == 2 and shown[-1].endswith(" …")
    assert shown[-1][:-2] + " · " in TEXT  # cut between parts, never inside a number
    width = label.contentsRect().width()
    assert all(label.fontMetrics().horizontalAdvance(line) <= width for line in shown)
    assert TEXT in label.toolTip() and "What the numbers mean." in label.toolTip()
    assert not label.grab().isNull()  # drawn by its own paint event
    # given room, every line, none elided
    label.setFixedSize(260, spacing * 12)
    assert not label.clipped()
    whole = label.shown_lines()
    assert len(whole) > 2 and " ".join(whole).split() == TEXT.split()
    assert not any(line.endswith("…") for line in whole)
