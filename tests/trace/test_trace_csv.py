"""The per-token CSV of a trace (File → Export trace…, ``moescope replay --tokens-csv``):
one row per recorded token whose counts add up to the trace's own event rows, and empty
cells, never zeros, for what was not recorded."""

from __future__ import annotations

import csv
import dataclasses
import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.cli import main
from moescope.trace import read_trace
from moescope.trace.tokens_csv import TOKEN_COLUMNS, to_tokens_csv

RecordFn = Callable[..., Path]


def _rows(text: str) -> list[dict[str, str]]:
    reader = csv.DictReader(io.StringIO(text))
    assert tuple(reader.fieldnames or ()) == TOKEN_COLUMNS
    return list(reader)


def test_each_token_is_a_row_that_adds_up_to_its_events(
        record: RecordFn, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = record("qwen3moe", tokens=20, answers=2, switch_at=7, policy="psr")
    trace = read_trace(path)
    out = tmp_path / "tokens.csv"
    assert main(["replay", str(path), "--policy", "recorded", "--tokens-csv", str(out)]) == 0
    capsys.readouterr()
    rows = _rows(out.read_text(encoding="utf-8"))
    assert len(rows) == len(trace.tokens) == 40
    assert [r["answer"] for r in rows] == ["0"] * 20 + ["1"] * 20
    assert [r["text"] for r in rows] == [t.text for t in trace.tokens]  # quoted as needed
    events = trace.events()
    for column, field in (("hits", "n_hit"), ("fetches", "n_fetch"),
                          ("substitutions", "n_substitute"), ("bytes_sync", "bytes_sync"),
                          ("selections", "k")):
        assert sum(int(r[column]) for r in rows) == int(events[field].sum()), column
    assert sum(float(r["substituted_mass"]) for r in rows) == pytest.approx(
        float(events["substituted_mass"].astype(np.float64).sum()))
    assert sum(int(r["prefetches"]) for r in rows) > 0  # psr prefetches, and says so
    assert all(r["sync_copy_us"] != "" for r in rows)  # the engine's timings were recorded
    switched = [r["changes"] for r in rows if r["changes"]]
    assert any("policy=speed-first" in c for c in switched)
    assert any("slots=" in c for c in switched)
    assert {r["policy"] for r in rows} == {"psr", "speed-first"}


def test_what_was_not_recorded_is_an_empty_cell_not_a_zero(record: RecordFn) -> None:
    trace = read_trace(record("qwen3moe", tokens=6))
    bare = dataclasses.replace(trace, tokens=[
        dataclasses.replace(t, timings=None, prefetches=None, prefetch_hits=None)
        for t in trace.tokens])
    rows = _rows(to_tokens_csv(bare))
    assert len(rows) == 6
    for r in rows:
        assert r["sync_copy_us"] == r["wait_us"] == r["prefetches"] == ""
        assert r["hits"] != ""
    rows = _rows(to_tokens_csv(trace))
    assert all(r["prefetches"] == "0" and r["wait_us"] != "" for r in rows)
