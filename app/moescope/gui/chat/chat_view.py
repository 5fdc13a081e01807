"""The conversation: transcript, input box, Send / Stop / Regenerate / Edit, context bar.

The transcript is a ``QTextBrowser`` (no web engine: its GPU process would take VRAM from
the expert cache). Answers are Markdown (:mod:`markdown`), the user's messages plain text.
Streamed text is buffered and the answer re-rendered at most once per display frame
(:mod:`markdown_stream` keeps that cost to the answer's unfinished tail), so a fast model
costs one render per frame instead of one per token; messages already shown are kept when
the transcript is rendered again. Copying an answer gives the model's raw Markdown.
"""

from __future__ import annotations

import bisect
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass

from PySide6.QtCore import QEvent, QObject, QPoint, QSize, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import (
    QAction,
    QColor,
    QDesktopServices,
    QFont,
    QGuiApplication,
    QKeyEvent,
    QKeySequence,
    QResizeEvent,
    QTextBlockFormat,
    QTextCharFormat,
    QTextCursor,
)
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMenu,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from moescope.display import context_meter
from moescope.display.answer_line import DECODE_RATE_TIP, answer_line
from moescope.gui import theme
from moescope.gui.chat.markdown import code_text, is_code_block, markdown_fragment
from moescope.gui.chat.markdown_stream import LiveMarkdown
from moescope.gui.chat.message_actions import BRANCH, COPY, EDIT, action_of, insert_actions
from moescope.gui.chat.reasoning_view import (
    LiveReasoning,
    header_text,
    insert_reasoning,
    message_id_of,
    reasoning_href,
)
from moescope.gui.chat.welcome import prompt_of
from moescope.gui.widgets.elided_label import ElidedLabel
from moescope.model.reasoning import split_reasoning
from moescope.session.store import DONE, GENERATING, ChatMessage

log = logging.getLogger("moescope.gui.chat")

MAX_RENDER_SHARE = 0.25
"""At most this share of the GUI thread goes to re-rendering a streaming answer."""
LINK_SCHEMES = ("http", "https", "mailto")
COPY_ANSWER_SHORTCUT = "Ctrl+Shift+C"


@dataclass
class _Shown:
    """A message in the transcript: where its header line starts and its raw text."""

    key: tuple[object, ...] | None
    """What it was rendered from; None for the answer still streaming (never matches)."""
    start: int
    role: str
    raw: str
    position: int | None = None
    """The stored message's position in its chat (None while it streams)."""


def _key(m: ChatMessage, expanded: bool) -> tuple[object, ...]:
    return (m.id, m.role, m.content, m.status, m.stats.get("summary", ""), expanded)


class ChatInput(QPlainTextEdit):
    """Enter sends, Shift+Enter inserts a newline."""

    submitted = Signal()

    def keyPressEvent(self, event: QKeyEvent) -> None:
        enter = event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)
        if enter and not event.modifiers() & Qt.KeyboardModifier.ShiftModifier:
            self.submitted.emit()
            return
        super().keyPressEvent(event)


