"""Past sessions' traces from the window: File ▸ Recent sessions and the Recorded sessions
dialog list the traces folder (when, model, tokens, size, format, state), open the chosen
one in a trace window, mark the session being recorded and a crash's journal, explain an
unreadable file instead of failing, and work from the keyboard; File ▸ Open trace's file
dialog shows whole names."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import send
from PySide6.QtCore import Qt, QThreadPool, QTimer, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import QApplication, QFileDialog, QLineEdit, QTreeView, QWidget

from moescope.gui.traces.session_list import SessionsDialog, ask_trace_file
from moescope.trace.names import dialog_filter, journal_path, live_trace_file
from moescope.util import paths

LONG = "20261129-181233-Qwen3-Next-80B-A3B-Instruct-Q4_K_M-with-a-long-name.parquet"


@pytest.fixture(scope="module")
def recorded(record: Callable[..., Path]) -> dict[str, Path]:
    """Real sessions from the engine: a finished Parquet trace and an Arrow stream."""
    return {"parquet": record("qwen3moe", name="s.parquet", tokens=10),
            "arrows": record("qwen3moe", name="s.arrows", tokens=6)}


@pytest.fixture
def folder(tmp_path: Path, recorded: dict[str, Path]) -> Path:
    """A traces folder as a user's looks after a few sessions and a crash: two finished
    sessions, a journal nobody holds (the app was killed mid-token), a foreign file with a
    trace's name, and a file that is not a trace."""
    d = tmp_path / "traces"
    d.mkdir()
    shutil.copyfile(recorded["parquet"], d / "20261128-101502-Qwen3-30B-A3B-Q4_K_M.parquet")
    shutil.copyfile(recorded["parquet"], d / LONG)
    crashed = d / "20261130-220101-Qwen3-30B-A3B-Q4_K_M.parquet.journal.arrows"
    shutil.copyfile(recorded["arrows"], crashed)
    os.truncate(crashed, crashed.stat().st_size - 20)
    (d / "notes.arrows").write_text("my notes, not a trace\n")
    (d / "README.txt").write_text("not listed")
    return d


def _listed(qtbot: Any, folder: Path) -> SessionsDialog:
    """The dialog on ``folder``, shown, once its first listing (on a thread) is in."""
    dialog = SessionsDialog(folder)
    qtbot.addWidget(dialog)
    with qtbot.waitSignal(dialog.listed, timeout=30_000):
        dialog.show()
    return dialog


def _rows(dialog: SessionsDialog) -> list[list[str]]:
    tree = dialog.tree
    return [[tree.topLevelItem(i).text(c) for c in range(tree.columnCount())]
            for i in range(tree.topLevelItemCount())]


def _select(dialog: SessionsDialog, name: str) -> int:
    n = next(i for i, e in enumerate(dialog.entries) if e.path.name == name)
    dialog.tree.setCurrentItem(dialog.tree.topLevelItem(n))
    return n


def test_the_dialog_lists_the_folder_and_explains_each_state(qtbot: Any,
                                                              folder: Path) -> None:
    dialog = _listed(qtbot, folder)
    rows = _rows(dialog)
    assert len(rows) == 4  # README.txt is not a trace
    assert dialog.entries[0].path.name == "notes.arrows"  # the newest file, by its time
    assert dialog.current().path.name != "notes.arrows"  # selected: the newest that opens
    assert dialog.open_button.isEnabled()
    states = {e.path.name: r[5] for e, r in zip(dialog.entries, rows, strict=True)}
    assert states[LONG] == "finished"
    assert states["20261130-220101-Qwen3-30B-A3B-Q4_K_M.parquet.journal.arrows"] \
        == "left by a crash"
    assert states["notes.arrows"] == "unreadable"
    finished = next(r for e, r in zip(dialog.entries, rows, strict=True)
                    if e.path.name == LONG)
    assert finished[2] == "10" and finished[3].endswith("kB") and finished[4] == "Parquet"
    assert finished[1].startswith("moescope-synth-qwen3moe")  # the header's model name
    assert "4 recorded sessions" in dialog.intro.text() and str(folder) in dialog.intro.text()
    _select(dialog, "notes.arrows")
    assert not dialog.open_button.isEnabled()
    assert "Cannot be opened" in dialog.detail.text() and "not a MoEScope trace" in \
        dialog.detail.text()
    _select(dialog, "20261130-220101-Qwen3-30B-A3B-Q4_K_M.parquet.journal.arrows")
    assert dialog.open_button.isEnabled() and "crash" in dialog.detail.text()
    screen = dialog.screen().availableGeometry()
    assert dialog.width() <= screen.width() and dialog.height() <= screen.height()


