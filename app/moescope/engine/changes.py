"""The engine's policy and budget changes, in order, read through cursors.

A change requested from another thread (the window's dials) is applied by the decode thread
between tokens (:meth:`Engine.apply_requests`); the window's markers and the session trace
both need to know, at each token, what changed since the previous one. Each reader holds
its own :class:`ChangeCursor`, so readers never share a position, and the log keeps only
the latest entries (a reader that falls that far behind has long lost interest).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

from moescope.trace.schema import Change

KEEP = 1024
"""Entries the log keeps; one entry per applied request, so a reader reading every token
never misses one."""


@dataclass(frozen=True)
class RequestNumbers:
    """The numbers of the latest policy and budget requests (0: none yet). The engine
    numbers each request it is given; a report carrying an older number than the window's
    latest request is stale and must not move the control the user just moved."""

    policy: int = 0
    budget: int = 0

    def at_least(self, other: RequestNumbers) -> tuple[bool, bool]:
        """Whether each of these numbers has reached ``other``'s: (policy, budget)."""
        return self.policy >= other.policy, self.budget >= other.budget


class ChangeLog:
    """Every :class:`Change` the engine applied, with the core step it took effect at."""

    def __init__(self, keep: int = KEEP) -> None:
        self._entries: deque[tuple[int, int, Change]] = deque(maxlen=keep)
        self._count = 0

    def append(self, step: int, changes: Iterable[Change]) -> None:
        for change in changes:
            self._entries.append((self._count, step, change))
            self._count += 1

    def cursor(self) -> ChangeCursor:
        """A reader that sees the changes appended from now on."""
        return ChangeCursor(self)

    def __len__(self) -> int:
        return self._count


class ChangeCursor:
    """One reader's position in a :class:`ChangeLog`."""

    def __init__(self, log: ChangeLog) -> None:
        self.log = log
        self._seen = len(log)

    def take(self) -> list[tuple[int, Change]]:
        """``(step, change)`` of every change appended since the previous take."""
        new = [(step, change) for n, step, change in self.log._entries if n >= self._seen]
        self._seen = len(self.log)
        return new


__all__ = ["ChangeCursor", "ChangeLog", "RequestNumbers"]
