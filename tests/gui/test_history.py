"""Chat history: several chats, persistence across restarts and kills, export, migrations."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from gui_helpers import load, send

from moescope.session.store import DONE, INTERRUPTED, SCHEMA_VERSION, ChatStore

HERE = Path(__file__).parent
CHILD_TIMEOUT_S = 90


def test_history_and_settings_survive_a_restart(make_window: Any, qtbot: Any,
                                                  tiny_moe: Path) -> None:
    first = make_window()
    load(qtbot, first, tiny_moe)
    first.chat_settings.temperature.setValue(0.3)
    send(qtbot, first, "remember me", max_tokens=6)
    chat_id = first.chat.chat_id
    before = [(m.role, m.content) for m in first.store.messages(chat_id)]
    first.close()

    second = make_window()
    assert second.chat.chat_id == chat_id
    assert second.chat_list.titles() == ["remember me"]
    assert [(m.role, m.content) for m in second.store.messages(chat_id)] == before
    assert "remember me" in second.chat_view.text()
    assert second.chat_settings.temperature.value() == 0.3
    assert second.recent_models() == [str(tiny_moe)]
    assert second.settings.value("last_model") == str(tiny_moe)


def test_killed_process_loses_at_most_the_answer_in_flight(data_dir: Path,
                                                           tiny_moe: Path) -> None:
    env = dict(os.environ, MOESCOPE_DATA_DIR=str(data_dir), QT_QPA_PLATFORM="offscreen")
    child = subprocess.Popen([sys.executable, str(HERE / "kill_target.py"), str(tiny_moe)],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                             text=True)
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], CHILD_TIMEOUT_S)
        line = child.stdout.readline() if ready else ""
        assert line, "the child did not start streaming"
        report = json.loads(line)
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    store = ChatStore(data_dir / "chats.sqlite3")
    assert store.recovered == 1
    (chat,) = store.chats()
    messages = store.messages(chat.id)
    assert [(m.role, m.status) for m in messages] == [
        ("user", DONE), ("assistant", DONE), ("user", DONE), ("assistant", INTERRUPTED)]
    assert messages[0].content == "first question" and messages[1].content
    assert messages[2].content == "Tell me a story"
    # every token the window had received when it reported is in the database
    assert report["saved"] and messages[3].content.startswith(report["saved"])
    store.close()


def test_chats_rename_delete_search(window: Any, qtbot: Any, dialogs: Any) -> None:
    send(qtbot, window, "alpha question", max_tokens=3)
    alpha = window.chat.chat_id
    window.chat.new_chat()
    send(qtbot, window, "beta question", max_tokens=3)
    beta = window.chat.chat_id
    assert sorted(window.chat_list.titles()) == ["alpha question", "beta question"]
    window.chat.rename(alpha, "Renamed alpha")
    window.chat_list.search.setText("ALPHA")
    assert window.chat_list.titles() == ["Renamed alpha"]
    window.chat_list.search.setText("")
    window.delete_chat_dialog(beta)  # QMessageBox.question answered Yes by the fixture
    assert [c.id for c in window.store.chats()] == [alpha]
    assert window.chat.chat_id == alpha
    assert "alpha question" in window.chat_view.text()


def test_export_chat_as_markdown_and_json(window: Any, qtbot: Any, tmp_path: Path) -> None:
    summary = send(qtbot, window, "export me", max_tokens=4)
    md = window.export_chat(tmp_path / "chat.md", "md").read_text()
    assert md.startswith("# export me") and "## User\n\nexport me" in md
    assert summary.summary in md
    doc = json.loads(window.export_chat(tmp_path / "chat.json", "json").read_text())
    assert [m["role"] for m in doc["messages"]] == ["user", "assistant"]
    assert doc["messages"][1]["stats"]["n_tokens"] == summary.n_tokens


def test_store_uses_wal_and_migrates_a_version_1_database(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite3"
    db = sqlite3.connect(path)
    db.executescript("""
        CREATE TABLE chats (id INTEGER PRIMARY KEY, title TEXT NOT NULL,
            system_prompt TEXT NOT NULL DEFAULT '', model TEXT NOT NULL DEFAULT '',
            created REAL NOT NULL, updated REAL NOT NULL);
        CREATE TABLE messages (id INTEGER PRIMARY KEY, chat_id INTEGER NOT NULL,
            position INTEGER NOT NULL, role TEXT NOT NULL, content TEXT NOT NULL,
            created REAL NOT NULL);
        INSERT INTO chats VALUES (1, 'old chat', '', '', 0, 0);
        INSERT INTO messages VALUES (1, 1, 0, 'user', 'hello from v1', 0);
        PRAGMA user_version=1;
    """)
    db.close()
    store = ChatStore(path)
    assert store.schema_version == SCHEMA_VERSION
    journal = store._db.execute("PRAGMA journal_mode").fetchone()[0]
    assert journal == "wal"
    (m,) = store.messages(1)
    assert m.content == "hello from v1" and m.status == DONE
    store.close()
