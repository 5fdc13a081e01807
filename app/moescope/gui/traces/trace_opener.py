"""Opening a trace off the GUI thread.

A session's trace can be gigabytes (a long chat on a 512-expert model writes ~170 kB a
token), and reading one takes seconds to minutes: on the GUI thread that would freeze the
chat, the plots and the Stop button. :class:`TraceOpener` reads and rebuilds it on its own
thread and reports progress; the window shows a cancellable progress dialog and opens the
trace window when it is done. The chat goes on meanwhile.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from PySide6.QtCore import QThread, Signal

from moescope.display.trace_io import account, reopen
from moescope.trace import TraceFormatError, TraceReadCancelled

log = logging.getLogger("moescope.gui")

PROGRESS_STEPS = 1000
"""Progress is reported in thousandths of the file (a signal only when that changes)."""


class TraceOpener(QThread):
    """Reads one trace (:func:`moescope.display.trace_io.reopen`) on its own thread.

    Signals (queued to the GUI thread, where this object lives): ``progressed(done,
    PROGRESS_STEPS)`` as the file is read, then exactly one of ``opened(path,
    ReopenedTrace)``, ``failed(message)``, or nothing after :meth:`cancel`; last, always,
    ``done(self)``, so its owner can free it and its dialog (a receiver needs no
    ``sender()``, which only a registered Qt slot gets).
    """

    progressed = Signal(int, int)
    opened = Signal(str, object)  # path, ReopenedTrace
    failed = Signal(str)
    done = Signal(object)  # this opener: run() has returned

    def __init__(self, path: str | Path) -> None:
        super().__init__()
        self.path = Path(path)
        self._cancel = threading.Event()
        self._last = -1

    def cancel(self) -> None:
        """Any thread: stop at the next record; nothing is emitted after."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def _report(self, done: int, total: int) -> bool:
        step = PROGRESS_STEPS * done // total if total else PROGRESS_STEPS
        if step != self._last:
            self._last = step
            self.progressed.emit(step, PROGRESS_STEPS)
        return not self._cancel.is_set()

    def run(self) -> None:
        try:
            self._read()
        finally:
            self.done.emit(self)

    def _read(self) -> None:
        try:
            reopened = reopen(self.path, progress=self._report)
            if self._cancel.is_set():
                raise TraceReadCancelled
            reopened = account(reopened)  # the window's numbers, off the GUI thread
        except TraceReadCancelled:
            log.info("opening %s was cancelled", self.path.name)
            return
        except MemoryError:
            self.failed.emit(f"{self.path.name}: not enough memory to open this trace (its "
                             "router inputs are held in memory for the What-if tool)")
            return
        except (TraceFormatError, OSError, ValueError, KeyError) as err:
            self.failed.emit(str(err))
            return
        except Exception as err:  # a reader bug must still end in a message, not silence
            log.exception("opening %s failed", self.path)
            self.failed.emit(f"{self.path.name}: cannot open this trace "
                             f"({type(err).__name__}: {err}); the log has the details")
            return
        if not self._cancel.is_set():
            self.opened.emit(str(self.path), reopened)
