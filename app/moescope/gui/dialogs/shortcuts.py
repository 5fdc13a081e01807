"""Help → Keyboard shortcuts: every shortcut the window has, read from its actions.

Built from the live ``QAction`` list (the menus' and the chat view's), not from a table
kept by hand, so it can never disagree with what the keys do. Grouped by window: the main
window's keys first, then those of each window opened from it (Serve API, Get models, a
dialog), under its title, since a key works only in its own window (the list had mixed
them: "Go to VRAM budget" twice, Alt+B from Get models and Alt+V from the cache controls;
Alt+A for both the serve panel's Address and Answer now). Each line is listed once.
"""

from __future__ import annotations

from collections.abc import Iterable

from PySide6.QtCore import QSize, Qt
from PySide6.QtGui import QAction, QFont, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QLabel,
    QMenu,
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
_POPUPS = (Qt.WindowType.Popup, Qt.WindowType.ToolTip, Qt.WindowType.SplashScreen)
"""Menus, tooltips: windows, but not ones a user works in."""
MAX_SCREEN_FRACTION = 0.9
"""The dialog grows to show every row without scrolling, up to this much of the screen."""


def _plain(text: str) -> str:
    """A label's text without its mnemonic marks ("RAM b&udget" → "RAM budget")."""
    return text.replace("&&", "\0").replace("&", "").replace("\0", "&").rstrip("…").strip()


def label_rows(window: QWidget | None) -> list[tuple[str, str]]:
    """``("Go to RAM budget", "Alt+U")`` for every label of ``window`` itself (not of
    another window opened from it) that moves the keyboard to its control (an ``&`` letter
    and a buddy): Qt registers those as shortcuts without an action, so the action list
    alone missed them."""
    if window is None:
        return []
    rows = []
    for label in window.findChildren(QLabel):
        text, buddy = label.text(), label.buddy()
        mark = text.replace("&&", "").find("&")
        if buddy is None or mark < 0 or mark + 1 >= len(text.replace("&&", "")) \
                or label.window() is not window:
            continue
        letter = text.replace("&&", "")[mark + 1].upper()
        rows.append((f"Go to {_plain(text)}", f"Alt+{letter}"))
    return sorted(set(rows), key=lambda r: r[0].lower())


def _action_rows(actions: Iterable[QAction]) -> list[tuple[str, str]]:
    rows = {}
    for action in actions:
        keys = action.shortcut().toString(QKeySequence.SequenceFormat.NativeText)
        if keys:
            rows[_plain(action.text())] = keys
    return sorted(rows.items(), key=lambda r: r[0].lower())


def _unique(rows: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """``rows`` in order, each line once."""
    return list(dict.fromkeys(rows))


def shortcut_rows(actions: Iterable[QAction], window: QWidget | None = None
                  ) -> list[tuple[str, str]]:
    """The main window's ``(what, keys)``: every action with a shortcut, menu mnemonics
    removed, sorted by what it does; then the labels that jump to a control; then the
    keys widgets handle themselves."""
    return _unique([*_action_rows(actions), *label_rows(window), *EXTRA])


def other_windows(window: QWidget | None) -> list[QWidget]:
    """The windows opened from ``window`` that are still there (Serve API, Get models, a
    dialog), by title; not menus, nor the shortcuts list itself."""
    if window is None:
        return []
    found = [w for w in window.findChildren(QWidget)
             if w.isWindow() and not isinstance(w, (QMenu, ShortcutsDialog))
             and w.windowTitle() and w.windowType() not in _POPUPS]
    return sorted(found, key=lambda w: w.windowTitle().lower())


def window_rows(window: QWidget) -> list[tuple[str, str]]:
    """A window's own shortcuts: its actions' keys and its labels' jumps."""
    actions = [a for w in [window, *window.findChildren(QWidget)] if w.window() is window
               for a in w.actions()]
    return _unique([*_action_rows(actions), *label_rows(window)])


def sections(actions: Iterable[QAction], window: QWidget | None = None
             ) -> list[tuple[str, list[tuple[str, str]]]]:
    """``(window title, rows)``: the main window's first, then each other window with
    a shortcut, each key listed under the window it works in."""
    others: dict[str, list[tuple[str, str]]] = {}
    for other in other_windows(window):  # a dialog made twice (a closed one kept): once
        title = other.windowTitle().replace("&", "")
        others[title] = _unique([*others.get(title, []), *window_rows(other)])
    return [("Main window", shortcut_rows(actions, window)),
            *((title, rows) for title, rows in others.items() if rows)]


class ShortcutsDialog(QDialog):
    def __init__(self, actions: Iterable[QAction], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Keyboard shortcuts")
        layout = QVBoxLayout(self)
        groups = sections(actions, parent)
        self.table = QTableWidget(sum(len(rows) + 1 for _, rows in groups), 2)
        self.table.setAccessibleName("Keyboard shortcuts")
        self.table.setHorizontalHeaderLabels(("Action", "Keys"))
        self.table.verticalHeader().setVisible(False)
        # one line of text a row (the style's default is near twice that): the whole
        # list fits a 768-pixel-high screen without scrolling
        self.table.verticalHeader().setDefaultSectionSize(self.fontMetrics().height() + 6)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        bold = QFont(self.font())
        bold.setBold(True)
        r = 0
        for title, rows in groups:
            head = QTableWidgetItem(title)
            head.setFont(bold)
            self.table.setItem(r, 0, head)
            self.table.setItem(r, 1, QTableWidgetItem(""))
            self.table.setSpan(r, 0, 1, 2)
            r += 1
            for what, keys in rows:
                self.table.setItem(r, 0, QTableWidgetItem(what))
                self.table.setItem(r, 1, QTableWidgetItem(keys))
                r += 1
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
