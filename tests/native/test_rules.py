"""Miss rules and substitution, one behaviour per test (paper 1's definitions).

Caches have 16 experts, top-2 (top-3 where said) and 4 slots unless a test says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from moescope.cache.native import ExpertCache, RouteResult
from moescope.cache.policy import MissRule, Policy, SubstituteWeight

MakeCache = Callable[..., ExpertCache]
RouteFn = Callable[..., RouteResult]


def fill(cache: ExpertCache, route: RouteFn, experts: list[int]) -> None:
    """Make ``experts`` resident by routing them, k at a time, under fetch-every-miss."""
    k = cache.top_k
    for i in range(0, len(experts), k):
        route(cache, experts[i : i + k])


def filled(make_cache: MakeCache, route: RouteFn, policy: Policy | str, **kw: int) -> ExpertCache:
    """A cache whose slots hold experts 0..slots-1, then switched to ``policy``."""
    cache = make_cache("exact", **kw)
    fill(cache, route, list(range(cache.slots)))
    cache.set_policy(policy)
    cache.begin_step()
    return cache


def test_a_resident_expert_is_a_hit(make_cache: MakeCache, route: RouteFn) -> None:
    cache = filled(make_cache, route, "exact")
    r = route(cache, [2, 0])
    assert r.out_ids.tolist() == [2, 0]
    assert len(r.plan) == 0
    assert cache.layer_experts(0)[r.out_ids].tolist() == r.out_slots.tolist()


def test_fetch_all_fetches_every_miss_synchronously(make_cache: MakeCache, route: RouteFn) -> None:
    cache = filled(make_cache, route, "exact")
    r = route(cache, [9, 10], [0.9, 0.1])
    assert r.out_ids.tolist() == [9, 10]
    assert r.plan["expert"].tolist() == [9, 10]
    assert r.plan["async"].tolist() == [0, 0]
    assert cache.layer_slots(0)[r.out_slots].tolist() == [9, 10]


def test_threshold_never_substitutes_the_first_choice(
    make_cache: MakeCache, route: RouteFn
) -> None:
    # theta = 1 leaves "first choice" as the only reason to fetch
    cache = filled(make_cache, route, Policy(miss_rule=MissRule.THRESHOLD, theta=1.0))
    r = route(cache, [9, 10], [0.6, 0.4])
    assert r.out_ids[0] == 9
    assert r.fetches["expert"].tolist() == [9]
    assert r.out_ids[1] != 10


def test_threshold_fetches_a_miss_whose_normalized_weight_reaches_theta(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = filled(make_cache, route, "threshold", top_k=3, slots=6)
    # raw 0.1 < 0.15 but normalized 0.1 / 0.32 = 0.31 >= 0.15; 0.02 / 0.32 = 0.06 < 0.15
    r = route(cache, [9, 10, 11], [0.2, 0.1, 0.02])
    assert r.fetches["expert"].tolist() == [9, 10]
    assert r.out_ids[:2].tolist() == [9, 10]
    assert r.out_ids[2] != 11


def test_threshold_is_inclusive_at_theta(make_cache: MakeCache, route: RouteFn) -> None:
    policy = Policy(miss_rule=MissRule.THRESHOLD, theta=0.25)
    cache = filled(make_cache, route, policy, top_k=3, slots=6)
    r = route(cache, [9, 10, 11], [0.5, 0.25, 0.25])
    assert r.fetches["expert"].tolist() == [9, 10, 11]


def test_first_choice_fetches_only_a_missing_first_choice(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = filled(make_cache, route, "first-choice", top_k=3, slots=6)
    r = route(cache, [9, 10, 11], [0.4, 0.35, 0.25])
    assert r.fetches["expert"].tolist() == [9]
    assert 10 not in r.out_ids and 11 not in r.out_ids


def test_substitute_all_substitutes_even_the_first_choice(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = filled(make_cache, route, "substitute-all")
    r = route(cache, [9, 10], [0.9, 0.1])
    assert len(r.plan) == 0
    assert set(r.out_ids.tolist()) <= {0, 1, 2, 3}


def test_fetch_all_never_substitutes(make_cache: MakeCache, route: RouteFn) -> None:
    cache = filled(make_cache, route, "exact")
    for ids in ([9, 10], [11, 0], [12, 13], [1, 14]):
        assert route(cache, ids).out_ids.tolist() == ids
    assert cache.layer_stats(0).substitutions == 0


def test_substitute_is_the_most_probable_resident_expert(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = filled(make_cache, route, "substitute-all")
    r = route(cache, [0, 9], [0.7, 0.3], probs={1: 0.01, 2: 0.2, 3: 0.05})
    assert r.out_ids.tolist() == [0, 2]


def test_substitute_is_not_an_expert_the_token_already_computes(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = filled(make_cache, route, "first-choice", top_k=3, slots=6)
    # 0 is resident and the most probable, but the token already uses it as a hit
    r = route(cache, [9, 0, 10], [0.5, 0.3, 0.2], probs={0: 0.3, 1: 0.01, 2: 0.02})
    assert r.out_ids[0] == 9 and r.out_ids[1] == 0
    assert r.out_ids[2] == 2


def test_two_misses_of_a_token_get_different_substitutes(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = filled(make_cache, route, "substitute-all", top_k=3, slots=6)
    r = route(cache, [9, 10, 11], [0.5, 0.3, 0.2])
    assert r.out_ids.tolist() == [0, 1, 2]  # by decreasing probability: 0, 1, 2


def test_substitute_takes_the_missing_experts_gate_weight(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = filled(make_cache, route, "substitute-all")
    r = route(cache, [0, 9], [0.7, 0.3], probs={1: 0.05})
    assert r.out_ids[1] == 1
    assert r.weights.tolist() == pytest.approx([0.7, 0.3])


def test_subw_own_gives_the_substitute_its_own_probability(
    make_cache: MakeCache, route: RouteFn
) -> None:
    policy = Policy(miss_rule=MissRule.SUBSTITUTE_ALL, substitute_weight=SubstituteWeight.OWN)
    cache = filled(make_cache, route, policy)
    # the router scaled expert 9's probability 0.15 to weight 0.3 (x2); substitute 1 has 0.05
    r = route(cache, [0, 9], [0.7, 0.3], probs={9: 0.15, 1: 0.05})
    assert r.out_ids[1] == 1
    assert r.weights[1] == pytest.approx(0.1)


def test_with_no_resident_expert_left_a_miss_is_fetched(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = make_cache("substitute-all", slots=4)
    r = route(cache, [5, 6], [0.5, 0.5])  # empty cache: nothing to substitute
    assert r.out_ids.tolist() == [5, 6]
    assert r.fetches["expert"].tolist() == [5, 6]
    assert cache.layer_stats(0).substitutions == 0


def test_the_last_unused_resident_is_still_a_substitute(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = make_cache("exact", slots=4, top_k=3)
    route(cache, [0, 1, 2])
    cache.set_policy(Policy.preset("substitute-all").replace(fill_free=False))  # a slot is free
    cache.begin_step()
    r = route(cache, [9, 0, 1], [0.4, 0.3, 0.3], probs={2: 0.0})
    assert r.out_ids.tolist() == [2, 0, 1]
    assert len(r.plan) == 0


def test_first_choice_is_fetched_even_when_a_substitute_exists(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = filled(make_cache, route, "speed-first")
    r = route(cache, [9, 0], [0.05, 0.95])
    assert r.out_ids[0] == 9
    assert r.fetches["expert"].tolist() == [9]


def test_a_batch_decides_each_token_in_order(make_cache: MakeCache) -> None:
    cache = make_cache("exact", slots=4)
    probs = np.full((2, 16), 0.01, dtype=np.float32)
    r = cache.route(0, probs, np.array([[3, 4], [4, 5]]), np.full((2, 2), 0.5))
    assert r.out_ids.tolist() == [[3, 4], [4, 5]]
    assert r.plan["expert"].tolist() == [3, 4, 5]  # 4 is a hit for the second token
    assert r.out_slots.tolist() == [[0, 1], [1, 2]]
