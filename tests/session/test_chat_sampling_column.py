"""Schema 3 keeps each chat's sampling settings (a JSON object in ``chats.sampling``): a
schema-2 database opens in place with every chat, message and stat as it was, its chats
with no settings saved; saved settings survive a reopen and a branch; a cell that is not
a JSON object reads as none, not as an unopenable chat."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from moescope.session.store import MIGRATIONS, SCHEMA_VERSION, ChatStore

SETTINGS = {"temperature": 0.3, "top_p": 0.9, "top_k": 20, "max_tokens": 64, "seed": 7,
            "thinking": "off", "from_model": False}


def _schema_2(path: Path) -> None:
    db = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:2]:
        for statement in step:
            db.execute(statement)
    db.execute("PRAGMA user_version=2")
    db.execute("INSERT INTO chats VALUES (1, 'a', 'sys', 'm.gguf', 1.5, 2.5)")
    db.execute("INSERT INTO messages VALUES (1, 1, 0, 'user', 'hello', 1.5, 'done', NULL)")
    db.execute("INSERT INTO messages VALUES (2, 1, 1, 'assistant', 'hi', 2.0, 'generating', "
               "'{\"n_tokens\": 2}')")
    db.close()


def _rows(path: Path, table: str) -> list[tuple[object, ...]]:
    db = sqlite3.connect(path)
    try:
        return db.execute(f"SELECT * FROM {table} ORDER BY id").fetchall()
    finally:
        db.close()


def test_a_schema_2_database_migrates_in_place_and_loses_nothing(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    _schema_2(path)
    chats, messages = _rows(path, "chats"), _rows(path, "messages")
    store = ChatStore(path, recover=False)
    try:
        assert store.schema_version == SCHEMA_VERSION >= 3
        (chat,) = store.chats()
        assert (chat.title, chat.system_prompt, chat.model, chat.sampling) == \
            ("a", "sys", "m.gguf", {})
        assert [(m.content, m.status, m.stats) for m in store.messages(1)] == [
            ("hello", "done", {}), ("hi", "generating", {"n_tokens": 2})]
    finally:
        store.close()
    # every old column of every row as it was; the new column empty
    assert [r[:6] for r in _rows(path, "chats")] == chats
    assert [r[-1] for r in _rows(path, "chats")] == [None]
    assert _rows(path, "messages") == messages


def test_settings_survive_a_reopen_and_go_with_a_branch(tmp_path: Path) -> None:
    path = tmp_path / "chats.sqlite3"
    store = ChatStore(path)
    chat = store.create_chat("t", sampling={"temperature": 1.1})
    plain = store.create_chat("none")
    store.add_message(chat.id, "user", "hi")
    store.set_sampling(chat.id, SETTINGS)
    store.close()
    store = ChatStore(path)
    try:
        assert store.chat(chat.id).sampling == SETTINGS  # type: ignore[union-attr]
        assert store.chat(plain.id).sampling == {}  # type: ignore[union-attr]
        branch = store.branch_chat(chat.id, 0, "b")
        assert store.chat(branch.id).sampling == SETTINGS  # type: ignore[union-attr]
        assert {c.id: c.sampling for c in store.chats()}[chat.id] == SETTINGS
    finally:
        store.close()


@pytest.mark.parametrize("stored", ["{", "5", "[1, 2]", "null", '"text"', "[" * 100_000,
                                    b"\xff\xfe"])
def test_a_damaged_settings_cell_reads_as_none(tmp_path: Path, stored: object) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3")
    try:
        chat = store.create_chat("t", sampling=SETTINGS)
        store.add_message(chat.id, "user", "kept")
        store._db.execute("UPDATE chats SET sampling=? WHERE id=?", (stored, chat.id))
        assert store.chat(chat.id).sampling == {}  # type: ignore[union-attr]
        assert [c.title for c in store.chats()] == ["t"]
        assert [m.content for m in store.messages(chat.id)] == ["kept"]
    finally:
        store.close()


def test_a_damaged_schema_2_database_is_salvaged_without_settings(tmp_path: Path) -> None:
    """The salvage reads an old file too: its chats come over with no settings saved."""
    from moescope.session.store_repair import open_chat_store

    path = tmp_path / "chats.sqlite3"
    _schema_2(path)
    db = sqlite3.connect(path, isolation_level=None)
    db.execute("INSERT INTO chats VALUES (2, 'long', '', '', 3, 3)")
    db.executemany("INSERT INTO messages VALUES (?, 2, ?, 'user', ?, 3, 'done', NULL)",
                   [(10 + i, i, f"x{i} " * 3000) for i in range(40)])
    db.close()
    data = bytearray(path.read_bytes())
    for p in range(1, len(data) // 4096):  # break the long chat's 20th message
        if b"x20 x20" in data[p * 4096:(p + 1) * 4096]:
            data[p * 4096:p * 4096 + 4] = b"\x7f\xff\xff\xff"
    path.write_bytes(bytes(data))
    opened = open_chat_store(path)
    try:
        assert opened.moved_to is not None and opened.salvaged == 1
        (chat,) = opened.store.chats()
        assert (chat.title, chat.system_prompt, chat.sampling) == ("a", "sys", {})
        assert [m.content for m in opened.store.messages(chat.id)] == ["hello", "hi"]
    finally:
        opened.store.close()
