"""A damaged chat database is moved aside under a new name (never over a file), a new one
is started, and the chats it still reads whole are copied over; a database that is merely
unreachable (a permission, a folder in its way) is not taken for a damaged one."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from moescope.session.store import ChatStore, CorruptChatsError, is_corruption
from moescope.session.store_repair import move_aside, open_chat_store

STAMPED = re.compile(r"chats\.sqlite3\.corrupt-\d{8}-\d{6}(-\d+)?")


def _kept_chats(path: Path) -> None:
    """A database with a small chat ("keep me") and a long one whose text fills pages of
    its own (the one damaged in :func:`_damage_long_chat`)."""
    store = ChatStore(path)
    keep = store.create_chat("keep me", sampling={"temperature": 0.35, "seed": 5})
    store.add_message(keep.id, "user", "hello")
    store.add_message(keep.id, "assistant", "hi there")
    long = store.create_chat("long one")
    for i in range(40):
        store.add_message(long.id, "user", f"x{i} " * 3000)
    store.close()


def _damage_long_chat(path: Path) -> None:
    """Overwrite the next-page number of each page holding the long chat's 20th message:
    SQLite's integrity check and any read of that message fail."""
    data = bytearray(path.read_bytes())
    page = 4096
    hit = 0
    for p in range(1, len(data) // page):
        if b"x20 x20" in data[p * page:(p + 1) * page]:
            data[p * page:p * page + 4] = b"\x7f\xff\xff\xff"
            hit += 1
    assert hit
    path.write_bytes(bytes(data))


def test_a_file_that_is_not_a_database_is_moved_aside_and_an_empty_store_starts(
        tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    junk = b"not a database, whatever it was " * 200
    path.write_bytes(junk)
    with pytest.raises(sqlite3.DatabaseError) as caught:
        ChatStore(path)
    assert is_corruption(caught.value)
    opened = open_chat_store(path)
    try:
        assert opened.moved_to is not None and STAMPED.fullmatch(opened.moved_to.name)
        assert opened.moved_to.parent == tmp_path
        assert opened.moved_to.read_bytes() == junk  # nothing lost
        assert opened.store.chats() == [] and opened.salvaged == 0
        chat = opened.store.create_chat("new")  # the new one works
        assert [c.id for c in opened.store.chats()] == [chat.id]
        line = opened.notice()
        assert "\n" not in line and str(opened.moved_to) in line
        assert "file is not a database" in line and "empty chat list" in line
    finally:
        opened.store.close()


def test_a_damaged_database_keeps_its_readable_chats_in_the_new_one(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    _kept_chats(path)
    _damage_long_chat(path)
    damaged = path.read_bytes()
    with pytest.raises(CorruptChatsError, match="integrity check"):
        ChatStore(path)
    opened = open_chat_store(path)
    try:
        assert opened.moved_to is not None and opened.moved_to.read_bytes() == damaged
        chats = opened.store.chats()
        assert [c.title for c in chats] == ["keep me"] and opened.salvaged == 1
        assert chats[0].sampling == {"temperature": 0.35, "seed": 5}  # its settings too
        assert [(m.role, m.content) for m in opened.store.messages(chats[0].id)] == [
            ("user", "hello"), ("assistant", "hi there")]
        assert "1 chat it still held whole is copied" in opened.notice()
    finally:
        opened.store.close()
    # the next start finds a sound database: nothing more is moved
    again = open_chat_store(path)
    try:
        assert again.moved_to is None and again.notice() == ""
        assert [c.title for c in again.store.chats()] == ["keep me"]
    finally:
        again.store.close()
    assert len([p for p in tmp_path.iterdir() if STAMPED.fullmatch(p.name)]) == 1


def test_moving_aside_never_replaces_a_file_and_takes_the_wal_with_it(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    for side, text in (("", "main"), ("-wal", "wal"), ("-shm", "shm")):
        Path(f"{path}{side}").write_text(text)
    taken = tmp_path / "chats.sqlite3.corrupt-20261203-120000"
    taken.write_text("an older damaged file")
    Path(f"{taken}-2-wal").write_text("someone's wal")  # "-2" is taken by its -wal alone
    moved = move_aside(path, stamp="20261203-120000")
    assert moved.name == "chats.sqlite3.corrupt-20261203-120000-3"
    assert taken.read_text() == "an older damaged file"
    assert Path(f"{taken}-2-wal").read_text() == "someone's wal"
    assert [Path(f"{moved}{s}").read_text() for s in ("", "-wal", "-shm")] == [
        "main", "wal", "shm"]
    assert not any(Path(f"{path}{s}").exists() for s in ("", "-wal", "-shm"))


def test_a_database_that_cannot_be_opened_is_not_taken_for_a_damaged_one(
        tmp_path: Path) -> None:
    """A folder where the file should be (as a permission problem, SQLite cannot open it):
    raised as it is, for the window's advice to make it usable; nothing is renamed."""
    path = tmp_path / "chats.sqlite3"
    path.mkdir()
    with pytest.raises(sqlite3.OperationalError) as caught:
        open_chat_store(path)
    assert not is_corruption(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["chats.sqlite3"] and path.is_dir()


def test_without_repair_a_damaged_database_is_raised_and_left_where_it_is(
        tmp_path: Path) -> None:
    """Another MoEScope owns the data folder (and may have the file open): not moved."""
    path = tmp_path / "chats.sqlite3"
    path.write_bytes(b"garbage" * 100)
    with pytest.raises(sqlite3.DatabaseError) as caught:
        open_chat_store(path, repair=False)
    assert is_corruption(caught.value)
    assert [p.name for p in tmp_path.iterdir()] == ["chats.sqlite3"]
