"""Start the desktop app: ``run_app()`` is what ``moescope`` (no subcommand) calls."""

from __future__ import annotations

import logging
import signal
import sqlite3
import sys
from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import QTimer
from PySide6.QtGui import QIcon
from PySide6.QtWidgets import QApplication, QMessageBox, QWidget

from moescope import __version__
from moescope.gui.instance_lock import DataFolderLock, ask_already_open, retake_when_free
from moescope.gui.main_window import MainWindow
from moescope.gui.theme import apply_theme
from moescope.session.store import UnreadableChatsError, is_corruption
from moescope.session.store_repair import open_chat_store
from moescope.util import paths
from moescope.util.resources import resources_dir
from moescope.util.words import utf8_name


def app_icon() -> QIcon:
    path = resources_dir() / "icons" / "moescope.svg"
    return QIcon(str(path)) if path.is_file() else QIcon()


GIL_SWITCH_INTERVAL_S = 0.001
"""The GUI thread gives the GIL away on every Qt call (PySide releases it around C++) and
must then wait for the decode thread to drop it, up to the switch interval each time
(5 ms by default). With many Qt calls per frame that added tens of milliseconds per frame
while decoding; 1 ms keeps the event loop's latency low at a negligible cost."""


DESKTOP_ID = "io.github.moescope.MoEScope"
"""The freedesktop application id (packaging/linux/)."""


def qt_arguments(argv: Sequence[str]) -> list[str]:
    """``argv`` as Qt may take it: each argument UTF-8 text. A model file name that is not
    UTF-8 (``moescope demo-$'\\xff'.gguf``, which Python holds with lone surrogates)
    crashed ``QApplication`` (a segmentation fault converting it); such an argument is
    handed over with its bytes escaped (``\\xff``). Qt only looks for its own options
    there (``-platform``, ``-style``…); the model is taken from the unescaped list."""
    return [utf8_name(str(a)) for a in argv]


def create_app(argv: Sequence[str] | None = None) -> QApplication:
    """The QApplication with MoEScope's names, icon and dark theme (reused if one exists,
    e.g. under pytest-qt)."""
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
    existing = QApplication.instance()
    app = existing if isinstance(existing, QApplication) else QApplication(
        qt_arguments(argv if argv is not None else sys.argv))
    app.setApplicationName("MoEScope")
    app.setOrganizationName("MoEScope")
    app.setApplicationVersion(__version__)
    app.setWindowIcon(app_icon())
    # the installed launcher (make install-desktop): Wayland matches windows to it by this
    app.setDesktopFileName(DESKTOP_ID)
    apply_theme(app)
    return app


def run_app(argv: Sequence[str] | None = None, model: str | Path | None = None) -> int:
    """Open the window; load ``model`` (or a ``.gguf`` given in ``argv``), else the last
    model, else the demo model. Returns the exit status of the event loop."""
    args = list(argv if argv is not None else sys.argv)
    if model is None:
        model = next((a for a in args[1:] if a.endswith(".gguf")), None)
    console = logging.StreamHandler()
    console.setLevel(logging.WARNING)  # the logs panel shows everything; the terminal less
    console.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(console)
    app = create_app(args)
    try:
        lock = DataFolderLock()
    except OSError as err:
        return cannot_use_data_folder(err)
    try:
        try:
            window = open_window(lock)
        except UnusableDataFolder as err:
            return cannot_use_data_folder(err.cause)
        if window is None:
            return 0
        window.fit_to_screen()
        window.show()
        _quit_on_sigint(window)
        window.autoload(model)
        return int(app.exec())
    finally:
        lock.release()


