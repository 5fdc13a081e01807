"""Live resize: capacity changes apply at once; shrinking evicts by the eviction rule and
compacts residents into slots [0, S); growing adds free slots."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from moescope.cache.native import ExpertCache, RouteResult
from moescope.cache.policy import Eviction, Policy

MakeCache = Callable[..., ExpertCache]
RouteFn = Callable[..., RouteResult]


def six_resident(make_cache: MakeCache, route: RouteFn, policy: Policy | str) -> ExpertCache:
    cache = make_cache(policy, slots=6, n_layers=2)
    for layer in (0, 1):
        route(cache, [0, 1], layer=layer)
        route(cache, [2, 3], layer=layer)
        route(cache, [4, 5], layer=layer)
    return cache


def test_shrinking_evicts_least_recently_used(make_cache: MakeCache, route: RouteFn) -> None:
    cache = six_resident(make_cache, route, "exact")
    route(cache, [0, 1])
    cache.set_slots(4)
    assert cache.resident(0) == {0, 1, 4, 5}
    assert cache.layer_stats(0).resize_evictions == 2


def test_shrinking_compacts_residents_into_the_first_slots(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = six_resident(make_cache, route, "exact")
    route(cache, [0, 1])
    cache.set_slots(4)
    assert cache.slots == 4
    assert cache.layer_slots(0).tolist() == [0, 1, 4, 5]  # 0, 1 stay; 4, 5 move down
    experts = cache.layer_experts(0)
    assert all(0 <= experts[e] < 4 for e in (0, 1, 4, 5))


def test_shrinking_evicts_by_frequency_under_frequency_eviction(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = six_resident(make_cache, route, Policy(eviction=Eviction.FREQUENCY, half_life=1e3))
    for _ in range(2):
        route(cache, [2, 3])
        route(cache, [4, 5])
    route(cache, [0, 1])  # most recent but least frequent
    cache.set_slots(4)
    assert cache.resident(0) == {2, 3, 4, 5}
    assert cache.layer_slots(0).tolist() == [4, 5, 2, 3]


def test_every_layer_is_resized(make_cache: MakeCache, route: RouteFn) -> None:
    cache = six_resident(make_cache, route, "exact")
    cache.set_slots(2)
    assert len(cache.resident(0)) == 2 and len(cache.resident(1)) == 2
    assert cache.layer_slots(1).shape == (2,)


def test_growing_adds_free_slots_at_the_end(make_cache: MakeCache, route: RouteFn) -> None:
    cache = six_resident(make_cache, route, "exact")
    cache.set_slots(8)
    assert cache.layer_slots(0).tolist() == [0, 1, 2, 3, 4, 5, -1, -1]
    r = route(cache, [9, 10])
    assert r.plan["slot"].tolist() == [6, 7]  # free slots before any eviction


def test_resize_applies_without_a_new_step(make_cache: MakeCache, route: RouteFn) -> None:
    cache = six_resident(make_cache, route, "exact")
    step = cache.step
    cache.set_slots(2)
    r = route(cache, [9, 10])
    assert cache.step == step
    assert sorted(r.plan["slot"].tolist()) == [0, 1]
    assert cache.resident(0) == {9, 10}


@pytest.mark.parametrize("slots", [1, 17])
def test_resize_rejects_fewer_than_top_k_or_more_than_experts(
    make_cache: MakeCache, slots: int
) -> None:
    cache = make_cache("exact", slots=4)
    with pytest.raises(ValueError):
        cache.set_slots(slots)
    assert cache.slots == 4
