"""Trace format v2 (Arrow IPC stream): the same content as version 1, read without a loop
per row, validated like version 1, open in analysis tools, and crash-safe to the token."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pytest

from moescope.sim.replay import decision_mismatches
from moescope.trace import TraceFormatError, read_trace
from moescope.trace.arrow_format import HEADER_KEY, TOKEN_KEY
from moescope_testing.traces import core_trace


@pytest.fixture
def both(tmp_path: Path) -> tuple[Path, Path]:
    return (core_trace(tmp_path / "t.jsonl", n_tokens=12),
            core_trace(tmp_path / "t.arrows", n_tokens=12))


def test_v2_holds_what_v1_holds(both: tuple[Path, Path]) -> None:
    a, b = (read_trace(p) for p in both)
    assert b.header.version == 2 and a.header.version == 1
    assert b.header.model == a.header.model and b.header.policy == a.header.policy
    assert b.end == a.end and not b.truncated
    assert decision_mismatches(a.events(), b.events()) == []
    k = a.header.model.top_k
    assert np.array_equal(a.events()["weights"][:, :k], b.events()["weights"][:, :k])
    for x, y in zip(a.tokens, b.tokens, strict=True):
        assert (x.index, x.phase, x.text, x.token_id, x.seconds, x.changes) == \
            (y.index, y.phase, y.text, y.token_id, y.seconds, y.changes)
        assert sorted(x.routes) == sorted(y.routes)
        for row, r in x.routes.items():
            s = y.routes[row]
            assert np.array_equal(r.probs, s.probs) and np.array_equal(r.weights, s.weights)
            assert np.array_equal(r.ids, s.ids) and r.next_layer == s.next_layer
            assert r.predicted is not None and s.predicted is not None
            assert np.array_equal(r.predicted, s.predicted)


def test_rows_open_as_a_table_with_the_header_beside_them(both: tuple[Path, Path]) -> None:
    """What docs/trace-format.md shows: one call gives a table (pandas, polars and DuckDB
    take it from there), and the header is readable JSON in the schema."""
    path = both[1]
    table = ipc.open_stream(str(path)).read_all()
    assert table.num_rows == len(read_trace(path).events())
    assert {"token", "layer", "ids", "action", "probs", "predicted"} <= set(table.column_names)
    header = json.loads(table.schema.metadata[HEADER_KEY])
    assert header["version"] == 2 and header["model"]["n_expert"] == 16
    try:
        import pandas  # noqa: F401
    except ImportError:
        return
    frame = ipc.open_stream(str(path)).read_pandas()
    assert len(frame) == table.num_rows


def test_a_kill_mid_token_loses_only_that_token(both: tuple[Path, Path], tmp_path: Path
                                                ) -> None:
    data = both[1].read_bytes()
    full = read_trace(both[1])
    # the offsets where each token's batch ends: cut inside the last few
    for cut in (len(data) - 9, len(data) - 400, len(data) // 2 + 13):
        p = tmp_path / f"cut{cut}.arrows"
        p.write_bytes(data[:cut])
        t = read_trace(p)
        assert t.end is None
        assert 0 < len(t.tokens) <= len(full.tokens)
        assert decision_mismatches(full.events()[:len(t.events())], t.events()) == []
        if cut == len(data) - 400:
            assert t.truncated


def test_every_row_field_is_bounded(both: tuple[Path, Path], tmp_path: Path) -> None:
    """A hostile v2 file (a row field out of the model's bounds) is refused with the row
    named, before anything is sized or looped by it."""
    path = both[1]
    reader = ipc.open_stream(str(path))
    schema = reader.schema
    batches = []
    while True:
        try:
            batches.append(reader.read_next_batch_with_custom_metadata())
        except StopIteration:
            break

    def rewrite(name: str, column: str, change: object) -> Path:
        out = tmp_path / name
        with open(out, "wb") as f, ipc.new_stream(f, schema) as w:
            for i, (b, meta) in enumerate(batches):
                if i == 3 and meta is not None and TOKEN_KEY in meta:
                    arrays = [change(a) if n == column else a  # type: ignore[operator]
                              for n, a in zip(b.schema.names, b.columns, strict=True)]
                    b = pa.RecordBatch.from_arrays(arrays, schema=schema)
                w.write_batch(b, custom_metadata=meta)
        return out

    def shift_fixed(a: pa.Array, to: int) -> pa.Array:
        values = a.values.to_numpy(zero_copy_only=False).copy()
        values[0] = to
        return pa.FixedSizeListArray.from_arrays(pa.array(values, type=a.type.value_type),
                                                 a.type.list_size)

    def shift_list(a: pa.Array, at: int, to: int | None) -> pa.Array:
        """``to`` at entry ``at`` of the column's values (None: a copy of entry 0)."""
        values = a.values.to_numpy(zero_copy_only=False).copy()
        values[at] = values[0] if to is None else to
        return pa.ListArray.from_arrays(a.offsets, pa.array(values, type=a.type.value_type))

    def stored_weights(a: pa.Array) -> pa.Array:
        """The batch's second row stores normalized weights, one of them above 1."""
        k = len(a) and 4
        offsets = np.r_[0, 0, np.full(len(a) - 1, k)].astype(np.int32)
        values = np.full(k, 0.25, np.float32)
        values[2] = 1.5
        valid = np.zeros(len(a), np.bool_)
        valid[1] = True
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values),
                                        mask=pa.array(~valid))

    cases = {
        "ids": (lambda a: shift_fixed(a, 99), r"row \d+\.ids\[0\] 99 is not an expert"),
        "weights": (stored_weights, r"row \d+\.weights\[2\] 1\.5 is not a normalized"),
        "predicted": (lambda a: shift_list(a, 0, 99), r"row \d+: route predicted ids out"),
        "next_layer": (lambda a: pa.array(np.full(len(a), 9, np.int16)), "not a MoE layer"),
        "slots": (lambda a: shift_fixed(a, 60), r"row \d+\.slots\[0\] 60 is not a slot"),
        "layer": (lambda a: pa.array(np.full(len(a), 7, np.int16)), "not a MoE layer"),
        "step": (lambda a: pa.array(np.zeros(len(a), np.int64)), "goes back"),
        "action": (lambda a: shift_fixed(a, 5), "is not an action"),
    }
    for column, (change, message) in cases.items():
        bad = rewrite(f"bad-{column}.arrows", column, change)
        with pytest.raises(TraceFormatError, match=message):
            read_trace(bad)
    # a prediction naming an expert twice (its second id made its first), and one id
    # below 0 in a row shorter than the rest (rows of mixed lengths are padded on read)
    twice = rewrite("twice.arrows", "predicted", lambda a: shift_list(a, 1, None))
    with pytest.raises(TraceFormatError, match=r"row \d+\.predicted names an expert twice"):
        read_trace(twice)

    def shorter(a: pa.Array, second: int | None) -> pa.Array:
        """The first row one id shorter; the second row's first id ``second`` (as it was
        if 0), or (None) the first row's second id made its first."""
        values = a.values.to_numpy(zero_copy_only=False)
        offsets = a.offsets.to_numpy(zero_copy_only=False).copy()
        keep = np.ones(len(values), np.bool_)
        keep[offsets[1] - 1] = False  # the first row loses its last id
        offsets[1:] -= 1
        values = values[keep].copy()
        if second is None:
            values[1] = values[0]
        elif second:
            values[offsets[1]] = second
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()),
                                        pa.array(values, type=a.type.value_type))

    with pytest.raises(TraceFormatError, match=r"row \d+: route predicted ids out of range"):
        read_trace(rewrite("short.arrows", "predicted", lambda a: shorter(a, -3)))
    with pytest.raises(TraceFormatError, match=r"row \d+\.predicted names an expert twice"):
        read_trace(rewrite("short2.arrows", "predicted", lambda a: shorter(a, None)))
    fine = read_trace(rewrite("short3.arrows", "predicted", lambda a: shorter(a, 0)))
    assert fine.columns is not None and fine.columns.predicted is not None


