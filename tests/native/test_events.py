"""Event rows and counters: one row per (step, layer, token), cumulative per-layer counters
equal to the sum of the rows, exact substituted-mass accounting, ring-buffer overflow."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from moescope.cache.native import (
    EVENT_DTYPE,
    EVENT_STEPS_HELD,
    FETCH,
    HIT,
    SUBSTITUTE,
    ExpertCache,
    RouteResult,
    event_ring_rows,
)
from moescope.cache.policy import Policy

MakeCache = Callable[..., ExpertCache]
RouteFn = Callable[..., RouteResult]


def run_workload(cache: ExpertCache, steps: int, seed: int = 0, batch: int = 1) -> None:
    """A deterministic random decode: every step routes every layer for ``batch`` tokens;
    low ids are popular, as real routers have favourite experts."""
    rng = np.random.default_rng(seed)
    n, k = cache.n_experts, cache.top_k
    prior = np.linspace(2.0, -2.0, n)
    for _ in range(steps):
        cache.begin_step()
        for layer in range(cache.n_layers):
            logits = rng.normal(size=(batch, n)) + prior
            probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
            ids = np.argsort(-probs, axis=1)[:, :k]
            weights = np.take_along_axis(probs, ids, axis=1)
            cache.route(layer, probs, ids, weights)


def test_one_row_per_step_layer_and_token(make_cache: MakeCache) -> None:
    cache = make_cache("quality-first", slots=6, top_k=2, n_layers=2)
    run_workload(cache, steps=3, batch=2)
    rows = cache.drain_events()
    assert rows.dtype == EVENT_DTYPE
    assert len(rows) == 3 * 2 * 2
    keys = [(int(r["step"]), int(r["layer"]), int(r["token"])) for r in rows]
    assert keys == [(s, la, t) for s in (1, 2, 3) for la in (0, 1) for t in (0, 1)]
    assert (rows["k"] == 2).all()


def test_a_row_records_the_decision(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache("exact")
    cache.set_expert_bytes(0, 1000)
    route(cache, [0, 1])
    # the rule alone: with fill_free a free slot would take the last row's miss
    cache.set_policy(Policy.preset("first-choice").replace(fill_free=False))
    cache.begin_step()
    route(cache, [9, 0], [0.6, 0.4])
    route(cache, [9, 10], [0.9, 0.1])
    rows = cache.drain_events()
    assert rows["action"][0, :2].tolist() == [FETCH, FETCH]
    assert rows["action"][1, :2].tolist() == [FETCH, HIT]
    last = rows[2]
    assert last["ids"][:2].tolist() == [9, 10]
    assert last["action"][:2].tolist() == [HIT, SUBSTITUTE]
    assert last["used_ids"][:2].tolist() == [9, 0]  # 0: most probable resident not in use
    assert last["weights"][:2].tolist() == pytest.approx([0.9, 0.1])
    assert last["substituted_mass"] == pytest.approx(0.1)
    assert rows["bytes_sync"].tolist() == [2000, 1000, 0]


def test_row_mass_is_the_sum_of_substituted_normalized_weights(make_cache: MakeCache) -> None:
    cache = make_cache("speed-first", slots=5, top_k=4)
    run_workload(cache, steps=20)
    rows = cache.drain_events()
    substituted = rows["action"] == SUBSTITUTE
    expected = np.where(substituted, rows["weights"], 0.0).sum(axis=1)
    assert rows["substituted_mass"] == pytest.approx(expected, abs=1e-6)
    assert substituted.any()


def test_counters_equal_the_sum_of_the_rows(make_cache: MakeCache) -> None:
    cache = make_cache("speed-first", slots=5, top_k=3, n_layers=2)
    for layer in (0, 1):
        cache.set_expert_bytes(layer, 10 * (layer + 1))
    run_workload(cache, steps=25)
    rows = cache.drain_events()
    for layer in (0, 1):
        mine = rows[rows["layer"] == layer]
        s = cache.layer_stats(layer)
        mass = 0.0
        for m in mine["substituted_mass"].tolist():
            mass += m  # the core adds float rows into a double, in order: exact
        assert s.substituted_mass == mass
        assert s.tokens == len(mine)
        assert s.selections == int(mine["k"].sum())
        assert s.hits == int(mine["n_hit"].sum())
        assert s.fetches == int(mine["n_fetch"].sum())
        assert s.substitutions == int(mine["n_substitute"].sum())
        assert s.admissions == int(mine["n_admit"].sum()) > 0
        assert s.evictions == int(mine["n_evict"].sum()) > 0
        assert s.bytes_sync == int(mine["bytes_sync"].sum())
        assert s.bytes_async == int(mine["bytes_async"].sum())
        assert s.hits + s.fetches + s.substitutions == s.selections


def test_ring_overflow_keeps_the_newest_rows_and_counts_the_lost(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = make_cache("exact")
    cache.set_event_capacity(3)
    for step in range(5):
        cache.begin_step()
        route(cache, [step, step + 1])
    rows = cache.drain_events()
    assert rows["step"].tolist() == [3, 4, 5]
    assert cache.events_dropped == 2
    assert cache.layer_stats(0).tokens == 5


def test_a_ring_sized_to_the_model_holds_its_steps_and_no_more(make_cache: MakeCache) -> None:
    """The engine's ring: EVENT_STEPS_HELD decode steps of every MoE layer survive undrained
    (teacher forcing drains once at the end); the next step drops its oldest rows."""
    cache = make_cache("quality-first", slots=6, top_k=2, n_layers=8)
    rows = event_ring_rows(cache.n_layers)
    assert rows == 8 * EVENT_STEPS_HELD and rows * EVENT_DTYPE.itemsize < 2**21
    cache.set_event_capacity(rows)
    run_workload(cache, steps=EVENT_STEPS_HELD)
    assert cache.events_dropped == 0
    run_workload(cache, steps=1, seed=1)
    assert cache.events_dropped == cache.n_layers
    assert len(cache.drain_events()) == rows
    assert event_ring_rows(2) == 1024, "a floor for tiny models"
    assert event_ring_rows(48) * EVENT_DTYPE.itemsize < 12e6, "not 57 MB as before"


def test_drain_removes_what_it_returns(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache("exact")
    for _ in range(4):
        route(cache, [0, 1])
    assert len(cache.drain_events(max_rows=3)) == 3
    assert len(cache.drain_events()) == 1
    assert len(cache.drain_events()) == 0


def test_capacity_zero_stops_recording_but_not_counting(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = make_cache("exact")
    cache.set_event_capacity(0)
    route(cache, [0, 1])
    assert len(cache.drain_events()) == 0
    assert cache.layer_stats(0).fetches == 2


def test_reset_stats_zeroes_counters_and_keeps_residency(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = make_cache("exact")
    route(cache, [0, 1])
    cache.reset_stats()
    assert cache.layer_stats(0).tokens == 0
    assert cache.resident(0) == {0, 1}