class ContextBar(QProgressBar):
    """The context meter: "context 1234 / 4096", or "1234 / 4096" where that does not
    fit, or the short numbers ("context 262k / 1.0M", "262k / 1.0M") where those do not:
    :mod:`moescope.display.context_meter`. As narrow as six-digit numbers need whatever
    the context (130 px for the long form kept the window from fitting a 1024 px screen
    with a 10 pt font); a context of a million tokens or more no longer clips there
    (its seven-digit numbers give way to the short ones). The tooltip has the exact
    numbers."""

    EMPTY = context_meter.EMPTY
    PAD_PX = 14
    TIP = "Tokens of the context window in use (prompt + answer)"

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._used = 0
        self._n_ctx = 0

    def set_context(self, used: int, n_ctx: int) -> None:
        changed = n_ctx != self._n_ctx
        self._used, self._n_ctx = used, n_ctx
        if changed:
            self.updateGeometry()  # the long form's room: sizeHint
        self.setRange(0, max(n_ctx, 1))
        self.setValue(min(used, max(n_ctx, 1)))
        self.setToolTip(f"{self.TIP}\n{context_meter.exact_text(used, n_ctx)}")
        self._fit_format()

    def _text_px(self, text: str) -> int:
        return self.fontMetrics().horizontalAdvance(text) + self.PAD_PX

    def minimumSizeHint(self) -> QSize:
        """As narrow as the widest short form needs ("999k / 999k"): six-digit numbers
        (the exact form's) had made the window 30 px wider at 11 pt."""
        hint = super().minimumSizeHint()
        return QSize(max(self._text_px(t) for t in context_meter.LEAST_WIDTH_TEXTS),
                     hint.height())

    def sizeHint(self) -> QSize:
        """Room for the long form where the row has it (of seven-digit numbers too)."""
        hint = super().sizeHint()
        longest = context_meter.meter_texts(self._n_ctx, self._n_ctx)[0]
        return QSize(max(self._text_px(context_meter.FULL_WIDTH_TEXT),
                         self._text_px(longest)), hint.height())

    def _fit_format(self) -> None:
        """The first form that fits, measured with the context full too, so the form does
        not change as the chat grows (only with the width or the context)."""
        shown = context_meter.meter_texts(self._used, self._n_ctx)
        full = context_meter.meter_texts(self._n_ctx, self._n_ctx)
        pick = len(shown) - 1
        for i, (text, widest) in enumerate(zip(shown, full, strict=True)):
            if max(self._text_px(text), self._text_px(widest)) <= self.width():
                pick = i
                break
        self.setFormat(shown[pick].replace("%", "%%"))

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_format()


