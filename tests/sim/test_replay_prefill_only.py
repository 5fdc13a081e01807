"""A trace cut right after its prefill (no decoded token) has nothing to replay: ``replay``
says so in one line and exits 2, instead of a table of zeros ("0 decode tokens of 1") and a
warning that a trace recorded under psr had no PSR predictions."""

from __future__ import annotations

from pathlib import Path

import pytest

from moescope.cli import main
from moescope.sim.cost import cost_model
from moescope.sim.sweep import sweep
from moescope.trace import read_trace
from moescope_testing.traces import core_trace


def _refused(capsys: pytest.CaptureFixture[str], trace: Path) -> str:
    assert main(["replay", str(trace)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"moescope: error: {trace.name}: nothing to replay: no token was "
                          "decoded")
    assert "PSR" not in err
    return err


def test_a_trace_of_one_prefill_token_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _refused(capsys, core_trace(tmp_path / "t.jsonl", n_tokens=1))


def test_a_jsonl_trace_cut_after_its_prefill_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    whole = core_trace(tmp_path / "whole.jsonl", n_tokens=6)
    lines = whole.read_text().splitlines()
    tokens = [i for i, line in enumerate(lines) if '"type":"token"' in line]
    cut = tmp_path / "cut.jsonl"
    cut.write_text("\n".join(lines[:tokens[0] + 1]) + "\n")
    assert main(["replay", str(whole), "--policy", "exact"]) == 0
    capsys.readouterr()
    err = _refused(capsys, cut)
    assert "the prefill of its prompt" in err


@pytest.mark.engine
def test_a_psr_session_of_one_token_says_nothing_to_replay_and_no_psr_warning(
        engine_required: None, tiny_moe: Path, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "one.jsonl"
    assert main(["generate", str(tiny_moe), "-n", "1", "--policy", "psr", "--trace",
                 str(trace)]) == 0
    capsys.readouterr()
    _refused(capsys, trace)
    result = sweep(read_trace(trace), ["recorded", "psr", "exact"], ["recorded"],
                   cost_model("pcie4"))
    assert result.warnings == []  # no decode token: nothing was to be prefetched
