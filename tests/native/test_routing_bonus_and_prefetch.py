"""Paper 2 in the core: the Cache-Prior routing bonus and PSR prefetch.

The routing bonus must be exactly "top-k of p + bonus * S * resident", S the probability of
the router's selection (checked against a numpy reference on random rows), so a bonus means
the same gate weight whatever the number of experts; a bonus of 0 must change nothing,
and prefetch must put the predicted experts in the logical cache as async copies without
ever changing what an exact policy computes. Prefetch accuracy (hits / prefetches) is
counted per layer.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from moescope.cache.native import FETCH, HIT, SUBSTITUTE, ExpertCache, RouteResult
from moescope.cache.policy import PREFETCH_TOP_K, MissRule, Policy

MakeCache = Callable[..., ExpertCache]
RouteFn = Callable[..., RouteResult]


def bonus_policy(bonus: float, prefetch: int = 0, fill_free: bool = False) -> Policy:
    """The routing bonus alone by default: these tests steer with slots still free."""
    return Policy(miss_rule=MissRule.ROUTING_BONUS, bonus=bonus, prefetch=prefetch,
                  fill_free=fill_free)


def softmax_row(rng: np.random.Generator, n: int) -> npt.NDArray[np.float32]:
    x = rng.normal(size=n) * 2.0
    e = np.exp(x - x.max())
    return (e / e.sum()).astype(np.float32)


def fill(cache: ExpertCache, layer: int, experts: list[int]) -> None:
    """Make ``experts`` resident with exact fetches (one token each, k of them at a time)."""
    policy = cache.policy
    cache.set_policy("exact")
    cache.begin_step()
    k = cache.top_k
    for i in range(0, len(experts) - len(experts) % k, k):
        chunk = experts[i:i + k]
        probs = np.full(cache.n_experts, 1e-4, dtype=np.float32)
        cache.route(layer, probs, np.array(chunk), np.full(k, 1.0 / k))
    cache.set_policy(policy)
    cache.begin_step()


@settings(max_examples=80, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), bonus=st.sampled_from([0.01, 0.05, 0.2, 1.0]))
def test_routing_bonus_is_the_top_k_of_biased_scores(seed: int, bonus: float) -> None:
    rng = np.random.default_rng(seed)
    n, k, slots = 24, 4, 12
    cache = ExpertCache(1, n, k, slots, bonus_policy(bonus))
    try:
        resident = sorted(rng.choice(n, size=slots, replace=False).tolist())
        fill(cache, 0, resident)
        assert cache.resident(0) == set(resident)
        probs = softmax_row(rng, n)
        ids = np.argsort(-probs, kind="stable")[:k].astype(np.int32)
        weights = probs[ids] / probs[ids].sum()
        r = cache.route(0, probs, ids, weights)
        biased = probs + bonus * probs[ids].sum() * np.isin(np.arange(n), resident)
        expected = set(np.argsort(-biased, kind="stable")[:k].tolist())
        assert set(r.out_ids.tolist()) == expected
        # every expert actually computed is resident now; the steered ones were resident
        assert set(r.out_ids.tolist()) <= cache.resident(0)
        ev = cache.drain_events()[-1]
        steered = ev["action"][:k] == SUBSTITUTE
        assert set(ev["used_ids"][:k][steered].tolist()) <= set(resident)
        assert ev["substituted_mass"] == pytest.approx(float(ev["weights"][:k][steered].sum()))
    finally:
        cache.close()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), share=st.sampled_from([1.0, 0.5, 0.125]))
def test_routing_bonus_means_the_same_whatever_the_probabilities_scale(
        seed: int, share: float) -> None:
    """A model with 8x more experts spreads the router's probability over them: the same
    routing preferences arrive as probabilities several times smaller. The bonus is in
    gate-weight units, so the decisions must not change (in probability units a fixed bonus
    would steer far more at the small scale)."""
    rng = np.random.default_rng(seed)
    n, k, slots = 32, 4, 16
    resident = sorted(rng.choice(n, size=slots, replace=False).tolist())
    probs = softmax_row(rng, n)
    ids = np.argsort(-probs, kind="stable")[:k].astype(np.int32)
    weights = probs[ids] / probs[ids].sum()
    decided = []
    for scale in (1.0, share):
        cache = ExpertCache(1, n, k, slots, bonus_policy(0.1))
        try:
            fill(cache, 0, resident)
            r = cache.route(0, (probs * scale).astype(np.float32), ids, weights)
            decided.append((r.out_ids.tolist(), cache.drain_events()[-1]["action"][:k].tolist()))
        finally:
            cache.close()
    assert decided[0] == decided[1]


def test_zero_bonus_changes_nothing(make_cache: MakeCache) -> None:
    rng = np.random.default_rng(7)
    cache = make_cache(bonus_policy(0.0), slots=6, top_k=3, n_experts=16)
    for step in range(40):
        cache.begin_step()
        probs = softmax_row(rng, 16)
        ids = np.argsort(-probs, kind="stable")[:3].astype(np.int32)
        r = cache.route(0, probs, ids, probs[ids])
        assert r.out_ids.tolist() == ids.tolist(), step
    assert cache.layer_stats(0).substitutions == 0


def test_bonus_steers_the_weakest_miss_first(make_cache: MakeCache) -> None:
    cache = make_cache(bonus_policy(0.1), slots=4, top_k=2, n_experts=16)
    fill(cache, 0, [10, 11])
    probs = np.full(16, 0.001, dtype=np.float32)
    probs[[0, 1, 10, 11]] = [0.40, 0.20, 0.15, 0.05]
    r = cache.route(0, probs, np.array([0, 1]), np.array([0.4, 0.2]))
    # the bonus is 0.1 of the selection's 0.6: 0.06 in probability
    # 1 (0.20) < 10 (0.15 + 0.06): steered; 0 (0.40) > 11 (0.05 + 0.06): fetched
    assert r.out_ids.tolist() == [0, 10]
    ev = cache.drain_events()[-1]
    assert ev["action"][:2].tolist() == [FETCH, SUBSTITUTE]


def test_cache_prior_substitute_computes_with_its_own_weight(make_cache: MakeCache) -> None:
    # two slots are free: the rule alone (fill_free off) steers
    cache = make_cache(Policy.preset("cache-prior").replace(fill_free=False), slots=4, top_k=2,
                       n_experts=16)
    fill(cache, 0, [10, 11])
    probs = np.full(16, 0.001, dtype=np.float32)
    probs[[0, 1, 10]] = [0.5, 0.2, 0.19]
    r = cache.route(0, probs, np.array([0, 1]), np.array([0.5, 0.2]))
    assert r.out_ids.tolist() == [0, 10]
    assert r.weights.tolist() == pytest.approx([0.5, 0.19])


def test_prefetch_brings_the_predicted_top_k_in_as_async_copies(make_cache: MakeCache) -> None:
    cache = make_cache(bonus_policy(0.05, prefetch=PREFETCH_TOP_K), slots=6, top_k=2,
                       n_layers=2, n_experts=16)
    cache.set_expert_bytes(1, 1000)
    fill(cache, 1, [3, 4, 5, 6, 7, 8])
    scores = np.zeros(16, dtype=np.float32)
    scores[[12, 4, 9]] = [3.0, 2.0, 1.0]  # top-2: 12 (missing), 4 (resident)
    plan = cache.prefetch(1, scores)
    assert plan["async"].tolist() == [1]
    assert (plan["layer"][0], plan["expert"][0]) == (1, 12)
    assert cache.resident(1) >= {12, 4}
    assert cache.layer_experts(1)[12] == plan["slot"][0]
    s = cache.layer_stats(1)
    assert (s.prefetches, s.bytes_async, s.evictions) == (1, 1000, 1)
    # a route that uses the prefetched expert counts a prefetch hit, once
    probs = np.full(16, 0.01, dtype=np.float32)
    probs[[12, 4]] = [0.6, 0.3]
    cache.begin_step()
    r = cache.route(1, probs, np.array([12, 4]), np.array([0.6, 0.3]))
    assert cache.drain_events()[-1]["action"][:2].tolist() == [HIT, HIT]
    assert r.plan.size == 0
    cache.begin_step()
    cache.route(1, probs, np.array([12, 4]), np.array([0.6, 0.3]))
    assert cache.layer_stats(1).prefetch_hits == 1


def test_prefetch_never_evicts_a_prediction_and_respects_the_count(make_cache: MakeCache) -> None:
    cache = make_cache(Policy(prefetch=3), slots=3, top_k=2, n_experts=16)
    fill(cache, 0, [0, 1])
    scores = np.arange(16, dtype=np.float32)  # predicted: 15, 14, 13
    plan = cache.prefetch(0, scores[None, :])
    assert sorted(plan["expert"].tolist()) == [13, 14, 15]
    assert cache.resident(0) == {13, 14, 15}
    two = np.stack([scores, scores[::-1].copy()])  # token 2 predicts 0, 1, 2
    plan = cache.prefetch(0, two)
    # token 1's predictions are pinned: token 2 finds no slot and stops
    assert plan.size == 0 and cache.resident(0) == {13, 14, 15}


def test_prefetch_off_nan_scores_and_bad_arguments(make_cache: MakeCache) -> None:
    off = make_cache("quality-first", slots=4, top_k=2)
    assert off.prefetch(0, np.arange(16, dtype=np.float32)).size == 0
    assert off.resident(0) == set()
    on = make_cache(Policy(prefetch=2), slots=4, top_k=2)
    scores = np.full(16, np.nan, dtype=np.float32)
    scores[[5, 9]] = [0.1, 0.2]
    assert sorted(on.prefetch(0, scores)["expert"].tolist()) == [5, 9]
    with pytest.raises(ValueError):
        on.prefetch(3, scores)
    with pytest.raises(ValueError):
        Policy(prefetch=-2)
    with pytest.raises(ValueError):
        Policy(bonus=-0.1)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), prefetch=st.sampled_from([1, 2, PREFETCH_TOP_K]))
def test_prefetch_keeps_fetch_every_miss_exact_and_is_deterministic(seed: int,
                                                                    prefetch: int) -> None:
    def run() -> list[tuple[list[int], list[int], list[tuple[int, int, int, int]]]]:
        rng = np.random.default_rng(seed)
        n, k, layers = 16, 3, 3
        cache = ExpertCache(layers, n, k, 5, Policy(prefetch=prefetch))
        out = []
        try:
            for _ in range(25):
                cache.begin_step()
                for layer in range(layers):
                    probs = softmax_row(rng, n)
                    ids = np.argsort(-probs, kind="stable")[:k].astype(np.int32)
                    r = cache.route(layer, probs, ids, probs[ids])
                    assert r.out_ids.tolist() == ids.tolist()  # exact: never substituted
                    assert len(set(r.out_slots.tolist())) == k
                    plan = cache.prefetch((layer + 1) % layers, rng.normal(size=n))
                    out.append((r.out_ids.tolist(), r.out_slots.tolist(),
                                [tuple(int(v) for v in c) for c in plan.tolist()]))
        finally:
            cache.close()
        return out

    assert run() == run()
