"""Whether a message fits the loaded model's context, checked before it is sent.

A message longer than the context was saved into the chat (and named it), then refused
by the engine in a modal box that advised "a larger context" even at the model's maximum.
The window now measures it first, with the loaded model's tokenizer and the chat's
history as the engine will fit it (``Engine.fit_conversation``: the earliest turns are
left out as needed, so what must fit is the system prompt, the template's markup and the
message itself); a message that does not fit is not sent, not saved, and stays in the box,
with a line under it saying how long it is against the room there is.

The measuring reads the engine from the GUI thread, as the API server's request threads
do (``Service.prepare_chat``: tokenizing and the chat template only read the model); the
window calls it only while a model is loaded and no load is running.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from moescope.util.errors import MoEScopeError

if TYPE_CHECKING:
    from moescope.engine import Engine


@dataclass(frozen=True)
class MessageFit:
    """A message measured against the context."""

    message_tokens: int
    """Tokens the message takes with the chat template (its share of the prompt)."""
    room: int
    """Tokens left for a message in this chat: the context less the system prompt, the
    template's markup and one token of answer (earlier turns are left out as needed)."""
    n_ctx: int
    """The context the model was loaded with."""
    max_ctx: int | None
    """The model's training context (its largest), None where its header does not say."""
    chars: int
    """The message's length in characters."""
    answer_room: int = 0
    """Tokens the engine keeps for the answer where earlier turns can make room."""

    def text(self) -> str:
        """The line shown under the message box: its length, the room, what to do."""
        if self.room <= 0:
            return (f"Not sent: the system prompt leaves no room for a message in the "
                    f"context of {self.n_ctx:,} tokens. Shorten the system prompt (Chat "
                    f"settings){self._larger()}.")
        target = max(1, self.room - self.answer_room) if self.room > self.answer_room \
            else self.room
        keep = self.chars * target // max(self.message_tokens, 1)
        text = (f"Not sent: this message is {self.message_tokens:,} tokens long, and at "
                f"most {self.room:,} fit in the context of {self.n_ctx:,} tokens. Shorten "
                f"it by about {self.message_tokens - target:,} tokens (to about "
                f"{keep:,} of its {self.chars:,} characters")
        if target < self.room:
            text += f", leaving {self.room - target:,} tokens for the answer"
        return f"{text}){self._larger()}."

    def _larger(self) -> str:
        if self.max_ctx is None:
            return ", or reload the model with a larger context (File ▸ Open model…)"
        if self.max_ctx > self.n_ctx:
            return (f", or reload the model with a larger context (up to {self.max_ctx:,}: "
                    f"File ▸ Open model…)")
        return f"; {self.n_ctx:,} tokens is the largest context this model takes"


def too_long(engine: Engine, history: Sequence[dict[str, str]], text: str, *,
             max_tokens: int, thinking: str = "default") -> MessageFit | None:
    """``text`` sent after ``history`` (system prompt first, if any) measured as the engine
    will fit it, where it does not fit: the rolling window leaves earlier turns out, so the
    message must fit with the system prompt and the template's markup alone. None where
    it fits, or cannot be measured (no model; a template that refuses the conversation:
    the engine says why when it is sent)."""
    model = engine.model
    if model is None:
        return None
    n_ctx = engine.n_ctx
    messages = [*history, {"role": "user", "content": text}]
    room_for_answer = min(max_tokens, n_ctx // 4)  # as Engine.generate fits it
    try:
        tokens, _ = engine.fit_conversation(messages, room=room_for_answer,
                                            thinking=thinking)
        if len(tokens) < n_ctx:  # fits (earlier turns left out, maybe): the common case
            return None
        head = [m for m in history[:1] if m["role"] == "system"]
        base = engine.chat_tokens([*head, {"role": "user", "content": ""}], thinking).tokens
    except MoEScopeError:
        return None
    info = model.info
    return MessageFit(message_tokens=len(tokens) - len(base),
                      room=n_ctx - 1 - len(base), n_ctx=n_ctx,
                      max_ctx=info.context_length if info is not None else None,
                      chars=len(text), answer_room=room_for_answer)
