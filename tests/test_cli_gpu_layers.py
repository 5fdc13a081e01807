"""``--n-gpu-layers`` defaults as the window does (issue 17): every layer on a GPU build of
the engine, none on a CPU build; the commands say which build they run on."""

from __future__ import annotations

from pathlib import Path

import pytest

from moescope.cli import build_parser, main
from moescope.engine.backend import NAMES, engine_build

COMMANDS = ["generate", "chat", "bench", "eval", "serve"]


@pytest.mark.parametrize("command", COMMANDS)
def test_the_default_is_left_to_the_engine_and_help_names_the_build(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command] + (["--text", "t.txt"] if command == "eval" else [])
    assert build_parser().parse_args(argv).n_gpu_layers is None
    assert main([command, "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert "all on a CUDA or Vulkan build of the engine, 0 on a CPU build" in help_text
    build = engine_build().backend
    if build in NAMES:
        assert f"this engine is a {NAMES[build]} build" in help_text


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("value", ["-2", "100001", "lots"])
def test_a_layer_count_out_of_range_is_refused_before_loading(
        command: str, value: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    argv = [command, str(tmp_path / "never-read.gguf"), "--n-gpu-layers", value]
    if command == "eval":
        argv += ["--text", str(tmp_path / "never-read.txt")]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "--n-gpu-layers" in err and "Traceback" not in err
    assert ("out of range" in err) if value != "lots" else ("not a whole number" in err)


@pytest.mark.engine
def test_generate_prints_the_build_and_loads_as_the_window_would(
        capsys: pytest.CaptureFixture[str]) -> None:
    import llama_cpp

    from moescope.engine import Engine

    assert main(["generate", "--n", "2", "--seed", "1"]) == 0
    err = capsys.readouterr().err
    build = engine_build().backend
    assert f"engine: {NAMES[build]} build" in err
    engine = Engine()
    try:
        loaded = engine.load(Path(__file__).parents[1] / "resources" / "models"
                             / "moescope-demo-qwen3moe.gguf", budget="25%")
        gpu = bool(llama_cpp.llama_supports_gpu_offload())
        assert loaded.n_gpu_layers == (-1 if gpu else 0)
    finally:
        engine.close()
