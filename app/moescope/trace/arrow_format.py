"""Trace format v2: an Apache Arrow IPC stream, one record batch per token.

Version 1 (JSON Lines) spends most of its bytes and its reading time on numbers as text: at
Qwen3-Next's geometry (48 MoE layers x 512 experts) a token is ~171 kB and takes ~3 ms to
parse. Version 2 keeps every per-row number binary and columnar, so a reader maps the file
and hands whole columns to numpy (and to the native batch replay) without a Python loop per
row, and analysis tools (pandas, polars, DuckDB) open the rows directly.

Why an IPC *stream* (not the IPC file format, not Parquet): a stream is a sequence of
self-delimiting messages with no footer, so the file is valid after every token; a process
killed mid-write leaves at most a partial last message, which the reader drops (the token
being written is lost, as in version 1). The IPC file format and Parquet both need a
footer written at close, so a crash would lose the whole session.

Layout (``docs/trace-format.md``):

* the stream's schema message carries the header JSON in the schema metadata
  (``moescope.header``), written when the file is created;
* one record batch per token: a row per event row (the core's decision for one layer),
  with the router inputs that make a replay exact (probabilities, raw gate weights,
  PSR's ranked prediction) in the same row; the token's own fields (text, time, phase,
  changes, timings, prefetch counters, resident masks) are JSON in the batch's custom
  metadata (``moescope.token``), the readable part beside the numbers;
* a last batch with no rows and ``moescope.end`` metadata when the session closed.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, overload

import numpy as np
import numpy.typing as npt
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from moescope.cache.native import EVENT_DTYPE, MAX_K
from moescope.cache.residency import masks_to_json
from moescope.trace.schema import (
    TIMING_KEYS,
    RouteBlock,
    RouterInput,
    TokenRecord,
    TraceColumns,
    TraceHeader,
    _prefetch_to_json,
)
from moescope.util.files import open_stream

ARROW_VERSION = 2
"""The header's ``version`` in an Arrow trace."""
SUFFIX = ".arrows"
"""The file name suffix of a version-2 trace (Arrow's registered stream extension)."""
MAGIC = b"\xff\xff\xff\xff"
"""An Arrow IPC stream begins with a continuation marker (JSON Lines never does)."""
HEADER_KEY, TOKEN_KEY, END_KEY = b"moescope.header", b"moescope.token", b"moescope.end"


def release_unused_memory() -> None:
    """Give the memory Arrow's allocator kept after a large read back to the system.
    pyarrow's default pool (mimalloc here) keeps the pages it freed for its next
    allocations: 480 MB after a 10,000-token Parquet trace of Qwen3-Next's geometry was
    read (its columns decoded, checked and dropped), which a window holding the trace
    would keep for as long as it runs. Returning them takes about 2 ms. mimalloc collects
    the calling thread's heap: a thread that decoded calls this itself."""
    pa.default_memory_pool().release_unused()


def row_schema(header: TraceHeader) -> pa.Schema:
    """The rows' schema for ``header``'s model: fixed-size lists of top-k and of the
    expert count, and the narrowest integer types the validated bounds allow (expert ids,
    slots and layers below 8192 and 1024 fit int16)."""
    m = header.model
    k, e = m.top_k, m.n_expert

    def fixed(t: pa.DataType, n: int) -> pa.DataType:
        return pa.list_(t, n)

    fields = [
        ("token", pa.int32()), ("step", pa.int64()), ("layer", pa.int16()),
        ("batch", pa.int32()), ("ids", fixed(pa.int16(), k)), ("action", fixed(pa.int8(), k)),
        ("used_ids", fixed(pa.int16(), k)), ("slots", fixed(pa.int16(), k)),
        ("gate", fixed(pa.float32(), k)), ("weights", pa.list_(pa.float32())),
        ("substituted_mass", pa.float32()), ("n_admit", pa.int8()), ("n_evict", pa.int8()),
        ("admitted", pa.list_(pa.int16())), ("evicted", pa.list_(pa.int16())),
        ("bytes_sync", pa.int64()), ("bytes_async", pa.int64()),
        ("tier", fixed(pa.int8(), k)), ("n_disk", pa.int32()), ("bytes_disk", pa.int64()),
        ("probs", fixed(pa.float32() if header.router_inputs != "f16" else pa.float16(), e)),
        ("next_layer", pa.int16()), ("predicted", pa.list_(pa.int16())),
    ]
    meta = {HEADER_KEY: json.dumps({**header.to_json(), "version": ARROW_VERSION})}
    return pa.schema([pa.field(n, t, nullable=n in ("probs", "weights")) for n, t in fields],
                     metadata=meta)


