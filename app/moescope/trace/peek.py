"""A trace's header and token count without reading its rows: enough to list a folder.

Reading a whole trace takes seconds for a long session (every row is decoded and
checked), far too long to list twenty of them in a menu. Each format keeps what a list
needs where it is cheap to reach: a Parquet trace's footer holds the header and one line
of fields per token; an Arrow stream's schema message holds the header and each token is
one message, whose length is in its prefix, so the messages are counted without decoding
a row (the file is memory-mapped: a body skipped is never read from disk); a JSON Lines
trace (version 1) begins with its header line and ends with its end record, which holds
the count (a session that did not close ends with its last token's line instead, which
begins with its index). A gzip stream cannot be read from its end, so the writer puts the
end record in a gzip member of its own, last in the file (:class:`.writer.TraceWriter`):
its last bytes are decompressed alone. A gzip trace without one (a crash, or written before
that) is decompressed from its start, as far as ``gzip_scan`` compressed bytes (40-60 ms
for :data:`MAX_GZIP_SCAN`): a longer one is counted in part, :attr:`TracePeek.partial`, its
count a lower bound.

The header is checked as the full reader checks it (:func:`.reader.header_of`), so a file
that peeks well opens; the rows are not, so one that peeks well may still be refused when
opened (a corrupt row group, a bad record).
"""

from __future__ import annotations

import gzip
import os
import re
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from moescope.trace.schema import TraceFormatError, TraceHeader

MAX_HEADER_LINE = 1 << 20
"""The longest JSON Lines header read (a real one is a few kB)."""
MAX_MESSAGES = 1 << 22
"""The most messages of an Arrow stream counted (a 2 GiB session holds ~20,000 tokens at
Qwen3-Next's geometry, far more for a small model); a file with more is refused rather than
walked for minutes."""

MAX_TAIL = 8 << 20
"""The most bytes of a JSON Lines trace looked back for its last line's start (an end
record is a few dozen bytes; a token's line at Qwen3-Next's geometry ~0.5 MB)."""

MAX_GZIP_SCAN = 2 << 20
"""The most compressed bytes of a gzip trace without its end member decompressed to count
its tokens (40-60 ms on one core; a small model's ~900 tokens, Qwen3-Next's ~30)."""

GZIP_END_MEMBER = 8 << 10
"""The last bytes of a gzip trace looked at for its end record's member (an end record is at
most a few hundred bytes, :func:`_end_record` takes up to 4 kB)."""

MAX_MESSAGE_METADATA = 64 << 20
"""The most bytes of one message's fields looked at (a token's are a few kB; the reader
bounds a record at 64 MiB too)."""


@dataclass(frozen=True)
class TracePeek:
    """What a trace's first and last bytes say about it."""

    header: TraceHeader
    format: str
    """The container the file's first bytes say: "parquet", "arrows" or "jsonl"."""
    tokens: int | None
    """Tokens recorded (a cut-off last one not counted), at least (:attr:`partial`) for a
    long gzip stream counted in part; None where only a full read counts them (a last line
    that does not say, a gzip stream's first bytes that hold no token)."""
    ended: bool | None
    """Whether the session's end record was written (it closed normally); None where only
    a full read tells (as for ``tokens``)."""
    truncated: bool = False
    """The last message was cut off (a writer killed mid-token): an Arrow stream only."""
    partial: bool = False
    """Only the first part of a gzip stream was counted (``gzip_scan``): ``tokens``, if
    not None, is how many it holds at least, and ``ended`` is None."""
    scanned: int = 0
    """Compressed bytes of a gzip stream decompressed to count its tokens."""


def peek_trace(path: str | os.PathLike[str], *, gzip_scan: int = MAX_GZIP_SCAN
               ) -> TracePeek:
    """The header and token count of the trace at ``path``, reading its header and, for
    an Arrow stream, each message's prefix (not its rows), for plain JSON Lines its last
    line (or the first bytes of a long one), for gzip JSON Lines its end record's member,
    else its first ``gzip_scan`` compressed bytes. Anything else raises
    :class:`TraceFormatError` with a one-line reason naming the file: an empty file, a
    foreign one, a header the reader refuses."""
    p = Path(path)
    try:
        with open(p, "rb") as f:
            magic = f.read(4)
    except IsADirectoryError:
        raise TraceFormatError(f"{p.name}: a folder, not a trace file") from None
    except OSError as err:
        raise TraceFormatError(f"{p.name}: cannot read it ({err.strerror or err})") from None
    if not magic:
        raise TraceFormatError(f"{p.name}: empty file (a session with no token recorded)")
    if magic == b"PAR1":
        return _peek_parquet(p)
    if magic == b"\xff\xff\xff\xff":
        return _peek_arrow(p)
    return _peek_jsonl(p, gz=magic[:2] == b"\x1f\x8b", gzip_scan=gzip_scan)