def test_enter_opens_the_selected_session_and_nothing_for_an_unreadable_one(
        qtbot: Any, folder: Path) -> None:
    dialog = _listed(qtbot, folder)
    dialog.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is dialog, timeout=5_000)
    qtbot.keyClick(dialog, Qt.Key.Key_S, Qt.KeyboardModifier.AltModifier)  # &Sessions
    assert dialog.tree.hasFocus()
    asked: list[str] = []
    dialog.openRequested.connect(asked.append)
    _select(dialog, "notes.arrows")
    qtbot.keyClick(dialog.tree, Qt.Key.Key_Return)
    assert not asked and dialog.isVisible()
    n = _select(dialog, LONG)
    dialog.tree.setCurrentItem(dialog.tree.topLevelItem(0))
    for _ in range(n):
        qtbot.keyClick(dialog.tree, Qt.Key.Key_Down)
    assert dialog.current().path.name == LONG
    qtbot.keyClick(dialog.tree, Qt.Key.Key_Return)
    assert asked == [str(folder / LONG)] and not dialog.isVisible()


def test_show_in_folder_refresh_and_another_file(qtbot: Any, folder: Path,
                                                 monkeypatch: pytest.MonkeyPatch,
                                                 recorded: dict[str, Path]) -> None:
    shown: list[QUrl] = []
    monkeypatch.setattr(QDesktopServices, "openUrl",
                        staticmethod(lambda url: shown.append(url) or True))
    dialog = _listed(qtbot, folder)
    _select(dialog, LONG)
    dialog.folder_button.click()
    assert [u.toLocalFile() for u in shown] == [str(folder)]
    newer = folder / "20261201-090000-OLMoE-1B-7B.arrows"
    shutil.copyfile(recorded["arrows"], newer)
    with qtbot.waitSignal(dialog.listed, timeout=30_000):
        dialog.refresh_button.click()
    assert len(dialog.entries) == 5 and dialog.current().path.name == LONG  # kept
    assert newer in [e.path for e in dialog.entries]
    with qtbot.waitSignal(dialog.otherFileRequested):
        dialog.other_button.click()


def test_the_open_trace_dialog_shows_whole_names(qtbot: Any, folder: Path) -> None:
    """Qt's own file dialog (Linux without a desktop portal) opened in its list view, 632
    pixels wide: a journal's or a split model's name was cut before its end."""
    sharded = ("20261129-181233-Qwen3-Coder-480B-A35B-Instruct-UD-Q4_K_XL-00001-of-00006"
               ".parquet.journal.arrows")  # a split GGUF's stem, and a crash's journal
    shutil.copyfile(folder / LONG, folder / sharded)
    parent = QWidget()
    qtbot.addWidget(parent)
    seen: dict[str, int] = {}

    def check() -> None:
        dialog = QApplication.activeModalWidget()
        if not isinstance(dialog, QFileDialog):  # exec() has not shown it yet
            QTimer.singleShot(20, check)
            return
        try:
            view = dialog.findChild(QTreeView, "treeView")
            qtbot.waitUntil(lambda: view.model().rowCount(view.rootIndex()) >= 4,
                            timeout=10_000)
            qtbot.wait(50)
            assert view.isVisible()  # the detail view (the list view cut names)
            seen["column"] = view.columnWidth(0)
            seen["name"] = view.fontMetrics().horizontalAdvance(sharded)
            seen["old"] = QFileDialog().size().width()  # Qt's default dialog, whole
            dialog.findChild(QLineEdit, "fileNameEdit").setText(LONG)  # as typed
        except BaseException:
            dialog.reject()  # never left open: exec() would wait for ever
            raise
        QTimer.singleShot(3000, dialog.reject)  # should accept() refuse, not a hang
        dialog.accept()

    QTimer.singleShot(0, check)
    chosen = ask_trace_file(parent, str(folder), dialog_filter())
    assert chosen == str(folder / LONG)
    assert seen["column"] > seen["name"] > seen["old"]