def normalized(gate: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """Gate weights normalized over the top-k exactly as the core does (float32, summed
    left to right, then divided), so rows with router inputs need not store both."""
    g = np.asarray(gate, dtype=np.float32)
    total = np.zeros(g.shape[0], dtype=np.float32)
    for j in range(g.shape[1]):
        total = total + g[:, j]
    safe = np.where(total > 0, total, np.float32(1))
    out = (g / safe[:, None]).astype(np.float32)
    out[total <= 0] = 0
    return out


def _fixed(values: npt.NDArray[Any], t: pa.DataType) -> pa.Array:
    w = values.shape[1]
    return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1), type=t), w)


def _validity(valid: npt.NDArray[np.bool_]) -> pa.Buffer | None:
    """A validity bitmap for ``valid`` (None: every row valid). Built here, where a
    ``mask=`` argument costs a compute call: 8-22 us a column, a token's largest share."""
    if valid.all():
        return None
    return pa.py_buffer(np.packbits(valid, bitorder="little"))


def _ragged(values: npt.NDArray[Any], counts: npt.NDArray[Any], t: pa.DataType,
            valid: npt.NDArray[np.bool_] | None = None) -> pa.Array:
    """Row i's first ``counts[i]`` entries of ``values`` as a list column."""
    counts = np.asarray(counts, dtype=np.int32)
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    mask = np.arange(values.shape[1])[None, :] < counts[:, None]
    flat = pa.array(values[mask], type=t)
    return pa.Array.from_buffers(pa.list_(t), len(counts),
                                 [None if valid is None else _validity(valid),
                                  pa.py_buffer(offsets)], children=[flat])


