"""Cache policies: miss rule + eviction + admission + their parameters, and the named presets.

The policy is the user's quality/speed dial. Its parts are the definitions of *Which Expert
Misses Are Worth Waiting For?*: a **miss rule** decides whether a routed expert that is not
resident is fetched (waited for) or substituted by a resident one; **eviction** picks the
resident expert that leaves; **background admission** brings in experts that keep losing
gate mass to substitution. *Prefetch-Steered Routing* adds the **routing bonus**
(Cache-Prior: resident experts' gate weights count ``bonus`` more) and **prefetch** (PSR:
the next layer's predicted experts enter the logical cache before it routes). The native
core (``native/``) is the single implementation the engine and the simulator share; this
module only names and validates policies, and its presets must equal the C ones
(``moecache_preset``), which a test checks.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

from moescope.util.errors import MoEScopeError

DEFAULT_THETA = 0.15
"""Paper 1's 0.15 rule: fetch a miss whose normalized gate weight is at least this."""
DEFAULT_BETA = 0.5
"""Paper 1's admission threshold on the gate mass an expert lost to substitution."""
DEFAULT_HALF_LIFE = 64.0
"""Our default half-life of frequency counts, in decode steps (tokens)."""
PARAMETER_RANGES: dict[str, tuple[float, float, str]] = {
    "theta": (0.0, 1.0, ""),
    "half_life": (0.1, 1e9, " steps"),
    "beta": (1e-3, 1e3, ""),
    "bonus": (0.0, 10.0, ""),
}
"""What a policy's numbers may be: finite, and far enough from 0 and infinity that the
native core's float32 keeps them meaningful (a ``half_life`` of 1e-300 is 0 in float32,
which the core refuses; theta and bonus are gate-weight shares, never above 1 or 10)."""
MAX_PREFETCH = 4096
"""More experts than any model has per layer (prefetch -1 means the router's top-k)."""
DEFAULT_BONUS = 0.07
"""Our default Cache-Prior bonus, in gate-weight units (those of θ and of the substituted
mass: a resident expert may take a miss's place when its weight among the token's selection
would be within 0.07 of the miss's), so it means the same for 64 experts or 512. Measured on
the demo model over 12 held-out windows (``bench/bonus_bench.py``, docs/benchmarks.md):
cache-prior +0.3% perplexity (as quality-first) for 0.43x Exact's waited-for bytes, psr
within noise for 0.18x; 0.2 costs +2-5% and 0.3 +9-16%."""
SUGGESTED_THETA_DISK = 0.3
"""A threshold for misses only on disk (RAM tier on) that trades quality for reads: a read
from disk costs about ten times a copy from RAM. No preset uses it: on held-out Python it
cost quality-first +3.7% / +2.2% perplexity at 25% / 50% VRAM (docs/benchmarks.md), so
quality-first waits for disk misses at θ like any other; Custom can set it."""
THETA_DISK_AS_THETA = -1.0
"""``Policy.theta_disk`` value meaning "the same threshold as ``theta``"."""
PREFETCH_TOP_K = -1
"""``Policy.prefetch`` value meaning "as many experts as the router selects"."""


class MissRule(IntEnum):
    """What to do with a routed expert that is not resident (values = C enum)."""

    FETCH_ALL = 0
    THRESHOLD = 1
    FIRST_CHOICE = 2
    SUBSTITUTE_ALL = 3
    ROUTING_BONUS = 4


class Eviction(IntEnum):
    """Which resident expert makes room (values = C enum)."""

    LRU = 0
    FREQUENCY = 1


class SubstituteWeight(IntEnum):
    """Which gate weight a substitute computes with (values = C enum)."""

    MISSING = 0
    OWN = 1


@dataclass(frozen=True)
class Policy:
    """One complete cache policy; immutable so a snapshot can be shared across threads.

    ``half_life`` is kept under LRU too, so that switching to frequency eviction starts from
    a meaningful history; ``beta`` likewise when admission is off.
    """

    miss_rule: MissRule = MissRule.FETCH_ALL
    theta: float = DEFAULT_THETA
    eviction: Eviction = Eviction.LRU
    half_life: float = DEFAULT_HALF_LIFE
    admission: bool = False
    beta: float = DEFAULT_BETA
    substitute_weight: SubstituteWeight = SubstituteWeight.MISSING
    bonus: float = DEFAULT_BONUS
    """ROUTING_BONUS: added to a resident expert's gate weight (router probability over
    the selection's) before top-k."""
    prefetch: int = 0
    """PSR: next-layer experts brought in per token (0 off, -1 = the router's top-k)."""
    theta_disk: float = THETA_DISK_AS_THETA
    """THRESHOLD with the RAM tier on: the threshold for a miss that is only on disk
    (-1: ``theta``)."""
    fill_free: bool = True
    """While a layer has a free slot, a miss is fetched into it whatever the rule: an empty
    slot stands in for nothing, so substituting then only loses quality (at a budget holding
    every expert, the output is Exact's). False: the rule alone, as traces recorded before
    this setting replay."""
    name: str | None = field(default=None, compare=False)
    """The preset this policy is (a label for the UI and traces; not part of equality)."""

    def __post_init__(self) -> None:
        """Coerce the enums and reject what the native core would reject, with a reason."""
        object.__setattr__(self, "miss_rule", MissRule(self.miss_rule))
        object.__setattr__(self, "eviction", Eviction(self.eviction))
        object.__setattr__(self, "substitute_weight", SubstituteWeight(self.substitute_weight))
        object.__setattr__(self, "admission", bool(self.admission))
        object.__setattr__(self, "fill_free", bool(self.fill_free))
        for key, (low, high, unit) in PARAMETER_RANGES.items():
            value = getattr(self, key)
            if not (math.isfinite(value) and low <= value <= high):  # NaN fails too
                raise ValueError(f"{key} must be between {low:g} and {high:g}{unit}, "
                                 f"got {value}")
        if self.theta_disk != THETA_DISK_AS_THETA and not (
                math.isfinite(self.theta_disk) and 0.0 <= self.theta_disk <= 1.0):
            raise ValueError(f"theta_disk must be in [0, 1] or -1 (= theta), "
                             f"got {self.theta_disk}")
        object.__setattr__(self, "prefetch", int(self.prefetch))
        if not PREFETCH_TOP_K <= self.prefetch <= MAX_PREFETCH:
            raise ValueError(f"prefetch must be between -1 (the router's top-k) and "
                             f"{MAX_PREFETCH} experts, got {self.prefetch}")

    @property
    def exact(self) -> bool:
        """True when the output equals the unpatched engine's (every miss is waited for)."""
        return self.miss_rule == MissRule.FETCH_ALL

    def replace(self, **changes: Any) -> Policy:
        """A copy with some parameters changed (the GUI's sliders); it is no longer the
        preset it came from unless ``name`` is given."""
        changes.setdefault("name", None)
        return dataclasses.replace(self, **changes)

    @classmethod
    def preset(cls, name: str) -> Policy:
        """The named preset (see :data:`PRESETS`); ``ValueError`` for an unknown name."""
        try:
            return PRESETS[name]
        except KeyError:
            known = ", ".join(PRESETS)
            raise ValueError(f"unknown policy preset {name!r} (known: {known})") from None