def test_recent_sessions_mark_the_live_one_and_open_a_past_one(
        window: Any, qtbot: Any, dialogs: Any, recorded: dict[str, Path]) -> None:
    send(qtbot, window, "Hello there.", max_tokens=6)
    folder = paths.traces_dir()
    past = folder / "20261101-120000-earlier-session.parquet"
    shutil.copyfile(recorded["parquet"], past)
    os.utime(past, (1_700_000_000, 1_700_000_000))
    live = live_trace_file(window.trace_path)
    assert live == journal_path(window.trace_path)  # recording: the journal is the trace
    menu = window.sessions_menu
    with qtbot.waitSignal(window.sessions_scanner.listed, timeout=30_000):
        menu.aboutToShow.emit()
        # listed on a thread: the menu says so until the first listing comes back
        assert menu.actions()[0].text() == "Listing the sessions…"
    actions = [a for a in menu.actions() if not a.isSeparator()]
    assert actions[-1] is window.sessions_action
    texts = [a.text() for a in actions[:-1]]
    assert len(texts) == 2 and texts[0].startswith("&1 ")
    assert texts[0].endswith("(recording now)"), texts
    assert "10 tokens" in texts[1] and "(" not in texts[1]
    assert str(live) in actions[0].statusTip() and actions[0].isEnabled()
    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        actions[1].trigger()
    assert opened.args[0].path == past and len(opened.args[0].tokens) == 10
    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        actions[0].trigger()  # the live session: the tokens so far
    assert opened.args[0].path == live and opened.args[0].tokens
    assert not dialogs.shown


def test_the_dialog_from_the_menu_opens_in_a_trace_window(
        window: Any, qtbot: Any, dialogs: Any, recorded: dict[str, Path]) -> None:
    folder = paths.traces_dir()
    past = folder / "20261101-120000-earlier-session.arrows"
    shutil.copyfile(recorded["arrows"], past)
    window.sessions_action.trigger()
    dialog = window._sessions_dialog
    assert dialog is not None and dialog.isVisible()
    qtbot.waitUntil(lambda: not dialog.scanning and bool(dialog.entries), timeout=30_000)
    assert window.show_sessions() is dialog  # one at a time
    _select(dialog, past.name)
    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        dialog.open_button.click()
    assert opened.args[0].path == past
    qtbot.waitUntil(lambda: window._sessions_dialog is None, timeout=5_000)  # closed, freed
    assert not dialogs.shown


def _settle(qtbot: Any) -> None:
    """Every scan thread has ended and what it sent has been delivered."""
    QThreadPool.globalInstance().waitForDone()
    qtbot.wait(50)


def test_the_list_fills_on_a_thread_and_a_rescan_shows_the_newer_folder(
        qtbot: Any, folder: Path, recorded: dict[str, Path]) -> None:
    """The dialog and File ▸ Recent sessions read every session's header on the GUI
    thread: with many sessions on disk the window froze for as long. The listing is now
    a pool thread's, the list fills when it comes, and a refresh during a scan wins over
    it (the older scan's list never shows)."""
    for n in range(60):  # many sessions on disk
        shutil.copyfile(recorded["parquet"], folder / f"20261001-{n:06d}-Many-MoE.parquet")
    dialog = SessionsDialog(folder)
    qtbot.addWidget(dialog)
    dialog.show()
    # the constructor returned before any file was read: nothing listed yet, and it says so
    assert dialog.scanning and dialog.tree.topLevelItemCount() == 0
    assert dialog.intro.text().startswith("Listing the recorded sessions in")
    lists: list[int] = []
    dialog.listed.connect(lambda: lists.append(len(dialog.entries)))
    newer = folder / "20261202-080000-Newer-MoE.arrows"
    shutil.copyfile(recorded["arrows"], newer)
    dialog.refresh()  # while the first scan runs (or waits to be delivered)
    qtbot.waitUntil(lambda: bool(lists), timeout=30_000)
    _settle(qtbot)
    assert lists == [65]  # once, the newer scan's: the folder with ``newer`` in it
    assert newer in [e.path for e in dialog.entries] and dialog.tree.topLevelItemCount() == 65
    assert "65 recorded sessions" in dialog.intro.text()
    assert not dialog.scanning
    # a refresh keeps the rows it has while it scans, then the new ones replace them
    newer.unlink()
    dialog.refresh()
    assert dialog.tree.topLevelItemCount() == 65
    qtbot.waitUntil(lambda: len(lists) == 2, timeout=30_000)
    assert lists[-1] == 64 and newer not in [e.path for e in dialog.entries]


def test_a_closed_dialog_stops_its_scan_and_shows_nothing_after(
        qtbot: Any, folder: Path) -> None:
    dialog = SessionsDialog(folder)
    qtbot.addWidget(dialog)
    dialog.show()
    lists: list[int] = []
    dialog.listed.connect(lambda: lists.append(1))
    dialog.reject()  # Close while the scan runs
    assert not dialog.scanning
    _settle(qtbot)
    assert lists == [] and dialog.tree.topLevelItemCount() == 0
