"""``moescope trace compact JOURNAL [OUT]``.

A trace named ``*.parquet`` is recorded to a journal beside it (``NAME.parquet.journal.arrows``,
an Arrow IPC stream that a crash leaves readable) and compacted to Parquet when the session
closes normally. A session that was killed leaves the journal: this finishes it the same way
(journal -> temporary file -> fsync -> rename -> journal removed), keeping every complete
token. Any other version-2 stream (``.arrows``) is converted too, and kept.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from moescope.cli.options import path_arg


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``trace`` subcommand."""
    p = subparsers.add_parser(
        "trace", help="work with trace files (compact a journal left by a crash)",
        description="Trace file tools.")
    sub = p.add_subparsers(dest="trace_command", metavar="ACTION", required=True,
                           help="what to do with the trace")
    c = sub.add_parser(
        "compact", help="write a version-2 stream (a crash's journal) as a Parquet trace",
        description="Compact a version-2 trace stream (.arrows), such as the journal a "
                    "killed session left beside its .parquet name, into the Parquet form: "
                    "the same rows bit for bit, smaller, open in pandas, polars and DuckDB.")
    c.add_argument("journal", type=path_arg, metavar="JOURNAL",
                   help="a .arrows trace stream (NAME.parquet.journal.arrows, or any)")
    c.add_argument("out", type=path_arg, nargs="?", metavar="OUT",
                   help="the Parquet file to write (default: the name the journal was "
                        "recorded for, which it replaces, else JOURNAL with the suffix "
                        ".parquet, which is not overwritten if it is there)")
    c.add_argument("--keep", action="store_true",
                   help="keep the journal (a journal is removed once compacted by default; "
                        "another stream is always kept)")
    c.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Compact; user errors (not a stream, a bad row, an output that must not be written)
    propagate as MoEScopeError (exit 2)."""
    from moescope.trace.reader import check_regular
    from moescope.util.errors import MoEScopeError

    src: Path = args.journal
    check_regular(src)  # a FIFO's open would block
    try:
        with open(src, "rb") as f:
            magic = f.read(4)
    except OSError as err:
        raise MoEScopeError(f"{src}: cannot read ({err.strerror})") from None
    lock = _hold(src) if magic != b"PAR1" else None
    try:
        return _compact(args, src, magic)
    finally:
        if lock is not None:
            os.close(lock)


def _hold(src: Path) -> int | None:
    """The journal's advisory lock (:func:`~moescope.trace.parquet_format.lock_journal`),
    held while it is compacted (a descriptor to close), or None where there are no such
    locks. A live session's writer or compaction holds it: compacting and removing its
    journal under it lost every token recorded after, and the session's own compaction
    at its end found no journal (before its first token: "a session killed before its
    first token recorded nothing")."""
    from moescope.trace.parquet_format import fcntl
    from moescope.util.errors import MoEScopeError

    if fcntl is None:
        return None
    fd = os.open(src, os.O_RDONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise MoEScopeError(f"{src}: a session is recording to it (or compacting it) now; "
                            "not compacted: run this again once it has ended") from None
    except OSError:  # no locks on this file system
        os.close(fd)
        return None
    return fd


def _compact(args: argparse.Namespace, src: Path, magic: bytes) -> int:
    from moescope.trace.names import JOURNAL_SUFFIX
    from moescope.trace.parquet_format import compact, compacted_path
    from moescope.trace.schema import TraceFormatError
    from moescope.util.errors import MoEScopeError
    from moescope.util.files import OutputPathError

    if magic == b"PAR1":
        raise TraceFormatError(f"{src}: already a Parquet trace; nothing to compact")
    if not magic:
        raise TraceFormatError(f"{src}: empty file (a session killed before its first "
                               f"token recorded nothing); nothing to compact")
    if magic != b"\xff\xff\xff\xff":
        raise TraceFormatError(f"{src}: not a version-2 trace stream (.arrows); nothing to "
                               f"compact")
    if args.out is None and not src.name.endswith(JOURNAL_SUFFIX) \
            and os.path.lexists(compacted_path(src)):
        # a name the user did not give is never written over (an OUT given is theirs; a
        # journal's is the name its session was recorded to, which it was to replace)
        raise MoEScopeError(f"{compacted_path(src)} is already there; not overwritten (give "
                            f"OUT to write the Parquet trace elsewhere)")
    remove = src.name.endswith(JOURNAL_SUFFIX) and not args.keep
    try:
        out = compact(src, args.out, remove=remove)
    except OutputPathError as err:  # names the output and what is wrong with it
        raise MoEScopeError(f"{err.filename}: {err.strerror}; not written") from None
    except OSError as err:  # a full disk names no file, or only the temporary
        dest = args.out or compacted_path(src)
        raise MoEScopeError(f"{dest}: not written ({err.strerror or err})") from None
    size = out.stat().st_size if out.is_file() else 0
    print(f"{out}: {size:,} bytes" + (f"; {src} removed" if remove else ""))
    return 0
