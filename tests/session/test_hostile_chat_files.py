"""Hostile chat files, found by the second hostile-input campaign: a chat export (File ▸
Import chat) and the chat database itself are read as untrusted bytes. Each refusal is one
``ChatImportError`` line, and an odd value is dropped, never raised on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from moescope.session.chat_import import ChatImportError, read_chat_file
from moescope.session.store import ChatStore

HUGE_INT = "9" * 400
"""An integer JSON parses (Python's limit is 4300 digits) that no float holds:
``math.isfinite`` on it raised ``OverflowError``."""


def _export(tmp_path: Path, stats_text: str) -> Path:
    path = tmp_path / "chat.json"
    path.write_text('{"title": "t", "messages": [{"role": "user", "content": "hi"}, '
                    '{"role": "assistant", "content": "hello", "stats": ' + stats_text
                    + "}]}")
    return path


@pytest.mark.parametrize("value", [HUGE_INT, "-" + HUGE_INT, "1" + "0" * 16])
def test_an_integer_stat_beyond_any_float_is_dropped(tmp_path: Path, value: str) -> None:
    chat = read_chat_file(_export(tmp_path, '{"n_tokens": 3, "hit_rate": ' + value + "}"))
    assert chat.messages[1].stats == {"n_tokens": 3}


def test_a_bounded_integer_stat_is_kept_as_it_was(tmp_path: Path) -> None:
    chat = read_chat_file(_export(tmp_path, '{"n_tokens": 1000000000000000, "x": -7}'))
    assert chat.messages[1].stats == {"n_tokens": 10**15, "x": -7}


def test_an_integer_past_pythons_digit_limit_is_one_line(tmp_path: Path) -> None:
    with pytest.raises(ChatImportError, match="not a chat export") as err:
        read_chat_file(_export(tmp_path, '{"n_tokens": ' + "9" * 5000 + "}"))
    assert "\n" not in str(err.value)


@pytest.mark.parametrize("stored", ["{", "5", "[1, 2]", "null", '"text"', "[" * 100_000])
def test_a_damaged_stats_cell_loses_its_stats_not_the_chat(tmp_path: Path,
                                                           stored: str) -> None:
    """A database written by another tool (or damaged) with stats that are not a JSON
    object: ``messages`` raised JSONDecodeError (or returned a non-dict that the answer
    line then called ``.get`` on), so the whole chat could not be opened."""
    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat("t")
    store.add_message(chat.id, "user", "hi")
    answer = store.add_message(chat.id, "assistant", "hello")
    store.finish_message(answer.id, "done", {"n_tokens": 3})
    store._db.execute("UPDATE messages SET stats=? WHERE id=?", (stored, answer.id))
    messages = store.messages(chat.id)
    assert [m.content for m in messages] == ["hi", "hello"]
    assert messages[1].stats == {}
    assert json.loads(store.export_json(chat.id))["messages"][1]["content"] == "hello"
    store.close()


def test_bytes_stored_as_a_message_are_shown_as_text(tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.sqlite")
    chat = store.create_chat("t")
    m = store.add_message(chat.id, "user", "hi")
    store._db.execute("UPDATE messages SET content=? WHERE id=?", (b"caf\xc3\xa9 \xff", m.id))
    assert store.messages(chat.id)[0].content == "café \ufffd"
    assert "café" in store.export_markdown(chat.id)
    store.close()
