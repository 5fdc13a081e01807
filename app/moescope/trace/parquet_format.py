"""Trace format v2 as Parquet: a finished trace, compacted from its crash-safe journal.

The Arrow IPC stream (:mod:`.arrow_format`) is safe to the token but stores the router
probabilities raw: ~112 kB a token at Qwen3-Next's geometry, 98 kB of them f32
probabilities. Parquet with byte-stream-split floats, delta-packed integers and zstd
stores the same rows, bit for bit, in ~89 kB (``docs/benchmarks.md``), and pandas, polars
and DuckDB open it in one call. But Parquet writes its index (the footer) at the end, so
a file being written is unreadable until it is closed: a session is recorded to a
*journal* (an ordinary ``.arrows`` stream beside the requested name, :func:`journal_path`)
and, when the writer closes normally, compacted: journal -> a temporary ``.NAME.*.part``
file in the same folder -> fsync -> rename to ``NAME.parquet`` -> journal removed. A crash
before or during that leaves the journal, a complete v2 trace that opens as it is and that
``moescope trace compact`` finishes.

Layout: the stream's row columns with the same Arrow types (pyarrow stores the Arrow
schema in the file and restores fixed-size lists and narrow integers from it), in row
groups of whole tokens; the file's key-value metadata holds the header JSON
(``moescope.header``), every token's own fields as JSON Lines in token order, tokens
with no rows included (``moescope.tokens``), the end record (``moescope.end``) and the
rows without router inputs (``moescope.no_inputs``, ``[start, stop)`` ranges) so that a
reader knows which rows are exact without decoding the probabilities.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from moescope.trace import arrow_format as af
from moescope.trace.names import JOURNAL_SUFFIX, journal_path
from moescope.trace.schema import TokenRecord, Trace, TraceFormatError, TraceHeader
from moescope.util.files import (
    LONGEST_PATH,
    NAME_MAX,
    OutputPathError,
    check_output,
    fill_atomic,
)

try:
    import fcntl
except ImportError:  # Windows: no advisory locks, so no journal is taken for a leftover
    fcntl = None  # type: ignore[assignment]

SUFFIX = ".parquet"
"""The file name suffix of a compacted version-2 trace."""
MAGIC = b"PAR1"
"""A Parquet file begins and ends with these bytes."""
TOKENS_KEY, NO_INPUTS_KEY = b"moescope.tokens", b"moescope.no_inputs"
ROW_GROUP_BYTES = 12 << 20
"""Decoded probability bytes a row group holds at most (plus one token's; a row counts as
1 kB at least, so a small model's groups are not huge in rows): 128 tokens at Qwen3-Next's
geometry. Larger groups compressed no better; each group is the unit a row's
probabilities are decoded in, and the unit the threads decode in parallel."""
COMPRESSION_LEVEL = 1
"""The probabilities' zstd level: level 3 saved 1% of the bytes and cost a third more
time to write; their decoding costs the same at any level (~150 us a token at Qwen3-Next's
geometry, uncompressed too: it is the list levels, not zstd). The other columns are LZ4:
2 kB a token more than zstd, and opening a trace (which decodes all of them) a third
faster (31 against 47 us a token)."""
MAX_FOOTER_BYTES = 1 << 30
"""The largest footer read (its key-value metadata holds every token's fields: ~1 kB a
token, a few kB with resident masks), so a hostile length cannot size an allocation."""
STATISTICS = ("token", "step", "layer")
"""Columns with min/max per row group (a few bytes each), so that a query for some tokens
or layers (DuckDB, polars) skips the other row groups; the others have none."""
FLOAT_COLUMNS = ("probs.list.element", "gate.list.element", "weights.list.element",
                 "substituted_mass")
INTEGER_ENCODING = "DELTA_BINARY_PACKED"
"""Every integer column's encoding (then LZ4, as before): each page stores the differences
between values bit-packed at the width they need (an expert id of a 512-expert model in
10 bits, not 32), where PLAIN stored 4 or 8 bytes a value that LZ4 hardly shrank (it finds
repeats, not small numbers). The 40-token session of the demo model (issue: Parquet larger
than gzip JSON Lines) went from 109.7 to 89.2 kB, Qwen3-Next's geometry from 91.8 to 88.8 kB
a token, with the columns decoded as fast. A Parquet reader of any age reads it (the
encoding is in Parquet since 2013; pyarrow 14, DuckDB and polars read it); files written
with PLAIN read as before."""


def is_parquet_path(path: str | os.PathLike[str]) -> bool:
    """Whether a trace written to ``path`` is compacted to Parquet (by its name, in any
    letter case: ``X.PARQUET`` is recorded as Parquet too)."""
    return os.fspath(path).lower().endswith(SUFFIX)


def compacted_path(journal: str | os.PathLike[str]) -> Path:
    """Where :func:`compact` writes ``journal`` by default: the name it was recorded for
    (a journal), else the stream's name with ``.parquet`` for its suffix."""
    name = os.fspath(journal)
    if name.endswith(JOURNAL_SUFFIX) and len(name) > len(JOURNAL_SUFFIX):
        return Path(name[:-len(JOURNAL_SUFFIX)])
    return Path(journal).with_suffix(SUFFIX)


class JournalExistsError(TraceFormatError):
    """A journal is already at the name a new recording was to take: a session cut off,
    or another window's session that took the name first."""


def _journal_there(journal: Path) -> JournalExistsError:
    lock = lock_journal(journal)
    if lock is not None:
        os.close(lock)
    elif fcntl is not None and os.path.isfile(journal):  # held: compacting it is no advice
        return JournalExistsError(f"{journal}: a session is recording to this name now; "
                                  "give another name")
    return JournalExistsError(f"{journal}: a trace journal is already there (a session cut "
                            f"off? `moescope trace compact {journal}` finishes it); not "
                            f"overwritten")


def check_journal_free(path: str | os.PathLike[str]) -> None:
    """Refuse (:class:`TraceFormatError`) to record ``path`` (a ``.parquet`` name) when its
    journal is already there, before anything is loaded: the writer would refuse it
    anyway, after the command had spent minutes loading a big model."""
    journal = journal_path(Path(path))
    if not is_parquet_path(path):
        return
    if len(os.fsencode(journal.name)) > NAME_MAX:  # every look at it: ENAMETOOLONG
        raise TraceFormatError(f"{path}: the name is too long to record to: its journal "
                               f"({JOURNAL_SUFFIX} added) would be over {NAME_MAX} bytes; "
                               f"give a shorter name")
    if os.path.lexists(journal):
        raise _journal_there(journal)
    try:  # where the journal goes must take it: a path near PATH_MAX (4095 bytes) did not
        check_output(journal)
    except OutputPathError as err:
        if err.errno == errno.ENAMETOOLONG:
            raise TraceFormatError(f"{path}: the path is too long to record to: its journal "
                                   f"({JOURNAL_SUFFIX} added) would be over {LONGEST_PATH} "
                                   f"bytes; give a shorter path") from None
        raise TraceFormatError(f"{path}: its journal {journal.name} cannot be made there "
                               f"({err.strerror})") from None


def _create_new(path: Path) -> IO[bytes]:
    """Open ``path`` for writing only if nothing is there: a journal that exists is a
    session's trace left by a crash (or someone's file), never truncated."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOCTTY, 0o666)
    except FileExistsError:
        raise _journal_there(path) from None
    return os.fdopen(fd, "wb")


def lock_journal(path: Path) -> int | None:
    """An advisory lock on the journal ``path`` (a descriptor to close to release it), or
    None if another open file holds it (a live session's writer or compaction, in any
    process) or the system has no such locks. A crash releases it with the process, so
    a journal nobody can lock is a live session's and one anybody can is a leftover."""
    if fcntl is None:
        return None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def _no_input_ranges(batches: Sequence[pa.RecordBatch]) -> list[list[int]]:
    """``[start, stop)`` row ranges whose probabilities are null (no router inputs)."""
    ranges: list[list[int]] = []
    row = 0
    for b in batches:
        probs = b.column("probs")
        if probs.null_count:
            missing = ~np.asarray(pc.is_valid(probs).to_numpy(zero_copy_only=False))
            edges = np.flatnonzero(np.diff(np.r_[0, missing.astype(np.int8), 0]))
            for a, z in zip(edges[::2].tolist(), edges[1::2].tolist(), strict=True):
                if ranges and ranges[-1][1] == row + a:
                    ranges[-1][1] = row + z
                else:
                    ranges.append([row + a, row + z])
        row += b.num_rows
    return ranges


def _one_line(text: bytes) -> bytes:
    """A token's JSON on one line (the writer's is; a hand-edited journal's may not be)."""
    if b"\n" not in text and b"\r" not in text:
        return text
    return json.dumps(json.loads(text), ensure_ascii=False, separators=(",", ":")).encode()


def file_schema(schema: pa.Schema) -> pa.Schema:
    """The stream's row schema as a Parquet trace stores it: the same columns and types,
    but list entries declared non-null (they never are: a row without router inputs is a
    null list, not a list of nulls), which spares the decoder a level per value: reading
    the probabilities took 146 instead of 198 us a token, the other columns 29 instead
    of 34."""
    def field(f: pa.Field) -> pa.Field:
        t = f.type
        if pa.types.is_fixed_size_list(t):
            t = pa.list_(pa.field("element", t.value_type, nullable=False), t.list_size)
        elif pa.types.is_list(t):
            t = pa.list_(pa.field("element", t.value_type, nullable=False))
        return f.with_type(t)

    return pa.schema([field(f) for f in schema], metadata=schema.metadata)


def _leaf(field: pa.Field) -> str:
    """The Parquet column path of ``field`` (a list's values are ``name.list.element``)."""
    t = field.type
    nested = pa.types.is_list(t) or pa.types.is_fixed_size_list(t)
    return f"{field.name}.list.element" if nested else field.name


def column_encodings(schema: pa.Schema) -> dict[str, str]:
    """Each column's encoding: floats byte-stream-split (:data:`FLOAT_COLUMNS`), integers
    :data:`INTEGER_ENCODING`."""
    out = dict.fromkeys(FLOAT_COLUMNS, "BYTE_STREAM_SPLIT")
    for f in schema:
        t = f.type
        nested = pa.types.is_list(t) or pa.types.is_fixed_size_list(t)
        if pa.types.is_integer(t.value_type if nested else t):
            out[_leaf(f)] = INTEGER_ENCODING
    return out


class CompactionStopped(Exception):
    """A compaction given up on request (the window quitting): the journal stays."""


def _check(stop: Callable[[], bool] | None) -> None:
    if stop is not None and stop():
        raise CompactionStopped("compaction stopped; the journal is the trace")


def write_parquet(journal: Any, out: IO[bytes],
                  stop: Callable[[], bool] | None = None) -> None:
    """Write a read journal (:class:`~moescope.trace.reader.Journal`) to ``out`` as a
    Parquet trace; ``stop()`` is asked before each row group (True: raise
    :class:`CompactionStopped`)."""
    header_raw = journal.schema.metadata[af.HEADER_KEY]
    # the small keys in the schema's metadata too (pyarrow's read_schema shows them); the
    # tokens' fields only in the file's key-value metadata: a schema's metadata is stored
    # twice in the footer (its own keys and, base64, in ARROW:schema), which for a small
    # model doubled the footer and made Parquet larger than gzip JSON Lines
    meta = {af.HEADER_KEY: header_raw}
    if journal.end_text is not None:
        meta[af.END_KEY] = _one_line(journal.end_text)
    footer = {TOKENS_KEY: b"\n".join(_one_line(t) for t in journal.texts),
              NO_INPUTS_KEY: json.dumps(_no_input_ranges(journal.batches)).encode()}
    schema = file_schema(journal.schema).with_metadata(meta)
    e = journal.header.model.n_expert
    row_bytes = max(e * schema.field("probs").type.value_type.byte_width, 1024)
    codecs = {_leaf(f): "lz4" for f in schema}
    codecs[_leaf(schema.field("probs"))] = "zstd"
    with pq.ParquetWriter(out, schema, compression=codecs,
                          compression_level={_leaf(schema.field("probs")): COMPRESSION_LEVEL},
                          use_dictionary=False,
                          column_encoding=column_encodings(schema),
                          write_statistics=list(STATISTICS)) as writer:
        group: list[pa.RecordBatch] = []
        rows = 0
        for b in [*journal.batches, None]:
            if b is not None and b.num_rows:
                group.append(b)
                rows += b.num_rows
            if group and (b is None or rows * row_bytes >= ROW_GROUP_BYTES):
                _check(stop)
                table = pa.Table.from_batches(group, schema=journal.schema).cast(schema)
                writer.write_table(table, row_group_size=rows)
                group, rows = [], 0
        writer.add_key_value_metadata(footer)


def _sync_folder(folder: Path) -> None:
    """The rename and the journal's removal reach the disk in order (a power cut between
    them must not leave neither)."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def compact(journal: str | os.PathLike[str], out: str | os.PathLike[str] | None = None, *,
            remove: bool = False, stop: Callable[[], bool] | None = None) -> Path:
    """Write the v2 stream ``journal`` as a Parquet trace at ``out`` (default
    :func:`compacted_path`), all or nothing; ``remove``: then delete the journal. Every
    row is checked first (:class:`TraceFormatError` naming the file): the journal is only
    removed once a file that opens holds it. A journal cut off mid-token gives its
    complete tokens. ``stop()`` True between steps gives up (:class:`CompactionStopped`,
    nothing written, the journal kept)."""
    from moescope.trace.reader import assemble_journal, read_journal

    src = Path(journal)
    dest = compacted_path(src) if out is None else Path(out)
    check_output(dest, [src])
    j = read_journal(src)
    _check(stop)
    assemble_journal(src, j)
    _check(stop)
    fill_atomic(dest, lambda f: write_parquet(j, f, stop), inputs=[src])
    if remove:
        _sync_folder(dest.parent)
        src.unlink()
        _sync_folder(src.parent)
    return dest


class ParquetTraceWriter:
    """Records a version-2 trace to its journal (:class:`.arrow_format.ArrowTraceWriter`:
    a token on disk before :meth:`write_token` returns) and compacts it to ``path`` at
    :meth:`close` (on the caller's thread: the recorder calls it on its writer thread).

    :meth:`close_journal` and :meth:`compact` are the two halves of :meth:`close`, for a
    caller that finishes the file later, elsewhere (:class:`.compactor.Compactor`). From
    creation until it is compacted (or closed without compaction) the writer holds an
    advisory lock on the journal (:func:`lock_journal`): another process that finds the
    journal then knows a live session owns it and leaves it alone."""

    def __init__(self, path: str | os.PathLike[str], header: TraceHeader, *,
                 fsync: bool = False) -> None:
        self.path = Path(path)
        self.header = header
        check_output(self.path)
        self.journal = journal_path(self.path)
        check_output(self.journal)
        self._journal = af.ArrowTraceWriter(self.journal, header, fsync=fsync,
                                            stream=_create_new(self.journal))
        self._lock = lock_journal(self.journal)
        if self._lock is None and fcntl is not None:  # another window's start took it
            self._journal._raw.close()
            raise OSError(f"{self.journal}: another MoEScope window took this new journal "
                          "as a leftover; not recorded")
        self._failed = False
        self.compacted = False

    @property
    def n_tokens(self) -> int:
        return self._journal.n_tokens

    @property
    def bytes_written(self) -> int:
        """The journal's size: the disk holds that much until it is compacted."""
        return self._journal.bytes_written

    def write_token(self, record: TokenRecord) -> None:
        """Append one token to the journal (written and flushed before this returns)."""
        try:
            self._journal.write_token(record)
        except BaseException:
            self._failed = True  # not compacted: the journal holds what was written
            raise

    def close(self, **end: Any) -> None:
        """Write the end record to the journal, close it, and compact it (unless a write
        failed: then the journal is the trace). A failed compaction leaves the journal."""
        if self.close_journal(**end):
            self.compact()

    def close_journal(self, **end: Any) -> bool:
        """Write the end record and close the journal (it is then a whole trace on disk);
        True if :meth:`compact` is due (nothing failed). A second call returns False."""
        if self._journal._raw.closed:
            return False
        try:
            self._journal.close(**end)
        except BaseException:
            self._failed = True
            raise
        finally:
            if self._failed:
                self._unlock()
        return not self._failed

    def compact(self, stop: Callable[[], bool] | None = None) -> Path:
        """Compact the closed journal to :attr:`path` and remove it (``OSError`` if that
        failed, :class:`CompactionStopped` if ``stop()`` gave up: the journal stays, and
        is the trace); the journal's lock ends either way."""
        try:
            compact(self.journal, self.path, remove=True, stop=stop)
        except (TraceFormatError, pa.ArrowException, ValueError) as err:
            raise OSError(f"{self.journal}: not compacted ({err}); the trace is this "
                          f"journal") from None
        finally:
            self._unlock()
        self.compacted = True
        return self.path

    def release(self) -> None:
        """Leave the closed journal as the trace, uncompacted: its lock ends (a later
        start finishes it)."""
        self._unlock()

    def _unlock(self) -> None:
        lock, self._lock = self._lock, None
        if lock is not None:
            os.close(lock)

    @property
    def readable(self) -> Path:
        """The file that holds the trace now: the journal until it is compacted."""
        return self.path if self.compacted else self.journal

    def __enter__(self) -> ParquetTraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- reading


class _Probs(af.LazyBlocks):
    """A Parquet trace's probabilities, one block per row group, decoded when first
    indexed (the last block kept: a token's routes read its rows one by one) or all at
    once (:meth:`join`, with threads). Each block's null rows must be the rows the file's
    index says lack router inputs (else :class:`TraceFormatError`)."""

    def __init__(self, path: Path, pf: pq.ParquetFile, starts: npt.NDArray[np.int64],
                 exact: npt.NDArray[np.bool_], width: int) -> None:
        self._path = path
        self._pf = pf
        self._starts = starts
        self._exact = exact
        self._width = width
        self._lock = threading.Lock()
        self._last: tuple[int, npt.NDArray[Any]] | None = None

    def __len__(self) -> int:
        return len(self._starts) - 1

    def _decode(self, pf: pq.ParquetFile, i: int, out: npt.NDArray[Any] | None = None
                ) -> npt.NDArray[Any]:
        a, z = int(self._starts[i]), int(self._starts[i + 1])
        try:
            col = pf.read_row_group(i, columns=["probs"], use_threads=False).column(0)
            chunk = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            if len(chunk) != z - a:
                raise ValueError(f"row group {i} holds {len(chunk)} rows, not {z - a}")
            w = self._width
            values = chunk.values.to_numpy(zero_copy_only=False)
            values = values[chunk.offset * w:(chunk.offset + len(chunk)) * w]
            valid = np.ones(len(chunk), np.bool_) if chunk.null_count == 0 else \
                np.asarray(pc.is_valid(chunk).to_numpy(zero_copy_only=False))
        except (pa.ArrowException, OSError, ValueError) as err:
            raise TraceFormatError(f"{self._path.name}: corrupt Parquet trace: the "
                                   f"probabilities of rows {a}..{z - 1} do not read "
                                   f"({_said(err)})") from None
        bad = valid != self._exact[a:z]
        if bad.any():
            raise TraceFormatError(f"{self._path.name}: row {a + int(np.argmax(bad))}: its "
                                   f"probabilities disagree with the file's index of rows "
                                   f"without router inputs")
        block = values.reshape(z - a, w)
        if out is not None:
            out[a:z] = block
            if not valid.all():
                out[a:z][~valid] = 0
            return out
        if not valid.all():  # a copy (a decoded column is read-only) with those rows zero
            block = np.array(block)
            block[~valid] = 0
        return block

    def _block(self, i: int) -> npt.NDArray[Any]:
        with self._lock:
            if self._last is None or self._last[0] != i:
                self._last = (i, self._decode(self._pf, i))
            return self._last[1]

    def join(self) -> npt.NDArray[np.float32]:
        """Every row group's probabilities in one float32 array, decoded by up to four
        threads (a file reader each: pyarrow's is not shared between threads)."""
        n_rows = int(self._starts[-1])
        out = np.empty((n_rows, self._width), dtype=np.float32)  # every row group fills its
        groups = list(range(len(self)))
        if not groups:
            return out
        n_threads = max(1, min(4, os.cpu_count() or 1, len(groups)))
        if n_threads == 1:
            with self._lock:  # the file reader is shared with __getitem__
                for i in groups:
                    self._decode(self._pf, i, out)
            af.release_unused_memory()
            return out

        def work(share: list[int]) -> None:
            try:
                pf = _open(self._path)
            except (pa.ArrowException, OSError) as err:  # removed since it was opened
                raise TraceFormatError(f"{self._path.name}: the probabilities do not read "
                                       f"({_said(err)})") from None
            try:
                for i in share:
                    self._decode(pf, i, out)
            finally:
                pf.close()
                af.release_unused_memory()  # this thread's heap (mimalloc's is per thread)

        with ThreadPoolExecutor(n_threads, thread_name_prefix="moescope-probs") as pool:
            for f in [pool.submit(work, groups[t::n_threads]) for t in range(n_threads)]:
                f.result()
        return out


def _said(err: BaseException) -> str:
    """pyarrow's message on one line (some end in a newline)."""
    return " ".join(str(err).split())


def _open(p: Path) -> pq.ParquetFile:
    # mapped by its bytes' name: pyarrow encodes a str path as UTF-8, so a name that is
    # not (a byte 0xff, as Python holds it: a surrogate) was "not a readable Parquet trace"
    return pq.ParquetFile(pa.memory_map(os.fsencode(p), "r"),
                          thrift_string_size_limit=MAX_FOOTER_BYTES)


def _footer_length(p: Path) -> int:
    """The footer's length from the file's last 8 bytes, bounded by the file and by
    :data:`MAX_FOOTER_BYTES`; a file without one (a compaction cut off) is refused."""
    with open(p, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size < 12:
            raise TraceFormatError(f"{p.name}: a Parquet file cut off before its footer "
                                   f"(an interrupted compaction?), not a trace")
        f.seek(size - 8)
        tail = f.read(8)
    if tail[4:] != MAGIC:
        raise TraceFormatError(f"{p.name}: a Parquet file cut off before its footer (an "
                               f"interrupted compaction?), not a trace")
    n = int.from_bytes(tail[:4], "little")
    if n > min(size - 12, MAX_FOOTER_BYTES):
        raise TraceFormatError(f"{p.name}: its Parquet footer claims {n:,} bytes, more "
                               f"than the file or the reader ({MAX_FOOTER_BYTES:,}) allow")
    return n


def _ranges(raw: bytes | None, n_rows: int) -> npt.NDArray[np.bool_]:
    """Which rows hold router inputs, from ``moescope.no_inputs`` (sorted, disjoint
    ``[start, stop)`` ranges within the rows)."""
    exact = np.ones(n_rows, dtype=np.bool_)
    if raw is None:
        raise ValueError("no index of the rows without router inputs "
                         f"({NO_INPUTS_KEY.decode()})")
    items = json.loads(raw)
    if not isinstance(items, list) or len(items) > n_rows:
        raise ValueError(f"{NO_INPUTS_KEY.decode()} is not a list of row ranges")
    last = 0
    for item in items:
        if not (isinstance(item, list) and len(item) == 2
                and all(type(v) is int for v in item) and last <= item[0] < item[1] <= n_rows):
            raise ValueError(f"{NO_INPUTS_KEY.decode()}: {str(item)[:40]} is not a range of "
                             f"rows in order within 0..{n_rows}")
        exact[item[0]:item[1]] = False
        last = item[1]
    return exact


def file_metadata(md: pq.FileMetaData) -> dict[bytes, bytes]:
    """The file's key-value metadata (where :func:`write_parquet` puts the tokens' fields;
    the schema's own metadata is there too)."""
    return dict(md.metadata or {})


def read_parquet(p: Path, progress: Any = None) -> Trace:
    """Read and validate a compacted version-2 trace: the header and tokens' fields from
    the footer, every row column but the probabilities decoded and checked as the
    stream's are (:func:`~moescope.trace.reader.assemble`); the probabilities are decoded
    when first used."""
    from moescope.trace.reader import MAX_ROWS_PER_TOKEN, assemble, header_of, token_fields
    from moescope.trace.validate import _is_scalar, may_hold_literals

    _footer_length(p)
    try:
        pf = _open(p)
        schema = pf.schema_arrow
        md = pf.metadata
    except (pa.ArrowException, OSError, ValueError) as err:
        raise TraceFormatError(f"{p.name}: not a readable Parquet trace ({_said(err)})") from None
    meta = file_metadata(md)
    header = header_of(p, meta.get(af.HEADER_KEY), schema, "a Parquet file",
                       lambda h: file_schema(af.row_schema(h)))
    try:
        raw = meta.get(TOKENS_KEY)
        if raw is None:
            raise ValueError(f"no tokens ({TOKENS_KEY.decode()})")
        lines = raw.split(b"\n") if raw else []
        metas: list[dict[str, Any]] = []
        for t, line in enumerate(lines):
            try:
                d = token_fields(line)
            except (ValueError, UnicodeDecodeError, RecursionError) as err:
                raise ValueError(f"token {t}: its fields are not JSON "
                                 f"({_said(err)[:80]})") from None
            if not isinstance(d, dict):
                raise ValueError(f"token {t}: its fields are not a JSON object")
            metas.append(d)
        end: dict[str, Any] | None = None
        if af.END_KEY in meta:
            d = token_fields(meta[af.END_KEY])
            end = {k: v for k, v in d.items() if _is_scalar(v)} if isinstance(d, dict) \
                else {}
        n_rows = md.num_rows
        if not 0 <= n_rows <= len(metas) * MAX_ROWS_PER_TOKEN:
            raise ValueError(f"{n_rows} rows for {len(metas)} tokens (at most "
                             f"{MAX_ROWS_PER_TOKEN} a token)")
        starts = np.zeros(md.num_row_groups + 1, dtype=np.int64)
        np.cumsum([md.row_group(i).num_rows for i in range(md.num_row_groups)],
                  out=starts[1:])
        if starts[-1] != n_rows or (np.diff(starts) < 0).any():
            raise ValueError("its row groups do not add up to its rows")
        exact = _ranges(meta.get(NO_INPUTS_KEY), n_rows)
    except (ValueError, UnicodeDecodeError, RecursionError) as err:
        raise TraceFormatError(f"{p.name}: bad Parquet trace metadata: {err}") from None
    names = [n for n in schema.names if n != "probs"]
    try:
        table = pf.read(columns=names, use_threads=False)
    except (pa.ArrowException, OSError, ValueError) as err:
        raise TraceFormatError(f"{p.name}: corrupt Parquet trace ({_said(err)})") from None
    if table.num_rows != n_rows:
        raise TraceFormatError(f"{p.name}: corrupt Parquet trace ({table.num_rows} rows "
                               f"read, {n_rows} in its index)")
    if progress is not None and not progress(1, 1):
        from moescope.trace.reader import TraceReadCancelled

        raise TraceReadCancelled(f"{p.name}: reading the trace was cancelled")
    token = table.column("token").to_numpy()
    if n_rows and (token.min() < 0 or token.max() >= len(metas)
                   or (np.diff(token) < 0).any()):
        bad = (token < 0) | (token >= len(metas)) | (np.diff(token, prepend=0) < 0)
        i = int(np.argmax(bad))
        raise TraceFormatError(f"{p.name}: row {i}.token {int(token[i])} is not a token of "
                               f"the trace's {len(metas)} in order")
    token_rows = np.searchsorted(token, np.arange(len(metas) + 1), side="left") \
        .astype(np.int64)
    if len(metas) and int(np.diff(token_rows).max()) > MAX_ROWS_PER_TOKEN:
        t = int(np.argmax(np.diff(token_rows)))
        raise TraceFormatError(f"{p.name}: token {t} has more than {MAX_ROWS_PER_TOKEN} "
                               f"rows")
    # row groups hold whole tokens: a block's first row is a token's
    if not np.isin(starts, token_rows).all():
        raise TraceFormatError(f"{p.name}: a row group splits a token's rows")
    probs = _Probs(p, pf, starts, exact, header.model.n_expert)
    held = [table]  # dropped once its columns are numpy's (what they keep of it stays)
    del table
    try:
        return assemble(p, header, metas, end, False, token_rows,
                        lambda: af.columns_of(held.pop(), header, (probs, exact)), starts,
                        literals=may_hold_literals(raw))
    finally:
        af.release_unused_memory()
