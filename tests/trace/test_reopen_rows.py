"""A reopened trace lays its event rows out a few tokens at a time, not all at once.

The window holds a snapshot per token of a reopened trace; with every token's rows laid out
(864 bytes a row) a 10,000-token trace of Qwen3-Next's geometry held 438 MB that nothing
but the accounting and the token on show reads. These tests check that the rows read
through a snapshot, the per-token sums and the accounting are those of the whole layout,
and that reopening and accounting keep far less than the whole layout in memory.
"""

from __future__ import annotations

import gc
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from moescope.cache.native import EVENT_DTYPE
from moescope.display import cache_model
from moescope.display.cache_model import CacheModel
from moescope.display.trace_io import account, reopen
from moescope.trace import read_trace
from moescope.trace.parquet_format import compact
from moescope.trace.schema import EVENT_ROWS_CHUNK
from moescope_testing.traces import synthetic_trace

N_TOKENS = 300
N_LAYERS = 24


@pytest.fixture(scope="module", params=["arrows", "parquet"])
def long_trace(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
               ) -> Path:
    folder = tmp_path_factory.mktemp("rows")
    stream = synthetic_trace(folder / "t.arrows", n_tokens=N_TOKENS, n_layers=N_LAYERS,
                             n_expert=128, top_k=8, slots=32)
    if request.param == "arrows":
        return stream
    return compact(stream, folder / "t.parquet")


def test_each_snapshot_reads_the_rows_of_the_whole_layout(long_trace: Path) -> None:
    reopened = reopen(long_trace)
    whole = read_trace(long_trace)
    rows = whole.events()  # every row laid out at once, as before
    assert len(rows) > EVENT_ROWS_CHUNK  # several chunks, and tokens across their borders
    starts = whole.columns.token_rows
    # in order, backwards (a chunk laid out anew each time), and one token twice
    for i in [*range(len(reopened.tokens)), *range(len(reopened.tokens) - 1, -1, -7), 5, 5]:
        got = reopened.tokens[i].events
        assert got.dtype == EVENT_DTYPE
        assert got.tobytes() == rows[starts[i]:starts[i + 1]].tobytes(), i


def test_token_sums_are_the_rows_sums(long_trace: Path) -> None:
    trace = read_trace(long_trace)
    for name in ("bytes_sync", "bytes_async", "n_admit", "n_evict"):
        want = [int(t.events[name].sum()) for t in trace.tokens]
        assert trace.token_sums(name).tolist() == want
    assert sum(trace.token_sums("bytes_sync")) > 0


def test_accounting_a_reopened_trace_is_accounting_each_token(
        long_trace: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In chunks of 64 tokens (the last one shorter), as in one: the same numbers."""
    monkeypatch.setattr(cache_model, "ACCOUNT_CHUNK", 64)
    reopened = account(reopen(long_trace))
    assert reopened.cache is not None
    one_by_one = CacheModel()
    one_by_one.reset(reopened.model)
    for snap in reopened.tokens:
        one_by_one.add(snap)
    for name in ("uses", "last_use", "_layer_mass", "_layer_hits", "_layer_sel",
                 "_layer_bytes"):
        assert np.array_equal(getattr(reopened.cache, name), getattr(one_by_one, name))
    assert reopened.cache.time.total == one_by_one.time.total == N_TOKENS
    for c in one_by_one.time.columns:
        assert reopened.cache.time.view(c).tobytes() == one_by_one.time.view(c).tobytes(), c


def test_reopening_holds_no_layout_of_every_row(long_trace: Path) -> None:
    """Reopened and accounted, the trace holds no layout of every row: laying it out
    afterwards adds all of it (before, reopening had laid it out already)."""
    n_rows = len(read_trace(long_trace).columns.exact)
    whole_layout = n_rows * EVENT_DTYPE.itemsize
    gc.collect()
    tracemalloc.start()
    try:
        reopened = account(reopen(long_trace))
        gc.collect()
        held, _ = tracemalloc.get_traced_memory()
        assert len(reopened.trace.events()) == n_rows  # laid out now, and kept by the trace
        gc.collect()
        with_rows, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # less the last chunk of rows laid out for the snapshots, dropped with it (and a MB
    # for whatever else moves); before, the difference was about nothing
    chunk = EVENT_ROWS_CHUNK * EVENT_DTYPE.itemsize
    assert with_rows - held > whole_layout - chunk - (1 << 20) > 0, \
        (held, with_rows, whole_layout)
    assert len(reopened.tokens) == N_TOKENS
