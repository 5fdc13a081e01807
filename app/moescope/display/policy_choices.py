"""The policy menu's contents: which presets, in what order, what each trades, and Custom.

Qt-free on purpose: the controls, the open-model dialog and the what-if view show the same
list with the same words, and tests check the Custom mapping without building a widget.

**Custom** spans both papers with one mapping (:func:`custom_policy`), chosen so that the
presets are points of it:

* routing bonus 0 (off): paper 1's **0.15 rule** with the user's θ, frequency eviction,
  background admission with the user's β (quality-first's machinery; at θ = 0.15,
  β = 0.5, prefetch off it *is* quality-first);
* routing bonus > 0: paper 2's **Cache-Prior** rule with that bonus (resident experts'
  gate weights count ``bonus`` more; a miss is replaced by a resident expert whose
  boosted score beats it, else fetched; a substitute computes with its own gate weight),
  with the same eviction and admission. θ is not used by this rule (its slider is
  disabled). At the presets' bonus (``DEFAULT_BONUS``, 0.07), β = 0.5, prefetch off it is
  cache-prior;
* prefetch (PSR) is independent of the rule: off, the router's top-k, or a fixed number of
  the next layer's predicted experts per token. Cache-Prior at the presets' bonus with
  top-k prefetch is psr.
"""

from __future__ import annotations

from dataclasses import dataclass

from moescope.cache.guard import GUARD
from moescope.cache.policy import (
    DEFAULT_BETA,
    DEFAULT_BONUS,
    DEFAULT_THETA,
    PREFETCH_TOP_K,
    PRESETS,
    THETA_DISK_AS_THETA,
    MissRule,
    Policy,
)

CUSTOM = "custom"

POLICY_CHOICES: tuple[tuple[str, str], ...] = (
    ("exact", "Exact (fetch every miss)"),
    ("quality-first", "Quality-first (0.15 rule)"),
    ("speed-first", "Speed-first (first choice)"),
    ("cache-prior", "Cache-prior (routing bonus)"),
    ("psr", "PSR (prefetch + bonus)"),
    (CUSTOM, "Custom (θ, β, bonus, prefetch)"),
    (GUARD, "Quality guard (cost under a target)"),
    ("threshold", "Threshold rule, LRU"),
    ("first-choice", "First-choice rule, LRU"),
    ("substitute-all", "Substitute every miss"),
)
"""Policy menu: paper 1's operating points, paper 2's, Custom, then the bare rules."""

POLICY_NAMES: dict[str, str] = {key: label.split(" (")[0] for key, label in POLICY_CHOICES}
"""The short name a table shows for each choice ("Quality-first", "PSR", "Custom")."""

POLICY_TIPS: dict[str, str] = {
    "exact": "Waits for every missing expert. Output identical to llama.cpp; the slowest "
             "when little of the model is resident.",
    "quality-first": "Waits for a missing expert only if it is the router's first choice or "
                     "its gate weight is at least 0.15; uses a resident expert for the rest. "
                     "About +0.35–1.5% perplexity for 2.5–3× speed (paper 1).",
    "speed-first": "Waits only for a missing first choice; every other miss uses a resident "
                   "expert. Faster than Quality-first, more substituted mass.",
    "cache-prior": f"Routing prefers resident experts: each scores p + {DEFAULT_BONUS:.2f}, so "
                   f"a miss gives way to a resident expert within {DEFAULT_BONUS:.2f} of it, "
                   "else is fetched. Fewer waits; the output is no longer exactly "
                   "llama.cpp's (paper 2).",
    "psr": "Cache-prior plus prefetch: the next layer's router, applied to this layer's "
           "input, predicts its experts, and their copies run while this layer computes. "
           "Fewer waits when the prediction is right; wasted copies (PCIe traffic, "
           "evictions) when it is wrong. The cache panel shows how often it is right.",
    GUARD: "PSR steered by audits: every 8th token is also computed exactly, and the "
           "routing bonus is lowered when the measured perplexity cost of recent tokens "
           "exceeds the target (Guard target), raised again when it is well under. On the "
           "demo model at 1% it fetches about half Quality-first's bytes.",
    CUSTOM: "Your own point: θ and β of the 0.15 rule (and its own θ for misses only on "
            "disk, with a RAM budget), a routing bonus (> 0 switches to the Cache-prior "
            "rule) and prefetch.",
    "threshold": "The bare 0.15 rule with LRU eviction and no admission (for comparison).",
    "first-choice": "The bare first-choice rule with LRU eviction and no admission.",
    "substitute-all": "Never waits (unless nothing resident is left): the reference for what "
                      "substitution costs in quality.",
}
"""One tooltip per menu entry: what it does and what it trades."""