def open_window(lock: DataFolderLock) -> MainWindow | None:
    """The main window, once ``lock`` (its data folder's) is taken; if another live
    MoEScope holds it, the user is asked first: None to quit, the data folder untouched
    (nothing is opened or written in it), else a window that shares the folder."""
    holder = lock.take()
    if holder is not None:
        logging.getLogger("moescope.gui").warning(
            "MoEScope is already open on %s (%s)", lock.folder, holder.words())
        if not ask_already_open(lock.folder, holder):
            return None
    # opened here, before the window starts its engine thread: a data folder that cannot
    # hold the chats (read-only, a file in the way) is said in words, not a traceback; a
    # damaged one is moved aside by the folder's owner, and the window says where
    try:
        opened = open_chat_store(paths.chats_db_path(), recover=holder is None,
                                 repair=holder is None)
    except (OSError, sqlite3.Error) as err:
        raise UnusableDataFolder(err) from err
    window = MainWindow(store=opened, owns_data=holder is None)
    if holder is not None:
        retake_when_free(lock, window)
    return window


class UnusableDataFolder(Exception):
    """The chat database could not be opened in the data folder (``cause`` says why)."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


DATA_FOLDER_ERROR = 2
"""``run_app``'s exit status when the data folder cannot be used (as the command line's
for a usage error: the user's setup, not a bug)."""


def cannot_use_data_folder(err: BaseException, parent: QWidget | None = None) -> int:
    """Say in one line (on standard error, and in a dialog for a window started from a
    menu, with no terminal) why the data folder cannot be used; returns
    :data:`DATA_FOLDER_ERROR`."""
    text = data_folder_error_text(err)
    print(f"moescope: error: {text}", file=sys.stderr)
    box = QMessageBox(QMessageBox.Icon.Critical, "MoEScope cannot start", text,
                      QMessageBox.StandardButton.Ok, parent)
    box.setObjectName("dataFolderError")
    box.exec()
    return DATA_FOLDER_ERROR


def data_folder_error_text(err: BaseException) -> str:
    """The one line :func:`cannot_use_data_folder` says: the reason, and the fix that fits
    it (a permission, a newer MoEScope's chats, a damaged file another MoEScope has open)."""
    folder = paths.data_dir_path()
    if isinstance(err, OSError):
        reason = err.strerror or str(err)
        if err.filename:
            reason += f" ({err.filename})"
    else:  # sqlite3's: the chat database
        reason = f"{paths.CHATS_DB}: {err}"
    if isinstance(err, UnreadableChatsError):  # a newer MoEScope's, or not ours: no access
        fix = (f"To use MoEScope meanwhile, start it with {paths.ENV_DATA_DIR} set to "
               f"another folder (this one is left as it is).")
    elif is_corruption(err):  # damaged, and another MoEScope has it open: not moved aside
        fix = (f"Close the other MoEScope and start again: the damaged file is then kept "
               f"under a new name and a new one started, or set {paths.ENV_DATA_DIR} to "
               f"another folder.")
    else:
        fix = (f"Make it writable, or start MoEScope with {paths.ENV_DATA_DIR} set to a "
               f"folder you can write to.")
    return f"MoEScope cannot use its data folder {folder}: {reason}. {fix}"


def _quit_on_sigint(window: MainWindow) -> None:
    """Ctrl+C in the terminal, ``kill`` (SIGTERM: a logout, a session manager, systemd) and a
    closed terminal (SIGHUP) close the window cleanly: an answer stops and is saved, the
    session's trace is finished (its journal compacted), as File → Quit does.

    Qt's event loop runs in C++, so Python's signal handler only runs when some Python code
    does: a 200 ms timer gives it that chance. The handler runs between two bytecodes of
    whatever Python code that is (a slot half done), so it only asks the event loop to
    close the window once that code has returned: closing from inside it crashed the
    process now and then (a segfault in a loaded test run).
    """
    for name in ("SIGINT", "SIGTERM", "SIGHUP"):
        number = getattr(signal, name, None)  # SIGHUP: not on Windows
        if number is not None:
            signal.signal(number, lambda *_: QTimer.singleShot(0, window, window.close))
    timer = QTimer(window)
    timer.timeout.connect(lambda: None)
    timer.start(200)


if __name__ == "__main__":
    sys.exit(run_app())
