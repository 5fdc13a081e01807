"""With the RAM tier on (``--ram-budget``), ``generate``'s summary line and ``chat``'s
(answers and /stats) give disk MB per token and the RAM hit rate, as README's hardware
notes say and the window's summary does; they lacked both."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import main


def _summary(capsys: pytest.CaptureFixture[str]) -> str:
    return capsys.readouterr().out.strip().splitlines()[-1]


def test_generate_says_disk_mb_per_token_when_the_ram_tier_is_on(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    path = str(synth_model("qwen3moe"))
    assert main(["generate", path, "-n", "8", "--budget", "10%", "--ram-budget", "25%"]) == 0
    summary = _summary(capsys)
    assert " | disk " in summary and " MB/tok | RAM hit " in summary
    assert summary.index("fetched") < summary.index("disk") < summary.index("substituted")
    assert main(["generate", path, "-n", "8", "--budget", "10%"]) == 0
    assert "disk" not in _summary(capsys)  # every expert in RAM: nothing to say


def test_chat_answers_and_stats_say_disk_mb_per_token_when_the_ram_tier_is_on(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n/stats\n"))
    assert main(["chat", str(synth_model("qwen3moe")), "-n", "6", "--budget", "10%",
                 "--ram-budget", "25%"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    answer = next(line for line in lines if line.startswith("[quality-first"))
    stats = next(line for line in lines if line.startswith("[session]"))
    for line in (answer, stats):
        assert " | disk " in line and " MB/tok | RAM hit " in line
