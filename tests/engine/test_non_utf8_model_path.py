"""A model whose file name is not UTF-8 (byte 0xff; Python holds it as a lone surrogate)
loads and generates as the same file under a plain name does: llama.cpp gets the name's
bytes, and messages show it escaped."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.engine import Engine, Sampling
from moescope.model.gguf_info import read_model_info
from moescope.util.resources import demo_model_path

pytestmark = pytest.mark.engine

NAME = os.fsdecode(b"demo-\xff.gguf")


@pytest.fixture(scope="module")
def odd_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("odd-names") / NAME
    shutil.copyfile(demo_model_path(), path)
    assert os.fsencode(path).endswith(b"demo-\xff.gguf")
    return path


def _greedy(path: Path) -> list[int]:
    e = Engine()
    try:
        e.load(path, n_ctx=256, n_threads=1, policy="exact")
        return [t.token_id for t in e.generate("ROMEO:", Sampling(temperature=0,
                                                                  max_tokens=6))]
    finally:
        e.close()


def test_the_engine_loads_a_name_that_is_not_utf8(odd_copy: Path) -> None:
    got = _greedy(odd_copy)
    assert len(got) == 6
    assert got == _greedy(demo_model_path())


def test_a_split_model_named_so_opens_all_its_parts(tmp_path: Path) -> None:
    """llama.cpp finds the other parts from the first one's name: its bytes must be the
    file's."""
    from moescope_testing.synth import preset, write_synth_model

    first = write_synth_model(tmp_path / os.fsdecode(b"split-\xfe.gguf"),
                              preset("tiny", "qwen3moe", expert_type="q8_0"), parts=2)
    assert b"\xfe" in os.fsencode(first)
    assert len(read_model_info(first).parts) == 2
    e = Engine()
    try:
        e.load(first, n_ctx=128, n_threads=1, policy="exact")
        assert len(list(e.generate("Hi", Sampling(temperature=0, max_tokens=3)))) == 3
    finally:
        e.close()


def test_generate_and_info_take_it_and_print_it_escaped(
        odd_copy: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", str(odd_copy), "--prompt", "Hi", "-n", "3",
                 "--policy", "exact"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert "3 tokens" in summary or "stop: eos" in summary
    assert main(["info", str(odd_copy)]) == 0
    out = capsys.readouterr().out
    assert "demo-\\xff.gguf" in out  # escaped as traces and the server write it (one_line)


def test_a_broken_file_so_named_is_one_line_naming_it_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / os.fsdecode(b"bad-\xfe.gguf")
    bad.write_bytes(b"hello, not a model")
    for command in ("generate", "info"):
        assert main([command, str(bad)]) != 0
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1
        assert "bad-\\xfe.gguf" in err and "not a GGUF" in err
