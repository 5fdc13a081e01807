"""Fixtures for the evaluation tests: a text to score and the engine's availability."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def engine_required() -> None:
    try:
        from moescope.engine.bindings import is_patched

        if not is_patched():
            pytest.skip("the patched engine is not installed (make engine)")
    except Exception as err:  # pragma: no cover - depends on the installation
        pytest.skip(f"the installed engine is unusable: {err}")


@pytest.fixture(scope="session")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A few hundred words of plain English (more tokens than any test scores)."""
    sentence = ("the quick brown fox jumps over the lazy dog while the old farmer walks to "
                "the red barn and the birds sing in the tall green trees near the river")
    words = sentence.split(" ")
    text = " ".join(words[(7 * i) % len(words)] for i in range(300))
    path = tmp_path_factory.mktemp("eval") / "text.txt"
    path.write_text(text + "\n", encoding="utf-8")
    return path
