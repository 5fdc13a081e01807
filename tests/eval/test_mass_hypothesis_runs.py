"""The mass hypothesis's r across runs: words instead of a number when there are too few
runs (or too few that differ), degenerate resamples left out of the bootstrap, and an
interval that always contains its r (new-user review: ``eval --policies
exact,quality-first,speed-first --budgets 100%`` printed "r = +1.000 [95% CI -0.987,
+0.999]": three runs, r outside its own interval)."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.cache.policy import Policy
from moescope.cli import main
from moescope.engine.evaluate import (
    MIN_RUNS_FOR_R,
    RunResult,
    RunSpec,
    bootstrap_interval,
    distinct_values,
    mass_hypothesis,
    pearson,
)


def _run(policy: str, nll: np.ndarray, mass: np.ndarray, budget: str = "25%") -> RunResult:
    n = len(nll)
    return RunResult(spec=RunSpec(Policy.preset(policy), budget), slots=4, nll=nll, mass=mass,
                     bytes_sync=np.zeros(n, np.int64), seconds=np.zeros(n))


def _runs(seed: int, scales: tuple[float, ...], noise: float = 0.0, n: int = 64
          ) -> list[RunResult]:
    """Exact, then one threshold run per scale whose log-perplexity rises with its mass."""
    rng = np.random.default_rng(seed)
    base = rng.uniform(1.0, 3.0, n)
    runs = [_run("exact", base, np.zeros(n))]
    for k, scale in enumerate(scales):
        mass = scale * rng.uniform(0.0, 2.0, n)
        runs.append(_run("threshold", base + 0.05 * mass + rng.normal(0, noise, n), mass,
                         budget=f"{10 + k}%"))
    return runs


def test_three_runs_say_in_words_that_r_needs_more() -> None:
    """Three runs (the review's command at a budget where they substitute): no r across
    runs and no interval, a sentence saying how many it needs and how many there are."""
    runs = _runs(0, (0.2, 0.5))
    h = mass_hypothesis(runs, runs[0], 8, n_boot=300)
    assert len(h.runs) == 3
    assert math.isnan(h.r_runs) and all(math.isnan(x) for x in h.ci_runs)
    text = h.describe()
    assert (f"r needs at least {MIN_RUNS_FOR_R} first-choice-preserving runs; this eval "
            "has 3") in text
    assert "across runs" not in text and "interval width" not in text
    # the run x window points are many: that r is still given, with its interval
    assert "across run x window points r = +" in text and "[95% CI" in text


def test_runs_that_do_not_differ_count_as_one_point() -> None:
    """Six runs at a budget that holds every expert: each is Exact's logits bit for bit,
    mass 0; two that substitute make three different points, not six."""
    n = 64
    rng = np.random.default_rng(3)
    base = rng.uniform(1.0, 3.0, n)
    same = [_run(p, base.copy(), np.zeros(n), "100%")
            for p in ("exact", "quality-first", "threshold", "first-choice")]
    m1, m2 = rng.uniform(0, 1, n), rng.uniform(0, 2, n)
    runs = [*same, _run("threshold", base + 0.05 * m1, m1), _run("threshold", base + 0.05 * m2,
                                                                   m2, "30%")]
    h = mass_hypothesis(runs, runs[0], 8, n_boot=200)
    assert len(h.runs) == 6 and h.distinct_runs == 3
    assert math.isnan(h.r_runs)
    assert "this eval's 6 give 3 different points" in h.describe()


def test_two_different_points_are_no_correlation() -> None:
    """Two different values make r exactly ±1 through the line between them; such a
    resample (runs that coincide in the windows drawn) is degenerate, not r = ±1."""
    assert pearson([0, 0, 1], [0, 0, 1]) != pearson([0, 0, 1], [0, 0, 1])  # NaN
    assert math.isnan(pearson([0.0, 0.0, 0.0, 2.0], [1.0, 1.0, 1.0, -3.0]))
    assert math.isnan(pearson([0, 1, 2, 3], [5, 5, 6, 6]))
    assert pearson([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0)
    assert math.isnan(pearson([0, 1, 2, 3], [0, 1, 3, 2], min_distinct=5))
    assert distinct_values([0.0, 1e-18, 0.5, 0.5 + 1e-15]) == 2
    assert distinct_values([]) == 0


def test_the_interval_holds_its_r_where_the_bootstrap_lies_to_one_side() -> None:
    """r near +1 from five runs: most resamples of windows give a lower r, and the
    percentile interval (2.5th-97.5th) ended below r (here 0.983 against [0.18, 0.98])."""
    runs = _runs(34, (0.1, 0.2, 0.3, 0.4), noise=0.05)
    h = mass_hypothesis(runs, runs[0], 8, n_boot=200)
    assert len(h.runs) == 5 and h.distinct_runs == 5
    lo, hi = h.ci_runs
    assert lo <= h.r_runs <= hi
    assert hi == h.r_runs  # taken out to r, not past it
    assert lo < 0.5 and "interval width" in h.describe()


@pytest.mark.parametrize("seed", range(12))
def test_every_interval_contains_its_r(seed: int) -> None:
    runs = _runs(seed, (0.05, 0.1, 0.2, 0.3, 0.4, 0.6), noise=0.1)
    h = mass_hypothesis(runs, runs[0], 8, n_boot=100)
    for r, (lo, hi) in ((h.r_runs, h.ci_runs), (h.r_windows, h.ci_windows)):
        assert not math.isnan(r)
        assert lo <= r <= hi


def test_bootstrap_interval_is_the_percentiles_when_they_hold_r() -> None:
    samples = list(np.linspace(-1.0, 1.0, 401))
    lo, hi = bootstrap_interval(0.1, [*samples, float("nan")], least=10)
    assert (lo, hi) == pytest.approx(tuple(np.percentile(samples, [2.5, 97.5])))
    assert bootstrap_interval(0.9, samples, least=10)[1] == pytest.approx(0.95)
    assert bootstrap_interval(0.99, samples, least=10)[1] == 0.99
    assert bootstrap_interval(0.99, [0.1, 0.2, 0.3] * 10, least=10) == (
        pytest.approx(0.1), 0.99)
    assert all(math.isnan(x) for x in bootstrap_interval(0.5, [0.1] * 5, least=10))
    assert all(math.isnan(x) for x in bootstrap_interval(float("nan"), samples, least=10))


def test_a_sweep_of_twelve_runs_keeps_the_percentile_interval() -> None:
    """The documented sweeps (>= 12 runs, docs/benchmarks.md): r and its interval as
    before: the 2.5th and 97.5th percentiles of the resamples' r, which hold r."""
    runs = _runs(5, tuple(0.05 * k for k in range(1, 13)), noise=0.02)
    h = mass_hypothesis(runs, runs[0], 8, n_boot=300, seed=0)
    assert len(h.runs) == 13 and h.distinct_runs == 13
    # the same resamples, as the old code drew them
    mass = np.array([r.mass for r in runs]).reshape(13, 8, 8).mean(axis=2)
    nll = np.array([r.nll for r in runs]).reshape(13, 8, 8).mean(axis=2)
    rng = np.random.default_rng(0)
    boots = []
    for _ in range(300):
        idx = rng.integers(0, 8, 8)
        d = nll[:, idx] - nll[0, idx]
        boots.append(float(np.corrcoef(mass[:, idx].mean(axis=1),
                                       100 * np.expm1(d.mean(axis=1)))[0, 1]))
    assert h.ci_runs == pytest.approx(tuple(np.percentile(boots, [2.5, 97.5])))
    assert h.ci_runs[0] < h.r_runs < h.ci_runs[1]
    text = h.describe()
    assert text.startswith("mass hypothesis over 13 first-choice-preserving runs, 8 windows "
                           f"of 8 tokens: r = {h.r_runs:+.3f} [95% CI ")
    assert "(interval width " in text and "across run x window points" in text


SynthModel = Callable[..., Path]


@pytest.mark.usefixtures("engine_required")
def test_eval_of_three_policies_says_r_needs_more_runs(
        synth_model: SynthModel, text_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The review's command, on a synthetic model: three policies at one budget."""
    code = main(["eval", str(synth_model("qwen3moe")), "--text", str(text_file),
                 "--policies", "exact,quality-first,speed-first", "--budgets", "25%",
                 "--tokens", "48", "--window", "8", "--bootstrap", "200", "--threads", "1"])
    out = capsys.readouterr().out
    assert code == 0
    line = out.strip().splitlines()[-1]
    assert line.startswith("mass hypothesis over 3 first-choice-preserving runs")
    assert "r needs at least 5 first-choice-preserving runs; this eval has 3" in line
    assert "across runs" not in line