def test_probabilities_are_read_in_place_and_checked_where_used(
        both: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Opening a v2 trace copies no probabilities (each token's rows are views of the
    file); a recorded row with a NaN is refused, naming the file and the row, where the
    rows are first used: the replay's layout and a token's router inputs."""
    from moescope.sim.replay import Routing

    path = both[1]
    good = read_trace(path)
    assert good.columns is not None
    row = good.columns.row_probs(5)
    assert not row.flags.owndata and row.base is not None  # a view, not a copy
    assert np.array_equal(good.columns.probs[5], row)

    reader = ipc.open_stream(str(path))
    bad = tmp_path / "nan.arrows"
    with open(bad, "wb") as f, ipc.new_stream(f, reader.schema) as w:
        i = 0
        while True:
            try:
                b, meta = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            if i == 2 and meta is not None and TOKEN_KEY in meta:
                probs = b.column("probs")
                values = probs.values.to_numpy(zero_copy_only=False).copy()
                values[probs.type.list_size + 3] = np.nan  # the token's second row
                fixed = pa.FixedSizeListArray.from_arrays(
                    pa.array(values, type=probs.type.value_type), probs.type.list_size)
                b = b.set_column(b.schema.get_field_index("probs"), "probs", fixed)
            w.write_batch(b, custom_metadata=meta)
            i += 1
    trace = read_trace(bad)
    first = int(trace.columns.token_rows[2]) + 1  # type: ignore[union-attr]
    with pytest.raises(TraceFormatError, match=rf"nan\.arrows: row {first}\.probs hold a "
                                               r"value that is not finite"):
        trace.tokens[2].routes[1]
    assert trace.tokens[2].routes[0].probs.shape == row.shape  # the token's other rows read
    with pytest.raises(TraceFormatError, match=rf"row {first}\.probs"):
        Routing.from_trace(trace)
    from moescope.cli import main

    assert main(["replay", str(bad), "--policy", "exact"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"row {first}.probs" in err[0], err


def test_a_stream_that_is_not_a_trace_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "x.arrows"
    with open(p, "wb") as f, ipc.new_stream(f, pa.schema([("a", pa.int32())])) as w:
        w.write_batch(pa.record_batch([pa.array([1, 2], pa.int32())], names=["a"]))
    with pytest.raises(TraceFormatError, match="without a MoEScope header"):
        read_trace(p)
    p.write_bytes(b"\xff\xff\xff\xff" + b"\x00" * 3)
    with pytest.raises(TraceFormatError):
        read_trace(p)


def test_event_rows_are_laid_out_when_first_read(both: tuple[Path, Path]) -> None:
    """A v2 trace opens without laying out its event rows; the first token to be asked
    for them lays out the trace's, and every token then reads its own slice of them,
    exactly what version 1 holds."""
    a, b = (read_trace(p) for p in both)
    assert b.columns is not None and b.columns._events is None  # nothing laid out yet
    rows = b.tokens[5].events
    assert b.columns._events is not None
    assert rows.base is not None and np.shares_memory(rows, b.columns.events)
    for x, y in zip(a.tokens, b.tokens, strict=True):
        assert x.events.dtype == y.events.dtype
        assert x.events.tobytes() == y.events.tobytes()
    assert (b.events() == a.events()).all()  # field by field (concatenating skips padding)
    assert b.tokens[5] == b.tokens[5] and b.tokens[5] != b.tokens[6]
    assert all(np.array_equal(b.tokens[3].routes[r].ids, a.tokens[3].routes[r].ids)
               for r in a.tokens[3].routes)