def token_batch(record: TokenRecord, header: TraceHeader, schema: pa.Schema
                ) -> tuple[pa.RecordBatch, dict[bytes, bytes]]:
    """One token as a record batch (its rows) and its metadata (its own fields)."""
    m = header.model
    ev = record.events
    n, k, e = len(ev), m.top_k, m.n_expert
    probs_t = schema.field("probs").type.value_type
    probs = np.zeros((n, e), dtype=np.float16 if probs_t == pa.float16() else np.float32)
    gate = np.ascontiguousarray(ev["weights"][:, :k], dtype=np.float32) if n else \
        np.zeros((0, k), np.float32)
    has = np.zeros(n, dtype=np.bool_)
    next_layer = np.full(n, -1, dtype=np.int16)
    routes = record.routes if header.router_inputs is not None else {}
    if isinstance(routes, RouteBlock):  # the recorder's: every row at once
        width = int(routes.n_pred.max(initial=0))
    else:
        width = max((len(r.predicted) for r in routes.values()
                     if r.predicted is not None and r.next_layer >= 0), default=0)
    predicted = np.zeros((n, width), dtype=np.int16)
    n_pred = np.zeros(n, dtype=np.int32)
    if isinstance(routes, RouteBlock):
        rows = routes.rows
        has[rows] = True
        probs[rows] = routes.probs
        gate[rows] = routes.weights
        on = routes.n_pred > 0
        next_layer[rows[on]] = routes.next_layer[on]
        predicted[rows] = routes.predicted[:, :width]
        n_pred[rows] = routes.n_pred
    else:
        for row, r in routes.items():
            has[row] = True
            probs[row] = r.probs
            gate[row] = r.weights
            if r.predicted is not None and r.next_layer >= 0:
                next_layer[row] = r.next_layer
                predicted[row, :len(r.predicted)] = r.predicted
                n_pred[row] = len(r.predicted)
    weights = ev["weights"][:, :k].astype(np.float32) if n else np.zeros((0, k), np.float32)
    derived = normalized(gate)
    # a row whose normalized weights follow from its raw gate weights stores only those
    stored = ~has | ~(derived.view(np.int32) == weights.view(np.int32)).all(axis=1) if n \
        else np.zeros(0, np.bool_)
    n_admit = ev["n_admit"].astype(np.int32) if n else np.zeros(0, np.int32)
    n_evict = ev["n_evict"].astype(np.int32) if n else np.zeros(0, np.int32)
    cols = [
        pa.array(np.full(n, record.index, dtype=np.int32)),
        pa.array(ev["step"].astype(np.int64)),
        pa.array(ev["layer"].astype(np.int16)),
        pa.array(ev["token"].astype(np.int32)),
        _fixed(ev["ids"][:, :k].astype(np.int16), pa.int16()),
        _fixed(ev["action"][:, :k].astype(np.int8), pa.int8()),
        _fixed(ev["used_ids"][:, :k].astype(np.int16), pa.int16()),
        _fixed(ev["slots"][:, :k].astype(np.int16), pa.int16()),
        _fixed(gate, pa.float32()),
        _ragged(weights, np.where(stored, k, 0), pa.float32(), stored),
        pa.array(ev["substituted_mass"].astype(np.float32)),
        pa.array(n_admit.astype(np.int8)), pa.array(n_evict.astype(np.int8)),
        _ragged(ev["admitted"].astype(np.int16), np.minimum(n_admit, MAX_K), pa.int16()),
        _ragged(ev["evicted"].astype(np.int16), np.minimum(n_evict, MAX_K), pa.int16()),
        pa.array(ev["bytes_sync"].astype(np.int64)), pa.array(ev["bytes_async"].astype(np.int64)),
        _fixed(ev["tier"][:, :k].astype(np.int8), pa.int8()),
        pa.array(ev["n_disk"].astype(np.int32)), pa.array(ev["bytes_disk"].astype(np.int64)),
        pa.Array.from_buffers(schema.field("probs").type, n, [_validity(has)],
                              children=[pa.array(probs.reshape(-1), type=probs_t)]),
        pa.array(next_layer), _ragged(predicted, n_pred, pa.int16()),
    ]
    batch = pa.RecordBatch.from_arrays(cols, schema=schema)
    meta: dict[str, Any] = {
        "index": record.index, "answer": record.answer, "position": record.position,
        "phase": record.phase, "token_id": record.token_id, "text": record.text,
        "seconds": record.seconds, "policy": record.policy,
        "slots_per_layer": record.slots_per_layer,
    }
    if record.changes:
        meta["changes"] = [c.to_json() for c in record.changes]
    if record.timings is not None:
        meta["timings"] = {key: int(record.timings.get(key, 0)) for key in TIMING_KEYS}
    if record.prefetches is not None and record.prefetch_hits is not None:
        meta["prefetch"] = _prefetch_to_json(record.prefetches, record.prefetch_hits,
                                             m.moe_layers)
    if record.resident is not None:
        meta["resident"] = masks_to_json(record.resident)
    text = json.dumps(meta, ensure_ascii=False, separators=(",", ":"))
    return batch, {TOKEN_KEY: text.encode()}


