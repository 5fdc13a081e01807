"""A trace exported from the GUI: File ▸ Export trace (the session being recorded) and a
trace window's Export (the trace it shows, however old) ask for a name the same way and
write the same three files through :func:`moescope.display.trace_io.export_session`, so
the two cannot drift apart.

The save dialog starts in the folder of the last export (remembered in the settings, so
that a series of exports lands together), else the home folder.

The export itself runs on its own thread (:class:`TraceExport`, the pattern of
:class:`~moescope.gui.traces.trace_opener.TraceOpener`): a long session's trace is a
gigabyte, and copying it, reading it back and writing its timeline takes long enough to
freeze a window. Each window's :class:`TraceExporter` runs one export at a time, shows its
progress and a Cancel button in the window's status bar, disables the window's Export
controls meanwhile, and stops and joins it when the window closes; the three files appear
together when it is done, or not at all (cancelled, failed, or the window closed).
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from PySide6.QtCore import QCoreApplication, QEvent, QObject, QSettings, QThread, Signal, Slot
from PySide6.QtGui import QAction
from PySide6.QtWidgets import (
    QFileDialog,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QToolButton,
    QWidget,
)

from moescope.display.trace_io import (
    EXPORT_STAGES,
    ExportCancelled,
    export_session,
    export_targets,
)
from moescope.trace.names import (
    FORMAT_NAMES,
    live_trace_file,
    session_stem,
    trace_suffix,
)
from moescope.util.errors import MoEScopeError

log = logging.getLogger("moescope.gui")

EXPORT_FOLDER_KEY = "traces/export_folder"
"""Settings key of the folder the last trace export went to."""
_MAX_PATH = 4096


def export_folder(settings: QSettings | None) -> Path:
    """Where the save dialog starts: the last export's folder while it still exists."""
    if settings is not None:
        value = settings.value(EXPORT_FOLDER_KEY, "")
        text = value[:_MAX_PATH] if isinstance(value, str) else ""
        if text and Path(text).is_absolute() and Path(text).is_dir():
            return Path(text)
    return Path.home()


def default_name(recorded: Path) -> tuple[str, str]:
    """The dialog's proposed file name for a trace and its filter: the session's (or
    file's) name with the suffix of the format the copy keeps."""
    suffix = trace_suffix(recorded.name)
    if suffix is None:  # opened through "All files": the copy keeps its name as given
        return recorded.name, "MoEScope trace (*)"
    stem = session_stem(recorded.name) or recorded.name[:-len(suffix)]
    return (f"{stem}{suffix}",
            f"MoEScope trace, {FORMAT_NAMES.get(suffix, 'as recorded')} (*{suffix})")


def ask_export_path(parent: QWidget, trace: Path, settings: QSettings | None) -> str:
    """The save dialog for exporting ``trace`` ("" when cancelled). The dialog confirms
    only the name typed; the export also writes the copy under its format's suffix and two
    side files, so any of those that already exists is confirmed here before it is
    replaced (No cancels the export)."""
    name, filters = default_name(live_trace_file(trace))
    path, _ = QFileDialog.getSaveFileName(
        parent, "Export trace", str(export_folder(settings) / name), filters)
    if not path:
        return path
    existing = [p for p in export_targets(trace, Path(path))
                if p != Path(path) and (p.exists() or p.is_symlink())]
    if existing:
        names = ", ".join(p.name for p in existing)
        answer = QMessageBox.question(
            parent, "Replace files?",
            f"{names} already {'exists' if len(existing) == 1 else 'exist'} in "
            f"{existing[0].parent}. The export writes {'it' if len(existing) == 1 else 'them'} "
            "too: replace?",
            QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No,
            QMessageBox.StandardButton.No)
        if answer != QMessageBox.StandardButton.Yes:
            return ""
    return path


def remember_folder(settings: QSettings | None, files: tuple[Path, Path, Path]) -> None:
    """The next export's dialog starts where these files went (GUI thread: a QSettings is
    not shared between threads)."""
    if settings is not None:
        settings.setValue(EXPORT_FOLDER_KEY, str(files[0].parent.absolute()))


