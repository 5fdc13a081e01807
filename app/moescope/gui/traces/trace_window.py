"""A recorded session, reopened: the same cache panel, filled from a trace file.

The panel is fed the trace's snapshots through the same :class:`CacheModel` code as a
live session, so the curves and bars are the numbers the live window showed. A line above
it gives PSR's prefetch accuracy over the whole session (hidden when no policy prefetched,
"not recorded" for a trace from before the counters). A second tab, the what-if view,
replays the trace under other policies and budgets, prefetch accuracy included.

Export… (Ctrl+Shift+E) writes the shown trace as File ▸ Export trace writes the session's
(:mod:`moescope.gui.traces.trace_export`): an older trace is exported from here, not only
with ``moescope replay``. It runs on a thread (:class:`TraceExporter`), with its progress
and a Cancel button in the window's status bar, and its outcome is one line there.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from pathlib import Path

from PySide6.QtCore import QSettings, QSize, Qt, QTimer, Signal, Slot
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence, QResizeEvent, QShowEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QMainWindow,
    QPushButton,
    QSlider,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from moescope.display.trace_io import (
    PREFETCH_SESSION_TIP,
    ReopenedTrace,
    account,
    prefetch_overview,
    tokens_text,
)
from moescope.display.trace_list import session_title
from moescope.gui.cache.panel import CachePanel
from moescope.gui.traces.trace_export import (
    TraceExport,
    TraceExporter,
    ask_export_path,
    saved_message,
)
from moescope.gui.traces.whatif_view import WhatIfView
from moescope.gui.widgets.named_tabs import name_tabs
from moescope.gui.widgets.screen_fit import resize_within_screen
from moescope.gui.widgets.status_tip import tooltip_follows_message
from moescope.trace.names import live_trace_file
from moescope.util.files import OutputPathError, same_file

log = logging.getLogger("moescope.gui")

EXPORT_SHORTCUT = "Ctrl+Shift+E"
"""The main window's File ▸ Export trace shortcut: the same keys export the shown trace."""
STATUS_MS = 15000

EMPTY_TRACE = ("This trace holds no tokens yet. A session's trace begins when the model "
               "loads (or when Compare policies empties the cache) and gains a token with "
               "every one generated: chat first, then open it again.")


