"""The quality guard's controller (issue 20) on synthetic audited-KL sequences: which way
it moves, by how much, when it holds, its bounds, and its spec's bounded input."""

from __future__ import annotations

import math

import pytest

from moescope.cache.guard import (
    BONUS_LEVELS,
    GUARD,
    GuardController,
    GuardSpec,
    parse_guard,
)
from moescope.cache.policy import DEFAULT_BONUS, DEFAULT_THETA, PRESETS, MissRule
from moescope.util.errors import MoEScopeError


def kl_for(cost: float) -> float:
    """The KL whose perplexity cost is ``cost`` (exp(KL) - 1)."""
    return math.log1p(cost)


def feed(c: GuardController, kls: list[float]) -> list[float | None]:
    """The knob after each audit that changed it (None: held)."""
    out: list[float | None] = []
    for kl in kls:
        new = c.observe(kl)
        out.append(None if new is None else c.value)
    return out


def test_starts_at_the_base_preset() -> None:
    c = GuardController(GuardSpec())
    assert c.policy == PRESETS["psr"] and c.policy.name == GUARD
    assert c.value == pytest.approx(DEFAULT_BONUS)
    q = GuardController(GuardSpec(base="quality-first"))
    assert q.policy == PRESETS["quality-first"] and q.value == pytest.approx(DEFAULT_THETA)


def test_over_the_target_tightens_after_settling() -> None:
    c = GuardController(GuardSpec(target=0.01))
    out = feed(c, [kl_for(0.03)] * 4)
    assert out[:3] == [None, None, None]  # settle: 4 audits before judging
    assert out[3] == pytest.approx(DEFAULT_BONUS - 0.02)  # two levels down
    assert c.policy.bonus == pytest.approx(DEFAULT_BONUS - 0.02)
    assert c.policy.miss_rule == MissRule.ROUTING_BONUS and c.policy.name == GUARD


def test_well_under_relaxes_one_level_and_in_between_holds() -> None:
    c = GuardController(GuardSpec(target=0.01))
    assert feed(c, [kl_for(0.001)] * 4)[3] == pytest.approx(DEFAULT_BONUS + 0.01)
    # between half the target and the target: hold, however long
    assert feed(c, [kl_for(0.007)] * 40) == [None] * 40
    assert c.changes == 1


def test_a_change_empties_the_window() -> None:
    """Audits of the old setting never judge the new one: after a change, settle again."""
    c = GuardController(GuardSpec(target=0.01))
    feed(c, [kl_for(0.05)] * 4)
    assert c.recent_cost() is None
    assert feed(c, [kl_for(0.05)] * 3) == [None] * 3
    assert feed(c, [kl_for(0.05)])[0] is not None


def test_bounded_range_both_ways() -> None:
    lo, hi, _ = BONUS_LEVELS
    c = GuardController(GuardSpec(target=0.01))
    feed(c, [kl_for(0.5)] * 400)
    assert c.value == lo and c.policy.bonus == lo
    assert c.observe(kl_for(0.5)) is None or c.value == lo
    feed(c, [0.0] * 4000)
    assert c.value == pytest.approx(hi)
    q = GuardController(GuardSpec(base="quality-first"))
    feed(q, [kl_for(0.5)] * 400)
    assert q.policy.theta == 0.0  # waits for every miss


def test_the_window_is_recent_audits_only() -> None:
    """One large KL long ago stops weighing once ``window`` newer audits came in."""
    c = GuardController(GuardSpec(target=0.01, window=8, settle=4))
    c.level = 7
    out = feed(c, [kl_for(0.007)] * 3 + [kl_for(0.2)])  # the spike makes the mean > 1%
    assert out[3] is not None
    start = c.value
    feed(c, [kl_for(0.007)] * 20)
    assert c.value == start  # 0.7% is in the hold band: no drift either way


def test_same_sequence_same_decisions() -> None:
    seq = [kl_for(x) for x in (0.0, 0.02, 0.001, 0.3, 0.0, 0.0, 0.004, 0.011) * 30]
    a, b = GuardController(GuardSpec()), GuardController(GuardSpec())
    assert feed(a, seq) == feed(b, seq)
    assert a.changes > 2


def test_non_finite_kl_is_bounded() -> None:
    c = GuardController(GuardSpec(target=0.01))
    feed(c, [math.nan, math.inf, -1.0, math.inf])
    assert c.value < DEFAULT_BONUS  # inf counted as huge: tightened


def test_parse_guard() -> None:
    assert parse_guard("quality-first") is None
    assert parse_guard("guard") == GuardSpec()
    s = parse_guard("guard:target=0.5%:every=16:base=cache-prior")
    assert s == GuardSpec(target=0.005, every=16, base="cache-prior")
    assert parse_guard("guard:target=0.02") == GuardSpec(target=0.02)
    for bad, words in (("guard:target=0%", "target"), ("guard:target=abc", "target"),
                       ("guard:target=nan%", "target"), ("guard:every=0", "audit period"),
                       ("guard:every=5000", "audit period"), ("guard:base=speed-first", "base"),
                       ("guard:theta=0.2", "unknown parameter"), ("guard:target", "key=value")):
        with pytest.raises(MoEScopeError, match=words):
            parse_guard(bad)
