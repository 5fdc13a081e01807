"""Recorded sessions, found without knowing the folder: File ▸ Recent sessions and the
Recorded sessions dialog, and the Open trace file dialog with whole names.

The window records every session into its traces folder, named by time and model
(``20261201-230412-Qwen3-30B-A3B-Instruct-2507-Q4_K_M.parquet``): in a file dialog those
names were cut before the model, and a user had to know the folder at all. The list here
comes from :func:`moescope.display.trace_list.list_traces` (headers only), run on a pool
thread by :class:`~moescope.gui.traces.session_scan.SessionScanner` each time the menu or
the dialog opens (with many sessions on disk it took the GUI thread for seconds), and says
when each session was recorded, its model, tokens, size, format and state; opening one
goes through the window's
:meth:`~moescope.gui.traces.session_traces.SessionTraces.open_trace`, on a thread, as
File ▸ Open trace does.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QSize, Qt, QUrl, Signal
from PySide6.QtGui import (
    QAction,
    QCloseEvent,
    QDesktopServices,
    QKeyEvent,
    QKeySequence,
    QShortcut,
)
from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QPushButton,
    QTreeView,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from moescope.display.trace_list import (
    SessionTrace,
    TraceState,
    detail_text,
    menu_text,
    size_text,
    state_text,
    tokens_text,
    when_text,
)
from moescope.gui.traces.session_scan import SessionScanner
from moescope.gui.widgets.screen_fit import resize_within_screen

MENU_SESSIONS = 10
"""Sessions File ▸ Recent sessions shows (the dialog lists every one kept)."""
COLUMNS = ("Recorded", "Model", "Tokens", "Size", "Format", "State")
MODEL_COLUMN = 1
DIALOG_SIZE = QSize(860, 420)
"""The dialog's preferred size (bounded by the screen: a 1024x700 laptop shows it whole)."""
FILE_DIALOG_SIZE = QSize(900, 520)
"""The Open trace dialog's preferred size: room for a session's whole name."""


LISTING = "Listing the sessions…"
"""The menu's one line before its first listing has come back from the thread."""


def fill_recent_menu(menu: QMenu, entries: list[SessionTrace] | None,
                     open_trace: Callable[[str], object], show_all: QAction
                     ) -> list[SessionTrace]:
    """Rebuild ``menu`` with the newest :data:`MENU_SESSIONS` of ``entries`` (a folder's
    listing, newest first; None: not listed yet, :data:`LISTING`), an action each, ``&1``
    ..``&9`` and ``1&0`` as keys (those that cannot open are disabled, their reason in
    the status tip) and, last, ``show_all`` (the dialog's action); returns the sessions
    listed."""
    menu.clear()
    if entries is None:
        menu.addAction(LISTING).setEnabled(False)
        menu.addSeparator()
        menu.addAction(show_all)
        return []
    for n, entry in enumerate(entries[:MENU_SESSIONS], 1):
        key = f"&{n}" if n < 10 else "1&0"
        action = menu.addAction(f"{key}  {menu_text(entry)}")
        action.setStatusTip(detail_text(entry))
        action.setToolTip(detail_text(entry))
        action.setEnabled(entry.openable)
        action.triggered.connect(lambda _=False, p=str(entry.path): open_trace(p))
    if not entries:
        none = menu.addAction("No recorded session yet")
        none.setEnabled(False)
    menu.addSeparator()
    menu.addAction(show_all)
    return entries


