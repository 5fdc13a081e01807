"""A trace recorded over a model whose file name is not UTF-8 (byte 0xff; Python holds it
as a lone surrogate) writes, reads back and replays in every format: the header keeps the
name with the byte written ``\\xff``, as the server's model id does. JSON Lines recording
raised UnicodeEncodeError, and the Arrow header's JSON ``\\udcff`` broke the replay's
Perfetto and JSON exports."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.trace import TRACE_SUFFIXES, read_trace
from moescope.util.resources import demo_model_path
from moescope.util.words import utf8_name

pytestmark = pytest.mark.engine

ESCAPED = "demo-\\xff.gguf"
"""The name as the trace keeps it: a backslash, then ``xff``."""


@pytest.fixture(scope="module")
def odd_copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("odd-trace") / os.fsdecode(b"demo-\xff.gguf")
    shutil.copyfile(demo_model_path(), path)
    return path


def test_the_escape_is_utf8_text() -> None:
    """One escape (util.words.utf8_name) for the trace, the server's model id and the
    window's titles."""
    for raw in (b"demo-\xff.gguf", b"caf\xc3\xa9.gguf", b"plain.gguf", b"\xfe\xff-\xc3"):
        name = os.fsdecode(raw)
        utf8_name(name).encode("utf-8")  # strict: UTF-8 text
    assert utf8_name(os.fsdecode(b"caf\xc3\xa9.gguf")) == "café.gguf"
    assert utf8_name("lone-\ud800") == "lone-\\ud800"  # a surrogate no byte gives


def _replays(path: Path, tmp_path: Path) -> None:
    """``moescope replay`` over ``path`` with every export, each naming the model."""
    perfetto, table, tokens = (tmp_path / "p.json", tmp_path / "r.json", tmp_path / "t.csv")
    assert main(["replay", str(path), "--perfetto", str(perfetto), "--json", str(table),
                 "--tokens-csv", str(tokens)]) == 0
    exported = json.loads(perfetto.read_text(encoding="utf-8"))
    assert exported["otherData"]["model"] == ESCAPED
    assert json.loads(table.read_text(encoding="utf-8"))
    assert tokens.read_text(encoding="utf-8").count("\n") >= 2


@pytest.mark.parametrize("suffix", TRACE_SUFFIXES)
def test_generate_records_and_replays_it_in_every_format(
        odd_copy: Path, tmp_path: Path, suffix: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / f"run{suffix}"
    code = main(["generate", str(odd_copy), "-n", "4", "--policy", "quality-first",
                 "--trace", str(out)])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == [out.name]  # no journal left
    trace = read_trace(out)
    assert trace.header.model.file_name == ESCAPED
    assert trace.end is not None and len(trace.tokens) >= 4
    _replays(out, tmp_path)
    capsys.readouterr()


def test_chat_records_it(odd_copy: Path, tmp_path: Path) -> None:
    """In its own process: the chat's first line names the model on standard error, whose
    ``backslashreplace`` a terminal has and pytest's capture has not."""
    out = tmp_path / "chat.parquet"
    done = subprocess.run(
        [sys.executable, "-m", "moescope", "chat", os.fsencode(odd_copy), "--n", "3",
         "--threads", "1", "--trace", str(out)],
        input=b"Hello there\n", capture_output=True, timeout=300,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr.decode(errors="replace")
    assert b"demo-\\xff.gguf" in done.stderr  # the chat's own line, escaped
    assert read_trace(out).header.model.file_name == ESCAPED


def test_a_trace_holding_the_surrogate_reads_back_escaped(
        odd_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """An Arrow trace recorded before the fix held the name as JSON's ``\\udcff`` (the
    header's JSON is ASCII): read, it is escaped as a new one is, and replays."""
    out = tmp_path / "old.jsonl"
    assert main(["generate", str(odd_copy), "-n", "3", "--trace", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    assert text.count(json.dumps(ESCAPED)) == 1
    out.write_text(text.replace(json.dumps(ESCAPED), '"demo-\\udcff.gguf"'),
                   encoding="utf-8")
    assert read_trace(out).header.model.file_name == ESCAPED
    _replays(out, tmp_path)
    capsys.readouterr()


def test_a_stream_so_recorded_compacts(odd_copy: Path, tmp_path: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    stream = tmp_path / "run.arrows"
    assert main(["generate", str(odd_copy), "-n", "3", "--trace", str(stream)]) == 0
    out = tmp_path / "run.parquet"
    assert main(["trace", "compact", "--keep", str(stream), str(out)]) == 0
    assert read_trace(out).header.model.file_name == ESCAPED
    _replays(out, tmp_path)
    capsys.readouterr()