def saved_message(trace: Path, files: tuple[Path, Path, Path]) -> str:
    """The status line after an export; a copy of a journal (the session still records)
    says how to get the format it will be finished in.

    Short, since a status bar clips rather than wraps: the side files share the copy's
    name, so their suffixes say which they are (a session's default name, spelt three
    times, pushed the journal's hint off a 1366-pixel screen)."""
    copy, perfetto, csv = files
    recorded = trace_suffix(trace.name)
    suffix = trace_suffix(copy.name)
    stem = copy.name[:-len(suffix)] if suffix else copy.name
    sides = ((perfetto.name, csv.name) if (perfetto.name, csv.name) !=
             (f"{stem}.perfetto.json", f"{stem}.tokens.csv") else
             (".perfetto.json", ".tokens.csv"))
    journal = recorded is not None and suffix != recorded
    return f"Saved {copy} with its {sides[0]} and {sides[1]}" + (
        f" (an Arrow stream while the session records: `moescope trace compact` makes it "
        f"{FORMAT_NAMES.get(recorded, recorded)})" if journal else "")


PROGRESS_STEPS = 1000
"""The status bar's progress is in thousandths of the export (a signal only when that
changes)."""
CANCELLED_MESSAGE = "Export cancelled; nothing was written."


class TraceExport(QThread):
    """Exports one trace (:func:`export_session`) on its own thread.

    Signals (queued to the GUI thread, where this object lives): ``progressed(done,
    stage)`` in thousandths of the whole, then exactly one of ``exported(files)``,
    ``failed(error)`` (an ``OSError`` or a :class:`MoEScopeError`, whose ``str`` is one
    sentence) or ``cancelled()``; last, always, ``done(self)``.
    """

    progressed = Signal(int, str)
    exported = Signal(object)  # (copy, perfetto, csv)
    failed = Signal(object)  # the error
    cancelled = Signal()
    done = Signal(object)  # this export: run() has returned

    def __init__(self, trace: Path, dest: Path) -> None:
        super().__init__()
        self.trace = trace
        self.dest = dest
        self._cancel = threading.Event()
        self._last = -1
        self._base = {name: sum(w for _, w in EXPORT_STAGES[:i])
                      for i, (name, _) in enumerate(EXPORT_STAGES)}
        self._weight = dict(EXPORT_STAGES)

    def cancel(self) -> None:
        """Any thread: stop at the next chunk or token; nothing is written."""
        self._cancel.set()

    def _report(self, stage: str, done: int, total: int) -> bool:
        part = done / total if total > 0 else 1.0
        step = int(PROGRESS_STEPS * (self._base[stage] + self._weight[stage] * min(part, 1.0)))
        if step != self._last:
            self._last = step
            self.progressed.emit(step, stage)
        return not self._cancel.is_set()

    def run(self) -> None:
        try:
            self._export()
        finally:
            self.done.emit(self)

    def _export(self) -> None:
        name = self.trace.name
        try:
            files = export_session(self.trace, self.dest, progress=self._report)
        except ExportCancelled:
            log.info("exporting %s was cancelled", name)
            self.cancelled.emit()
        except (OSError, MoEScopeError) as err:
            self.failed.emit(err)
        except MemoryError:
            self.failed.emit(MoEScopeError(f"{name}: not enough memory to read this trace "
                                           "back for its timeline and CSV"))
        except Exception as err:  # a bug must still end in a message, not silence
            log.exception("exporting %s failed", self.trace)
            self.failed.emit(MoEScopeError(f"{name}: cannot export this trace "
                                           f"({type(err).__name__}: {err}); the log has "
                                           "the details"))
        else:
            self.exported.emit(files)


