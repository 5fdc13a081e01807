"""The session's traces in the main window: recording on and off, File ▸ Export trace, and
recorded traces reopened in their own windows (read on a thread, with a progress dialog).

A mixin of :class:`~moescope.gui.main_window.MainWindow`. The recording itself is the
worker's (:mod:`moescope.session.recording`); the window only knows the trace's path and
whether it is still being written, from the worker's signals.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer, Slot
from PySide6.QtWidgets import QProgressDialog

from moescope.display.trace_io import ReopenedTrace, nothing_recorded
from moescope.display.trace_list import SessionTrace
from moescope.gui.traces.session_list import SessionsDialog, ask_trace_file, fill_recent_menu
from moescope.gui.traces.trace_export import (
    TraceExport,
    TraceExporter,
    ask_export_path,
    saved_message,
)
from moescope.gui.traces.trace_opener import PROGRESS_STEPS, TraceOpener
from moescope.gui.traces.trace_window import TraceWindow
from moescope.trace.names import (
    dialog_filter,
    live_trace_file,
)
from moescope.util import paths
from moescope.util.errors import MoEScopeError
from moescope.util.files import OutputPathError
from moescope.util.memory import release_freed_memory

log = logging.getLogger("moescope.gui")

if TYPE_CHECKING:
    from moescope.gui.main_window import MainWindow

    _Window = MainWindow
else:
    _Window = object

RELEASE_DELAY_MS = 500
"""After a trace window closes, when its memory is handed back (it is deleted by then)."""


class SessionTraces(_Window):
    """Recording toggle, trace export, and reopened trace windows."""

    def _build_trace_exports(self) -> None:
        self.trace_exports = TraceExporter(self, [self.export_trace_action])
        """Runs File ▸ Export trace on a thread (the action is disabled meanwhile)."""
        self.trace_exports.exported.connect(self._trace_exported)
        self.trace_exports.failed.connect(self._trace_export_failed)
        self.trace_exports.finished.connect(self.traceExportFinished)

    def _toggle_recording(self, on: bool) -> None:
        """Off stops the session's recording at once (at the next token mid-answer); on
        starts with the next model load, since a trace must begin with an empty cache for
        its replay to be exact."""
        self.recording = bool(on)
        self.settings.setValue("record_traces", self.recording)
        if not self.recording and self.trace_path is not None:
            self.recording_now = False
            empty = not self.chat.generating and nothing_recorded(
                live_trace_file(self.trace_path))  # no token yet: no trace will be kept
            self.client.stop_recording()
            self.statusBar().showMessage(
                "Recording stopped; this session recorded nothing, so it leaves no trace."
                if empty else f"Recording stopped; the trace so far is kept: "
                              f"{self.trace_path}", 8000)
        elif self.recording and not self.recording_now:
            self.statusBar().showMessage(
                "Recording starts with the next model load (a trace begins with an empty "
                "cache, so that its replay is exact).", 8000)

    def export_trace_dialog(self) -> None:
        if self.trace_path is None:
            self.show_error("No trace to export", "This session is not being recorded: turn "
                                                  "on File ▸ Record session traces and load "
                                                  "the model again.")
            return
        # the copy keeps the recorded format (export_session names it so)
        if nothing_recorded(live_trace_file(self.trace_path)):  # a journal while recording
            earlier = self.trace_before_compare
            if earlier is not None and live_trace_file(earlier).exists():
                # "no token yet" read as if the chat's answers were lost
                self.show_error("No trace to export yet",
                                f"Comparing policies ended this session's trace and "
                                f"started a new one, which has no token yet. The trace "
                                f"before the comparison is saved as {earlier}: File ▸ "
                                f"Open trace… opens it, and its window exports it.")
                return
            self.show_error("No trace to export yet", "This session has recorded no token "
                                                      "yet: its trace begins with the first "
                                                      "answer.")
            return
        path = ask_export_path(self, self.trace_path, self.settings)
        if path:
            self.export_trace(path)

    def export_trace(self, path: str | Path) -> TraceExport | None:
        """Start copying the session's trace to ``path`` (named with the recorded format's
        suffix) and writing Perfetto JSON and a per-token CSV next to it, on a thread;
        ``traceExportFinished`` says how it ended (the status bar, or a message box for a
        failure, tells the user). None while another export runs.

        Read from the file as it is: the worker puts each answer's last token on disk
        before it reports the answer finished, so between answers the file is whole;
        mid-answer the copy ends at the tokens written so far (a line being written reads
        as a cut-off tail, which the reader accepts)."""
        if self.trace_path is None:
            raise MoEScopeError("this session is not being recorded")
        return self.trace_exports.start(self.trace_path, path, self.settings)

    def _trace_exported(self, trace: Path, files: tuple[Path, Path, Path]) -> None:
        self.statusBar().showMessage(saved_message(trace, files), 15000)

    def _trace_export_failed(self, dest: Path, err: Exception) -> None:
        recorded = self.trace_path
        if (isinstance(err, OSError) and not isinstance(err, OutputPathError)
                and isinstance(err.filename, str) and recorded is not None
                and Path(err.filename) in (recorded, live_trace_file(recorded))):
            # the session's own file went away or broke: not the output's fault
            self.show_error("Could not export the trace",
                            f"The session's trace {err.filename} can no longer be read "
                            f"({err.strerror or err}). Nothing was written.")
        elif isinstance(err, OSError):
            self._export_failed("trace", dest, err)
        else:  # nothing recorded yet, or a trace that does not read
            self.show_error("Could not export the trace", str(err))

    def open_trace_dialog(self) -> None:
        path = ask_trace_file(self, str(paths.traces_dir()), dialog_filter())
        if path:
            self.open_trace(path)

    def _live_trace(self) -> Path | None:
        """This window's session being recorded now, if any (the list marks it)."""
        return self.trace_path if self.recording_now else None

    def _rebuild_sessions_menu(self) -> None:
        """File ▸ Recent sessions, listed afresh on a thread each time it opens (headers
        only): the last listing shows at once, the new one replaces it when it comes."""
        scanner = self.sessions_scanner
        fill_recent_menu(self.sessions_menu, scanner.entries, self.open_trace,
                         self.sessions_action)
        scanner.scan(paths.traces_dir(), self._live_trace())

    @Slot(object)
    def _sessions_listed(self, entries: list[SessionTrace]) -> None:
        if not self._closed:
            fill_recent_menu(self.sessions_menu, entries, self.open_trace,
                             self.sessions_action)

    def show_sessions(self) -> SessionsDialog:
        """The Recorded sessions dialog (one at a time, non-modal: the chat goes on)."""
        dialog = self._sessions_dialog
        if dialog is not None:
            dialog.refresh()
            dialog.raise_()
            dialog.activateWindow()
            return dialog
        dialog = SessionsDialog(paths.traces_dir(), self._live_trace, self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.openRequested.connect(self.open_trace)
        dialog.otherFileRequested.connect(self.open_trace_dialog,
                                          Qt.ConnectionType.QueuedConnection)
        dialog.destroyed.connect(self._sessions_dialog_gone)
        self._sessions_dialog = dialog
        dialog.show()
        return dialog

    @Slot()
    def _sessions_dialog_gone(self) -> None:
        self._sessions_dialog = None

    def open_trace(self, path: str | Path) -> TraceOpener:
        """Show a recorded session's plots in their own window, read on a thread (a long
        session's trace takes seconds to read): a progress dialog with Cancel appears if
        it takes a while, the chat goes on meanwhile, and ``traceOpened`` (the window)
        or ``traceFailed`` (the message, also shown) says how it ended."""
        opener = TraceOpener(path)
        dialog = QProgressDialog(f"Reading {Path(path).name}…", "Cancel", 0,
                                 PROGRESS_STEPS, self)
        dialog.setWindowTitle("Open trace")
        dialog.setMinimumDuration(400)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        dialog.setValue(0)
        dialog.canceled.connect(opener.cancel)
        # the opener emits from its own thread: only bound slots of GUI-thread objects
        # (queued), never lambdas, which would run on the reading thread
        opener.progressed.connect(dialog.setValue)
        opener.opened.connect(self._trace_opened)
        opener.failed.connect(self._trace_failed)
        opener.done.connect(self._trace_opener_finished)
        self._trace_openers[opener] = dialog
        opener.start()
        return opener

    @Slot(object)
    def _trace_opener_finished(self, opener: TraceOpener) -> None:
        opener.wait()  # its run() has returned: the thread ends at once
        dialog = self._trace_openers.pop(opener, None)
        if dialog is not None:
            dialog.reset()
            dialog.deleteLater()
        opener.deleteLater()

    @Slot(str, object)
    def _trace_opened(self, path: str, reopened: ReopenedTrace) -> None:
        if self._closed:
            return
        window = TraceWindow(path, reopened, settings=self.settings)
        window.closed.connect(self._trace_window_closed)
        window.show()
        self.trace_windows.append(window)
        self.traceOpened.emit(window)

    @Slot(object)
    def _trace_window_closed(self, window: TraceWindow) -> None:
        """Free a closed trace window: it holds the whole trace (every token's masks and
        router inputs), and a closed window is never shown again."""
        self.trace_windows = [w for w in self.trace_windows if w is not window]
        window.deleteLater()
        if not self._closed and self.isVisible():
            self.activateWindow()  # the keyboard goes back where it was, not nowhere
        # once it is gone, hand its memory back to the system (the allocator would keep
        # the peak for the rest of the session)
        QTimer.singleShot(RELEASE_DELAY_MS, release_freed_memory)

    @Slot(str)
    def _trace_failed(self, message: str) -> None:
        if not self._closed:
            self.show_error("Cannot open the trace", message)
            self.traceFailed.emit(message)
