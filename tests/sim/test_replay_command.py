"""``moescope replay``: a policy x budget table from a recorded session, CSV and JSON on
request, and one-line errors for mistakes."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.sim import cost_model, sweep
from moescope.trace import read_trace

RecordFn = Callable[..., Path]


def test_a_sweep_reports_every_policy_and_budget(record: RecordFn) -> None:
    trace = read_trace(record("qwen3moe", tokens=20, answers=2, switch_at=7))
    result = sweep(trace, ["recorded", "exact", "speed-first"], ["recorded", "25%", "100%"],
                   cost_model("pcie4"))
    rows = {(r.policy, r.budget): r for r in result.rows}
    assert len(rows) == 9
    assert rows["exact", "25%"].slots == 4 and rows["exact", "recorded"].slots is None
    for budget in ("25%", "100%"):
        exact, speed = rows["exact", budget], rows["speed-first", budget]
        assert exact.substituted_pct == 0.0 and exact.mass_per_token == 0.0
        assert exact.speedup_vs_exact == pytest.approx(1.0)
    speed = rows["speed-first", "25%"]
    assert speed.substituted_pct > 0 and speed.mass_per_token > 0
    assert speed.fetched_bytes_per_token < rows["exact", "25%"].fetched_bytes_per_token
    assert speed.est_ms_per_token < rows["exact", "25%"].est_ms_per_token
    assert rows["exact", "100%"].hit_rate > rows["exact", "25%"].hit_rate
    assert rows["recorded", "recorded"].tokens == 38  # decode tokens of the two answers


def test_the_calibrated_model_is_fitted_to_the_engines_timings(record: RecordFn) -> None:
    trace = read_trace(record("qwen3moe", tokens=20, answers=2, switch_at=7))
    calibrated = cost_model("calibrated", trace)
    assert calibrated.bandwidth > 0 and calibrated.compute_s is not None
    result = sweep(trace, ["recorded"], ["recorded"], calibrated)
    assert result.recorded_ms_per_token is not None
    assert result.rows[0].est_ms_per_token > 0


def test_the_replay_command_prints_a_table_and_writes_csv_json_and_perfetto(
        record: RecordFn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = record("qwen3moe", tokens=20, answers=2, switch_at=7)
    out_csv, out_json, out_pf = tmp_path / "r.csv", tmp_path / "r.json", tmp_path / "p.json"
    code = main(["replay", str(trace), "--policy", "exact,speed-first",
                 "--policy", "threshold:theta=0.3", "--budget", "25%,50%",
                 "--cost-model", "calibrated", "--csv", str(out_csv), "--json", str(out_json),
                 "--perfetto", str(out_pf)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    lines = captured.out.splitlines()
    assert lines[0].split()[:4] == ["policy", "budget", "slots", "hit"]
    assert sum(line.startswith(("exact", "speed-first", "threshold")) for line in lines) == 6
    assert "calibrated" in captured.out
    rows = list(csv.DictReader(io.StringIO(out_csv.read_text())))
    assert [(r["policy"], r["budget"]) for r in rows][:3] == [
        ("exact", "25%"), ("speed-first", "25%"), ("threshold:theta=0.3", "25%")]
    assert float(rows[1]["mass_per_token"]) > 0
    doc = json.loads(out_json.read_text())
    assert doc["cost_model"]["name"] == "calibrated" and len(doc["rows"]) == 6
    assert json.loads(out_pf.read_text())["traceEvents"]


def test_mistakes_are_one_line_errors(record: RecordFn, tmp_path: Path,
                                      capsys: pytest.CaptureFixture[str]) -> None:
    trace = record("qwen3moe", tokens=20, answers=2, switch_at=7)
    assert main(["replay", str(trace), "--policy", "fastest"]) == 2
    assert "unknown policy 'fastest'" in capsys.readouterr().err
    assert main(["replay", str(trace), "--budget", "12 parsecs"]) == 2
    assert "budget" in capsys.readouterr().err
    assert main(["replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "no such trace" in capsys.readouterr().err
    (tmp_path / "bad.jsonl").write_text("not json\n")
    assert main(["replay", str(tmp_path / "bad.jsonl")]) == 2
    assert "line 1" in capsys.readouterr().err
    (tmp_path / "bad.jsonl.gz").write_bytes(b"\x1f\x8bgarbage, not deflate")
    assert main(["replay", str(tmp_path / "bad.jsonl.gz")]) == 2
    assert "corrupt gzip stream at line 1" in capsys.readouterr().err
    assert main(["replay", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
