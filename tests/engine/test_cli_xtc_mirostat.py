"""`generate` takes llama-cli's XTC and mirostat options, bounded, and the model's
recommended values for them (``general.sampling.xtc_*``, ``mirostat*``) when not given;
`info` shows them, and the recommended values MoEScope does not apply (sampling order,
penalty window) as such."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType

from moescope.cli import main
from moescope.util.resources import demo_model_path
from moescope_testing.hostile import rewrite_gguf

F32, I32, STR = GGUFValueType.FLOAT32, GGUFValueType.INT32, GGUFValueType.STRING

pytestmark = pytest.mark.engine


@pytest.fixture
def xtc_model(tmp_path: Path) -> Path:
    """The demo model whose authors recommend XTC at every token and greedy decoding,
    with a sampling order and a penalty window MoEScope does not apply."""
    return rewrite_gguf(demo_model_path(), tmp_path / "xtc-demo.gguf", set_keys={
        "general.sampling.temp": (F32, 0.0),
        "general.sampling.xtc_probability": (F32, 1.0),
        "general.sampling.xtc_threshold": (F32, 0.01),
        "general.sampling.mirostat_eta": (F32, 7.0),  # out of bounds: ignored
        "general.sampling.sequence": (STR, "edkypmxt"),
        "general.sampling.penalty_last_n": (I32, 128)})


def _generate(capsys: pytest.CaptureFixture[str], path: Path | None, *extra: str
              ) -> tuple[str, str]:
    model = [str(path)] if path is not None else []
    assert main(["generate", *model, "--n", "10", "--policy", "exact", *extra]) == 0
    captured = capsys.readouterr()
    return captured.out.strip().splitlines()[0], captured.err


def test_the_options_change_the_answer(capsys: pytest.CaptureFixture[str]) -> None:
    greedy, _ = _generate(capsys, None, "--temperature", "0")
    xtc, _ = _generate(capsys, None, "--temperature", "0", "--xtc-probability", "1",
                       "--xtc-threshold", "0.01")
    assert xtc != greedy
    mirostat, _ = _generate(capsys, None, "--temperature", "0.01", "--mirostat", "2",
                            "--mirostat-ent", "9", "--mirostat-lr", "0.2")
    assert mirostat == greedy  # the temperature before mirostat: near-greedy


def test_the_models_recommendation_applies_unless_told(
        xtc_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    greedy, _ = _generate(capsys, None, "--temperature", "0")
    xtc, err = _generate(capsys, xtc_model)
    assert "XTC probability 1, XTC threshold 0.01" in err and "mirostat eta" not in err
    assert xtc != greedy
    told, err = _generate(capsys, xtc_model, "--xtc-probability", "0")
    assert told == greedy and "XTC probability" not in err


@pytest.mark.parametrize(("option", "value"), [
    ("--xtc-probability", "1.5"), ("--xtc-threshold", "nan"), ("--mirostat", "3"),
    ("--mirostat-ent", "1e9"), ("--mirostat-lr", "-1")])
def test_bad_values_are_one_line(option: str, value: str,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", option, value]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and option in err and "must be from" in err


def test_info_shows_them(xtc_model: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["info", str(xtc_model)]) == 0
    rows = {line.split("  ", 1)[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "temperature 0" in rows["sampling"]
    assert "XTC probability 1, XTC threshold 0.01" in rows["sampling+"]
    assert "mirostat" not in rows["sampling+"]
    assert "sampling order edkypmxt, penalty window 128" in rows["not applied"]
