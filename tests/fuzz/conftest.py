"""Fixtures of the fuzz tests: one fork worker for the session, and the seed files."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from moescope_testing import fuzzgen
from moescope_testing.forkrun import ForkRunner


@pytest.fixture(scope="session")
def fork_runner(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkRunner]:
    """A worker that imports MoEScope once and runs every input in a limited fork."""
    with ForkRunner(timeout=60.0, cpu_seconds=30,
                    scratch=tmp_path_factory.mktemp("fork")) as runner:
        yield runner


@pytest.fixture(scope="session")
def fuzz_bases(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Path], list[Path]]:
    """(models, traces): the small real files the mutations start from."""
    return fuzzgen.make_bases(tmp_path_factory.mktemp("fuzz-bases"))



@pytest.fixture(scope="session")
def gguf_docs(fuzz_bases: tuple[list[Path], list[Path]]) -> list[fuzzgen.GGUFDoc]:
    """The seed models, decoded once."""
    return [fuzzgen.read_doc(m) for m in fuzz_bases[0]]


@pytest.fixture(scope="session")
def trace_docs(fuzz_bases: tuple[list[Path], list[Path]]) -> list[fuzzgen.TraceDoc]:
    """The seed traces, decoded once."""
    return [fuzzgen.read_trace_doc(t) for t in fuzz_bases[1]]
