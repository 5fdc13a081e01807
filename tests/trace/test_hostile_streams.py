"""A version-2 stream (``.arrows``, a crash's journal) whose record batch says a buffer is
shorter than its rows need, found by the second hostile-input campaign (a flipped bit in a
recorded journal): the reader handed the column to numpy as it was (reading past the
buffer: garbage, "probs hold a value that is not finite" or worse), and ``moescope trace
compact`` ended in an ``ArrowInvalid`` traceback from the Parquet cast. Every batch is now
validated as it is read: one line naming the token, nothing written, the journal kept."""

from __future__ import annotations

import struct
from pathlib import Path

import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from moescope.cli import main
from moescope.trace import TraceFormatError, read_trace
from moescope.trace.parquet_format import compact
from moescope_testing.traces import core_trace

BATCH = 3
"""The record batch (0-based, after the schema) whose buffer is cut: token 3's."""


def _batches(raw: bytes) -> list[tuple[int, bytes, int, pa.RecordBatch]]:
    """(metadata's file offset, metadata, body size, batch) of each record batch."""
    schema_reader = ipc.open_stream(pa.BufferReader(raw))
    reader = ipc.MessageReader.open_stream(pa.BufferReader(raw))
    out = []
    pos = 0
    while True:
        try:
            msg = reader.read_next_message()
        except StopIteration:
            return out
        _marker, length = struct.unpack_from("<Ii", raw, pos)
        body = msg.body.size if msg.body is not None else 0
        if msg.type == "record batch":
            batch = ipc.read_record_batch(msg, schema_reader.schema)
            out.append((pos + 8, raw[pos + 8:pos + 8 + length], body, batch))
        pos += 8 + length + body


def cut_buffer(source: Path, dest: Path, column: str, child_data: int) -> Path:
    """``source`` with batch :data:`BATCH`'s buffer ``child_data`` (index among the
    column's buffers, children included, as ``Array.buffers()`` lists them) said to be 8
    bytes long: the flatbuffer's (offset, length) pair is rewritten in place, as a flipped
    byte would leave it."""
    raw = bytearray(source.read_bytes())
    at, meta, body, batch = _batches(bytes(raw))[BATCH]
    names = batch.schema.names
    buffers = [len(c.buffers()) for c in batch.columns]
    index = sum(buffers[:names.index(column)]) + child_data
    n = sum(buffers)
    for p in range(0, len(meta) - 4 - 16 * n, 4):
        if (p + 4) % 8 or struct.unpack_from("<I", meta, p)[0] != n:
            continue
        pairs = [struct.unpack_from("<qq", meta, p + 4 + 16 * i) for i in range(n)]
        if all(0 <= o <= body and ln >= 0 and o + ln <= body for o, ln in pairs) \
                and pairs[index][1] > 8:
            struct.pack_into("<q", raw, at + p + 4 + 16 * index + 8, 8)
            dest.write_bytes(bytes(raw))
            return dest
    raise AssertionError("the buffers' vector was not found")


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return core_trace(tmp_path_factory.mktemp("streams") / "good.arrows", n_tokens=8)


@pytest.mark.parametrize(("column", "child_data"), [("probs", 2), ("gate", 2), ("step", 1)])
def test_a_buffer_shorter_than_its_rows_is_one_line(stream: Path, tmp_path: Path,
                                                    column: str, child_data: int) -> None:
    bad = cut_buffer(stream, tmp_path / "bad.arrows", column, child_data)
    with pytest.raises(TraceFormatError, match=r"bad\.arrows: corrupt Arrow stream after "
                                               r"token 3 \(.*too small") as err:
        read_trace(bad)
    assert "\n" not in str(err.value)


def test_compacting_such_a_journal_writes_nothing_and_keeps_it(
        stream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = cut_buffer(stream, tmp_path / "s.parquet.journal.arrows", "probs", 2)
    before = journal.read_bytes()
    with pytest.raises(TraceFormatError, match="corrupt Arrow stream"):
        compact(journal, remove=True)
    assert main(["trace", "compact", str(journal)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moescope: error: s.parquet.journal.arrows: corrupt Arrow stream") \
        and err.count("\n") == 1, err
    assert journal.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.parquet.journal.arrows"]


def test_the_untouched_stream_still_reads(stream: Path) -> None:
    assert len(read_trace(stream).tokens) == 8


def _with_probs(source: Path, dest: Path, values: list[float]) -> Path:
    """``source`` with the first row of batch :data:`BATCH` holding ``values`` (then 0)
    as its probabilities."""
    import numpy as np

    reader = ipc.open_stream(str(source))
    with open(dest, "wb") as f, ipc.new_stream(f, reader.schema) as w:
        for i, (b, meta) in enumerate(iter(reader.read_next_batch_with_custom_metadata,
                                           None)):
            if i == BATCH:
                a = b.column(b.schema.names.index("probs"))
                probs = a.values.to_numpy(zero_copy_only=False).copy()
                probs[:a.type.list_size] = 0
                probs[:len(values)] = values
                fixed = pa.FixedSizeListArray.from_arrays(
                    pa.array(probs.astype(np.float32)), a.type.list_size)
                b = pa.RecordBatch.from_arrays(
                    [fixed if n == "probs" else c for n, c in zip(b.schema.names, b.columns,
                                                                  strict=True)],
                    schema=reader.schema)
            w.write_batch(b, custom_metadata=meta)
    return dest


@pytest.mark.parametrize("values", [[float("inf"), float("-inf")], [3e38, 3e38, 3e38]])
def test_probabilities_that_overflow_their_sum_print_no_numpy_warning(
        stream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        values: list[float]) -> None:
    """The rows' sum (how non-finite values are found fast) of ``inf`` and ``-inf``, or of
    values near float32's largest, printed numpy's RuntimeWarning above the error line."""
    import warnings

    bad = _with_probs(stream, tmp_path / "p.arrows", values)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code = main(["replay", str(bad), "--policy", "exact"])
    err = capsys.readouterr().err
    assert "RuntimeWarning" not in err and "Traceback" not in err, err
    if code:
        assert code == 2 and err.startswith("moescope: error: p.arrows: row ") \
            and err.count("\n") == 1, err


def test_a_slot_at_int16s_largest_is_one_line_without_a_numpy_warning(
        stream: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Slots are int16 in a stream: the check's ``slots.max() + 1`` overflowed at 32767,
    and numpy's RuntimeWarning came out above the error line."""
    import warnings

    import numpy as np

    reader = ipc.open_stream(str(stream))
    bad = tmp_path / "s.arrows"
    with open(bad, "wb") as f, ipc.new_stream(f, reader.schema) as w:
        for i, (b, meta) in enumerate(iter(reader.read_next_batch_with_custom_metadata,
                                           None)):
            if i == BATCH:
                a = b.column(b.schema.names.index("slots"))
                slots = pa.FixedSizeListArray.from_arrays(
                    pa.array(np.full(len(a.values), 32767, np.int16)), a.type.list_size)
                b = pa.RecordBatch.from_arrays(
                    [slots if n == "slots" else c for n, c in zip(b.schema.names, b.columns,
                                                                  strict=True)],
                    schema=reader.schema)
            w.write_batch(b, custom_metadata=meta)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main(["replay", str(bad), "--policy", "exact"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moescope: error: s.arrows: row ") and "32767 is not a slot" in err \
        and err.count("\n") == 1, err