class SessionsDialog(QDialog):
    """Every recorded session of the traces folder, newest first: Open (Enter, a double
    click), Show in folder, Open another file…, Refresh (F5). Non-modal: the chat goes on
    while it is open."""

    openRequested = Signal(str)
    """A session to open (its file's path)."""
    otherFileRequested = Signal()
    """Open another file… was pressed (the window asks with its file dialog)."""
    listed = Signal()
    """The list shows the newest scan of the folder (:meth:`refresh`'s, on a thread)."""

    def __init__(self, folder: Path, live: Callable[[], Path | None] = lambda: None,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.folder = folder
        self.live = live
        """This window's session being recorded now (asked at each refresh), if any."""
        self.entries: list[SessionTrace] = []
        self.scanner = SessionScanner()
        """Lists the folder on a thread; a refresh during a scan supersedes it."""
        self.scanner.listed.connect(self._show_entries)
        self._keep: Path | None = None  # the session selected when the refresh began
        self.setWindowTitle("Recorded sessions — MoEScope")
        layout = QVBoxLayout(self)
        self.intro = QLabel()
        self.intro.setWordWrap(True)
        self.intro.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.intro)
        label = QLabel("&Sessions:")
        layout.addWidget(label)
        self.tree = QTreeWidget()
        label.setBuddy(self.tree)
        self.tree.setAccessibleName("Recorded sessions")
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(COLUMNS)
        self.tree.setRootIsDecorated(False)
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setAllColumnsShowFocus(True)
        self.tree.setTextElideMode(Qt.TextElideMode.ElideMiddle)
        self.tree.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.tree.header()
        header.setStretchLastSection(False)
        for column in range(len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        # the model's name takes what is left, cut in the middle where it must (its
        # quantization, at the end, tells files apart)
        header.setSectionResizeMode(MODEL_COLUMN, QHeaderView.ResizeMode.Stretch)
        # Enter is the dialog's (keyPressEvent): the tree's "activated" also fires on a
        # single click where the style says so, and a click must only select
        self.tree.itemDoubleClicked.connect(lambda _item, _col: self.open_current())
        self.tree.currentItemChanged.connect(lambda *_: self._current_changed())
        layout.addWidget(self.tree, 1)
        self.detail = QLabel()
        """What the selected session is: its path, and why it cannot open if it cannot."""
        self.detail.setWordWrap(True)
        self.detail.setObjectName("statsLabel")
        self.detail.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.detail)
        buttons = QHBoxLayout()
        self.open_button = QPushButton("&Open")
        self.open_button.setToolTip("Open the selected session's trace in its own window "
                                    "(Enter)")
        self.open_button.clicked.connect(self.open_current)
        self.folder_button = QPushButton("Show in &folder")
        self.folder_button.setToolTip(f"Open {folder} in the file manager")
        self.folder_button.clicked.connect(self.show_folder)
        self.other_button = QPushButton("Open &another file…")
        self.other_button.setToolTip("Choose a trace file anywhere (File ▸ Open trace…)")
        self.other_button.clicked.connect(self._other_file)
        self.refresh_button = QPushButton("&Refresh")
        self.refresh_button.setToolTip("List the folder again (F5)")
        self.refresh_button.clicked.connect(self.refresh)
        close = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        close.rejected.connect(self.reject)
        for b in (self.open_button, self.folder_button, self.other_button,
                  self.refresh_button):
            b.setAutoDefault(False)
            buttons.addWidget(b)
        buttons.addStretch(1)
        buttons.addWidget(close)
        layout.addLayout(buttons)
        QShortcut(QKeySequence(QKeySequence.StandardKey.Refresh), self, self.refresh)
        resize_within_screen(self, DIALOG_SIZE)
        self.refresh()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Enter opens the selected session (on a button: presses it), never Close."""
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            focus = self.focusWidget()
            if isinstance(focus, QPushButton):
                focus.click()
            else:
                self.open_current()
            event.accept()
            return
        super().keyPressEvent(event)

    def refresh(self) -> None:
        """List the folder again, on a thread (``listed`` once it shows), keeping the
        selected session selected if it is still there; what was listed stays until
        then. A refresh while one runs supersedes it."""
        current = self.current()
        if current is not None:
            self._keep = current.path
        if not self.entries:
            self.intro.setText(f"Listing the recorded sessions in {self.folder}…")
        self.scanner.scan(self.folder, self.live())

    @property
    def scanning(self) -> bool:
        return self.scanner.scanning

    def _show_entries(self, entries: list[SessionTrace]) -> None:
        current = self.current()  # chosen while the scan ran: that choice is kept
        keep = current.path if current is not None else self._keep
        self.entries = entries
        self.tree.clear()
        openable = [n for n, e in enumerate(self.entries) if e.openable]
        pick = openable[0] if openable else 0  # the newest that opens, unless one was chosen
        for n, entry in enumerate(self.entries):
            item = QTreeWidgetItem([when_text(entry), entry.model or entry.path.name,
                                    tokens_text(entry), size_text(entry.size), entry.format,
                                    state_text(entry)])
            for column in (2, 3):
                item.setTextAlignment(column, Qt.AlignmentFlag.AlignRight
                                      | Qt.AlignmentFlag.AlignVCenter)
            tip = detail_text(entry)
            for column in range(len(COLUMNS)):
                item.setToolTip(column, tip)
            if not entry.openable:
                item.setForeground(5, self.palette().placeholderText())
            if entry.state is not TraceState.FINISHED:
                font = item.font(5)
                font.setItalic(True)
                item.setFont(5, font)
            self.tree.addTopLevelItem(item)
            if entry.path == keep:
                pick = n
        count = len(self.entries)
        self.intro.setText(
            f"{count} recorded session{'s' if count != 1 else ''} in {self.folder} "
            "(the newest are kept; File ▸ Record session traces turns recording on and "
            "off)." if count else
            f"No recorded session yet in {self.folder}: with File ▸ Record session traces "
            "on, each model session is recorded there.")
        if count:
            self.tree.setCurrentItem(self.tree.topLevelItem(pick))
        self._current_changed()
        self.listed.emit()

    def closeEvent(self, event: QCloseEvent) -> None:
        self.scanner.cancel()
        super().closeEvent(event)

    def done(self, result: int) -> None:  # Close, Esc, Open: no scan left running
        self.scanner.cancel()
        super().done(result)

    def current(self) -> SessionTrace | None:
        item = self.tree.currentItem()
        if item is None:
            return None
        n = self.tree.indexOfTopLevelItem(item)
        return self.entries[n] if 0 <= n < len(self.entries) else None

    def _current_changed(self) -> None:
        entry = self.current()
        self.open_button.setEnabled(entry is not None and entry.openable)
        self.detail.setText(detail_text(entry) if entry is not None else "")

    def open_current(self) -> None:
        """Open the selected session (the dialog closes), unless it cannot open: then the
        detail line says why, and nothing else happens."""
        entry = self.current()
        if entry is None or not entry.openable:
            return
        self.openRequested.emit(str(entry.path))
        self.accept()

    def show_folder(self) -> bool:
        """Show the traces folder in the system's file manager."""
        ok = QDesktopServices.openUrl(QUrl.fromLocalFile(str(self.folder)))
        if not ok:
            self.detail.setText(f"Could not open a file manager; the folder is "
                                f"{self.folder}")
        return bool(ok)

    def _other_file(self) -> None:
        self.otherFileRequested.emit()
        self.accept()


