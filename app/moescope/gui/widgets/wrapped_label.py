"""A word-wrapped label whose minimum size does not follow its text.

A plain word-wrapped ``QLabel`` asks for one more line of height with every line its text
has, and for the width of its longest word: the cache panel's stats line, which gains
parts as a chat runs (a RAM tier, a TTFT, an audit), made the main window taller by
itself on a 1024x700 screen, past its bottom edge. This one asks for a fixed number of
lines at least; where its layout has room it still shows every wrapped line, and where
it is given fewer than its text needs, the whole text is in its tooltip.

It is not a height-for-width item to its layout: a box layout gives such an item every
line it wraps to, whatever its siblings' minimums, so at the window's least size the stats
line took four lines and the cache panel's splitter below it less than its minimum (the
heatmap's legend was drawn over its axis). Its size hint is the height of its lines at its
width instead, which a layout grants only where there is room.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QResizeEvent
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
        return QSize(hint.width(), max(height, self.minimumSizeHint().height()))

    def minimumSizeHint(self) -> QSize:
        margins = self.contentsMargins()
        height = (self.fontMetrics().lineSpacing() * self.lines + margins.top()
                  + margins.bottom() + 2 * self.margin())
        return QSize(self.MIN_WIDTH, height)

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
