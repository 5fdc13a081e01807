"""Policies: Python presets equal the C presets, validation, and a switch taking effect at
the next step (never in the middle of a token)."""

from __future__ import annotations

import ctypes
from collections.abc import Callable

import pytest

from moescope.cache.native import (
    CPolicy,
    ExpertCache,
    RouteResult,
    c_preset,
    load_library,
    policy_from_c,
    policy_to_c,
)
from moescope.cache.policy import PRESET_NAMES, Eviction, MissRule, Policy

MakeCache = Callable[..., ExpertCache]
RouteFn = Callable[..., RouteResult]


def as_tuple(c: CPolicy) -> tuple[object, ...]:
    return tuple(getattr(c, name) for name, _ in CPolicy._fields_)


@pytest.mark.parametrize("name", PRESET_NAMES)
def test_python_and_c_presets_agree(name: str) -> None:
    assert as_tuple(policy_to_c(Policy.preset(name))) == as_tuple(c_preset(name))


def test_both_know_the_same_preset_names() -> None:
    assert set(PRESET_NAMES) == {
        "exact",
        "quality-first",
        "speed-first",
        "cache-prior",
        "psr",
        "substitute-all",
        "threshold",
        "first-choice",
    }
    with pytest.raises(ValueError):
        c_preset("turbo")
    with pytest.raises(ValueError):
        Policy.preset("turbo")


def test_the_paper_presets() -> None:
    quality, speed = Policy.preset("quality-first"), Policy.preset("speed-first")
    assert (quality.miss_rule, quality.theta, quality.eviction) == (
        MissRule.THRESHOLD,
        0.15,
        Eviction.FREQUENCY,
    )
    assert quality.admission and quality.beta == 0.5
    assert (speed.miss_rule, speed.eviction, speed.admission) == (
        MissRule.FIRST_CHOICE,
        Eviction.FREQUENCY,
        True,
    )
    assert Policy.preset("exact").exact and not Policy.preset("exact").admission


def test_policy_round_trips_through_c() -> None:
    p = Policy(miss_rule=MissRule.THRESHOLD, theta=0.25, half_life=8.0, admission=True, beta=1.0)
    assert policy_from_c(policy_to_c(p)) == p


@pytest.mark.parametrize(
    "change", [{"theta": -0.1}, {"theta": 1.5}, {"half_life": 0.0}, {"beta": 0.0}]
)
def test_invalid_parameters_are_rejected(change: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Policy(**change)  # type: ignore[arg-type]


def test_the_core_rejects_an_invalid_policy_too(make_cache: MakeCache) -> None:
    cache = make_cache("exact")
    bad = policy_to_c(Policy())
    bad.miss_rule = 7
    assert load_library().moecache_set_policy(cache.handle, ctypes.byref(bad)) == -1


def test_a_policy_switch_waits_for_the_next_step(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache("exact")
    route(cache, [0, 1])
    route(cache, [2, 3])
    cache.set_policy("substitute-all")
    assert cache.policy == Policy.preset("exact")
    assert route(cache, [9, 10]).out_ids.tolist() == [9, 10]  # still fetch-every-miss
    cache.begin_step()
    assert cache.policy.miss_rule == MissRule.SUBSTITUTE_ALL
    assert 11 not in route(cache, [0, 11]).out_ids


def test_the_last_switch_before_a_step_wins(make_cache: MakeCache) -> None:
    cache = make_cache("exact")
    cache.set_policy("speed-first")
    cache.set_policy("threshold")
    cache.begin_step()
    assert cache.policy.miss_rule == MissRule.THRESHOLD


def test_a_preset_carries_its_name_but_equality_ignores_it() -> None:
    quality = Policy.preset("quality-first")
    assert quality.name == "quality-first"
    assert quality == Policy(
        miss_rule=MissRule.THRESHOLD, eviction=Eviction.FREQUENCY, admission=True,
    )
    assert quality.replace(theta=0.3).name is None