class ChatView(QWidget):
    """Shows one chat and collects the next message; the window does the work."""

    sendRequested = Signal(str)
    stopRequested = Signal()
    regenerateRequested = Signal()
    editRequested = Signal()
    editMessageRequested = Signal(int)  # position of one of the user's messages
    branchRequested = Signal(int)  # position: a new chat with the messages up to it
    reasoningToggled = Signal(int)  # message id: render the chat again
    answerNowRequested = Signal()
    promptChosen = Signal(str)  # a suggested prompt of the empty chat was clicked
    copied = Signal(str)  # what went to the clipboard, in words for the status bar

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        # 4 px at the sides and between the buttons (6 before): with a 10 pt font the
        # window's least width is then under a 1024 px screen's
        layout.setContentsMargins(4, 6, 4, 6)
        self.title = ElidedLabel("No chat")
        self.title.setObjectName("chatTitle")
        layout.addWidget(self.title)
        self.transcript = QTextBrowser()
        self.transcript.setAccessibleName("Conversation")
        self.transcript.setOpenLinks(False)  # links open in the system browser, on click
        self.transcript.anchorClicked.connect(self.open_link)
        self.transcript.document().setDocumentMargin(10)
        self.transcript.document().setUndoRedoEnabled(False)  # read-only: no edit history
        self.transcript.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.transcript.customContextMenuRequested.connect(self._show_context_menu)
        self.copy_answer_action = QAction("Copy last answer as Markdown", self)
        self.copy_answer_action.setShortcut(QKeySequence(COPY_ANSWER_SHORTCUT))
        self.copy_answer_action.setShortcutContext(
            Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.copy_answer_action.triggered.connect(self.copy_last_answer)
        self.addAction(self.copy_answer_action)
        layout.addWidget(self.transcript, 1)
        self._reflow: tuple[bool, int, int] | None = None
        """Where the view was when the transcript's width changed: at the end, or the
        document position at its top and that position's offset (:meth:`eventFilter`)."""
        self.transcript.installEventFilter(self)
        self.transcript.verticalScrollBar().rangeChanged.connect(self._keep_place)
        self.transcript.verticalScrollBar().actionTriggered.connect(self._moved)

        self.input = ChatInput()
        self.input.setAccessibleName("Message")
        self.input.setPlaceholderText("Message the model — Enter sends, Shift+Enter: new line")
        self.input.setMaximumHeight(96)
        self.input.setTabChangesFocus(True)
        self.input.submitted.connect(self._submit)
        layout.addWidget(self.input)
        # why the message in the box was not sent (longer than the context): a line under
        # it, not a modal box, gone as soon as the message is edited
        self.input_note = QLabel()
        self.input_note.setObjectName("inputNote")
        self.input_note.setAccessibleName("Why the message was not sent")
        self.input_note.setWordWrap(True)
        self.input_note.setTextFormat(Qt.TextFormat.PlainText)
        self.input_note.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.input_note.setVisible(False)
        self.input.textChanged.connect(self.clear_input_note)
        layout.addWidget(self.input_note)

        buttons = QHBoxLayout()
        buttons.setSpacing(4)
        self.send_button = QPushButton("&Send")
        self.stop_button = QPushButton("Sto&p")
        self.regenerate_button = QPushButton("&Regenerate")
        self.edit_button = QPushButton("Ed&it last")  # Alt+E: the Cache menu
        self.answer_now_button = QPushButton("&Answer now")
        self.answer_now_button.setToolTip(
            "Stop thinking: close the model's thoughts and have it answer from what it has "
            "thought so far (each thought is a token of expert copies)")
        self.answer_now_button.setVisible(False)
        for b, name in ((self.send_button, "Send message"), (self.stop_button, "Stop"),
                        (self.answer_now_button, "Stop thinking and answer now"),
                        (self.regenerate_button, "Regenerate the last answer"),
                        (self.edit_button, "Edit and resend the last message")):
            b.setAccessibleName(name)
            buttons.addWidget(b)
        self.send_button.setDefault(True)
        self.send_button.clicked.connect(self._submit)
        self.stop_button.clicked.connect(self.stopRequested)
        self.regenerate_button.clicked.connect(self.regenerateRequested)
        self.edit_button.clicked.connect(self.editRequested)
        self.answer_now_button.clicked.connect(self.answerNowRequested)
        buttons.addStretch(1)
        self.context_bar = ContextBar()
        self.context_bar.setAccessibleName("Context used")
        self.set_context(0, 0)
        self.context_bar.setMaximumWidth(240)
        buttons.addWidget(self.context_bar)
        layout.addLayout(buttons)

        self.welcome = ""
        """HTML an empty chat shows (:mod:`.welcome`): what the model is, what to try."""
        self.editing_position: int | None = None
        self._draft_before_edit = ""  # the box's text when an edit began (Esc restores it)
        self._shown: list[_Shown] = []
        self._live: LiveMarkdown | None = None
        """The answer being streamed, rendered at the end of the transcript."""
        self._pending = ""
        self._render_after = 0.0
        self._stream_raw: str | None = None
        """The streaming answer's raw text rendered so far (None: nothing streams)."""
        self._thoughts: LiveReasoning | None = None
        self._answer_start = 0
        self._stream_started = 0.0
        self.expanded: set[int] = set()
        """Ids of the messages whose reasoning is unfolded."""
        self.set_generating(False)

    # ------------------------------------------------------------------ formats
    @staticmethod
    def _role_format(role: str) -> QTextCharFormat:
        f = QTextCharFormat()
        f.setFontWeight(QFont.Weight.Bold)
        colours = {"user": theme.ACCENT, "assistant": theme.ASSISTANT, "system": theme.MUTED}
        f.setForeground(QColor(colours.get(role, theme.TEXT)))
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
        f.setFontPointSize(theme.SMALL_PT + 0.5)
        return f

    @staticmethod
    def _block(role: str, top: float) -> QTextBlockFormat:
        b = QTextBlockFormat()
        b.setTopMargin(top)
        b.setLeftMargin(4)
        b.setRightMargin(4)
        if role == "user":
            b.setBackground(QColor(theme.USER_BACKGROUND))
        return b

    # ------------------------------------------------------------------ rendering
    def render(self, messages: Sequence[ChatMessage], title: str = "") -> None:
        """Show ``messages`` (chat switched, answer finished, message edited).

        Messages already shown unchanged at the top are kept: finishing an answer renders
        only that answer again (as a whole, with its stats line), not the whole chat's
        Markdown. The view follows the end unless the user scrolled up in the same chat.
        """
        self.title.setText(title or "New chat")
        self._pending = ""
        self._live = None
        self._stream_raw = None
        streaming: str | None = None
        if messages and messages[-1].role == "assistant" and messages[-1].status == GENERATING:
            # rendered again mid-answer (the chat was renamed): the answer keeps streaming
            streaming, messages = messages[-1].content, messages[:-1]
        bar = self.transcript.verticalScrollBar()
        at_end, value = bar.value() >= bar.maximum() - 4, bar.value()
        keep = 0
        while (keep < min(len(self._shown), len(messages))
               and self._shown[keep].key == self._key(messages[keep])):
            keep += 1
        doc = self.transcript.document()
        if keep == 0:
            doc.clear()
        cursor = QTextCursor(doc)
        cursor.beginEditBlock()
        if keep:
            cursor.movePosition(QTextCursor.MoveOperation.End)
            if keep < len(self._shown):  # from the end of the last kept message's text
                cursor.setPosition(self._shown[keep].start - 1)
                cursor.movePosition(QTextCursor.MoveOperation.End,
                                    QTextCursor.MoveMode.KeepAnchor)
                cursor.removeSelectedText()
        del self._shown[keep:]
        for m in messages[keep:]:
            self._append_message(cursor, m)
        if not messages and streaming is None and self.welcome:
            cursor.insertHtml(self.welcome)  # an empty chat: what the model is, what to try
        cursor.endEditBlock()
        if streaming is not None:
            self.begin_answer()
            if streaming:
                self._show_stream(streaming)
        if keep and not at_end:
            bar.setValue(value)
        else:
            self._scroll_to_end()

    def forget_rendering(self) -> None:
        """The next :meth:`render` draws every message anew (the theme changed)."""
        for shown in self._shown:
            shown.key = ("stale",)

    def _key(self, m: ChatMessage) -> tuple[object, ...]:
        return _key(m, m.id in self.expanded)

    def _append_message(self, cursor: QTextCursor, m: ChatMessage) -> None:
        start = self._insert_header(cursor, m.role, len(self._shown))
        if m.role == "assistant":
            split = split_reasoning(m.content)
            if split.has_reasoning:
                expanded = m.id in self.expanded
                seconds = m.stats.get("reasoning_seconds")
                header = header_text(expanded=expanded, tokens=m.stats.get("reasoning_tokens"),
                                     seconds=float(seconds) if seconds is not None else None,
                                     cut_short=bool(m.stats.get("reasoning_cut_short")))
                insert_reasoning(cursor, split.reasoning, header=header,
                                 href=reasoning_href(m.id), expanded=expanded)
            if split.answer.strip():
                cursor.insertFragment(markdown_fragment(split.answer))
            elif not split.has_reasoning:  # not an empty bubble: say why there is no text
                cursor.insertBlock(self._block("stats", 2), self._stats_format())
                cursor.insertText("(no text: stopped before the model wrote anything)"
                                  if m.status != DONE else "(the model answered nothing)")
        else:  # the user's own words, exactly as typed: no Markdown, no HTML
            cursor.insertBlock(self._block(m.role, 2), self._body_format())
            cursor.insertText(m.content)
        line = answer_line(m.stats, m.status) if m.role == "assistant" else ""
        if line:
            # hovered, it says over which tokens its numbers are (the cache panel's tok/s
            # is over its last few: the two differ)
            stats = self._stats_format()
            stats.setToolTip(DECODE_RATE_TIP)
            cursor.insertBlock(self._block("stats", 2), stats)
            cursor.insertText(line, stats)
        self._shown.append(_Shown(self._key(m), start, m.role, m.content, m.position))

    def _insert_header(self, cursor: QTextCursor, role: str, index: int) -> int:
        """The role line ("You", "Assistant", then the message's links) at ``cursor``;
        returns where it begins."""
        if not self._shown:
            cursor.setBlockFormat(self._block(role, 4))
            cursor.setBlockCharFormat(self._role_format(role))
        else:
            cursor.insertBlock(self._block(role, 14), self._role_format(role))
        start = cursor.block().position()
        cursor.insertText({"user": "You", "assistant": "Assistant"}.get(role, role.title()))
        insert_actions(cursor, role, index)
        return start

    def begin_answer(self) -> None:
        """Start the streamed answer at the end of the transcript."""
        cursor = QTextCursor(self.transcript.document())
        cursor.movePosition(QTextCursor.MoveOperation.End)
        start = self._insert_header(cursor, "assistant", len(self._shown))
        self._shown.append(_Shown(None, start, "assistant", ""))
        self._answer_start = cursor.position()
        self._live = LiveMarkdown(self.transcript.document(), self._answer_start)
        self._thoughts = None
        self._stream_raw = ""
        self._stream_started = time.perf_counter()
        self._pending = ""
        self._render_after = 0.0
        self._scroll_to_end()

    @property
    def live(self) -> LiveMarkdown | None:
        """The answer being streamed (None when no answer is streaming)."""
        return self._live

    @property
    def pending(self) -> str:
        """Streamed text waiting for the next :meth:`flush`."""
        return self._pending

    def append_text(self, text: str) -> None:
        """Queue streamed text; :meth:`flush` renders it (display frame)."""
        self._pending += text

    def flush(self) -> bool:
        """Render the streamed answer with what was queued; True when it was rendered.

        Called by the window's display timer. A render that took long (a huge code block
        still open) postpones the next one, so Markdown never takes more than
        :data:`MAX_RENDER_SHARE` of the GUI thread.
        """
        if not self._pending or self._stream_raw is None:
            return False
        started = time.perf_counter()
        if started < self._render_after:
            return False
        bar = self.transcript.verticalScrollBar()
        at_end, value = bar.value() >= bar.maximum() - 4, bar.value()
        self._show_stream(self._stream_raw + self._pending)
        self._pending = ""
        if at_end:
            self._scroll_to_end()
        else:
            bar.setValue(value)  # reading above: the text must not move under the user
        cost = time.perf_counter() - started
        self._render_after = started + cost / MAX_RENDER_SHARE
        return True

    def _show_stream(self, raw: str) -> None:
        """Render the streaming answer's ``raw`` text: thoughts while the model thinks,
        folded into one line when the answer begins, the answer as live Markdown."""
        self._stream_raw = self._shown[-1].raw = raw
        split = split_reasoning(raw, partial=True)
        doc = self.transcript.document()
        if self._thoughts is None and split.has_reasoning:
            # thoughts come first: nothing of the answer has been shown yet
            cursor = QTextCursor(doc)
            cursor.setPosition(self._answer_start)
            cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
            cursor.removeSelectedText()
            self._thoughts = LiveReasoning(doc, self._answer_start)
            self._live = None
        if self._thoughts is not None:
            self._thoughts.update(split.reasoning)
            had_focus = self.answer_now_button.hasFocus()
            self._show_answer_now(split.thinking and self.stop_button.isEnabled())
            if had_focus and not self.answer_now_button.isVisible():
                self.input.setFocus()  # not the next widget in the chain
            if split.thinking:
                return
            if self._live is None:
                seconds = time.perf_counter() - self._stream_started
                self._live = LiveMarkdown(doc, self._thoughts.fold(
                    seconds, keep=bool(split.reasoning.strip())))
        assert self._live is not None
        self._live.update(split.answer)

    @property
    def thinking(self) -> bool:
        """The streaming answer is still in its reasoning."""
        return self._thoughts is not None and not self._thoughts.folded

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Before the transcript is resized (its lines wrap again, its height changes):
        note where the user is, for :meth:`_keep_place` once the lines have wrapped."""
        if watched is self.transcript and event.type() == QEvent.Type.Resize \
                and self._reflow is None and isinstance(event, QResizeEvent) \
                and event.oldSize().width() != event.size().width():
            bar = self.transcript.verticalScrollBar()
            top = self.transcript.cursorForPosition(QPoint(0, 0))
            self._reflow = (bar.value() >= bar.maximum() - 4, top.position(),
                            self.transcript.cursorRect(top).top())
            QTimer.singleShot(0, self._reflowed)
        return super().eventFilter(watched, event)

    def _keep_place(self, _low: int = 0, _high: int = 0) -> None:
        """The lines wrapped again at a new width: the user at the end stays at the end,
        one reading further up keeps the line at the top of the view there."""
        if self._reflow is None:
            return
        at_end, position, offset = self._reflow
        bar = self.transcript.verticalScrollBar()
        if at_end:
            bar.setValue(bar.maximum())
            return
        cursor = QTextCursor(self.transcript.document())
        cursor.setPosition(min(position, self.transcript.document().characterCount() - 1))
        bar.setValue(bar.value() + self.transcript.cursorRect(cursor).top() - offset)

    def _moved(self, _action: int) -> None:
        self._reflow = None  # the user scrolled: where they were is where they are now

    def _reflowed(self) -> None:
        self._keep_place()  # a long chat's lines are laid out in steps after the resize
        self._reflow = None

    def _scroll_to_end(self) -> None:
        bar = self.transcript.verticalScrollBar()
        bar.setValue(bar.maximum())

    def text(self) -> str:
        """The transcript as shown (rendered, not the Markdown source)."""
        return self.transcript.toPlainText()

    # ------------------------------------------------------------------ copy, links
    def message_at(self, position: int) -> int | None:
        """Index of the message shown at document ``position`` (None above the first)."""
        index = bisect.bisect_right([s.start for s in self._shown], position) - 1
        return index if index >= 0 else None

    def raw_text(self, index: int) -> str:
        """What message ``index`` really says: the model's Markdown, not its rendering."""
        shown = self._shown[index]
        if shown.key is None and self._stream_raw is not None:
            return self._stream_raw + self._pending
        return shown.raw

    def copy_message(self, index: int) -> None:
        """Copy the answer's Markdown (without its reasoning: that is what gets pasted)."""
        raw = self.raw_text(index)
        answer = self._shown[index].role == "assistant"
        text = split_reasoning(raw).answer if answer else raw
        QGuiApplication.clipboard().setText(text)
        # the Copy link and Ctrl+Shift+C changed nothing on screen: the user could not
        # tell that they had worked
        self.copied.emit("Answer copied to the clipboard (as Markdown)." if answer
                         else "Message copied to the clipboard.")

    def copy_last_answer(self) -> bool:
        """Copy the last answer's Markdown; False when there is none."""
        for index in range(len(self._shown) - 1, -1, -1):
            if self._shown[index].role == "assistant":
                self.copy_message(index)
                return True
        return False

    def context_menu(self, pos: QPoint) -> QMenu:
        """The transcript's menu at viewport point ``pos``: Qt's own (Copy, Select All, Copy
        Link Location) plus "Copy answer as Markdown" over an answer and "Copy code block"
        over code."""
        bars = QPoint(self.transcript.horizontalScrollBar().value(),
                      self.transcript.verticalScrollBar().value())
        menu = self.transcript.createStandardContextMenu(pos + bars)
        cursor = self.transcript.cursorForPosition(pos)
        index = self.message_at(cursor.position())
        if index is not None and self._shown[index].role == "assistant":
            action = menu.addAction("Copy answer as &Markdown")
            action.triggered.connect(lambda _=False, i=index: self.copy_message(i))
            thoughts = split_reasoning(self.raw_text(index)).reasoning
            if thoughts:
                action = menu.addAction("Copy &thinking")
                action.triggered.connect(
                    lambda _=False, t=thoughts: QGuiApplication.clipboard().setText(t))
            if is_code_block(cursor.block()):
                code = code_text(cursor)
                action = menu.addAction("Copy &code block")
                action.triggered.connect(
                    lambda _=False, c=code: QGuiApplication.clipboard().setText(c))
        return menu

    def message_action(self, action: str, index: int) -> bool:
        """A message link was clicked: copy it, or ask to edit or branch from it (the
        controller decides; a message still streaming has no position to act on yet)."""
        if not 0 <= index < len(self._shown):
            return False
        if action == COPY:
            self.copy_message(index)
            return True
        position = self._shown[index].position
        if position is None:
            return False
        if action == EDIT and self._shown[index].role == "user":
            self.editMessageRequested.emit(position)
        elif action == BRANCH:
            self.branchRequested.emit(position)
        else:
            return False
        return True

    def _show_context_menu(self, pos: QPoint) -> None:
        menu = self.context_menu(pos)
        menu.exec(self.transcript.viewport().mapToGlobal(pos))
        menu.deleteLater()

    def open_link(self, url: QUrl) -> bool:
        """A clicked link opens in the system's handler, web and mail links only: an answer
        is untrusted text, and ``file:`` or custom schemes could start programs. Our own
        reasoning links fold or unfold a message's thoughts."""
        prompt = prompt_of(url.toString())
        if prompt is not None:
            self.promptChosen.emit(prompt)
            return True
        action = action_of(url.toString())
        if action is not None:
            return self.message_action(*action)
        message_id = message_id_of(url.toString())
        if message_id is not None:
            self.expanded.symmetric_difference_update({message_id})
            self.reasoningToggled.emit(message_id)
            return True
        if url.scheme().lower() not in LINK_SCHEMES:
            log.info("not opening link %s (scheme %r)", url.toString(), url.scheme())
            return False
        return QDesktopServices.openUrl(url)

    # ------------------------------------------------------------------ input
    def _submit(self) -> None:
        text = self.input.toPlainText().strip()
        if not text or not self.send_button.isEnabled():
            return
        self.sendRequested.emit(text)

    def show_input_note(self, text: str) -> None:
        """Say under the message box why its message was not sent (it stays there)."""
        self.input_note.setText(f"⚠ {text}")
        self.input_note.setVisible(True)

    def clear_input_note(self) -> None:
        if self.input_note.isVisible() or self.input_note.text():
            self.input_note.clear()
            self.input_note.setVisible(False)

    def set_generating(self, generating: bool, can_regenerate: bool = False,
                       can_edit: bool = False) -> None:
        buttons = (self.send_button, self.stop_button, self.answer_now_button,
                   self.regenerate_button, self.edit_button)
        focused = next((b for b in buttons if b.hasFocus()), None)
        self.send_button.setEnabled(not generating)
        self.stop_button.setEnabled(generating)
        if not generating:
            self._show_answer_now(False)
        self.regenerate_button.setEnabled(not generating and can_regenerate)
        self.edit_button.setEnabled(not generating and can_edit)
        if focused is not None and not (focused.isEnabled() and focused.isVisible()):
            # a clicked button that is now disabled would hand the keyboard focus to the
            # next widget in the chain (the cache policy box, where the next arrow key
            # would change the policy): give it back to the message box instead
            self.input.setFocus()

    def _show_answer_now(self, visible: bool) -> None:
        """Answer now takes the place of Regenerate and Edit last (greyed while the model
        thinks): shown beside them, it made the button row, and so the window, about 90
        pixels wider by itself, past a 1024 px screen's edge."""
        self.answer_now_button.setVisible(visible)
        self.regenerate_button.setVisible(not visible)
        self.edit_button.setVisible(not visible)

    def start_edit(self, position: int, content: str) -> None:
        """Put a user message back in the box; the next send replaces it and every
        message after it."""
        if self.editing_position is None:
            self._draft_before_edit = self.input.toPlainText()
        self.editing_position = position
        self.input.setPlainText(content)
        self.input.setFocus()
        self.send_button.setText("Re&send")
        self.send_button.setToolTip("Replace the message and everything after it "
                                    "(Esc: cancel the edit)")

    def end_edit(self) -> None:
        self.editing_position = None
        self._draft_before_edit = ""
        self.send_button.setText("&Send")
        self.send_button.setToolTip("")

    def cancel_edit(self, *, focus: bool = True) -> bool:
        """Esc while editing a message (or leaving its chat): the box holds again what it
        held before the edit (the draft then, usually nothing) and Send sends a new
        message; False when no message was being edited."""
        if self.editing_position is None:
            return False
        draft = self._draft_before_edit
        self.end_edit()
        self.input.setPlainText(draft)
        if focus:
            self.input.setFocus()
        return True

    def set_welcome(self, text: str) -> None:
        """What an empty chat shows from now on (shown at once if the chat is empty)."""
        self.welcome = text
        if not self._shown and self._stream_raw is None:
            self.render([], self.title.text())

    def set_context(self, used: int, n_ctx: int) -> None:
        """``n_ctx`` 0: no model, no context (not "context 0 / 1")."""
        self.context_bar.set_context(used, n_ctx)
