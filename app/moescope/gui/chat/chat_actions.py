"""The main window's chat actions: new, rename, delete, export as Markdown or JSON.

A mixin of :class:`~moescope.gui.main_window.MainWindow`: the dialogs these need are the
window's; the chat rules are the controller's (:mod:`.controller`).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from moescope.util.files import write_atomic

log = logging.getLogger("moescope.gui")

if TYPE_CHECKING:
    from moescope.gui.main_window import MainWindow

    _Window = MainWindow
else:
    _Window = object


class ChatActions(_Window):
    """Chat ▸ New, Rename, Delete and File ▸ Export chat."""

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
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=chat.title)
        if ok:
            self.chat.rename(chat_id, title)

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
        name = (chat.title if chat else "chat").replace("/", "_")[:40] or "chat"
        pattern = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"{name}.{kind}", pattern)
        if path:
            self.export_chat(path, kind)

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
