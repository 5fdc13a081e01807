"""The native batch replay (``moecache_replay_batch``) decides exactly what the per-call
replay and the engine decided: on every synthetic architecture, from a version-2 trace
the recorder wrote, for the recorded configuration and for other policies and budgets."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.cache.native import NativeError
from moescope.sim import Routing, decision_mismatches, replay
from moescope.sim.replay import REPLAY_FIELDS, ReplayResult, replay_many
from moescope.trace import read_trace
from moescope_testing import MOE_ARCHES

RecordFn = Callable[..., Path]

CONFIGS = [(None, None), ("exact", 4), ("quality-first", 4), ("speed-first", None),
           ("cache-prior", 6), ("psr", 4), ("substitute-all", 8), ("threshold", 5)]


def same_numbers(a: ReplayResult, b: ReplayResult) -> list[str]:
    """Fields of the per-token arrays where two replays differ (mass: to rounding, since
    the batch sums the core's counters and the per-call replay sums rows)."""
    bad = []
    for name in (*REPLAY_FIELDS, "decode", "prefetching"):
        x, y = a.per_token[name], b.per_token[name]
        ok = (np.allclose(x, y, rtol=1e-9, atol=1e-9) if name == "substituted_mass"
              else np.array_equal(x, y))
        if not ok:
            bad.append(name)
    return bad


@pytest.mark.parametrize("arch", MOE_ARCHES)
def test_batch_replay_of_a_v2_trace_matches_the_engine_and_the_per_call_replay(
        record: RecordFn, arch: str) -> None:
    trace = read_trace(record(arch, name="trace.arrows", tokens=20, answers=2, switch_at=7))
    assert trace.columns is not None and trace.header.version == 2
    routing = Routing.from_trace(trace)
    batch = replay_many(routing, CONFIGS, threads=2, keep_events=True)
    recorded = trace.events()
    assert batch[0].events is not None
    assert decision_mismatches(recorded, batch[0].events) == []
    k = trace.header.model.top_k
    assert np.array_equal(recorded["weights"][:, :k], batch[0].events["weights"][:, :k])
    assert batch[0].warnings == []
    for (policy, slots), got in zip(CONFIGS, batch, strict=True):
        one = replay(routing, policy, slots, keep_events=True)
        assert one.events is not None and got.events is not None
        assert decision_mismatches(one.events, got.events) == [], (policy, slots)
        assert same_numbers(one, got) == [], (policy, slots)
        assert got.warnings == one.warnings
    assert int(recorded["n_substitute"].sum()) > 0


def test_batch_replay_of_a_psr_session_prefetches_as_the_engine_did(record: RecordFn) -> None:
    trace = read_trace(record("qwen3moe", name="psr.arrows", policy="psr", tokens=24,
                              switch_at=9, switch_policy="quality-first"))
    routing = Routing.from_trace(trace)
    assert routing.predicted is not None
    result, psr4 = replay_many(routing, [(None, None), ("psr", 4)], keep_events=True)
    assert result.events is not None
    assert decision_mismatches(trace.events(), result.events) == []
    assert result.per_token["prefetches"].sum() > 0
    assert same_numbers(replay(routing), result) == []
    assert same_numbers(replay(routing, "psr", 4), psr4) == []


def test_a_v1_and_a_v2_recording_of_one_session_replay_alike(record: RecordFn) -> None:
    v1 = read_trace(record("qwen3moe", name="same.jsonl", tokens=16))
    v2 = read_trace(record("qwen3moe", name="same.arrows", tokens=16))
    assert decision_mismatches(v1.events(), v2.events()) == []
    a = replay_many(v1, CONFIGS)
    b = replay_many(v2, CONFIGS)
    for x, y in zip(a, b, strict=True):
        assert same_numbers(x, y) == []


def test_a_session_recorded_as_parquet_replays_as_the_engine_decided(record: RecordFn) -> None:
    """Recorded through the recorder (journal, compacted at close): the engine's decisions
    replay exactly, and the file holds what the stream recording of the session holds."""
    v2 = read_trace(record("qwen3moe", name="same.arrows", tokens=16))
    pq = read_trace(record("qwen3moe", name="same.parquet", tokens=16))
    assert pq.path is not None and pq.path.suffix == ".parquet"
    assert decision_mismatches(v2.events(), pq.events()) == []
    result = replay_many(pq, [(None, None)], keep_events=True)[0]
    assert result.events is not None and decision_mismatches(pq.events(), result.events) == []
    for x, y in zip(replay_many(v2, CONFIGS), replay_many(pq, CONFIGS), strict=True):
        assert same_numbers(x, y) == []


def test_the_batch_refuses_a_configuration_the_core_would_refuse(record: RecordFn) -> None:
    routing = Routing.from_trace(read_trace(record("qwen3moe", name="trace.arrows",
                                                   tokens=20, answers=2, switch_at=7)))
    with pytest.raises(NativeError):
        replay_many(routing, [("exact", routing.header.model.n_expert + 1)])
    routing.call_stop[-1] = routing.n_rows + 5  # a call past the rows: nothing is replayed
    with pytest.raises(NativeError):
        replay_many(routing, [("exact", 4)])


def test_the_shared_ranking_names_each_rows_best_experts_in_substitution_order(
        record: RecordFn) -> None:
    from moescope.cache.batch import rank_rows

    routing = Routing.from_trace(read_trace(record("qwen3moe", name="trace.arrows",
                                                   tokens=12)))
    made = routing.substitute_ranking()
    assert made is not None and routing.substitute_ranking() is made  # once per trace
    ranks, counts, selected = made
    probs = routing.probs
    experts = np.broadcast_to(np.arange(probs.shape[1]), probs.shape)
    order = np.lexsort((experts, -probs), axis=-1)  # probability down, then lower id
    assert (counts > 0).all()
    for r in range(routing.n_rows):
        assert ranks[r, :counts[r]].tolist() == order[r, :counts[r]].tolist()
    assert np.array_equal(selected, np.take_along_axis(probs, routing.ids, axis=1))
    broken = probs.copy()
    broken[3, 1] = np.nan  # no order exists: that row is left to the scan
    again = rank_rows(broken, routing.ids)
    assert again is not None and again[1][3] == 0 and (np.delete(again[1], 3) > 0).all()


def test_the_layout_and_a_batch_replay_lay_out_no_event_rows_until_asked(
        record: RecordFn, monkeypatch: pytest.MonkeyPatch) -> None:
    """A version-2 trace's rows are laid out as event rows (864 bytes each) only when
    something reads them: ``Routing.from_trace`` and a batch replay take steps, layers and
    ids from the columns. ``recorded`` then lays them out, equal to the trace's."""
    from moescope.trace import arrow_format

    laid: list[int] = []
    events_of = arrow_format.events_of

    def counted(cols, k):  # type: ignore[no-untyped-def]
        laid.append(cols["n"])
        return events_of(cols, k)

    monkeypatch.setattr(arrow_format, "events_of", counted)
    trace = read_trace(record("qwen3moe", name="trace.arrows", tokens=20, answers=2,
                              switch_at=7))
    routing = Routing.from_trace(trace)
    (result,) = replay_many(routing, [("exact", 4)])
    assert laid == [] and result.per_token["selections"].sum() > 0
    recorded = routing.recorded
    assert len(laid) == 1 and routing.recorded is recorded and routing.n_rows == len(recorded)
    events = trace.events()
    assert recorded.tobytes() == events.tobytes() and len(laid) == 1
    assert np.array_equal(routing.ids, events["ids"][:, :routing.ids.shape[1]])
    assert np.array_equal(routing.call_step, events["step"][routing.call_start])
    assert np.array_equal(routing.call_layer, events["layer"][routing.call_start])


ALL_PRESETS = ["exact", "quality-first", "speed-first", "cache-prior", "psr", "substitute-all",
               "threshold", "first-choice"]


@pytest.mark.parametrize("arch", MOE_ARCHES)
def test_the_replay_loop_gives_the_per_call_cores_totals_to_the_bit(
        record: RecordFn, arch: str) -> None:
    """Without event rows a fixed configuration runs the batch replay's own decision loop
    (native/src/replay_loop.cpp); asking for the rows runs the per-call core. Every
    per-token total, the substituted mass included, must be identical. On one thread the
    loop's run of a policy at a budget it never filled is certainly taken for its larger
    budgets (substitute-all at k slots keeps the first row's experts), and on two it may be:
    the same totals either way."""
    trace = read_trace(record(arch, name="trace.arrows", tokens=20, answers=2, switch_at=7))
    routing = Routing.from_trace(trace)
    k = trace.header.model.top_k
    every = trace.header.model.n_expert  # every expert resident: the loop's all-hit path
    configs = [(None, None),
               *[(p, s) for p in ALL_PRESETS for s in (k, k + 2, None, every)]]
    reference = replay_many(routing, configs, threads=2, keep_events=True)
    for threads in (1, 2):
        fast = replay_many(routing, configs, threads=threads)
        for (policy, slots), a, b in zip(configs, fast, reference, strict=True):
            for name in REPLAY_FIELDS:
                assert np.array_equal(a.per_token[name], b.per_token[name]), \
                    (threads, policy, slots, name)
    assert sum(int(r.per_token["substitutions"].sum()) for r in fast) > 0


@pytest.mark.parametrize("arch", MOE_ARCHES)
def test_a_compacted_trace_replays_to_the_bit_as_its_journal(
        record: RecordFn, arch: str, tmp_path: Path) -> None:
    """Parquet stores the journal's rows losslessly: every per-token total of every
    configuration is the same bytes replayed from either file."""
    from moescope.trace.parquet_format import compact

    stream = record(arch, name="trace.arrows", tokens=20, answers=2, switch_at=7)
    a = read_trace(stream)
    b = read_trace(compact(stream, tmp_path / "trace.parquet"))
    k = a.header.model.top_k
    configs = [(None, None), *[(p, s) for p in ALL_PRESETS for s in (k, k + 2, None)]]
    for x, y in zip(replay_many(a, configs, threads=2), replay_many(b, configs, threads=2),
                    strict=True):
        assert x.per_token.tobytes() == y.per_token.tobytes()


def test_a_kept_plan_replays_to_the_bit_as_a_fresh_batch(
        record: RecordFn, monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan (``moecache_replay_plan``) is made at the first batch and kept with the
    routing; batches over it, of any policies, with and without event rows, give what a
    batch that validates and packs the trace itself gives, to the bit."""
    from moescope.cache import batch

    path = record("qwen3moe", name="trace.arrows", tokens=20, answers=2, switch_at=7)
    routing = Routing.from_trace(read_trace(path))
    k = routing.header.model.top_k
    configs = [(None, None), *[(p, s) for p in ALL_PRESETS for s in (k, k + 2, None)]]
    assert routing.plan is None
    first = replay_many(routing, configs[:3], threads=2)  # fetch-all and two others
    plan = routing.plan
    assert plan is not None and plan.nbytes >= routing.n_rows * (20 * k + 257)
    kept = replay_many(routing, configs, threads=2)
    assert routing.plan is plan  # made once, served every later batch
    rows = replay_many(routing, configs, threads=2, keep_events=True)
    monkeypatch.setattr(batch, "has_plan", lambda: False)
    fresh_routing = Routing.from_trace(read_trace(path))
    fresh = replay_many(fresh_routing, configs, threads=2)
    assert fresh_routing.plan is None
    for a, b in zip(first, fresh[:3], strict=True):
        assert a.per_token.tobytes() == b.per_token.tobytes()
    for (policy, slots), a, b, c in zip(configs, kept, fresh, rows, strict=True):
        assert a.per_token.tobytes() == b.per_token.tobytes(), (policy, slots)
        assert a.per_token.tobytes() == c.per_token.tobytes(), (policy, slots)
    assert sum(int(r.per_token["substitutions"].sum()) for r in kept) > 0


def test_a_plan_is_refused_for_another_trace(record: RecordFn) -> None:
    """The core ties a plan to the trace it was made for (dimensions and arrays): a batch
    of another trace over it fails with a clear error and replays nothing, and a routing
    whose arrays were replaced makes itself a new plan."""
    from moescope.cache.batch import CReplayConfig, c_policy, replay_batch
    from moescope.cache.policy import Policy
    from moescope.sim.replay import native_trace

    path = record("qwen3moe", name="trace.arrows", tokens=12)
    a = Routing.from_trace(read_trace(path))
    b = Routing.from_trace(read_trace(path))  # the same rows, other arrays
    replay_many(a, [("exact", 4)])
    plan = a.plan
    assert plan is not None
    trace_b, keep = native_trace(b, b.substitute_ranking())
    cfg = CReplayConfig(policy=c_policy(Policy.preset("quality-first")), slots=4)
    with pytest.raises(NativeError, match="made for another trace"):
        replay_batch(trace_b, [cfg], plan=plan)
    trace_a, keep_a = native_trace(a, a.substitute_ranking())
    out, _ = replay_batch(trace_a, [cfg], plan=plan)
    again, _ = replay_batch(trace_b, [cfg])  # b's own batch
    assert out.tobytes() == again.tobytes()
    del keep, keep_a
    a.ids = a.ids.copy()  # moved: the kept plan no longer fits, a new one is made
    (moved,) = replay_many(a, [("quality-first", 4)])
    assert a.plan is not None and a.plan is not plan
    for name in REPLAY_FIELDS:
        assert np.array_equal(moved.per_token[name], again[0][name]), name


def test_batches_on_two_threads_make_one_plan(record: RecordFn,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Two what-ifs starting together on one routing share one plan (made under the
    routing's lock) and give the same results."""
    import threading

    from moescope.cache.batch import ReplayPlan

    routing = Routing.from_trace(read_trace(record("qwen3moe", name="trace.arrows",
                                                   tokens=12)))
    made: list[int] = []
    make = ReplayPlan.make

    def counted(*args: object, **kwargs: object) -> ReplayPlan | None:
        made.append(1)
        return make(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ReplayPlan, "make", counted)
    got: list[list[ReplayResult]] = []
    threads = [threading.Thread(target=lambda: got.append(replay_many(routing, CONFIGS[1:])))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(made) == 1 and routing.plan is not None and len(got) == 2
    for a, b in zip(*got, strict=True):
        assert a.per_token.tobytes() == b.per_token.tobytes()
