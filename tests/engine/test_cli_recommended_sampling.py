"""`generate` and `chat` take the model's recommended sampling (its GGUF's
``general.sampling.*``) for what their options leave unset, as llama-cli does, and say so;
`info` shows it. A given ``--temperature`` wins."""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFValueType

from moescope.cli import main
from moescope_testing.hostile import rewrite_gguf

F32, I32 = GGUFValueType.FLOAT32, GGUFValueType.INT32


@pytest.fixture
def greedy(tiny_moe: Path, tmp_path: Path) -> Path:
    """A model whose authors recommend greedy decoding (temperature 0) and top-k 30."""
    return rewrite_gguf(tiny_moe, tmp_path / "greedy.gguf", set_keys={
        "general.sampling.temp": (F32, 0.0), "general.sampling.top_k": (I32, 30)})


def _generate(capsys: pytest.CaptureFixture[str], path: Path, *extra: str) -> tuple[str, str]:
    assert main(["generate", str(path), "--prompt", "Hello", "--n", "24", *extra]) == 0
    captured = capsys.readouterr()
    return captured.out.strip().splitlines()[0], captured.err


def test_generate_uses_the_models_sampling_unless_told(
        greedy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    texts = set()
    for seed in ("1", "2", "3"):
        text, err = _generate(capsys, greedy, "--seed", seed)
        texts.add(text)
        assert "sampling: temperature 0, top-k 30 (the model's recommendation)" in err
    assert len(texts) == 1, "greedy whatever the seed"
    own = set()
    for seed in ("1", "2", "3"):
        text, err = _generate(capsys, greedy, "--seed", seed, "--temperature", "1.5")
        own.add(text)
        assert "sampling: top-k 30 (the model's recommendation)" in err  # not its temperature
    assert len(own) > 1, "a given --temperature samples"
    assert main(["info", str(greedy)]) == 0
    assert "sampling      temperature 0, top-k 30 (the model's recommendation" in \
        capsys.readouterr().out


def test_a_model_without_a_recommendation_says_nothing_of_it(
        tiny_moe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _, err = _generate(capsys, tiny_moe, "--seed", "1")
    assert "sampling:" not in err
