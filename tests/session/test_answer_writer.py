"""The decode thread's connection to the chat database (``AnswerWriter``): each token is
committed at once, seen by the window's connection, and it never creates a database or
marks the answer being written as interrupted (as opening a second ChatStore would)."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest

from moescope.session.store import GENERATING, AnswerWriter, ChatStore


def test_each_token_is_committed_and_the_answer_stays_generating(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = store.create_chat("c")
    answer = store.add_message(chat.id, "assistant", "<think>\n", GENERATING)
    seen: list[str] = []

    def decode() -> None:  # sqlite connections belong to their thread: opened here
        writer, reader = AnswerWriter(store.path), sqlite3.connect(store.path)
        for text in ("Hel", "lo", " there"):
            writer.append(answer.id, text)
            seen.append(reader.execute("SELECT content FROM messages WHERE id=?",
                                       (answer.id,)).fetchone()[0])
        writer.close()
        reader.close()

    thread = threading.Thread(target=decode)
    thread.start()
    thread.join()
    assert seen == ["<think>\nHel", "<think>\nHello", "<think>\nHello there"]
    (message,) = store.messages(chat.id)
    assert message.content == "<think>\nHello there" and message.status == GENERATING
    store.close()


def test_it_opens_only_an_existing_database(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no chat database"):
        AnswerWriter(tmp_path / "missing.sqlite3")
    with pytest.raises(FileNotFoundError):
        AnswerWriter(tmp_path)  # a directory
    assert list(tmp_path.iterdir()) == []


def test_a_full_database_refuses_the_token_and_keeps_the_answer(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = store.create_chat("c")
    answer = store.add_message(chat.id, "assistant", "", GENERATING)
    writer = AnswerWriter(store.path)
    pages = writer._db.execute("PRAGMA page_count").fetchone()[0]
    writer._db.execute(f"PRAGMA max_page_count = {pages}")
    written = ""
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for _ in range(2000):
            writer.append(answer.id, "x" * 64)
            written += "x" * 64
    assert store.messages(chat.id)[0].content == written
    writer.close()
    store.close()


def test_a_store_opened_beside_a_live_writer_without_recovery_leaves_its_answer(
        tmp_path: Path) -> None:
    """A second window opened anyway on the same data folder (it does not hold the
    folder's lock) must not mark the first window's answer as cut off by a crash; the
    window that owns the folder recovers a dead one's."""
    from moescope.session.store import INTERRUPTED

    first = ChatStore(tmp_path / "chats.sqlite3")
    chat = first.create_chat("c")
    answer = first.add_message(chat.id, "assistant", "so far", GENERATING)
    writer = AnswerWriter(first.path)
    second = ChatStore(first.path, recover=False)
    writer.append(answer.id, " and more")
    assert second.recovered == 0
    assert second.messages(chat.id)[-1].status == GENERATING
    assert first.messages(chat.id)[-1].content == "so far and more"
    writer.close()
    second.close()
    first.close()
    owner = ChatStore(tmp_path / "chats.sqlite3")  # the first window was killed meanwhile
    assert owner.recovered == 1 and owner.messages(chat.id)[-1].status == INTERRUPTED
    owner.close()
