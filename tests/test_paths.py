"""Where the app keeps its files: the folders the environment names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from moescope.util import paths


def test_a_data_folder_given_with_a_tilde_is_in_the_home_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``MOESCOPE_DATA_DIR=~/profile`` where no shell expands it (a launcher's Exec= line,
    a service file) made a folder named "~" in the working folder; the models folder's
    variable was expanded already."""
    home = tmp_path / "home"
    work = tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("USERPROFILE", str(home))
    monkeypatch.chdir(work)
    monkeypatch.setenv(paths.ENV_DATA_DIR, "~/profile")
    monkeypatch.setenv(paths.ENV_MODELS_DIR, "~/models")
    assert paths.data_dir() == home / "profile" and (home / "profile").is_dir()
    assert paths.chats_db_path() == home / "profile" / "chats.sqlite3"
    assert paths.models_dir() == home / "models"
    assert not (work / "~").exists()


def test_a_data_folder_that_cannot_be_made_is_one_sentence_and_still_an_oserror(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``MOESCOPE_DATA_DIR`` under a file (or ``/proc/x``): ``data_dir()`` raised a bare
    NotADirectoryError, a traceback in ``calibrate``, ``pull`` and ``replay --cost-model
    calibrated``. It is still an OSError (the window words those), and a MoEScopeError
    whose one line names the folder and the variable."""
    from moescope.util.errors import MoEScopeError

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv(paths.ENV_DATA_DIR, str(blocker / "data"))
    with pytest.raises(OSError) as caught:
        paths.data_dir()
    err = caught.value
    assert isinstance(err, MoEScopeError) and err.filename == str(blocker / "data")
    assert str(err) == (f"the data folder {blocker / 'data'} cannot be made (Not a "
                        "directory); set MOESCOPE_DATA_DIR to a folder you can write to")


def test_commands_on_a_data_folder_that_cannot_be_made_say_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record: Any,
        capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.cli import main

    trace = str(record("qwen3moe", tokens=8))
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"x" * (3 << 20))
    monkeypatch.setenv(paths.ENV_DATA_DIR, str(blob / "data"))
    for argv in (["replay", trace, "--policy", "exact", "--cost-model", "calibrated"],
                 ["calibrate", str(blob), "--reads", "2", "--block-mib", "1"]):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("moescope: error: "), err
        assert str(blob / "data") in err
