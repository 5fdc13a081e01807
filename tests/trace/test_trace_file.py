"""The trace file: what a recorded session holds, and how the reader treats bad files."""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moescope.cache.native import EVENT_DTYPE, ExpertCache
from moescope.cache.policy import Policy
from moescope.trace import (
    TRACE_VERSION,
    RouterInput,
    TokenRecord,
    TraceFormatError,
    TraceHeader,
    TraceModel,
    TraceWriter,
    read_trace,
)

RecordFn = Callable[..., Path]
N_EXPERT, TOP_K, N_LAYERS = 16, 4, 2


def _header(router_inputs: str | None = "f32") -> TraceHeader:
    model = TraceModel(file_name="m.gguf", metadata_sha256="ab" * 32, architecture="qwen3moe",
                         n_layers=N_LAYERS, moe_layers=(0, 1), n_expert=N_EXPERT, top_k=TOP_K,
                         bytes_per_expert=(1000, 1000))
    return TraceHeader(model=model, budget="25%", slots_per_layer=4,
                       policy=Policy.preset("speed-first"), router_inputs=router_inputs)


def _records(n_tokens: int = 6, seed: int = 0) -> list[TokenRecord]:
    """Tokens whose event rows come from the real core (standalone), routing random."""
    rng = np.random.default_rng(seed)
    out = []
    with ExpertCache(N_LAYERS, N_EXPERT, TOP_K, 4, "speed-first") as cache:
        for i in range(n_tokens):
            cache.begin_step()
            routes = {}
            for layer in range(N_LAYERS):
                probs = rng.dirichlet(np.ones(N_EXPERT)).astype(np.float32)
                ids = np.argsort(-probs)[:TOP_K].astype(np.int32)
                cache.route(layer, probs, ids, probs[ids])
                routes[layer] = RouterInput(row=layer, probs=probs, weights=probs[ids], ids=ids)
            out.append(TokenRecord(index=i, phase="prefill" if i == 0 else "decode",
                                   token_id=i + 3, text=f"t{i} ü", seconds=0.001 * (i + 1),
                                   policy="speed-first", slots_per_layer=4,
                                   events=cache.drain_events(), routes=routes))
    return out


def _write(path: Path, records: list[TokenRecord], router_inputs: str | None = "f32") -> None:
    with TraceWriter(path, _header(router_inputs)) as writer:
        for r in records:
            writer.write_token(r)


@pytest.mark.parametrize("name", ["t.jsonl", "t.jsonl.gz"])
def test_a_written_trace_reads_back_bit_for_bit(tmp_path: Path, name: str) -> None:
    records = _records()
    _write(tmp_path / name, records)
    trace = read_trace(tmp_path / name)
    assert trace.header.policy == Policy.preset("speed-first")
    assert trace.header.version == TRACE_VERSION
    assert trace.end == {"type": "end", "tokens": len(records)}
    assert not trace.truncated
    for wrote, read in zip(records, trace.tokens, strict=True):
        assert (read.index, read.text, read.seconds) == (wrote.index, wrote.text, wrote.seconds)
        for field in ("step", "layer", "ids", "weights", "action", "used_ids", "slots",
                      "substituted_mass", "admitted", "evicted", "bytes_sync"):
            k = TOP_K if field in ("ids", "weights", "action", "used_ids", "slots") else None
            a, b = wrote.events[field], read.events[field]
            if field in ("admitted", "evicted"):
                n = wrote.events["n_admit" if field == "admitted" else "n_evict"]
                assert all(np.array_equal(x[:m], y[:m]) for x, y, m in zip(a, b, n, strict=True))
            else:
                assert np.array_equal(a[:, :k] if k else a, b[:, :k] if k else b), field
        for row, route in wrote.routes.items():
            got = read.routes[row]
            assert got.probs.tobytes() == route.probs.tobytes()
            assert got.weights.tobytes() == route.weights.tobytes()
            assert np.array_equal(got.ids, route.ids)


def test_gzip_is_chosen_by_the_suffix(tmp_path: Path) -> None:
    _write(tmp_path / "t.jsonl.gz", _records(2))
    with gzip.open(tmp_path / "t.jsonl.gz", "rt") as f:
        assert json.loads(f.readline())["format"] == "moescope-trace"


