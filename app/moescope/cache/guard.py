"""The quality guard: a policy that keeps the audited perplexity cost under a target.

The user sets a target ("keep the estimated perplexity cost under 1%"); audits run every
Nth token (:mod:`moescope.cache.audit`), and after each one :class:`GuardController`
looks at the recent audited KLs. When ``exp(mean KL) - 1`` over them exceeds the target it
*tightens* the policy (a lower routing bonus, or a lower θ under the 0.15 rule: more misses
are waited for); when it is well under (below ``relax_below`` x target) it *relaxes* it
(a higher bonus or θ: fewer waits). Steps are whole levels of a bounded range, tightening
two levels and relaxing one (costly quality is fixed faster than cheap speed is taken),
and after a change the controller waits for ``settle`` audits of the new setting before it
decides again (hysteresis: the window is emptied, so old audits never move the new one).

Its input is only the audited KLs, which are themselves deterministic (computed in
float64 from logits that audits leave bitwise unchanged), so two runs make the same
changes at the same tokens; each change is an ordinary policy change, which traces record,
so a replay needs no controller to reproduce the run.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from moescope.cache.audit import AUDIT_EVERY_MAX
from moescope.cache.policy import PRESET_NAMES, PRESETS, MissRule, Policy, parse_preset
from moescope.util.errors import MoEScopeError

GUARD = "guard"
"""The guard's name in the policy menu, on the command line and in traces."""
GUARD_BASES = ("psr", "cache-prior", "quality-first")
"""Presets the guard can steer: the routing bonus (cache-prior, psr) or θ (quality-first)."""
DEFAULT_TARGET = 0.01
"""1%: the estimated perplexity cost the guard keeps the run under by default."""
DEFAULT_EVERY = 8
"""The guard's audit period: one extra exact pass per 8 tokens."""
TARGET_RANGE = (1e-4, 0.5)
"""A target from 0.01% to 50% (bounded user input)."""
BONUS_LEVELS = (0.0, 0.3, 0.01)
"""Routing bonus: low, high, step (gate-weight units; the window's slider's range)."""
THETA_LEVELS = (0.0, 0.5, 0.025)
"""θ of the 0.15 rule: low, high, step (0 waits for every miss)."""
KL_CAP = 50.0
"""An audited KL counts at most this many nats (far above any target, and exp() stays
finite)."""


@dataclass(frozen=True)
class GuardSpec:
    """What the user asked of the guard, and the controller's fixed constants."""

    target: float = DEFAULT_TARGET
    every: int = DEFAULT_EVERY
    base: str = "psr"
    window: int = 8
    """At most this many recent audits enter the estimate."""
    settle: int = 4
    """Audits of a setting before the controller judges it."""
    relax_below: float = 0.5
    """Relax only when the estimate is under this share of the target."""
    tighten_levels: int = 2
    relax_levels: int = 1

    def __post_init__(self) -> None:
        lo, hi = TARGET_RANGE
        number = not isinstance(self.target, bool) and isinstance(self.target, (int, float))
        if not number or not (math.isfinite(self.target) and lo <= self.target <= hi):
            got = (f"{100 * self.target:g}%" if number and math.isfinite(self.target)
                   else f"{self.target!r:.20}")
            raise MoEScopeError(f"guard target must be between {100 * lo:g}% and "
                                f"{100 * hi:g}%, got {got}")  # as typed: -5%, not -0.05
        if isinstance(self.every, bool) or not isinstance(self.every, int) or \
                not 1 <= self.every <= AUDIT_EVERY_MAX:
            raise MoEScopeError(f"guard audit period must be 1 to {AUDIT_EVERY_MAX} tokens, "
                                f"got {self.every!r:.20}")
        if self.base not in GUARD_BASES:
            raise MoEScopeError(f"guard base {self.base!r:.30}: use one of "
                                f"{', '.join(GUARD_BASES)}")
        if not 1 <= self.settle <= self.window <= 1024 or not 0 < self.relax_below < 1 or \
                not 1 <= self.relax_levels <= self.tighten_levels <= 100:
            raise MoEScopeError("guard constants out of range")

    @property
    def label(self) -> str:
        """``guard 1%``: what a summary line says of it."""
        return f"{GUARD} {100 * self.target:g}%"

    def start_policy(self) -> Policy:
        """The base preset, named ``guard`` (as every policy the guard sets): where the
        controller starts."""
        return PRESETS[self.base].replace(name=GUARD)


