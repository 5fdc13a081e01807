"""The chat list: search by title and message text, new, rename, delete. It only emits
requests; the window asks the store and calls :meth:`ChatListPanel.set_chats` back."""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import QEvent, Qt, Signal
from PySide6.QtGui import QAction, QKeySequence, QResizeEvent
from PySide6.QtWidgets import (
    QGridLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from moescope.session.store import Chat

MIN_WIDTH = 110
"""The chat list's narrowest (a small screen gives its width to the chat and the cache)."""


class ChatListPanel(QWidget):
    chatSelected = Signal(int)
    newRequested = Signal()
    renameRequested = Signal(int)
    deleteRequested = Signal(int)
    searchChanged = Signal(str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 0, 6)
        self.setMinimumWidth(MIN_WIDTH)
        self.setMaximumWidth(320)  # a wide window gives its width to the chat and the cache
        self.search = QLineEdit()
        self.search.setPlaceholderText("Search chats")
        self.search.setAccessibleName("Search chats by title and text")
        self.search.setToolTip("Finds chats whose title or any message contains this")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self.searchChanged)
        layout.addWidget(self.search)
        self.list = QListWidget()
        self.list.setAccessibleName("Chats")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        # cut in the middle: a title's end shows, so that a branch ("… (branch)") and the
        # chat it came from do not read alike in a narrow list
        self.list.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.list.setUniformItemSizes(True)
        self.list.currentItemChanged.connect(self._current_changed)
        # Delete in the list deletes the chat (after asking); only there, so that Delete in
        # a text box or on a slider never offers to delete a chat
        self.delete_action = QAction("Delete chat (in the chat list)", self.list)
        self.delete_action.setShortcut(QKeySequence(QKeySequence.StandardKey.Delete))
        self.delete_action.setShortcutContext(Qt.ShortcutContext.WidgetShortcut)
        self.delete_action.triggered.connect(
            lambda: self._emit_for_current(self.deleteRequested))
        self.list.addAction(self.delete_action)
        layout.addWidget(self.list, 1)
        # two rows: a narrow list cuts no label; Rename and Delete side by side where
        # they fit, one under the other where they do not (_place_buttons)
        top, row = QHBoxLayout(), QGridLayout()
        row.setContentsMargins(0, 0, 0, 0)
        self._button_grid = row
        self.new_button = QPushButton("&New")
        self.rename_button = QPushButton("Rena&me")
        self.delete_button = QPushButton("&Delete")
        for b, name in ((self.new_button, "New chat"), (self.rename_button, "Rename chat"),
                        (self.delete_button, "Delete chat")):
            b.setAccessibleName(name)
            if b is self.new_button:
                top.addWidget(b)
        row.addWidget(self.rename_button, 0, 0)
        row.addWidget(self.delete_button, 0, 1)
        self.new_button.clicked.connect(self.newRequested)
        self.rename_button.clicked.connect(lambda: self._emit_for_current(self.renameRequested))
        self.delete_button.clicked.connect(lambda: self._emit_for_current(self.deleteRequested))
        layout.addLayout(top)
        layout.addLayout(row)
        self._quiet = False
        self._fit_buttons()

    def changeEvent(self, event: QEvent) -> None:
        super().changeEvent(event)
        if event.type() in (QEvent.Type.FontChange, QEvent.Type.StyleChange):
            self._fit_buttons()

    def _side_by_side_px(self) -> int:
        """The list's width that has Rename and Delete side by side."""
        margins = self.layout().contentsMargins()
        return (self.rename_button.sizeHint().width() + self.delete_button.sizeHint().width()
                + self._button_grid.horizontalSpacing() + margins.left() + margins.right())

    def _fit_buttons(self) -> None:
        """As narrow as the widest button allows: a larger font (Preferences) cut
        "Rename" to "enam" in a column that had fitted it. Rename and Delete side by side
        had made it 176 px at least with an 11 pt font (the window then 1088 px wide);
        where they do not fit side by side they go one under the other."""
        margins = self.layout().contentsMargins()
        widest = max(b.sizeHint().width() for b in (self.new_button, self.rename_button,
                                                    self.delete_button))
        self.setMinimumWidth(max(MIN_WIDTH, min(widest + margins.left() + margins.right(),
                                                self.maximumWidth())))
        self._place_buttons()

    def _place_buttons(self) -> None:
        grid = self._button_grid
        want = (0, 1) if self.width() >= self._side_by_side_px() else (1, 0)
        row, column, _rows, _columns = grid.getItemPosition(grid.indexOf(self.delete_button))
        if (row, column) != want:
            grid.removeWidget(self.delete_button)
            grid.addWidget(self.delete_button, *want)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._place_buttons()

    def set_chats(self, chats: Sequence[Chat], current: int | None) -> None:
        """Refill the list without re-emitting a selection."""
        self._quiet = True
        self.list.clear()
        for chat in chats:
            item = QListWidgetItem(chat.title)
            item.setData(Qt.ItemDataRole.UserRole, chat.id)
            item.setToolTip(chat.title)
            self.list.addItem(item)
            if chat.id == current:
                self.list.setCurrentItem(item)
        self._quiet = False

    def titles(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def current_id(self) -> int | None:
        item = self.list.currentItem()
        return int(item.data(Qt.ItemDataRole.UserRole)) if item else None

    def _current_changed(self, item: QListWidgetItem | None, _prev: object) -> None:
        if item is not None and not self._quiet:
            self.chatSelected.emit(int(item.data(Qt.ItemDataRole.UserRole)))

    def _emit_for_current(self, signal: Signal) -> None:
        chat_id = self.current_id()
        if chat_id is not None:
            signal.emit(chat_id)  # type: ignore[attr-defined]
