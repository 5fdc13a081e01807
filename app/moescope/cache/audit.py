"""Audited tokens: what substitution costs, measured on the user's own text (issue 20).

Every Nth decoded step the engine also computes that step's *exact* output (every miss
fetched, into scratch slots outside the cache) beside the policy's own. The two next-token
distributions give ``KL(exact || policy)``, which is the expected increase of the token's
negative log-likelihood when the text follows the exact model: the mean audited KL
estimates the policy's log-perplexity cost on text the model writes itself (held-out text
reads about 2x higher, with the same ranking), and ``exp(mean KL) - 1`` its perplexity cost,
with a t interval over the audited tokens (audits are N steps apart, so roughly
independent). What it does not see: the policy's earlier substitutions reach this step
through the KV cache in both passes alike, so the estimate is each step's own cost given
the policy's past, not the drift of a whole run (``moescope eval`` measures that).

Plain numpy; the engine, the trace and the window share these records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.util.errors import MoEScopeError

AUDIT_EVERY_MAX = 4096
"""The longest audit period accepted (a bound on user input; 0 is off)."""


@dataclass(frozen=True)
class AuditRecord:
    """One audited step: the exact output beside the policy's, for the token it shipped."""

    kl: float
    """KL(exact || policy) of the next-token distributions, nats."""
    logp_exact: float
    """log-probability of the shipped token under the exact output."""
    logp_policy: float
    """... and under the policy's output (the one it was sampled from)."""
    greedy_differs: bool
    """The two outputs' most likely tokens differ."""
    substituted_mass: float
    """The step's substituted gate mass (the sum over its event rows)."""

    def to_json(self) -> dict[str, Any]:
        return {"kl": self.kl, "logp_exact": self.logp_exact,
                "logp_policy": self.logp_policy, "greedy_differs": self.greedy_differs,
                "substituted_mass": self.substituted_mass}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> AuditRecord:
        """Read back with every number bounded (a trace is untrusted input)."""
        def num(key: str, lo: float, hi: float) -> float:
            v = d.get(key)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v <= hi:
                raise ValueError(f"audit.{key} must be a number in [{lo:g}, {hi:g}], "
                                 f"got {v!r:.40}")
            return float(v)

        differs = d.get("greedy_differs")
        if not isinstance(differs, bool):
            raise ValueError(f"audit.greedy_differs must be true or false, got {differs!r:.40}")
        return cls(kl=num("kl", 0.0, 1e6), logp_exact=num("logp_exact", -1e6, 0.0),
                   logp_policy=num("logp_policy", -1e6, 0.0), greedy_differs=differs,
                   substituted_mass=num("substituted_mass", 0.0, 1e6))


def _log_softmax(logits: npt.ArrayLike) -> npt.NDArray[np.float64]:
    x = np.asarray(logits, dtype=np.float64)
    top = float(x.max())
    return x - (top + math.log(float(np.exp(x - top).sum())))


def compare(exact: npt.ArrayLike, policy: npt.ArrayLike, token: int,
            substituted_mass: float) -> AuditRecord:
    """The audit of one step from its two logit rows and the token the policy shipped.
    In float64: float32 sums lose the small KLs of nearly-exact policies."""
    le = _log_softmax(exact)
    lp = _log_softmax(policy)
    pe = np.exp(le)
    kl = float(np.sum(pe * (le - lp)))
    return AuditRecord(kl=max(0.0, kl), logp_exact=float(le[token]),
                       logp_policy=float(lp[token]),
                       greedy_differs=int(np.argmax(le)) != int(np.argmax(lp)),
                       substituted_mass=float(substituted_mass))


def _t_two_sided(t: float, df: int) -> float:
    """P(|T| < t) for Student's t with integer ``df`` (Abramowitz & Stegun 26.7.3-4)."""
    theta = math.atan(t / math.sqrt(df))
    c2 = math.cos(theta) ** 2
    if df % 2:
        term, total = 1.0, 1.0 if df > 1 else 0.0
        for k in range(1, (df - 3) // 2 + 1):
            term *= c2 * (2 * k) / (2 * k + 1)
            total += term
        return 2 / math.pi * (theta + (math.sin(theta) * math.cos(theta) * total if df > 1
                                       else 0.0))
    term, total = 1.0, 1.0
    for k in range(1, (df - 2) // 2 + 1):
        term *= c2 * (2 * k - 1) / (2 * k)
        total += term
    return math.sin(theta) * total


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile for integer ``df`` (numpy has none, and scipy is not a
    dependency): the exact distribution function, inverted by bisection."""
    if df < 1 or not 0.0 < p < 1.0:
        raise ValueError("t quantile needs df >= 1 and 0 < p < 1")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    target = 2 * p - 1
    lo, hi = 0.0, 1.0
    while _t_two_sided(hi, df) < target and hi < 1e12:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        if _t_two_sided(mid, df) < target:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return (lo + hi) / 2


@dataclass(frozen=True)
class AuditEstimate:
    """The perplexity cost estimated from audited steps: ``exp(mean KL) - 1``, with the
    95% t interval of the mean KL mapped the same way (its low end floored at 0: a KL is
    never negative). ``low``/``high`` equal ``cost`` until there are 2 audits."""

    n: int
    mean_kl: float
    cost: float
    low: float
    high: float
    greedy_differs: int = 0
    mean_mass: float = 0.0

    @classmethod
    def from_records(cls, records: Iterable[AuditRecord], level: float = 0.95
                     ) -> AuditEstimate | None:
        recs = list(records)
        if not recs:
            return None
        kl = np.array([r.kl for r in recs], dtype=np.float64)
        mean = float(kl.mean())
        half = 0.0
        if kl.size >= 2:
            se = float(kl.std(ddof=1)) / math.sqrt(kl.size)
            half = t_quantile(0.5 + level / 2, kl.size - 1) * se
        return cls(n=int(kl.size), mean_kl=mean, cost=math.expm1(mean),
                   low=math.expm1(max(0.0, mean - half)), high=math.expm1(mean + half),
                   greedy_differs=sum(r.greedy_differs for r in recs),
                   mean_mass=float(np.mean([r.substituted_mass for r in recs])))

    def describe(self) -> str:
        """``quality cost +0.42% (95% CI 0.10-0.81%, 12 audits)``: the stats lines' words."""
        ci = (f"95% CI {100 * self.low:.2f}-{100 * self.high:.2f}%, " if self.n >= 2 else "")
        return (f"quality cost +{100 * self.cost:.2f}% ({ci}{self.n} audit"
                f"{'s' if self.n != 1 else ''})")


def estimate(records: Sequence[AuditRecord | None]) -> AuditEstimate | None:
    """The estimate over the audited entries of ``records`` (None: not audited)."""
    return AuditEstimate.from_records(r for r in records if r is not None)


def check_every(every: int) -> int:
    """An audit period from the user: 0 (off) or 1..AUDIT_EVERY_MAX."""
    if isinstance(every, bool) or not isinstance(every, int) or \
            not 0 <= every <= AUDIT_EVERY_MAX:
        raise MoEScopeError(f"audit period {every!r:.20}: give 0 (off) or a number of tokens "
                         f"from 1 to {AUDIT_EVERY_MAX}")
    return every
