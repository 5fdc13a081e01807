"""Eviction: LRU and frequency (decayed counts, half-life), deterministic tie-breaks, and
the rule that an expert used by the current route call is never evicted."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from moescope.cache.native import ExpertCache, RouteResult
from moescope.cache.policy import Eviction, MissRule, Policy

MakeCache = Callable[..., ExpertCache]
RouteFn = Callable[..., RouteResult]


def frequency(half_life: float) -> Policy:
    return Policy(eviction=Eviction.FREQUENCY, half_life=half_life)


def evicted(cache: ExpertCache) -> list[int]:
    """Experts evicted by the rows not yet drained, in order."""
    rows = cache.drain_events()
    return [int(e) for row in rows for e in row["evicted"][: row["n_evict"]]]


def test_lru_evicts_the_least_recently_used(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache("exact")
    route(cache, [0, 1])
    route(cache, [2, 3])
    route(cache, [0, 1])
    cache.drain_events()
    route(cache, [4, 5])
    assert evicted(cache) == [2, 3]
    assert cache.resident(0) == {0, 1, 4, 5}


def test_lru_reuses_the_victims_slot(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache("exact")
    route(cache, [0, 1])
    route(cache, [2, 3])
    route(cache, [0, 1])
    r = route(cache, [4, 5])
    assert r.plan["slot"].tolist() == [2, 3]


def test_lru_counts_use_as_a_substitute(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache("exact")
    route(cache, [0, 1])
    route(cache, [2, 3])
    cache.set_policy("substitute-all")
    cache.begin_step()
    r = route(cache, [0, 9], probs={2: 0.5})  # 2 computes for 9: now recently used
    assert r.out_ids.tolist() == [0, 2]
    cache.set_policy("exact")
    cache.begin_step()
    cache.drain_events()
    route(cache, [10, 11])
    assert evicted(cache) == [1, 3]


def test_frequency_keeps_the_often_selected_expert(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache(frequency(half_life=1000.0))
    for _ in range(4):
        cache.begin_step()
        route(cache, [0, 1])
    while cache.step < 20:
        cache.begin_step()
    route(cache, [2, 3])
    cache.begin_step()
    cache.drain_events()
    route(cache, [4, 5])
    assert evicted(cache) == [2, 3]  # LRU would have evicted 0 and 1


def test_frequency_forgets_with_the_half_life(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache(frequency(half_life=1.0))
    for _ in range(4):
        cache.begin_step()
        route(cache, [0, 1])
    while cache.step < 20:
        cache.begin_step()
    route(cache, [2, 3])  # 4 selections 16 half-lives ago weigh less than 1 now
    cache.begin_step()
    cache.drain_events()
    route(cache, [4, 5])
    assert evicted(cache) == [0, 1]


def test_frequency_counts_selections_of_missing_experts(
    make_cache: MakeCache, route: RouteFn
) -> None:
    exact = Policy(eviction=Eviction.FREQUENCY, half_life=1000.0)
    cache = make_cache(exact)
    route(cache, [0, 1])
    route(cache, [2, 3])
    cache.set_policy(exact.replace(miss_rule=MissRule.SUBSTITUTE_ALL))
    cache.begin_step()
    for _ in range(3):
        r = route(cache, [0, 9], [0.9, 0.1], probs={1: 0.5})  # 9 wanted, 1 computes
        assert r.out_ids.tolist() == [0, 1]
    cache.set_policy(exact)
    cache.begin_step()
    route(cache, [9, 0])  # 9 fetched at last
    route(cache, [3, 1])
    cache.drain_events()
    route(cache, [10, 11])
    # counts: 0 -> 5, 9 -> 4 (three of them while missing), 1 -> 2, 3 -> 2
    assert evicted(cache) == [3, 1]
    assert 9 in cache.resident(0)


def test_equal_frequencies_fall_back_to_lru(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache(frequency(half_life=8.0))
    cache.begin_step()
    route(cache, [1, 0])
    route(cache, [3, 2])
    cache.drain_events()
    route(cache, [4, 5])  # all counts equal at the same step: least recent first
    assert evicted(cache) == [1, 0]


def test_a_hit_of_another_token_in_the_batch_is_never_evicted(make_cache: MakeCache) -> None:
    cache = make_cache("exact")
    probs = np.full((1, 16), 0.01, dtype=np.float32)
    for ids in ([0, 1], [2, 3]):
        cache.route(0, probs, np.array(ids), np.array([0.5, 0.5]))
    cache.drain_events()
    batch = np.array([[8, 9], [0, 1]])  # LRU alone would evict 0 and 1 for 8 and 9
    r = cache.route(0, np.repeat(probs, 2, axis=0), batch, np.full((2, 2), 0.5))
    assert r.out_ids.tolist() == batch.tolist()
    assert evicted(cache) == [2, 3]


def test_a_substitute_is_never_evicted_by_the_same_tokens_fetch(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = make_cache("exact")
    route(cache, [0, 1])
    route(cache, [2, 3])
    cache.set_policy("first-choice")
    cache.begin_step()
    cache.drain_events()
    r = route(cache, [9, 10])  # 10 -> substitute 0 (most probable); 0 is also LRU
    assert r.out_ids.tolist() == [9, 0]
    assert evicted(cache) == [1]
