"""The conversation logic between the chat widgets, the chat store and the engine worker.

Kept out of the window so the rules read in one place: a user message is stored before
the engine sees it; the answer row is created empty with status ``generating`` and every
streamed token is appended and committed by the decode thread before it decodes the next
(``GenerateRequest.save``; a killed process loses at most the token in flight), the tokens
it could not save by the window as they arrive; Regenerate drops the last answer and asks
again; Edit puts a user message (the last, or any through its header's link) back in the
box and Resend replaces it and everything after it; Branch copies the conversation up to a
message into a new chat.

Each chat keeps its own sampling settings (the *Chat settings* panel): shown when it is
opened, saved with it at every change and again with each answer it is asked for (an edit
whose save failed), so a chat reopened later samples as it did; a new chat starts from the
user's defaults (see :mod:`.settings`).

When the disk is full (or the database cannot be written) nothing is lost: a message that
cannot be stored is not sent and stays in the box; an answer's text that cannot be stored
stays on screen and in memory (:class:`PendingSave`) and is written with the next tokens,
or by a retry every few seconds, as soon as there is room again. The user is told once
when saving fails and once when it works again.
"""

from __future__ import annotations

import dataclasses
import logging
import sqlite3
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from moescope.gui.chat.chat_list import ChatListPanel
from moescope.gui.chat.chat_view import ChatView
from moescope.gui.chat.message_fit import MessageFit, too_long
from moescope.gui.chat.settings import ChatSettingsPanel
from moescope.gui.worker import AnswerSave, EngineClient, GenerateRequest
from moescope.model.reasoning import split_reasoning
from moescope.session.answer import AnswerState, answer_now
from moescope.session.snapshots import AnswerSummary, TokenSnapshot
from moescope.session.store import DONE, GENERATING, STOPPED, ChatMessage, ChatStore

log = logging.getLogger("moescope.gui.chat")

TITLE_CHARS = 48
NEW_CHAT = "New chat"
STORE_ERRORS = (sqlite3.Error, OSError)
"""What a full disk (SQLITE_FULL), a read-only or vanished database raise on a write."""
RETRY_SAVE_MS = 3000
"""How often unsaved answer text is retried while no token arrives to carry it."""


@dataclass
class PendingSave:
    """Answer text (and its final status) that could not be written yet."""

    message_id: int
    texts: list[str] = field(default_factory=list)
    finish: tuple[str, dict[str, Any]] | None = None


