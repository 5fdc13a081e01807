"""Where the app keeps its files: the folders the environment names."""

from __future__ import annotations

from pathlib import Path

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
