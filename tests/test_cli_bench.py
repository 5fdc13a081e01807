"""`moescope bench`: policies compared on one loaded tiny model, round-robin, from a clean
cache every run. Only what the numbers must satisfy is asserted, never how fast they are."""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moescope.cli import main
from moescope.engine import Engine

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("engine_required")]

POLICIES = ("exact", "quality-first", "speed-first")
FAST = ["--tokens", "8", "--runs", "2", "--threads", "1"]


@pytest.fixture
def switches(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The policy names bench asked the engine for, in order (one per run)."""
    asked: list[str] = []
    request = Engine.request_policy

    def spy(self: Engine, policy: Any) -> None:
        asked.append(policy if isinstance(policy, str) else policy.name)
        request(self, policy)

    monkeypatch.setattr(Engine, "request_policy", spy)
    return asked


def test_bench_prints_one_row_per_policy_and_writes_medians_and_ratios(
        synth_model: Callable[..., Path], tmp_path: Path, switches: list[str],
        capsys: pytest.CaptureFixture[str]) -> None:
    out_json = tmp_path / "bench.json"
    model = synth_model("qwen3moe")
    code = main(["bench", str(model), "--budget", "25%", "--policies", ",".join(POLICIES),
                 *FAST, "--json", str(out_json)])
    out = capsys.readouterr().out
    assert code == 0

    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("policy"))
    assert "vs exact" in lines[header] and "mass/tok" in lines[header]
    rows = [line.split()[0] for line in lines[header + 1:] if line.strip()
            and not line.startswith("note")]
    assert rows == list(POLICIES)
    assert model.name in out and "4/16 slots per layer" in out
    assert "8 tokens" in out and "2 timed runs" in out

    data = json.loads(out_json.read_text())
    assert (data["budget"], data["slots_per_layer"], data["tokens"], data["runs"]) == \
        ("25%", 4, 8, 2)
    by_name = {r["policy"]: r for r in data["rows"]}
    assert list(by_name) == list(POLICIES)
    exact = by_name["exact"]
    assert exact["ratio"] == 1.0
    assert exact["mass_per_token"] == 0.0 and exact["substituted"] == 0.0
    for name, row in by_name.items():
        assert len(row["tok_s_runs"]) == 2 and all(v > 0 for v in row["tok_s_runs"])
        assert row["tok_s_median"] == statistics.median(row["tok_s_runs"])
        assert row["ratio"] == pytest.approx(row["tok_s_median"] / exact["tok_s_median"])
        assert all(run["tokens"] == 8 for run in row["runs"]), name
        # a clean cache before every run: each run made the same decisions
        decisions = {(run["hit_rate"], run["substituted"], run["mass_per_token"])
                     for run in row["runs"]}
        assert len(decisions) == 1, name
    for name in ("quality-first", "speed-first"):
        assert by_name[name]["mass_per_token"] > 0, name
        assert by_name[name]["substituted"] > 0, name
    # warm-up round, then round-robin with the first policy rotating
    assert switches == [*POLICIES, *POLICIES, "quality-first", "speed-first", "exact"]
    # the greedy texts against exact's: exact agrees with itself, the others are measured
    assert (exact["same_start_tokens"], exact["agreement"]) == (8, 1.0)
    assert "identical" in lines[header + 1] and "same text" in lines[header]
    for name in ("quality-first", "speed-first"):
        row = by_name[name]
        assert 0 <= row["same_start_tokens"] <= 8 and 0.0 <= row["agreement"] <= 1.0
        shown = next(line for line in lines if line.startswith(name))
        assert ("identical" in shown) == (row["same_start_tokens"] == 8)


@pytest.mark.parametrize(("args", "message"), [
    (["--policies", "exact,exact"], "more than once"),
    (["--policies", "exact,fastest"], "unknown policy 'fastest'"),
    (["--tokens", "1"], "--tokens"),
    (["--runs", "0"], "--runs"),
    (["--budget", "lots"], "cannot read budget"),
])
def test_bench_rejects_bad_options_in_one_line(
        synth_model: Callable[..., Path], args: list[str], message: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(synth_model("qwen3moe")), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_bench_on_a_dense_model_says_there_is_nothing_to_compare(
        dense_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(dense_model), *FAST]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "expert cache is off" in err[0]


def test_bench_takes_the_quality_guard_and_audits_only_its_runs(
        synth_model: Callable[..., Path], monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--policies exact,guard:target=1%`` was a traceback (``'GuardSpec' object has no
    attribute 'name'``) after the model had loaded; and the audits the guard turns on for
    itself stayed on for the policies measured after it, slowing them."""
    audited: list[tuple[str, int]] = []
    generate = Engine.generate

    def spy(self: Engine, *args: Any, **kwargs: Any) -> Any:
        audited.append((self.policy_name, self.audit_every))
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(Engine, "generate", spy)
    out_json = tmp_path / "bench.json"
    code = main(["bench", str(synth_model("qwen3moe")), "--policies",
                 "exact,guard:target=1%,speed-first", *FAST, "--json", str(out_json)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Traceback" not in err
    assert [r["policy"] for r in json.loads(out_json.read_text())["rows"]] == \
        ["exact", "guard 1%", "speed-first"]
    assert any(line.startswith("guard 1% ") for line in out.splitlines())
    assert len(audited) == 3 * 3  # a warm-up round and two timed ones
    for policy, every in audited:
        assert (every > 0) == (policy == "guard"), audited
