"""A word-wrapped label whose minimum size does not follow its text.

A plain word-wrapped ``QLabel`` asks for one more line of height with every line its text
has, and for the width of its longest word: the cache panel's stats line, which gains
parts as a chat runs (a RAM tier, a TTFT, an audit), made the main window taller by
itself on a 1024x700 screen, past its bottom edge. This one asks for a fixed number of
lines at least; where its layout has room it still shows every wrapped line, and where
it is given fewer than its text needs, it shows the lines that fit whole, the last one
ending in "…", and the whole text is in its tooltip.

It is not a height-for-width item to its layout: a box layout gives such an item every
line it wraps to, whatever its siblings' minimums, so at the window's least size the stats
line took four lines and the cache panel's splitter below it less than its minimum (the
heatmap's legend was drawn over its axis). Its size hint is the height of its lines at its
width instead, which a layout grants only where there is room.
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent, QTextLayout, QTextOption
from PySide6.QtWidgets import QLabel, QWidget


class WrappedLabel(QLabel):
    """Word-wrapped, at least ``lines`` lines tall and :attr:`MIN_WIDTH` wide whatever
    its text. ``setToolTip`` sets the explanation; :meth:`clipped` says whether the text
    is cut, and then the tooltip adds the whole text."""

    MIN_WIDTH = 80

    def __init__(self, text: str = "", *, lines: int = 2,
                 parent: QWidget | None = None) -> None:
        super().__init__(text, parent)
        self.lines = lines
        self.max_lines: int | None = None
        """Where set, it asks for no more than this many lines (the rest: "…", and the
        whole text in its tooltip)."""
        self._explanation = ""
        self.setWordWrap(True)
        self.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        self._hint_width = -1

    def hasHeightForWidth(self) -> bool:
        """Not to its layout (QLabel sets the flag again with every text)."""
        return False

    def sizeHint(self) -> QSize:
        """Every wrapped line at the width it has (its least height, at least)."""
        hint = super().sizeHint()
        height = self.heightForWidth(self.width()) if self.width() > 0 else hint.height()
        if self.max_lines is not None:
            height = min(height, self._lines_px(self.max_lines))
        return QSize(hint.width(), max(height, self.minimumSizeHint().height()))

    def set_max_lines(self, lines: int | None) -> None:
        if lines != self.max_lines:
            self.max_lines = lines
            self.updateGeometry()
            self._update_tip()

    def minimumSizeHint(self) -> QSize:
        return QSize(self.MIN_WIDTH, self._lines_px(self.lines))

    def _lines_px(self, lines: int) -> int:
        margins = self.contentsMargins()
        return (self.fontMetrics().lineSpacing() * lines + margins.top()
                + margins.bottom() + 2 * self.margin())

    def clipped(self) -> bool:
        """Whether the text needs more height than the label has."""
        return self.isVisible() and self.heightForWidth(self.width()) > self.height()

    def setText(self, text: str) -> None:
        super().setText(text)
        self._update_tip()

    def setToolTip(self, tip: str) -> None:
        self._explanation = tip
        self._update_tip()

    def _update_tip(self) -> None:
        tip = self._explanation
        if self.clipped():
            tip = f"{tip}\n\n{self.text()}" if tip else self.text()
        super().setToolTip(tip)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if self.width() != self._hint_width:  # its lines' height changes with its width
            self._hint_width = self.width()
            self.updateGeometry()
        self._update_tip()

    def shown_lines(self) -> list[str]:
        """The lines drawn: every wrapped line where they fit, else those that fit whole,
        the last one ending in "…" (a line cut across its middle read as a broken
        window)."""
        rect = self.contentsRect().adjusted(self.margin(), self.margin(), -self.margin(),
                                            -self.margin())
        text = self.text()
        layout = QTextLayout(text.replace("\n", "\u2028"), self.font())  # QLabel's breaks
        option = QTextOption()
        option.setWrapMode(QTextOption.WrapMode.WordWrap)
        layout.setTextOption(option)
        layout.beginLayout()
        spans: list[tuple[int, int]] = []
        while True:
            line = layout.createLine()
            if not line.isValid():
                break
            line.setLineWidth(max(1, rect.width()))
            spans.append((line.textStart(), line.textLength()))
        layout.endLayout()
        fit = max(1, rect.height() // max(1, self.fontMetrics().lineSpacing()))
        lines = [text[a:a + n].rstrip("\n ") for a, n in spans]
        if len(lines) <= fit:
            return lines
        rest = text[spans[fit - 1][0]:].replace("\n", " ")
        metrics = self.fontMetrics()

        def fits(cut: str) -> bool:
            return metrics.horizontalAdvance(cut + " …") <= rect.width()

        # whole parts (" · "), else whole words: "tokens/s 23.…" read as another number
        last = ""
        for sep in (" · ", " "):
            parts = rest.split(sep)
            for n in range(len(parts) - 1, 0, -1):
                if fits(sep.join(parts[:n])):
                    last = sep.join(parts[:n]).rstrip(" ·") + " …"
                    break
            if last:
                break
        if not last:  # one word wider than the line
            last = metrics.elidedText(rest, Qt.TextElideMode.ElideRight, rect.width())
        return [*lines[:fit - 1], last]

    def paintEvent(self, event: QPaintEvent) -> None:
        rich = self.textFormat() == Qt.TextFormat.RichText or (
            self.textFormat() == Qt.TextFormat.AutoText and "<" in self.text())
        if rich or not self.clipped():
            super().paintEvent(event)
            return
        painter = QPainter(self)
        painter.setPen(self.palette().color(self.foregroundRole()))
        rect = self.contentsRect().adjusted(self.margin(), self.margin(), -self.margin(),
                                            -self.margin())
        metrics = self.fontMetrics()
        y = rect.top() + metrics.ascent()
        for line in self.shown_lines():
            painter.drawText(QPointF(rect.left(), y), line)
            y += metrics.lineSpacing()
        painter.end()
