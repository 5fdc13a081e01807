"""Reading a trace back: every record validated, the bad line named, a truncated tail accepted.

This module reads the lines (plain or gzip, with bounds on a line's length and on blank and
unknown records) and walks the records in order; :mod:`.validate` checks each record's
fields against the header's model before anything is sized by them.
"""

from __future__ import annotations

import errno
import gc
import gzip
import json
import os
import stat
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import orjson

from moescope.trace.names import JOURNAL_SUFFIX
from moescope.trace.schema import (
    TokenRecord,
    Trace,
    TraceFormatError,
    TraceHeader,
)
from moescope.trace.validate import (
    _header_from_json,
    _is_scalar,
    _ReadState,
    _show,
    _token_from_json,
    _token_record,
    _token_slots,
    check_columns,
    check_stored_weights,
    may_hold_literals,
    prefetch_rows,
)
from moescope.util.errors import MoEScopeError


class TraceReadCancelled(MoEScopeError):
    """``read_trace``'s ``progress`` asked to stop (the user closed the window, say)."""


ReadProgress = Callable[[int, int], bool]
"""``progress(bytes_read, file_bytes)`` after each record; False stops the read."""

MAX_LINE_BYTES = 64 << 20
"""The longest record read: a token of a 48-layer, 512-expert model with f32 router inputs
is about 0.2 MB, so this leaves room for batched rows, and a file that is one endless line
(or a small gzip that inflates to one) ends after a fraction of a second."""
MAX_BLANK_LINES = 1024
"""The writer writes no blank line; a few from hand editing are forgiven, a gigabyte of
them (a small gzip that inflates to newlines) ends the read at once."""
MAX_UNKNOWN_RECORDS = 1024
"""Records of an unknown type (a newer minor version's) are skipped, up to this many plus
four per token: a file made of them is not a trace, and would take minutes to skip."""



def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a trace can hold")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
"""Strict JSON: ``NaN`` and ``Infinity`` are refused while parsing (an out-of-range number
such as ``1e999`` parses to infinity and is refused by the field's bounds). Integers are not
hooked (a Python call per integer doubled the parse time): each field bounds its own."""


def token_fields(text: bytes) -> Any:
    """A version-2 token's (or end record's) JSON fields, parsed by orjson: strict as
    :data:`_DECODER` (``NaN``, ``Infinity`` and ``1e999`` are refused, as are invalid UTF-8
    and lone surrogates, which no writer makes), a few times faster on a token's counter
    lists; an integer beyond 64 bits reads as a float, which the field's check refuses.
    Raises ``ValueError`` (orjson's ``JSONDecodeError``) on anything it cannot parse."""
    return orjson.loads(text)


def cut_after_member_magic(err: BaseException) -> bool:
    """Whether ``err``, raised reading a gzip stream, is the stream cut one byte into a
    member: the writer puts the end record in a gzip member of its own
    (:class:`.writer.TraceWriter`), and a write cut there (a full disk) can leave that
    member's first byte alone, which Python's gzip refuses as "not a gzipped file" (its
    header is read two bytes at a time; two or more bytes cut short are an EOFError)."""
    return isinstance(err, gzip.BadGzipFile) and \
        str(err) == f"Not a gzipped file ({_GZIP_FIRST_BYTE!r})"


_GZIP_FIRST_BYTE = b"\x1f"


