"""One window per data folder: the lock a window takes on its data folder at start.

Two MoEScope windows on one data folder share its chat database and settings, and
neither shows the other's changes as they happen: a chat deleted in one is still listed
in the other. A second window's start also marked the answer the first one was writing
as cut off by a crash (the chat store's recovery cannot tell a live writer from a dead
one). So the window takes a lock on the folder (``moescope.lock`` in it, a
:class:`QLockFile`) and a second start asks first: the other window is named (its
process and host), the user can quit, or open anyway (then this window leaves crash
recovery to the lock's holder, see :class:`moescope.session.store.ChatStore`), and is
told how to open a separate profile (``MOESCOPE_DATA_DIR``).

A lock left by a process that is gone (a crash, a kill) is taken over without a word:
QLockFile checks the holder's process id on this host. One never expires by age (a
window stays open for days), and one held from another host (a shared home folder) is
reported as held. A lock file that names no process (empty or garbled: a power cut right
after it was created) is taken over too once it is :data:`UNNAMED_GRACE_S` old: no live
holder leaves its lock file so, and with stale locks never expiring by age, QLockFile
alone would report such a file as held at every start from then on. The command line
(``moescope chat``, ``serve``, ...) never takes it: it writes no chat database and its
traces are safe beside a window's (their journals carry locks of their own,
:func:`moescope.trace.parquet_format.lock_journal`).
"""

from __future__ import annotations

import stat
import time
from dataclasses import dataclass
from pathlib import Path

from PySide6.QtCore import QLockFile, QObject, QTimer
from PySide6.QtWidgets import QMessageBox, QWidget

from moescope.util import paths

LOCK_NAME = "moescope.lock"
UNNAMED_GRACE_S = 10.0
RETAKE_MS = 5000
"""How often a window opened anyway tries the lock again (:func:`retake_when_free`)."""
"""How old a lock file that names no process must be before it is taken over: a starting
window writes its process id right after creating the file, so a younger one may be that
window's."""


@dataclass(frozen=True)
class Holder:
    """Who holds a data folder's lock, as its lock file says (empty when unreadable)."""

    pid: int = 0
    host: str = ""
    app: str = ""

    def words(self) -> str:
        if not self.pid:
            return f"another process (its lock file, {LOCK_NAME}, names none)"
        return f"process {self.pid}" + (f" on {self.host}" if self.host else "")


class DataFolderLock:
    """The lock on ``folder`` (default: :func:`moescope.util.paths.data_dir`); released
    by :meth:`release` or when the process ends, however it ends."""

    def __init__(self, folder: Path | None = None) -> None:
        self.folder = folder if folder is not None else paths.data_dir()
        self.path = self.folder / LOCK_NAME
        self._lock = QLockFile(str(self.path))
        self._lock.setStaleLockTime(0)  # held as long as its window lives, never "old"
        self.held = False

    def take(self) -> Holder | None:
        """Take the lock: None when taken (a dead process's lock is taken over), else who
        holds it. A folder where no lock file can be written is not held by anybody: the
        start goes on (and says so in words if the chats cannot be written there either,
        :func:`moescope.gui.app.cannot_use_data_folder`)."""
        if self._lock.tryLock(0):
            self.held = True
            return None
        if self._lock.error() != QLockFile.LockError.LockFailedError:
            return None
        holder = self._holder()
        if not holder.pid and self._unnamed_and_old():
            # removed under QLockFile's own ".rmlock" (as it removes a dead process's), so
            # two windows starting at once cannot both remove it and both hold the lock
            remover = QLockFile(f"{self.path}.rmlock")
            if remover.tryLock(0):
                try:
                    if not self._holder().pid and self._unnamed_and_old() \
                            and self._lock.removeStaleLockFile() and self._lock.tryLock(0):
                        self.held = True
                        return None
                finally:
                    remover.unlock()
            holder = self._holder()
        return holder

    def _holder(self) -> Holder:
        info = self._lock.getLockInfo()
        if isinstance(info, tuple) and len(info) == 3 and info[0]:
            pid, host, app = info
            return Holder(int(pid or 0), str(host or ""), str(app or ""))
        return Holder()

    def _unnamed_and_old(self) -> bool:
        """The lock file is a file that names no process, last written at least
        :data:`UNNAMED_GRACE_S` ago."""
        try:
            st = self.path.lstat()
        except OSError:
            return False
        return stat.S_ISREG(st.st_mode) and time.time() - st.st_mtime >= UNNAMED_GRACE_S

    def release(self) -> None:
        if self.held:
            self._lock.unlock()
            self.held = False


OPEN_ANYWAY = "Open anyway"
QUIT = "Quit"


def already_open_text(folder: Path, holder: Holder) -> tuple[str, str]:
    """The dialog's text and its informative text."""
    text = (f"MoEScope is already open on this data folder ({holder.words()}):\n{folder}")
    info = ("Switch to that window: MoEScope cannot bring it to the front for you.\n\n"
            f"To run a second MoEScope with its own chats and settings, start it with "
            f"{paths.ENV_DATA_DIR} set to another folder.\n\n"
            "Open anyway: both windows share the chats and settings, and neither shows "
            "the other's changes until it reloads its list, so do not delete or edit a "
            "chat the other window is using.")
    return text, info


def ask_already_open(folder: Path, holder: Holder, parent: QWidget | None = None) -> bool:
    """Ask what to do about another MoEScope on ``folder``: True to open anyway, False to
    quit (the default, and what Esc or closing the dialog does)."""
    text, info = already_open_text(folder, holder)
    box = QMessageBox(QMessageBox.Icon.Warning, "MoEScope is already open", text,
                      QMessageBox.StandardButton.NoButton, parent)
    box.setObjectName("alreadyOpenDialog")
    box.setInformativeText(info)
    anyway = box.addButton(OPEN_ANYWAY, QMessageBox.ButtonRole.AcceptRole)
    quit_button = box.addButton(QUIT, QMessageBox.ButtonRole.RejectRole)
    box.setDefaultButton(quit_button)
    box.setEscapeButton(quit_button)
    box.exec()
    return box.clickedButton() is anyway


def retake_when_free(lock: DataFolderLock, parent: QObject) -> QTimer:
    """A window opened anyway (``lock`` held by another) takes the lock once its holder is
    gone: every :data:`RETAKE_MS` until it holds it (or finds nothing can be held there).
    Without it, a third start after the first window quit took the lock and marked the
    answer this window was writing as cut off by a crash. It runs no crash recovery itself:
    the answers still ``generating`` may be its own."""
    timer = QTimer(parent)
    timer.setObjectName("dataFolderLockRetry")
    timer.setInterval(RETAKE_MS)

    def attempt() -> None:
        if lock.held or lock.take() is None:
            timer.stop()

    timer.timeout.connect(attempt)
    timer.start()
    return timer