BONUS_MAX = 0.30
"""The routing-bonus slider's top (gate-weight units, as θ); 0 is off."""
BONUS_STEPS = 100
"""Slider units per 1.0 of bonus (the slider shows two decimals)."""

THETA_DISK_OFF = -0.05
"""The disk-threshold control's bottom step (one below 0): it reads "disk = θ", i.e. no
threshold of its own (``THETA_DISK_AS_THETA``)."""

PREFETCH_OFF = "off"
PREFETCH_TOPK = "top-k"
PREFETCH_FIXED = "fixed"
PREFETCH_MODES: tuple[tuple[str, str], ...] = (
    (PREFETCH_OFF, "Off"),
    (PREFETCH_TOPK, "Router's top-k"),
    (PREFETCH_FIXED, "Fixed number"),
)
PREFETCH_MAX = 32
"""Upper end of a fixed prefetch count: what a trace keeps per row (``PREDICTED_KEEP``), so
a recorded session can be replayed exactly."""


def prefetch_value(mode: str, count: int) -> int:
    """``Policy.prefetch`` for the prefetch control: 0 off, -1 top-k, else ``count``."""
    if mode == PREFETCH_OFF:
        return 0
    if mode == PREFETCH_TOPK:
        return PREFETCH_TOP_K
    if mode == PREFETCH_FIXED:
        if count < 1:
            raise ValueError(f"a fixed prefetch needs at least one expert, got {count}")
        return count
    raise ValueError(f"unknown prefetch mode {mode!r}")


def custom_policy(theta: float = DEFAULT_THETA, beta: float = DEFAULT_BETA,
                  bonus: float = 0.0, prefetch: int = 0,
                  theta_disk: float = THETA_DISK_AS_THETA) -> Policy:
    """The Custom entry's policy (mapping in the module docstring).

    A bonus of 0 keeps the dataclass's default ``bonus`` (unused by the 0.15 rule), so that
    Custom at the defaults equals Quality-first, not a near-copy of it. ``theta_disk`` (the
    RAM tier's own threshold for misses only on disk; -1 = θ) belongs to the 0.15 rule and
    is dropped with a bonus, as θ is.
    """
    if bonus < 0:
        raise ValueError(f"the routing bonus must be >= 0, got {bonus}")
    if bonus > 0:
        return PRESETS["cache-prior"].replace(theta=theta, beta=beta, bonus=bonus,
                                              prefetch=prefetch, name=CUSTOM)
    return PRESETS["quality-first"].replace(theta=theta, beta=beta, prefetch=prefetch,
                                            theta_disk=theta_disk, name=CUSTOM)



@dataclass(frozen=True)
class ControlValues:
    """What Custom's controls show: the inverse of :func:`custom_policy`."""

    theta: float
    beta: float
    bonus: float
    """0 unless the policy's rule is the routing bonus (the slider's "off")."""
    prefetch_mode: str
    prefetch_count: int | None
    """Only for a fixed prefetch; None leaves the count control as it is."""
    theta_disk: float = THETA_DISK_AS_THETA
    """The 0.15 rule's threshold for misses only on disk; -1: θ."""


def control_values(policy: Policy) -> ControlValues:
    """The controls' reading of ``policy``: a preset's own parameters are shown (greyed)
    while it is selected, so the controls never contradict the active policy."""
    bonus = policy.bonus if policy.miss_rule == MissRule.ROUTING_BONUS else 0.0
    if policy.prefetch == 0:
        mode, count = PREFETCH_OFF, None
    elif policy.prefetch == PREFETCH_TOP_K:
        mode, count = PREFETCH_TOPK, None
    else:
        mode, count = PREFETCH_FIXED, policy.prefetch
    return ControlValues(theta=policy.theta, beta=policy.beta, bonus=bonus,
                         prefetch_mode=mode, prefetch_count=count,
                         theta_disk=policy.theta_disk)
