"""A chat database this MoEScope must not open (a newer schema, a negative one) is refused
as a database error in words, and left as it was: the window's start said it with a
RuntimeError traceback, and a negative ``user_version`` ran ``MIGRATIONS[-1]`` on it."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from moescope.session.store import SCHEMA_VERSION, ChatStore


def _database(path: Path, version: int) -> Path:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE keep (x)")
    db.execute("INSERT INTO keep VALUES (42)")
    db.execute(f"PRAGMA user_version={version}")
    db.commit()
    db.close()
    return path


@pytest.mark.parametrize("version,words", [(SCHEMA_VERSION + 97, "written by a newer MoEScope"),
                                           (-1, "not a MoEScope chat database"),
                                           (-2**31, "not a MoEScope chat database")])
def test_a_schema_this_version_cannot_read_is_a_database_error_and_nothing_changes(
        tmp_path: Path, version: int, words: str) -> None:
    path = _database(tmp_path / "chats.sqlite3", version)
    with pytest.raises(sqlite3.DatabaseError, match=words):
        ChatStore(path)
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == version
    tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    assert tables == {"keep"}  # no migration ran
    db.close()


def test_the_window_started_on_a_newer_database_says_one_line(tmp_path: Path) -> None:
    """``moescope`` (the window) on a data folder whose chats a newer MoEScope wrote: one
    line on stderr (then the same words in a dialog, which waits for its OK: the process
    is ended once the line is read)."""
    data = tmp_path / "data"
    data.mkdir()
    _database(data / "chats.sqlite3", SCHEMA_VERSION + 1)
    env = dict(os.environ, MOESCOPE_DATA_DIR=str(data), QT_QPA_PLATFORM="offscreen",
               PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen([sys.executable, "-m", "moescope"], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        assert proc.stderr is not None
        seen = []
        for line in proc.stderr:  # ends when the process does (a traceback)
            seen.append(line)
            if line.startswith("moescope: error:"):
                break
    finally:
        proc.kill()
        proc.wait()
    text = "".join(seen)
    assert "Traceback" not in text and seen, text
    assert seen[-1].startswith("moescope: error:") and "written by a newer MoEScope" in seen[-1]
    # nothing to make writable: it is the database, not the folder's permissions
    assert "Make it writable" not in seen[-1] and "left as it is" in seen[-1]
