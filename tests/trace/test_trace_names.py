"""Trace file names (moescope.trace.names): the app records in ``RECORD_SUFFIX`` and finds
every trace the reader opens by its name; a finished-at-close form's journal is one session
with it."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.trace import RECORD_SUFFIX, TRACE_SUFFIXES, read_trace
from moescope.trace.names import (
    FORMAT_NAMES,
    dialog_filter,
    formats_help,
    journal_path,
    live_trace_file,
    session_stem,
    trace_suffix,
    with_trace_suffix,
)


def test_every_suffix_has_words_and_the_recorded_one_is_among_them() -> None:
    assert RECORD_SUFFIX in TRACE_SUFFIXES
    assert set(FORMAT_NAMES) == set(TRACE_SUFFIXES)
    assert all(f"*{s}" in dialog_filter() and s in formats_help() for s in TRACE_SUFFIXES)


@pytest.mark.parametrize(("name", "suffix", "stem"), [
    ("a.arrows", ".arrows", "a"),
    ("a.parquet", ".parquet", "a"),
    ("a.jsonl", ".jsonl", "a"),
    ("a.jsonl.gz", ".jsonl.gz", "a"),  # the longest suffix, not .gz's
    ("20200101-000000-qwen2.5-moe.arrows", ".arrows", "20200101-000000-qwen2.5-moe"),
    ("a.parquet.journal.arrows", ".arrows", "a"),  # the journal: its session is a's
    ("a.journal.arrows", ".arrows", "a.journal"),  # no finished form named: a plain trace
    (".a.parquet.k2x_9q0z.part", None, "a"),  # a compaction cut off: its session's
    (".a.jsonl.gz.k2x_9q0z.part", None, "a"),
    (".a.perfetto.json.k2x_9q0z.part", None, None),  # an export's: not a trace
    (".a.parquet.part", None, None),
    ("..a.parquet.x.part", None, None),
    ("a.perfetto.json", None, None),
    ("a.tokens.csv", None, None),
    ("a.gz", None, None),
    (".arrows", None, None),
    ("notes.txt", None, None),
])
def test_names_are_read_by_their_longest_trace_suffix(name: str, suffix: str | None,
                                                      stem: str | None) -> None:
    assert trace_suffix(name) == suffix
    assert session_stem(name) == stem


def test_an_export_name_says_the_format_it_holds(tmp_path: Path) -> None:
    assert with_trace_suffix(tmp_path / "a.jsonl", ".arrows") == tmp_path / "a.arrows"
    assert with_trace_suffix(tmp_path / "a.jsonl.gz", ".arrows") == tmp_path / "a.arrows"
    assert with_trace_suffix(tmp_path / "a", ".parquet") == tmp_path / "a.parquet"
    assert with_trace_suffix(tmp_path / "run.v2", ".arrows") == tmp_path / "run.v2.arrows"
    assert with_trace_suffix(tmp_path / "a.arrows", ".jsonl.gz") == tmp_path / "a.jsonl.gz"


def test_the_live_file_is_the_trace_or_else_its_journal(
        tmp_path: Path, record: Callable[..., Path]) -> None:
    final = tmp_path / "s.parquet"
    journal = journal_path(final)
    assert journal == tmp_path / "s.parquet.journal.arrows"
    assert live_trace_file(final) == final  # neither: the name asked for
    stream = record("qwen3moe", name="live.arrows", tokens=6)
    journal.write_bytes(stream.read_bytes())
    assert live_trace_file(final) == journal
    assert len(read_trace(live_trace_file(final)).tokens) > 0  # a journal reads as a trace
    final.write_bytes(b"")
    assert live_trace_file(final) == final


@pytest.mark.parametrize("command", ["chat", "generate", "replay"])
def test_the_command_line_names_every_trace_format(command: str,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.cli import main

    assert main([command, "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps the help
    assert all(s in text for s in TRACE_SUFFIXES) and "FILE.jsonl" not in text