class TraceExporter(QObject):
    """A window's trace exports, one at a time, each on a :class:`TraceExport` thread.

    While one runs, the window's status bar shows its progress and a Cancel button and
    ``controls`` (the window's Export action and button) are disabled. When it ends, the
    folder is remembered and ``exported(trace, files)`` or ``failed(dest, error)`` is
    emitted for the window to word the outcome (a cancel is said here), then, with the
    controls enabled again, always ``finished(files or None)``.
    """

    exported = Signal(object, object)  # trace Path, (copy, perfetto, csv)
    failed = Signal(object, object)  # dest Path, OSError | MoEScopeError
    finished = Signal(object)  # the files, or None

    def __init__(self, window: QMainWindow, controls: list[QAction | QWidget]) -> None:
        super().__init__(window)
        self.window = window
        self.controls = controls
        self.job: TraceExport | None = None
        self._settings: QSettings | None = None
        self._outcome: tuple[Path, Path, Path] | None = None
        self._closed = False
        self._status = ""
        """The line said while the export runs; cleared at its end unless replaced (a
        failure the main window says in a box left "Exporting…" standing)."""
        self.bar = QProgressBar()
        self.bar.setRange(0, PROGRESS_STEPS)
        self.bar.setMaximumWidth(260)
        self.bar.setAccessibleName("Trace export progress")
        self.cancel_button = QToolButton()
        self.cancel_button.setText("Cancel")
        self.cancel_button.setAccessibleName("Cancel the trace export")
        self.cancel_button.setToolTip("Stop the export; nothing is written")
        self.cancel_button.clicked.connect(self.cancel)
        status = window.statusBar()
        status.addPermanentWidget(self.bar)
        status.addPermanentWidget(self.cancel_button)
        self._show(False)

    @property
    def running(self) -> bool:
        return self.job is not None

    def start(self, trace: Path, dest: str | Path,
              settings: QSettings | None) -> TraceExport | None:
        """Export ``trace`` to ``dest`` on a thread (None, and nothing started, while
        another export runs or after the window closed)."""
        if self.job is not None or self._closed:
            return None
        job = TraceExport(trace, Path(dest))
        self._settings = settings
        # the job emits from its own thread: only bound slots of GUI-thread objects
        # (queued), never lambdas, which would run on the export's thread
        job.progressed.connect(self._progressed)
        job.exported.connect(self._exported)
        job.failed.connect(self._failed)
        job.cancelled.connect(self._cancelled)
        job.done.connect(self._done)
        self.job = job
        self.bar.setValue(0)
        self.bar.setFormat(f"Exporting {trace.name}: %p%")
        self._show(True)
        self._status = f"Exporting the trace to {Path(dest)}…"
        self.window.statusBar().showMessage(self._status)
        job.start()
        return job

    def cancel(self) -> None:
        """Stop the running export (nothing is written); its ``finished`` still comes."""
        if self.job is not None:
            self.job.cancel()
            self.cancel_button.setEnabled(False)

    def shutdown(self) -> None:
        """The window closes: stop the export and join its thread, so that none writes
        after the window is gone and no partial file is left (a file still staged is
        removed; one already complete stays)."""
        self._closed = True
        job = self.job
        if job is not None:
            job.cancel()
            job.wait()
            # its last signals, queued to this thread: an export that completed before
            # the cancel reached it is reported (and its folder remembered) like any other
            QCoreApplication.sendPostedEvents(self, QEvent.Type.MetaCall)
            self._done(job)

    def _show(self, running: bool) -> None:
        self.bar.setVisible(running)
        self.cancel_button.setVisible(running)
        self.cancel_button.setEnabled(running)
        for control in self.controls:
            control.setEnabled(not running)

    @Slot(int, str)
    def _progressed(self, step: int, stage: str) -> None:
        if self.job is not None:
            self.bar.setValue(step)
            self.bar.setFormat(f"Exporting: {stage} %p%")

    @Slot(object)
    def _exported(self, files: tuple[Path, Path, Path]) -> None:
        remember_folder(self._settings, files)
        log.info("trace exported: %s, %s and %s", *files)
        self._outcome = files
        if not self._closed and self.job is not None:
            self.exported.emit(self.job.trace, files)

    @Slot(object)
    def _failed(self, err: Exception) -> None:
        if not self._closed and self.job is not None:
            self.failed.emit(self.job.dest, err)

    @Slot()
    def _cancelled(self) -> None:
        if not self._closed:
            self.window.statusBar().showMessage(CANCELLED_MESSAGE, 15000)

    @Slot(object)
    def _done(self, job: TraceExport) -> None:
        if job is not self.job:
            return  # already joined (shutdown)
        job.wait()  # its run() has returned: the thread ends at once
        self.job = None
        files, self._outcome = self._outcome, None
        if not self._closed:
            self._show(False)
            status = self.window.statusBar()
            if status.currentMessage() == self._status:
                status.clearMessage()
        job.deleteLater()
        self.finished.emit(files)
