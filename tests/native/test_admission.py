"""Background admission: per (layer, expert) lost gate mass accumulates under substitution;
at beta the expert is admitted by an ASYNC copy, resident at once, accumulator reset."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from moescope.cache.native import ExpertCache, RouteResult
from moescope.cache.policy import Eviction, MissRule, Policy

MakeCache = Callable[..., ExpertCache]
RouteFn = Callable[..., RouteResult]

ADMIT = Policy(miss_rule=MissRule.SUBSTITUTE_ALL, admission=True, beta=0.5)


def full_cache(
    make_cache: MakeCache, route: RouteFn, policy: Policy, slots: int = 4
) -> ExpertCache:
    """Experts 0..3 resident, then ``policy`` active."""
    cache = make_cache("exact", slots=slots)
    route(cache, [0, 1])
    route(cache, [2, 3])
    cache.set_policy(policy)
    cache.begin_step()
    cache.drain_events()
    return cache


def test_lost_mass_accumulates_below_beta(make_cache: MakeCache, route: RouteFn) -> None:
    cache = full_cache(make_cache, route, ADMIT)
    r = route(cache, [0, 9], [0.7, 0.3])
    assert len(r.plan) == 0
    assert cache.layer_lost_mass(0)[9] == pytest.approx(0.3)
    assert 9 not in cache.resident(0)


def test_reaching_beta_schedules_an_async_admission(make_cache: MakeCache, route: RouteFn) -> None:
    cache = full_cache(make_cache, route, ADMIT)
    route(cache, [0, 9], [0.7, 0.3])
    r = route(cache, [0, 9], [0.7, 0.3])  # 0.6 >= 0.5
    assert r.plan["expert"].tolist() == [9]
    assert r.plan["async"].tolist() == [1]
    assert r.out_ids[1] != 9  # this token still computed a substitute


def test_an_admitted_expert_is_resident_immediately(make_cache: MakeCache, route: RouteFn) -> None:
    cache = full_cache(make_cache, route, ADMIT)
    route(cache, [0, 9], [0.7, 0.3])
    r = route(cache, [0, 9], [0.7, 0.3])
    assert cache.layer_slots(0)[r.plan["slot"][0]] == 9
    nxt = route(cache, [0, 9], [0.7, 0.3])
    assert nxt.out_ids.tolist() == [0, 9]
    assert len(nxt.plan) == 0


def test_admission_resets_the_accumulator(make_cache: MakeCache, route: RouteFn) -> None:
    cache = full_cache(make_cache, route, ADMIT)
    route(cache, [0, 9], [0.7, 0.3])
    route(cache, [0, 9], [0.7, 0.3])
    assert cache.layer_lost_mass(0)[9] == 0.0


def test_beta_is_the_admission_threshold(make_cache: MakeCache, route: RouteFn) -> None:
    cache = full_cache(make_cache, route, ADMIT.replace(beta=0.25))
    r = route(cache, [0, 9], [0.7, 0.3])
    assert r.admissions["expert"].tolist() == [9]


def test_no_accumulation_without_admission(make_cache: MakeCache, route: RouteFn) -> None:
    cache = full_cache(make_cache, route, ADMIT.replace(admission=False))
    for _ in range(4):
        r = route(cache, [0, 9], [0.7, 0.3])
        assert len(r.plan) == 0
    assert cache.layer_lost_mass(0)[9] == 0.0


def test_admission_takes_a_free_slot_first(make_cache: MakeCache, route: RouteFn) -> None:
    # the rule alone (fill_free off): substitute-all substitutes even with free slots
    cache = full_cache(make_cache, route, ADMIT.replace(fill_free=False), slots=6)
    route(cache, [0, 9], [0.5, 0.5])
    row = cache.drain_events()[0]
    assert row["n_admit"] == 1 and row["admitted"][0] == 9
    assert row["n_evict"] == 0
    assert cache.layer_experts(0)[9] == 4


def test_admission_evicts_by_the_rule_but_never_an_expert_the_call_uses(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = full_cache(make_cache, route, ADMIT.replace(beta=0.25))
    r = route(cache, [0, 9], [0.7, 0.3])  # uses 0 and substitute 1; LRU of the rest: 2
    assert r.out_ids.tolist() == [0, 1]
    row = cache.drain_events()[0]
    assert row["evicted"][: row["n_evict"]].tolist() == [2]
    assert cache.resident(0) == {0, 1, 3, 9}


def test_quality_first_admits_substituted_experts(make_cache: MakeCache, route: RouteFn) -> None:
    cache = full_cache(make_cache, route, Policy.preset("quality-first"))
    assert cache.policy.eviction == Eviction.FREQUENCY
    for _ in range(5):
        route(cache, [0, 9], [0.9, 0.1])  # 0.1 < 0.15: substituted, 0.1 lost each time
    assert 9 in cache.resident(0)
    assert cache.layer_stats(0).admissions == 1
