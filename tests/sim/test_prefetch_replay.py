"""The simulator counts PSR's prefetches per token the way the trace recorder counts the
engine's, so replaying a recorded session under its own policy gives the very counters the
engine recorded, token by token and layer by layer (the simulator makes the engine's
decisions); the sweep turns them into the prefetch accuracy the what-if table shows."""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.cache.prefetch import PrefetchSummary
from moescope.sim import Routing, cost_model, decision_mismatches, replay, sweep
from moescope.sim.sweep import RECORDED, format_table, to_csv
from moescope.trace import Trace, TraceRecorder, read_trace

RecordFn = Callable[..., Path]

pytestmark = pytest.mark.usefixtures("engine_required")


@pytest.fixture(scope="module")
def four_layer_psr(synth_model: Callable[..., Path],
                   tmp_path_factory: pytest.TempPathFactory) -> Path:
    """psr, then quality-first after 10 tokens, then psr again after 20, on a qwen3moe
    with four MoE layers (three of them predicted), two answers."""
    from moescope.engine import Engine, Sampling

    path = tmp_path_factory.mktemp("psr4") / "psr4.jsonl"
    engine = Engine()
    try:
        engine.load(synth_model("qwen3moe", n_layers=4), budget="25%", policy="psr",
                    n_ctx=256, n_threads=1)
        recorder = TraceRecorder.for_engine(path, engine)
        prompt = "The quick brown fox jumps over the lazy dog, again and again and again."
        for answer, seed in enumerate((3, 7)):
            sampling = Sampling(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0,
                                repeat_penalty=1.0, max_tokens=30, seed=seed)
            for stats in engine.generate(prompt, sampling):
                recorder.record(stats, engine)
                if answer == 0 and stats.index + 1 == 10:
                    engine.request_policy("quality-first")
                elif answer == 0 and stats.index + 1 == 20:
                    engine.request_policy("psr")
            prompt += " And then the dog woke up and ran off into the woods, barking."
        recorder.close()
    finally:
        engine.close()
    return path


def _recorded(trace: Trace) -> tuple[np.ndarray, np.ndarray]:
    assert all(t.prefetches is not None and t.prefetch_hits is not None for t in trace.tokens)
    return (np.array([t.prefetches for t in trace.tokens]),
            np.array([t.prefetch_hits for t in trace.tokens]))


def _assert_replay_counts_like_the_engine(trace: Trace) -> None:
    pf, hits = _recorded(trace)
    result = replay(trace, keep_events=True)
    assert result.warnings == []
    assert result.events is not None
    assert decision_mismatches(trace.events(), result.events) == []
    assert result.layer_prefetches is not None and result.layer_prefetch_hits is not None
    np.testing.assert_array_equal(result.layer_prefetches, pf)
    np.testing.assert_array_equal(result.layer_prefetch_hits, hits)
    np.testing.assert_array_equal(result.per_token["prefetches"], pf.sum(axis=1))
    np.testing.assert_array_equal(result.per_token["prefetch_hits"], hits.sum(axis=1))
    assert pf.sum() > 0 and hits.sum() > 0  # the session really prefetched, and it paid off
    # the replay knows which tokens ran a prefetching policy, as the trace says
    prefetching = [t.policy == "psr" for t in trace.tokens]
    assert result.per_token["prefetching"].tolist() == prefetching


def test_replaying_a_psr_session_gives_the_engines_prefetch_counters(
        four_layer_psr: Path) -> None:
    trace = read_trace(four_layer_psr)
    assert len(trace.header.model.moe_layers) == 4
    _assert_replay_counts_like_the_engine(trace)
    pf, _ = _recorded(trace)
    assert pf[:, 0].sum() == 0 and (pf[:, 1:].sum(axis=0) > 0).all()
    assert pf[10:20].sum() == 0  # quality-first in between


@pytest.mark.parametrize(("arch", "policy", "switch_policy", "name"), [
    ("qwen3moe", "psr", "quality-first", "psr.jsonl"),
    ("qwen3moe", "quality-first", "psr", "to-psr.jsonl"),
    ("deepseek2", "psr", "quality-first", "psr.jsonl"),  # a leading dense layer
])
def test_replay_counts_equal_the_recorded_ones_across_switches_and_architectures(
        record: RecordFn, arch: str, policy: str, switch_policy: str, name: str) -> None:
    trace = read_trace(record(arch, name=name, policy=policy, tokens=24, switch_at=9,
                              switch_policy=switch_policy))
    _assert_replay_counts_like_the_engine(trace)


