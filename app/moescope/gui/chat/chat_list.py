"""The chat list: search by title and message text, new, rename, delete. It only emits
requests; the window asks the store and calls :meth:`ChatListPanel.set_chats` back."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from PySide6.QtCore import (
    QDate,
    QDateTime,
    QEvent,
    QLocale,
    QModelIndex,
    QPersistentModelIndex,
    Qt,
    Signal,
)
from PySide6.QtGui import QAction, QFont, QFontMetrics, QKeySequence, QResizeEvent
from PySide6.QtWidgets import (
    QApplication,
    QGridLayout,
    QHBoxLayout,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QVBoxLayout,
    QWidget,
)

from moescope.session.store import Chat

MIN_WIDTH = 110
"""The chat list's narrowest (a small screen gives its width to the chat and the cache)."""
UPDATED_ROLE = Qt.ItemDataRole.UserRole + 1
"""An item's chat's last change (seconds since the epoch)."""
ELLIPSIS = "…"


def chat_time(updated: float) -> str:
    """A chat's last change in the locale's short date and time ("12/3/26 2:05 PM")."""
    when = QDateTime.fromSecsSinceEpoch(int(updated))
    return QLocale().toString(when, QLocale.FormatType.ShortFormat)


def short_time(updated: float) -> str:
    """A chat's last change as short as tells it: the time today, else the date."""
    when = QDateTime.fromSecsSinceEpoch(int(updated))
    if when.date() == QDate.currentDate():
        return QLocale().toString(when.time(), QLocale.FormatType.ShortFormat)
    return QLocale().toString(when.date(), QLocale.FormatType.ShortFormat)


def distinct_titles(titles: Sequence[str], updated: Sequence[float], width: int,
                    metrics: QFontMetrics) -> list[str]:
    """``titles`` as the list shows them in ``width`` pixels, told apart.

    Each is cut in the middle (a branch's "(branch)" shows). Titles that would then read
    alike ("Explain quantum computing in…" and "Explain quantum entanglement in…", both
    "Explain q…ple terms") drop the words they start with alike for "…", so that the words
    which differ show; titles that are the same whole are told apart by each chat's last
    change (``updated``) after them: the time today, else the date, else both. The whole
    title and its date are in the item's tooltip."""
    shown = [metrics.elidedText(t, Qt.TextElideMode.ElideMiddle, width) for t in titles]

    def settle(rows: list[int], done: int) -> None:
        """``rows`` read alike; their titles share words up to ``done`` already dropped."""
        group = [titles[i] for i in rows]
        if len(set(group)) == 1:  # the same title: the chats' times tell them apart
            stamps = {i: short_time(updated[i]) for i in rows}
            if len(set(stamps.values())) < len(rows):
                stamps = {i: chat_time(updated[i]) for i in rows}
            if len(set(stamps.values())) == 1:
                return  # changed in the same minute: their order in the list tells
            for i in rows:
                stamp = f" · {stamps[i]}"
                room = width - metrics.horizontalAdvance(stamp)
                shown[i] = (metrics.elidedText(titles[i], Qt.TextElideMode.ElideMiddle, room)
                            + stamp if room > 4 * metrics.averageCharWidth() else
                            metrics.elidedText(titles[i] + stamp, Qt.TextElideMode.ElideLeft,
                                               width))
            return
        start = _parting_word(group)
        if start <= done:
            return
        for i in rows:
            shown[i] = metrics.elidedText(ELLIPSIS + titles[i][start:],
                                          Qt.TextElideMode.ElideRight, width)
        for again in _alike(shown, rows):
            settle(again, start)

    for rows in _alike(shown, range(len(titles))):
        settle(rows, 0)
    return shown


def _alike(shown: Sequence[str], rows: Iterable[int]) -> list[list[int]]:
    """The groups of two or more of ``rows`` that read the same."""
    groups: dict[str, list[int]] = {}
    for i in rows:
        groups.setdefault(shown[i], []).append(i)
    return [g for g in groups.values() if len(g) > 1]


