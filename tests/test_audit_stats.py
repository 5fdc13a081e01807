"""The audit's arithmetic (issue 20): KL of two logit rows, the estimate and its interval."""

from __future__ import annotations

import math

import numpy as np
import pytest

from moescope.cache.audit import AuditEstimate, AuditRecord, check_every, compare, t_quantile
from moescope.util.errors import MoEScopeError


def test_compare_is_kl_of_the_softmaxes() -> None:
    rng = np.random.default_rng(0)
    exact = rng.normal(size=50).astype(np.float32)
    policy = exact + rng.normal(scale=0.3, size=50).astype(np.float32)
    rec = compare(exact, policy, token=7, substituted_mass=0.25)
    p = np.exp(exact - exact.max()) / np.exp(exact - exact.max()).sum()
    q = np.exp(policy - policy.max()) / np.exp(policy - policy.max()).sum()
    assert rec.kl == pytest.approx(float(np.sum(p * np.log(p / q))), rel=1e-6)
    assert rec.logp_exact == pytest.approx(math.log(p[7]), rel=1e-6)
    assert rec.logp_policy == pytest.approx(math.log(q[7]), rel=1e-6)
    assert rec.greedy_differs == (int(np.argmax(p)) != int(np.argmax(q)))
    assert rec.substituted_mass == 0.25
    same = compare(exact, exact.copy(), token=3, substituted_mass=0.0)
    assert same.kl == 0.0 and not same.greedy_differs


def test_t_quantiles_match_tables() -> None:
    for df, want in ((1, 12.706), (2, 4.303), (3, 3.182), (5, 2.571), (10, 2.228),
                     (30, 2.042), (1000, 1.962)):
        assert t_quantile(0.975, df) == pytest.approx(want, abs=2e-3)


def test_estimate_interval_holds_the_point() -> None:
    recs = [AuditRecord(kl=k, logp_exact=-1.0, logp_policy=-1.1, greedy_differs=k > 0.02,
                        substituted_mass=0.1) for k in (0.0, 0.01, 0.03, 0.005, 0.02)]
    est = AuditEstimate.from_records(recs)
    assert est is not None and est.n == 5 and est.greedy_differs == 1
    assert est.cost == pytest.approx(math.expm1(0.013))
    assert 0.0 <= est.low < est.cost < est.high
    assert "quality cost +1.31% expected on the model's own text" in est.describe()
    assert "5 audits" in est.describe() and est.source == "model"
    assert est.matched == est.kl  # tokens the model chose: the KL is the estimate
    one = AuditEstimate.from_records(recs[:1])
    assert one is not None and one.low == one.cost == one.high
    assert AuditEstimate.from_records([]) is None


def test_given_tokens_are_measured_by_their_log_ratio() -> None:
    """Teacher-forced tokens: the estimate is exp(mean(log p_exact - log p_policy)) - 1 of
    the text's tokens, which may be negative (the policy gave them more probability), with
    an unfloored interval; the KL estimate stays beside it."""
    pairs = ((-1.0, -1.2), (-2.0, -1.9), (-0.5, -0.8), (-3.0, -2.7), (-1.5, -1.5))
    recs = [AuditRecord(kl=0.02, logp_exact=e, logp_policy=p, greedy_differs=False,
                        substituted_mass=0.3, given=True) for e, p in pairs]
    est = AuditEstimate.from_records(recs)
    assert est is not None and est.source == "given" and est.n_given == 5
    ratios = np.array([e - p for e, p in pairs])
    assert est.cost == pytest.approx(math.expm1(ratios.mean()))
    assert est.matched == est.measured
    half = t_quantile(0.975, 4) * ratios.std(ddof=1) / math.sqrt(5)
    assert est.low == pytest.approx(math.expm1(ratios.mean() - half)) and est.low < 0
    assert est.high == pytest.approx(math.expm1(ratios.mean() + half))
    assert est.kl.cost == pytest.approx(math.expm1(0.02)) and est.kl.low == est.kl.high
    text = est.describe()
    assert "measured on the given text" in text and "expected" not in text
    # the same steps, chosen by the model: the KL is the estimate
    chosen = AuditEstimate.from_records(chosen_recs(recs))
    assert chosen is not None and chosen.source == "model"
    assert chosen.cost == pytest.approx(math.expm1(0.02))
    assert chosen.measured == est.measured  # both numbers kept either way
    mixed = AuditEstimate.from_records([recs[0], *chosen_recs(recs[1:])])
    assert mixed is not None and mixed.source == "mixed" and mixed.n_given == 1
    assert mixed.matched.mean == pytest.approx((ratios[0] + 4 * 0.02) / 5)


def chosen_recs(recs: list[AuditRecord]) -> list[AuditRecord]:
    return [AuditRecord(kl=r.kl, logp_exact=r.logp_exact, logp_policy=r.logp_policy,
                        greedy_differs=r.greedy_differs, substituted_mass=r.substituted_mass)
            for r in recs]


def test_records_round_trip_and_refuse_bad_values() -> None:
    rec = AuditRecord(kl=0.01, logp_exact=-2.0, logp_policy=-2.5, greedy_differs=True,
                      substituted_mass=0.4)
    assert AuditRecord.from_json(rec.to_json()) == rec
    assert "given" not in rec.to_json()  # generated text: records as before
    forced = AuditRecord(kl=0.01, logp_exact=-2.0, logp_policy=-2.5, greedy_differs=True,
                         substituted_mass=0.4, given=True)
    assert AuditRecord.from_json(forced.to_json()) == forced
    assert forced.matched == pytest.approx(0.5) and rec.matched == 0.01
    for key, bad in (("kl", -1.0), ("kl", float("nan")), ("logp_exact", 1.0),
                     ("greedy_differs", 1), ("substituted_mass", "x"), ("given", 1)):
        with pytest.raises(ValueError, match="audit"):
            AuditRecord.from_json({**rec.to_json(), key: bad})


def test_audit_period_bounds() -> None:
    assert check_every(0) == 0 and check_every(16) == 16
    for bad in (-1, 4097, True, 1.5):
        with pytest.raises(MoEScopeError, match="audit period"):
            check_every(bad)  # type: ignore[arg-type]
