"""A layout that wraps its items onto more rows when it is too narrow for one.

Qt has none built in (this is its documented "flow layout" example, trimmed): a row of
legend entries in a plain ``QHBoxLayout`` makes its widest row the window's minimum
width, which kept the main window from ever being narrower than 1360 pixels.
"""

from __future__ import annotations

from PySide6.QtCore import QMargins, QPoint, QRect, QSize, Qt
from PySide6.QtWidgets import QLayout, QLayoutItem, QWidget


class FlowLayout(QLayout):
    """Items left to right, wrapping to a new row when the next one does not fit.
    ``reserve_hidden``: the height is that of every item shown, hidden ones too, so
    showing one never makes the layout (and its window) taller; the hidden ones take no
    room in the rows."""

    def __init__(self, parent: QWidget | None = None, *, spacing: int = 8,
                 row_spacing: int = 2, reserve_hidden: bool = False) -> None:
        super().__init__(parent)
        self._items: list[QLayoutItem] = []
        self.reserve_hidden = reserve_hidden
        self._spacing = spacing
        self._row_spacing = row_spacing
        self.setContentsMargins(0, 0, 0, 0)

    def addItem(self, item: QLayoutItem) -> None:
        self._items.append(item)

    def count(self) -> int:
        return len(self._items)

    def itemAt(self, index: int) -> QLayoutItem | None:
        return self._items[index] if 0 <= index < len(self._items) else None

    def takeAt(self, index: int) -> QLayoutItem | None:
        return self._items.pop(index) if 0 <= index < len(self._items) else None

    def expandingDirections(self) -> Qt.Orientation:
        return Qt.Orientation(0)

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self._height(QRect(0, 0, width, 0))

    def _height(self, rect: QRect) -> int:
        height = self._arrange(rect, move=False)
        if self.reserve_hidden:
            height = max(height, self._arrange(rect, move=False, every=True))
        return height

    def setGeometry(self, rect: QRect) -> None:
        super().setGeometry(rect)
        self._arrange(rect, move=True)
        height = self._height(rect)
        # ask for the rows it wraps to: a parent layout that gives a height-for-width
        # item only its one-row minimum (a splitter pane) would let the rows overlap
        # whatever is below
        owner = self.parentWidget()
        if owner is not None and owner.minimumHeight() != height:
            owner.setMinimumHeight(height)
            # a splitter above does not pass its pane's new minimum on: its own stayed as
            # it was until something else asked for a layout, and the window then grew
            # by itself, long after the resize that wrapped the rows
            above = owner.parentWidget()
            while above is not None and not above.isWindow():
                above.updateGeometry()
                above = above.parentWidget()

    def sizeHint(self) -> QSize:
        """One row of everything (what it would like), as tall as its tallest item."""
        width = sum(i.sizeHint().width() for i in self._items)
        width += self._spacing * max(len(self._items) - 1, 0)
        height = max((i.sizeHint().height() for i in self._items), default=0)
        return QSize(width, height).grownBy(self.contentsMargins())

    def minimumSize(self) -> QSize:
        """As narrow as its widest item: the rest wraps."""
        size = QSize()
        for item in self._items:
            size = size.expandedTo(item.minimumSize())
        return size.grownBy(self.contentsMargins())

    def _arrange(self, rect: QRect, *, move: bool, every: bool = False) -> int:
        """Place the items (``move``) and return the height they take; ``every``: as if
        the hidden ones were shown too."""
        margins: QMargins = self.contentsMargins()
        area = rect.marginsRemoved(margins)
        x, y, row_height = area.x(), area.y(), 0
        for item in self._items:
            widget = item.widget()
            if widget is not None and widget.isHidden():
                if not every:
                    continue
                hint = widget.sizeHint()
            else:
                hint = item.sizeHint()
            if x > area.x() and x + hint.width() > area.right() + 1:
                x, y = area.x(), y + row_height + self._row_spacing
                row_height = 0
            if move:
                item.setGeometry(QRect(QPoint(x, y), hint))
            x += hint.width() + self._spacing
            row_height = max(row_height, hint.height())
        return y + row_height - rect.y() + margins.bottom()
