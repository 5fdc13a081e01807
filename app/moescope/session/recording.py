"""Recording a chat session's trace, and what happens when recording fails: written once.

The terminal chat and the window (and the coming API server) record the same way: one
token at a time on the decode thread, then the step that chose the end-of-generation token
(which ``generate`` does not yield), the answer's last token on disk before the answer is
reported over, an "answer now" note on the generation that continues a cut-short answer.
Recording never stops the chat: a failed write (a full disk), the session's size limit or
the user turning it off closes the trace (readable, with the reason in its end line) and
tells the front end once, through ``on_stopped``, with a typed :class:`RecordingStopped`
that the front end words in its own way.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from moescope.trace import ANSWER_NOW_NOTE, TraceRecorder

log = logging.getLogger(__name__)

StopKind = Literal["failed", "size limit", "turned off"]


@dataclass(frozen=True)
class RecordingStopped:
    """Why a session's recording ended early, and where the trace so far is."""

    kind: StopKind
    path: Path
    error: str = ""
    """The failure's message (``kind == "failed"``)."""
    limit_bytes: int = 0
    """The session's size limit (``kind == "size limit"``)."""


class Recording:
    """A session's :class:`TraceRecorder` plus the rules every front end follows.

    Decode thread only. After it stops (a failure, the size limit, :meth:`close`) every
    call is a no-op and :attr:`active` is False.
    """

    def __init__(self, recorder: TraceRecorder, *,
                 on_stopped: Callable[[RecordingStopped], None] | None = None,
                 limit_bytes: Callable[[], int] | None = None) -> None:
        self.recorder: TraceRecorder | None = recorder
        self.path = recorder.path
        self.on_stopped = on_stopped
        self.limit_bytes = limit_bytes
        """The session's size limit, read at every token (settings may change it)."""

    @property
    def active(self) -> bool:
        return self.recorder is not None

    def answer_now(self) -> None:
        """Mark the next token as the start of an answer "Answer now" continued: the
        closing text is written into the prompt, so the trace cannot see it otherwise."""
        if self.recorder is not None:
            self.recorder.add_note(ANSWER_NOW_NOTE)

    def record(self, token: Any, engine: Any) -> None:
        """Record one generated token (``Engine.generate``'s ``TokenStats``)."""
        self._write(lambda recorder: recorder.record(token, engine))

    def end_answer(self, engine: Any) -> None:
        """The generation is over: record the step that chose its end-of-generation token
        (``TraceRecorder.end_answer``) and wait until all is on disk. Call it after every
        ``generate`` loop, before "answer now" generates again."""
        self._write(lambda recorder: recorder.end_answer(engine))

    def _write(self, write: Callable[[TraceRecorder], object]) -> None:
        if self.recorder is None:
            return
        try:
            write(self.recorder)
        except (OSError, ValueError) as err:
            self._failed(err)
            return
        limit = self.limit_bytes() if self.limit_bytes is not None else None
        if limit is not None and self.recorder.bytes_written >= limit:
            log.warning("session recording stopped at its size limit: %s", self.path)
            self.close(stop_reason="size limit")
            self._tell(RecordingStopped("size limit", self.path, limit_bytes=limit))

    def flush(self) -> None:
        """Wait until the recorded tokens are on disk (end of an answer)."""
        if self.recorder is None:
            return
        try:
            self.recorder.flush()
        except (OSError, ValueError) as err:
            self._failed(err)

    def close(self, stop_reason: str = "") -> None:
        """End the trace (its end line names ``stop_reason``); a failure to finish it is
        ignored: what was written stays readable. A Parquet trace whose recorder has a
        compactor (the window's) is compacted after this returns, in the background."""
        recorder, self.recorder = self.recorder, None
        if recorder is not None:
            with contextlib.suppress(OSError, ValueError):
                recorder.close(stop_reason=stop_reason)

    def _failed(self, err: Exception) -> None:
        log.warning("session recording stopped: %s", err)
        self.close(stop_reason="recording failed")
        self._tell(RecordingStopped("failed", self.path, error=str(err)))

    def _tell(self, stopped: RecordingStopped) -> None:
        if self.on_stopped is not None:
            self.on_stopped(stopped)


__all__ = ["Recording", "RecordingStopped"]
