"""The conversation: transcript, input box, Send / Stop / Regenerate / Edit, context bar.

The transcript is a ``QTextBrowser`` (no web engine: its GPU process would take VRAM from
the expert cache). Streamed text is buffered and inserted at the end of the document at
most once per display frame, so a fast model costs one cheap insert per frame instead of
one layout per token; the full transcript is rebuilt only when its structure changes.
"""

from __future__ import annotations

from collections.abc import Sequence

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QColor, QFont, QKeyEvent, QTextBlockFormat, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from moescope.gui import theme
from moescope.gui.store import DONE, ChatMessage

ROLE_COLOURS = {"user": theme.ACCENT, "assistant": "#4cc38a", "system": theme.MUTED}
USER_BACKGROUND = "#252c36"


class ChatInput(QPlainTextEdit):
    """Enter sends, Shift+Enter inserts a newline."""

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class ChatView(QWidget):
    """Shows one chat and collects the next message; the window does the work."""

    sendRequested = Signal(str)
    stopRequested = Signal()
    regenerateRequested = Signal()
    editRequested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(6, 6, 6, 6)
        self.title = QLabel("No chat")
        self.title.setObjectName("chatTitle")
        layout.addWidget(self.title)
        self.transcript = QTextBrowser()
        self.transcript.setAccessibleName("Conversation")
        self.transcript.setOpenLinks(False)
        self.transcript.document().setDocumentMargin(10)
        layout.addWidget(self.transcript, 1)

        self.input = ChatInput()
        self.input.setAccessibleName("Message")
        self.input.setPlaceholderText("Message the model — Enter sends, Shift+Enter: new line")
        self.input.setMaximumHeight(96)
        self.input.setTabChangesFocus(True)
        self.input.submitted.connect(self._submit)
        layout.addWidget(self.input)

        buttons = QHBoxLayout()
        self.send_button = QPushButton("&Send")
        self.stop_button = QPushButton("Sto&p")
        self.regenerate_button = QPushButton("&Regenerate")
        self.edit_button = QPushButton("&Edit last")
        for b, name in ((self.send_button, "Send message"), (self.stop_button, "Stop"),
                        (self.regenerate_button, "Regenerate the last answer"),
                        (self.edit_button, "Edit and resend the last message")):
            b.setAccessibleName(name)
            buttons.addWidget(b)
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._submit)
        self.stop_button.clicked.connect(self.stopRequested)
        self.regenerate_button.clicked.connect(self.regenerateRequested)
        self.edit_button.clicked.connect(self.editRequested)
        buttons.addStretch(1)
        self.context_bar = QProgressBar()
        self.context_bar.setAccessibleName("Context used")
        self.context_bar.setFormat("context %v / %m")
        self.context_bar.setToolTip("Tokens of the context window in use (prompt + answer)")
        self.context_bar.setRange(0, 1)
        self.context_bar.setValue(0)
        self.context_bar.setMinimumWidth(170)
        self.context_bar.setMaximumWidth(240)
        buttons.addWidget(self.context_bar)
        layout.addLayout(buttons)

        self.editing_position: int | None = None
        self._pending = ""
        self._streaming = False
        self.set_generating(False)

    # ------------------------------------------------------------------ formats
    @staticmethod
    def _role_format(role: str) -> QTextCharFormat:
        f = QTextCharFormat()
        f.setFontWeight(QFont.Weight.Bold)
        f.setForeground(QColor(ROLE_COLOURS.get(role, theme.TEXT)))
        return f

    @staticmethod
    def _body_format() -> QTextCharFormat:
        f = QTextCharFormat()
        f.setForeground(QColor(theme.TEXT))
        return f

    @staticmethod
    def _stats_format() -> QTextCharFormat:
        f = QTextCharFormat()
        f.setForeground(QColor(theme.MUTED))
        f.setFontItalic(True)
        f.setFontPointSize(8.5)
        return f

    @staticmethod
    def _block(role: str, top: float) -> QTextBlockFormat:
        b = QTextBlockFormat()
        b.setTopMargin(top)
        b.setLeftMargin(4)
        b.setRightMargin(4)
        if role == "user":
            b.setBackground(QColor(USER_BACKGROUND))
        return b

    # ------------------------------------------------------------------ rendering
    def render(self, messages: Sequence[ChatMessage], title: str = "") -> None:
        """Rebuild the transcript (chat switched, answer finished, message edited)."""
        self.title.setText(title or "New chat")
        self._pending = ""
        self._streaming = False
        doc = self.transcript.document()
        doc.clear()
        cursor = QTextCursor(doc)
        first = True
        for m in messages:
            self._insert_message(cursor, m.role, m.content, first)
            first = False
            stats = m.stats.get("summary", "")
            note = "" if m.status == DONE else m.status
            if m.role == "assistant" and (stats or note):
                cursor.insertBlock(self._block("stats", 2), self._stats_format())
                cursor.insertText(" · ".join(t for t in (stats, note) if t))
        self._scroll_to_end()

    def _insert_message(self, cursor: QTextCursor, role: str, content: str,
                        first: bool) -> None:
        if first:
            cursor.setBlockFormat(self._block(role, 4))
            cursor.setBlockCharFormat(self._role_format(role))
        else:
            cursor.insertBlock(self._block(role, 14), self._role_format(role))
        cursor.insertText({"user": "You", "assistant": "Assistant"}.get(role, role.title()))
        cursor.insertBlock(self._block(role, 2), self._body_format())
        cursor.insertText(content)

    def begin_answer(self) -> None:
        """Start the streamed answer's block at the end of the transcript."""
        cursor = QTextCursor(self.transcript.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        empty = self.transcript.document().isEmpty()
        self._insert_message(cursor, "assistant", "", empty)
        self._pending = ""
        self._streaming = True
        self._scroll_to_end()

    def append_text(self, text: str) -> None:
        """Queue streamed text; :meth:`flush` writes it (display frame)."""
        self._pending += text

    def flush(self) -> bool:
        """Insert queued text at the end; True when something was written."""
        if not self._pending or not self._streaming:
            return False
        bar = self.transcript.verticalScrollBar()
        at_end = bar.value() >= bar.maximum() - 4
        cursor = QTextCursor(self.transcript.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(self._pending, self._body_format())
        self._pending = ""
        if at_end:
            self._scroll_to_end()
        return True

    def _scroll_to_end(self) -> None:
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    def text(self) -> str:
        return self.transcript.toPlainText()

    # ------------------------------------------------------------------ input
    def _submit(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or not self.send_button.isEnabled():
            return
        self.sendRequested.emit(text)

    def set_generating(self, generating: bool, can_regenerate: bool = False,
                       can_edit: bool = False) -> None:
        self.send_button.setEnabled(not generating)
        self.stop_button.setEnabled(generating)
        self.regenerate_button.setEnabled(not generating and can_regenerate)
        self.edit_button.setEnabled(not generating and can_edit)

    def start_edit(self, position: int, content: str) -> None:
        """Put the last user message back in the box; the next send replaces it."""
        self.editing_position = position
        self.input.setPlainText(content)
        self.input.setFocus()
        self.send_button.setText("Re&send")

    def end_edit(self) -> None:
        self.editing_position = None
        self.send_button.setText("&Send")

    def set_context(self, used: int, n_ctx: int) -> None:
        self.context_bar.setRange(0, max(n_ctx, 1))
        self.context_bar.setValue(min(used, max(n_ctx, 1)))
