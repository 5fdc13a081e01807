"""A full disk loses nothing: the chat history keeps the answer in memory until it can be
written, a message that cannot be stored is not sent, and a trace that cannot be written
stops recording while the chat goes on. The user is told, without a blocking dialog in
the middle of an answer."""

from __future__ import annotations

import errno
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import LONG_PROMPT, export_trace, load, send, slow_down

from moescope.session.store import DONE, AnswerWriter, ChatStore
from moescope.trace import RECORD_SUFFIX, read_trace
from moescope.trace.names import live_trace_file

FULL = sqlite3.OperationalError("database or disk is full")


def test_a_full_database_raises_and_keeps_what_it_had(tmp_path: Path) -> None:
    """The store's writes fail with sqlite3 errors on a full database (SQLite's own limit,
    not a mock) and leave the rows as they were; with room again, writing goes on."""
    store = ChatStore(tmp_path / "chats.sqlite3")
    chat = store.create_chat("c")
    answer = store.add_message(chat.id, "assistant", "")
    db = store._db
    pages = db.execute("PRAGMA page_count").fetchone()[0]
    db.execute(f"PRAGMA max_page_count = {pages}")
    written = ""
    with pytest.raises(sqlite3.OperationalError, match="full"):
        for _ in range(2000):
            store.append_texts(answer.id, ["x" * 64])
            written += "x" * 64
    assert store.messages(chat.id)[0].content == written
    db.execute(f"PRAGMA max_page_count = {pages + 1000}")
    store.append_texts(answer.id, ["y"])
    assert store.messages(chat.id)[0].content == written + "y"
    store.close()


