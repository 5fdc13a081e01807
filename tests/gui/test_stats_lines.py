"""The cache panel's two stats lines keep one order and each its own line (new-user
review, window rev 5: "now: …" was first in a tall window and second in a short one, and
at 12 pt the label's shortening ran them together, "…TTFT 512 ms last 32 tokens
(quality-first)…"). Real window, real engine on the demo model, Qt offscreen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gui_helpers import load, send
from PySide6.QtCore import QSize

from moescope.gui.widgets.screen_fit import WINDOW_FRAME


def _parts(text: str) -> list[str]:
    return text.split("\n")


def _own_line(line: str, paragraphs: list[str]) -> bool:
    """A drawn line is a piece of one paragraph (its end cut to " …" at most)."""
    piece = line.removesuffix(" …").strip()
    return any(piece in p for p in paragraphs)


def test_the_stats_lines_keep_their_order_and_their_own_lines(
        make_window: Any, font_pt: Any, qtbot: Any, demo: Path) -> None:
    window = make_window()
    load(qtbot, window, demo)
    font_pt(window, 12)
    panel = window.cache_panel
    summary = panel.summary
    send(qtbot, window, "Recite some Shakespeare.", max_tokens=24)
    orders = []
    for size in (QSize(1024, 700), QSize(1366, 768), QSize(1024, 700), QSize(1920, 1080)):
        window.resize(size - WINDOW_FRAME)
        qtbot.waitUntil(lambda s=size: window.height() <= s.height(), timeout=5_000)
        qtbot.wait(50)
        panel.draw(force=True)
        qtbot.waitUntil(lambda: "tok/s" in summary.text(), timeout=5_000)
        paragraphs = _parts(summary.text())
        orders.append([p.split(":")[0].split(" ")[0] for p in paragraphs])
        shown = summary.shown_lines()
        for line in shown:
            assert _own_line(line, paragraphs), (line, paragraphs)
        assert not any("TTFT" in line and "last " in line.split("TTFT")[1] for line in shown)
        # the numbers stay in view however short the label is
        joined = " ".join(shown)
        for part in ("last ", "hit ", "mass/token"):
            assert part in joined, (part, shown)
    assert orders == [["now", "last"]] * 4
    font_pt(window, 0)


def test_a_short_label_gives_the_first_line_way(make_window: Any, qtbot: Any,
                                                demo: Path) -> None:
    """Two lines of room for a long "now" line and the numbers: each gets a line, the
    numbers' whole where it fits, each cut at a whole part with " …" otherwise; the
    numbers never share a line with the "now" line."""
    from moescope.gui.cache.panel import StatsLabel

    window = make_window()
    label = StatsLabel(lines=2)
    label.setParent(window)
    now = "now: quality-first · 16/64 slots per layer (25.0% resident) · token 24 · " \
          "latest answer's TTFT 512 ms"
    recent = "last 24 tokens (quality-first) · hit 80% · mass/token 0.012 · 12.0 tok/s"
    label.setText(f"{now}\n{recent}")
    width = label.fontMetrics().horizontalAdvance(recent) + 20
    label.setGeometry(0, 0, width, label.minimumSizeHint().height())
    label.show()
    assert label.clipped()
    shown = label.shown_lines()
    assert len(shown) == 2
    assert shown[0].startswith("now: ") and shown[0].endswith(" …")
    assert shown[1] == recent
    # one line of room: the numbers only
    label.setGeometry(0, 0, width, label.fontMetrics().lineSpacing() + 2)
    assert label.shown_lines() == [recent]