def test_half_precision_router_inputs_round_trip_within_fp16(tmp_path: Path) -> None:
    records = _records(2)
    _write(tmp_path / "t.jsonl", records, router_inputs="f16")
    trace = read_trace(tmp_path / "t.jsonl")
    assert trace.header.router_inputs == "f16"
    route = trace.tokens[1].routes[0]
    assert route.probs.dtype == np.float32
    np.testing.assert_allclose(route.probs, records[1].routes[0].probs, rtol=1e-3, atol=1e-4)
    assert route.weights.tobytes() == records[1].routes[0].weights.tobytes()


def test_a_bad_record_is_reported_with_its_line_number(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _write(path, _records(4))
    lines = path.read_text().splitlines()
    bad = json.loads(lines[2])
    del bad["events"][0]["ids"]
    lines[2] = json.dumps(bad)
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match=r"line 3: .*ids"):
        read_trace(path)


def test_broken_json_in_the_middle_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _write(path, _records(4))
    lines = path.read_text().splitlines()
    lines[3] = lines[3][:40]
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(TraceFormatError, match="line 4: not valid JSON"):
        read_trace(path)


@pytest.mark.parametrize("name", ["notes.txt", "t.jsonl", "t.jsonl.gz"])
def test_some_other_file_is_named_as_no_trace(tmp_path: Path, name: str) -> None:
    """A text (or anything not JSON) opened as a trace said "line 1: not valid JSON", as
    if a trace were broken."""
    path = tmp_path / name
    path.write_bytes(b"Dear diary,\ntoday I opened the wrong file.\n")
    with pytest.raises(TraceFormatError, match=rf"^{name}: not a MoEScope trace \(its "
                                               r"first line is not a JSON record"):
        read_trace(path)


