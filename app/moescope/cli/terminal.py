"""The terminal side of ``moescope chat``: streaming an answer with its thoughts dim, Ctrl+C
as "stop after this token", and reading messages from a terminal (line editing, history,
a backslash continues a line) or from a pipe. Apart from ``commands/chat.py``, which holds
the conversation and its slash commands, so that each reads on its own; no engine logic.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, TextIO

from moescope.model.reasoning import split_reasoning

if TYPE_CHECKING:
    from moescope.engine import Engine


@dataclass
class AnswerPrinter:
    """Streams an answer to ``out``: thoughts dim (or not at all), then the answer.

    Prints what each split adds to what it printed before; a marker cut by the stream is
    held back by the split until it completes, so none is ever printed.
    """

    out: TextIO
    show_thoughts: bool
    raw: str = ""
    last: str = ""
    """The last character printed."""
    _thoughts: int = 0
    _answer: int = 0

    def feed(self, text: str, *, partial: bool = True) -> None:
        self.raw += text
        split = split_reasoning(self.raw, partial=partial)
        if self.show_thoughts and len(split.reasoning) > self._thoughts:
            head = "" if self._thoughts else "thinking: "
            self._write(f"\x1b[2m{head}{split.reasoning[self._thoughts:]}\x1b[0m")
            self._thoughts = len(split.reasoning)
        if len(split.answer) > self._answer:
            if self._thoughts and not self._answer:
                self._write("\n\n")
            self._write(split.answer[self._answer:])
            self._answer = len(split.answer)

    def _write(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()
        self.last = text[-1:] or self.last

    def finish(self) -> str:
        """Print what was held back; returns the answer (without thoughts)."""
        self.feed("", partial=False)
        return split_reasoning(self.raw).answer


@contextlib.contextmanager
def stop_on_interrupt(engine: Engine) -> Iterator[Callable[[], bool]]:
    """While an answer streams, Ctrl+C asks the engine to stop after the current token
    (the answer so far stays valid, and so does the KV cache); a second Ctrl+C raises
    KeyboardInterrupt as usual, for a token that never ends. Yields "was Ctrl+C pressed"."""
    hits = 0

    def on_sigint(_signum: int, _frame: object) -> None:
        nonlocal hits
        hits += 1
        if hits > 1:
            raise KeyboardInterrupt
        engine.stop()

    try:
        previous = signal.signal(signal.SIGINT, on_sigint)
    except ValueError:  # not the main thread: leave SIGINT alone
        previous = None
    try:
        yield lambda: hits > 0
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


# ------------------------------------------------------------------------------ input
Reader = Callable[[], "str | None"]


def terminal_reader() -> Reader:
    """``input()`` with line editing and history; None to quit. Ctrl+C clears a typed
    line (as a shell does) and quits on an empty one."""
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (imported for its side effect on input())

    def read() -> str | None:
        lines: list[str] = []
        while True:
            try:
                line = input("… " if lines else "> ")
            except EOFError:
                print(file=sys.stderr)
                return None
            except KeyboardInterrupt:
                print(file=sys.stderr)
                if lines or typed_text():
                    return ""
                return None
            if not line.endswith("\\"):
                return "\n".join([*lines, line])
            lines.append(line[:-1])

    return read


def typed_text() -> str:
    """What was on the input line when Ctrl+C came (readline keeps it)."""
    try:
        import readline
    except ImportError:
        return ""
    return str(readline.get_line_buffer())


def stream_reader(stream: TextIO) -> Reader:
    """One message per line from a pipe or file; a trailing backslash joins lines."""

    def read() -> str | None:
        lines: list[str] = []
        while True:
            try:
                raw = stream.readline()
            except KeyboardInterrupt:
                return None
            if not raw:
                return "\n".join(lines) if lines else None
            line = raw.rstrip("\r\n")
            if not line.endswith("\\"):
                return "\n".join([*lines, line])
            lines.append(line[:-1])

    return read


def use_color(stream: TextIO) -> bool:
    """Dim the summary lines only on a terminal that wants colour (NO_COLOR, TERM=dumb)."""
    return (bool(getattr(stream, "isatty", lambda: False)())
            and "NO_COLOR" not in os.environ and os.environ.get("TERM") != "dumb")