def parse_guard(spec: str) -> GuardSpec | None:
    """``guard[:target=1%][:every=8][:base=psr]`` -> a spec; None when ``spec`` is not
    the guard (another policy). A bad parameter is one line saying which."""
    name, *params = spec.strip().split(":")
    if name.strip() != GUARD:
        return None
    kwargs: dict[str, object] = {}
    for item in params:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip().lower()
        try:
            if not sep:
                raise ValueError("expected key=value")
            if key == "target":
                kwargs[key] = float(value[:-1]) / 100 if value.endswith("%") else float(value)
            elif key == "every":
                kwargs[key] = int(value)
            elif key == "base":
                kwargs[key] = value
            else:
                raise ValueError("unknown parameter; use target, every or base")
        except ValueError as err:
            raise MoEScopeError(f"policy {spec!r:.60}: cannot use {item!r:.40} ({err})") from None
    return GuardSpec(**kwargs)  # type: ignore[arg-type]


def parse_live_policy(spec: str) -> Policy | GuardSpec:
    """What ``--policy`` and the server's ``/v1/moescope/cache`` take: a preset or
    ``preset:key=value`` (:func:`~moescope.cache.policy.parse_preset`), or the quality
    guard, ``guard[:target=1%][:every=8][:base=psr]``."""
    guard = parse_guard(spec)
    if guard is not None:
        return guard
    name = spec.strip().split(":", 1)[0]
    if name not in PRESET_NAMES:
        raise MoEScopeError(f"unknown policy {name!r} (known: {', '.join(PRESET_NAMES)}, "
                            f"{GUARD})")
    return parse_preset(spec)


def _knob(policy: Policy) -> tuple[str, tuple[float, float, float]]:
    """Which parameter the guard moves for this policy's miss rule, and its levels."""
    if policy.miss_rule == MissRule.ROUTING_BONUS:
        return "bonus", BONUS_LEVELS
    return "theta", THETA_LEVELS


class GuardController:
    """Deterministic controller: audited KLs in, a policy change now and then out."""

    def __init__(self, spec: GuardSpec, policy: Policy | None = None) -> None:
        self.spec = spec
        self.policy = policy or spec.start_policy()
        self._key, (lo, hi, step) = _knob(self.policy)
        self._lo, self._step = lo, step
        self._top = round((hi - lo) / step)
        self.level = min(self._top, max(0, round((getattr(self.policy, self._key) - lo)
                                                 / step)))
        self._kls: deque[float] = deque(maxlen=spec.window)
        self.changes = 0

    @property
    def value(self) -> float:
        """The knob's value at the current level (bonus or θ)."""
        return round(self._lo + self.level * self._step, 6)

    def describe(self) -> str:
        """``guard 1% (bonus 0.05, 3 changes)``: what a summary line calls the policy."""
        return (f"{self.spec.label} ({'θ' if self._key == 'theta' else self._key} "
                f"{self.value:g}, {self.changes} change{'' if self.changes == 1 else 's'})")

    def recent_cost(self) -> float | None:
        """``exp(mean KL) - 1`` over the audits of the current setting (None: none yet)."""
        return math.expm1(sum(self._kls) / len(self._kls)) if self._kls else None

    def observe(self, kl: float) -> Policy | None:
        """Take one audited KL (nats); return the new policy when the setting changes."""
        kl = 0.0 if kl != kl or kl < 0 else min(float(kl), KL_CAP)  # NaN, < 0: never
        self._kls.append(kl)                                          # from compare()
        if len(self._kls) < self.spec.settle:
            return None
        mean = sum(self._kls) / len(self._kls)
        level = self.level
        if mean > math.log1p(self.spec.target):
            level = max(0, level - self.spec.tighten_levels)
        elif mean < math.log1p(self.spec.relax_below * self.spec.target):
            level = min(self._top, level + self.spec.relax_levels)
        if level == self.level:
            return None
        self.level = level
        self._kls.clear()
        self.changes += 1
        self.policy = self.policy.replace(name=GUARD, **{self._key: self.value})
        return self.policy


__all__ = ["DEFAULT_EVERY", "DEFAULT_TARGET", "GUARD", "GUARD_BASES", "GuardController",
           "GuardSpec", "parse_guard", "parse_live_policy"]