def test_a_truncated_last_line_is_dropped_and_flagged(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _write(path, _records(5))
    text = path.read_text()
    cut = text.rstrip("\n").rsplit("\n", 2)[0] + "\n" + text.rstrip("\n").rsplit("\n", 2)[1][:50]
    path.write_text(cut)  # header + tokens 0..3 complete, token 4 cut mid-line, no end
    trace = read_trace(path)
    assert trace.truncated
    assert [t.index for t in trace.tokens] == [0, 1, 2, 3]
    assert trace.end is None


def test_a_cut_off_gzip_stream_reads_up_to_the_last_flushed_token(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl.gz"
    writer = TraceWriter(path, _header())
    for r in _records(3):
        writer.write_token(r)
    size = path.stat().st_size  # everything flushed so far; the writer is never closed
    trace = read_trace(path)
    assert [t.index for t in trace.tokens] == [0, 1, 2]
    assert trace.truncated and trace.end is None
    path.write_bytes(path.read_bytes()[: size - 7])  # and a cut inside the last block
    assert len(read_trace(path).tokens) >= 2


def test_a_newer_version_is_refused_with_a_reason(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    _write(path, _records(1))
    lines = path.read_text().splitlines()
    header = json.loads(lines[0])
    header["version"] = TRACE_VERSION + 1
    path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    with pytest.raises(TraceFormatError,
                       match=r"^t\.jsonl: line 1: trace version .* not supported"):
        read_trace(path)  # named like every other reader error


def test_files_that_are_not_traces_are_refused(tmp_path: Path) -> None:
    (tmp_path / "empty.jsonl").write_text("")
    (tmp_path / "other.jsonl").write_text('{"type": "header", "format": "other"}\n')
    with pytest.raises(TraceFormatError, match="empty"):
        read_trace(tmp_path / "empty.jsonl")
    with pytest.raises(TraceFormatError, match="line 1"):
        read_trace(tmp_path / "other.jsonl")
    with pytest.raises(TraceFormatError, match="no such"):
        read_trace(tmp_path / "missing.jsonl")


def test_event_rows_keep_the_core_dtype(tmp_path: Path) -> None:
    _write(tmp_path / "t.jsonl", _records(2))
    assert read_trace(tmp_path / "t.jsonl").events().dtype == EVENT_DTYPE


@pytest.mark.usefixtures("engine_required")
def test_an_engine_session_records_every_token_and_its_routing(record: RecordFn) -> None:
    """Two answers; after the 7th token the user asks for speed-first and a 50% budget."""
    trace = read_trace(record("qwen3moe", tokens=20, answers=2, switch_at=7))
    h = trace.header
    assert h.model.file_name.endswith(".gguf") and len(h.model.metadata_sha256) == 64
    assert (h.model.n_expert, h.model.top_k, h.slots_per_layer) == (16, 4, 4)
    assert h.model.bytes_per_expert and all(b > 0 for b in h.model.bytes_per_expert)
    assert h.policy == Policy.preset("quality-first") and h.budget == "25%"
    assert h.initial_resident == 0
    assert {"moescope", "llama_cpp", "moecache", "python"} <= set(h.software)
    assert h.software["llama_cpp"] and "cpu" in h.machine and "gpus" in h.machine
    assert len(trace.tokens) == 40 and trace.end is not None and not trace.truncated
    assert [t.phase for t in trace.tokens].count("prefill") == 2
    assert [t.answer for t in trace.tokens] == [0] * 20 + [1] * 20
    # requested after token 7 of the first answer, in effect from its 8th (index 7)
    changed = {t.index: [c.kind for c in t.changes] for t in trace.tokens if t.changes}
    assert changed == {7: ["policy", "slots"]}
    change = trace.tokens[7].changes
    assert change[0].policy == Policy.preset("speed-first") and change[1].slots == 8
    assert [t.policy for t in trace.tokens[6:8]] == ["quality-first", "speed-first"]
    for tok in trace.tokens:
        assert tok.timings is not None
        if tok.phase == "decode":
            assert len(tok.events) == len(h.model.moe_layers)
            assert sorted(tok.routes) == list(range(len(tok.events)))  # every row replayable


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([0.0, -0.0, 0.25, 0.5, 1.0, -1.0, float("nan"), float("inf"),
                                 float("-inf")])
                | st.floats(-4, 4, width=32), min_size=1, max_size=80),
       st.integers(1, 40))
def test_ranked_predictions_are_a_stable_sort_of_the_best(values: list[float],
                                                          keep: int) -> None:
    """The core's ranking (selection, then a sort of the kept) equals a full stable sort
    (ties by lower id, NaN last), with many ties, -0, NaN and infinities."""
    from moescope.trace import rank_predictions

    s = np.asarray(values, dtype=np.float32)
    reference = np.argsort(-np.where(np.isnan(s), -np.inf, s), kind="stable")[:keep]
    assert rank_predictions(s, keep).tolist() == reference.tolist()
    # a block of rows (one per layer) is ranked row by row
    block = np.stack([s, s[::-1], np.roll(s, 3)])
    assert rank_predictions(block, keep).tolist() == [
        rank_predictions(row, keep).tolist() for row in block]


def test_ranking_predictions_refuses_what_it_cannot_rank() -> None:
    """Bounded before the core reads a byte: no experts, nothing to keep."""
    from moescope.trace import rank_predictions

    with pytest.raises(ValueError, match="at least one score"):
        rank_predictions(np.zeros((2, 0), np.float32), 3)
    with pytest.raises(ValueError, match="keep >= 1"):
        rank_predictions(np.zeros(4, np.float32), 0)
    assert rank_predictions(np.zeros((0, 4), np.float32), 2).shape == (0, 2)


def test_a_failed_write_surfaces_on_the_recording_thread_and_the_file_still_closes(
        tmp_path: Path) -> None:
    """The writer thread's error is raised by the next record (or flush), again by every
    later one, once by close (which closes the file all the same); a second close does
    nothing. What was written before the failure reads back."""
    import errno
    from types import SimpleNamespace

    from trace_helpers import psr_header

    from moescope.trace import TraceRecorder

    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(path, psr_header())

    def token(i: int) -> SimpleNamespace:
        return SimpleNamespace(index=i, token_id=1, text="x", seconds=0.01, policy="psr",
                               slots_per_layer=4, events=np.zeros(0, dtype=EVENT_DTYPE))

    for i in range(3):
        recorder.record(token(i))
    recorder.flush()

    def full(_data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    raw = recorder.writer._raw
    recorder.writer._raw = SimpleNamespace(write=full, flush=raw.flush, close=raw.close,
                                           closed=False)
    recorder.record(token(3))  # handed over; the writer thread fails on it
    with pytest.raises(OSError, match="No space"):
        recorder.record(token(4))
    with pytest.raises(OSError, match="No space"):
        recorder.flush()
    with pytest.raises(OSError, match="No space"):
        recorder.close()
    recorder.close()  # closed: nothing more
    assert raw.closed
    trace = read_trace(path)
    assert [t.index for t in trace.tokens] == [0, 1, 2] and trace.end is None
