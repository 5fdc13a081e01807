"""Help → Keyboard shortcuts: every shortcut the window has, read from its actions.

Built from the live ``QAction`` list (the menus' and the chat view's), not from a table
kept by hand, so it can never disagree with what the keys do.
"""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QSize
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

EXTRA: tuple[tuple[str, str], ...] = (
    ("Send the message", "Enter"),
    ("New line in the message", "Shift+Enter"),
    ("Answer now (while a thinking model thinks)", "Alt+A"),
)
"""Keys handled by widgets rather than actions (Alt+A is the *Answer now* button's, shown
only while a model thinks)."""
MAX_SCREEN_FRACTION = 0.8
"""The dialog grows to show every row without scrolling, up to this much of the screen."""


def _plain(text: str) -> str:
    """A label's text without its mnemonic marks ("RAM b&udget" → "RAM budget")."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").rstrip("…").strip()


def label_rows(window: QWidget | None) -> list[tuple[str, str]]:
    """``("Go to RAM budget", "Alt+U")`` for every label that moves the keyboard to its
    control (an ``&`` letter and a buddy): Qt registers those as shortcuts without an
    action, so the action list alone missed them."""
    if window is None:
        return []
    rows = []
    for label in window.findChildren(QLabel):
        text, buddy = label.text(), label.buddy()
        mark = text.replace("&&", "").find("&")
        if buddy is None or mark < 0 or mark + 1 >= len(text.replace("&&", "")):
            continue
        letter = text.replace("&&", "")[mark + 1].upper()
        rows.append((f"Go to {_plain(text)}", f"Alt+{letter}"))
    return sorted(set(rows), key=lambda r: r[0].lower())


def shortcut_rows(actions: Iterable[QAction], window: QWidget | None = None
                  ) -> list[tuple[str, str]]:
    """``(what, keys)`` for every action with a shortcut, menu mnemonics removed, sorted by
    what it does; then the labels that jump to a control; then the keys widgets handle
    themselves."""
    rows = {}
    for action in actions:
        keys = action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
        if keys:
            rows[_plain(action.text())] = keys
    return sorted(rows.items(), key=lambda r: r[0].lower()) + label_rows(window) + list(EXTRA)


class ShortcutsDialog(QDialog):
    def __init__(self, actions: Iterable[QAction], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        layout = QVBoxLayout(self)
        rows = shortcut_rows(actions, parent)
        self.table = QTableWidget(len(rows), 2)
        self.table.setAccessibleName("Keyboard shortcuts")
        self.table.setHorizontalHeaderLabels(("Action", "Keys"))
        self.table.verticalHeader().setVisible(False)
        # one line of text a row (the style's default is near twice that): the whole
        # list fits a 768-pixel-high screen without scrolling
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 6)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        for r, (what, keys) in enumerate(rows):
            self.table.setItem(r, 0, QTableWidgetItem(what))
            self.table.setItem(r, 1, QTableWidgetItem(keys))
        self.table.resizeColumnsToContents()
        self.table.horizontalHeader().setStretchLastSection(True)
        layout.addWidget(self.table)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.resize(self._fitting_size(buttons.sizeHint().height()))

    def _fitting_size(self, buttons_height: int) -> QSize:
        """Every row and both columns in view (no scroll bar for the last two rows), within
        the screen."""
        table = self.table
        frame = 2 * table.frameWidth()
        margins = self.layout().contentsMargins()
        width = table.horizontalHeader().length() + frame + margins.left() + margins.right()
        height = (table.horizontalHeader().sizeHint().height()
                  + table.verticalHeader().length() + frame + buttons_height
                  + self.layout().spacing() + margins.top() + margins.bottom())
        screen = self.screen().availableGeometry() if self.screen() else None
        if screen is not None:
            width = min(width, int(screen.width() * MAX_SCREEN_FRACTION))
            height = min(height, int(screen.height() * MAX_SCREEN_FRACTION))
        return QSize(max(width, 460), height)
