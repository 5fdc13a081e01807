"""Trace format v2 as Parquet: recorded to a journal, compacted at close, bit for bit the
journal's rows and tokens; a crash leaves the journal (a readable trace) and never a file
that passes for a finished one; a hostile .parquet gets one line naming the file."""

from __future__ import annotations

import base64
import io
import json
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest

from moescope.sim.replay import Routing, decision_mismatches, replay_many
from moescope.trace import TraceFormatError, TraceRecorder, read_trace
from moescope.trace import parquet_format as pf
from moescope.trace.arrow_format import END_KEY, HEADER_KEY
from moescope.trace.names import live_trace_file
from moescope.trace.reader import read_journal
from moescope_testing.traces import core_trace


@pytest.fixture
def pair(tmp_path: Path) -> tuple[Path, Path]:
    """One session's stream and its compaction (the stream kept)."""
    stream = core_trace(tmp_path / "t.arrows", n_tokens=12)
    return stream, pf.compact(stream, tmp_path / "t.parquet")


def test_the_parquet_file_holds_the_streams_rows_and_tokens_bit_for_bit(
        pair: tuple[Path, Path]) -> None:
    stream, parquet = pair
    a = ipc.open_stream(str(stream)).read_all()
    b = pq.read_table(parquet)
    # the types restored (fixed-size lists, int16), list entries declared non-null
    assert b.schema.remove_metadata().equals(pf.file_schema(a.schema).remove_metadata())
    assert b.num_rows == a.num_rows
    for name in a.column_names:
        x, y = a.column(name).combine_chunks(), b.column(name).combine_chunks()
        assert y.equals(x.cast(y.type)) and y.cast(x.type).equals(x), name
    x, y = read_trace(stream), read_trace(parquet)
    assert (x.header, x.end, x.truncated) == (y.header, y.end, y.truncated)
    assert x.end is not None and x.end["tokens"] == 12
    assert len(x.tokens) == len(y.tokens) == 12
    for s, t in zip(x.tokens, y.tokens, strict=True):
        assert (s.index, s.answer, s.position, s.phase, s.token_id, s.text, s.seconds,
                s.policy, s.slots_per_layer, s.changes, s.timings) == \
            (t.index, t.answer, t.position, t.phase, t.token_id, t.text, t.seconds,
             t.policy, t.slots_per_layer, t.changes, t.timings)
        assert s.events.tobytes() == t.events.tobytes()
        assert sorted(s.routes) == sorted(t.routes)
        for row, r in s.routes.items():
            q = t.routes[row]
            assert r.probs.tobytes() == q.probs.tobytes()
            assert r.weights.tobytes() == q.weights.tobytes()
            assert r.next_layer == q.next_layer and r.predicted is not None
            assert q.predicted is not None and r.predicted.tolist() == q.predicted.tolist()
    assert x.columns is not None and y.columns is not None
    assert x.columns.probs.tobytes() == y.columns.probs.tobytes()
    assert np.array_equal(x.columns.token_rows, y.columns.token_rows)


