"""Audited tokens: what substitution costs, measured on the user's own text (issue 20).

Every Nth decoded step the engine also computes that step's *exact* output (every miss
fetched, into scratch slots outside the cache) beside the policy's own. Which number
estimates the cost depends on where the step's token came from:

- **The model chose it** (chat answers, ``generate``): ``KL(exact || policy)`` of the two
  next-token distributions is the expected increase of the token's negative
  log-likelihood when the text follows the exact model, so ``exp(mean KL) - 1`` is the
  *expected* perplexity cost on text the model writes itself. The realized log-ratio of the
  shipped token would be biased there: it was drawn from the policy's distribution.
- **It was given** (teacher-forced text: ``moescope eval``-style runs, held-out text): the
  text's tokens follow neither distribution, and the step's change of NLL on them is the
  realized ``log p_exact(x) - log p_policy(x)`` of the text's next token; its mean,
  ``exp(mean) - 1``, is the cost *measured on the given text*. On held-out text the KL
  overstates it about 2x on the demo model (docs/benchmarks.md), since the text is not what
  the model would write.

Both come with a 95% t interval over the audited steps (N apart, so roughly independent),
and every record keeps both numbers. What neither sees: the policy's earlier substitutions
reach this step through the KV cache in both passes alike, so the estimate is each step's
own cost given the policy's past, not the drift of a whole run (``moescope eval`` measures
that).

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
    given: bool = False
    """The token was given from outside (teacher-forced text), not chosen by the model:
    its realized log-ratio, not the KL, is then the step's cost on that text."""

    @property
    def log_ratio(self) -> float:
        """``log p_exact - log p_policy`` of the token: the step's NLL change on it."""
        return self.logp_exact - self.logp_policy

    @property
    def matched(self) -> float:
        """The cost estimator that fits where the token came from: the realized log-ratio
        for a given token, the KL (expected cost) for one the model chose."""
        return self.log_ratio if self.given else self.kl

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kl": self.kl, "logp_exact": self.logp_exact, "logp_policy": self.logp_policy,
            "greedy_differs": self.greedy_differs, "substituted_mass": self.substituted_mass}
        if self.given:  # generated text never has it: its records stay as they were
            out["given"] = True
        return out

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
        given = d.get("given", False)
        if not isinstance(given, bool):
            raise ValueError(f"audit.given must be true or false, got {given!r:.40}")
        return cls(kl=num("kl", 0.0, 1e6), logp_exact=num("logp_exact", -1e6, 0.0),
                   logp_policy=num("logp_policy", -1e6, 0.0), greedy_differs=differs,
                   substituted_mass=num("substituted_mass", 0.0, 1e6), given=given)


def _log_softmax(logits: npt.ArrayLike) -> npt.NDArray[np.float64]:
    x = np.asarray(logits, dtype=np.float64)
    top = float(x.max())
    return x - (top + math.log(float(np.exp(x - top).sum())))


def compare(exact: npt.ArrayLike, policy: npt.ArrayLike, token: int,
            substituted_mass: float, *, given: bool = False) -> AuditRecord:
    """The audit of one step from its two logit rows and the step's token: the one the
    policy shipped, or (``given``) the text's next token in a teacher-forced run.
    In float64: float32 sums lose the small KLs of nearly-exact policies."""
    le = _log_softmax(exact)
    lp = _log_softmax(policy)
    pe = np.exp(le)
    kl = float(np.sum(pe * (le - lp)))
    return AuditRecord(kl=max(0.0, kl), logp_exact=float(le[token]),
                       logp_policy=float(lp[token]),
                       greedy_differs=int(np.argmax(le)) != int(np.argmax(lp)),
                       substituted_mass=float(substituted_mass), given=bool(given))


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


SOURCE_WORDS = {
    "model": "expected on the model's own text",
    "given": "measured on the given text",
    "mixed": "expected on the model's tokens, measured on the given ones",
}
"""How each estimate is labelled wherever it is shown (``AuditEstimate.source``)."""


@dataclass(frozen=True)
class CostInterval:
    """``exp(mean) - 1`` of per-step log costs, with the 95% t interval of the mean mapped
    the same way (``low``/``high`` equal ``cost`` until there are 2 steps)."""

    mean: float
    cost: float
    low: float
    high: float

    @classmethod
    def of(cls, values: npt.NDArray[np.float64], level: float = 0.95, *,
           floor: bool = False) -> CostInterval:
        """``floor``: the low end never below 0 (a KL is never negative; a realized
        log-ratio may be)."""
        mean = float(values.mean())
        half = 0.0
        if values.size >= 2:
            se = float(values.std(ddof=1)) / math.sqrt(values.size)
            half = t_quantile(0.5 + level / 2, values.size - 1) * se
        low = max(0.0, mean - half) if floor else mean - half
        return cls(mean=mean, cost=math.expm1(mean), low=math.expm1(low),
                   high=math.expm1(mean + half))