class _LineReader:
    """Reads a trace's lines as they come (a long session's trace is gigabytes: never all
    in memory at once), plain or gzip, and tells a gzip stream that was cut off (a crash:
    everything sync-flushed before it is still complete) from one that is corrupt."""

    def __init__(self, path: Path, progress: ReadProgress | None) -> None:
        self.path = path
        self.progress = progress
        self.raw: IO[bytes] | None = None
        self.stream: IO[bytes] | None = None
        self.size = 0
        self.n = 0

    def lines(self) -> Iterator[tuple[int, bytes, bool]]:
        """(line number, raw line, ended with newline) for every line. A gzip stream cut
        off ends the lines with ``(n, b"", False)``; a corrupt one (bad data or CRC,
        garbage after it) raises :class:`TraceFormatError`, so it is never mistaken for a
        session that was cut off. ``progress`` hears of the bytes read (compressed bytes of
        a gzip file) after every line."""
        with open(self.path, "rb") as raw:
            self.raw = raw
            self.size = os.fstat(raw.fileno()).st_size
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            self.stream = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            while True:
                line = self._next_line()
                if line is None:
                    yield self.n + 1, b"", False
                    return
                if not line:
                    return
                self.n += 1
                if len(line) > MAX_LINE_BYTES:
                    raise TraceFormatError(f"{self.path.name}: line {self.n} is longer than "
                                           f"{MAX_LINE_BYTES >> 20} MiB: not a MoEScope trace")
                if not line.endswith(b"\n"):  # the last line: is it cut off, or corrupt?
                    after = self._next_line()  # raises for a corrupt stream
                    yield self.n, line, False
                    if after is None:
                        yield self.n + 1, b"", False
                    return
                yield self.n, line, True
                if self.progress is not None and not self.progress(raw.tell(), self.size):
                    raise TraceReadCancelled(f"{self.path.name}: reading the trace was "
                                             f"cancelled")

    def _next_line(self) -> bytes | None:
        """The next line (``b""`` at the end), or None where the stream was cut off."""
        assert self.stream is not None
        try:
            return self.stream.readline(MAX_LINE_BYTES + 1)
        except EOFError:  # ends inside a deflate block or the trailer: cut off
            return None
        except (zlib.error, gzip.BadGzipFile) as err:
            if cut_after_member_magic(err):
                return None
            raise TraceFormatError(f"{self.path.name}: corrupt gzip stream at line "
                                   f"{self.n + 1} ({self._where()}: {err})") from None

    def _where(self) -> str:
        return f"compressed byte {self.raw.tell() if self.raw else 0} of {self.size}"

    def damage(self, budget: int = MAX_LINE_BYTES) -> str | None:
        """Why the rest of a gzip stream is corrupt, or None (intact as far as ``budget``
        decompressed bytes, cut off, or not gzip): a record that does not parse in a gzip
        file is most often corruption, which the stream's CRC tells for certain."""
        if self.stream is None or self.stream is self.raw or self.raw is None \
                or self.raw.closed:
            return None
        read = 0
        try:
            while read < budget:
                chunk = self.stream.read(1 << 20)
                if not chunk:
                    return None
                read += len(chunk)
        except EOFError:
            return None
        except (zlib.error, gzip.BadGzipFile) as err:
            return None if cut_after_member_magic(err) else f"{self._where()}: {err}"
        return None


def check_regular(p: Path) -> None:
    """Refuse a FIFO, device or socket given as a trace before it is opened: a FIFO's open
    blocks until something writes to it (``replay`` hung), ``/dev/zero`` never ends, and
    a trace is read more than once (its first bytes, then its records), which no pipe can
    be. A missing file or a folder is left to the readers' own words."""
    try:
        mode = os.stat(p).st_mode
    except OSError as err:
        if err.errno == errno.ELOOP:  # was "no such trace file", of a link that is there
            raise TraceFormatError(f"{p}: a symbolic link that loops (or a chain of too "
                                   "many links), not a trace file") from None
        return
    except ValueError:
        return
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):
        return
    what = ("a FIFO (named pipe)" if stat.S_ISFIFO(mode) else "a socket"
            if stat.S_ISSOCK(mode) else "a device")
    raise TraceFormatError(f"{p}: {what}, not a regular file; a trace is read from a file")


