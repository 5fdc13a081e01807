"""Properties of the core over random workloads (hypothesis): capacity, exactness of
fetch-every-miss, the first choice never substituted, mass accounting, consistency of the
returned slots, no duplicate expert in a token, and determinism.

A scenario is a random cache shape and policy plus a sequence of operations (route a batch,
begin a step, resize, switch policy); ``replay`` runs it and records what every route call
saw and decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from hypothesis import given, settings
from hypothesis import strategies as st

from moescope.cache.native import SUBSTITUTE, ExpertCache, NoSlotError
from moescope.cache.policy import Eviction, MissRule, Policy, SubstituteWeight

SETTINGS = settings(max_examples=60, deadline=None)


@dataclass(frozen=True)
class Scenario:
    n_layers: int
    n_experts: int
    top_k: int
    slots: int
    policy: Policy
    ops: tuple[tuple[Any, ...], ...]
    seed: int


@dataclass
class Call:
    """One successful route call: inputs, decision, and the cache right after it."""

    policy: Policy
    ids: npt.NDArray[np.int32]
    weights: npt.NDArray[np.float32]
    out_ids: npt.NDArray[np.int32]
    out_slots: npt.NDArray[np.int32]
    out_weights: npt.NDArray[np.float32]
    plan: npt.NDArray[Any]
    expert_of_slot: npt.NDArray[np.int32]
    slot_of_expert: npt.NDArray[np.int32]
    slots: int


@dataclass
class Trace:
    calls: list[Call] = field(default_factory=list)
    events: npt.NDArray[Any] | None = None
    mass: list[float] = field(default_factory=list)  # per layer, from the counters
    no_slot_unchanged: list[bool] = field(default_factory=list)


policies = st.builds(
    Policy,
    miss_rule=st.sampled_from(list(MissRule)),
    theta=st.floats(0.0, 1.0),
    eviction=st.sampled_from(list(Eviction)),
    half_life=st.floats(0.5, 200.0),
    admission=st.booleans(),
    beta=st.floats(0.05, 2.0),
    substitute_weight=st.sampled_from(list(SubstituteWeight)),
    bonus=st.sampled_from([0.0, 0.05, 0.3]),
)


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n_experts = draw(st.integers(3, 12))
    top_k = draw(st.integers(1, min(4, n_experts)))
    n_layers = draw(st.integers(1, 2))
    route = st.tuples(
        st.just("route"), st.integers(0, n_layers - 1), st.integers(1, 3), st.integers(1, 8)
    )
    op = st.one_of(
        route,
        route,
        route,
        st.tuples(st.just("step")),
        st.tuples(st.just("slots"), st.integers(top_k, n_experts)),
        st.tuples(st.just("policy"), policies),
    )
    return Scenario(
        n_layers=n_layers,
        n_experts=n_experts,
        top_k=top_k,
        slots=draw(st.integers(top_k, n_experts)),
        policy=draw(policies),
        ops=tuple(draw(st.lists(op, min_size=5, max_size=40))),
        seed=draw(st.integers(0, 2**32 - 1)),
    )


def router(rng: np.random.Generator, n_tokens: int, n: int, k: int) -> tuple[Any, Any, Any]:
    """Peaked router probabilities, their top-k in router order, unnormalized weights."""
    probs = rng.dirichlet(np.full(n, 0.3), size=n_tokens).astype(np.float32)
    ids = np.argsort(-probs, axis=1, kind="stable")[:, :k].astype(np.int32)
    return probs, ids, np.take_along_axis(probs, ids, axis=1)


def replay(s: Scenario) -> Trace:
    rng = np.random.default_rng(s.seed)
    trace = Trace()
    with ExpertCache(s.n_layers, s.n_experts, s.top_k, s.slots, s.policy) as cache:
        for op in s.ops:
            if op[0] == "step":
                cache.begin_step()
            elif op[0] == "slots":
                cache.set_slots(op[1])
            elif op[0] == "policy":
                cache.set_policy(op[1])
            else:
                _, layer, n_tokens, repeats = op
                for i in range(repeats):
                    if i > 0:
                        cache.begin_step()
                    route_once(cache, rng, layer, n_tokens, trace)
        trace.events = cache.drain_events()
        trace.mass = [cache.layer_stats(la).substituted_mass for la in range(s.n_layers)]
    return trace


def route_once(
    cache: ExpertCache, rng: np.random.Generator, layer: int, n_tokens: int, trace: Trace
) -> None:
    """One route call for ``layer`` with fresh router output, recorded into ``trace``."""
    probs, ids, weights = router(rng, n_tokens, cache.n_experts, cache.top_k)
    before = (cache.layer_slots(layer).tolist(), cache.layer_stats(layer))
    try:
        r = cache.route(layer, probs, ids, weights)
    except NoSlotError:
        after = (cache.layer_slots(layer).tolist(), cache.layer_stats(layer))
        trace.no_slot_unchanged.append(before == after)
        return
    trace.calls.append(
        Call(
            policy=cache.policy,
            ids=ids,
            weights=weights,
            out_ids=r.out_ids,
            out_slots=r.out_slots,
            out_weights=r.weights,
            plan=r.plan,
            expert_of_slot=cache.layer_slots(layer),
            slot_of_expert=cache.layer_experts(layer),
            slots=cache.slots,
        )
    )


@SETTINGS
@given(scenarios())
def test_never_more_resident_experts_than_slots(s: Scenario) -> None:
    for call in replay(s).calls:
        resident = np.flatnonzero(call.slot_of_expert >= 0)
        assert len(resident) <= call.slots == len(call.expert_of_slot)
        assert (call.expert_of_slot[call.slot_of_expert[resident]] == resident).all()


@SETTINGS
@given(scenarios())
def test_out_slots_hold_out_ids(s: Scenario) -> None:
    for call in replay(s).calls:
        assert (call.expert_of_slot[call.out_slots] == call.out_ids).all()


@SETTINGS
@given(scenarios())
def test_no_expert_twice_in_a_tokens_out_ids(s: Scenario) -> None:
    for call in replay(s).calls:
        for row in call.out_ids:
            assert len(set(row.tolist())) == len(row)


@SETTINGS
@given(scenarios())
def test_fetch_all_never_substitutes(s: Scenario) -> None:
    for call in replay(s).calls:
        if call.policy.miss_rule == MissRule.FETCH_ALL:
            assert (call.out_ids == call.ids).all()
            assert (call.out_weights == call.weights).all()


@SETTINGS
@given(scenarios())
def test_first_choice_never_substituted_by_paper_1_rules(s: Scenario) -> None:
    # substitute-all replaces any miss; the routing bonus (paper 2) may route a resident
    # expert above a first choice that is barely more probable
    for call in replay(s).calls:
        if call.policy.miss_rule not in (MissRule.SUBSTITUTE_ALL, MissRule.ROUTING_BONUS):
            assert (call.out_ids[:, 0] == call.ids[:, 0]).all()


@SETTINGS
@given(scenarios())
def test_threshold_never_substitutes_a_weight_at_or_above_theta(s: Scenario) -> None:
    for call in replay(s).calls:
        if call.policy.miss_rule == MissRule.THRESHOLD:
            norm = call.weights / call.weights.sum(axis=1, keepdims=True)
            heavy = norm >= call.policy.theta + 1e-6
            assert (call.out_ids[heavy] == call.ids[heavy]).all()


@SETTINGS
@given(scenarios())
def test_substituted_mass_is_the_sum_of_substituted_normalized_weights(s: Scenario) -> None:
    trace = replay(s)
    rows = trace.events
    assert rows is not None
    substituted = rows["action"] == SUBSTITUTE
    k = s.top_k
    assert (substituted[:, :k] == (rows["used_ids"] != rows["ids"])[:, :k]).all()
    expected = np.where(substituted, rows["weights"], 0.0).sum(axis=1)
    assert np.allclose(rows["substituted_mass"], expected, atol=1e-5)
    for layer, counted in enumerate(trace.mass):
        total = 0.0
        for m in rows["substituted_mass"][rows["layer"] == layer].tolist():
            total += m
        assert counted == total


@SETTINGS
@given(scenarios())
def test_a_batch_without_room_leaves_the_cache_unchanged(s: Scenario) -> None:
    assert all(replay(s).no_slot_unchanged)


@settings(max_examples=30, deadline=None)
@given(scenarios())
def test_identical_inputs_give_identical_decisions(s: Scenario) -> None:
    a, b = replay(s), replay(s)
    assert len(a.calls) == len(b.calls)
    for x, y in zip(a.calls, b.calls, strict=True):
        assert x.out_ids.tolist() == y.out_ids.tolist()
        assert x.out_slots.tolist() == y.out_slots.tolist()
        assert x.out_weights.tobytes() == y.out_weights.tobytes()
        assert x.plan.tobytes() == y.plan.tobytes()
    assert a.events is not None and b.events is not None
    assert a.events.tobytes() == b.events.tobytes()
