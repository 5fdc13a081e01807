"""An answer's life, shared by every front end: its state, and "Answer now".

"Answer now" cuts a thinking model's thoughts short: the front end stops the generation,
this module says what closes the thoughts and where the next generation starts, and the
engine continues from the tokens it already generated (the KV cache keeps every thought,
only the closing text is read). The terminal chat (Ctrl+C while thinking) and the window
(the "Answer now" button) call the same function, so the two cannot drift apart.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from moescope.model.reasoning import close_reasoning


class AnswerState(enum.Enum):
    """Where the answer being generated is; one value instead of a handful of flags."""

    IDLE = "idle"
    """No answer is being generated."""
    GENERATING = "generating"
    STOPPING = "stopping"
    """Stop was asked for; the generation ends after the token being decoded."""
    ANSWERING_NOW = "answering now"
    """"Answer now" was asked for: the generation stops, then goes on past the thoughts."""


@dataclass(frozen=True)
class AnswerNow:
    """How to continue an answer whose thoughts were cut short."""

    closing: str
    """The text that closes the thoughts (shown, saved and read into the prompt)."""
    start: str
    """What ``Engine.generate(answer_start=...)`` continues from: the answer so far plus
    ``closing``, without the template's answer prefix (the engine writes that itself)."""


def answer_now(raw: str, prefix: str) -> AnswerNow | None:
    """The continuation of the answer whose raw text so far is ``raw`` (including the
    template's ``prefix`` if it was generated), or None when its thoughts are not open."""
    closing = close_reasoning(raw)
    if not closing:
        return None
    text = raw + closing
    return AnswerNow(closing=closing, start=text[len(prefix):] if text.startswith(prefix)
                     else text)


__all__ = ["AnswerNow", "AnswerState", "answer_now"]
