"""Each chat keeps its own sampling settings: shown when it is opened, sampled with, saved
with it in the chat database (so a restart keeps them), and a new chat starts from the
user's defaults (the settings last chosen), or from the loaded model's recommendation
while those follow it. A database from before (schema 2, no settings column) opens with
every chat and message, its chats taking the user's defaults until they are sent to."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFValueType
from gui_helpers import load, send

from moescope.engine import Engine
from moescope.session.store import MIGRATIONS, SCHEMA_VERSION, ChatStore
from moescope_testing.hostile import rewrite_gguf

F32, I32 = GGUFValueType.FLOAT32, GGUFValueType.INT32


@pytest.fixture
def temperatures(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The temperature of every generation the engine ran (on the decode thread)."""
    seen: list[float] = []
    generate = Engine.generate

    def spy(self: Engine, messages: Any, sampling: Any = None, **kw: Any) -> Iterator[Any]:
        seen.append(sampling.temperature)
        yield from generate(self, messages, sampling, **kw)

    monkeypatch.setattr(Engine, "generate", spy)
    return seen


def show(window: Any, chat_id: int) -> None:
    """Open a chat as a click in the chat list does."""
    window.chat_list.chatSelected.emit(chat_id)
    assert window.chat.chat_id == chat_id


def test_two_chats_keep_their_temperatures_across_switching_and_a_restart(
        make_window: Any, qtbot: Any, demo: Path, temperatures: list[float],
        data_dir: Path) -> None:
    w = make_window()
    load(qtbot, w, demo)
    panel = w.chat_settings
    panel.temperature.setValue(0.3)
    send(qtbot, w, "first chat", max_tokens=3)
    a = w.chat.chat_id
    b = w.chat.new_chat()
    assert b != a and panel.temperature.value() == 0.3  # the user's last choice
    panel.temperature.setValue(1.2)
    send(qtbot, w, "second chat", max_tokens=3)
    assert temperatures == [0.3, 1.2]

    show(w, a)
    assert panel.temperature.value() == 0.3
    assert w.chat.regenerate()
    qtbot.waitUntil(lambda: not w.chat.generating, timeout=30_000)
    show(w, b)
    assert panel.temperature.value() == 1.2
    send(qtbot, w, "again", max_tokens=3)
    assert temperatures == [0.3, 1.2, 0.3, 1.2], "each chat samples with its own"
    # opening a chat is not choosing its settings: a new chat starts from the last chosen
    show(w, a)
    c = w.chat.new_chat()
    assert panel.temperature.value() == 1.2
    panel.seed.setValue(77)  # another setting, this chat's only
    show(w, a)
    assert (panel.temperature.value(), panel.seed.value()) == (0.3, -1)
    w.close()

    store = ChatStore(data_dir / "chats.sqlite3", recover=False)  # what is on disk
    try:
        saved = {chat.id: chat.sampling for chat in store.chats()}
    finally:
        store.close()
    assert (saved[a]["temperature"], saved[b]["temperature"]) == (0.3, 1.2)
    assert (saved[c]["temperature"], saved[c]["seed"]) == (1.2, 77)

    again = make_window()  # a restart: the store is opened anew
    panel = again.chat_settings
    load(qtbot, again, demo)
    for chat_id, temperature in ((a, 0.3), (b, 1.2), (a, 0.3)):
        show(again, chat_id)
        assert panel.temperature.value() == temperature
    send(qtbot, again, "after the restart", max_tokens=3)
    show(again, b)
    send(qtbot, again, "and here", max_tokens=3)
    assert temperatures[-2:] == [0.3, 1.2]
    assert again.chat.new_chat() and panel.temperature.value() == 1.2  # defaults kept


def _schema_2_database(path: Path) -> None:
    """A chat database as the MoEScope before per-chat settings wrote it."""
    db = sqlite3.connect(path, isolation_level=None)
    for step in MIGRATIONS[:2]:
        for statement in step:
            db.execute(statement)
    db.execute("PRAGMA user_version=2")
    db.execute("INSERT INTO chats VALUES (1, 'older chat', 'be brief', 'old.gguf', 1, 2)")
    db.execute("INSERT INTO chats VALUES (2, 'oldest chat', '', '', 1, 1)")
    db.execute("INSERT INTO messages VALUES (1, 1, 0, 'user', 'hello', 1, 'done', NULL)")
    db.execute("INSERT INTO messages VALUES (2, 1, 1, 'assistant', 'hi', 2, 'done', "
               "'{\"n_tokens\": 1}')")
    db.execute("INSERT INTO messages VALUES (3, 2, 0, 'user', 'anyone?', 1, 'done', NULL)")
    db.close()