class ArrowTraceWriter:
    """Streams a version-2 trace: the header at once, then one record batch per token,
    flushed before :meth:`write_token` returns (``fsync=True`` also syncs the disk)."""

    def __init__(self, path: str | os.PathLike[str], header: TraceHeader, *,
                 fsync: bool = False, stream: IO[bytes] | None = None) -> None:
        self.path = Path(path)
        self.header = header
        self._fsync = fsync
        self.schema = row_schema(header)
        self._raw: IO[bytes] = open_stream(self.path) if stream is None else stream
        try:
            self._stream = ipc.new_stream(self._raw, self.schema)
            self._raw.flush()
        except BaseException:
            self._raw.close()
            raise
        self.n_tokens = 0
        self.bytes_written = self._raw.tell()

    def _flush(self) -> None:
        self._raw.flush()
        if self._fsync:
            os.fsync(self._raw.fileno())
        self.bytes_written = self._raw.tell()

    def write_token(self, record: TokenRecord) -> None:
        """Append one token (written and flushed before this returns)."""
        batch, meta = token_batch(record, self.header, self.schema)
        self._stream.write_batch(batch, custom_metadata=meta)
        self._flush()
        self.n_tokens += 1

    def close(self, **end: Any) -> None:
        """Write the end batch (``end`` adds fields, e.g. ``stop_reason``) and close."""
        if self._raw.closed:
            return
        try:
            empty = pa.RecordBatch.from_pylist([], schema=self.schema)
            text = json.dumps({"type": "end", "tokens": self.n_tokens, **end})
            self._stream.write_batch(empty, custom_metadata={END_KEY: text.encode()})
            self._stream.close()  # the stream's end-of-stream marker
            self._flush()
        finally:
            self._raw.close()

    def __enter__(self) -> ArrowTraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --------------------------------------------------------------------------- reading


def read_batches(path: Path) -> tuple[pa.Schema, Iterator[tuple[pa.RecordBatch | None,
                                                                  Mapping[bytes, bytes]]], Any]:
    """The stream's schema and its (batch, metadata) pairs, read from a memory map (the
    columns are views of the file). A message cut off at the end (a writer killed
    mid-token) ends the iteration with ``(None, {})``; the returned reader's
    ``stats``/position is informational."""
    # the mapped file read through a buffer (zero-copy, as the map itself; a read from the
    # map's own stream cost ~1 us more a message); one thread: a token's batch is small,
    # and handing its columns to a pool cost more than decoding them
    # (by its bytes' name: a str is encoded as UTF-8, which a name with a byte 0xff is not)
    source = pa.BufferReader(pa.memory_map(os.fsencode(path), "r").read_buffer())
    reader = ipc.open_stream(source, options=ipc.IpcReadOptions(use_threads=False))

    def batches() -> Iterator[tuple[pa.RecordBatch | None, Mapping[bytes, bytes]]]:
        read = reader.read_next_batch_with_custom_metadata
        empty: dict[bytes, bytes] = {}
        try:
            while True:
                batch, meta = read()
                yield batch, (empty if meta is None else meta)
        except StopIteration:
            return
        except (pa.ArrowInvalid, pa.ArrowIOError, OSError) as err:
            if source.tell() >= source.size() or "Expected to" in str(err) \
                    or "to read" in str(err):
                yield None, {}
                return
            raise

    return reader.schema, batches(), source


class LazyBlocks(Sequence[npt.NDArray[Any]]):
    """Blocks of rows (arrays) made when first indexed: a subclass gives ``__len__`` and
    ``_block(i)`` for ``0 <= i < len``; indexing handles negatives, bounds and slices."""

    def _block(self, i: int) -> npt.NDArray[Any]:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> npt.NDArray[Any]: ...

    @overload
    def __getitem__(self, i: slice) -> list[npt.NDArray[Any]]: ...

    def __getitem__(self, i: int | slice) -> npt.NDArray[Any] | list[npt.NDArray[Any]]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if not -n <= i < n:
            raise IndexError(i)
        return self._block(i % n)


class _Parts(LazyBlocks):
    """Each token's rows of a fixed-size list column as numpy views of the memory map,
    made when first indexed (the probabilities: opening a trace needs none of them)."""

    def __init__(self, chunks: pa.ChunkedArray, width: int) -> None:
        self._chunks = chunks  # a chunk's Python object is made only when it is read
        self._width = width

    def __len__(self) -> int:
        return int(self._chunks.num_chunks)

    def _block(self, i: int) -> npt.NDArray[Any]:
        c, w = self._chunks.chunk(i), self._width
        values = c.values.to_numpy(zero_copy_only=False)
        return values[c.offset * w:(c.offset + len(c)) * w].reshape(len(c), w)


