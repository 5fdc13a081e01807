"""The main window's chat actions: new, rename, delete, export as Markdown or JSON, import.

A mixin of :class:`~moescope.gui.main_window.MainWindow`: the dialogs these need are the
window's; the chat rules are the controller's (:mod:`.controller`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QDialog, QFileDialog, QInputDialog, QLineEdit, QMessageBox

from moescope.gui.chat.controller import STORE_ERRORS
from moescope.session.chat_import import ChatImportError, read_chat_file
from moescope.util.files import write_atomic

log = logging.getLogger("moescope.gui")

RENAME_MIN_WIDTH = 320
"""Chat ▸ Rename's title field, at the least (a long title gets its whole width)."""
CHAT_FOLDER_KEY = "chat/export_folder"
"""Where the last chat export went: the next export and import start there (the home
folder before the first; they started in the folder MoEScope was started from, after
`make run` the source checkout)."""

if TYPE_CHECKING:
    from moescope.gui.main_window import MainWindow

    _Window = MainWindow
else:
    _Window = object



def imported_title(title: str, taken: set[str]) -> str:
    """``title``, or ``title (imported)``, ``(imported 2)``... where a chat has it: an
    imported copy of a chat still listed read the same as the original."""
    if title not in taken:
        return title
    n = 1
    while (candidate := f"{title} (imported{'' if n == 1 else f' {n}'})") in taken:
        n += 1
    return candidate

def export_name(title: str) -> str:
    """A chat's exported file name, before its suffix: the title's first 40 characters
    with no slash, and no dot, blank or ellipsis at either end ("Recite some
    Shakespeare." was offered as "Recite some Shakespeare..json"); "chat" when nothing
    is left."""
    name = title.replace("/", "_").replace("\\", "_")[:40]
    return name.strip(" .…\t\n") or "chat"


class ChatActions(_Window):
    """Chat ▸ New, Rename, Delete and File ▸ Export chat, Import chat."""

    def new_chat(self) -> int:
        """Chat ▸ New chat: a new chat, and the keyboard in its message box."""
        chat_id = self.chat.new_chat()
        self.chat_view.input.setFocus()
        return chat_id

    def rename_current_dialog(self) -> None:
        if self.chat.chat_id is not None:
            self.rename_chat_dialog(self.chat.chat_id)

    def rename_chat_dialog(self, chat_id: int) -> None:
        chat = self.store.chat(chat_id)
        if chat is None:
            return
        dialog = QInputDialog(self)
        dialog.setWindowTitle("Rename chat")
        dialog.setLabelText("Title:")
        dialog.setTextValue(chat.title)
        # QInputDialog.getText's box was ~190 px wide: a title made from the first message
        # showed as "ode that sorts a list and pri…", to be edited blind
        edit = dialog.findChild(QLineEdit)
        if edit is not None:
            screen = self.screen().availableGeometry().width() if self.screen() else 1024
            edit.setMinimumWidth(max(RENAME_MIN_WIDTH, min(
                edit.fontMetrics().horizontalAdvance(chat.title) + 24, screen * 2 // 3)))
        if dialog.exec() == QDialog.DialogCode.Accepted:
            self.chat.rename(chat_id, dialog.textValue())

    def delete_current_dialog(self) -> None:
        if self.chat.chat_id is not None:
            self.delete_chat_dialog(self.chat.chat_id)

    def delete_chat_dialog(self, chat_id: int) -> None:
        chat = self.store.chat(chat_id)
        if chat is None:
            return
        # No is the default: Enter (pressed once too often) never deletes a chat
        answer = QMessageBox.question(self, "Delete chat",
                                      f"Delete “{chat.title}” and all its messages?",
                                      QMessageBox.StandardButton.Yes
                                      | QMessageBox.StandardButton.No,
                                      QMessageBox.StandardButton.No)
        if answer == QMessageBox.StandardButton.Yes:
            self.chat.delete(chat_id)

    def export_chat_dialog(self, kind: str) -> None:
        if self.chat.chat_id is None:
            self.show_error("Nothing to export", "Select a chat first.")
            return
        chat = self.store.chat(self.chat.chat_id)
        name = export_name(chat.title if chat else "")
        pattern = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(
            self, "Export chat", str(self._chat_folder() / f"{name}.{kind}"), pattern)
        if path and self.export_chat(path, kind) is not None:
            self.settings.setValue(CHAT_FOLDER_KEY, str(Path(path).absolute().parent))

    def _chat_folder(self) -> Path:
        """Where chat exports and imports start: the last export's folder, else home."""
        value = self.settings.value(CHAT_FOLDER_KEY, "")
        if isinstance(value, str) and value and Path(value).is_absolute() \
                and Path(value).is_dir():
            return Path(value)
        return Path.home()

    def export_chat(self, path: str | Path, kind: str) -> Path | None:
        """Write the chat as Markdown or JSON; None (and the user told) if it failed."""
        assert self.chat.chat_id is not None
        text = (self.store.export_markdown(self.chat.chat_id) if kind == "md"
                else self.store.export_json(self.chat.chat_id))
        try:
            dest = write_atomic(path, text)
        except OSError as err:
            self._export_failed("chat", path, err)
            return None
        log.info("chat exported to %s", dest)
        self.statusBar().showMessage(f"Chat saved to {dest}", 8000)
        return dest

    def import_chat_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import chat", str(self._chat_folder()),
                                              "MoEScope chat (*.json);;All files (*)")
        if path:
            self.import_chat(path)

    def import_chat(self, path: str | Path) -> int | None:
        """Add the chat exported (as JSON) at ``path`` as a new chat and show it; None,
        and the reason in one line, when the file is not one (nothing is stored then)."""
        if self.chat.generating:
            self.show_error("Cannot import now", "Wait for the answer to finish (or stop "
                                                 "it), then import.")
            return None
        try:
            chat = read_chat_file(path)
            new = self.store.add_chat(
                imported_title(chat.title, {c.title for c in self.store.chats()}),
                chat.system_prompt, chat.model,
                [(m.role, m.content, m.status, m.stats) for m in chat.messages])
        except ChatImportError as err:
            self.show_error("Cannot import this chat", f"{Path(path).name}: {err}.")
            return None
        except STORE_ERRORS as err:
            self.show_error("Cannot import this chat", f"Saving failed: {err}.")
            return None
        log.info("imported %s as chat %d (%d messages)", path, new.id, len(chat.messages))
        self.chat.select_chat(new.id)
        self.statusBar().showMessage(
            f"Imported “{new.title}” ({len(chat.messages)} messages)", 8000)
        return new.id
