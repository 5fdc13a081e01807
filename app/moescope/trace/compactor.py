"""Finishing Parquet traces in the background, so that closing a recording never waits.

Compacting a journal to Parquet reads it whole and writes it again: 0.5 ms of CPU a
token, seconds for a long session. The window must not make its user wait for that at a
model load or unload, a comparison or quit, so it closes only the journal (the end record
written, a whole trace on disk that every reader opens, see
:func:`.names.live_trace_file`) and hands the rest to a :class:`Compactor`. The command
line has nobody else to wait for the file and compacts before it returns (a recorder
without a compactor).

One thread compacts, one journal at a time, and it ends when nothing is queued: a
compaction holds the journal's columns in memory, so two at once would hold both, and
the cores are the decode thread's. Every journal queued or being compacted is in
:meth:`Compactor.busy` (pruning old sessions skips them), and a job holds the journal's
advisory lock (:func:`.parquet_format.lock_journal`: the writer's, handed over) until it
is done, so another window finishing leftovers never takes it. A process killed meanwhile
leaves the journal (and maybe a ``.part`` file): the trace, finished at the next start
(:meth:`Compactor.finish_leftovers`) or by ``moescope trace compact``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from moescope.trace.names import JOURNAL_SUFFIX, PART_SUFFIX, session_stem

log = logging.getLogger(__name__)

MAX_LEFTOVERS = 1000
"""The most leftover journals one start looks at (a folder is not trusted to be small)."""


class Compactor:
    """Compacts closed Parquet journals on one background thread (thread-safe)."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: deque[tuple[Path | None, Callable[[], None]]] = deque()
        self._busy: set[Path] = set()
        self._running = False
        self.finished: list[Path] = []
        """Traces compacted so far (their Parquet files), oldest first."""
        self.failed: list[Path] = []
        """Journals that could not be compacted (they stay, and open as traces)."""
        self._stop = threading.Event()

    def submit(self, writer: Any) -> None:
        """Compact a :class:`~.parquet_format.ParquetTraceWriter` whose journal is closed
        (``close_journal`` returned True); it holds the journal's lock until done. A
        session that recorded no token is removed instead: an empty trace shows and
        replays nothing, and kept it would count among the sessions pruning keeps."""
        journal = Path(writer.journal)
        self._add(journal, lambda: self._compact_writer(writer))

    def finish_leftovers(self, directory: str | os.PathLike[str]) -> None:
        """In the background: compact every Parquet journal in ``directory`` that no live
        session owns (a crash's leftover: nobody holds its lock) and remove the stale
        ``.part`` files of those; each step is logged, and a journal that fails to
        compact stays as it is (it opens as a trace). An empty journal (a process killed
        before its session's first token: the stream's header is written with it) is
        removed: it holds nothing, and kept it would be refused at every start."""
        folder = Path(directory)
        self._add(None, lambda: self._finish_leftovers(folder))

    def busy(self) -> set[Path]:
        """The journals queued or being compacted now."""
        with self._cv:
            return set(self._busy)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until nothing is queued or being compacted (at most ``timeout`` seconds);
        True if so."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while self._running or self._queue:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._cv.wait(left)
        return True

    def stop(self) -> None:
        """Give up (quitting): the compaction running stops at its next step (a row
        group: tens of milliseconds) and the queued ones do not start; their journals
        stay, whole traces that the next start finishes, and no ``.part`` is left. For
        good: later jobs are given up too."""
        self._stop.set()

    # ------------------------------------------------------------------ the thread
    def _add(self, journal: Path | None, job: Callable[[], None]) -> None:
        with self._cv:
            if journal is not None:
                self._busy.add(journal)
            self._queue.append((journal, job))
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, name="moescope-trace-compactor",
                                 daemon=True).start()

    def _run(self) -> None:
        while True:
            with self._cv:
                if not self._queue:
                    self._running = False
                    self._cv.notify_all()
                    return
                journal, job = self._queue.popleft()
            try:
                job()
            except Exception:  # a bug: logged, and the queue goes on
                log.exception("compacting a trace failed")
            finally:
                with self._cv:
                    if journal is not None:
                        self._busy.discard(journal)
                    self._cv.notify_all()

    def _compact_writer(self, writer: Any) -> None:
        from moescope.trace.parquet_format import CompactionStopped

        if writer.n_tokens == 0:  # a load then quit, say: no session to keep (or to let
            with contextlib.suppress(OSError):  # push a real one out of the kept 20)
                Path(writer.journal).unlink()
                log.info("trace with no token removed: %s", writer.journal)
            writer.release()
            return
        if self._stop.is_set():
            writer.release()
            log.info("trace left as its journal (quitting): %s", writer.journal)
            return
        t0 = time.perf_counter()
        try:
            path = writer.compact(stop=self._stop.is_set)
        except CompactionStopped:
            log.info("trace left as its journal (quitting): %s", writer.journal)
            return
        except OSError as err:
            log.warning("trace left as its journal: %s", err)
            self.failed.append(Path(writer.journal))
            return
        log.info("trace compacted in %.2f s: %s", time.perf_counter() - t0, path)
        self.finished.append(path)

    def _finish_leftovers(self, folder: Path) -> None:
        try:
            names = sorted(p.name for p in folder.iterdir() if p.name.endswith(JOURNAL_SUFFIX))
        except OSError:  # no folder yet: nothing was recorded
            return
        for name in names[:MAX_LEFTOVERS]:
            if self._stop.is_set():
                return
            journal = folder / name
            with self._cv:
                if journal in self._busy:
                    continue
                self._busy.add(journal)
            try:
                self._finish_leftover(journal)
            finally:
                with self._cv:
                    self._busy.discard(journal)
                    self._cv.notify_all()

    def _finish_leftover(self, journal: Path) -> None:
        from moescope.trace.parquet_format import (
            CompactionStopped,
            compact,
            compacted_path,
            is_parquet_path,
            lock_journal,
        )
        from moescope.trace.schema import TraceFormatError

        dest = compacted_path(journal)
        if not is_parquet_path(dest) or not journal.is_file() or journal.is_symlink():
            return
        lock = lock_journal(journal)
        if lock is None:
            if journal.exists():
                log.info("trace journal %s is in use (a live session), left", journal.name)
            return
        try:
            for part in _parts_of(dest):
                with contextlib.suppress(OSError):
                    part.unlink()
                    log.info("removed %s, a compaction cut off", part.name)
            if os.fstat(lock).st_size == 0:  # killed before its first token: nothing in it
                with contextlib.suppress(OSError):
                    journal.unlink()
                    log.info("removed %s, an empty journal (its session recorded nothing)",
                             journal.name)
                return
            t0 = time.perf_counter()
            try:
                compact(journal, dest, remove=True, stop=self._stop.is_set)
            except CompactionStopped:
                log.info("trace journal %s left for the next start (quitting)", journal.name)
                return
            except (TraceFormatError, OSError, ValueError) as err:
                log.warning("trace journal %s left as it is (not compacted): %s",
                            journal.name, err)
                self.failed.append(journal)
                return
            except Exception as err:  # pyarrow's own errors: the journal stays all the same
                log.warning("trace journal %s left as it is: %s", journal.name, err)
                self.failed.append(journal)
                return
            log.info("finished leftover trace journal %s as %s in %.2f s", journal.name,
                     dest.name, time.perf_counter() - t0)
            self.finished.append(dest)
        finally:
            os.close(lock)


def _parts_of(dest: Path) -> list[Path]:
    """The ``.part`` files a compaction to ``dest`` left (``.NAME.parquet.XXXXXXXX.part``)."""
    prefix = f".{dest.name}."
    stem = session_stem(dest.name)
    out = []
    with contextlib.suppress(OSError):
        for p in dest.parent.iterdir():
            if (p.name.startswith(prefix) and p.name.endswith(PART_SUFFIX)
                    and session_stem(p.name) == stem and p.is_file() and not p.is_symlink()):
                out.append(p)
    return out
