"""A panel that scrolls up and down where its window is shorter than the panel's least
height, instead of making the window taller or its text smaller.

The cache panel's small print (stats line, heatmap legend, Memory lines, plot titles)
was held at 8 pt so that the window's least height fitted a 1024x700 screen at 11 pt:
at the user's font size its lines, and the legend's rows, made the window 37 px taller
than the screen's work area. In this area the panel keeps its least height (nothing in
it is squeezed or drawn over) and a scroll bar reaches its bottom; where the window has
room, the panel fills it as before and no scroll bar shows.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtWidgets import QFrame, QScrollArea, QStyle, QWidget

LEAST_PX = 120
"""The area's own least height: a few lines of the panel and its scroll bar."""


class ScrollColumn(QScrollArea):
    """Holds ``panel`` at the area's width, and at its height or the panel's least height,
    whichever is more (a vertical scroll bar then reaches the rest); never scrolls
    sideways: it is as narrow as the panel can be, plus the scroll bar."""

    def __init__(self, panel: QWidget, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.panel = panel
        self.setWidget(panel)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the panel's own parts take the focus
        self.viewport().setAutoFillBackground(False)
        panel.setAutoFillBackground(False)

    def _bar_px(self) -> int:
        return self.style().pixelMetric(QStyle.PixelMetric.PM_ScrollBarExtent, None, self)

    def sizeHint(self) -> QSize:
        return self.panel.sizeHint() + QSize(self._bar_px(), 0)

    def minimumSizeHint(self) -> QSize:
        least = self.panel.minimumSizeHint()
        return QSize(least.width() + self._bar_px(), min(least.height(), LEAST_PX))

    def scrolls(self) -> bool:
        """Whether part of the panel is out of view (its scroll bar shows)."""
        bar = self.verticalScrollBar()
        return bar.maximum() > bar.minimum()

    def viewportEvent(self, event: QEvent) -> bool:
        if event.type() == QEvent.Type.LayoutRequest:
            # the panel's least size changed (a font, a legend row): it asked its parent,
            # the viewport, for a layout; this area asks its own layout again
            self.updateGeometry()
        return super().viewportEvent(event)
