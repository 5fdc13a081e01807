"""A trace's header and token count without reading its rows: enough to list a folder.

Reading a whole trace takes seconds for a long session (every row is decoded and
checked), far too long to list twenty of them in a menu. Each format keeps what a list
needs where it is cheap to reach: a Parquet trace's footer holds the header and one line
of fields per token; an Arrow stream's schema message holds the header and each token is
one message, whose length is in its prefix, so the messages are counted without decoding
a row (the file is memory-mapped: a body skipped is never read from disk); a JSON Lines
trace (version 1) begins with its header line and ends with its end record, which holds
the count (a session that did not close ends with its last token's line instead, which
begins with its index); a gzip-compressed one is only counted by reading it all, so
:attr:`TracePeek.tokens` is None there.

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
    """Tokens recorded (a cut-off last one not counted); None where only a full read
    counts them (gzip-compressed JSON Lines, or a last line that does not say)."""
    ended: bool | None
    """Whether the session's end record was written (it closed normally); None where only
    a full read tells (as for ``tokens``)."""
    truncated: bool = False
    """The last message was cut off (a writer killed mid-token): an Arrow stream only."""


def peek_trace(path: str | os.PathLike[str]) -> TracePeek:
    """The header and token count of the trace at ``path``, reading its header and, for
    an Arrow stream, each message's prefix (not its rows), for plain JSON Lines its last
    line (or the first bytes of a long one). Anything else raises
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
    return _peek_jsonl(p, gz=magic[:2] == b"\x1f\x8b")


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
        source = pa.memory_map(str(p), "r")
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


def _peek_jsonl(p: Path, *, gz: bool) -> TracePeek:
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
    if gz:  # a gzip stream is read from its start: counting is a full read
        return TracePeek(header, "jsonl", None, None)
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
