"""The chat database's integrity check at the start is cheap when it can be: after a clean
close (its stamp matches the file) only the header and schema are read; after a crash, a
change from outside (a copy, another program's write, damage), a stamp that does not read,
or damage SQLite reported while the database was in use, the whole file is checked, and a
damaged one is found as before (the move aside and salvage are test_store_repair's)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from moescope.session.store import (
    CHECK_SUFFIX,
    CLEAN_SUFFIX,
    INTERRUPTED,
    ChatStore,
    CorruptChatsError,
)
from moescope.session.store_repair import open_chat_store


def _long_chat(path: Path) -> int:
    """A closed database with a short chat and a long one whose messages fill pages of
    their own; returns the long chat's id."""
    store = ChatStore(path)
    keep = store.create_chat("keep me")
    store.add_message(keep.id, "user", "hello")
    long = store.create_chat("long one")
    for i in range(40):
        store.add_message(long.id, "user", f"x{i} " * 3000)
    store.close()
    return long.id


def _damage(path: Path, marker: bytes = b"x20 x20") -> None:
    """Overwrite the next-page number of each page holding ``marker`` (in place: the same
    file, size and, within a clock tick, the same times)."""
    page = 4096
    with open(path, "r+b") as f:
        data = f.read()
        hit = 0
        for p in range(1, len(data) // page):
            if marker in data[p * page:(p + 1) * page]:
                f.seek(p * page)
                f.write(b"\x7f\xff\xff\xff")
                hit += 1
    assert hit


def _open(path: Path, **kw: object) -> ChatStore:
    store = ChatStore(path, **kw)  # type: ignore[arg-type]
    return store


def test_a_clean_close_lets_the_next_open_skip_the_full_check(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    _long_chat(path)
    assert Path(f"{path}{CLEAN_SUFFIX}").is_file()
    for _ in range(2):
        store = _open(path)
        assert store.checked == "header"
        assert not Path(f"{path}{CLEAN_SUFFIX}").exists()  # taken: a crash leaves none
        store.add_message(store.chats()[0].id, "user", "more")
        store.close()
    store = _open(path)
    assert [m.content for m in store.messages(store.chats()[0].id)][-2:] == ["more", "more"]
    store.close()


def test_damage_right_after_a_clean_close_is_still_found(tmp_path: Path) -> None:
    """In place, at once: same file, same size, and maybe the same clock tick."""
    path = tmp_path / "chats.sqlite3"
    _long_chat(path)
    _damage(path)
    with pytest.raises(CorruptChatsError, match="integrity check"):
        _open(path)


def test_after_a_crash_the_whole_file_is_checked_and_the_answer_recovered(
        tmp_path: Path) -> None:
    """A process that ends without closing (os._exit, as a kill would) leaves no stamp."""
    path = tmp_path / "chats.sqlite3"
    _long_chat(path)
    code = ("import os, sys; from moescope.session.store import ChatStore, GENERATING; "
            "s = ChatStore(sys.argv[1]); c = s.chats()[0]; "
            "s.add_message(c.id, 'assistant', 'half an ans', GENERATING); os._exit(0)")
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, timeout=60,
                   env=dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path)))
    store = _open(path)
    try:
        assert store.checked == "full" and store.recovered == 1
        last = store.messages(store.chats()[0].id)[-1]
        assert (last.content, last.status) == ("half an ans", INTERRUPTED)
    finally:
        store.close()
    again = _open(path)
    assert again.checked == "header"
    again.close()


@pytest.mark.parametrize("stamp", ["", "{", "[]", '{"size": 1}', "null"])
def test_a_stamp_that_does_not_read_or_match_means_the_full_check(
        tmp_path: Path, stamp: str) -> None:
    path = tmp_path / "chats.sqlite3"
    _long_chat(path)
    Path(f"{path}{CLEAN_SUFFIX}").write_text(stamp)
    store = _open(path)
    assert store.checked == "full"
    store.close()


def test_a_file_put_in_its_place_is_checked_fully(tmp_path: Path) -> None:
    """A copy of another (damaged) database restored over it: another inode and times."""
    path = tmp_path / "chats.sqlite3"
    _long_chat(path)
    other = tmp_path / "other.sqlite3"
    _long_chat(other)
    _damage(other)
    shutil.copyfile(other, tmp_path / "copy")
    os.replace(tmp_path / "copy", path)
    with pytest.raises(CorruptChatsError):
        _open(path)


def test_damage_sqlite_reports_in_use_makes_the_next_start_check_fully(
        tmp_path: Path) -> None:
    """The file is damaged while open (after a cheap start): reading the damaged chat
    fails, which leaves the marker; the close then writes no stamp, the next open checks
    the whole file, and the window's opener moves it aside and keeps the sound chat."""
    path = tmp_path / "chats.sqlite3"
    long_id = _long_chat(path)
    store = _open(path)
    assert store.checked == "header"
    _damage(path)
    with pytest.raises(sqlite3.DatabaseError):
        store.messages(long_id)
    assert Path(f"{path}{CHECK_SUFFIX}").is_file()
    store.close()
    assert not Path(f"{path}{CLEAN_SUFFIX}").exists()
    opened = open_chat_store(path)
    try:
        assert opened.store.checked == "full" and opened.moved_to is not None
        assert [c.title for c in opened.store.chats()] == ["keep me"]
    finally:
        opened.store.close()
    assert not Path(f"{path}{CHECK_SUFFIX}").exists()  # the new one passed its check
    again = _open(path)
    assert again.checked == "header"
    again.close()


def test_a_second_connection_leaves_no_stamp_while_the_first_is_open(tmp_path: Path) -> None:
    """Another window beside the owner: its open finds no stamp (the owner took it), and
    its close leaves none while the owner's connection (and the -wal) is still there."""
    path = tmp_path / "chats.sqlite3"
    _long_chat(path)
    owner = _open(path)
    beside = _open(path, recover=False)
    assert (owner.checked, beside.checked) == ("header", "full")
    beside.close()
    assert not Path(f"{path}{CLEAN_SUFFIX}").exists()
    owner.close()
    assert Path(f"{path}{CLEAN_SUFFIX}").is_file()
