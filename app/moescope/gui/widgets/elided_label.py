"""A one-line label that never sets its window's minimum width.

A plain ``QLabel`` asks for the width of its whole text; a chat title (any length, once
renamed), a model name in the status bar or a heatmap title with a long model's numbers
then make the window impossible to narrow below that, past a laptop screen's width.
"""

from __future__ import annotations

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QPainter, QPaintEvent, QResizeEvent
from PySide6.QtWidgets import QLabel


class ElidedLabel(QLabel):
    """A long text ends in "…" where it does not fit, whole in the tooltip; ``text()``
    stays the whole text."""

    MIN_WIDTH = 80

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        return QSize(min(hint.width(), self.MIN_WIDTH), hint.height())

    def setText(self, text: str) -> None:
        super().setText(text)
        self._update_tip()

    def elided(self) -> str:
        """The text as painted at the current width."""
        return self.fontMetrics().elidedText(self.text(), Qt.TextElideMode.ElideRight,
                                             self.contentsRect().width())

    def _update_tip(self) -> None:
        self.setToolTip(self.text() if self.elided() != self.text() else "")

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._update_tip()

    def paintEvent(self, event: QPaintEvent) -> None:
        elided = self.elided()
        if elided == self.text():
            super().paintEvent(event)
            return
        painter = QPainter(self)
        self.style().drawItemText(painter, self.contentsRect(), int(self.alignment()),
                                  self.palette(), self.isEnabled(), elided,
                                  self.foregroundRole())
