"""A trace cut right after its prefill (no decoded token) has nothing to replay: ``replay``
says so in one line instead of a table of zeros ("0 decode tokens of 1") and a warning that
a trace recorded under psr had no PSR predictions. Its exports need no replay: ``--perfetto``
and ``--tokens-csv`` write what it holds (they refused it with "nothing to replay"), and the
table's place says in one line that there is nothing to replay."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.sim.cost import cost_model
from moescope.sim.sweep import sweep
from moescope.trace import read_trace
from moescope.trace.perfetto import to_perfetto
from moescope.trace.tokens_csv import to_tokens_csv
from moescope_testing.traces import core_trace, prefill_only_trace


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




@pytest.fixture(scope="module", params=["jsonl", "parquet"])
def prefill_only(request: pytest.FixtureRequest, engine_required: None,
                 tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prefill_only_trace(tmp_path_factory.mktemp("prefill") / f"prompt-only.{request.param}")


@pytest.mark.engine
def test_a_prefill_only_trace_exports_perfetto_and_tokens_csv(
        prefill_only: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    perfetto, tokens = tmp_path / "t.perfetto.json", tmp_path / "t.tokens.csv"
    assert main(["replay", str(prefill_only), "--perfetto", str(perfetto),
                 "--tokens-csv", str(tokens)]) == 0
    out, err = capsys.readouterr()
    assert out == ""  # no table of zeros
    assert err == (f"moescope: note: {prefill_only.name}: nothing to replay: no token was "
                   "decoded (the trace holds only the prefill of its prompt); wrote "
                   "--perfetto and --tokens-csv only\n")
    trace = read_trace(prefill_only)
    doc = json.loads(perfetto.read_text(encoding="utf-8"))
    assert doc == json.loads(json.dumps(to_perfetto(trace)))
    slices = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["cat"] == "prefill"]
    assert len(slices) == 1 and slices[0]["args"]["token_id"] == trace.tokens[0].token_id
    assert tokens.read_text(encoding="utf-8") == to_tokens_csv(trace)
    rows = list(csv.DictReader(tokens.open(encoding="utf-8", newline="")))
    assert [(r["phase"], int(r["token_id"])) for r in rows] == [
        ("prefill", trace.tokens[0].token_id)]


@pytest.mark.engine
def test_a_prefill_only_trace_exports_perfetto_to_stdout(
        prefill_only: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    assert main(["replay", str(prefill_only), "--perfetto", "-"]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out) == json.loads(json.dumps(to_perfetto(read_trace(prefill_only))))
    assert err.count("\n") == 1 and "nothing to replay" in err and "--perfetto only" in err


@pytest.mark.engine
def test_a_prefill_only_trace_refuses_the_table_as_a_file_and_writes_nothing(
        prefill_only: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    table, perfetto = tmp_path / "table.csv", tmp_path / "t.perfetto.json"
    assert main(["replay", str(prefill_only), "--csv", str(table), "--perfetto",
                 str(perfetto)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert err.startswith(f"moescope: error: {prefill_only.name}: nothing to replay: no "
                          "token was decoded")
    assert "--csv would be a table of zeros" in err
    assert not table.exists() and not perfetto.exists()
    assert list(tmp_path.iterdir()) == []
