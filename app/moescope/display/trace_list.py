"""The recorded sessions in the traces folder, as a list a window can show.

The window records every session into its traces folder (:func:`moescope.util.paths
.traces_dir`; :func:`.trace_io.prune_traces` keeps the newest), but a user who wants one
back should not need to know the folder or read cut-off file names: File ▸ Recent sessions
and the Recorded sessions dialog list them from here, newest first, each with when it was
recorded, its model, tokens, size, format and state.

Listing must be quick (it runs when a menu opens, on the GUI thread), so no trace is read:
each file's header and token count come from :func:`moescope.trace.peek.peek_trace`,
remembered while the file's size and time are unchanged. A file that does not peek (empty,
foreign, damaged) is listed as unreadable with the reason, never raised. The one count that
costs work is a gzip JSON Lines trace's without its end member (a crash, an older writer):
it is decompressed from its start, at most :data:`~moescope.trace.peek.MAX_GZIP_SCAN`
compressed bytes a file and :data:`GZIP_SCAN_PER_LISTING` a listing (~0.1 s), and a longer
one is listed as "≥N" tokens (:attr:`SessionTrace.tokens_partial`), counted further at a
later listing while the budget was short.

A session is every file of one name (:func:`moescope.trace.names.session_stem`): its
finished trace, or while it records (and after a crash) its journal. A journal that some
writer holds (:func:`moescope.trace.parquet_format.lock_journal`: this window's or another
one's) is *recording*: it opens as the tokens so far. One nobody holds and that never got
its end record was left by a crash: it opens as it is.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import logging
import os
import re
import stat
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from moescope.trace.names import (
    FORMAT_NAMES,
    JOURNAL_SUFFIX,
    session_stem,
    trace_suffix,
)
from moescope.trace.peek import MAX_GZIP_SCAN, TracePeek, peek_trace
from moescope.trace.schema import TraceFormatError

log = logging.getLogger(__name__)

class TraceState(Enum):
    FINISHED = "finished"
    """Closed normally (or an older trace that says nothing of it): opens as recorded."""
    RECORDING = "recording"
    """A journal a live writer holds: opens as the tokens recorded so far."""
    CRASHED = "crashed"
    """A journal nobody holds, without its end record: the app stopped mid-session."""
    EMPTY = "empty"
    """No token recorded yet (a session's journal gets its header with its first token):
    nothing to open."""
    UNREADABLE = "unreadable"
    """Not a trace this MoEScope reads: :attr:`SessionTrace.reason` says why."""


@dataclass(frozen=True)
class SessionTrace:
    """One recorded session in the traces folder."""

    path: Path
    """The file to open: the finished trace, else the journal."""
    state: TraceState
    modified: float
    """The newest of the session's files' modification times (as
    :func:`.trace_io.prune_traces` ranks sessions)."""
    size: int
    """Bytes of :attr:`path`."""
    recorded: _dt.datetime | None = None
    """When recording began (the header's time), else None."""
    model: str = ""
    policy: str = ""
    tokens: int | None = None
    """None where only a full read counts them (a JSON Lines trace whose last line does not
    say) or nothing was read."""
    tokens_partial: bool = False
    """``tokens`` is a lower bound: a long gzip JSON Lines trace without its end member,
    counted only in part (:attr:`.peek.TracePeek.partial`)."""
    format: str = ""
    """The file's format, in words (a journal says so)."""
    reason: str = ""
    """One line: why it does not read, or what a crash left."""
    truncated: bool = False
    """The last token was cut off mid-write (it is not counted, and opening drops it)."""
    this_window: bool = False
    """The session this window is recording now."""

    @property
    def openable(self) -> bool:
        """Whether it opens: not empty or unreadable, and a live one has a token."""
        if self.state is TraceState.RECORDING:
            return self.tokens != 0
        return self.state not in (TraceState.EMPTY, TraceState.UNREADABLE)

    @property
    def when(self) -> _dt.datetime:
        """When it was recorded, in local time: the header's time, else the file's."""
        if self.recorded is not None:
            return self.recorded.astimezone()
        return _dt.datetime.fromtimestamp(self.modified).astimezone()


MAX_LISTED = 500
"""The most sessions listed (the newest on disk): the window keeps 20, so a folder with
more holds other files, and peeking thousands would stall the menu."""

GZIP_SCAN_PER_LISTING = 4 << 20
"""The most compressed bytes of gzip traces decompressed to count them in one listing
(two files at most: 0.1 s on one core, a busy one; what a listing counted is remembered)."""

_PEEKS: dict[Path, tuple[tuple[int, int], TracePeek | str, int]] = {}
"""What each file peeked as (its header, or why it does not read), while its size and
modification time stay as they were, with the gzip bytes it was allowed to count."""
_MAX_PEEKS = 256


class _Budget:
    """Compressed bytes of gzip traces one listing may still decompress to count them."""

    def __init__(self, left: int) -> None:
        self.left = left


def _peek(path: Path, st: os.stat_result, budget: _Budget | None = None) -> TracePeek | str:
    key = (st.st_size, st.st_mtime_ns)
    allowed = MAX_GZIP_SCAN if budget is None else max(0, min(MAX_GZIP_SCAN, budget.left))
    known = _PEEKS.get(path)
    # a count cut short by a listing's budget is taken further when more is allowed
    if known is not None and known[0] == key and not (
            isinstance(known[1], TracePeek) and known[1].partial and known[2] < allowed):
        return known[1]
    try:
        result: TracePeek | str = peek_trace(path, gzip_scan=allowed)
        if budget is not None:
            budget.left -= result.scanned
    except TraceFormatError as err:
        result = _one_line(str(err), path.name)
        _charge_refused(path, budget, allowed)
    except Exception as err:  # a reader's surprise: still one line, the list goes on
        log.warning("listing %s: %s", path, err, exc_info=True)
        result = _one_line(f"cannot read it ({type(err).__name__}: {err})", path.name)
        _charge_refused(path, budget, allowed)
    if len(_PEEKS) >= _MAX_PEEKS:
        _PEEKS.clear()
    _PEEKS[path] = (key, result, allowed)
    return result


def _charge_refused(path: Path, budget: _Budget | None, allowed: int) -> None:
    """A gzip trace refused partway may have decompressed all it was allowed: charged in
    full, so a folder of corrupt ones cannot stall a listing (the refusal is kept until
    the file changes)."""
    if budget is not None and path.name.lower().endswith(".gz"):
        budget.left -= allowed


def _one_line(message: str, name: str) -> str:
    """``message`` on one line, without the file's name it starts with (the list shows
    the name beside it), at most 300 characters."""
    text = " ".join(message.split())
    if text.startswith(f"{name}: "):
        text = text[len(name) + 2:]
    return text[:300]


def _held(journal: Path) -> bool:
    """Whether a live writer or compaction holds ``journal`` (in any process, this one
    included: its lock is on another open file)."""
    from moescope.trace.parquet_format import fcntl, lock_journal

    if fcntl is None:  # no advisory locks: no journal is known to be left by a crash
        return True
    lock = lock_journal(journal)
    if lock is None:
        return journal.exists()
    os.close(lock)
    return False


def _pick(files: list[tuple[Path, os.stat_result]]) -> tuple[Path, os.stat_result] | None:
    """The file a session opens as: its finished trace (:func:`~moescope.trace.names
    .live_trace_file`'s rule), else its journal; None for a compaction's leftover alone."""
    finished = sorted(f for f in files if not f[0].name.startswith(".")
                      and not f[0].name.endswith(JOURNAL_SUFFIX))
    journals = sorted(f for f in files if f[0].name.endswith(JOURNAL_SUFFIX))
    return (finished or journals or [None])[0]


def _format_words(name: str) -> str:
    if name.endswith(JOURNAL_SUFFIX):
        return "Arrow stream (journal)"
    suffix = trace_suffix(name)
    return FORMAT_NAMES.get(suffix, "unknown") if suffix else "unknown"


def _created(text: str) -> _dt.datetime | None:
    try:
        when = _dt.datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return when if when.tzinfo is not None else when.replace(tzinfo=_dt.timezone.utc)


_NAMED = re.compile(r"^\d{8}-\d{6}-(.+)$")
"""The window's session names: ``YYYYMMDD-HHMMSS-MODEL`` (:func:`.trace_io.new_trace_path`)."""


def _model_from_name(name: str) -> str:
    """The model a session's file name says, for an entry with no header to read (a
    session that has recorded no token yet): its model file's stem, else nothing."""
    stem = session_stem(name)
    m = _NAMED.match(stem) if stem is not None else None
    return m.group(1) if m is not None else ""


def describe(path: Path, st: os.stat_result, modified: float, *,
             this_window: bool = False, budget: _Budget | None = None) -> SessionTrace:
    """One session's entry, from the file it opens as (``st``: that file's ``lstat``);
    ``this_window``: the session this window records now; ``budget``: what a listing may
    still decompress to count gzip traces (default: one file's
    :data:`~moescope.trace.peek.MAX_GZIP_SCAN`)."""
    base = {"path": path, "modified": modified, "size": st.st_size,
            "format": _format_words(path.name), "this_window": this_window}
    if not stat.S_ISREG(st.st_mode):
        what = "a folder" if stat.S_ISDIR(st.st_mode) else (
            "a link" if stat.S_ISLNK(st.st_mode) else "not a regular file")
        return SessionTrace(state=TraceState.UNREADABLE, reason=f"{what}, not a trace file "
                            "(open it with Open trace… if it leads to one)", **base)
    journal = path.name.endswith(JOURNAL_SUFFIX)
    # this window's own journal is known to be held: not locked to find out, which could
    # take a journal its writer has just created and not yet locked
    held = journal and (this_window or _held(path))
    if st.st_size == 0:
        if held:
            return SessionTrace(state=TraceState.RECORDING, tokens=0,
                                model=_model_from_name(path.name),
                                reason="recording: no token yet", **base)
        return SessionTrace(state=TraceState.EMPTY, tokens=0,
                            reason="empty: the session recorded no token", **base)
    peek = _peek(path, st, budget)
    if isinstance(peek, str):
        if held:  # a writer mid-way through its first token
            return SessionTrace(state=TraceState.RECORDING, tokens=0,
                                model=_model_from_name(path.name),
                                reason="recording: no token yet", **base)
        return SessionTrace(state=TraceState.UNREADABLE, reason=peek, **base)
    h = peek.header
    fields = {**base, "recorded": _created(h.created),
              "model": h.model.name or h.model.file_name,
              "policy": h.policy.name or "custom", "tokens": peek.tokens,
              "tokens_partial": peek.partial and peek.tokens is not None,
              "truncated": peek.truncated}
    if held:
        return SessionTrace(state=TraceState.RECORDING, **fields)
    if peek.ended is False:
        cut = " (its last token was cut off)" if peek.truncated else ""
        return SessionTrace(state=TraceState.CRASHED, reason="left by a crash: the app "
                            f"stopped before this session ended{cut}; it opens as recorded",
                            **fields)
    return SessionTrace(state=TraceState.FINISHED, **fields)


def list_traces(directory: Path, live: Iterable[str | os.PathLike[str]] = (),
                cancelled: Callable[[], bool] | None = None) -> list[SessionTrace]:
    """Every recorded session in ``directory``, the last recorded first (by
    :attr:`SessionTrace.when`: a leftover journal compacted at a later start is newer on
    disk than it was recorded); an empty list for a folder that is missing or unreadable.
    ``live`` names this window's session (any of its file
    names): it is marked :attr:`SessionTrace.this_window`. Files that are not traces by
    name are not listed; one that is by name but does not read is, as unreadable.
    ``cancelled`` (any thread's) is asked before each file: once it says True the listing
    stops and returns what it has (the window's scan on a thread, superseded)."""
    stop = cancelled or (lambda: False)
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    mine = {session_stem(Path(p).name) for p in live} - {None}
    sessions: dict[str, list[tuple[Path, os.stat_result]]] = {}
    for entry in entries:
        stem = session_stem(entry.name)
        if stem is None:
            continue
        with contextlib.suppress(OSError):
            sessions.setdefault(stem, []).append((Path(entry.path),
                                                  entry.stat(follow_symlinks=False)))
    newest = sorted(((max(st.st_mtime for _, st in files), stem, files)
                     for stem, files in sessions.items()), reverse=True)
    out = []
    budget = _Budget(GZIP_SCAN_PER_LISTING)
    for modified, stem, files in newest[:MAX_LISTED]:
        if stop():
            break
        picked = _pick(files)
        if picked is not None:
            out.append(describe(picked[0], picked[1], modified, this_window=stem in mine,
                                budget=budget))
    out.sort(key=lambda e: (e.when, e.path.name), reverse=True)
    return out


# --------------------------------------------------------------------------- words


def when_text(entry: SessionTrace) -> str:
    """``2026-12-01 23:04``, in local time."""
    return entry.when.strftime("%Y-%m-%d %H:%M")


def session_title(model: str, created: str, path: Path) -> str:
    """A session's name for a window title: its model and when it was recorded (local
    time), as the sessions list shows them; the file's name where the trace has neither
    (a journal's name says only ``….parquet.journal.arrows``)."""
    when = _created(created)
    stamp = when.astimezone().strftime("%Y-%m-%d %H:%M") if when is not None else ""
    parts = [x for x in (model, stamp) if x]
    return " · ".join(parts) if parts else path.name


def tokens_text(entry: SessionTrace) -> str:
    if entry.tokens is None:
        return "–"
    return f"≥{entry.tokens:,}" if entry.tokens_partial else f"{entry.tokens:,}"


def size_text(n: int) -> str:
    """Bytes in the unit a file manager would use (1 kB = 1000 bytes)."""
    value = float(n)
    for unit in ("bytes", "kB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{n} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"  # unreachable


def state_text(entry: SessionTrace) -> str:
    """A few words for the state column."""
    if entry.state is TraceState.RECORDING:
        return "recording now" if entry.this_window else "recording (another window)"
    if entry.state is TraceState.CRASHED:
        return "left by a crash"
    if entry.state is TraceState.EMPTY:
        return "empty"
    if entry.state is TraceState.UNREADABLE:
        return "unreadable"
    return "finished"


def detail_text(entry: SessionTrace) -> str:
    """A sentence about the entry, for a tooltip or the dialog's detail line: its file, a
    dash, then what it is (the path alone where there is nothing to say)."""
    parts: list[str] = []
    if entry.state is TraceState.UNREADABLE:
        parts.append(f"Cannot be opened: {entry.reason}.")
    elif entry.state is TraceState.EMPTY:
        parts.append("Nothing to open: this session recorded no token.")
    elif entry.state is TraceState.RECORDING:
        parts.append("Still being recorded" + (" by this window" if entry.this_window
                                               else " by another MoEScope window")
                     + ": it opens as the tokens recorded so far, not as a finished trace.")
    elif entry.state is TraceState.CRASHED:
        parts.append(entry.reason[:1].upper() + entry.reason[1:] + ".")
    elif entry.tokens_partial:
        parts.append(f"A long gzip JSON Lines trace: at least {entry.tokens:,} tokens, "
                     "counted without reading it all; all are counted when it opens.")
    elif entry.tokens is None:
        parts.append("A JSON Lines trace whose tokens are counted when it opens.")
    if entry.policy and entry.openable:
        parts.append(f"Policy at the start: {entry.policy}.")
    return " — ".join((str(entry.path), " ".join(parts))) if parts else str(entry.path)


def menu_text(entry: SessionTrace) -> str:
    """One line for a menu: when, model, tokens, and the state unless finished."""
    model = entry.model if len(entry.model) <= 40 else entry.model[:39] + "…"
    text = f"{when_text(entry)} · {model or entry.path.name}"
    if entry.openable:
        text += f" · {tokens_text(entry)} tokens" if entry.tokens is not None else ""
    if entry.state is not TraceState.FINISHED:
        text += f" ({state_text(entry)})"
    return text.replace("&", "&&")