def test_a_database_from_before_opens_whole_and_its_chats_take_the_defaults(
        make_window: Any, qtbot: Any, demo: Path, data_dir: Path,
        temperatures: list[float]) -> None:
    data_dir.mkdir(parents=True)
    path = data_dir / "chats.sqlite3"
    _schema_2_database(path)
    w = make_window()
    assert w.store.schema_version == SCHEMA_VERSION
    assert w.chat_list.titles() == ["older chat", "oldest chat"]
    assert [(m.role, m.content, m.stats) for m in w.store.messages(1)] == [
        ("user", "hello", {}), ("assistant", "hi", {"n_tokens": 1})]
    assert w.chat.chat_id == 1 and w.chat_settings.system_prompt.toPlainText() == "be brief"
    assert w.chat_settings.temperature.value() == 0.7  # none saved: MoEScope's defaults
    assert w.store.chat(1).sampling == {}  # opening it writes nothing
    load(qtbot, w, demo)
    w.chat_settings.temperature.setValue(0.4)  # a change is this chat's, saved with it
    assert w.store.chat(1).sampling["temperature"] == 0.4
    show(w, 2)
    assert w.chat_settings.temperature.value() == 0.4  # the user's defaults now
    send(qtbot, w, "still there?", max_tokens=3)
    assert temperatures == [0.4]
    assert w.store.chat(2).sampling["temperature"] == 0.4  # kept once it was sent to
    assert [m.content for m in w.store.messages(2)][:2] == ["anyone?", "still there?"]


def test_a_chat_that_follows_the_models_recommendation_follows_the_loaded_model(
        make_window: Any, qtbot: Any, tiny_moe: Path, tmp_path: Path) -> None:
    qwen = rewrite_gguf(tiny_moe, tmp_path / "qwen.gguf", set_keys={
        "general.sampling.temp": (F32, 0.6), "general.sampling.top_k": (I32, 20)})
    oss = rewrite_gguf(tiny_moe, tmp_path / "oss.gguf", set_keys={
        "general.sampling.temp": (F32, 1.0)})
    w = make_window()
    panel = w.chat_settings
    load(qtbot, w, qwen)
    following = w.chat.new_chat()
    assert (panel.temperature.value(), panel.top_k.value(), panel.from_model) == (0.6, 20, True)
    assert w.store.chat(following).sampling["from_model"] is True
    own = w.chat.new_chat()
    panel.temperature.setValue(0.25)  # the user's: kept whatever model is loaded
    assert not panel.from_model
    load(qtbot, w, oss)
    assert panel.temperature.value() == 0.25
    show(w, following)
    assert (panel.temperature.value(), panel.top_k.value()) == (1.0, 40)
    show(w, own)
    assert panel.temperature.value() == 0.25 and not panel.from_model
    # the window saved the current chat's change at load: its stored values are shown
    assert w.store.chat(own).sampling["temperature"] == 0.25


def test_a_chats_malformed_settings_give_way_to_the_defaults_one_by_one(
        make_window: Any, data_dir: Path) -> None:
    """Settings written by another tool (or damaged): each entry that is not a usable
    number is the user's default; the others, and the chat, are kept."""
    data_dir.mkdir(parents=True)
    store = ChatStore(data_dir / "chats.sqlite3")
    other = store.create_chat("other", sampling={"temperature": 1.5, "top_k": 5})
    odd = store.create_chat("odd")
    store.add_message(odd.id, "user", "hello")
    store._db.execute("UPDATE chats SET sampling=? WHERE id=?", (
        '{"temperature": "hot", "top_p": NaN, "top_k": 1e400, "seed": 5, '
        '"max_tokens": [3], "thinking": "sideways"}', odd.id))
    store.close()
    w = make_window()
    panel = w.chat_settings
    show(w, other.id)
    assert (panel.temperature.value(), panel.top_k.value()) == (1.5, 5)
    show(w, odd.id)
    assert (panel.temperature.value(), panel.top_p.value(), panel.top_k.value(),
            panel.max_tokens.value(), panel.seed.value()) == (0.7, 0.95, 40, 512, 5)
    assert panel.values()["thinking"] == "default"
    assert "hello" in w.chat_view.text()