def _said(err: BaseException) -> str:
    return " ".join(str(err).split())[:200]


def _peek_parquet(p: Path) -> TracePeek:
    import pyarrow as pa

    from moescope.trace import arrow_format as af
    from moescope.trace import parquet_format as pf
    from moescope.trace.reader import header_of

    pf._footer_length(p)  # a cut-off file, or a footer claiming more than the file
    try:
        opened = pf._open(p)
        schema = opened.schema_arrow
        meta = pf.file_metadata(opened.metadata)
    except (pa.ArrowException, OSError, ValueError) as err:
        raise TraceFormatError(f"{p.name}: not a readable Parquet trace ({_said(err)})") \
            from None
    header = header_of(p, meta.get(af.HEADER_KEY), schema, "a Parquet file",
                       lambda h: pf.file_schema(af.row_schema(h)))
    tokens = meta.get(pf.TOKENS_KEY)
    if tokens is None:
        raise TraceFormatError(f"{p.name}: bad Parquet trace metadata: no tokens "
                               f"({pf.TOKENS_KEY.decode()})")
    n = tokens.count(b"\n") + 1 if tokens else 0
    return TracePeek(header, "parquet", n, af.END_KEY in meta)


def _peek_arrow(p: Path) -> TracePeek:
    import pyarrow as pa
    import pyarrow.ipc as ipc

    from moescope.trace import arrow_format as af
    from moescope.trace.reader import header_of

    try:
        source = pa.memory_map(os.fsencode(p), "r")  # a name not UTF-8 too
    except (pa.ArrowException, OSError) as err:
        raise TraceFormatError(f"{p.name}: cannot read it ({_said(err)})") from None
    with source:
        try:
            messages = ipc.MessageReader.open_stream(source)
            first = messages.read_next_message()
            if first.type != "schema":
                raise ValueError(f"it begins with a {first.type} message, not a schema")
            schema = ipc.read_schema(first)
        except StopIteration:
            raise TraceFormatError(f"{p.name}: an Arrow stream with no schema, not a "
                                   "trace") from None
        except (pa.ArrowException, OSError, ValueError) as err:
            raise TraceFormatError(f"{p.name}: not a readable Arrow trace "
                                   f"({_said(err)})") from None
        header = header_of(p, (schema.metadata or {}).get(af.HEADER_KEY), schema,
                           "an Arrow stream")
        tokens, ended, truncated = 0, False, False
        for _ in range(MAX_MESSAGES):
            try:
                message = messages.read_next_message()
            except StopIteration:
                break
            except (pa.ArrowException, OSError) as err:
                # the full reader's rule (:func:`.arrow_format.read_batches`): a message
                # cut off at the end is a token lost mid-write; anything else is damage
                if source.tell() < source.size() and "Expected to" not in str(err) \
                        and "to read" not in str(err):
                    raise TraceFormatError(f"{p.name}: a damaged Arrow stream after token "
                                           f"{tokens} ({_said(err)})") from None
                truncated = True
                break
            if message.type != "record batch":
                continue
            if message.metadata.size > MAX_MESSAGE_METADATA:
                raise TraceFormatError(f"{p.name}: a message after token {tokens} claims "
                                       f"{message.metadata.size:,} bytes of fields, more "
                                       "than a token's")
            meta = message.metadata.to_pybytes()
            if af.TOKEN_KEY in meta:
                tokens += 1
            elif af.END_KEY in meta:
                ended = True
        else:
            raise TraceFormatError(f"{p.name}: more than {MAX_MESSAGES:,} messages, not "
                                   f"a session's trace")
    return TracePeek(header, "arrows", tokens, ended, truncated)


