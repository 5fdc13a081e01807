"""A trace is recorded in the format its name ends with, in any letter case, and a name
with no trace suffix is refused: ``--trace x.PARQUET`` and ``--trace x.txt`` both used to
record JSON Lines without a word."""

from __future__ import annotations

from pathlib import Path

import pytest
from trace_helpers import psr_header

from moescope.cli import main
from moescope.trace import TRACE_SUFFIXES, read_trace
from moescope.trace.names import record_suffix
from moescope.trace.schema import TraceFormatError
from moescope.trace.writer import open_writer
from moescope_testing.traces import core_trace

MAGIC = {".parquet": b"PAR1", ".arrows": b"\xff\xff\xff\xff", ".jsonl": b'{"type"',
         ".jsonl.gz": b"\x1f\x8b"}
"""How each format's file begins (an Arrow stream with its continuation marker)."""


@pytest.mark.parametrize("suffix", [s.upper() for s in TRACE_SUFFIXES]
                         + [".Parquet", ".Arrows", ".JSONL.gz"])
def test_a_suffix_in_capitals_records_its_format(tmp_path: Path, suffix: str) -> None:
    path = core_trace(tmp_path / f"t{suffix}", n_tokens=4)
    known = record_suffix(path)
    assert known == suffix.lower()
    assert path.read_bytes().startswith(MAGIC[known])
    assert len(read_trace(path).tokens) == 4
    assert sorted(p.name for p in tmp_path.iterdir()) == [path.name]  # no journal left


@pytest.mark.parametrize("name", ["t.txt", "t.json", "t.gz", "t", "t.parquet.bak",
                                  ".parquet"])
def test_a_name_with_no_trace_suffix_is_refused_and_nothing_is_made(tmp_path: Path,
                                                                    name: str) -> None:
    with pytest.raises(TraceFormatError) as err:
        open_writer(tmp_path / name, psr_header())
    assert str(err.value).count("\n") == 0 and all(s in str(err.value)
                                                   for s in TRACE_SUFFIXES)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("name", ["x.txt", "x"])
def test_the_cli_refuses_an_unknown_trace_suffix_before_loading(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, name: str) -> None:
    code = main([command, str(tmp_path / "never-read.gguf"), "--trace",
                 str(tmp_path / name)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and err.count("\n") == 1
    assert err.startswith(f"moescope: error: --trace {tmp_path / name}: ")
    assert ".arrows, .parquet, .jsonl, .jsonl.gz" in err
    assert list(tmp_path.iterdir()) == []


def test_the_cli_refuses_a_capitalised_parquet_whose_journal_is_there(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    journal = tmp_path / "x.PARQUET.journal.arrows"
    journal.write_bytes(b"a killed session's tokens")
    code = main(["generate", str(tmp_path / "never-read.gguf"), "--trace",
                 str(tmp_path / "x.PARQUET")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "a trace journal is already there" in err
    assert journal.read_bytes() == b"a killed session's tokens"


@pytest.mark.engine
def test_generate_records_parquet_for_a_capitalised_name(
        tiny_moe: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run.PARQUET"
    assert main(["generate", str(tiny_moe), "-n", "4", "--trace", str(out)]) == 0
    capsys.readouterr()
    assert out.read_bytes().startswith(b"PAR1")
    assert len(read_trace(out).tokens) >= 1
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]
