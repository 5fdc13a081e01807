"""Models split into several GGUF files (``-00001-of-00003.gguf``, as 80B models ship):
read as one, opened at the first part whichever is given, a missing part named, and
decoded exactly as the same model in one file."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from moescope.model.gguf_info import read_model_info
from moescope.util.errors import ModelFileNotFoundError, ModelFormatError
from moescope_testing import preset, write_synth_model

SPEC = preset("tiny", "qwen3moe", expert_type="q8_0")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    d = tmp_path_factory.mktemp("split")
    whole = write_synth_model(d / "whole.gguf", SPEC)
    first = write_synth_model(d / "model.gguf", SPEC, parts=3)
    return whole, first


def test_the_parts_are_named_like_gguf_split(models: tuple[Path, Path]) -> None:
    _, first = models
    assert first.name == "model-00001-of-00003.gguf"
    assert sorted(x.name for x in first.parent.glob("model-*")) == [
        f"model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]


@pytest.mark.parametrize("given", [1, 2, 3])
def test_any_part_reads_as_the_whole_model(models: tuple[Path, Path], given: int) -> None:
    whole, first = models
    part = first.with_name(f"model-0000{given}-of-00003.gguf")
    a, b = read_model_info(whole), read_model_info(part)
    assert b.path == first and len(b.parts) == 3 and a.parts == ()
    for name in ("architecture", "n_layers", "n_expert", "top_k", "moe_layers",
                 "bytes_per_expert", "total_expert_bytes", "non_expert_bytes", "n_tensors"):
        assert getattr(a, name) == getattr(b, name), name
    assert b.file_size == sum(x.stat().st_size for x in b.parts)
    splits = {t.split for ts in b.expert_tensors.values() for t in ts}
    assert len(splits) > 1  # the experts really are spread over the files
    strip = [dataclasses.replace(t, data_offset=0, split=0)
             for ts in b.expert_tensors.values() for t in ts]
    assert strip == [dataclasses.replace(t, data_offset=0)
                     for ts in a.expert_tensors.values() for t in ts]


def test_a_missing_part_is_named(models: tuple[Path, Path], tmp_path: Path) -> None:
    _, first = models
    for i in (1, 2):
        (tmp_path / f"model-0000{i}-of-00003.gguf").symlink_to(
            first.with_name(f"model-0000{i}-of-00003.gguf"))
    with pytest.raises(ModelFileNotFoundError,
                       match=r"part 3 of 3 .*model-00003-of-00003\.gguf should be next to it"):
        read_model_info(tmp_path / "model-00002-of-00003.gguf")


def test_a_renamed_part_is_a_clear_error(models: tuple[Path, Path], tmp_path: Path) -> None:
    _, first = models
    odd = tmp_path / "my-model.gguf"
    odd.symlink_to(first)
    with pytest.raises(ModelFormatError, match=r"PREFIX-00001-of-00003\.gguf pattern"):
        read_model_info(odd)


def test_parts_of_different_models_are_refused(models: tuple[Path, Path],
                                               tmp_path: Path) -> None:
    _, first = models
    other = write_synth_model(tmp_path / "x.gguf", SPEC, parts=3)
    (tmp_path / "x-00002-of-00003.gguf").unlink()
    (tmp_path / "x-00002-of-00003.gguf").symlink_to(
        first.with_name("model-00003-of-00003.gguf"))
    with pytest.raises(ModelFormatError, match="says it is split part 2, expected 1"):
        read_model_info(other)


@pytest.mark.engine
@pytest.mark.usefixtures("engine_required")
def test_a_split_model_decodes_exactly_like_the_whole_file(models: tuple[Path, Path]) -> None:
    from moescope.engine import Engine

    whole, first = models
    logits = []
    for path in (whole, first.with_name("model-00002-of-00003.gguf")):
        e = Engine()
        try:
            loaded = e.load(path, budget="25%", policy="exact", n_ctx=128, n_threads=2)
            assert loaded.cache_enabled
            prompt = e.tokenize("The experts of this model")
            logits.append(e.forced_logits(prompt, prompt[1:6]))
        finally:
            e.close()
    assert np.array_equal(logits[0], logits[1])
