"""Shared fixtures: real (tiny) GGUF files, written once per test session."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moescope.testing import ensure_synth_model, preset, write_broken_file


@pytest.fixture(scope="session")
def synth_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One directory for every synthetic model of the session."""
    return tmp_path_factory.mktemp("synth-models")


@pytest.fixture(scope="session")
def synth_model(synth_dir: Path) -> Callable[..., Path]:
    """Factory: ``synth_model("olmoe", expert_type="q8_0")`` -> path of a cached model.

    Same arguments, same file: each distinct spec is written once per session.
    """

    def make(arch: str = "qwen3moe", preset_name: str = "tiny", **overrides: Any) -> Path:
        return ensure_synth_model(synth_dir, preset(preset_name, arch, **overrides))

    return make


@pytest.fixture(scope="session")
def tiny_moe(synth_model: Callable[..., Path]) -> Path:
    """The default tiny qwen3moe model with q8_0 experts."""
    return synth_model("qwen3moe", expert_type="q8_0")


@pytest.fixture(scope="session")
def dense_model(synth_model: Callable[..., Path]) -> Path:
    """A tiny dense qwen3 model (no experts)."""
    return synth_model("qwen3")


@pytest.fixture(scope="session")
def broken_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Factory: ``broken_file("truncated_data")`` -> path (kinds: moescope.testing.BROKEN_KINDS)."""
    directory = tmp_path_factory.mktemp("broken-models")
    cache: dict[str, Path] = {}

    def make(kind: str) -> Path:
        if kind not in cache:
            cache[kind] = write_broken_file(directory / f"{kind}.gguf", kind)
        return cache[kind]

    return make
