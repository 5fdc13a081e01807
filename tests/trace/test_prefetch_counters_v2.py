"""Version 2 reads every token's PSR counters in one pass over the trace
(``validate.prefetch_rows``): the same arrays as checking each token alone, and the same
refusals, named by token, in the stream and in the compacted Parquet file (whose
compaction reads the stream first)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow.ipc as ipc
import pytest

from moescope.trace import TraceFormatError, read_trace
from moescope.trace.arrow_format import TOKEN_KEY
from moescope.trace.parquet_format import compact
from moescope.trace.validate import _prefetch_from_json, may_hold_literals, prefetch_rows
from moescope_testing.traces import synthetic_trace

MOE = tuple(range(4))


@pytest.fixture(scope="module")
def stream(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return synthetic_trace(tmp_path_factory.mktemp("pf") / "t.arrows", n_tokens=10,
                           n_layers=4, n_expert=32, top_k=4, slots=8)


def edited(src: Path, dest: Path, change: Callable[[int, dict[str, Any]], None]) -> Path:
    """``src`` with each token's fields passed through ``change(index, fields)``."""
    reader = ipc.open_stream(str(src))
    with open(dest, "wb") as f, ipc.new_stream(f, reader.schema) as w:
        while True:
            try:
                batch, meta = reader.read_next_batch_with_custom_metadata()
            except StopIteration:
                break
            if meta is not None and TOKEN_KEY in meta:
                d = json.loads(meta[TOKEN_KEY])
                change(d["index"], d)
                meta = {TOKEN_KEY: json.dumps(d).encode()}
            w.write_batch(batch, custom_metadata=meta)
    return dest


def per_token(path: Path) -> list[tuple[list[int], list[int]] | None]:
    """Each token's counters as the one-token check reads them."""
    reader = ipc.open_stream(str(path))
    out = []
    while True:
        try:
            _, meta = reader.read_next_batch_with_custom_metadata()
        except StopIteration:
            return out
        if meta is not None and TOKEN_KEY in meta:
            d = json.loads(meta[TOKEN_KEY])
            if "prefetch" not in d:
                out.append(None)
                continue
            a, b = _prefetch_from_json(d["prefetch"], MOE)
            out.append((a.tolist(), b.tolist()))


def read_counters(path: Path) -> list[tuple[list[int], list[int]] | None]:
    return [None if t.prefetches is None or t.prefetch_hits is None
            else (t.prefetches.tolist(), t.prefetch_hits.tolist())
            for t in read_trace(path).tokens]


def _reverse(i: int, d: dict[str, Any]) -> None:
    d["prefetch"].reverse()  # any order of layers is the same counters


def _drop(i: int, d: dict[str, Any]) -> None:
    if i == 4:
        del d["prefetch"]  # one token without: each token alone


def _true_text(i: int, d: dict[str, Any]) -> None:
    d["text"] = "is it true"  # the word in a token's text: still one pass


def _literal_like_text(i: int, d: dict[str, Any]) -> None:
    d["text"] = "a,true:false"  # as a value could be written: each token alone


@pytest.mark.parametrize("change", [None, _reverse, _drop, _true_text, _literal_like_text])
def test_one_pass_reads_what_each_token_alone_reads(stream: Path, tmp_path: Path,
                                                    change: Callable[..., None] | None) -> None:
    path = stream if change is None else edited(stream, tmp_path / "e.arrows", change)
    want = per_token(path)
    assert sum(w is not None and sum(w[0]) > 0 for w in want) >= 5
    assert read_counters(path) == want
    parquet = compact(path, tmp_path / "e.parquet")
    assert read_counters(parquet) == want


@pytest.mark.parametrize("bad", [[[0, True, 0]], [[0, 1.0, 0]], [[1, 2, 0], [1, 2, 0]],
                                 [[9, 1, 0]], [[-1, 1, 0]], [[0, -1, 0]], [[0, 1, 1 << 31]],
                                 [[0, 1, 1 << 70]], [[0, 1]], [["0", 1, 0]], [[[0], 1, 0]],
                                 [[0, 1, 0], 7], {"0": [1, 0]}, 5])
def test_a_bad_counter_is_refused_and_named_as_when_read_alone(
        stream: Path, tmp_path: Path, bad: object) -> None:
    def put(i: int, d: dict[str, Any]) -> None:
        if i == 6:
            d["prefetch"] = bad

    path = edited(stream, tmp_path / "bad.arrows", put)
    with pytest.raises(TraceFormatError, match=r"bad\.arrows: token 6: bad token record: "
                                               r".*prefetch"):
        read_trace(path)
    with pytest.raises(TraceFormatError, match=r"token 6: bad token record: .*prefetch"):
        compact(path, tmp_path / "bad.parquet")  # compaction reads it first


def test_the_one_pass_declines_what_it_cannot_check_exactly() -> None:
    good = [{"prefetch": [[0, 1, 1], [2, 3, 0]]}, {"prefetch": []}]
    pf, hits = prefetch_rows(good, MOE, True)  # type: ignore[misc]
    assert pf.tolist() == [[1, 0, 3, 0], [0, 0, 0, 0]]
    assert hits.tolist() == [[1, 0, 0, 0], [0, 0, 0, 0]]
    assert prefetch_rows(good, MOE, False) is None  # a true/false somewhere: numpy takes it as 1
    assert prefetch_rows([{"prefetch": [[0, 1, 1]]}, {}], MOE, True) is None
    assert prefetch_rows([{"prefetch": [[0, 1, 1], [0, 1, 1]]}], MOE, True) is None
    assert prefetch_rows([], MOE, True) is None
    assert not may_hold_literals(b'{"text":"is it true","prefetch":[[0,1,1]]}')
    for held in (b'[[0,true,1]]', b'[[0, false,1]]', b'{"a":true}', b'[\ttrue]'):
        assert may_hold_literals(held), held