def test_integer_columns_are_delta_encoded_and_plain_ones_still_read(
        pair: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every integer column is stored DELTA_BINARY_PACKED (small differences bit-packed:
    PLAIN kept 4 or 8 bytes a value, and made a short session's Parquet file larger than its
    gzip JSON Lines); a file written before, with PLAIN integers, reads as the same trace."""
    stream, parquet = pair
    md = pq.read_metadata(parquet)
    schema = pq.read_schema(parquet)
    ints = {pf._leaf(f) for f in schema
            if pa.types.is_integer(f.type.value_type if pa.types.is_list(f.type)
                                   or pa.types.is_fixed_size_list(f.type) else f.type)}
    assert {"token", "step", "ids.list.element", "predicted.list.element"} <= ints
    for g in range(md.num_row_groups):
        for c in range(md.num_columns):
            col = md.row_group(g).column(c)
            if col.path_in_schema in ints:
                assert "DELTA_BINARY_PACKED" in col.encodings, col.path_in_schema
                assert "PLAIN" not in col.encodings, col.path_in_schema
            elif col.path_in_schema in pf.FLOAT_COLUMNS:
                assert "BYTE_STREAM_SPLIT" in col.encodings, col.path_in_schema
    # the statistics a query skips row groups by are still there
    first = md.row_group(0)
    stats = {first.column(c).path_in_schema: first.column(c).is_stats_set
             for c in range(md.num_columns)}
    assert all(stats[name] for name in pf.STATISTICS)

    monkeypatch.setattr(pf, "INTEGER_ENCODING", "PLAIN")  # as written before
    old = pf.compact(stream, tmp_path / "old.parquet")
    assert "PLAIN" in pq.read_metadata(old).row_group(0).column(0).encodings
    assert old.stat().st_size > parquet.stat().st_size
    a, b = read_trace(old), read_trace(parquet)
    assert a.columns is not None and b.columns is not None
    assert [t.events.tobytes() for t in a.tokens] == [t.events.tobytes() for t in b.tokens]
    assert a.columns.probs.tobytes() == b.columns.probs.tobytes()
    assert pq.read_table(old).equals(pq.read_table(parquet))


def test_a_short_sessions_parquet_file_is_smaller_than_its_gzip_json_lines(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo model's short PSR session (40 tokens) recorded as Parquet and as gzip JSON
    Lines: Parquet, the finished format, is the smaller (it was 109.7 kB against 94.6)."""
    from moescope.cli import main

    sizes = {}
    for name in ("d.parquet", "d.jsonl.gz"):
        out = tmp_path / name
        assert main(["generate", "--policy", "psr", "-n", "200", "--trace", str(out)]) == 0
        sizes[name] = out.stat().st_size
    capsys.readouterr()
    a, b = read_trace(tmp_path / "d.parquet"), read_trace(tmp_path / "d.jsonl.gz")
    assert len(a.tokens) == len(b.tokens) > 1
    assert [t.events.tobytes() for t in a.tokens] == [t.events.tobytes() for t in b.tokens]
    assert sizes["d.parquet"] < sizes["d.jsonl.gz"], sizes


def _no_inputs_trace(out: Path) -> Path:
    """Three tokens without router inputs, the first and last without rows."""
    from trace_helpers import psr_header

    from moescope.cache.native import EVENT_DTYPE
    from moescope.trace import TokenRecord
    from moescope.trace.writer import open_writer

    header = psr_header()
    rows = np.zeros(3, dtype=EVENT_DTYPE)
    rows["layer"] = [1, 2, 3]
    rows["k"] = 4
    rows["ids"][:, :4] = [0, 1, 2, 3]
    rows["used_ids"][:, :4] = [0, 1, 2, 3]
    rows["weights"][:, :4] = 0.25
    rows["action"][:, :4] = 1
    rows["slots"][:, :4] = [0, 1, 2, 3]
    rows["n_admit"] = 4
    rows["admitted"][:, :4] = [0, 1, 2, 3]
    with open_writer(out, header) as w:
        w.write_token(TokenRecord(index=0, phase="decode", token_id=5, text="a\nb", seconds=0.5,
                                  policy="psr", slots_per_layer=4,
                                  events=np.zeros(0, dtype=EVENT_DTYPE)))
        w.write_token(TokenRecord(index=1, phase="decode", token_id=6, text="ü",
                                  seconds=0.25, policy="psr", slots_per_layer=4,
                                  events=rows))
        w.write_token(TokenRecord(index=2, phase="decode", token_id=7, text="",
                                  seconds=0.125, policy="psr", slots_per_layer=4,
                                  events=np.zeros(0, dtype=EVENT_DTYPE)))
    return out


def test_tokens_without_rows_and_rows_without_router_inputs_survive(tmp_path: Path) -> None:
    """A token with no event rows (the first, of a model with no MoE routing yet) and a
    trace recorded without router inputs: the tokens' fields are kept in order and no
    row claims probabilities it does not have."""
    out = _no_inputs_trace(tmp_path / "r.parquet")
    assert not pf.journal_path(out).exists()
    t = read_trace(out)
    assert [x.text for x in t.tokens] == ["a\nb", "ü", ""]
    assert [len(x.events) for x in t.tokens] == [0, 3, 0]
    assert t.columns is not None and not t.columns.exact.any()
    assert all(not x.routes for x in t.tokens)
    assert t.tokens[1].events["weights"][:, :4].tolist() == [[0.25] * 4] * 3


def test_the_one_liners_open_it_and_the_header_is_beside_the_rows(
        pair: tuple[Path, Path]) -> None:
    """What docs/trace-format.md shows (pandas, polars, DuckDB where installed)."""
    parquet = pair[1]
    n = len(read_trace(parquet).events())
    assert pq.read_table(parquet).num_rows == n
    header = json.loads(pq.read_schema(parquet).metadata[HEADER_KEY])
    assert header["version"] == 2 and header["model"]["n_expert"] == 16
    tokens = pq.read_metadata(parquet).metadata[pf.TOKENS_KEY].decode().splitlines()
    assert [json.loads(line)["index"] for line in tokens] == list(range(12))
    assert json.loads(pq.read_schema(parquet).metadata[END_KEY])["type"] == "end"
    # the tokens' fields are in the footer once: not again in pyarrow's copy of the schema
    assert pf.TOKENS_KEY not in (pq.read_schema(parquet).metadata or {})
    stored = base64.b64decode(pq.read_metadata(parquet).metadata[b"ARROW:schema"])
    assert HEADER_KEY in stored and pf.TOKENS_KEY not in stored
    try:
        import pandas
    except ImportError:
        pass
    else:
        assert len(pandas.read_parquet(parquet)) == n
        table = pandas.read_json(io.StringIO(pq.read_metadata(parquet).metadata[
            pf.TOKENS_KEY].decode()), lines=True, dtype=False)
        assert table["index"].tolist() == list(range(12))
        assert table["text"].tolist() == [t.text for t in read_trace(parquet).tokens]
    try:
        import polars
    except ImportError:
        pass
    else:
        assert len(polars.read_parquet(parquet)) == n
    try:
        import duckdb
    except ImportError:
        pass
    else:
        assert duckdb.sql(f"SELECT count(*) FROM '{parquet}'").fetchone()[0] == n


def test_replaying_the_parquet_file_gives_its_journals_totals_to_the_bit(
        pair: tuple[Path, Path]) -> None:
    stream, parquet = pair
    x, y = read_trace(stream), read_trace(parquet)
    configs = [(None, None), ("exact", 4), ("quality-first", 5), ("speed-first", 6),
               ("psr", 5), ("substitute-all", 4), ("threshold", 7), ("first-choice", 4)]
    a = replay_many(Routing.from_trace(x), configs, threads=2)
    b = replay_many(Routing.from_trace(y), configs, threads=2)
    for r, s in zip(a, b, strict=True):
        assert r.per_token.tobytes() == s.per_token.tobytes()
    ref = replay_many(Routing.from_trace(y), [(None, None)], keep_events=True)[0]
    assert ref.events is not None and decision_mismatches(y.events(), ref.events) == []


# --------------------------------------------------------------------------- crashes


def test_a_journal_cut_off_mid_token_opens_without_that_token_and_compacts(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A killed session leaves NAME.parquet.journal.arrows and no NAME.parquet; the
    journal opens as a v2 trace minus the token being written, and ``moescope trace
    compact`` finishes it (journal removed) into a file with those tokens."""
    from moescope.cli import main

    full = core_trace(tmp_path / "full.arrows", n_tokens=10)
    data = full.read_bytes()
    target = tmp_path / "s.parquet"
    journal = pf.journal_path(target)
    assert journal.name == "s.parquet.journal.arrows"
    whole = read_trace(full)
    for cut_at in range(len(data) - 100, 0, -100):  # the end batch and part of a token
        journal.write_bytes(data[:cut_at])
        cut = read_trace(journal)
        if len(cut.tokens) < 10:
            break
    assert cut.truncated and cut.end is None and len(cut.tokens) == 9
    assert main(["trace", "compact", str(journal)]) == 0
    assert "removed" in capsys.readouterr().out
    assert not journal.exists() and target.exists()
    done = read_trace(target)
    assert done.end is None and len(done.tokens) == 9
    assert done.events().tobytes() == whole.events()[:len(done.events())].tobytes()
    assert done.columns is not None and whole.columns is not None
    n = len(done.events())
    assert done.columns.probs.tobytes() == whole.columns.probs[:n].tobytes()
    # compacting again: the journal is gone, and a finished file is not a stream
    assert main(["trace", "compact", str(journal)]) == 2
    assert main(["trace", "compact", str(target)]) == 2
    journal.write_bytes(b"")  # killed before its first token: the header goes out with it
    assert main(["trace", "compact", str(journal)]) == 2
    (tmp_path / "v1.jsonl").write_text('{"type": "header"}\n')
    assert main(["trace", "compact", str(tmp_path / "v1.jsonl")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("moescope: error: ") for line in err), err
    assert err[1].endswith("s.parquet: already a Parquet trace; nothing to compact"), err
    assert "empty file" in err[2] and journal.exists(), err  # an empty journal is left
    assert "not a version-2 trace stream" in err[3], err


def test_an_interrupted_compaction_leaves_the_journal_and_no_trace(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "s.parquet"
    journal = pf.journal_path(target)
    core_trace(journal, n_tokens=6)
    before = journal.read_bytes()

    def dies(j: Any, out: Any, *_stop: Any) -> None:
        out.write(b"PAR1" + b"\0" * 5000)  # part of a file, then the process "dies"
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pf, "write_parquet", dies)
    with pytest.raises(OSError, match="No space"):
        pf.compact(journal, remove=True)
    assert journal.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [journal.name]  # no .part left
    assert len(read_trace(journal).tokens) == 6
    # a .part left by a kill (no cleanup ran) is not mistaken for a trace
    part = tmp_path / ".s.parquet.x1y2.part"
    part.write_bytes(b"PAR1" + b"\0" * 5000)
    with pytest.raises(TraceFormatError, match=r"^\.s\.parquet\.x1y2\.part: a Parquet file "
                                               r"cut off before its footer"):
        read_trace(part)


def test_the_writer_never_truncates_a_journal_that_is_there(tmp_path: Path) -> None:
    target = tmp_path / "s.parquet"
    journal = pf.journal_path(target)
    journal.write_bytes(b"an earlier session's journal")
    with pytest.raises(TraceFormatError, match="already there"):
        core_trace(target, n_tokens=2)
    assert journal.read_bytes() == b"an earlier session's journal"
    assert not target.exists()


def test_the_recorder_compacts_on_its_writer_thread(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Compaction is the slow part of closing (~0.4 ms a token): the recorder runs it on
    its writer thread, never the caller's (the GUI's); a write that failed leaves the
    journal as the trace, not compacted."""
    from trace_helpers import psr_header

    from moescope.cache.native import EVENT_DTYPE

    threads: list[str] = []
    real = pf.compact

    def spy(*args: Any, **kwargs: Any) -> Path:
        threads.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(pf, "compact", spy)

    def token(i: int) -> SimpleNamespace:
        return SimpleNamespace(index=i, token_id=1, text="x", seconds=0.01, policy="psr",
                               slots_per_layer=4, events=np.zeros(0, dtype=EVENT_DTYPE))

    path = tmp_path / "t.parquet"
    recorder = TraceRecorder(path, psr_header())
    for i in range(3):
        recorder.record(token(i))
    recorder.close(stop_reason="done")
    assert threads == ["moescope-trace-writer"]
    assert path.exists() and not pf.journal_path(path).exists()
    assert live_trace_file(path) == path
    t = read_trace(path)
    assert len(t.tokens) == 3 and t.end is not None and t.end["stop_reason"] == "done"

    failing = tmp_path / "f.parquet"
    recorder = TraceRecorder(failing, psr_header())
    recorder.record(token(0))
    recorder.flush()

    def full(_record: object) -> None:
        raise OSError(28, "No space left on device")

    inner = recorder.writer._journal
    monkeypatch.setattr(inner, "write_token", full)
    recorder.record(token(1))
    with pytest.raises(OSError, match="No space"):
        recorder.close()
    assert inner._raw.closed and not failing.exists()
    assert threads == ["moescope-trace-writer"]
    assert len(read_trace(pf.journal_path(failing)).tokens) == 1
    assert live_trace_file(failing) == pf.journal_path(failing)  # what the user is told


# --------------------------------------------------------------------------- hostile


def _rewrite(src: Path, out: Path, *, table: Callable[[pa.Table], pa.Table] | None = None,
             meta: Callable[[dict[bytes, bytes]], dict[bytes, bytes]] | None = None) -> Path:
    """``src`` written again with its table and/or key-value metadata changed."""
    t = pq.read_table(src)
    m = file_keys(src)  # written back as the schema's: as files before the footer-only keys
    if table is not None:
        t = table(t)
    if meta is not None:
        m = meta(m)
    pq.write_table(t.replace_schema_metadata(m), out)
    return out


def file_keys(path: Path) -> dict[bytes, bytes]:
    """The file's key-value metadata, without pyarrow's own copy of the schema."""
    return {k: v for k, v in pq.read_metadata(path).metadata.items() if k != b"ARROW:schema"}


def _set(t: pa.Table, name: str, values: pa.Array | pa.ChunkedArray, *,
         retype: bool = False) -> pa.Table:
    """Column ``name`` replaced by ``values``, cast to its type (``retype``: of theirs)."""
    i = t.schema.get_field_index(name)
    if not retype:
        values = values.cast(t.schema.field(i).type)
    return t.set_column(i, t.schema.field(i).with_type(values.type), values)


def test_hostile_parquet_files_get_one_line_naming_the_file(
        pair: tuple[Path, Path], tmp_path: Path) -> None:
    good = pair[1]
    data = good.read_bytes()
    n = pq.read_table(good).num_rows

    def ids_out_of_range(t: pa.Table) -> pa.Table:
        col = t.column("ids").combine_chunks()
        values = col.values.to_numpy(zero_copy_only=False).copy()
        values[7] = 99
        return _set(t, "ids", pa.FixedSizeListArray.from_arrays(
            pa.array(values, pa.int16()), 4))

    def tokens_out_of_order(t: pa.Table) -> pa.Table:
        token = t.column("token").to_numpy().copy()
        token[3], token[4] = 5, 0
        return _set(t, "token", pa.array(token, pa.int32()))

    cases: dict[str, tuple[Callable[[Path], Path], str]] = {
        "truncated": (lambda p: (p.write_bytes(data[:len(data) // 2]), p)[1],
                      "cut off before its footer"),
        "footer": (lambda p: (p.write_bytes(data[:-8] + (1 << 31).to_bytes(4, "little")
                                            + b"PAR1"), p)[1], "footer claims"),
        "garbled": (lambda p: (p.write_bytes(data[:4] + b"\x17" * (len(data) - 12)
                                             + data[-8:]), p)[1], "not a readable Parquet"),
        "wrong-type": (lambda p: _rewrite(good, p, table=lambda t: _set(
            t, "probs", t.column("probs").cast(pa.list_(pa.float64())), retype=True)),
            "bad header: the rows' columns are not the ones version 2 defines"),
        "ids": (lambda p: _rewrite(good, p, table=ids_out_of_range),
                r"row 1\.ids\[3\] 99 is not an expert"),
        "token-order": (lambda p: _rewrite(good, p, table=tokens_out_of_order),
                        r"row \d+\.token \d+ is not a token of the trace's 12 in order"),
        "no-header": (lambda p: _rewrite(good, p, meta=lambda m: {
            k: v for k, v in m.items() if k != HEADER_KEY}),
            "a Parquet file without a MoEScope header"),
        "no-tokens": (lambda p: _rewrite(good, p, meta=lambda m: {
            k: v for k, v in m.items() if k != pf.TOKENS_KEY}), "no tokens"),
        "few-tokens": (lambda p: _rewrite(good, p, meta=lambda m: {
            **m, pf.TOKENS_KEY: m[pf.TOKENS_KEY].split(b"\n")[0]}),
            r"rows for 1 tokens|is not a token of the trace's 1"),
        "bad-token": (lambda p: _rewrite(good, p, meta=lambda m: {
            **m, pf.TOKENS_KEY: m[pf.TOKENS_KEY].replace(b'"seconds":', b'"seconds":-', 1)}),
            r"token 0: bad token record"),
        "token-json": (lambda p: _rewrite(good, p, meta=lambda m: {
            **m, pf.TOKENS_KEY: b"[1]\n" * 12}), "token 0: its fields are not a JSON"),
        "ranges": (lambda p: _rewrite(good, p, meta=lambda m: {
            **m, pf.NO_INPUTS_KEY: json.dumps([[3, 2]]).encode()}),
            "is not a range of rows in order"),
        "ranges-big": (lambda p: _rewrite(good, p, meta=lambda m: {
            **m, pf.NO_INPUTS_KEY: json.dumps([[0, 1]] * (n + 1)).encode()}),
            "is not a list of row ranges"),
        "huge-meta": (lambda p: _rewrite(good, p, meta=lambda m: {
            **m, pf.TOKENS_KEY: m[pf.TOKENS_KEY] + b"\n" + b"{}" * 50_000}),
            r"token 12: its fields are not JSON \(unexpected content after"),
    }
    for name, (make, message) in cases.items():
        p = make(tmp_path / f"{name}.parquet")
        with pytest.raises(TraceFormatError) as err:
            read_trace(p)
        text = str(err.value)
        assert text.startswith(p.name) and "\n" not in text, (name, text)
        assert __import__("re").search(message, text), (name, text)


def test_a_footer_larger_than_the_bound_is_not_read(pair: tuple[Path, Path],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pf, "MAX_FOOTER_BYTES", 1024)
    with pytest.raises(TraceFormatError, match=r"^t\.parquet: its Parquet footer claims "
                                               r"[\d,]+ bytes, more than the file or the "
                                               r"reader \(1,024\) allow"):
        read_trace(pair[1])


def test_probabilities_that_disagree_with_the_index_are_refused_where_used(
        pair: tuple[Path, Path], tmp_path: Path) -> None:
    """The index of rows without router inputs is what opening trusts (decoding the
    probabilities is most of the reading time); a file whose probabilities say otherwise,
    or hold a NaN, is refused (one line, the row named) when they are decoded."""
    from moescope.cli import main

    good = pair[1]
    lying = _rewrite(good, tmp_path / "lying.parquet", meta=lambda m: {
        **m, pf.NO_INPUTS_KEY: b"[[2,3]]"})  # row 2 would have no weights at all
    with pytest.raises(TraceFormatError, match=r"^lying\.parquet: row 2 has neither router "
                                               r"inputs nor normalized weights"):
        read_trace(lying)
    none = _no_inputs_trace(tmp_path / "none.parquet")
    lying = _rewrite(none, tmp_path / "lying2.parquet", meta=lambda m: {
        **m, pf.NO_INPUTS_KEY: b"[]"})  # every row would hold probabilities
    t = read_trace(lying)
    with pytest.raises(TraceFormatError, match=r"^lying2\.parquet: row 0: its probabilities "
                                               r"disagree"):
        Routing.from_trace(t)
    with pytest.raises(TraceFormatError, match=r"^lying2\.parquet: row 0: its probabilities "
                                               r"disagree"):
        t.tokens[1].routes[0]

    def nan(table: pa.Table) -> pa.Table:
        col = table.column("probs").combine_chunks()
        values = col.values.to_numpy(zero_copy_only=False).copy()
        values[16 * 5 + 2] = np.nan
        return _set(table, "probs", pa.FixedSizeListArray.from_arrays(
            pa.array(values, pa.float32()), 16))

    bad = _rewrite(good, tmp_path / "nan.parquet", table=nan)
    t = read_trace(bad)
    with pytest.raises(TraceFormatError, match=r"^nan\.parquet: row 5\.probs hold a value"):
        t.tokens[2].routes[1]
    assert main(["replay", str(bad), "--policy", "exact"]) == 2


def test_a_journal_with_a_bad_row_is_not_compacted(pair: tuple[Path, Path],
                                                   tmp_path: Path) -> None:
    """Compaction checks every row first: a journal is only ever replaced by a file that
    opens."""
    stream = pair[0]
    j = read_journal(stream)
    out = tmp_path / "bad.parquet.journal.arrows"
    with open(out, "wb") as f, ipc.new_stream(f, j.schema) as w:
        for i, (b, text) in enumerate(zip(j.batches, j.texts, strict=True)):
            if i == 4:
                layer = np.full(b.num_rows, 9, np.int16)
                b = b.set_column(b.schema.get_field_index("layer"),
                                 pa.field("layer", pa.int16(), nullable=False),
                                 pa.array(layer))
            w.write_batch(b, custom_metadata={b"moescope.token": text})
    with pytest.raises(TraceFormatError, match="not a MoE layer"):
        pf.compact(out, remove=True)
    assert out.exists() and not (tmp_path / "bad.parquet").exists()


def test_f16_router_inputs_round_trip(tmp_path: Path) -> None:
    """Half-precision probabilities (``router_inputs: "f16"``) are byte-stream-split too
    and read back as the stream holds them."""
    import dataclasses

    from moescope.trace.writer import open_writer

    src = read_trace(core_trace(tmp_path / "a.arrows", n_tokens=6))
    header = dataclasses.replace(src.header, router_inputs="f16")
    with open_writer(tmp_path / "h.arrows", header) as a, \
            open_writer(tmp_path / "h.parquet", header) as b:
        for t in src.tokens:
            a.write_token(t)
            b.write_token(t)
    assert pq.read_schema(tmp_path / "h.parquet").field("probs").type.value_type == \
        pa.float16()
    x, y = read_trace(tmp_path / "h.arrows"), read_trace(tmp_path / "h.parquet")
    assert x.columns is not None and y.columns is not None
    assert x.columns.probs.tobytes() == y.columns.probs.tobytes()
    assert x.tokens[2].routes[1].probs.tobytes() == y.tokens[2].routes[1].probs.tobytes()
    assert x.events().tobytes() == y.events().tobytes()


def test_trace_compact_converts_any_stream_and_refuses_bad_outputs(
        pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.cli import main

    stream = pair[0]
    assert main(["trace", "compact", str(stream), str(tmp_path / "c.parquet")]) == 0
    assert stream.exists() and read_trace(tmp_path / "c.parquet").end is not None
    # t.parquet beside it, a name the user did not give: not written over (it replaced
    # another session's file silently), and said in one line; given as OUT, replaced
    before = (tmp_path / "t.parquet").read_bytes()
    capsys.readouterr()
    assert main(["trace", "compact", str(stream)]) == 2
    assert (tmp_path / "t.parquet").read_bytes() == before
    assert capsys.readouterr().err == (f"moescope: error: {tmp_path / 't.parquet'} is already "
                                       f"there; not overwritten (give OUT to write the "
                                       f"Parquet trace elsewhere)\n")
    assert main(["trace", "compact", str(stream), str(tmp_path / "t.parquet")]) == 0
    assert read_trace(tmp_path / "t.parquet").end is not None
    capsys.readouterr()
    for out in (tmp_path, stream, tmp_path / "nowhere" / "x.parquet"):
        assert main(["trace", "compact", str(stream), str(out)]) == 2
    assert main(["trace", "compact", str(tmp_path / "missing.arrows")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 4 and all(line.startswith("moescope: error: ") for line in err), err
    journal = pf.journal_path(tmp_path / "k.parquet")
    journal.write_bytes(stream.read_bytes())
    (tmp_path / "k.parquet").write_bytes(b"an earlier run's k.parquet")
    # a journal's default is the name its session was recorded to: it replaces it, as
    # closing the session would have (the hint a crash's journal gives must work)
    assert main(["trace", "compact", "--keep", str(journal)]) == 0
    assert journal.exists() and read_trace(tmp_path / "k.parquet").end is not None
    assert read_trace(stream).events().tobytes() == stream_events(tmp_path / "k.parquet")


def stream_events(path: Path) -> bytes:
    return read_trace(path).events().tobytes()


def test_many_row_groups_decode_on_threads_as_one(tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Row groups hold whole tokens; the probabilities of a file of several decode the
    same on threads (each its own reader) as a row at a time; a group that splits a
    token is refused."""
    import os

    stream = core_trace(tmp_path / "s.arrows", n_tokens=12)
    monkeypatch.setattr(pf, "ROW_GROUP_BYTES", 6 * 1024)  # 3 tokens of 2 rows (1 kB at least)
    out = pf.compact(stream, tmp_path / "s.parquet")
    assert pq.ParquetFile(out).metadata.num_row_groups == 4
    x, y = read_trace(stream), read_trace(out)
    assert x.columns is not None and y.columns is not None
    rows = [y.columns.row_probs(r).tobytes() for r in range(len(y.events()))]
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    assert y.columns.probs.tobytes() == x.columns.probs.tobytes() == b"".join(rows)
    split = tmp_path / "split.parquet"
    pq.write_table(pq.read_table(out).replace_schema_metadata(file_keys(out)), split,
                   row_group_size=5)
    with pytest.raises(TraceFormatError, match=r"^split\.parquet: a row group splits a "
                                               r"token's rows"):
        read_trace(split)