PRESETS: dict[str, Policy] = {
    # reference: exact output at any budget
    "exact": Policy(name="exact"),
    # paper 1's operating points
    "quality-first": Policy(
        miss_rule=MissRule.THRESHOLD,
        eviction=Eviction.FREQUENCY,
        admission=True,
        name="quality-first",
    ),
    "speed-first": Policy(
        miss_rule=MissRule.FIRST_CHOICE,
        eviction=Eviction.FREQUENCY,
        admission=True,
        name="speed-first",
    ),
    # paper 2: the Cache-Prior routing bonus, without and with PSR prefetch (the eviction
    # and admission of quality-first, so only the routing differs)
    "cache-prior": Policy(
        miss_rule=MissRule.ROUTING_BONUS,
        eviction=Eviction.FREQUENCY,
        admission=True,
        substitute_weight=SubstituteWeight.OWN,
        name="cache-prior",
    ),
    "psr": Policy(
        miss_rule=MissRule.ROUTING_BONUS,
        eviction=Eviction.FREQUENCY,
        admission=True,
        substitute_weight=SubstituteWeight.OWN,
        prefetch=PREFETCH_TOP_K,
        name="psr",
    ),
    # the bare miss rules (LRU, no admission), to isolate what each rule costs
    "substitute-all": Policy(miss_rule=MissRule.SUBSTITUTE_ALL, name="substitute-all"),
    "threshold": Policy(miss_rule=MissRule.THRESHOLD, name="threshold"),
    "first-choice": Policy(miss_rule=MissRule.FIRST_CHOICE, name="first-choice"),
}
"""Named presets, identical to the C ``moecache_preset`` table."""

PRESET_NAMES: tuple[str, ...] = tuple(PRESETS)


def parse_preset(spec: str) -> Policy:
    """A preset name, or ``preset:key=value[:key=value]``.

    Keys: ``theta``, ``beta``, ``half_life``, ``eviction`` (lru|frequency), ``admission``
    (on|off), ``miss_rule`` (fetch_all|threshold|first_choice|substitute_all|
    routing_bonus),
    ``substitute_weight`` (missing|own), ``bonus`` (routing bonus), ``prefetch``
    (off|top-k|N experts per token), ``fill_free`` (on|off: free slots take misses first).
    A policy with parameters is labelled by its spec.
    """
    spec = spec.strip()
    name, *params = spec.split(":")
    if name not in PRESET_NAMES:
        raise MoEScopeError(f"unknown policy {name!r} (known: {', '.join(PRESET_NAMES)})")
    policy = Policy.preset(name)
    if not params:
        return policy
    changes: dict[str, Any] = {}
    for item in params:
        key, sep, value = item.partition("=")
        key, value = key.strip().replace("-", "_"), value.strip().lower()
        try:
            if not sep:
                raise ValueError("expected key=value")
            if key in ("theta", "theta_disk", "beta", "half_life", "bonus"):
                changes[key] = float(value)
            elif key == "prefetch":
                changes[key] = {"off": 0, "topk": -1, "top_k": -1}.get(value.replace("-", "_"))
                if changes[key] is None:
                    changes[key] = int(value)
            elif key == "eviction":
                changes[key] = Eviction[value.upper()]
            elif key == "miss_rule":
                changes[key] = MissRule[value.upper().replace("-", "_")]
            elif key == "substitute_weight":
                changes[key] = SubstituteWeight[value.upper()]
            elif key in ("admission", "fill_free"):
                if value not in ("on", "off", "true", "false", "1", "0"):
                    raise ValueError("use on or off")
                changes[key] = value in ("on", "true", "1")
            else:
                raise ValueError("unknown parameter")
        except (KeyError, ValueError) as err:
            raise MoEScopeError(f"policy {spec!r}: cannot use {item!r} ({err})") from None
    try:
        return policy.replace(name=spec, **changes)
    except ValueError as err:
        raise MoEScopeError(f"policy {spec!r}: {err}") from None
