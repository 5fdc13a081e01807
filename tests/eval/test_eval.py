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
    evaluate,
    forced_steps,
    mass_hypothesis,
    pearson,
    run_one,
    split_segments,
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
    assert "--audit -1: give 0 (off)" in capsys.readouterr().err


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


@pytest.mark.parametrize("option", ["--sweep-theta", "--sweep-bonus"])
def test_an_empty_sweep_is_refused_not_taken_for_none(
        option: str, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    """``eval --sweep-theta ''`` ran no sweep and said nothing (a shell variable unset)."""
    from moescope.cli import main

    text = tmp_path / "t.txt"
    text.write_text("To be, or not to be, that is the question.\n")
    assert main(["eval", "--text", str(text), option, ""]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"moescope: error: {option} '': expected LO:HI:N")
    assert err.count("\n") == 1


def test_split_segments_scores_every_token_once_within_the_context() -> None:
    """With BOS every segment starts with it; without, with the previous segment's last
    token. Either way each of ``tokens[1:]`` is scored once, in order, and a text that fits
    is one segment equal to itself."""
    from moescope.util.errors import MoEScopeError

    text = list(range(100, 200))
    with_bos = [7, *text]
    segs = split_segments(with_bos, 40, bos=7)
    assert [len(s) for s in segs] == [41, 41, 21]
    assert all(s[0] == 7 for s in segs)
    assert [t for s in segs for t in s[1:]] == text
    segs = split_segments(text, 40)
    assert [s[0] for s in segs] == [100, 140, 180]  # the previous segment's last token
    assert [t for s in segs for t in s[1:]] == text[1:]
    assert split_segments(with_bos, 100, bos=7) == [with_bos]
    assert split_segments(text, 99) == [text]
    assert split_segments(text, 40, bos=7)[1][0] == 140  # the text does not start with BOS
    with pytest.raises(MoEScopeError, match="at least 1"):
        split_segments(text, 0)
    with pytest.raises(MoEScopeError, match="segments"):
        split_segments(list(range(10_000)), 1)


def test_segments_start_from_an_empty_context_and_a_warm_cache(
        synth_model: SynthModel) -> None:
    """Each segment is decoded from an empty KV context: under exact its NLLs are those of
    the segment alone. The expert cache carries on: the second segment's first token finds
    experts resident that an empty cache would fetch. One segment scores as the flat list,
    and an early stop counts tokens across segments."""
    from moescope.engine import Engine

    tokens = [(37 * i + 11) % 300 + 3 for i in range(61)]
    segs = split_segments(tokens, 30)
    assert [len(s) for s in segs] == [31, 31]
    engine = Engine()
    try:
        engine.load(synth_model("qwen3moe"), budget="50%", policy="exact", n_ctx=128,
                    n_threads=1)
        exact = RunSpec(Policy.preset("exact"), "50%")
        whole = run_one(engine, segs, exact)
        alone = [run_one(engine, s, exact) for s in segs]
        assert whole.n_tokens == 60 and whole.segment_starts == (0, 30)
        np.testing.assert_array_equal(whole.nll, np.concatenate([a.nll for a in alone]))
        assert whole.bytes_sync[30] < alone[1].bytes_sync[0]  # warm cache: fewer fetches
        np.testing.assert_array_equal(whole.bytes_sync[:30], alone[0].bytes_sync)
        flat = run_one(engine, tokens[:31], exact)
        nested = run_one(engine, [tokens[:31]], exact)
        np.testing.assert_array_equal(flat.nll, nested.nll)
        np.testing.assert_array_equal(flat.nll, alone[0].nll)
        seen: list[int] = []
        stopped = run_one(engine, segs, exact, progress=seen.append,
                          stopped=lambda: len(seen) >= 42)
        assert stopped.n_tokens == 42 and stopped.segment_starts == (0, 30)
        np.testing.assert_array_equal(stopped.nll, whole.nll[:42])
        assert seen == list(range(1, 43))
        at_edge: list[int] = []
        edge = run_one(engine, segs, exact, progress=at_edge.append,
                       stopped=lambda: len(at_edge) >= 30)
        assert edge.n_tokens == 30 and edge.segment_starts == (0,)
        ticks: list[tuple[int, int]] = []
        report = evaluate(engine, segs, [RunSpec(Policy.preset("speed-first"), "25%")],
                          window=8, n_boot=50, progress=lambda d, t, _: ticks.append((d, t)))
    finally:
        engine.close()
    assert ticks[-1] == (120, 120) and [d for d, _ in ticks] == sorted(d for d, _ in ticks)
    assert report.segments == 2 and report.n_tokens == 60
    assert report.hypothesis.n_windows == 6 and report.hypothesis.n_segments == 2  # 3 + 3
    assert "in 2 segments of at most 30" in report.to_markdown().splitlines()[0]
    assert "6 windows of 8 tokens in 2 segments" in report.to_markdown()


@pytest.mark.parametrize("add_bos", [False, True])
def test_eval_scores_a_text_longer_than_the_context_in_segments(
        synth_model: SynthModel, text_file: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], add_bos: bool) -> None:
    """``--tokens`` beyond the model's context: every token is scored, in segments of at
    most the context less one (each led by BOS when the model adds one), and windows are
    counted per segment."""
    out_csv = tmp_path / "long.csv"
    model = str(synth_model("qwen3moe", ctx=64, add_bos=add_bos))
    code = main(["eval", model, "--text", str(text_file),
                 "--policies", "exact,speed-first", "--budgets", "25%", "--tokens", "150",
                 "--window", "8", "--bootstrap", "100", "--threads", "1",
                 "--csv", str(out_csv)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "scoring 150 in 3 segments of at most 63" in captured.err
    assert ("with BOS first" if add_bos else "after the previous segment's last token") \
        in captured.err
    assert "300/300 tok" in captured.err  # 2 runs x 150: the bar counts every segment
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [int(r["tokens"]) for r in rows] == [150, 150]
    assert captured.out.startswith("Teacher-forced perplexity on 150 tokens")
    assert "in 3 segments of at most 63" in captured.out.splitlines()[0]
    # 63 // 8 + 63 // 8 + 24 // 8 = 17 windows; 150 // 8 = 18 if they straddled
    assert "17 windows of 8 tokens in 3 segments" in captured.out
    for bad, message in ((["--tokens", "2000000"], "--tokens must be"),
                         (["--window", "0"], "--window must be"),
                         (["--bootstrap", "-1"], "--bootstrap must be")):
        assert main(["eval", model, "--text", str(text_file), *bad]) == 2
        assert message in capsys.readouterr().err


def test_mass_hypothesis_windows_stay_inside_segments() -> None:
    """Two segments of 20 tokens and windows of 8: 2 + 2 windows, none across the
    boundary; a window is never longer than the longest segment."""
    rng = np.random.default_rng(2)
    n = 40
    base = rng.uniform(1.0, 3.0, n)
    exact = _run("exact", base, np.zeros(n))
    worse = _run("speed-first", base + 0.1, np.full(n, 0.5))
    for r in (exact, worse):
        r.segment_starts = (0, 20)
    h = mass_hypothesis([exact, worse], exact, 8, n_boot=50)
    assert h.n_windows == 4 and h.window == 8 and h.n_segments == 2
    assert "4 windows of 8 tokens in 2 segments" in h.describe()
    assert mass_hypothesis([exact, worse], exact, 64, n_boot=50).window == 20
    one = _run("exact", base, np.zeros(n))
    assert mass_hypothesis([one], one, 8, n_boot=50).n_windows == 5
    assert "segments" not in mass_hypothesis([one], one, 8, n_boot=50).describe()
