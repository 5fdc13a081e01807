"""``read_trace`` pauses the cyclic garbage collector while it reads and leaves it as it
found it: on after a read, a refused file or a cancelled read; off if it was off."""

from __future__ import annotations

import gc
from pathlib import Path

import pytest

from moescope.trace import TraceFormatError, read_trace
from moescope.trace.reader import TraceReadCancelled
from moescope_testing.traces import synthetic_trace


@pytest.fixture(scope="module")
def trace_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_trace(tmp_path_factory.mktemp("gc") / "t.arrows", n_tokens=70,
                           n_layers=3, n_expert=16, top_k=2, slots=4)


def test_the_collector_is_paused_during_a_read_and_on_after_it(trace_path: Path) -> None:
    seen: list[bool] = []

    def progress(done: int, total: int) -> bool:
        seen.append(gc.isenabled())
        return True

    assert gc.isenabled()
    trace = read_trace(trace_path, progress)
    assert len(trace.tokens) == 70 and seen and not any(seen)
    assert gc.isenabled()


def test_a_refused_or_cancelled_read_turns_it_back_on(trace_path: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.arrows"
    bad.write_bytes(b"\xff\xff\xff\xff" + b"\0" * 64)
    with pytest.raises(TraceFormatError):
        read_trace(bad)
    assert gc.isenabled()
    with pytest.raises(TraceReadCancelled):
        read_trace(trace_path, lambda done, total: False)
    assert gc.isenabled()


def test_a_read_leaves_a_paused_collector_paused(trace_path: Path) -> None:
    gc.disable()
    try:
        read_trace(trace_path)
        assert not gc.isenabled()
    finally:
        gc.enable()
