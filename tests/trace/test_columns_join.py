"""A long trace's probabilities are joined into one array by several threads, a slice of
blocks each (``TraceColumns.probs``): the result and its checks must be a serial join's."""

from __future__ import annotations

import os

import numpy as np
import pytest

from moescope.trace import TraceFormatError, schema
from moescope.trace.schema import TraceColumns


def columns(parts: list[np.ndarray], exact: np.ndarray) -> TraceColumns:
    rows = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in parts], out=rows[1:])
    return TraceColumns(events=lambda: np.zeros(0), token_rows=rows, exact=exact,
                        probs=parts, gate=np.zeros((int(rows[-1]), 2), np.float32),
                        source="x.arrows")


@pytest.fixture(params=[1, 4])
def threads(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """A slice per block (threads on every machine) or one thread."""
    monkeypatch.setattr(os, "cpu_count", lambda: request.param)
    monkeypatch.setattr(schema, "JOIN_SLICE_BYTES", 1)
    return int(request.param)


def test_the_threaded_join_is_the_serial_one(threads: int) -> None:
    rng = np.random.default_rng(7)
    parts = [rng.random((int(rng.integers(0, 5)), 8), dtype=np.float32) for _ in range(11)]
    parts[3] = parts[3].astype(np.float16)  # an f16 trace's blocks are converted
    joined = columns(parts, np.ones(sum(len(p) for p in parts), np.bool_)).probs
    assert joined.dtype == np.float32 and joined.flags.c_contiguous
    assert np.array_equal(joined, np.concatenate(parts).astype(np.float32))


def test_the_first_bad_row_is_named_whichever_slice_holds_it(threads: int) -> None:
    parts = [np.full((3, 8), 0.125, np.float32) for _ in range(10)]
    parts[7][1, 2] = np.nan  # row 22
    parts[8][0, 0] = np.inf  # row 24
    exact = np.ones(30, np.bool_)
    with pytest.raises(TraceFormatError, match=r"^x\.arrows: row 22\.probs hold a value"):
        _ = columns([p.copy() for p in parts], exact).probs
    parts[1][2, 5] = np.nan  # row 5: in the first slice
    with pytest.raises(TraceFormatError, match=r"row 5\.probs"):
        _ = columns([p.copy() for p in parts], exact).probs
    exact[[5, 22, 24]] = False  # rows without router inputs are not checked
    assert columns(parts, exact).probs.shape == (30, 8)
