"""Turns on one engine: one generation at a time, the others waiting in order.

The expert cache follows one sequence of tokens, and llama.cpp's context holds one
conversation, so every front end that generates on an engine (the window's chat, the
API server's requests) takes a turn here first. Waiting is bounded: a queue that is
full refuses at once (the server answers 503 with Retry-After) instead of piling up
work nobody will wait for. Plain threads and a condition variable, no Qt and no asyncio,
so the window's decode thread and the server's worker threads share one queue.
"""

from __future__ import annotations

import contextlib
import enum
import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from moescope.util.errors import MoEScopeError


class QueueFull(MoEScopeError):
    """Every waiting place is taken; ask again later."""


class TurnCancelled(MoEScopeError):
    """The turn was given up (its client left) before it came."""


class TurnState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    CANCELLED = "cancelled"
    DONE = "done"


_numbers = itertools.count(1)


@dataclass(eq=False)
class Turn:
    """One front end's place in the queue."""

    who: str
    """Who asked (``window``, or a client address): the log and the window show it."""
    number: int = field(default_factory=lambda: next(_numbers))
    state: TurnState = TurnState.WAITING
    joined: float = field(default_factory=time.perf_counter)
    started: float = 0.0

    @property
    def waited_s(self) -> float:
        """Seconds from joining the queue to the engine (so far, while waiting)."""
        return (self.started or time.perf_counter()) - self.joined


def _waiting(n: int) -> str:
    """How many requests wait, in words, for the queue-full message."""
    if n == 0:
        return "no request may wait"
    return "1 request already waits" if n == 1 else f"{n} requests already wait"


class EngineQueue:
    """A bounded FIFO of turns on one engine; at most one turn runs at a time."""

    def __init__(self, capacity: int = 8) -> None:
        if capacity < 0:
            raise MoEScopeError(f"queue capacity {capacity} must be >= 0")
        self.capacity = capacity
        """How many turns may wait while one runs (0: none wait, the busy engine refuses)."""
        self._cond = threading.Condition()
        self._waiting: deque[Turn] = deque()
        self._running: Turn | None = None
        self.on_change: Callable[[], None] | None = None
        """Called (on whichever thread changed it) after a turn starts, ends or joins:
        the window updates its "waiting for a request" line from it."""

    # ---------------------------------------------------------------- taking turns
    def join(self, who: str) -> Turn:
        """A place in the queue: running at once when the engine is free, else waiting.
        Raises :class:`QueueFull` when ``capacity`` turns already wait."""
        turn = Turn(who)
        with self._cond:
            if self._running is None and not self._waiting:
                self._start(turn)
            elif len(self._waiting) >= self.capacity:
                raise QueueFull(f"the engine is busy and {_waiting(len(self._waiting))}; "
                                "try again shortly")
            else:
                self._waiting.append(turn)
        self._changed()
        return turn

    def join_if_idle(self, who: str) -> Turn | None:
        """A running turn if nothing runs or waits, else None (never waits)."""
        turn = Turn(who)
        with self._cond:
            if self._running is not None or self._waiting:
                return None
            self._start(turn)
        self._changed()
        return turn

    def wait(self, turn: Turn, timeout: float | None = None) -> bool:
        """Block until ``turn`` runs (True) or was cancelled (False); False also when
        ``timeout`` seconds pass first (the turn keeps its place)."""
        with self._cond:
            self._cond.wait_for(lambda: turn.state is not TurnState.WAITING, timeout)
            return turn.state is TurnState.RUNNING

    def cancel(self, turn: Turn) -> None:
        """Give up a waiting turn (its place goes to the next); no effect on a running
        one (stop its generation instead) or one already over."""
        with self._cond:
            if turn.state is not TurnState.WAITING:
                return
            self._waiting.remove(turn)
            turn.state = TurnState.CANCELLED
            self._cond.notify_all()
        self._changed()

    def leave(self, turn: Turn) -> None:
        """End ``turn`` (running or waiting); the next waiting turn starts."""
        with self._cond:
            if turn.state is TurnState.WAITING:
                self._waiting.remove(turn)
                turn.state = TurnState.CANCELLED
            elif turn.state is TurnState.RUNNING and self._running is turn:
                turn.state = TurnState.DONE
                self._running = None
                if self._waiting:
                    self._start(self._waiting.popleft())
            self._cond.notify_all()
        self._changed()

    @contextlib.contextmanager
    def turn(self, who: str, timeout: float | None = None) -> Iterator[Turn]:
        """``with queue.turn("window"):`` the engine is this thread's until the block
        ends. Raises :class:`QueueFull`, or :class:`TurnCancelled` when the turn was
        cancelled or ``timeout`` passed before it came."""
        turn = self.join(who)
        try:
            if not self.wait(turn, timeout):
                raise TurnCancelled(f"{who} gave up waiting for the engine")
            yield turn
        finally:
            self.leave(turn)

    # ---------------------------------------------------------------- reading
    @property
    def running(self) -> Turn | None:
        with self._cond:
            return self._running

    def waiting(self) -> list[Turn]:
        with self._cond:
            return list(self._waiting)

    def position(self, turn: Turn) -> int:
        """How many turns are ahead of ``turn`` (0: it runs or is next)."""
        with self._cond:
            if turn.state is not TurnState.WAITING:
                return 0
            return self._waiting.index(turn) + (self._running is not None)

    def _start(self, turn: Turn) -> None:
        turn.state = TurnState.RUNNING
        turn.started = time.perf_counter()
        self._running = turn

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()


__all__ = ["EngineQueue", "QueueFull", "Turn", "TurnCancelled", "TurnState"]
