"""Chat history: several chats, persistence across restarts and kills, export, migrations."""

from __future__ import annotations

import json
import os
import select
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import LONG_PROMPT, load, send, slow_down

from moescope.session.store import DONE, INTERRUPTED, SCHEMA_VERSION, AnswerWriter, ChatStore
from moescope.trace import read_trace
from moescope.trace.names import live_trace_file

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


def test_a_window_closed_cleanly_lets_the_next_start_skip_the_full_check(
        make_window: Any, qtbot: Any, tiny_moe: Path, data_dir: Path) -> None:
    """The window's close (its decode thread's connection closed first) leaves the stamp
    of a clean close; the next window reads the header and schema only."""
    first = make_window()
    assert first.store.checked == "full"  # a new database: no stamp yet
    load(qtbot, first, tiny_moe)
    send(qtbot, first, "hello", max_tokens=4)
    first.close()
    assert (data_dir / "chats.sqlite3.clean").is_file()
    assert not (data_dir / "chats.sqlite3-wal").exists()
    second = make_window()
    assert second.store.checked == "header"
    assert second.chat_list.titles() == ["hello"]


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
        time.sleep(0.6)  # mid-stream, wherever the decode thread is
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    store = ChatStore(data_dir / "chats.sqlite3")
    assert store.recovered == 1
    assert store.checked == "full"  # no clean close: the whole file is checked
    (chat,) = store.chats()
    messages = store.messages(chat.id)
    assert [(m.role, m.status) for m in messages] == [
        ("user", DONE), ("assistant", DONE), ("user", DONE), ("assistant", INTERRUPTED)]
    assert messages[0].content == "first question" and messages[1].content
    assert messages[2].content == "Tell me a story"
    # every token the window had received when it reported is in the database
    assert report["saved"] and messages[3].content.startswith(report["saved"])
    # and every token the trace recorded of it, but at most the last one
    trace = read_trace(live_trace_file(report["trace"]))
    last = [t.text for t in trace.tokens if t.answer == trace.tokens[-1].answer]
    assert len(last) > report["received"] + 1, (len(last), report["received"])
    assert messages[3].content.startswith(report["prefix"] + "".join(last[:-1]))
    store.close()


def test_the_decode_thread_saves_each_token_while_the_window_is_busy(window: Any,
                                                                     qtbot: Any) -> None:
    """The GUI thread handles no event for the whole answer (it sleeps): the answer is in
    the database anyway, read through a connection of its own, every generated token but
    at most the one being decoded; afterwards the stored answer is the one shown."""
    slow_down(window, 300)
    window.chat_settings.max_tokens.setValue(40)
    worker = window.client.worker
    shown: list[str] = []
    window.chat.tokensArrived.connect(lambda snaps: shown.extend(
        s.text for s in snaps if not s.end))
    reader = sqlite3.connect(f"{window.store.path.resolve().as_uri()}?mode=ro", uri=True)
    assert window.chat.send(LONG_PROMPT)
    answer_id, prefix = window.chat.answer_id, window.chat.answer_prefix
    samples: list[tuple[int, str]] = []  # (tokens generated before the read, text read)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        n = worker.answer_tokens
        (content,) = reader.execute("SELECT content FROM messages WHERE id=?",
                                    (answer_id,)).fetchone()
        samples.append((n, content))
        if n == 40 and not worker.generating:
            break
        time.sleep(0.003)
    assert window.chat.tokens_received == 0  # the window handled no token meanwhile
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000):
        pass
    assert len(shown) == 40 and window.chat.pending is None
    stored = window.store.messages(window.chat.chat_id)[-1]
    assert stored.content == prefix + "".join(shown) and stored.status == DONE
    assert samples[-1] == (40, stored.content)  # all of it before the window saw a token
    texts = [prefix + "".join(shown[:k]) for k in range(len(shown) + 1)]
    middle = 0
    for n, content in samples:
        saved = max(k for k, text in enumerate(texts) if text == content)  # raises if torn
        assert saved >= n - 1, (n, content)
        middle += 0 < saved < 40
    assert middle >= 3  # seen growing mid-answer, not only at its ends
    reader.close()


def test_tokens_the_decode_thread_could_not_save_are_saved_by_the_window_in_order(
        window: Any, qtbot: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A write that fails on the decode thread (here: locked beyond the busy timeout)
    ends its saving for that answer; the window saves the tokens it did not, after the
    saved ones, each once. The next answer is saved on the decode thread again."""
    real_append = AnswerWriter.append
    appended: list[str] = []

    def append(writer: AnswerWriter, message_id: int, text: str) -> None:
        appended.append(text)
        if len(appended) == 6:
            raise sqlite3.OperationalError("database is locked")
        real_append(writer, message_id, text)

    monkeypatch.setattr(AnswerWriter, "append", append)
    snaps: list[Any] = []
    window.chat.tokensArrived.connect(lambda batch: snaps.extend(
        s for s in batch if not s.end))
    slow_down(window, 200)
    assert send(qtbot, window, LONG_PROMPT, max_tokens=20).n_tokens == 20
    assert len(appended) == 6  # none tried after the failure
    flags = [s.saved for s in snaps]
    assert flags == sorted(flags, reverse=True) and 5 <= flags.count(True) < 20
    stored = window.store.messages(window.chat.chat_id)[-1]
    whole = window.chat.answer_prefix + "".join(s.text for s in snaps)
    assert stored.content == whole and stored.status == DONE
    assert window.chat.pending is None and window.chat.save_error == ""
    snaps.clear()
    assert send(qtbot, window, "And then?", max_tokens=6).n_tokens > 0
    assert len(appended) > 6 and all(s.saved or not s.text for s in snaps)


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