def columns_of(whole: pa.Table | None, header: TraceHeader,
               probs: tuple[Sequence[npt.NDArray[Any]], npt.NDArray[np.bool_]] | None = None
               ) -> dict[str, Any]:
    """Every row of ``whole`` (the stream's batches as chunks, or a Parquet file's columns)
    as numpy arrays (concatenated once per column); the probabilities stay in place, one
    block per chunk (``probs``, a sequence), or are ``probs`` (blocks and which rows hold
    them) where ``whole`` has no such column (a Parquet file decodes them when used)."""
    m = header.model
    k, e = m.top_k, m.n_expert
    n = whole.num_rows if whole is not None else 0
    if whole is None or n == 0:
        return {"n": 0}
    # the list columns joined in one pass (a chunk per token otherwise); the scalar ones
    # go to numpy straight from their chunks (joining costs ~0.5 us a chunk, converting
    # a chunked column 0.04); the probabilities, nearly all of the bytes, stay in place
    lists = [f.name for f in whole.schema if pa.types.is_list(f.type)
             or pa.types.is_fixed_size_list(f.type)]
    table = whole.select([name for name in lists if name != "probs"]).combine_chunks()

    def one(name: str) -> pa.Array:
        col = table.column(name)
        return col.chunks[0] if col.num_chunks == 1 else col.combine_chunks()

    def flat(name: str) -> npt.NDArray[Any]:
        return whole.column(name).to_numpy()

    def fixed(name: str, width: int) -> npt.NDArray[Any]:
        c = one(name)
        values = c.values.to_numpy(zero_copy_only=False)
        return values[c.offset * width:(c.offset + len(c)) * width].reshape(n, width)

    def valid(col: pa.Array | pa.ChunkedArray) -> npt.NDArray[np.bool_]:
        if col.null_count == 0:
            return np.ones(n, dtype=np.bool_)
        return np.asarray(pc.is_valid(col).to_numpy(zero_copy_only=False), dtype=np.bool_)

    def ragged(name: str, width: int) -> tuple[npt.NDArray[Any], npt.NDArray[np.int64]]:
        col = one(name)
        offsets = col.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
        values = col.values.to_numpy(zero_copy_only=False)
        lengths = np.diff(offsets)
        if len(offsets) != n + 1 or (lengths < 0).any() or offsets[0] < 0 \
                or offsets[-1] > len(values):
            raise ValueError(f"{name}: its list offsets are out of order")
        if col.null_count:
            lengths[~valid(col)] = 0
        longest = int(lengths.max(initial=0))
        if longest > width:
            raise ValueError(f"{name}: a row holds {longest} entries, more than {width}")
        dtype = values.dtype if values.dtype.kind in "if" else np.int64
        cols = max(longest, 1)
        first, total = int(offsets[0]), int(lengths.sum())
        if total == int(offsets[-1]) - first:  # no null row holds values: they are in order
            ordered = values[first:first + total].astype(dtype, copy=False)
        else:
            ordered = np.asarray(col.flatten().to_numpy(zero_copy_only=False), dtype=dtype)
        full = lengths == longest
        if longest and full.all():  # every row full: the values are the rows
            return ordered.reshape(n, longest), lengths
        out = np.full((n, cols), -1, dtype=dtype)
        if longest and (full | (lengths == 0)).all():  # full or empty rows (the usual)
            out[full] = ordered.reshape(-1, longest)
        else:
            out[np.arange(cols)[None, :] < lengths[:, None]] = ordered
        return out, lengths

    if probs is None:
        column = whole.column("probs")
        probs = (_Parts(column, e), valid(column))
    return {
        "n": n, "token": flat("token"), "step": flat("step"), "layer": flat("layer"),
        "batch": flat("batch"), "ids": fixed("ids", k), "action": fixed("action", k),
        "used_ids": fixed("used_ids", k), "slots": fixed("slots", k),
        "gate": fixed("gate", k), "weights": ragged("weights", k),
        "weights_valid": valid(one("weights")), "substituted_mass": flat("substituted_mass"),
        "n_admit": flat("n_admit"), "n_evict": flat("n_evict"),
        "admitted": ragged("admitted", MAX_K), "evicted": ragged("evicted", MAX_K),
        "bytes_sync": flat("bytes_sync"), "bytes_async": flat("bytes_async"),
        **({"tier": fixed("tier", k), "n_disk": flat("n_disk"),
            "bytes_disk": flat("bytes_disk")} if "tier" in whole.column_names else {}),
        "probs": probs[0], "probs_valid": probs[1],
        "next_layer": flat("next_layer"), "predicted": ragged("predicted", e),
    }


