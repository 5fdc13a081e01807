"""The synthetic test trace (``moescope_testing.traces.synthetic_trace``) writes the per-layer
PSR counters the recorder writes, so a trace window shows its prefetch accuracy instead of
calling it a trace from before those counters."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from moescope.display.trace_io import prefetch_overview, reopen
from moescope.sim import Routing
from moescope.sim.replay import replay, replay_many
from moescope.trace import read_trace
from moescope_testing.traces import synthetic_trace


def test_a_psr_synthetic_trace_records_the_cores_prefetch_counters(tmp_path: Path) -> None:
    path = synthetic_trace(tmp_path / "t.arrows", n_tokens=8, n_layers=4, n_expert=32,
                           top_k=4, slots=8)
    trace = read_trace(path)
    routing = Routing.from_trace(trace)
    again = replay(routing, None, None, keep_events=True)
    assert again.layer_prefetches is not None and again.layer_prefetch_hits is not None
    recorded = np.array([t.prefetches for t in trace.tokens])
    hits = np.array([t.prefetch_hits for t in trace.tokens])
    assert np.array_equal(recorded, again.layer_prefetches)
    assert np.array_equal(hits, again.layer_prefetch_hits)
    assert recorded.sum() > 0 and 0 < hits.sum() < recorded.sum()
    (batch,) = replay_many(routing, [(None, None)])  # the batch's per-token totals agree
    assert np.array_equal(batch.per_token["prefetches"], recorded.sum(axis=1))
    assert np.array_equal(batch.per_token["prefetch_hits"], hits.sum(axis=1))

    line = prefetch_overview(reopen(path))
    assert line.startswith("PSR, 8 prefetching tokens:"), line
    assert "not recorded" not in line


def test_a_synthetic_trace_of_a_policy_without_prefetch_records_no_counters(
        tmp_path: Path) -> None:
    path = synthetic_trace(tmp_path / "t.arrows", n_tokens=4, n_layers=3, n_expert=16,
                           top_k=2, slots=4, policy="quality-first")
    trace = read_trace(path)
    assert all(t.prefetches is None and t.prefetch_hits is None for t in trace.tokens)
    assert prefetch_overview(reopen(path)) == ""
