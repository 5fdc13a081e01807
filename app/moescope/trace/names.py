"""Trace file names: the format the app records in, and every name the reader opens.

The writer picks a trace's format by its name (:func:`moescope.trace.writer.open_writer`),
and the reader by its first bytes. The window, its dialogs, drag-and-drop, the pruning of
old sessions, the export and the command line all ask this module rather than spell a
suffix, so the recorded format changes by changing :data:`RECORD_SUFFIX` alone.

A format finished at close (Parquet) is recorded first to a crash-safe journal beside the
final name (``NAME.parquet.journal.arrows``, an Arrow stream that opens as a trace): until
the session closes the journal is the file on disk, and after a crash it stays the trace.
:func:`live_trace_file` finds whichever exists, :func:`session_stem` groups both as one
session.
"""

from __future__ import annotations

import os
from pathlib import Path

RECORD_SUFFIX = ".parquet"
"""The format new sessions are recorded in (the window; ``moescope chat --trace`` takes the
name's suffix: any of :data:`TRACE_SUFFIXES`)."""

TRACE_SUFFIXES = (".arrows", ".parquet", ".jsonl", ".jsonl.gz")
"""Every trace name the reader opens: version 2 (Arrow stream, Parquet) and version 1
(JSON Lines, plain or gzip)."""

JOURNAL_SUFFIX = ".journal.arrows"
"""Appended to a finished form's name (``NAME.parquet``): its journal, an Arrow stream
(the same name :mod:`moescope.trace.parquet_format` records to)."""

PART_SUFFIX = ".part"
"""A file being written whole (``moescope.util.files``): ``.NAME.XXXXXXXX.part`` beside
``NAME`` until it is renamed over it; a crash mid-write leaves it."""

FORMAT_NAMES = {".arrows": "Arrow stream", ".parquet": "Parquet",
                ".jsonl": "JSON Lines", ".jsonl.gz": "gzip JSON Lines"}
"""Words for each suffix, for help texts and file dialogs."""


def trace_suffix(name: str | os.PathLike[str]) -> str | None:
    """The trace suffix ``name`` ends with (the longest that fits), or None."""
    text = os.fspath(name)
    fits = [s for s in TRACE_SUFFIXES if text.endswith(s) and len(text) > len(s)]
    return max(fits, key=len) if fits else None


def record_suffix(name: str | os.PathLike[str]) -> str | None:
    """The trace suffix a file to record is named with, in any letter case (``X.PARQUET``
    is Parquet, ``X.JSONL.GZ`` gzip JSON Lines), lower-cased; None for any other name,
    which :func:`moescope.trace.writer.open_writer` refuses rather than guess."""
    return trace_suffix(os.path.basename(os.fspath(name)).lower())


def unknown_suffix_message(name: str | os.PathLike[str]) -> str:
    """Why a trace cannot be recorded to ``name``: its suffix names no trace format."""
    return (f"{os.fspath(name)}: a trace's name says its format; end it with "
            f"{', '.join(TRACE_SUFFIXES)}")


def not_a_trace_name_message(name: str | os.PathLike[str]) -> str:
    """Why a file whose name has no trace suffix (``README.md``) could not be read as a
    trace: the suffixes a trace's name ends with, and what this one ends with (the
    reader's own reason, "its first line is not a JSON record", read as a damaged
    trace)."""
    base = os.path.basename(os.fspath(name))
    dot = base.rfind(".")
    ends = f"this one ends with {base[dot:]}" if dot > 0 else "this one has no suffix"
    return (f"{base}: not a MoEScope trace: a trace's name ends with "
            f"{', '.join(TRACE_SUFFIXES[:-1])} or {TRACE_SUFFIXES[-1]}; {ends}")


def journal_path(path: str | os.PathLike[str]) -> Path:
    """Where a trace finished at close (``NAME.parquet``) is written while recording."""
    return Path(os.fspath(path) + JOURNAL_SUFFIX)


def session_stem(name: str) -> str | None:
    """The session a file in the traces folder belongs to (``NAME`` for ``NAME.arrows``,
    ``NAME.parquet``, ``NAME.parquet.journal.arrows`` and a compaction's leftover
    ``.NAME.parquet.XXXXXXXX.part`` alike), or None for a file that is not a trace."""
    if name.startswith(".") and name.endswith(PART_SUFFIX):
        written, dot, _random = name[1:-len(PART_SUFFIX)].rpartition(".")
        return session_stem(written) if dot and not written.startswith(".") else None
    if name.endswith(JOURNAL_SUFFIX):
        finished = name[:-len(JOURNAL_SUFFIX)]
        suffix = trace_suffix(finished)
        if suffix is not None:
            return finished[:-len(suffix)]
    suffix = trace_suffix(name)
    return name[:-len(suffix)] if suffix is not None else None


def live_trace_file(path: str | os.PathLike[str]) -> Path:
    """The file on disk now for a trace recorded to ``path``: the trace itself, or its
    journal while a finished-at-close form is still being recorded or compacted (or after
    a crash); ``path`` when neither exists. A journal's own name, once the journal is
    compacted and gone, gives the finished file."""
    p = Path(path)
    if os.path.exists(p):  # not Path.exists: a name too long (the journal's) raised
        return p
    text = os.fspath(p)
    if text.endswith(JOURNAL_SUFFIX) and trace_suffix(text[:-len(JOURNAL_SUFFIX)]):
        finished = Path(text[:-len(JOURNAL_SUFFIX)])
        return finished if os.path.exists(finished) else p
    journal = journal_path(p)
    return journal if os.path.exists(journal) else p


def with_trace_suffix(path: str | os.PathLike[str], suffix: str) -> Path:
    """``path`` named as a ``suffix`` trace: a trace suffix it has is replaced, anything
    else kept (``run.v2`` becomes ``run.v2.arrows``, ``a.jsonl`` becomes ``a.arrows``)."""
    p = Path(path)
    old = trace_suffix(p.name)
    base = p.name[:-len(old)] if old is not None else p.name
    return p.with_name(base + suffix)


def dialog_filter() -> str:
    """The file dialogs' filter for every trace the reader opens."""
    patterns = " ".join(f"*{s}" for s in TRACE_SUFFIXES)
    return f"MoEScope traces ({patterns});;All files (*)"


def formats_help() -> str:
    """The suffixes and their formats, for ``--trace`` help texts."""
    return ", ".join(f"{s} ({FORMAT_NAMES[s]})" for s in TRACE_SUFFIXES)
