"""``moescope eval``: teacher-forced perplexity per policy and budget on the same tokens."""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.cache.policy import Policy
from moescope.cli import main
from moescope.engine.evaluate import (
    RunResult,
    RunSpec,
    change_interval,
    forced_steps,
    mass_hypothesis,
    pearson,
)

pytestmark = pytest.mark.usefixtures("engine_required")

SynthModel = Callable[..., Path]


def test_eval_compares_every_policy_with_exact_and_writes_table_and_csv(
        synth_model: SynthModel, text_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    out_csv, out_md = tmp_path / "eval.csv", tmp_path / "eval.md"
    code = main(["eval", str(synth_model("qwen3moe")), "--text", str(text_file),
                 "--policies", "exact,quality-first,speed-first,substitute-all",
                 "--budgets", "25%,50%", "--tokens", "48", "--window", "8",
                 "--bootstrap", "200", "--threads", "1", "--csv", str(out_csv),
                 "--markdown", str(out_md)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [(r["policy"], r["budget"]) for r in rows] == [
        (p, b) for b in ("25%", "50%")
        for p in ("exact", "quality-first", "speed-first", "substitute-all")]
    for r in rows:
        assert int(r["tokens"]) == 48
        assert float(r["perplexity"]) > 1.0
        if r["policy"] == "exact":
            assert float(r["ppl_change_pct"]) == 0.0  # exact at any budget: same logits
            assert float(r["substituted_pct"]) == 0.0 and float(r["mass_per_token"]) == 0.0
        else:
            assert float(r["mass_per_token"]) > 0.0 and float(r["substituted_pct"]) > 0.0
        assert float(r["fetched_bytes_per_token"]) >= 0 and float(r["seconds_per_token"]) > 0
    exact_ppl = {float(r["perplexity"]) for r in rows if r["policy"] == "exact"}
    assert len(exact_ppl) == 1
    table = captured.out
    assert table.startswith("Teacher-forced perplexity on 48 tokens")
    assert "| policy | budget | slots | perplexity | Δ vs exact |" in table
    assert table.count("| exact |") == 2 and "+0.00%" in table
    assert "mass hypothesis over 6 first-choice-preserving runs, 6 windows of 8 tokens" in table
    assert out_md.read_text().strip() == table.strip()
    assert "ETA" in captured.err and "100%" in captured.err


def test_eval_with_audits_measures_the_cost_on_the_text(
        synth_model: SynthModel, text_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--audit N``: each run also audits every Nth step; the text's tokens are given, so
    the table shows the cost measured on them beside the KL estimate, and the perplexities
    are those of the run without audits."""
    common = ["eval", str(synth_model("qwen3moe")), "--text", str(text_file),
              "--policies", "exact,substitute-all", "--budgets", "25%", "--tokens", "48",
              "--window", "8", "--bootstrap", "50", "--threads", "1"]
    plain_csv, audit_csv = tmp_path / "plain.csv", tmp_path / "audit.csv"
    assert main([*common, "--csv", str(plain_csv)]) == 0
    assert main([*common, "--audit", "4", "--csv", str(audit_csv)]) == 0
    table = capsys.readouterr().out.split("Teacher-forced")[-1]
    assert "audited, measured on the text [95% CI] | KL estimate |" in table
    assert "Audits every 4 tokens" in table
    plain = list(csv.DictReader(io.StringIO(plain_csv.read_text())))
    audited = list(csv.DictReader(io.StringIO(audit_csv.read_text())))
    assert "audits" not in plain[0]
    assert [r["perplexity"] for r in audited] == [r["perplexity"] for r in plain]
    exact, sub = audited
    assert int(exact["audits"]) == int(sub["audits"]) == 11  # steps 4, 8, ..., 44 of 48
    assert float(exact["audit_measured_pct"]) == 0.0 and float(exact["audit_kl_pct"]) == 0.0
    assert float(sub["audit_kl_pct"]) > 0.0
    assert float(sub["audit_measured_low_pct"]) <= float(sub["audit_measured_pct"]) \
        <= float(sub["audit_measured_high_pct"])
    assert main([*common, "--audit", "-1"]) == 2
    assert "audit period" in capsys.readouterr().err


def test_eval_with_a_ram_budget_below_the_experts_reads_from_disk_and_keeps_exact(
        synth_model: SynthModel, text_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Experts beyond the RAM budget stay in the file: the table gains disk bytes and RAM
    hits per run, and exact's perplexity is the same as with every expert in memory."""
    model = str(synth_model("qwen3moe", expert_type="q8_0"))
    common = ["eval", model, "--text", str(text_file), "--policies", "exact,quality-first",
              "--budgets", "25%", "--tokens", "32", "--window", "8", "--bootstrap", "50",
              "--threads", "1"]
    tiered_csv, whole_csv = tmp_path / "tiered.csv", tmp_path / "whole.csv"
    assert main([*common, "--ram-budget", "30%", "--csv", str(tiered_csv)]) == 0
    table = capsys.readouterr().out
    assert main([*common, "--csv", str(whole_csv)]) == 0
    whole_table = capsys.readouterr().out
    assert "RAM tier " in table.splitlines()[0] and "| disk/tok | RAM hits |" in table
    assert "disk/tok" not in whole_table and "RAM tier" not in whole_table
    tiered = {r["policy"]: r for r in csv.DictReader(io.StringIO(tiered_csv.read_text()))}
    whole = {r["policy"]: r for r in csv.DictReader(io.StringIO(whole_csv.read_text()))}
    assert "disk_bytes_per_token" not in whole["exact"]
    assert float(tiered["exact"]["perplexity"]) == float(whole["exact"]["perplexity"])
    for r in tiered.values():
        assert float(r["disk_bytes_per_token"]) > 0.0
        assert 0.0 <= float(r["ram_hit_rate"]) < 1.0
    # quality-first waits for fewer disk-only misses than exact (its disk threshold)
    assert float(tiered["quality-first"]["fetched_bytes_per_token"]) < float(
        tiered["exact"]["fetched_bytes_per_token"])


def test_forced_steps_decode_like_the_engines_forced_logits(
        synth_model: SynthModel) -> None:
    from moescope.engine import Engine

    engine = Engine()
    try:
        engine.load(synth_model("olmoe"), budget="25%", policy="speed-first", n_ctx=128,
                    n_threads=1)
        tokens = [1, 5, 9, 40, 77, 3, 120, 64, 8, 200]
        streamed = np.array([logits.copy() for _, logits, *_ in forced_steps(engine, tokens)])
        assert engine.cache is not None
        engine.cache.clear()
        reference = engine.forced_logits(tokens[:1], tokens[1:])
    finally:
        engine.close()
    np.testing.assert_array_equal(streamed[1:], reference)


def test_pearson_matches_numpy_and_is_undefined_without_variance() -> None:
    rng = np.random.default_rng(1)
    x, y = rng.normal(size=50), rng.normal(size=50)
    assert pearson(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert math.isnan(pearson([1, 1, 1, 1], [1, 2, 3, 4]))
    assert math.isnan(pearson([1, 2], [3, 4]))


def _run(policy: str, nll: np.ndarray, mass: np.ndarray) -> RunResult:
    n = len(nll)
    return RunResult(spec=RunSpec(Policy.preset(policy), "25%"), slots=4, nll=nll, mass=mass,
                     bytes_sync=np.zeros(n, np.int64), seconds=np.zeros(n))


def test_the_change_interval_resamples_blocks_and_brackets_the_pooled_change() -> None:
    rng = np.random.default_rng(1)
    base = rng.uniform(1.0, 5.0, size=320)
    worse = base + rng.normal(0.05, 0.2, size=base.size)
    change, lo, hi = change_interval(worse, base, block=32)
    assert change == pytest.approx(math.expm1(worse.mean() - base.mean()) * 100)
    assert lo < change < hi and lo > 0  # a real, consistent loss: the interval excludes 0
    assert change_interval(base, base, block=32) == (0.0, 0.0, 0.0)
    # one block that carries the whole difference: no certainty to claim
    lumpy = base.copy()
    lumpy[:32] += 1.6
    change, lo, hi = change_interval(lumpy, base, block=32)
    assert lo == pytest.approx(0.0) and hi > 2 * change
    # a ragged last block counts with its own length
    assert change_interval(worse[:100], base[:100], block=32)[0] == pytest.approx(
        math.expm1((worse[:100] - base[:100]).mean()) * 100)


def test_the_mass_hypothesis_sees_perplexity_that_grows_with_substituted_mass() -> None:
    """Synthetic runs whose log-perplexity rises in proportion to their substituted mass
    per window: r is ~1 across runs and across windows, with tight intervals; a run that
    substitutes every miss is left out (it does not always fetch the first choice)."""
    rng = np.random.default_rng(0)
    n, window = 64, 8
    base = rng.uniform(1.0, 3.0, n)
    exact = _run("exact", base, np.zeros(n))
    runs = [exact]
    for policy, scale in (("quality-first", 0.1), ("threshold", 0.2), ("speed-first", 0.5),
                          ("first-choice", 0.8)):
        mass = scale * rng.uniform(0.5, 1.5, n)
        runs.append(_run(policy, base + 0.05 * mass, mass))
    runs.append(_run("substitute-all", base - 1.0, np.full(n, 3.0)))  # would break r
    h = mass_hypothesis(runs, exact, window, n_boot=300)
    assert h.runs == ("exact@25%", "quality-first@25%", "threshold@25%", "speed-first@25%",
                      "first-choice@25%")
    assert h.n_windows == 8
    assert h.r_runs > 0.99 and h.r_windows > 0.95
    assert h.ci_runs[0] > 0.95 and h.ci_windows[0] > 0.9
    assert "r = +" in h.describe()


def test_sweep_values_are_bounded_and_evenly_spaced() -> None:
    from moescope.cli.commands.eval import sweep_values
    from moescope.util.errors import MoEScopeError

    assert sweep_values("0.1:0.5:5", "--sweep-theta", 0.0, 1.0) == [0.1, 0.2, 0.3, 0.4, 0.5]
    for bad in ("0.1:0.5", "a:b:3", "0.1:2:3", "0.1:0.5:0", "0.1:0.5:65"):
        with pytest.raises(MoEScopeError, match="--sweep-theta"):
            sweep_values(bad, "--sweep-theta", 0.0, 1.0)
