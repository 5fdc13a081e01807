"""File names near the file system's limit (255 bytes), found by the second hostile-input
campaign: valid names that the temporary beside them (``.NAME.XXXXXXXX.part``) or the
journal beside them (``NAME.journal.arrows``) pushed past it. A valid output name is
written; a trace name whose journal cannot exist is refused before anything is loaded; a
name too long to exist is "no such file", never an ENAMETOOLONG traceback."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.cli.commands.generate import write_error
from moescope.trace import TraceFormatError
from moescope.trace.names import journal_path, live_trace_file
from moescope.trace.parquet_format import check_journal_free
from moescope.util.files import LONGEST_PATH, NAME_MAX, OutputPathError, temp_prefix, write_atomic
from moescope.util.resources import demo_model_path
from moescope_testing.traces import core_trace


def _name(n_bytes: int, suffix: str, fill: str = "a") -> str:
    """A name of exactly ``n_bytes`` bytes ending in ``suffix``."""
    width = len(fill.encode())
    body = n_bytes - len(suffix.encode())
    return "a" * (body % width) + fill * (body // width) + suffix


@pytest.mark.parametrize("fill", ["a", "é", "€"])
@pytest.mark.parametrize("n_bytes", [240, 241, 254, 255])
def test_an_output_with_a_long_valid_name_is_written(tmp_path: Path, n_bytes: int,
                                                     fill: str) -> None:
    dest = tmp_path / _name(n_bytes, ".csv", fill)
    write_atomic(dest, "a,b\n")
    assert dest.read_text() == "a,b\n"
    assert os.listdir(tmp_path) == [dest.name]  # no temporary left
    write_atomic(dest, "c,d\n")  # and replaced whole, as any output
    assert dest.read_text() == "c,d\n"


def test_the_temporarys_prefix_fits_and_keeps_short_names_as_they_were() -> None:
    assert temp_prefix("out.csv") == ".out.csv."
    for name in (_name(255, ".csv"), _name(255, ".csv", "é"), os.fsdecode(b"\xff" * 255)):
        assert len(os.fsencode(temp_prefix(name))) + 8 + len(".part") <= NAME_MAX
        os.fsencode(temp_prefix(name))  # a whole character, or a raw byte, not half one


def test_replay_writes_its_table_to_a_long_valid_name(tmp_path: Path) -> None:
    trace = core_trace(tmp_path / "t.jsonl")
    dest = tmp_path / _name(254, ".csv")
    assert main(["replay", str(trace), "--policy", "exact", "--csv", str(dest)]) == 0
    assert dest.read_text().startswith("policy,")


def test_a_missing_trace_whose_journal_name_is_too_long_is_no_such_file(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``replay`` looks for a killed session's journal beside a missing ``.parquet``: with
    a 250-byte name the journal's name is too long, and the look was a traceback."""
    missing = tmp_path / _name(250, ".parquet")
    assert main(["replay", str(missing)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moescope: error: ") and "no such trace file" in err \
        and err.count("\n") == 1, err
    assert live_trace_file(missing) == missing  # the window's look, the same


@pytest.mark.parametrize("n_bytes", [241, 255])
def test_a_parquet_name_with_no_room_for_its_journal_is_refused_first(
        tmp_path: Path, n_bytes: int) -> None:
    """Recording ``NAME.parquet`` writes ``NAME.parquet.journal.arrows`` first: the model
    was loaded, then the journal failed as "cannot write (cannot write (File name too
    long))"; now the name is refused, in words, before anything is loaded."""
    path = tmp_path / _name(n_bytes, ".parquet")
    with pytest.raises(TraceFormatError, match="too long to record to: its journal") as err:
        check_journal_free(path)
    assert "\n" not in str(err.value)
    check_journal_free(tmp_path / _name(NAME_MAX - len(".journal.arrows"), ".parquet"))
    assert len(journal_path(_name(NAME_MAX - 15, ".parquet")).name.encode()) == NAME_MAX


def _path_near_the_limit(tmp_path: Path, name: str) -> Path:
    """``FOLDER/name`` of exactly :data:`LONGEST_PATH` bytes, its folders made: the path
    opens, a probe file beside it fits, but ``name`` + ``.journal.arrows`` does not."""
    folder = str(tmp_path)
    width = LONGEST_PATH - len(os.fsencode(name)) - 1
    while len(folder) < width - 201:
        folder = os.path.join(folder, "d" * 200)
    folder = os.path.join(folder, "e" * (width - len(folder) - 1))
    os.makedirs(folder)
    path = os.path.join(folder, name)
    assert len(os.fsencode(path)) == LONGEST_PATH
    return Path(path)


def test_a_parquet_path_with_no_room_for_its_journal_is_refused_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A 4095-byte ``--trace X.parquet`` path: the model loaded, then its journal (15
    bytes longer than the longest path) failed as "cannot write (cannot write (File name
    too long))". Now refused in one line before the model is read (it does not exist)."""
    path = _path_near_the_limit(tmp_path, "t" * 21 + ".parquet")
    with pytest.raises(TraceFormatError, match="path is too long to record to: its journal"):
        check_journal_free(path)
    model = demo_model_path()
    assert model is not None
    for argv in (["generate", str(tmp_path / "never-read.gguf"), "--trace", str(path)],
                 ["generate", str(model), "-p", "hi", "-n", "1", "--trace", str(path)]):
        assert main(argv) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1, err
        assert err == (f"moescope: error: {path}: the path is too long to record to: its "
                       f"journal (.journal.arrows added) would be over {LONGEST_PATH} "
                       "bytes; give a shorter path\n")
    assert not any(p.is_file() for p in tmp_path.rglob("*"))  # nothing was made


def test_a_write_error_says_cannot_write_once(tmp_path: Path) -> None:
    """``open_trace`` wrapped the writer's own "cannot write (...)" in another one."""
    dest = tmp_path / "t.parquet"
    journal = tmp_path / "t.parquet.journal.arrows"
    cases = [
        (OutputPathError(errno.ENAMETOOLONG, "cannot write (File name too long)", str(dest)),
         f"--trace {dest}: cannot write (File name too long)"),
        (OutputPathError(errno.EACCES, "cannot write in folder /x", str(journal)),
         f"--trace {dest}: {journal}: cannot write in folder /x"),
        (OSError(errno.ENOSPC, "No space left on device"),
         f"--trace {dest}: cannot write (No space left on device)"),
        (OSError(f"{journal}: another MoEScope window took this new journal"),
         f"--trace {dest}: {journal}: another MoEScope window took this new journal"),
    ]
    for err, says in cases:
        assert str(write_error("--trace", dest, err)) == says
        assert str(write_error("--trace", dest, err)).count("cannot write") <= 1