class FullDisk:
    """Patches the chat store's writes, and the decode thread's (``AnswerWriter``), to fail
    as SQLite does on a full disk, until ``full`` is cleared (the user freed space)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: ChatStore) -> None:
        self.full = False
        self.refused = 0
        self.refused_on_decode_thread = 0
        real_append = AnswerWriter.append

        def append(writer: AnswerWriter, *args: Any) -> None:
            if self.full:
                self.refused_on_decode_thread += 1
                raise FULL
            real_append(writer, *args)

        monkeypatch.setattr(AnswerWriter, "append", append)
        for name in ("append_texts", "finish_message", "add_message", "set_system_prompt"):
            real = getattr(store, name)

            def write(*args: Any, _real: Any = real, **kw: Any) -> Any:
                if self.full:
                    self.refused += 1
                    raise FULL
                return _real(*args, **kw)

            monkeypatch.setattr(store, name, write)


def test_a_full_disk_mid_answer_keeps_the_answer_and_saves_it_once_there_is_room(
        window: Any, qtbot: Any, dialogs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    send(qtbot, window, "Hello there.", max_tokens=8)
    disk = FullDisk(monkeypatch, window.store)
    streamed: list[str] = []

    def fill_up(snaps: list[Any]) -> None:
        streamed.extend(s.text for s in snaps)
        if len(streamed) >= 5:
            disk.full = True

    window.chat.tokensArrived.connect(fill_up)
    slow_down(window, 300)
    summary = send(qtbot, window, LONG_PROMPT, max_tokens=30)
    window.chat.tokensArrived.disconnect(fill_up)
    assert summary.n_tokens == 30 and disk.refused > 0
    assert disk.refused_on_decode_thread == 1  # it stopped saving; the window kept the rest
    # told once, without a blocking dialog; the answer is whole on screen and in memory
    assert [t for t, _ in window.notices] == ["Could not save the chat"]
    assert "disk full" in window.notices[0][1] and dialogs.shown == []
    assert window.chat.pending is not None
    answer = "".join(streamed)
    assert window.chat.messages()[-1].content == answer
    assert window.chat.messages()[-1].status == DONE
    assert answer in window.chat_view.text() or answer.strip()[:20] in window.chat_view.text()
    stored = window.store.messages(window.chat.chat_id)[-1].content
    assert answer.startswith(stored) and len(stored) < len(answer)
    # a new message cannot be stored while the disk is full: not sent, kept in the box
    window.chat_view.input.setPlainText("Next question")
    assert not window.chat.send("Next question")
    assert any("not sent" in text for text in dialogs.texts())
    assert window.chat_view.input.toPlainText() == "Next question"
    assert not window.chat.generating
    # room again: the retry writes the rest of the answer and its status, and says so
    disk.full = False
    qtbot.waitUntil(lambda: window.chat.pending is None, timeout=10_000)
    last = window.store.messages(window.chat.chat_id)[-1]
    assert last.content == answer and last.status == DONE and last.stats["n_tokens"] == 30
    assert "saved again" in window.statusBar().currentMessage()
    assert send(qtbot, window, "Next question", max_tokens=4).n_tokens > 0


def test_text_that_failed_to_save_is_carried_by_the_next_tokens(
        window: Any, qtbot: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    disk = FullDisk(monkeypatch, window.store)

    def frees_space(_snaps: list[Any]) -> None:
        disk.full = window.chat.tokens_received <= 6

    window.chat.tokensArrived.connect(frees_space)
    window.chat.answerStarted.connect(lambda: setattr(disk, "full", True))
    slow_down(window, 200)
    # the first tokens fail to save; later ones carry them; the answer ends saved
    send(qtbot, window, "Hello there.", max_tokens=12)
    assert disk.refused > 0 and window.chat.pending is None
    chat_id = window.chat.chat_id
    text = window.chat.messages()[-1].content
    path = window.store.path
    window.close()
    reopened = ChatStore(path)
    assert reopened.messages(chat_id)[-1].content == text
    reopened.close()


def test_a_system_prompt_edited_on_a_full_disk_is_saved_with_the_next_message(
        window: Any, qtbot: Any, dialogs: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    send(qtbot, window, "Hello there.", max_tokens=4)
    disk = FullDisk(monkeypatch, window.store)
    disk.full = True
    window.chat_settings.system_prompt.setPlainText("Answer like a sailor.")
    assert not window.chat.send("Ahoy?")
    assert any("not sent" in text for text in dialogs.texts())
    disk.full = False
    send(qtbot, window, "Ahoy?", max_tokens=4)
    chat = window.store.chat(window.chat.chat_id)
    assert chat.system_prompt == "Answer like a sailor."
    assert window.chat.history()[0] == {"role": "system", "content": "Answer like a sailor."}


class FillsUp:
    """A trace file on a disk with ``room`` bytes left: the write that does not fit is
    written in part, then fails with ENOSPC, as a real full disk does."""

    def __init__(self, f: Any, room: int) -> None:
        self.f, self.room = f, room

    def write(self, data: bytes) -> int:
        if len(data) > self.room:
            self.f.write(data[:self.room])
            self.room = 0
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return int(self.f.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.f, name)


def test_a_full_disk_stops_the_trace_not_the_chat(window: Any, qtbot: Any, dialogs: Any,
                                                   tiny_moe: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib

    disks: list[FillsUp] = []

    def small_disk(real_open: Any) -> Any:
        def opened(path: Any) -> FillsUp:
            disks.append(FillsUp(real_open(path), 1 << 40))
            return disks[-1]
        return opened

    # every opener a trace format records through (a journal's, where a format has one)
    for name, opener in (("writer", "open_stream"), ("arrow_format", "open_stream"),
                         ("parquet_format", "_create_new")):
        try:
            module = importlib.import_module(f"moescope.trace.{name}")
        except ModuleNotFoundError:
            continue
        monkeypatch.setattr(module, opener, small_disk(getattr(module, opener)))
    load(qtbot, window, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    assert window.trace_path is not None and len(disks) == 1
    live = live_trace_file(window.trace_path)  # a journal, for a format finished at close
    header = live.stat().st_size  # nothing recorded but the header yet
    first = send(qtbot, window, "Hello there.", max_tokens=10)
    assert window.client.worker.recorder is not None and first.n_tokens == 10
    assert len(read_trace(live).tokens) == 10
    disks[0].room = int((live.stat().st_size - header) / 10 * 3.5)
    summary = send(qtbot, window, LONG_PROMPT, max_tokens=20)
    assert summary.n_tokens == 20 and summary.stop_reason != "error"
    assert window.client.worker.recorder is None
    assert [t for t, _ in window.notices] == ["Session recording stopped"]
    assert "No space left on device" in window.notices[0][1]
    assert str(window.trace_path) in window.notices[0][1] and dialogs.shown == []
    # the trace so far reads back: every complete token, the cut one flagged
    trace = read_trace(live_trace_file(window.trace_path))
    assert trace.truncated and trace.end is None
    assert 10 + 2 <= len(trace.tokens) < 10 + 20
    assert [t.text for t in trace.tokens][:10] == [
        s.text for s in list(window.recent_tokens)[:10]]
    # and the chat goes on
    assert send(qtbot, window, "And then?", max_tokens=4).n_tokens > 0


def test_an_export_to_a_full_disk_is_explained_and_replaces_nothing(
        window: Any, qtbot: Any, dialogs: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Export chat / Export trace: a failed write says where and why in a dialog (it used
    to raise inside the menu's slot, so the user saw nothing), and the file that was
    there is left as it was."""
    from moescope.util import files

    send(qtbot, window, "Hello there.", max_tokens=6)
    out = tmp_path / "exports"
    out.mkdir()
    md, trace = out / "chat.md", out / f"session{RECORD_SUFFIX}"
    md.write_text("an earlier export")
    trace.write_text("an earlier trace")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    real_fsync = os.fsync
    monkeypatch.setattr(files.os, "fsync", full)
    assert window.export_chat(md, "md") is None
    assert dialogs.shown[-1][1] == "Could not export the chat"
    assert "No space left on device" in dialogs.shown[-1][2]
    assert export_trace(qtbot, window, trace) is None
    assert dialogs.shown[-1][1] == "Could not export the trace"
    assert md.read_text() == "an earlier export" and trace.read_text() == "an earlier trace"
    assert sorted(p.name for p in out.iterdir()) == ["chat.md", trace.name]
    # a folder that does not exist is explained the same way
    assert window.export_chat(out / "gone" / "chat.md", "md") is None
    assert "does not exist" in dialogs.shown[-1][2]
    monkeypatch.setattr(files.os, "fsync", real_fsync)
    assert window.export_chat(md, "md") == md and "Hello there." in md.read_text()
