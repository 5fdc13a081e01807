"""What a model's GGUF header settles is said before the slow load: a budget of more
experts than the model has is refused naming the option and the model's count, and a
``--ctx`` longer than the model's trained context says, in one line, the context used."""

from __future__ import annotations

import io
import socket
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.engine import Engine


def _port() -> list[str]:
    """``serve``'s ``--port``: a free one (8080 may be taken on a shared machine)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return ["--port", str(s.getsockname()[1])]


@pytest.fixture
def no_load(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Counts the engine loads a command starts (and lets none run: the refusal must come
    before one)."""
    loads: list[Path] = []

    def load(self: Engine, path: Path, **_kw: object) -> None:
        loads.append(Path(path))
        raise AssertionError("the model was loaded before the options were refused")

    monkeypatch.setattr(Engine, "load", load)
    return loads


@pytest.mark.parametrize("command", ["generate", "chat", "serve"])
@pytest.mark.parametrize("option", ["--ram-budget", "--budget"])
def test_more_experts_than_the_model_has_is_refused_before_the_load(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str],
        no_load: list[Path], command: str, option: str) -> None:
    """``--ram-budget 999`` on a model of 16 experts said "budget '999': ..." (either
    option's words) and only from inside the engine's load."""
    model = synth_model("qwen3moe", expert_type="q8_0")
    code = main([command, str(model), option, "17",
                 *(_port() if command == "serve" else [])])
    err = capsys.readouterr().err
    assert code == 2 and not no_load, err
    assert err == (f"moescope: error: {option} 17 asks for 17 experts per layer; the model "
                   "has 16 (give at most 16, or 100%)\n")


def test_a_whole_budget_of_all_experts_passes_the_header_check(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str],
        no_load: list[Path]) -> None:
    model = synth_model("qwen3moe", expert_type="q8_0")
    with pytest.raises(AssertionError, match="was loaded"):
        main(["generate", str(model), "--ram-budget", "16", "--budget", "100%"])
    assert no_load == [model]


def test_a_file_that_is_not_a_gguf_is_one_line_before_the_load(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], no_load: list[Path]) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 60)
    code = main(["serve", str(bad), "--ram-budget", "4", *_port()])
    err = capsys.readouterr().err
    assert code == 2 and not no_load
    assert err.startswith("moescope: error: bad.gguf") and err.count("\n") == 1, err


@pytest.mark.engine
@pytest.mark.usefixtures("engine_required")
def test_a_ctx_above_the_models_context_says_the_one_used(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's 512 tokens were used without a word but for the startup line's
    number; a ``--ctx`` left at its default says nothing."""
    model = synth_model("qwen3moe", expert_type="q8_0")
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    assert main(["chat", str(model), "--ctx", "65536", "--n", "2", "--threads", "1"]) == 0
    err = capsys.readouterr().err
    assert "moescope: --ctx 65536 is above the model's 512; using 512\n" in err
    assert "context 512 tokens" in err
    monkeypatch.setattr("sys.stdin", io.StringIO("hi\n"))
    assert main(["chat", str(model), "--n", "2", "--threads", "1"]) == 0
    assert "--ctx" not in capsys.readouterr().err