def events_of(cols: Mapping[str, Any], k: int) -> npt.NDArray[Any]:
    """The validated columns as the core's event rows (``EVENT_DTYPE``)."""
    n = cols["n"]
    ev = np.zeros(n, dtype=EVENT_DTYPE)
    if not n:
        return ev
    ev["step"], ev["layer"], ev["token"], ev["k"] = (cols["step"], cols["layer"],
                                                     cols["batch"], k)
    ev["ids"][:, :k] = cols["ids"]
    ev["action"][:, :k] = cols["action"]
    ev["used_ids"][:, :k] = cols["used_ids"]
    ev["slots"][:, :k] = cols["slots"]
    ev["weights"][:, :k] = cols["normalized"]
    ev["substituted_mass"] = cols["substituted_mass"]
    action = cols["action"]
    ev["n_hit"] = (action == 0).sum(axis=1)
    ev["n_fetch"] = (action == 1).sum(axis=1)
    ev["n_substitute"] = (action == 2).sum(axis=1)
    ev["n_admit"], ev["n_evict"] = cols["n_admit"], cols["n_evict"]
    for name in ("admitted", "evicted"):
        values, lengths = cols[name]
        w = min(values.shape[1], MAX_K)
        mask = np.arange(w)[None, :] < lengths[:, None]
        ev[name][:, :w][mask] = values[:, :w][mask]
    ev["bytes_sync"], ev["bytes_async"] = cols["bytes_sync"], cols["bytes_async"]
    if "tier" in cols:  # the disk tier's fields (streams written before it have none)
        ev["tier"][:, :k] = cols["tier"]
        ev["n_disk"], ev["bytes_disk"] = cols["n_disk"], cols["bytes_disk"]
    return ev