def read_trace(path: str | os.PathLike[str], progress: ReadProgress | None = None) -> Trace:
    """Read and validate a trace (plain or gzip JSON Lines; version 2, an Arrow stream or
    its Parquet compaction, known by the file's first bytes).

    A malformed record raises :class:`TraceFormatError` naming its line and field; a last
    line without its newline (a writer killed mid-token) is dropped and flagged
    ``truncated``. Every count, size, id and step is checked against the header's model
    before anything is sized or looped by it (see ``docs/trace-format.md``).
    ``progress(bytes_read, file_bytes)`` is called after every record; returning False
    raises :class:`TraceReadCancelled`.

    The cyclic garbage collector is paused meanwhile: a read makes a few objects a token
    that live as long as the trace, and the collector's passes over them as they pile up
    cost 5-10% of a version-2 read. Its state is restored (with another thread reading too,
    only the read that found it on turns it back on).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        return _read_trace(path, progress)
    finally:
        if was:
            gc.enable()


def _read_trace(path: str | os.PathLike[str], progress: ReadProgress | None) -> Trace:
    p = Path(path)
    check_regular(p)
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except OSError:
        magic = b""  # the line reader below words the error
    arrow, parquet = magic == b"\xff\xff\xff\xff", magic == b"PAR1"
    if magic == b"GGUF":  # a model picked in the trace's place: not "line 1: not valid JSON"
        raise TraceFormatError(f"{p.name}: a GGUF model file, not a MoEScope trace (open "
                               "it as a model)")
    if arrow:
        return _read_arrow(p, progress)
    if parquet:
        from moescope.trace.parquet_format import read_parquet

        return read_parquet(p, progress)
    kind = {".parquet": "a Parquet file", ".arrows": "an Arrow stream"}.get(
        p.suffix.lower())
    # named as one but not begun as one; JSON Lines or gzip bytes read on (a .PARQUET
    # name recorded JSON Lines before suffixes were matched in any letter case)
    if kind is not None and magic and magic[:1] != b"{" and magic[:2] != b"\x1f\x8b":
        # (shorter than its magic too: 1-3 bytes read as JSON, "its first line is not a
        # JSON record")
        raise TraceFormatError(f"{p.name}: not {kind}, so not a MoEScope trace")
    header: TraceHeader | None = None
    tokens: list[TokenRecord] = []
    end: dict[str, Any] | None = None
    truncated = False
    blank = unknown = 0
    state: _ReadState | None = None
    reader = _LineReader(p, progress)
    lines = reader.lines()
    n = 0

    def refuse(message: str) -> TraceFormatError:
        """The error for line ``n``, unless the gzip stream it came from is corrupt: a
        flipped byte most often makes a line that does not parse, and the stream's CRC
        says why."""
        damage = reader.damage()
        if damage is not None:
            return TraceFormatError(f"{p.name}: corrupt gzip stream at line {n} (the line "
                                    f"does not read back; {damage})")
        return TraceFormatError(message)

    while True:
        try:
            n, raw, complete = next(lines)
        except StopIteration:
            break
        except FileNotFoundError:
            raise TraceFormatError(f"{p}: no such trace file") from None
        except IsADirectoryError:
            raise TraceFormatError(f"{p}: is a folder, not a trace file") from None
        except OSError as err:
            raise TraceFormatError(f"{p}: cannot read trace ({err})") from None
        if not raw and not complete:  # a gzip stream cut off
            if header is None:
                raise TraceFormatError(f"{p.name}: a damaged gzip stream before any "
                                       f"record, not a readable MoEScope trace")
            truncated = True
            break
        if not raw.strip():
            blank += 1
            if blank > MAX_BLANK_LINES:
                raise refuse(f"{p.name}: line {n}: more than {MAX_BLANK_LINES} blank "
                             f"lines, not a MoEScope trace")
            continue
        try:
            obj = _DECODER.decode(raw.decode("utf-8"))
            if not isinstance(obj, dict):
                raise ValueError("a record must be a JSON object")
        except (ValueError, RecursionError) as err:
            if not complete and header is not None:  # only the last line can lack its \n
                truncated = True  # the writer died while writing this line
                break
            what = ("nested deeper than any record" if isinstance(err, RecursionError)
                    else str(err))
            if header is None:  # no record yet: some other file (a text, a picture...)
                raise refuse(f"{p.name}: not a MoEScope trace (its first line is not a "
                             f"JSON record: {what})") from None
            raise refuse(f"{p.name}: line {n}: not valid JSON ({what})") from None
        kind = obj.get("type")
        try:
            if header is None:
                if kind != "header":
                    raise ValueError("the first record must be the header")
                header = _header_from_json(obj)
                state = _ReadState(header)
            elif type(kind) is not str:
                raise ValueError(f"type is {_show(kind)}, not a record type")
            elif kind == "token":
                assert state is not None
                tokens.append(_token_from_json(obj, header, len(tokens), state))
            elif kind == "end":
                end = {k: v for k, v in obj.items() if _is_scalar(v)}
            elif kind == "header":
                raise ValueError("a second header")
            else:  # written by a newer minor version: skipped, within reason
                unknown += 1
                if unknown > MAX_UNKNOWN_RECORDS + 4 * len(tokens):
                    raise ValueError(f"more than {unknown - 1} records of unknown types")
        except TraceFormatError as err:
            raise refuse(f"{p.name}: line {n}: {err}") from None
        except (KeyError, TypeError, ValueError, IndexError) as err:
            what = f"missing field {err}" if isinstance(err, KeyError) else str(err)
            shown = f"{kind} record" if isinstance(kind, str) and len(kind) < 20 else "record"
            raise refuse(f"{p.name}: line {n}: bad {shown}: {what}") from None
    if n == 0:
        if p.name.endswith(JOURNAL_SUFFIX):  # a stream's header goes out with its first token
            raise TraceFormatError(f"{p.name}: empty file: this session has recorded no "
                                   "token yet")
        raise TraceFormatError(f"{p.name}: empty file, not a MoEScope trace")
    if header is None:
        raise TraceFormatError(f"{p.name}: no header record")
    return Trace(header=header, tokens=tokens, end=end, truncated=truncated, path=p)



MAX_ROWS_PER_TOKEN = 1 << 16
"""The most event rows one token's batch may hold (a long prompt's ubatches: 48 layers x a
512-token ubatch is 24,576), so a hostile batch cannot size the reader's arrays."""


