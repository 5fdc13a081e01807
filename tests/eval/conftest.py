"""Fixtures for the evaluation tests: a text to score (engine_required is in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


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