def _rows_of(cols: Mapping[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows ``start:stop`` of :func:`columns_of`'s arrays (views; the probabilities'
    blocks left out)."""
    n = cols["n"]
    out: dict[str, Any] = {"n": stop - start}
    for name, value in cols.items():
        if isinstance(value, np.ndarray) and len(value) == n:
            out[name] = value[start:stop]
        elif isinstance(value, tuple) and all(isinstance(v, np.ndarray) for v in value):
            out[name] = tuple(v[start:stop] for v in value)
    return out


def trace_columns(cols: dict[str, Any], token_rows: npt.NDArray[np.int64], source: str = "",
                  starts: npt.NDArray[np.int64] | None = None) -> TraceColumns:
    """The replay's view of the checked rows: router inputs where recorded; the event rows
    laid out from ``cols`` when first asked for (``cols`` is kept until then). ``starts``:
    the first row of each block of ``cols["probs"]`` (default: a block per token)."""
    n = cols["n"]
    k = cols["ids"].shape[1] if n else 0
    if not n:
        return TraceColumns.empty(events_of(cols, k), token_rows)
    pred, lengths = cols["predicted"]
    width = int(lengths.max(initial=0))
    predicted = pred[:, :width] if width else None
    kept: list[dict[str, Any]] = [cols]

    def weighed() -> dict[str, Any]:
        from moescope.trace.validate import normalized_weights

        laid = kept[0]
        if "normalized" not in laid:  # checked columns: in 0..1 (every row, once)
            laid["normalized"] = normalized_weights(laid, k)
        return laid

    def lay_out() -> npt.NDArray[Any]:
        laid = weighed()
        kept.clear()
        return events_of(laid, k)

    def rows(start: int, stop: int) -> npt.NDArray[Any]:
        return events_of(_rows_of(weighed(), start, stop), k)

    return TraceColumns(
        events=lay_out, token_rows=token_rows, exact=cols["probs_valid"],
        probs=cols["probs"], gate=np.asarray(cols["gate"], dtype=np.float32),
        next_layer=cols["next_layer"].astype(np.int32) if width else None,
        predicted=predicted, source=source, ids=cols["ids"],
        fields={"step": cols["step"], "layer": cols["layer"], "token": cols["batch"],
                **{name: cols[name] for name in ("bytes_sync", "bytes_async", "n_admit",
                                                 "n_evict", "n_disk", "bytes_disk")
                   if name in cols}},
        rows=rows,
        # a batch per token, a chunk per batch (empty ones too): the tokens' first rows
        starts=starts if starts is not None else
        token_rows if len(cols["probs"]) == len(token_rows) - 1 else None)


class LazyRoutes(Mapping[int, RouterInput]):
    """A token's router inputs, built from the trace's columns when first asked for: a
    long trace has a row per layer per token, and most readers (the replay) use the
    columns instead."""

    def __init__(self, columns: TraceColumns, start: int, stop: int) -> None:
        self._c = columns
        self._start = start
        self._stop = stop
        self._which: list[int] | None = None

    @property
    def _rows(self) -> list[int]:
        if self._which is None:
            self._which = [int(r) for r in np.flatnonzero(self._c.exact[self._start:
                                                                        self._stop])]
        return self._which

    def __getitem__(self, row: int) -> RouterInput:
        if row not in self._rows:
            raise KeyError(row)
        c, r = self._c, self._start + row
        predicted = None
        next_layer = -1
        if c.predicted is not None and c.next_layer is not None and c.next_layer[r] >= 0:
            p = c.predicted[r]
            predicted = p[p >= 0].astype(np.int32)
            next_layer = int(c.next_layer[r])
        return RouterInput(row=row, probs=c.row_probs(r), weights=c.gate[r],
                           ids=c.ids[r].astype(np.int32),
                           next_layer=next_layer, predicted=predicted)

    def __iter__(self) -> Iterator[int]:
        return iter(self._rows)

    def __len__(self) -> int:
        return len(self._rows)

    def __contains__(self, row: object) -> bool:
        return row in self._rows


class ColumnToken(TokenRecord):
    """A version-2 token: its event rows are its slice of the trace's
    (:attr:`TraceColumns.events`), laid out when something first reads ``events``.
    Opening a trace checks every column but need not lay out 864-byte rows for every
    layer of every token; whoever reads them gets the same array as before."""

    def rows_from(self, columns: TraceColumns, start: int, stop: int) -> ColumnToken:
        """Read ``events`` as rows ``start:stop`` of ``columns`` (built with ``events``
        None)."""
        self.__dict__["_slice"] = (columns, start, stop)
        return self

    @property  # type: ignore[override]
    def events(self) -> npt.NDArray[Any]:
        rows = self.__dict__.get("_events")
        if rows is None:
            columns, start, stop = self.__dict__["_slice"]
            rows = self.__dict__["_events"] = columns.events[start:stop]
        return rows

    def rows_when_read(self) -> Callable[[], npt.NDArray[Any]]:
        """A function that gives this token's event rows each time it is called, laid out
        then from the trace's columns (:meth:`TraceColumns.event_rows`) and kept neither
        by this token nor by the trace: for a reader that holds every token but looks at
        a few tokens' rows at a time (a reopened trace's window)."""
        rows = self.__dict__.get("_events")
        if rows is not None:
            return lambda: rows
        columns, start, stop = self.__dict__["_slice"]
        return lambda: columns.event_rows(start, stop)

    @events.setter
    def events(self, rows: npt.NDArray[Any] | None) -> None:
        self.__dict__["_events"] = rows