def ask_trace_file(parent: QWidget, start: str, filters: str) -> str:
    """File ▸ Open trace's dialog: the detail view, its name column as wide as the longest
    name in the folder (sessions are named by time *and* model: cut, they all look alike)
    and the dialog as wide as the screen allows. A platform's own dialog (Windows, macOS,
    a desktop portal) is used as it comes: it has no column of Qt's to widen. Returns the
    chosen path, or "" when cancelled."""
    dialog = QFileDialog(parent, "Open trace", start, filters)
    dialog.setFileMode(QFileDialog.FileMode.ExistingFile)
    dialog.setAcceptMode(QFileDialog.AcceptMode.AcceptOpen)
    dialog.setViewMode(QFileDialog.ViewMode.Detail)
    view = dialog.findChild(QTreeView, "treeView")
    if view is not None:  # Qt's own dialog: size it for the names
        resize_within_screen(dialog, FILE_DIALOG_SIZE)

        def fit() -> None:
            shown = [c for c in range(view.header().count()) if not view.isColumnHidden(c)]
            for column in shown:
                view.resizeColumnToContents(column)
            room = view.viewport().width() - sum(view.columnWidth(c) for c in shown[1:])
            view.setColumnWidth(0, max(view.columnWidth(0), room))

        model = view.model()
        model.layoutChanged.connect(fit)  # the folder is listed on a thread: fit it then
        model.rowsInserted.connect(lambda *_: fit())
        dialog.directoryEntered.connect(lambda _path: fit())
        fit()
    if dialog.exec() != QDialog.DialogCode.Accepted:
        return ""
    files = dialog.selectedFiles()
    return files[0] if files else ""
