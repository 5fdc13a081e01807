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
    assert "quality cost +1.31%" in est.describe() and "5 audits" in est.describe()
    one = AuditEstimate.from_records(recs[:1])
    assert one is not None and one.low == one.cost == one.high
    assert AuditEstimate.from_records([]) is None


def test_records_round_trip_and_refuse_bad_values() -> None:
    rec = AuditRecord(kl=0.01, logp_exact=-2.0, logp_policy=-2.5, greedy_differs=True,
                      substituted_mass=0.4)
    assert AuditRecord.from_json(rec.to_json()) == rec
    for key, bad in (("kl", -1.0), ("kl", float("nan")), ("logp_exact", 1.0),
                     ("greedy_differs", 1), ("substituted_mass", "x")):
        with pytest.raises(ValueError, match="audit"):
            AuditRecord.from_json({**rec.to_json(), key: bad})


def test_audit_period_bounds() -> None:
    assert check_every(0) == 0 and check_every(16) == 16
    for bad in (-1, 4097, True, 1.5):
        with pytest.raises(MoEScopeError, match="audit period"):
            check_every(bad)  # type: ignore[arg-type]