@dataclass
class Journal:
    """A version-2 stream as read, before its rows are checked: what the reader checks and
    what compaction (:mod:`.parquet_format`) writes out again."""

    header: TraceHeader
    schema: Any  # pa.Schema, with the header in its metadata
    texts: list[bytes]
    """Each token's fields, as the JSON its batch's metadata holds."""
    metas: list[dict[str, Any]]
    batches: list[Any]  # pa.RecordBatch, one per token
    end: dict[str, Any] | None
    end_text: bytes | None
    truncated: bool


def header_of(p: Path, raw: bytes | None, schema: Any, what: str,
              columns: Callable[[TraceHeader], Any] | None = None) -> TraceHeader:
    """A version-2 header from ``raw`` (a schema's ``moescope.header``), checked, with
    ``schema`` (metadata aside) the columns version 2 defines for it (``columns(header)``:
    default the stream's, :func:`.arrow_format.row_schema`)."""
    from moescope.trace import arrow_format as af

    if raw is None:
        raise TraceFormatError(f"{p.name}: {what} without a MoEScope header")
    try:
        obj = _DECODER.decode(raw.decode("utf-8"))
        if not isinstance(obj, dict):
            raise ValueError("the header must be a JSON object")
        header = _header_from_json(obj, versions=(af.ARROW_VERSION, af.ARROW_VERSION))
        want = (columns or af.row_schema)(header)
        if not schema.remove_metadata().equals(want.remove_metadata()):
            raise ValueError("the rows' columns are not the ones version 2 defines")
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, RecursionError,
            TraceFormatError) as err:
        what = f"missing field {err}" if isinstance(err, KeyError) else str(err)
        raise TraceFormatError(f"{p.name}: bad header: {what}") from None
    return header


def read_journal(p: Path, progress: ReadProgress | None = None) -> Journal:
    """A version-2 stream's header, tokens' fields and batches (rows not yet checked). A
    message cut off at the end (a writer killed mid-token) is dropped and flagged
    ``truncated``."""
    import pyarrow as pa

    from moescope.trace import arrow_format as af

    try:
        schema, batches, source = af.read_batches(p)
    except (pa.ArrowException, OSError, ValueError) as err:
        raise TraceFormatError(f"{p.name}: not a readable Arrow trace ({err})") from None
    header = header_of(p, (schema.metadata or {}).get(af.HEADER_KEY), schema,
                       "an Arrow stream")
    kept: list[pa.RecordBatch] = []
    metas: list[dict[str, Any]] = []
    texts: list[bytes] = []
    end: dict[str, Any] | None = None
    end_text: bytes | None = None
    truncated = False
    unknown = 0
    size = source.size()
    try:
        for i, (batch, meta) in enumerate(batches):
            if batch is None:
                truncated = True
                break
            # a flipped byte in a message can leave a buffer shorter than its length says
            # (or list offsets past their values): numpy then read beyond it, and the
            # compaction's cast raised ArrowInvalid (a traceback); ~20 us a batch
            batch.validate(full=True)
            if len(meta) == 1 and meta.key(0) == af.TOKEN_KEY:  # a token's (one lookup)
                text = meta.value(0)
            elif af.END_KEY in meta:
                end_text = meta[af.END_KEY]
                try:
                    d = token_fields(end_text)
                except ValueError as err:
                    raise ValueError(f"the end record is not JSON ({err})") from None
                end = {k: v for k, v in d.items() if _is_scalar(v)} if isinstance(d, dict) \
                    else {}
                continue
            else:
                text = meta.get(af.TOKEN_KEY)
            if text is None:
                unknown += 1
                if unknown > MAX_UNKNOWN_RECORDS + 4 * len(metas):
                    raise ValueError(f"more than {unknown - 1} batches without a token")
                continue
            if batch.num_rows > MAX_ROWS_PER_TOKEN:
                raise ValueError(f"token {len(metas)} has {batch.num_rows} rows, more than "
                                 f"{MAX_ROWS_PER_TOKEN}")
            try:
                d = token_fields(text)
            except ValueError as err:
                raise ValueError(f"token {len(metas)}: its fields are not JSON ({err})") \
                    from None
            if not isinstance(d, dict):
                raise ValueError(f"token {len(metas)}: its fields are not a JSON object")
            metas.append(d)
            texts.append(text)
            kept.append(batch)
            if progress is not None and i % 64 == 63 and not progress(source.tell(), size):
                raise TraceReadCancelled(f"{p.name}: reading the trace was cancelled")
    except (pa.ArrowException, OSError) as err:
        raise TraceFormatError(f"{p.name}: corrupt Arrow stream after token {len(metas)} "
                               f"({err})") from None
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise TraceFormatError(f"{p.name}: {err}") from None
    return Journal(header=header, schema=schema, texts=texts, metas=metas, batches=kept,
                   end=end, end_text=end_text, truncated=truncated)


