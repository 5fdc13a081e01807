"""PSR's prefetch counters in the trace: written per token (sparse), read back exactly,
absent (unknown, not zero) in a trace written before them, and equal to the engine's own
cumulative counters when summed over a real session."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from trace_helpers import MOE_LAYERS, psr_header, set_token_field

from moescope.cache.prefetch import PrefetchCounters, PrefetchSummary, prefetch_delta, summarize
from moescope.trace import (
    TRACE_VERSION,
    TokenRecord,
    TraceFormatError,
    TraceRecorder,
    TraceWriter,
    read_trace,
    to_perfetto,
)
from moescope_testing.traces import as_older_trace

RecordFn = Callable[..., Path]


def _token(i: int, prefetches: list[int] | None, hits: list[int] | None) -> TokenRecord:
    from moescope.cache.native import EVENT_DTYPE

    return TokenRecord(index=i, phase="prefill" if i == 0 else "decode", token_id=i, text="x",
                       seconds=0.001, policy="psr", slots_per_layer=4,
                       events=np.zeros(0, dtype=EVENT_DTYPE),
                       prefetches=None if prefetches is None else np.array(prefetches),
                       prefetch_hits=None if hits is None else np.array(hits))


def test_counters_round_trip_and_are_written_sparse(tmp_path: Path) -> None:
    tokens = [_token(0, [0, 0, 0], [0, 0, 0]), _token(1, [0, 4, 0], [0, 0, 0]),
              _token(2, [0, 3, 4], [0, 2, 3]), _token(3, None, None)]
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, psr_header()) as writer:
        for t in tokens:
            writer.write_token(t)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    # model layer indices, only layers that counted something; [] = recorded zero
    assert [line.get("prefetch", "absent") for line in lines[1:5]] == \
        [[], [[2, 4, 0]], [[2, 3, 2], [3, 4, 3]], "absent"]
    assert lines[0]["version"] == TRACE_VERSION == 1  # an optional field: no version bump

    trace = read_trace(path)
    for wrote, read in zip(tokens, trace.tokens, strict=True):
        if wrote.prefetches is None:
            assert read.prefetches is None and read.prefetch_hits is None
            continue
        assert read.prefetches is not None and read.prefetch_hits is not None
        assert read.prefetches.tolist() == wrote.prefetches.tolist()
        assert read.prefetch_hits.tolist() == wrote.prefetch_hits.tolist()
    # Perfetto carries the token's totals where they were recorded
    slices = [e for e in to_perfetto(trace)["traceEvents"] if e.get("ph") == "X"
              and e.get("cat") in ("prefill", "decode")]
    assert [s["args"].get("prefetches") for s in slices] == [0, 4, 7, None]
    assert [s["args"].get("prefetch_hits") for s in slices] == [0, 0, 5, None]


def test_writing_counters_needs_the_layers_they_belong_to() -> None:
    with pytest.raises(ValueError, match="MoE layers"):
        _token(1, [0, 1, 0], [0, 0, 0]).to_json()
    with pytest.raises(ValueError, match="2/2 entries for 3"):
        _token(1, [0, 1], [0, 0]).to_json(None, MOE_LAYERS)


@pytest.mark.parametrize("bad", [[[0, 1, 0]], [[2, 1, 0], [2, 1, 0]], [[2, -1, 0]], [[2, 1]],
                                 {"2": [1, 0]}, [[2, True, 0]], [[2, 1.0, 0]],
                                 [[2, 1, 1 << 31]], [["2", 1, 0]], [[[2], 1, 0]], [[2, 1, 0], 7]])
def test_a_malformed_prefetch_field_names_its_line(tmp_path: Path, bad: object) -> None:
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, psr_header()) as writer:
        writer.write_token(_token(0, [0, 0, 0], [0, 0, 0]))
        writer.write_token(_token(1, [0, 2, 0], [0, 1, 0]))
    set_token_field(path, 2, "prefetch", bad)
    with pytest.raises(TraceFormatError, match=r"line 3: bad token record: .*prefetch"):
        read_trace(path)


def test_delta_takes_a_reset_as_counting_anew() -> None:
    base = np.array([[5, 7], [2, 3]])
    assert prefetch_delta(np.array([[6, 9], [2, 4]]), base).tolist() == [[1, 2], [0, 1]]
    assert prefetch_delta(np.array([[1, 0], [0, 0]]), base).tolist() == [[1, 0], [0, 0]]
    assert prefetch_delta(np.array([[1, 0], [0, 0]]), None).tolist() == [[1, 0], [0, 0]]
    assert summarize([([1, 2], [1, 1]), ([3, 0], [0, 4])]) == \
        PrefetchSummary(tokens=2, prefetches=6, hits=6)


@pytest.mark.usefixtures("engine_required")
def test_an_old_trace_without_counters_still_loads(record: RecordFn, tmp_path: Path) -> None:
    """A psr session as an older MoEScope wrote it: everything but the counters."""
    recorded = record("qwen3moe", name="psr.jsonl", policy="psr", tokens=24, switch_at=9,
                      switch_policy="quality-first")
    old = tmp_path / "old.jsonl"
    dropped = as_older_trace(recorded, old, "prefetch")
    assert dropped == 24  # every token of the new trace has them
    trace = read_trace(old)
    assert len(trace.tokens) == 24 and not trace.truncated
    assert all(t.prefetches is None and t.prefetch_hits is None for t in trace.tokens)
    new = read_trace(recorded)
    np.testing.assert_array_equal(trace.events(), new.events())


@pytest.mark.usefixtures("engine_required")
def test_recorded_counters_add_up_to_the_engines_cumulative_counters(
        synth_model: Callable[..., Path], tmp_path: Path) -> None:
    """Four MoE layers under psr, then quality-first, then psr again: per layer, the sum of
    the recorded per-token counts is the core's own total, and only psr tokens prefetch."""
    from moescope.engine import Engine, Sampling

    engine = Engine()
    try:
        engine.load(synth_model("qwen3moe", n_layers=4), budget="25%", policy="psr", n_ctx=256,
                    n_threads=1)
        recorder = TraceRecorder.for_engine(tmp_path / "s.jsonl", engine)
        sampling = Sampling(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                            max_tokens=30, seed=3)
        for stats in engine.generate("The quick brown fox jumps over the lazy dog, again and "
                                     "again and again.", sampling):
            recorder.record(stats, engine)
            if stats.index + 1 == 10:
                engine.request_policy("quality-first")
            elif stats.index + 1 == 20:
                engine.request_policy("psr")
        recorder.close()
        totals = PrefetchCounters(engine.cache, engine.model.info.moe_layers).read()
        layer_stats = engine.layer_stats()
    finally:
        engine.close()
    assert totals.tolist() == [[s.prefetches for s in layer_stats.values()],
                               [s.prefetch_hits for s in layer_stats.values()]]
    trace = read_trace(tmp_path / "s.jsonl")
    assert len(trace.tokens) == 30
    assert all(t.prefetches is not None for t in trace.tokens)
    pf = np.array([t.prefetches for t in trace.tokens])
    hits = np.array([t.prefetch_hits for t in trace.tokens])
    assert pf.shape == (30, 4)
    np.testing.assert_array_equal(pf.sum(axis=0), totals[0])
    np.testing.assert_array_equal(hits.sum(axis=0), totals[1])
    assert totals[0, 0] == 0 and (totals[0, 1:] > 0).all()  # the first layer is never predicted
    assert hits.sum() > 0
    policies = [t.policy for t in trace.tokens]
    # requested after tokens 10 and 20, in effect from the next token
    assert policies[:10] == ["psr"] * 10 and policies[20:] == ["psr"] * 10
    assert policies[10:20] == ["quality-first"] * 10
    assert pf[10:20].sum() == 0  # no prefetch while the policy does not prefetch
    assert pf[1:10].sum() > 0 and pf[20:].sum() > 0
