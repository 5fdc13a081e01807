"""A long word-wrapped note that stays whole in a small window: it scrolls.

A word-wrapped ``QLabel`` in a box layout gets the height its layout can spare, not the
height of its lines: the what-if's note on its cost model (eight lines at 500 px wide)
was given five in a 500x400 trace window, cut at the top and the bottom with no way to
read the rest (its tooltip explains the numbers; it does not repeat them). This area
asks for every line where the window has room and for a few where it has not; then a
scroll bar reaches the rest, and the text can still be selected and copied.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QSizePolicy, QWidget


class NoteArea(QScrollArea):
    """Holds ``label`` (word-wrapped here): as tall as its lines where its layout has
    room, ``lines`` lines at least, with a vertical scroll bar when it is given fewer.
    With ``most``, it asks for that many lines at most (the rest scrolls): a note above a
    table that takes the room a layout gives beyond its siblings' wishes."""

    def __init__(self, label: QLabel, *, lines: int = 3, most: int | None = None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.label = label
        self.lines = lines
        self.most = most
        label.setWordWrap(True)
        label.setAlignment(Qt.AlignmentFlag.AlignLeft | Qt.AlignmentFlag.AlignTop)
        label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.setWidget(label)
        self.setWidgetResizable(True)
        self.setFrameShape(QFrame.Shape.NoFrame)
        self.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.viewport().setAutoFillBackground(False)
        label.setAutoFillBackground(False)
        self.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the label's text is read, not typed
        self.setSizePolicy(self.sizePolicy().horizontalPolicy(),
                           QSizePolicy.Policy.Preferred)  # spare height goes to its siblings
        label.installEventFilter(self)
        # a new text: the label asks its parent, the viewport, for a layout; the lines it
        # needs changed, so this area asks its own layout again
        self.viewport().installEventFilter(self)
        self._hint_width = -1

    def _lines_px(self, width: int) -> int:
        return self.label.heightForWidth(max(width, 1))

    def _height_of(self, lines: int) -> int:
        margins = self.label.contentsMargins()
        return (self.label.fontMetrics().lineSpacing() * lines + margins.top()
                + margins.bottom() + 2 * self.label.margin())

    def whole_px(self) -> int:
        """The height of every line at the width it has (no scroll bar)."""
        return self._lines_px(self.width() - 2 * self.frameWidth()) + 2 * self.frameWidth()

    def lines_px(self, lines: int) -> int:
        """The height of ``lines`` lines of its font."""
        return self._height_of(lines) + 2 * self.frameWidth()

    def set_most(self, most: int | None) -> None:
        """Ask for ``most`` lines at most (None: every line)."""
        if most != self.most:
            self.most = most
            self.updateGeometry()

    def sizeHint(self) -> QSize:
        """Every line at the width it has, with no scroll bar (``most`` lines at most)."""
        hint = super().sizeHint()
        width = self.width() if self.width() > 0 else hint.width()
        frame = 2 * self.frameWidth()
        need = self._lines_px(width - frame)
        if self.most is not None:
            need = min(need, self._height_of(self.most))
        return QSize(hint.width(), need + frame)

    def minimumSizeHint(self) -> QSize:
        """``lines`` lines of the label's font (fewer if its text has fewer)."""
        few = self._height_of(self.lines)
        frame = 2 * self.frameWidth()
        width = self.width() if self.width() > 0 else super().sizeHint().width()
        height = min(few, self._lines_px(width - frame)) + frame
        return QSize(super().minimumSizeHint().width(), height)

    def clipped(self) -> bool:
        """Whether part of the text is out of view (the scroll bar reaches it)."""
        bar = self.verticalScrollBar()
        return bar.maximum() > bar.minimum()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (watched is self.label and event.type() in (
                QEvent.Type.FontChange, QEvent.Type.StyleChange)) or (
                watched is self.viewport() and event.type() == QEvent.Type.LayoutRequest):
            self.updateGeometry()
        return super().eventFilter(watched, event)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if self.width() != self._hint_width:  # its lines' height changes with its width
            self._hint_width = self.width()
            self.updateGeometry()
