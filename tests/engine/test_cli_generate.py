"""`moescope generate` prints the text, then one summary line of the cache's work."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moescope.cli import main
from moescope.trace import RECORD_SUFFIX


def test_generate_prints_text_and_summary_line(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = synth_model("qwen3moe")
    code = main(["generate", str(path), "--prompt", "Hello", "--policy", "speed-first",
                 "--budget", "25%", "--n", "16", "--seed", "1"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 0
    summary = out[-1]
    for field in ("tok/s", "hit", "MB/tok", "substituted", "mass/tok", "speed-first"):
        assert field in summary
    assert "16 tokens" in summary or "stop: eos" in summary


def test_generate_without_cache_says_so(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", str(synth_model("olmoe")), "--n", "4", "--no-cache"])
    assert code == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.startswith("[cache off]") and "tok/s" in summary
    assert "hit" not in summary  # no cache, no hit rate (a 0% would read as measured)


def test_generate_takes_a_policy_with_parameters_like_the_other_commands(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", str(synth_model("qwen3moe")), "--n", "4",
                 "--policy", "threshold:theta=0.3"])
    assert code == 0
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith(
        "[threshold:theta=0.3 @ ")
    assert main(["generate", str(synth_model("qwen3moe")), "--policy", "fastest"]) == 2
    assert "unknown policy 'fastest'" in capsys.readouterr().err


def test_generate_rejects_a_bad_budget_in_one_line(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", str(synth_model("qwen3moe")), "--budget", "lots"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2
    assert len(err) == 1 and "budget" in err[0]


@pytest.mark.parametrize("suffix", sorted({".jsonl", RECORD_SUFFIX}))
def test_generate_records_a_trace_that_replays_exactly(
        synth_model: Callable[..., Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], suffix: str) -> None:
    """In the format the name says: the app's own (``RECORD_SUFFIX``) and JSON Lines."""
    from moescope.trace import read_trace

    trace = tmp_path / f"session{suffix}"
    assert main(["generate", str(synth_model("qwen3moe")), "--n", "12", "--policy",
                 "quality-first", "--trace", str(trace)]) == 0
    tokens = read_trace(trace).tokens
    assert 1 <= len(tokens) <= 12
    assert list(tmp_path.iterdir()) == [trace]  # finished before the command returned
    capsys.readouterr()
    assert main(["replay", str(trace), "--policy", "recorded", "--budget", "recorded"]) == 0
    assert "recorded" in capsys.readouterr().out


def test_generate_says_so_while_it_compacts_a_long_trace(
        synth_model: Callable[..., Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The command returns with the Parquet file finished: it waits for the compaction
    (seconds for a long session), and says so on stderr once that takes a while."""
    import threading

    from moescope.cli.commands import generate
    from moescope.trace import parquet_format as pf
    from moescope.trace import read_trace

    monkeypatch.setattr(generate, "COMPACT_NOTICE_S", 0.05)
    real, said = pf.compact, threading.Event()

    def slow(*args: Any, **kwargs: Any) -> Path:
        said.wait(30)  # until the notice is out: a long session's compaction
        return real(*args, **kwargs)

    monkeypatch.setattr(pf, "compact", slow)
    real_say = generate._say_compacting

    def say(path: Path) -> None:
        real_say(path)
        said.set()

    monkeypatch.setattr(generate, "_say_compacting", say)
    trace = tmp_path / "long.parquet"
    assert main(["generate", str(synth_model("qwen3moe")), "--n", "6", "--trace",
                 str(trace)]) == 0
    err = capsys.readouterr().err
    assert f"moescope: compacting trace {trace}..." in err
    assert list(tmp_path.iterdir()) == [trace] and len(read_trace(trace).tokens) >= 1


def test_generate_with_the_quality_guard(
        synth_model: Callable[..., Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """``--policy guard:target=...``: audits on at the guard's period, its setting and
    changes in the summary, and its trace replays exactly."""
    from moescope.sim import decision_mismatches, replay
    from moescope.trace import read_trace

    trace = tmp_path / "guard.jsonl"
    code = main(["generate", str(synth_model("qwen3moe")), "--n", "32", "--seed", "3",
                 "--policy", "guard:target=0.05%:every=2", "--trace", str(trace)])
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert code == 0
    assert summary.startswith("[guard 0.05% (bonus ") and "quality cost +" in summary
    assert "expected on the model's own text" in summary  # generated: the KL estimate
    t = read_trace(trace)
    assert t.header.policy.name == "guard"
    result = replay(t, None, None, keep_events=True)
    assert result.events is not None
    assert decision_mismatches(t.events(), result.events) == []
    for bad in ("guard:target=0", "guard:every=0", "guard:base=exact"):
        assert main(["generate", str(synth_model("qwen3moe")), "--policy", bad]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "guard" in err[0]
