"""Writing a trace: JSON Lines (optionally gzip), flushed per token, off the decode thread.
"""

from __future__ import annotations

import gzip
import json
import os
import threading
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, Any

from moescope.trace.schema import TokenRecord, TraceFormatError, TraceHeader
from moescope.util.files import open_stream

# --------------------------------------------------------------------------- writing


class TraceWriter:
    """Streams records to a ``.jsonl`` (or ``.jsonl.gz``) file, flushing after each.

    A gzip stream is sync-flushed after every record, so everything written so far is
    decodable even if the process dies. ``fsync=True`` also survives a power cut, at the
    cost of a disk sync per token.
    """

    def __init__(self, path: str | os.PathLike[str], header: TraceHeader, *,
                 compress: bool | None = None, fsync: bool = False) -> None:
        self.path = Path(path)
        self.header = header
        self._fsync = fsync
        self._raw: IO[bytes] = open_stream(self.path)  # closed in close(); files.py's rules
        gz = self.path.suffix == ".gz" if compress is None else compress
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0) if gz else None
        self.n_tokens = 0
        self.bytes_written = 0
        """Bytes in the file so far (compressed, for a gzip stream): what the disk holds."""
        self._write(header.to_json())

    def _write(self, obj: Mapping[str, Any], *, member: bool = False) -> None:
        """Write one record and flush it; ``member``: as a gzip member of its own (the
        end record of a gzip stream, once the tokens' member is closed)."""
        data = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        if member:
            self._raw.write(gzip.compress(data, compresslevel=9, mtime=0))
        elif self._gz is not None:
            self._gz.write(data)
            self._gz.flush(zlib.Z_SYNC_FLUSH)
        else:
            self._raw.write(data)
        self._raw.flush()
        self.bytes_written = (self._raw.tell() if self._gz is not None or member
                              else self.bytes_written + len(data))
        if self._fsync:
            os.fsync(self._raw.fileno())

    def write_token(self, record: TokenRecord) -> None:
        """Append one token (written and flushed before this returns)."""
        self._write(record.to_json(self.header.router_inputs, self.header.model.moe_layers))
        self.n_tokens += 1

    def close(self, **end: Any) -> None:
        """Write the end record (``end`` adds fields, e.g. ``stop_reason``) and close.

        A gzip stream's end record is a gzip member of its own after the tokens' (a gzip
        file may hold several, read as one stream by every gzip reader): its last bytes
        then say the token count, which :func:`.peek.peek_trace` reads without
        decompressing the tokens."""
        if self._raw.closed:
            return
        try:
            record = {"type": "end", "tokens": self.n_tokens, **end}
            if self._gz is not None:
                self._gz.close()  # the tokens' member ends (the file stays open)
                self._write(record, member=True)
            else:
                self._write(record)
        finally:  # a full disk fails the end record: the file is closed all the same
            try:
                if self._gz is not None:
                    self._gz.close()
            finally:
                self._raw.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



class _BackgroundWriter:
    """Writes a recorder's tokens on one thread, at most one token behind the caller."""

    def __init__(self, writer: TraceWriter) -> None:
        self._writer = writer
        self._cv = threading.Condition()
        self._pending: TokenRecord | None = None
        self._error: BaseException | None = None
        self._closing = False
        self._finish: Callable[[], None] | None = None
        self._thread = threading.Thread(target=self._run, name="moescope-trace-writer",
                                        daemon=True)
        self._thread.start()

    def put(self, record: TokenRecord) -> None:
        with self._cv:
            self._wait_idle()
            if self._closing:
                raise ValueError("the trace recorder is closed")
            self._pending = record
            self._cv.notify_all()

    def flush(self) -> None:
        with self._cv:
            self._wait_idle()

    def close(self, finish: Callable[[], None] | None = None) -> None:
        """Write the pending token, then run ``finish`` (closing the file, compacting a
        Parquet trace) on the writer thread, and wait for both. If a write failed, the
        thread has ended: ``finish`` runs here instead, and the failure is raised."""
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._finish = finish
            self._cv.notify_all()
        self._thread.join()
        with self._cv:
            left = self._finish
            self._finish = None
        if left is not None:
            try:
                left()
            except BaseException as err:
                if self._error is None:
                    raise
                raise self._error from err
        with self._cv:
            self._raise()

    def _wait_idle(self) -> None:
        while self._pending is not None and self._error is None:
            self._cv.wait()
        self._raise()

    def _raise(self) -> None:
        """The write that failed, raised again on every later call: nothing more is
        written after it (the thread has ended), and the caller stops recording."""
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closing:
                    self._cv.wait()
                record = self._pending
                if record is None:
                    finish, self._finish = self._finish, None
                    break
            try:
                self._writer.write_token(record)
            except BaseException as err:  # any failure ends writing; the caller hears of it
                with self._cv:
                    self._error, self._pending = err, None
                    self._cv.notify_all()
                return
            with self._cv:
                self._pending = None
                self._cv.notify_all()
        if finish is not None:
            try:
                finish()
            except BaseException as err:
                with self._cv:
                    self._error = err


def open_writer(path: str | os.PathLike[str], header: TraceHeader, *,
                compress: bool | None = None, fsync: bool = False) -> Any:
    """The writer for ``path``'s format, by its suffix in any letter case: version 2 as
    Parquet for ``.parquet`` (recorded to a journal beside it, compacted at close:
    :mod:`.parquet_format`), version 2 (Arrow IPC stream) for ``.arrows``, version 1 JSON
    Lines for ``.jsonl`` (gzip for ``.jsonl.gz``). Any other name is refused
    (:class:`TraceFormatError`, before a file is made): a typo such as ``x.txt`` used to
    record JSON Lines without a word. All have ``write_token``, ``close``, ``n_tokens``
    and ``bytes_written``."""
    from moescope.trace.arrow_format import ArrowTraceWriter
    from moescope.trace.names import record_suffix, unknown_suffix_message
    from moescope.trace.parquet_format import ParquetTraceWriter

    suffix = record_suffix(path)
    if suffix is None:
        raise TraceFormatError(unknown_suffix_message(path))
    if suffix == ".parquet":
        return ParquetTraceWriter(path, header, fsync=fsync)
    if suffix == ".arrows":
        return ArrowTraceWriter(path, header, fsync=fsync)
    return TraceWriter(path, header, fsync=fsync,
                       compress=suffix == ".jsonl.gz" if compress is None else compress)