def _peek_jsonl(p: Path, *, gz: bool, gzip_scan: int = MAX_GZIP_SCAN) -> TracePeek:
    import json

    from moescope.trace.validate import _header_from_json

    try:
        with open(p, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            line = stream.readline(MAX_HEADER_LINE + 1)
    except (OSError, EOFError, zlib.error) as err:
        raise TraceFormatError(f"{p.name}: not a readable trace ({_said(err)})") from None
    if len(line) > MAX_HEADER_LINE or not line.endswith(b"\n"):
        raise TraceFormatError(f"{p.name}: no header line, not a MoEScope trace")
    try:
        obj = json.loads(line.decode("utf-8"))
        if not isinstance(obj, dict) or obj.get("type") != "header":
            raise ValueError("its first line is not a header record")
        header = _header_from_json(obj)
    except (ValueError, UnicodeDecodeError, RecursionError, KeyError, TypeError,
            TraceFormatError) as err:
        what = f"missing field {err}" if isinstance(err, KeyError) else _said(err)
        raise TraceFormatError(f"{p.name}: not a MoEScope trace ({what})") from None
    if gz:
        end = _gzip_end_member(p)
        if end is not None:
            return TracePeek(header, "jsonl", end, True)
        tokens, ended, partial, scanned = _gzip_count(p, gzip_scan)
        return TracePeek(header, "jsonl", tokens, ended, partial=partial, scanned=scanned)
    tokens, ended = _jsonl_tail(p)
    return TracePeek(header, "jsonl", tokens, ended)


_TOKEN_START = re.compile(rb'\{[ \t\r\n]*"type"[ \t\r\n]*:[ \t\r\n]*"token"[ \t\r\n]*,'
                          rb'[ \t\r\n]*"index"[ \t\r\n]*:[ \t\r\n]*(0|[1-9][0-9]{0,9})[ \t\r\n]*,')
_LINE_HEAD = 4096
"""The first bytes of the last line looked at (an end record is a few dozen bytes)."""


def _jsonl_tail(p: Path) -> tuple[int | None, bool | None]:
    """(tokens, ended) from a plain JSON Lines trace's last line: the end record's count
    (its line may lack the final newline: the reader takes it too); else, the session not
    closed (a crash, or still recording), its last whole token line's index + 1 (read from
    the line's first bytes; a token cut off after it is dropped by the reader too, one
    whole but for its newline is not),
    or 0 after the header alone; (None, None) where the last line says neither (a later
    version's record: only a full read counts). Blank lines at the end are passed over,
    as the reader passes over them."""
    window = 64 << 10
    try:
        with open(p, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            while True:
                at = max(0, size - window)
                f.seek(at)
                tail = f.read(size - at)
                pieces = tail.split(b"\n")
                cut = pieces.pop()  # after the last newline: empty, or a line not ended
                if cut.strip() and (pieces or at == 0):  # (its start is in the window)
                    end = _end_record(cut)
                    if end is not None:
                        return end, True
                    m = _TOKEN_START.match(cut[:_LINE_HEAD])
                    if m is not None and int(m.group(1)) < _MAX_TOKENS and _parses(cut):
                        return int(m.group(1)) + 1, False  # whole but for its newline
                first = 0 if at == 0 else 1  # a window's first piece may begin mid-line
                for i in range(len(pieces) - 1, first - 1, -1):
                    line = pieces[i]
                    if not line.strip():
                        continue
                    if at == 0 and i == 0:  # the header is the last line: no token yet
                        return 0, False
                    end = _end_record(line)
                    if end is not None:
                        return end, True
                    m = _TOKEN_START.match(line[:_LINE_HEAD])
                    if m is None or int(m.group(1)) >= _MAX_TOKENS:
                        return None, None
                    return int(m.group(1)) + 1, False
                if at == 0 or window >= MAX_TAIL:
                    return None, None
                window = min(window * 8, MAX_TAIL)
    except OSError:
        return None, None


_MAX_TOKENS = (1 << 31) - 1


_NOT_JSON = object()


def _json_of(line: bytes) -> Any:
    """``line``'s one JSON value, or ``_NOT_JSON``."""
    import json

    try:
        return json.loads(line.decode("utf-8"))
    except (ValueError, UnicodeDecodeError, RecursionError):
        return _NOT_JSON


def _parses(line: bytes) -> bool:
    """Whether ``line`` is one JSON value (a line the writer finished but for its
    newline, which the reader takes)."""
    return _json_of(line) is not _NOT_JSON


def _end_record(line: bytes) -> int | None:
    """The token count of ``line`` if it is an end record with a count in range."""
    if len(line) > _LINE_HEAD or b'"end"' not in line:
        return None
    obj = _json_of(line)
    if not isinstance(obj, dict) or obj.get("type") != "end":
        return None
    tokens = obj.get("tokens")
    return tokens if type(tokens) is int and 0 <= tokens <= _MAX_TOKENS else None


_GZIP_MEMBER = b"\x1f\x8b\x08"
"""A gzip member's first bytes (magic, deflate)."""


def _gzip_end_member(p: Path) -> int | None:
    """The token count of the end record in a gzip trace's last member, when that member
    holds the end record alone (:class:`.writer.TraceWriter` writes it so); None otherwise
    (no such member: a crash, an older writer, or not a trace's)."""
    try:
        with open(p, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            at = max(0, size - GZIP_END_MEMBER)
            f.seek(at)
            tail = f.read(size - at)
    except OSError:
        return None
    i = len(tail)
    while True:
        i = tail.rfind(_GZIP_MEMBER, 0, i)
        if i < 0 or at + i == 0:  # the first member holds the header, never the end
            return None
        d = zlib.decompressobj(31)
        try:
            line = d.decompress(tail[i:], _LINE_HEAD + 2)
        except zlib.error:
            continue
        # one whole member to the file's last byte (its CRC checked), one line
        if d.eof and not d.unused_data and not d.unconsumed_tail and line.endswith(b"\n") \
                and line.count(b"\n") == 1:
            end = _end_record(line[:-1])
            if end is not None:
                return end
        # else: the magic bytes inside compressed data; look further back


_GZIP_CHUNK = 1 << 16
_KEEP_LINE = MAX_TAIL
"""The most bytes of a last line without its newline kept to parse (as the plain tail)."""


def _gzip_count(p: Path, limit: int) -> tuple[int | None, bool | None, bool, int]:
    """(tokens, ended, partial, compressed bytes read) from a gzip JSON Lines trace,
    decompressed from its start as the reader does (:class:`.reader._LineReader`) but
    keeping only the line being read and the first bytes of the last whole one; as far as
    ``limit`` compressed bytes (further: ``partial``, tokens a lower bound, ended None).
    The count follows :func:`_jsonl_tail`'s rules for the last lines; a stream cut off (a
    crash) counts its whole lines, as the reader does. A corrupt stream (bad data or CRC)
    raises :class:`TraceFormatError`, as it does in the reader."""
    from moescope.trace.reader import cut_after_member_magic

    lines = 0
    last: bytes | None = None  # the last non-blank whole line's first bytes
    last_no = 0
    line = bytearray()  # the line being read (its first _KEEP_LINE + 1 bytes)
    line_len = 0
    how = "end"
    try:
        with open(p, "rb") as raw:
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
            while True:
                if raw.tell() >= limit:
                    how = "partial"
                    break
                try:
                    # read1: at most one read of the file, so nothing decoded is lost when
                    # the next raises for a stream cut off
                    chunk = stream.read1(_GZIP_CHUNK)
                except EOFError:
                    how = "cut"
                    break
                except gzip.BadGzipFile as err:
                    if not cut_after_member_magic(err):
                        raise
                    how = "cut"
                    break
                if not chunk:
                    break
                start = 0
                while True:
                    nl = chunk.find(b"\n", start)
                    stop = len(chunk) if nl < 0 else nl
                    if len(line) <= _KEEP_LINE:
                        line += chunk[start:min(stop, start + _KEEP_LINE + 1 - len(line))]
                    line_len += stop - start
                    if nl < 0:
                        break
                    lines += 1
                    if line_len > _LINE_HEAD or line.strip():
                        last, last_no = bytes(line[:_LINE_HEAD + 1]), lines
                    line.clear()
                    line_len = 0
                    start = nl + 1
            scanned = raw.tell()
    except (zlib.error, gzip.BadGzipFile) as err:
        raise TraceFormatError(f"{p.name}: corrupt gzip stream after line {lines} "
                               f"({_said(err)})") from None
    except OSError as err:
        raise TraceFormatError(f"{p.name}: cannot read it ({_said(err)})") from None
    if how == "partial":
        m = _TOKEN_START.match(last[:_LINE_HEAD]) if last is not None and last_no > 1 \
            else None
        tokens = int(m.group(1)) + 1 if m is not None and int(m.group(1)) < _MAX_TOKENS \
            else None
        return tokens, None, True, scanned
    if how == "end" and line_len and (line_len > _KEEP_LINE or line.strip()):
        # a last line without its newline, at the stream's end: the reader parses it
        if line_len > _KEEP_LINE:
            return None, None, False, scanned
        cut = bytes(line)
        end = _end_record(cut)
        if end is not None:
            return end, True, False, scanned
        m = _TOKEN_START.match(cut[:_LINE_HEAD])
        if m is not None and int(m.group(1)) < _MAX_TOKENS and _parses(cut):
            return int(m.group(1)) + 1, False, False, scanned
    if last is None or last_no <= 1:  # the header alone
        return 0, False, False, scanned
    end = _end_record(last)
    if end is not None:
        return end, True, False, scanned
    m = _TOKEN_START.match(last[:_LINE_HEAD])
    if m is None or int(m.group(1)) >= _MAX_TOKENS:
        return None, None, False, scanned
    return int(m.group(1)) + 1, False, False, scanned
