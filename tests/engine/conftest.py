"""Fixtures for engine tests: real (tiny) synthetic models through the patched llama.cpp."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from moescope.engine import Engine
from moescope.engine.bindings import is_patched

pytestmark = pytest.mark.engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if not is_patched():
        skip = pytest.mark.skip(reason="the patched engine is not installed (make engine)")
        for item in items:
            if "tests/engine" in str(item.fspath):
                item.add_marker(skip)


@pytest.fixture
def engine() -> Iterator[Callable[..., Engine]]:
    """Factory: ``engine(path, **load_kwargs)`` -> a loaded Engine, closed after the test."""
    made: list[Engine] = []

    def load(path: Path, **kwargs: Any) -> Engine:
        kwargs.setdefault("n_ctx", 256)
        kwargs.setdefault("n_threads", 2)
        e = Engine()
        e.load(path, **kwargs)
        made.append(e)
        return e

    yield load
    for e in made:
        e.close()

