"""A watched batch replay (``replay_many(progress=...)``, ``sweep(progress=...)``): the
progress callback runs on the caller's thread as the native batch advances, False stops it
(:class:`ReplayCancelled`), and the results are the unwatched batch's to the bit. A sweep's
``extra`` points share its batch and give the rows separate sweeps give."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.cache.policy import Policy
from moescope.sim import ReplayCancelled, Routing, cost_model, sweep
from moescope.sim.replay import REPLAY_FIELDS, replay_many
from moescope.sim.sweep import RECORDED
from moescope.trace import read_trace
from moescope_testing.traces import synthetic_trace

RecordFn = Callable[..., Path]
N_LAYERS = 8
CONFIGS = [(p, s) for s in (6, 12, 24) for p in
           ("exact", "quality-first", "speed-first", "cache-prior", "psr", "substitute-all")]


@pytest.fixture(scope="module")
def routing(tmp_path_factory: pytest.TempPathFactory) -> Routing:
    path = synthetic_trace(tmp_path_factory.mktemp("progress") / "t.arrows", n_tokens=1200,
                           n_layers=N_LAYERS, n_expert=48, top_k=4, slots=12)
    return Routing.from_trace(read_trace(path))


def distinct(n: int) -> list[tuple[Policy, int]]:
    """``n`` copies of CONFIGS between which no batch shares a run (each copy's half-life
    differs, which a batch compares: equal configurations take one run's results), so the
    batch stays long enough (0.4 s here, idle) to be watched mid-run."""
    return [(Policy.preset(p).replace(half_life=64.0 + i), s)
            for i in range(n) for p, s in CONFIGS]


def batch_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "moescope-replay-batch"]


def test_progress_runs_on_the_callers_thread_from_zero_to_the_total(routing: Routing) -> None:
    calls: list[tuple[int, int]] = []
    threads: set[int] = set()

    def progress(done: int, total: int) -> bool:
        calls.append((done, total))
        threads.add(threading.get_ident())
        return True

    watched = replay_many(routing, CONFIGS, threads=2, progress=progress)
    total = len(CONFIGS) * N_LAYERS
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    done = [d for d, _ in calls]
    assert done == sorted(done) and len(set(done)) == len(done)
    assert {t for _, t in calls} == {total}
    assert threads == {threading.get_ident()}
    assert batch_threads() == []
    plain = replay_many(routing, CONFIGS, threads=2)
    for a, b in zip(watched, plain, strict=True):
        for name in REPLAY_FIELDS:
            assert np.array_equal(a.per_token[name], b.per_token[name]), name


def test_false_stops_the_batch_and_raises_cancelled(routing: Routing) -> None:
    calls: list[int] = []
    many = distinct(30)

    def progress(done: int, total: int) -> bool:
        calls.append(done)
        return done == 0

    with pytest.raises(ReplayCancelled):
        replay_many(routing, many, threads=2, progress=progress)
    assert calls[0] == 0 and len(calls) == 2  # nothing is reported after the False
    assert calls[1] < len(many) * N_LAYERS
    assert batch_threads() == []


def test_a_cancelled_batch_over_the_kept_plan_leaves_it_whole(routing: Routing) -> None:
    """The routing's plan (made at its first batch) serves a batch that is stopped midway,
    and the next batches over it replay to the bit as before."""
    before = replay_many(routing, CONFIGS, threads=2)
    plan = routing.plan
    assert plan is not None
    calls: list[int] = []

    def progress(done: int, total: int) -> bool:
        calls.append(done)
        return done == 0

    with pytest.raises(ReplayCancelled):
        replay_many(routing, distinct(30), threads=2, progress=progress)
    assert len(calls) == 2 and calls[1] < len(CONFIGS) * 30 * N_LAYERS
    assert routing.plan is plan and batch_threads() == []
    after = replay_many(routing, CONFIGS, threads=2)
    for a, b in zip(before, after, strict=True):
        assert a.per_token.tobytes() == b.per_token.tobytes()


def test_false_at_the_start_replays_nothing(routing: Routing) -> None:
    calls: list[int] = []
    with pytest.raises(ReplayCancelled):
        replay_many(routing, CONFIGS, progress=lambda d, t: calls.append(d) is not None)
    assert calls == [0]


def test_an_exception_in_progress_stops_the_batch_and_propagates(routing: Routing) -> None:
    def progress(done: int, total: int) -> bool:
        if done:
            raise KeyboardInterrupt
        return True

    with pytest.raises(KeyboardInterrupt):
        replay_many(routing, distinct(8), threads=2, progress=progress)
    assert batch_threads() == []
    # the library is still usable afterwards
    assert len(replay_many(routing, CONFIGS[:2])) == 2


def test_a_sweeps_extra_points_are_the_separate_sweeps_rows(record: RecordFn) -> None:
    trace = read_trace(record("qwen3moe", name="trace.arrows", tokens=20, answers=2,
                              switch_at=7))
    cost = cost_model("pcie4")
    policies, budgets = ["exact", "speed-first", "cache-prior"], ["25%", "50%"]
    extra = ((RECORDED, RECORDED), ("exact", RECORDED))
    seen: list[tuple[int, int]] = []
    together = sweep(trace, policies, budgets, cost, extra=extra,
                     progress=lambda d, t: seen.append((d, t)) is None)
    grid = sweep(trace, policies, budgets, cost)
    own = sweep(trace, [RECORDED, "exact"], [RECORDED], cost)
    assert together.rows == [*grid.rows, *own.rows]
    assert together.warnings == [*grid.warnings,
                                 *(w for w in own.warnings if w not in grid.warnings)]
    total = (len(policies) * len(budgets) + 2) * trace.header.model.n_layers
    assert seen[0] == (0, total) and seen[-1] == (total, total)


def test_a_ram_tier_sweep_reports_progress_and_stops(record: RecordFn) -> None:
    trace = read_trace(record("qwen3moe", name="trace.arrows", tokens=12))
    cost = cost_model("pcie4")
    n = trace.header.model.n_layers
    seen: list[int] = []
    result = sweep(trace, ["exact", "speed-first"], ["50%"], cost, ram_slots=6,
                   progress=lambda d, t: seen.append(d) is None)
    assert seen == [0, n, 2 * n] and len(result.rows) == 2
    with pytest.raises(ReplayCancelled):
        sweep(trace, ["exact", "speed-first"], ["50%"], cost, ram_slots=6,
              progress=lambda d, t: d == 0)