def test_the_comparison_notices_a_replay_that_prefetches_differently(
        four_layer_psr: Path) -> None:
    """Without the recorded predictions the replay cannot prefetch: counters differ."""
    trace = read_trace(four_layer_psr)
    pf, _ = _recorded(trace)
    for tok in trace.tokens:
        tok.routes = {i: dataclasses.replace(r, predicted=None, next_layer=-1)
                      for i, r in tok.routes.items()}
    blind = replay(trace, keep_events=True)
    assert blind.layer_prefetches is not None
    assert not np.array_equal(blind.layer_prefetches, pf)
    assert blind.per_token["prefetches"].sum() == 0
    assert blind.prefetch is None  # it could not prefetch, so it reports no accuracy


def test_prefetch_accuracy_is_the_live_panels_definition_over_decode_tokens(
        four_layer_psr: Path) -> None:
    trace = read_trace(four_layer_psr)
    pf, hits = _recorded(trace)
    psr_decode = np.array([t.policy == "psr" and t.phase == "decode" for t in trace.tokens])
    expected = PrefetchSummary(tokens=int(psr_decode.sum()), prefetches=int(pf[psr_decode].sum()),
                               hits=int(hits[psr_decode].sum()))
    routing = Routing.from_trace(trace)
    own = replay(routing)
    assert own.prefetch == expected
    assert expected.accuracy is not None and 0 < expected.accuracy <= 1
    # a policy without prefetch has no accuracy (not 0%); psr at any budget has one
    assert replay(routing, "exact").prefetch is None
    assert replay(routing, "quality-first", 8).prefetch is None
    wide = replay(routing, "psr", 8)
    assert wide.prefetch is not None and wide.prefetch.tokens == int(
        sum(t.phase == "decode" for t in trace.tokens))
    assert wide.prefetch.prefetches > 0


def test_the_sweep_reports_prefetch_accuracy_only_for_prefetching_policies(
        four_layer_psr: Path) -> None:
    trace = read_trace(four_layer_psr)
    result = sweep(trace, ["exact", "quality-first", "psr", RECORDED], ["25%"],
                   cost_model("pcie4"))
    rows = {r.policy: r for r in result.rows}
    assert rows["exact"].prefetch_accuracy is None and rows["exact"].prefetches_per_token is None
    assert rows["quality-first"].prefetch_accuracy is None
    psr = rows["psr"]
    assert psr.prefetch_accuracy is not None and 0 < psr.prefetch_accuracy <= 1
    assert psr.prefetches_per_token is not None and psr.prefetches_per_token > 0
    own = replay(trace, None, rows[RECORDED].slots).prefetch
    assert own is not None
    assert rows[RECORDED].prefetch_accuracy == own.accuracy
    assert rows[RECORDED].prefetches_per_token == own.per_token
    # the CLI's table, CSV and JSON carry the column: "-" where the policy does not prefetch
    table = format_table(result).splitlines()
    assert "prefetch acc" in table[0]
    exact_line = next(line for line in table if line.startswith("exact "))
    psr_line = next(line for line in table if line.startswith("psr "))
    assert exact_line.rstrip().endswith("-")
    assert psr_line.rstrip().endswith(f"{psr.prefetch_accuracy:.1%}")
    by_policy = {r["policy"]: r for r in csv.DictReader(io.StringIO(to_csv(result)))}
    assert by_policy["exact"]["prefetch_accuracy"] == ""
    assert float(by_policy["psr"]["prefetch_accuracy"]) == psr.prefetch_accuracy


def test_a_trace_from_the_probability_unit_bonus_core_says_its_replay_is_not_exact(
        four_layer_psr: Path) -> None:
    """Cores before 0.2 added the routing bonus to raw router probabilities; 0.2 scales it
    by the selection's probability. Replaying such a trace under its own psr cannot make the
    recorded decisions, and the replay must say so instead of passing for exact; a what-if
    under a chosen policy is a new simulation and needs no warning."""
    trace = read_trace(four_layer_psr)
    assert replay(trace).warnings == []
    software = dict(trace.header.software, moecache="0.1.0")
    trace.header = dataclasses.replace(trace.header, software=software)
    warnings = replay(trace).warnings
    assert len(warnings) == 1 and "gate-weight units" in warnings[0]
    assert replay(trace, "psr").warnings == []
    assert replay(trace, "quality-first").warnings == []
