"""Listing the traces folder off the GUI thread, for File ▸ Recent sessions and the
Recorded sessions dialog.

:func:`~moescope.display.trace_list.list_traces` reads each session's header (and counts
a journal's tokens): with hundreds of sessions, or a slow disk, that took the GUI thread
for as long, each time the menu or the dialog opened. :class:`SessionScanner` runs it on
Qt's thread pool and hands the list back by a signal on the GUI thread. A newer scan
supersedes an older one: the older is told to stop (at its next file) and its result, if
it still comes, is dropped, so the list shown is always the newest scan's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from pathlib import Path

from PySide6.QtCore import QObject, QThreadPool, Signal, Slot

from moescope.display.trace_list import SessionTrace, list_traces

log = logging.getLogger("moescope.gui")


class SessionScanner(QObject):
    """Scans a traces folder on a pool thread; ``listed(entries)`` on the GUI thread with
    the newest scan's sessions (newest first). Keep it parentless and referenced from
    Python: a running scan holds it too, so it outlives a closed dialog until the scan
    ends (its result then goes nowhere)."""

    listed = Signal(object)
    """list[SessionTrace]: the newest scan's result (older scans' never come)."""
    _arrived = Signal(int, object)  # (scan number, entries), from the pool thread

    def __init__(self) -> None:
        super().__init__()
        self._scan = 0
        self._cancel: threading.Event | None = None
        self.entries: list[SessionTrace] | None = None
        """The last result delivered (None before the first)."""
        self._arrived.connect(self._deliver)

    @property
    def scanning(self) -> bool:
        """A scan is running whose result has not been delivered yet."""
        return self._cancel is not None

    def scan(self, folder: Path, live: Path | None = None) -> int:
        """List ``folder`` on a pool thread (``live``: this window's session being
        recorded, marked as such); stops a scan still running. Returns the scan's number."""
        self.cancel()
        self._scan += 1
        number = self._scan
        cancel = self._cancel = threading.Event()
        marked = [live] if live is not None else []

        def work() -> None:
            try:
                entries = list_traces(folder, marked, cancelled=cancel.is_set)
            except Exception:  # a bug: said in the log, and the list says nothing found
                log.exception("listing the sessions in %s failed", folder)
                entries = []
            if not cancel.is_set():
                with contextlib.suppress(RuntimeError):  # the app is being torn down
                    self._arrived.emit(number, entries)

        QThreadPool.globalInstance().start(work)
        return number

    def cancel(self) -> None:
        """Stop the running scan, if any: its result is never delivered."""
        if self._cancel is not None:
            self._cancel.set()
            self._cancel = None

    @Slot(int, object)
    def _deliver(self, number: int, entries: list[SessionTrace]) -> None:
        if number != self._scan or self._cancel is None:
            return  # superseded (or cancelled) after it had finished
        self._cancel = None
        self.entries = entries
        self.listed.emit(entries)