def _read_arrow(p: Path, progress: ReadProgress | None) -> Trace:
    """Read and validate a version-2 trace (:mod:`.arrow_format`): the header from the
    schema, each token's fields from its batch's metadata, and every row field column by
    column over the whole file. A message cut off at the end (a writer killed mid-token)
    is dropped and flagged ``truncated``."""
    return assemble_journal(p, read_journal(p, progress))


def assemble_journal(p: Path, j: Journal) -> Trace:
    """The trace a read journal holds, every row checked (:func:`assemble`): what opening
    a stream returns, and what compaction checks before it writes."""
    import pyarrow as pa

    from moescope.trace import arrow_format as af

    token_rows = np.zeros(len(j.batches) + 1, dtype=np.int64)
    np.cumsum([b.num_rows for b in j.batches], out=token_rows[1:])
    whole = pa.Table.from_batches(j.batches, schema=j.schema) if j.batches else None
    return assemble(p, j.header, j.metas, j.end, j.truncated, token_rows,
                    lambda: af.columns_of(whole, j.header),
                    literals=may_hold_literals(b"\n".join(j.texts)))


def assemble(p: Path, header: TraceHeader, metas: list[dict[str, Any]],
             end: dict[str, Any] | None, truncated: bool, token_rows: npt.NDArray[np.int64],
             columns: Callable[[], dict[str, Any]],
             starts: npt.NDArray[np.int64] | None = None, *, literals: bool = True) -> Trace:
    """A version-2 trace from its tokens' fields (``metas``) and its rows (``columns()``,
    :func:`.arrow_format.columns_of`'s arrays; ``token_rows`` delimits each token's),
    every field checked against ``header`` as the stream's are; the one place both
    containers (stream and Parquet) build their :class:`Trace`. ``literals``: the
    tokens' JSON may hold ``true`` or ``false`` (then their PSR counters are checked a
    token at a time, where a boolean is refused)."""
    import pyarrow as pa

    from moescope.trace import arrow_format as af

    state = _ReadState(header)
    in_force = np.zeros(len(metas), dtype=np.int64)
    tokens: list[TokenRecord] = []
    counters = prefetch_rows(metas, header.model.moe_layers, not literals)
    for t, d in enumerate(metas):
        try:
            changes, slots, force = _token_slots(d, header, t, state)
            in_force[t] = force
            # its rows and router inputs are attached once the columns are checked
            tokens.append(_token_record(d, header, t, state, changes, slots, None, {},
                                        af.ColumnToken, None if counters is None
                                        else (counters[0][t], counters[1][t])))
        except (KeyError, TypeError, ValueError) as err:
            what = f"missing field {err}" if isinstance(err, KeyError) else str(err)
            raise TraceFormatError(f"{p.name}: token {t}: bad token record: {what}") from None
    try:
        cols = columns()
        check_columns(cols, header, token_rows, in_force)
        check_stored_weights(cols, header.model.top_k)
    except (ValueError, pa.ArrowException) as err:
        raise TraceFormatError(f"{p.name}: {err}") from None
    trace_columns = af.trace_columns(cols, token_rows, p.name, starts)
    bounds = token_rows.tolist()
    for t, record in enumerate(tokens):
        a, b = bounds[t], bounds[t + 1]
        record.routes = af.LazyRoutes(trace_columns, a, b)  # type: ignore[assignment]
        record.rows_from(trace_columns, a, b)  # type: ignore[attr-defined]
    return Trace(header=header, tokens=tokens, end=end, truncated=truncated, path=p,
                 columns=trace_columns)
