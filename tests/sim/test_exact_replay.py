"""The simulator shares the engine's core: replaying a recorded session under its own
policy and budget makes exactly the engine's decisions, on every synthetic architecture."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.sim import Routing, decision_mismatches, replay
from moescope.trace import read_trace
from moescope_testing import MOE_ARCHES

RecordFn = Callable[..., Path]


@pytest.mark.parametrize("arch", MOE_ARCHES)
def test_replaying_a_recorded_session_reproduces_the_engines_decisions(
        record: RecordFn, arch: str) -> None:
    """Two answers (the second reuses the first's KV cache), with a switch to speed-first
    and a larger budget requested mid-answer, as a user would from the window."""
    trace = read_trace(record(arch, tokens=20, answers=2, switch_at=7))
    recorded = trace.events()
    assert len(recorded) > 0
    assert any(t.changes for t in trace.tokens)

    result = replay(trace, keep_events=True)
    assert result.approximate_rows == 0
    assert result.warnings == []
    assert result.events is not None
    assert decision_mismatches(recorded, result.events) == []
    k = trace.header.model.top_k
    assert np.array_equal(recorded["weights"][:, :k], result.events["weights"][:, :k])
    assert int(recorded["n_substitute"].sum()) > 0  # the policies really substituted


def test_a_trace_without_router_inputs_replays_exact_exactly(record: RecordFn) -> None:
    """Fetch-every-miss never consults probabilities, so the event rows alone suffice;
    the rows are still counted as approximate for policies that substitute."""
    trace = read_trace(record("olmoe", policy="exact", tokens=16, router_inputs=None))
    assert all(not t.routes for t in trace.tokens)
    result = replay(trace, keep_events=True)
    assert result.events is not None
    assert decision_mismatches(trace.events(), result.events) == []
    assert result.approximate_rows == len(trace.events())


def test_one_routing_replays_under_many_policies_from_the_same_start(record: RecordFn) -> None:
    routing = Routing.from_trace(read_trace(record("qwen3moe", tokens=20, answers=2, switch_at=7)))
    first = replay(routing, "speed-first", 4)
    again = replay(routing, "speed-first", 4)
    assert np.array_equal(first.per_token, again.per_token)
    exact = replay(routing, "exact", 4)
    assert exact.substituted_fraction == 0.0 and exact.mass_per_token == 0.0
    assert first.mass_per_token > 0.0
    assert first.fetches_per_token < exact.fetches_per_token
    everything = replay(routing, "exact", 16)
    assert everything.hit_rate > exact.hit_rate


def test_a_short_prompt_takes_the_original_path_and_every_row_replays_exactly(
        record: RecordFn) -> None:
    """The engine governs one-token ubatches only: even a two-token prompt is prefill
    (no rows), and every governed row has its router inputs, so nothing is approximate
    even under a substituting policy."""
    trace = read_trace(record("qwen3moe", policy="quality-first", budget="50%", tokens=10,
                              prompt="Hi"))
    assert len(trace.tokens[0].events) == 0
    result = replay(trace, keep_events=True)
    assert result.events is not None
    assert decision_mismatches(trace.events(), result.events) == []
    assert result.approximate_rows == 0


def test_a_trace_with_missing_rows_is_replayed_with_a_warning(record: RecordFn) -> None:
    trace = read_trace(record("qwen3moe", tokens=20, answers=2, switch_at=7))
    trace.tokens[5].events = trace.tokens[5].events[:0]
    trace.tokens[5].routes = {}
    result = replay(trace)
    assert len(result.warnings) == 1 and "jumps from step" in result.warnings[0]


def test_a_psr_session_replays_exactly_with_its_recorded_predictions(record: RecordFn) -> None:
    """PSR prefetches from the next layer's predicted router scores; the trace keeps their
    ranking, so the replay prefetches, and therefore decides, exactly as the engine did."""
    trace = read_trace(record("qwen3moe", name="psr.jsonl", policy="psr", tokens=24,
                              switch_at=9, switch_policy="quality-first"))
    routing = Routing.from_trace(trace)
    assert routing.predicted is not None and (routing.next_layer >= 0).any()
    result = replay(routing, keep_events=True)
    assert result.warnings == []
    assert result.events is not None
    assert decision_mismatches(trace.events(), result.events) == []
    assert result.per_token["n_async"].sum() > result.per_token["admissions"].sum()
    # without its predictions the same trace cannot be replayed exactly, and says so
    for tok in trace.tokens:
        tok.routes = {i: dataclasses.replace(r, predicted=None, next_layer=-1)
                      for i, r in tok.routes.items()}
    blind = replay(trace, keep_events=True)
    assert any("PSR" in w for w in blind.warnings)
    assert blind.events is not None
    assert decision_mismatches(trace.events(), blind.events) != []


def test_switching_into_psr_mid_session_replays_exactly(record: RecordFn) -> None:
    """The switch takes effect at the token's first step, so that token already prefetches."""
    trace = read_trace(record("qwen3moe", name="to-psr.jsonl", policy="quality-first",
                              tokens=24, switch_at=9, switch_policy="psr"))
    result = replay(trace, keep_events=True)
    assert result.warnings == []
    assert result.events is not None
    assert decision_mismatches(trace.events(), result.events) == []
    assert result.per_token["n_async"][9:].sum() > result.per_token["admissions"][9:].sum()