def _parting_word(texts: Sequence[str]) -> int:
    """Where the word in which ``texts`` first differ starts (0: in the first word)."""
    first, last = min(texts), max(texts)  # the shared start of all is theirs
    n = next((i for i, (a, b) in enumerate(zip(first, last, strict=False)) if a != b),
             min(len(first), len(last)))
    return texts[0].rfind(" ", 0, n) + 1


class _TitleDelegate(QStyledItemDelegate):
    """Paints each chat's title as :func:`distinct_titles` words it at the row's width."""

    def __init__(self, panel: ChatListPanel) -> None:
        super().__init__(panel.list)
        self.panel = panel

    def initStyleOption(self, option: QStyleOptionViewItem,
                        index: QModelIndex | QPersistentModelIndex) -> None:
        super().initStyleOption(option, index)
        width = text_px(option)
        if width > 0:  # a size hint asks with no rect: the whole title
            option.text = self.panel.shown_title(  # type: ignore[attr-defined]
                index.row(), width, option.font)  # type: ignore[attr-defined]


def text_px(option: QStyleOptionViewItem) -> int:
    """The width an item's text is painted in: its text rect less the margins the style
    keeps each side (Qt's common style: the focus frame's margin and one pixel). Worded
    for its rect alone, a title was cut again in the middle by the style."""
    widget = option.widget  # type: ignore[attr-defined]
    style = widget.style() if widget is not None else QApplication.style()
    rect = style.subElementRect(QStyle.SubElement.SE_ItemViewItemText, option, widget)
    margin = style.pixelMetric(QStyle.PixelMetric.PM_FocusFrameHMargin, None, widget) + 1
    return rect.width() - 2 * margin


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
        self._shown: dict[tuple[int, str], list[str]] = {}
        """The titles as shown, by the width and font they were worded for."""
        self.list.setItemDelegate(_TitleDelegate(self))
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
            item.setData(UPDATED_ROLE, chat.updated)
            item.setToolTip(f"{chat.title}\nLast changed {chat_time(chat.updated)}")
            self.list.addItem(item)
            if chat.id == current:
                self.list.setCurrentItem(item)
        self._shown.clear()  # worded as items came, each time for fewer of them
        self._quiet = False

    def titles(self) -> list[str]:
        return [self.list.item(i).text() for i in range(self.list.count())]

    def shown_title(self, row: int, width: int, font: QFont) -> str:
        """Row ``row``'s title as painted in ``width`` pixels (:func:`distinct_titles`)."""
        key = (width, font.key())
        shown = self._shown.get(key)
        if shown is None:
            if len(self._shown) > 8:  # widths a resize went through
                self._shown.clear()
            updated = [float(self.list.item(i).data(UPDATED_ROLE) or 0)
                       for i in range(self.list.count())]
            shown = self._shown[key] = distinct_titles(self.titles(), updated, width,
                                                       QFontMetrics(font))
        return shown[row] if 0 <= row < len(shown) else ""

    def shown_titles(self) -> list[str]:
        """Every title as the list paints it now (cut to the row's width as the style
        cuts what still does not fit)."""
        out = []
        delegate = self.list.itemDelegate()
        for row in range(self.list.count()):
            index = self.list.model().index(row, 0)
            option = QStyleOptionViewItem()
            option.initFrom(self.list.viewport())  # type: ignore[attr-defined]
            option.rect = self.list.visualRect(index)  # type: ignore[attr-defined]
            option.widget = self.list  # type: ignore[attr-defined]
            delegate.initStyleOption(option, index)  # type: ignore[attr-defined]
            out.append(option.fontMetrics.elidedText(  # type: ignore[attr-defined]
                option.text, self.list.textElideMode(),  # type: ignore[attr-defined]
                text_px(option)))
        return out

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