class TraceWindow(QMainWindow):
    closed = Signal(object)
    """This window, once closed: whoever opened it frees it (it holds the whole trace)."""
    exportFinished = Signal(object)
    """An export ended: its three files, or None (failed or cancelled; the status bar
    says which)."""

    def __init__(self, path: str | Path, reopened: ReopenedTrace,
                 parent: QWidget | None = None, *,
                 settings: QSettings | None = None) -> None:
        super().__init__(parent)
        self._closing = False  # closed, and its what-if's thread asked to end
        self._closed_said = False  # closed emitted
        self.path = Path(path)
        self.settings = settings
        """Where the last export's folder is remembered (None: the dialog starts at home)."""
        if reopened.cache is None or reopened.cost_choices is None:
            reopened = account(reopened)  # else the opener did, off this thread
        self.reopened = reopened
        model, tokens = reopened.model, reopened.tokens
        self.tokens = tokens
        name = session_title(model.name, reopened.trace.header.created, self.path)
        self.setWindowTitle(f"Trace: {name} — MoEScope")
        # the what-if table's ten columns, unscrolled, where the screen has room
        resize_within_screen(self, QSize(980, 760))
        body = QWidget()
        layout = QVBoxLayout(body)
        policies = sorted({t.policy for t in tokens})
        text = (f"{model.name} · {tokens_text(reopened.trace)} · policies: "
                f"{', '.join(policies) or '–'} · {self.path}")
        if reopened.trace.truncated:
            text += " · the recording was cut off (its last token is missing)"
        if reopened.approximate_from is not None:
            text += (f" · residency after the budget shrink at token "
                     f"{reopened.approximate_from} is approximate")
        info = QLabel(text)
        info.setWordWrap(True)
        info.setObjectName("statsLabel")
        self.export_button = QPushButton("E&xport…")
        self.export_button.setAccessibleName("Export this trace")
        self.export_button.setToolTip(
            f"Save a copy of this trace, with a Perfetto timeline and a CSV of every token "
            f"({EXPORT_SHORTCUT})")
        self.export_button.clicked.connect(self.export_dialog)
        top = QHBoxLayout()
        top.addWidget(info, 1)
        top.addWidget(self.export_button)
        layout.addLayout(top)
        prefetch = prefetch_overview(reopened)
        self.prefetch_label = QLabel(prefetch)
        """Session-wide prefetch accuracy; hidden when no token's policy prefetched."""
        self.prefetch_label.setObjectName("statsLabel")
        self.prefetch_label.setWordWrap(True)
        self.prefetch_label.setToolTip(PREFETCH_SESSION_TIP if reopened.prefetch else "")
        self.prefetch_label.setVisible(bool(prefetch))
        layout.addWidget(self.prefetch_label)
        self.empty_label = QLabel(EMPTY_TRACE)
        """Said instead of blank plots when the trace holds no token."""
        self.empty_label.setObjectName("warningLabel")
        self.empty_label.setWordWrap(True)
        self.empty_label.setVisible(not tokens)
        layout.addWidget(self.empty_label)
        self.panel = CachePanel(reopened.cache, live=False)
        self.panel.show_numbers()
        self.panel.time_plots.full_range = True
        self.panel.draw(force=True)
        self.whatif = WhatIfView(reopened.trace, cost_choices=reopened.cost_choices)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.panel, "P&lots")  # Alt+P: What-if's Policies
        # beside the tabs, where the bar has room: no height taken from the plots
        self.tabs.setCornerWidget(self._token_row(len(tokens)), Qt.Corner.TopRightCorner)
        self.tabs.currentChanged.connect(self._tab_shown)
        self.tabs.addTab(self.whatif, "&What-if")
        layout.addWidget(self.tabs, 1)
        if not tokens:  # nothing to replay: a sweep would draw a table of zeros
            self.tabs.setTabEnabled(1, False)
            self.tabs.setTabToolTip(1, "Nothing to replay: this trace has no tokens")
        elif self.whatif.nothing is not None:  # prefills only: the tab says why, in words
            self.tabs.setTabToolTip(1, self.whatif.nothing)
        name_tabs(self.tabs, "Trace views", [
            "The recorded run's heatmap and plots, per token and per layer",
            "Replay the recorded selections under other policies and budgets"])
        self.setCentralWidget(body)
        self._fitted = False
        # a window with no menu: without these only the mouse (or the window manager)
        # closed it
        self.close_action = QAction("Close", self)
        keys = [*QKeySequence.keyBindings(QKeySequence.StandardKey.Close),
                QKeySequence("Ctrl+W"), QKeySequence("Esc")]
        self.close_action.setShortcuts(list({k.toString(): k for k in keys}.values()))
        self.close_action.triggered.connect(self.close)
        self.addAction(self.close_action)
        self.export_action = QAction("Export trace…", self)
        self.export_action.setShortcut(QKeySequence(EXPORT_SHORTCUT))
        self.export_action.triggered.connect(self.export_dialog)
        self.addAction(self.export_action)
        self.statusBar()  # made now: the first export's message must not resize the window
        tooltip_follows_message(self.statusBar())  # clipped: whole on hover
        self.exports = TraceExporter(self, [self.export_action, self.export_button])
        """Runs this window's exports on a thread; Export is disabled while one runs."""
        self.exports.exported.connect(self._exported)
        self.exports.failed.connect(self._export_failed)
        self.exports.finished.connect(self.exportFinished)

    def _token_row(self, n: int) -> QWidget:
        """A slider choosing the token whose states the heatmap draws (the last at first):
        where each expert was, what each layer hit, fetched and substituted, token by
        token (the plots below show every token at once)."""
        box = QWidget()
        row = QHBoxLayout(box)
        row.setContentsMargins(8, 0, 2, 0)
        self.token_slider = QSlider(Qt.Orientation.Horizontal)
        self.token_slider.setAccessibleName("Heatmap token")
        self.token_slider.setToolTip(
            "The token whose expert states the heatmap shows: drag, use the arrow keys, "
            "Page Up/Down, Home and End, or click a token in the per-token plots (a dashed "
            "line marks it there). The heatmap's hover counts uses over the whole trace.")
        self.token_slider.setRange(0, max(n - 1, 0))
        self.token_slider.setValue(max(n - 1, 0))
        self.token_slider.setPageStep(max(1, n // 20))
        self.token_label = QLabel()
        self.token_label.setObjectName("statsLabel")
        label = QLabel("&Heatmap at")
        label.setBuddy(self.token_slider)
        row.addWidget(label)
        row.addWidget(self.token_slider, 1)
        row.addWidget(self.token_label)
        self.token_slider.valueChanged.connect(self.show_token)
        self.panel.time_plots.tokenClicked.connect(self._plot_clicked)
        self.token_slider.setMinimumWidth(80)
        self._scrubbable = n > 1 and self.reopened.packed_resident is not None
        box.setVisible(self._scrubbable)
        self._token_text(max(n - 1, 0))
        return box

    def _token_text(self, i: int) -> None:
        if not self.tokens:
            return
        text = f"token {self.tokens[i].step} of {self.tokens[-1].step}"
        # as wide as its longest text: the slider does not jump as the digits change
        longest = f"token {self.tokens[-1].step} of {self.tokens[-1].step}"
        self.token_label.setMinimumWidth(self.token_label.fontMetrics().horizontalAdvance(
            longest))
        self.token_label.setText(text)
        self.token_slider.setAccessibleDescription(text)

    @Slot(int)
    def show_token(self, i: int) -> None:
        """Draw the heatmap as it stood after the trace's ``i``-th token (its residency
        and what that token's rows did)."""
        if not 0 <= i < len(self.tokens):
            return
        last = i == len(self.tokens) - 1
        self.panel.model.show_token(
            None if last else replace(self.tokens[i], resident=self.reopened.resident(i)))
        self.panel.heatmap.refresh()
        self.panel.heatmap.update_title()
        self.panel.time_plots.show_cursor(None if last else self.tokens[i].step)
        self._token_text(i)

    @Slot(int)
    def _tab_shown(self, i: int) -> None:
        """The token slider is the Plots tab's: hidden beside What-if."""
        self.tabs.cornerWidget(Qt.Corner.TopRightCorner).setVisible(
            i == 0 and self._scrubbable)

    @Slot(float)
    def _plot_clicked(self, x: float) -> None:
        """A click in a per-token plot: the heatmap at the token nearest it."""
        if not self._scrubbable:
            return
        steps = [t.step for t in self.tokens]
        i = min(range(len(steps)), key=lambda j: abs(steps[j] - x))
        self.token_slider.setValue(i)

    def export_dialog(self) -> None:
        """Ask where to export the shown trace, then export it (nothing when cancelled)."""
        path = ask_export_path(self, self.path, self.settings)
        if path:
            self.export(path)

    def export(self, path: str | Path) -> TraceExport | None:
        """Start writing the shown trace, Perfetto JSON and a per-token CSV at ``path``
        (the trace named with its format's suffix), read from the file as it is now, on a
        thread; ``exportFinished`` says how it ended (the status bar says it to the user).
        None while another export runs."""
        return self.exports.start(self.path, path, self.settings)

    def _exported(self, trace: Path, files: tuple[Path, Path, Path]) -> None:
        self.statusBar().showMessage(saved_message(trace, files), STATUS_MS)

    def _export_failed(self, dest: Path, err: Exception) -> None:
        if (isinstance(err, OSError) and not isinstance(err, OutputPathError)
                and self._is_shown_trace(err.filename)):
            reason = (f"the trace {err.filename} can no longer be read "
                      f"({err.strerror or err}). Nothing was written.")
        elif isinstance(err, OutputPathError) and any(
                same_file(err.filename, p) for p in (self.path, live_trace_file(self.path))):
            # the shared wording, "is an input of this command", speaks of a command line;
            # and the clash may be the suffixed name, not the one typed
            reason = (f"{err.filename} is the trace this window shows (or a link to it); "
                      "refusing to overwrite it. Nothing was written there.")
        elif isinstance(err, OSError):
            reason = f"{dest}: {err.strerror or err}. Nothing was written there."
        else:  # a trace no longer readable, or with no token
            reason = str(err)
        message = f"Could not export the trace: {reason}"
        log.error("%s", message)
        self.statusBar().showMessage(" ".join(message.split()), STATUS_MS)

    def resizeEvent(self, event: QResizeEvent) -> None:
        """The token slider takes a third of a wide window (the tab bar's corner gives a
        widget its size hint, a short slider's)."""
        super().resizeEvent(event)
        self.token_slider.setFixedWidth(max(80, min(400, self.width() // 3 - 120)))

    def showEvent(self, event: QShowEvent) -> None:
        """At the first show, once laid out, give the heatmap its rows' height: the panel
        was filled before the window had a size, so its splitter split half and half and a
        6-layer heatmap's rows overlapped their labels."""
        super().showEvent(event)
        if not self._fitted:
            self._fitted = True
            QTimer.singleShot(0, self.panel.fit_heatmap)

    def _is_shown_trace(self, name: object) -> bool:
        """Whether a read error's file name is the trace this window shows (deleted or
        unreadable since it was opened): not the output's fault (an output refused for
        being the trace itself is an ``OutputPathError``, said as the output's)."""
        if not isinstance(name, str):
            return False
        return Path(name) in (self.path, live_trace_file(self.path))

    def closeEvent(self, event: QCloseEvent) -> None:
        """Stop the what-if's worker and join the export's thread (an export is cancelled:
        nothing of it is left). The window hides at once; ``closed`` (its owner frees it)
        waits for the what-if's thread, which a QThread must not outlive: a preparation
        ends its step in flight first (up to a second at 10,000 tokens), which the GUI
        thread used to wait for."""
        self.exports.shutdown()
        super().closeEvent(event)
        if not event.isAccepted() or self._closing:
            return
        self._closing = True
        if self.whatif.stop_thread():
            self._thread_ended()
            return
        self.whatif.threadEnded.connect(self._thread_ended)
        if not self.whatif.thread_running:  # it ended before the connection: no signal
            self._thread_ended()

    @Slot()
    def _thread_ended(self) -> None:
        if not self._closed_said:  # once, however it was heard
            self._closed_said = True
            self.closed.emit(self)