@dataclass(frozen=True)
class AuditEstimate:
    """The perplexity cost estimated from audited steps, by the estimator that matches
    where their tokens came from (:attr:`matched`; ``cost``/``low``/``high`` are its):
    ``kl`` (expected cost, for tokens the model chose) and ``measured`` (realized log-ratio,
    for given tokens) are both kept."""

    n: int
    kl: CostInterval
    """``exp(mean KL) - 1``: the expected cost on the model's own text."""
    measured: CostInterval
    """``exp(mean (log p_exact - log p_policy)) - 1`` of the steps' tokens: the cost
    measured on them, unbiased where they were given (teacher-forced)."""
    matched: CostInterval
    """Per step, the realized log-ratio where the token was given, the KL where the model
    chose it (:attr:`AuditRecord.matched`): one of the two above unless mixed."""
    n_given: int = 0
    """Audited steps whose token was given (teacher-forced), not chosen by the model."""
    greedy_differs: int = 0
    mean_mass: float = 0.0

    @property
    def source(self) -> str:
        """``model`` (every token chosen by the model), ``given`` or ``mixed``."""
        return "model" if not self.n_given else "given" if self.n_given == self.n else "mixed"

    @property
    def mean_kl(self) -> float:
        return self.kl.mean

    @property
    def cost(self) -> float:
        return self.matched.cost

    @property
    def low(self) -> float:
        return self.matched.low

    @property
    def high(self) -> float:
        return self.matched.high

    @property
    def words(self) -> str:
        """``expected on the model's own text`` or ``measured on the given text``."""
        return SOURCE_WORDS[self.source]

    @classmethod
    def from_records(cls, records: Iterable[AuditRecord], level: float = 0.95
                     ) -> AuditEstimate | None:
        recs = list(records)
        if not recs:
            return None
        kl = np.array([r.kl for r in recs], dtype=np.float64)
        ratio = np.array([r.log_ratio for r in recs], dtype=np.float64)
        given = np.array([r.given for r in recs], dtype=bool)
        return cls(n=len(recs), kl=CostInterval.of(kl, level, floor=True),
                   measured=CostInterval.of(ratio, level),
                   matched=CostInterval.of(np.where(given, ratio, kl), level,
                                           floor=not given.any()),
                   n_given=int(given.sum()),
                   greedy_differs=sum(r.greedy_differs for r in recs),
                   mean_mass=float(np.mean([r.substituted_mass for r in recs])))

    def cost_text(self) -> str:
        """``+0.42%`` (a measured cost may be negative: ``-0.10%``)."""
        return f"{100 * self.cost:+.2f}%"

    def interval_text(self) -> str:
        """``0.10 to 0.81%``: the 95% interval of :attr:`cost` ("" under 2 audits)."""
        return f"{100 * self.low:.2f} to {100 * self.high:.2f}%" if self.n >= 2 else ""

    def describe(self) -> str:
        """``quality cost +0.42% expected on the model's own text (95% CI 0.10 to 0.81%,
        12 audits)``: the stats lines' words."""
        ci = f"95% CI {self.interval_text()}, " if self.n >= 2 else ""
        return (f"quality cost {self.cost_text()} {self.words} ({ci}{self.n} audit"
                f"{'s' if self.n != 1 else ''})")


def estimate(records: Sequence[AuditRecord | None]) -> AuditEstimate | None:
    """The estimate over the audited entries of ``records`` (None: not audited)."""
    return AuditEstimate.from_records(r for r in records if r is not None)


def check_every(every: int, name: str = "audit period") -> int:
    """An audit period from the user: 0 (off) or 1..AUDIT_EVERY_MAX; ``name`` (an option's,
    e.g. ``--audit``) starts the message."""
    if isinstance(every, bool) or not isinstance(every, int) or \
            not 0 <= every <= AUDIT_EVERY_MAX:
        raise MoEScopeError(f"{name} {every!r:.20}: give 0 (off) or a number of tokens "
                            f"from 1 to {AUDIT_EVERY_MAX}")
    return every