class ChatController(QObject):
    """Owns the current chat id and the answer being generated."""

    answerStarted = Signal()
    tokensArrived = Signal(object)  # list[TokenSnapshot], after the GUI has handled them
    answerFinished = Signal(object)  # AnswerSummary
    answerBegan = Signal(int)  # step of a thinking model's first answer token
    chatChanged = Signal(int)
    problem = Signal(str, str)  # title, message: the window shows a dialog
    saveFailed = Signal(str)  # why: the window says so once, without blocking the stream
    busy = Signal(str)  # why a click did nothing (an answer is being written): the status bar
    saveRecovered = Signal()

    def __init__(self, store: ChatStore, client: EngineClient, view: ChatView,
                 chat_list: ChatListPanel, settings: ChatSettingsPanel,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.store, self.client, self.view = store, client, view
        self.chat_list, self.settings = chat_list, settings
        self.chat_id: int | None = None
        self.answer_id: int | None = None
        self.state = AnswerState.IDLE
        self.model_loaded = False
        self.n_ctx = 0
        """The loaded model's context window (0: no model)."""
        self.model_name = ""
        self.answer_prefixes: dict[str, str] = {}
        """Per thinking setting, what the model's chat template opens each answer with
        (see ``model.reasoning``)."""
        self.answer_prefix = ""
        """The prefix of the answer being generated (its thinking setting's)."""
        self.last_answer: AnswerSummary | None = None
        self.tokens_received = 0
        self.closed = False
        """Set when the window has closed the store: late worker signals are ignored."""
        self._search = ""
        self._raw = ""
        """The answer's raw text until its answer proper begins: all that counting the
        thoughts and "Answer now" need (not kept up after that)."""
        self._answer_begun = False
        self.reasoning_tokens = 0
        """Tokens of the answer being generated spent before its first answer character."""
        self.reasoning_seconds = 0.0
        self._cut_short = False
        """This answer's thoughts were cut short by "Answer now"."""
        self._request: GenerateRequest | None = None
        """The request of the answer being generated (its history and sampling)."""
        self.pending: PendingSave | None = None
        """Answer text the store could not take yet (full disk); kept until it can."""
        self.save_error = ""
        """Why saving fails now ("" while it works)."""
        self._retry = QTimer(self)
        self._retry.setInterval(RETRY_SAVE_MS)
        self._retry.timeout.connect(self.flush_pending)
        view.sendRequested.connect(self.send)
        view.answerNowRequested.connect(self.answer_now)
        view.reasoningToggled.connect(lambda _id: self.render())
        view.stopRequested.connect(self.stop)
        view.regenerateRequested.connect(self.regenerate)
        view.editRequested.connect(self.edit_last)
        view.editMessageRequested.connect(self.edit_message)
        view.branchRequested.connect(self.branch)
        view.promptChosen.connect(self._prompt_chosen)
        chat_list.chatSelected.connect(self.select_chat)
        chat_list.newRequested.connect(self.new_chat)
        chat_list.searchChanged.connect(self._search_changed)
        settings.system_prompt.textChanged.connect(self._system_prompt_edited)
        settings.changed.connect(self._sampling_changed)
        client.tokens.connect(self.on_tokens)
        client.finished.connect(self.on_finished)

    # ------------------------------------------------------------------ chats
    @property
    def generating(self) -> bool:
        """An answer is being generated (or stopping): the worker is busy with it."""
        return self.state is not AnswerState.IDLE

    def refresh_list(self) -> None:
        self.chat_list.set_chats(self.store.chats(self._search), self.chat_id)

    def _search_changed(self, text: str) -> None:
        self._search = text
        self.refresh_list()

    BUSY = "An answer is being written: stop it (Esc) or let it finish, then switch chats."

    def new_chat(self) -> int:
        if self.generating:
            self.busy.emit(self.BUSY)
            return self.chat_id or 0
        try:
            chat = self.store.create_chat(NEW_CHAT, self.settings.system_prompt.toPlainText(),
                                          self.model_name, self.settings.new_chat_values())
        except STORE_ERRORS as err:
            self.problem.emit("Could not create a chat", f"Saving failed: {err}.")
            return self.chat_id or 0
        self.select_chat(chat.id)
        return chat.id

    def select_chat(self, chat_id: int) -> None:
        if self.generating and chat_id != self.chat_id:
            self.refresh_list()  # keep the generating chat selected
            self.busy.emit(self.BUSY)
            return
        chat = self.store.chat(chat_id)
        if chat is None:
            return
        if chat_id != self.chat_id:  # an edit of this chat's message cannot go with it:
            self.view.cancel_edit(focus=False)  # the box gets its draft back, as with Esc
        self.chat_id = chat_id
        self.view.end_edit()
        self.settings.system_prompt.blockSignals(True)
        self.settings.system_prompt.setPlainText(chat.system_prompt)
        self.settings.system_prompt.blockSignals(False)
        self.settings.show_chat(chat.sampling)
        self.render()
        self.show_context()
        self.refresh_list()
        self.chatChanged.emit(chat_id)

    def _prompt_chosen(self, text: str) -> None:
        """A suggested prompt was clicked: send it (or, when it cannot be sent now, leave
        it in the box unless the box holds something being typed)."""
        if not self.send(text) and not self.view.input.toPlainText().strip():
            self.view.input.setPlainText(text)

    def set_n_ctx(self, n_ctx: int) -> None:
        """A model was loaded (``n_ctx``) or closed (0): the meter shows the current chat
        against its context."""
        self.n_ctx = n_ctx
        self.show_context()

    def chat_context(self) -> int:
        """Tokens the current chat took at its last answer (prompt + answer, as the engine
        counted them); 0 before any answer."""
        if self.chat_id is None:
            return 0
        for m in reversed(self.store.messages(self.chat_id)):
            if m.role == "assistant":
                prompt, tokens = m.stats.get("n_prompt_tokens"), m.stats.get("n_tokens")
                if isinstance(prompt, int) and isinstance(tokens, int):
                    return prompt + tokens
        return 0

    def show_context(self) -> None:
        """The context meter for the chat shown (not the previous chat's, not 0 for a full
        chat reopened after a restart)."""
        if not self.generating:
            self.view.set_context(self.chat_context(), self.n_ctx)

    def rename(self, chat_id: int, title: str) -> None:
        title = title.strip()
        if title:
            self.store.rename_chat(chat_id, title)
            self.refresh_list()
            if chat_id == self.chat_id:
                self.render()

    def delete(self, chat_id: int) -> None:
        if self.generating and chat_id == self.chat_id:
            return
        self.store.delete_chat(chat_id)
        if chat_id == self.chat_id:
            self.chat_id = None
            remaining = self.store.chats()
            if remaining:
                self.select_chat(remaining[0].id)
                return
            self.view.render([], "No chat")
            self.settings.show_chat(None)  # what the next chat starts with
            self.show_context()
            self._update_buttons()
        self.refresh_list()

    def render(self) -> None:
        if self.chat_id is None:
            return
        chat = self.store.chat(self.chat_id)
        self.view.render(self.messages(), chat.title if chat else "")
        self._update_buttons()

    def messages(self) -> list[ChatMessage]:
        """The current chat's messages as stored, plus the answer text not saved yet."""
        if self.chat_id is None:
            return []
        messages = self.store.messages(self.chat_id)
        p = self.pending
        if p is None:
            return messages
        return [dataclasses.replace(m, content=m.content + "".join(p.texts),
                                    status=p.finish[0] if p.finish else m.status)
                if m.id == p.message_id else m for m in messages]

    def _system_prompt_edited(self) -> None:
        if self.chat_id is not None:
            try:
                self.store.set_system_prompt(self.chat_id,
                                             self.settings.system_prompt.toPlainText())
            except STORE_ERRORS as err:  # saved again when the next message is sent
                log.warning("could not save the system prompt: %s", err)

    def _sampling_changed(self, _by_user: bool) -> None:
        """The settings shown changed (the user's edit, or a loaded model's recommendation
        taken): they are the current chat's, saved with it."""
        if self.chat_id is not None:
            try:
                self.store.set_sampling(self.chat_id, self.settings.values())
            except STORE_ERRORS as err:  # saved again when the next answer starts
                log.warning("could not save the chat's settings: %s", err)

    def _pin_sampling(self) -> None:
        """Save the settings the answer samples with into the chat, where they differ from
        what it has (an edit whose save failed, a chat from before settings were kept)."""
        assert self.chat_id is not None
        chat = self.store.chat(self.chat_id)
        values = self.settings.values()
        if chat is not None and chat.sampling != values:
            self.store.set_sampling(self.chat_id, values)

    # ------------------------------------------------------------------ sending
    def send(self, text: str) -> bool:
        """Store the user's message and start the answer; False when it cannot start."""
        text = text.strip()
        if not text or self.generating:
            return False
        if not self.model_loaded:
            self.problem.emit("No model loaded",
                              "Open a model first (File ▸ Open model…, or drop a .gguf file "
                              "on the window).")
            return False
        refused = self.check_length(text)
        if refused is not None:
            if not self.view.input.toPlainText().strip():  # a suggested prompt: to the box
                self.view.input.setPlainText(text)
            self.view.show_input_note(refused.text())  # after: an edit of the box clears it
            log.info("message not sent: %d tokens, room for %d", refused.message_tokens,
                     refused.room)
            return False
        self.view.clear_input_note()
        if self.chat_id is None:
            self.new_chat()
        if self.chat_id is None:
            return False
        if not self.flush_pending():
            self.problem.emit("Could not save the chat", self._unsaved_message(
                "Your message was not sent and stays in the box; the last answer is still "
                "on screen, not yet saved."))
            return False
        try:
            prompt = self.settings.system_prompt.toPlainText()
            chat = self.store.chat(self.chat_id)
            if chat is not None and chat.system_prompt != prompt:  # an edit that failed
                self.store.set_system_prompt(self.chat_id, prompt)
            if self.view.editing_position is not None:
                self.store.delete_messages_from(self.chat_id, self.view.editing_position)
                self.view.end_edit()
            self.store.add_message(self.chat_id, "user", text)
        except STORE_ERRORS as err:
            self.problem.emit("Could not save your message", self._unsaved_message(
                "It was not sent and stays in the box.", err))
            return False
        chat = self.store.chat(self.chat_id)
        if chat is not None and chat.title == NEW_CHAT:
            first_line = text.splitlines()[0]
            title = first_line[:TITLE_CHARS] + ("…" if len(first_line) > TITLE_CHARS else "")
            try:
                self.store.rename_chat(self.chat_id, title)
            except STORE_ERRORS as err:
                log.warning("could not title the chat: %s", err)
        self.refresh_list()  # a message makes it the newest chat: to the top of the list
        if self.view.input.toPlainText().strip() == text:  # sent from the box: it leaves
            self.view.input.clear()  # (a suggested prompt leaves what is being typed)
        self._start_answer()
        return True

    def check_length(self, text: str) -> MessageFit | None:
        """How far ``text`` is from fitting the context, where it does not fit after the
        chat's history as the engine will fit it (the message being edited replaces it and
        every later message); None where it fits."""
        history: list[dict[str, str]] = []
        prompt = self.settings.system_prompt.toPlainText()
        if prompt.strip():
            history.append({"role": "system", "content": prompt})
        if self.chat_id is not None:
            editing = self.view.editing_position
            kept = [m for m in self.messages()
                    if editing is None or m.position < editing]
            for m in kept:
                content = (split_reasoning(m.content).answer if m.role == "assistant"
                           else m.content)
                if content or m.role == "user":
                    history.append({"role": m.role, "content": content})
        sampling = self.settings.sampling()
        return too_long(self.client.worker.engine, history, text,
                        max_tokens=sampling.max_tokens, thinking=sampling.thinking)

    def regenerate(self) -> bool:
        """Drop the last answer and generate a new one for the same conversation."""
        if self.generating or self.chat_id is None or not self.model_loaded:
            return False
        messages = self.store.messages(self.chat_id)
        if not messages:
            return False
        try:
            if messages[-1].role == "assistant":
                self.store.delete_messages_from(self.chat_id, messages[-1].position)
                if self.pending is not None and self.pending.message_id == messages[-1].id:
                    self.pending = None  # its unsaved text went with it
        except STORE_ERRORS as err:
            self.problem.emit("Could not regenerate", f"Saving failed: {err}.")
            return False
        self._start_answer()
        return True

    def edit_last(self) -> bool:
        """Put the last user message back in the input box; Resend replaces it."""
        if self.generating or self.chat_id is None:
            return False
        user = [m for m in self.store.messages(self.chat_id) if m.role == "user"]
        if not user:
            return False
        self.view.start_edit(user[-1].position, user[-1].content)
        return True

    def edit_message(self, position: int) -> bool:
        """Put the user message at ``position`` back in the box: sending it replaces it
        and every later message (as editing the last one does)."""
        if self.generating or self.chat_id is None:
            return False
        for m in self.store.messages(self.chat_id):
            if m.position == position and m.role == "user":
                self.view.start_edit(position, m.content)
                return True
        return False

    def branch(self, position: int) -> int | None:
        """A new chat with this chat's conversation up to (and with) the message at
        ``position``, selected; the original stays as it is. None when it cannot be made
        now (an answer is being written: the new chat could not be shown)."""
        if self.chat_id is None:
            return None
        if self.generating:
            self.problem.emit("Cannot branch now",
                              "Wait for the answer to finish (or stop it), then branch.")
            return None
        chat = self.store.chat(self.chat_id)
        title = f"{chat.title if chat else NEW_CHAT} (branch)"
        try:
            if not self.flush_pending():
                raise OSError(self.save_error)
            branch = self.store.branch_chat(self.chat_id, position, title)
        except STORE_ERRORS as err:
            self.problem.emit("Could not branch the chat", f"Saving failed: {err}.")
            return None
        log.info("chat %d branched at message %d into chat %d", self.chat_id, position,
                 branch.id)
        self.select_chat(branch.id)
        return branch.id

    def stop(self) -> None:
        if self.generating:
            log.info("stop requested after %d tokens", self.tokens_received)
            self.state = AnswerState.STOPPING  # Stop wins over an "Answer now" not yet done
            self.client.stop()

    def answer_now(self) -> bool:
        """Cut a thinking model's thoughts short: stop, close them, and generate the answer
        from there (the engine continues from the tokens it generated, so the KV cache keeps
        every thought and only the closing text is read). False when no answer is
        thinking."""
        if not self.generating or not split_reasoning(self._raw, partial=True).thinking:
            return False
        log.info("answer now, after %d thinking tokens", self.reasoning_tokens)
        self.state = AnswerState.ANSWERING_NOW
        self.client.stop()
        return True

    def _continue_answer(self) -> bool:
        """After "Answer now" stopped the thoughts: append their close and generate on."""
        self.state = AnswerState.GENERATING
        cut = answer_now(self._raw, self.answer_prefix)
        if cut is None or self._request is None or self.answer_id is None:
            return False
        self._save_texts([cut.closing])
        self.view.append_text(cut.closing)
        self._raw += cut.closing
        self._request = GenerateRequest(messages=self._request.messages,
                                        sampling=self._request.sampling,
                                        answer_start=cut.start,
                                        save=self._answer_save(self.answer_id))
        self._cut_short = True
        self.client.generate(self._request)
        return True

    def history(self) -> list[dict[str, str]]:
        """The conversation as the engine gets it: system prompt, then done messages."""
        assert self.chat_id is not None
        chat = self.store.chat(self.chat_id)
        out = []
        if chat is not None and chat.system_prompt.strip():
            out.append({"role": "system", "content": chat.system_prompt})
        for m in self.messages():
            # earlier answers go back without their thoughts, as the models' own templates
            # send them: thoughts would only take context
            content = split_reasoning(m.content).answer if m.role == "assistant" else m.content
            if content or m.role == "user":
                out.append({"role": m.role, "content": content})
        return out

    def prompt_of_last_answer(self) -> list[dict[str, str]]:
        """The conversation up to its last user message: what the last answer answered
        (what a comparison of policies answers again); [] without a user message."""
        if self.chat_id is None:
            return []
        messages = self.history()
        while messages and messages[-1]["role"] != "user":
            messages.pop()
        return messages if any(m["role"] == "user" for m in messages) else []

    def _start_answer(self) -> None:
        assert self.chat_id is not None
        messages = self.history()
        self.render()
        sampling = self.settings.sampling()
        self.answer_prefix = self.answer_prefixes.get(sampling.thinking, "")
        try:
            if not self.flush_pending():  # an earlier answer's text first, in order
                raise OSError(self.save_error)
            self._pin_sampling()
            answer = self.store.add_message(self.chat_id, "assistant", self.answer_prefix,
                                            GENERATING)
        except STORE_ERRORS as err:
            self.problem.emit("Could not start the answer", self._unsaved_message(
                "Your message is saved; press Regenerate when there is room.", err))
            self._update_buttons()
            return
        self.answer_id = answer.id
        self.view.begin_answer()
        self.view.append_text(self.answer_prefix)
        self.state = AnswerState.GENERATING
        self.tokens_received = 0
        self._raw, self._answer_begun = self.answer_prefix, False
        self.reasoning_tokens, self.reasoning_seconds = 0, 0.0
        self._cut_short = False
        self._update_buttons()
        self._request = GenerateRequest(messages=tuple(messages), sampling=sampling,
                                        save=self._answer_save(answer.id))
        self.client.generate(self._request)
        self.answerStarted.emit()

    def _answer_save(self, message_id: int) -> AnswerSave | None:
        """Where the decode thread saves the answer's tokens; None (the window saves them)
        while earlier text waits to be written: the tokens must follow it."""
        if self.pending is not None:
            return None
        return AnswerSave(store_path=str(self.store.path), message_id=message_id)

    # ------------------------------------------------------------------ worker output
    def on_tokens(self, snaps: list[TokenSnapshot]) -> None:
        if self.closed:
            return
        words = [s for s in snaps if not s.end]  # an end step has rows, not text
        unsaved = [s.text for s in words if not s.saved]  # the decode thread saved the others
        if self.answer_id is not None and unsaved:
            self._save_texts(unsaved)
        self.view.append_text("".join(s.text for s in words))
        self.tokens_received += len(words)
        self._count_reasoning(words)
        last = snaps[-1]
        self.view.set_context(last.context_used, last.n_ctx)
        self.tokensArrived.emit(snaps)

    def _count_reasoning(self, snaps: list[TokenSnapshot]) -> None:
        """Count the tokens (and decode time) before the answer's first character."""
        for snap in snaps:
            if self._answer_begun:
                return
            self._raw += snap.text
            split = split_reasoning(self._raw, partial=True)
            if split.answer:
                self._answer_begun = True
                if self.reasoning_tokens:
                    self.answerBegan.emit(snap.step)
            elif split.has_reasoning:
                self.reasoning_tokens += 1
                self.reasoning_seconds += snap.seconds

    def on_finished(self, summary: AnswerSummary) -> None:
        if self.closed:
            return
        self.view.flush()
        if (self.state is AnswerState.ANSWERING_NOW and summary.stop_reason != "error"
                and self._continue_answer()):
            return
        self.last_answer = summary
        if self.answer_id is not None:
            if summary.n_tokens == 0 and summary.stop_reason == "error":
                self._drop_answer(self.answer_id)
            else:
                status = STOPPED if summary.stop_reason == "stopped" else DONE
                stats = summary.as_dict()
                if self.reasoning_tokens:
                    stats["reasoning_tokens"] = self.reasoning_tokens
                    stats["reasoning_seconds"] = round(self.reasoning_seconds, 2)
                if self._cut_short:
                    stats["reasoning_cut_short"] = True
                self._finish_answer(self.answer_id, status, stats)
        self.answer_id = None
        self.state = AnswerState.IDLE
        self.view.set_context(summary.n_prompt_tokens + summary.n_tokens, self.n_ctx)
        self.render()
        log.info("answer: %s", summary.summary)
        self.answerFinished.emit(summary)

    def _drop_answer(self, message_id: int) -> None:
        if self.chat_id is None:
            return
        try:
            for m in self.store.messages(self.chat_id):
                if m.id == message_id:
                    self.store.delete_messages_from(self.chat_id, m.position)
            if self.pending is not None and self.pending.message_id == message_id:
                self.pending = None
        except STORE_ERRORS as err:
            log.warning("could not drop the failed answer: %s", err)

    # ------------------------------------------------------------------ saving
    def _save_texts(self, texts: list[str]) -> None:
        """Append streamed text to the answer being generated; while the store refuses,
        keep it (in order) for the next try."""
        assert self.answer_id is not None
        if self.pending is None:
            self.pending = PendingSave(self.answer_id)
        self.pending.texts.extend(texts)
        self.flush_pending()

    def _finish_answer(self, message_id: int, status: str, stats: dict[str, Any]) -> None:
        if self.pending is None:
            self.pending = PendingSave(message_id)
        self.pending.finish = (status, stats)
        self.flush_pending()

    def close_answer(self, message_id: int) -> None:
        """The window closes mid-answer: it is saved as stopped (with any pending text)."""
        if self.pending is None or self.pending.message_id == message_id:
            if self.pending is None:
                self.pending = PendingSave(message_id)
            self.pending.finish = (STOPPED, {})
        self._retry.stop()

    def flush_pending(self) -> bool:
        """Write what is pending; True when nothing is left (also the retry timer's slot)."""
        p = self.pending
        if p is None:
            return True
        try:
            if p.texts:
                self.store.append_texts(p.message_id, p.texts)
                p.texts = []
            if p.finish is not None:
                self.store.finish_message(p.message_id, *p.finish)
        except STORE_ERRORS as err:
            self._save_failed(err)
            return False
        self.pending = None
        self._retry.stop()
        if self.save_error:
            self.save_error = ""
            log.info("the chat is saved again")
            self.saveRecovered.emit()
        return True

    def _save_failed(self, err: BaseException) -> None:
        first = not self.save_error
        self.save_error = str(err) or type(err).__name__
        if self.pending is not None and not self._retry.isActive():
            self._retry.start()
        if first:
            log.error("saving the chat failed: %s", self.save_error)
            self.saveFailed.emit(self._unsaved_message(
                "The answer stays on screen and is kept in memory; it is saved as soon as "
                "there is room again."))

    def _unsaved_message(self, what: str, err: BaseException | None = None) -> str:
        why = (str(err) or type(err).__name__) if err is not None else self.save_error
        return f"MoEScope could not write the chat history ({why}); is the disk full? {what}"

    def _update_buttons(self) -> None:
        messages: list[ChatMessage] = (self.store.messages(self.chat_id)
                                       if self.chat_id is not None else [])
        has_user = any(m.role == "user" for m in messages)
        self.view.set_generating(self.generating, can_regenerate=has_user and self.model_loaded,
                                 can_edit=has_user)
