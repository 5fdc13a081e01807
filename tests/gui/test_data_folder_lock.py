"""A second MoEScope on one data folder: the lock the window takes at start, the dialog
that names the other one, and a dead process's lock taken over without a word."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from moescope.session.store import DONE, GENERATING, INTERRUPTED, ChatStore

HERE = Path(__file__).parent
CHILD_TIMEOUT_S = 60


@pytest.fixture
def live_answer(data_dir: Path) -> tuple[int, int]:
    """A chat whose answer is being written (status ``generating``), as another window's
    is mid-answer, and a setting: (chat id, the answer's id)."""
    store = ChatStore(data_dir / "chats.sqlite3")
    chat = store.create_chat("theirs")
    store.add_message(chat.id, "user", "hello")
    answer = store.add_message(chat.id, "assistant", "so far", status=GENERATING)
    store.close()
    (data_dir / "settings.ini").write_text("[General]\nlast_model=/models/m.gguf\n")
    return chat.id, answer.id


@pytest.fixture
def other_moescope(data_dir: Path) -> Iterator[subprocess.Popen[str]]:
    """A real second process holding the data folder's lock (until the test ends)."""
    env = dict(os.environ, MOESCOPE_DATA_DIR=str(data_dir))
    child = subprocess.Popen([sys.executable, str(HERE / "lock_holder.py")], env=env,
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        ready, _, _ = select.select([child.stdout], [], [], CHILD_TIMEOUT_S)
        assert ready and child.stdout.readline().strip() == "held"
        yield child
    finally:
        child.kill()
        child.wait(timeout=30)


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


def answer_dialog(button: str, seen: list[str]) -> Callable[[], None]:
    """Click ``button`` on the already-open dialog once it shows (its text into ``seen``);
    returns a function that stops watching."""
    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    stopped = []

    def poll() -> None:
        if stopped:
            return
        box = next((w for w in QApplication.topLevelWidgets()
                    if isinstance(w, QMessageBox) and w.objectName() == "alreadyOpenDialog"
                    and w.isVisible()), None)
        if box is None:
            QTimer.singleShot(10, poll)
            return
        seen.append(f"{box.text()}\n{box.informativeText()}")
        next(b for b in box.buttons() if b.text() == button).click()

    QTimer.singleShot(0, poll)
    return lambda: stopped.append(True)


def test_a_second_start_names_the_other_process_and_quitting_touches_nothing(
        qtbot: Any, data_dir: Path, live_answer: tuple[int, int],
        other_moescope: subprocess.Popen[str]) -> None:
    from moescope.gui.app import create_app, open_window
    from moescope.gui.instance_lock import DataFolderLock

    create_app([])
    before = snapshot(data_dir)
    lock = DataFolderLock()
    seen: list[str] = []
    answer_dialog("Quit", seen)
    assert open_window(lock) is None
    (text,) = seen
    assert f"MoEScope is already open on this data folder (process {other_moescope.pid} " \
           f"on " in text
    assert str(data_dir) in text and "MOESCOPE_DATA_DIR" in text
    assert "cannot bring it to the front" in text
    assert not lock.held
    assert snapshot(data_dir) == before  # the other's answer is not marked cut off
    assert other_moescope.poll() is None


def test_open_anyway_shares_the_folder_and_leaves_the_live_answer_alone(
        qtbot: Any, data_dir: Path, live_answer: tuple[int, int],
        other_moescope: subprocess.Popen[str]) -> None:
    from moescope.gui.app import create_app, open_window
    from moescope.gui.instance_lock import DataFolderLock

    create_app([])
    chat_id, answer_id = live_answer
    lock = DataFolderLock()
    seen: list[str] = []
    answer_dialog("Open anyway", seen)
    window = open_window(lock)
    assert window is not None and len(seen) == 1
    qtbot.addWidget(window)
    try:
        assert window.store.recovered == 0
        assert window.store.messages(chat_id)[-1].status == GENERATING
        assert window.chat.chat_id == chat_id and "so far" in window.chat_view.text()
        assert not lock.held
    finally:
        window.close()
    assert not window.client.thread.isRunning()
    # the other window finishes its answer as ever
    store = ChatStore(data_dir / "chats.sqlite3")
    store.append_text(answer_id, " and the rest")
    store.finish_message(answer_id, DONE)
    assert store.messages(chat_id)[-1].content == "so far and the rest"
    store.close()


def test_a_window_opened_anyway_takes_the_lock_once_the_other_is_gone(
        qtbot: Any, data_dir: Path, live_answer: tuple[int, int],
        other_moescope: subprocess.Popen[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Without it, a third start after the first window quit took the lock and marked the
    answer the second window was writing as cut off by a crash."""
    from moescope.gui import instance_lock
    from moescope.gui.app import create_app, open_window
    from moescope.gui.instance_lock import DataFolderLock

    monkeypatch.setattr(instance_lock, "RETAKE_MS", 20)
    create_app([])
    chat_id, _ = live_answer
    lock = DataFolderLock()
    answer_dialog("Open anyway", [])
    window = open_window(lock)
    assert window is not None
    qtbot.addWidget(window)
    try:
        qtbot.wait(100)
        assert not lock.held  # the other still holds it
        os.kill(other_moescope.pid, signal.SIGKILL)
        other_moescope.wait(timeout=30)
        qtbot.waitUntil(lambda: lock.held, timeout=10_000)
        third = DataFolderLock().take()  # a third start is told about this window
        assert third is not None and third.pid == os.getpid()
        # taking the lock late runs no crash recovery: the answer may be this window's
        assert window.store.messages(chat_id)[-1].status == GENERATING
    finally:
        window.close()
        lock.release()


def test_a_dead_process_lock_is_taken_over_silently(
        qtbot: Any, data_dir: Path, live_answer: tuple[int, int],
        other_moescope: subprocess.Popen[str]) -> None:
    from moescope.gui.app import create_app, open_window
    from moescope.gui.instance_lock import LOCK_NAME, DataFolderLock

    create_app([])
    chat_id, _ = live_answer
    os.kill(other_moescope.pid, signal.SIGKILL)
    other_moescope.wait(timeout=30)
    assert str(other_moescope.pid) in (data_dir / LOCK_NAME).read_text()  # left behind
    lock = DataFolderLock()
    seen: list[str] = []
    stop = answer_dialog("Quit", seen)
    window = open_window(lock)
    stop()
    assert seen == [] and window is not None
    qtbot.addWidget(window)
    try:
        assert lock.held
        assert (data_dir / LOCK_NAME).read_text().split("\n")[0] == str(os.getpid())
        # the dead process's answer is recovered by the window that now owns the folder
        assert window.store.recovered == 1
        assert window.store.messages(chat_id)[-1].status == INTERRUPTED
        again = DataFolderLock().take()  # a third start is told about this one
        assert again is not None and again.pid == os.getpid()
    finally:
        window.close()
        lock.release()
    assert not (data_dir / LOCK_NAME).exists()


@pytest.mark.parametrize("content", [b"", b"garbage\n"])
def test_a_lock_file_that_names_no_process_is_taken_over_once_old(
        data_dir: Path, content: bytes) -> None:
    """A power cut right after a window created its lock file leaves it empty: with stale
    locks never expiring by age, every later start reported it as held (the dialog each
    time, and no window recovering the chats ever again)."""
    from moescope.gui.instance_lock import LOCK_NAME, UNNAMED_GRACE_S, DataFolderLock

    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / LOCK_NAME
    path.write_bytes(content)
    young = DataFolderLock()
    holder = young.take()  # may be a window that is writing its process id right now
    assert holder is not None and holder.pid == 0 and not young.held
    words = holder.words()
    old = time.time() - UNNAMED_GRACE_S - 60
    os.utime(path, (old, old))
    lock = DataFolderLock()
    try:
        assert lock.take() is None and lock.held
        assert path.read_text().split("\n")[0] == str(os.getpid())
        again = DataFolderLock().take()
        assert again is not None and again.pid == os.getpid()
    finally:
        lock.release()
    assert not path.exists()
    assert not Path(f"{path}.rmlock").exists()
    assert LOCK_NAME in words  # where to look, for a lock file nothing can take over


def test_a_folder_in_the_lock_file_place_is_left_alone(data_dir: Path) -> None:
    from moescope.gui.instance_lock import LOCK_NAME, DataFolderLock

    (data_dir / LOCK_NAME / "inside").mkdir(parents=True)
    old = time.time() - 3600
    os.utime(data_dir / LOCK_NAME, (old, old))
    lock = DataFolderLock()
    holder = lock.take()
    assert holder is not None and holder.pid == 0 and not lock.held
    assert (data_dir / LOCK_NAME / "inside").is_dir()


@pytest.mark.parametrize("spoil", ["database is a folder", "data folder under a file"])
def test_a_data_folder_that_cannot_hold_the_chats_is_one_line_and_a_dialog(
        qtbot: Any, data_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str], spoil: str) -> None:
    """A read-only data folder (or a file in its way) ended the start in a traceback from
    sqlite3 or mkdir: it is said in words, in the terminal and in a dialog (a window
    started from a menu has no terminal), and the lock is let go."""
    import logging

    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    from moescope.gui.app import DATA_FOLDER_ERROR, create_app, run_app
    from moescope.gui.instance_lock import LOCK_NAME
    from moescope.util import paths

    if spoil == "database is a folder":
        (data_dir / "chats.sqlite3").mkdir(parents=True)
        folder = data_dir
    else:
        data_dir.parent.mkdir(parents=True, exist_ok=True)
        (data_dir.parent / "a file").write_text("")
        folder = data_dir.parent / "a file" / "data"
        monkeypatch.setenv(paths.ENV_DATA_DIR, str(folder))
    create_app([])
    shown: list[str] = []

    def answer() -> None:
        box = next((w for w in QApplication.topLevelWidgets() if isinstance(w, QMessageBox)
                    and w.objectName() == "dataFolderError" and w.isVisible()), None)
        if box is None:
            QTimer.singleShot(10, answer)
            return
        shown.append(box.text())
        box.accept()

    QTimer.singleShot(0, answer)
    handlers = list(logging.getLogger().handlers)
    try:
        assert run_app(["moescope"]) == DATA_FOLDER_ERROR
    finally:
        for h in logging.getLogger().handlers:
            if h not in handlers:
                logging.getLogger().removeHandler(h)
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"moescope: error: MoEScope cannot use its data folder {folder}: ")
    assert "MOESCOPE_DATA_DIR" in err
    assert shown == [err.removeprefix("moescope: error: ").strip()]
    assert not (data_dir / LOCK_NAME).exists()


def test_a_damaged_chat_database_is_moved_aside_and_the_window_starts_and_says_where(
        qtbot: Any, data_dir: Path, dialogs: Any) -> None:
    """A corrupt chats.sqlite3 stopped every start with "Make it writable": the window's
    owner keeps it under a new name beside it, starts with an empty chat list, and says
    in one line where it went."""
    from moescope.gui.app import create_app, open_window
    from moescope.gui.instance_lock import DataFolderLock

    create_app([])
    data_dir.mkdir(parents=True)
    junk = b"\x00this is no SQLite database\n" * 300
    (data_dir / "chats.sqlite3").write_bytes(junk)
    lock = DataFolderLock()
    window = open_window(lock)
    assert window is not None
    qtbot.addWidget(window)
    try:
        qtbot.waitUntil(lambda: bool(window.notices), timeout=5_000)
        ((title, line),) = window.notices
        (moved,) = [p for p in data_dir.iterdir() if ".corrupt-" in p.name]
        assert moved.name.startswith("chats.sqlite3.corrupt-") and moved.read_bytes() == junk
        assert title == "Chat database damaged" and "\n" not in line
        assert str(moved) in line and "file is not a database" in line
        assert "writable" not in line
        assert line in window.statusBar().currentMessage()
        assert window.store.chats() == [] and window.chat_list.titles() == []
        assert window.store.path == data_dir / "chats.sqlite3"  # a new, working one
        window.store.create_chat("after the repair")
        assert [c.title for c in window.store.chats()] == ["after the repair"]
    finally:
        window.close()
        lock.release()


def test_a_damaged_chat_database_another_moescope_has_open_is_left_with_fitting_advice(
        qtbot: Any, data_dir: Path, other_moescope: subprocess.Popen[str]) -> None:
    """Opened beside another MoEScope, the damaged file is not moved (the other may have it
    open); the line says what helps, not to make the folder writable."""
    from moescope.gui.app import (
        UnusableDataFolder,
        create_app,
        data_folder_error_text,
        open_window,
    )
    from moescope.gui.instance_lock import DataFolderLock

    create_app([])
    (data_dir / "chats.sqlite3").write_bytes(b"garbage" * 100)
    lock = DataFolderLock()
    answer_dialog("Open anyway", [])
    with pytest.raises(UnusableDataFolder) as caught:
        open_window(lock)
    assert sorted(p.name for p in data_dir.iterdir() if p.name.startswith("chats")) == [
        "chats.sqlite3"]
    text = data_folder_error_text(caught.value.cause)
    assert "file is not a database" in text and "Make it writable" not in text
    assert "Close the other MoEScope" in text


def test_a_folder_in_the_database_s_place_keeps_the_writable_advice(data_dir: Path) -> None:
    import sqlite3

    from moescope.gui.app import data_folder_error_text
    from moescope.session.store_repair import open_chat_store

    (data_dir / "chats.sqlite3").mkdir(parents=True)
    with pytest.raises(sqlite3.OperationalError) as caught:
        open_chat_store(data_dir / "chats.sqlite3")
    assert "Make it writable" in data_folder_error_text(caught.value)
