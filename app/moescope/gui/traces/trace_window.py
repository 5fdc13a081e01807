"""A recorded session, reopened: the same cache panel, filled from a trace file.

The panel is fed the trace's snapshots through the same :class:`CacheModel` code as a
live session, so the curves and bars are the numbers the live window showed. A line above
it gives PSR's prefetch accuracy over the whole session (hidden when no policy prefetched,
"not recorded" for a trace from before the counters). A second tab, the what-if view,
replays the trace under other policies and budgets, prefetch accuracy included.
"""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import QSize, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QLabel, QMainWindow, QTabWidget, QVBoxLayout, QWidget

from moescope.display.trace_io import PREFETCH_SESSION_TIP, ReopenedTrace, prefetch_overview
from moescope.gui.cache.panel import CachePanel
from moescope.gui.traces.whatif_view import WhatIfView
from moescope.gui.widgets.screen_fit import resize_within_screen

EMPTY_TRACE = ("This trace holds no tokens yet. A session's trace begins when the model "
               "loads (or when Compare policies empties the cache) and gains a token with "
               "every one generated: chat first, then open it again.")


class TraceWindow(QMainWindow):
    closed = Signal(object)
    """This window, once closed: whoever opened it frees it (it holds the whole trace)."""

    def __init__(self, path: str | Path, reopened: ReopenedTrace,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.path = Path(path)
        self.reopened = reopened
        model, tokens = reopened.model, reopened.tokens
        self.tokens = tokens
        self.setWindowTitle(f"Trace: {self.path.name} — MoEScope")
        # the what-if table's ten columns, unscrolled, where the screen has room
        resize_within_screen(self, QSize(980, 760))
        body = QWidget()
        layout = QVBoxLayout(body)
        policies = sorted({t.policy for t in tokens})
        text = (f"{model.name} · {len(tokens)} tokens · policies: "
                f"{', '.join(policies) or '–'} · {self.path}")
        if reopened.trace.truncated:
            text += " · the recording was cut off (its last token is missing)"
        if reopened.approximate_from is not None:
            text += (f" · residency after the budget shrink at token "
                     f"{reopened.approximate_from} is approximate")
        info = QLabel(text)
        info.setWordWrap(True)
        info.setObjectName("statsLabel")
        layout.addWidget(info)
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
        self.panel = CachePanel(live=False)
        self.panel.set_model(model)
        self.panel.add_snapshots(tokens)
        self.panel.time_plots.full_range = True
        self.panel.draw(force=True)
        self.whatif = WhatIfView(reopened.trace)
        self.tabs = QTabWidget()
        self.tabs.setAccessibleName("Trace views")
        self.tabs.addTab(self.panel, "P&lots")  # Alt+P: What-if's Policies
        self.tabs.addTab(self.whatif, "&What-if")
        layout.addWidget(self.tabs, 1)
        if not tokens:  # nothing to replay: a sweep would draw a table of zeros
            self.tabs.setTabEnabled(1, False)
            self.tabs.setTabToolTip(1, "Nothing to replay: this trace has no tokens")
        self.setCentralWidget(body)
        # a window with no menu: without these only the mouse (or the window manager)
        # closed it
        self.close_action = QAction("Close", self)
        keys = [*QKeySequence.keyBindings(QKeySequence.StandardKey.Close),
                QKeySequence("Ctrl+W"), QKeySequence("Esc")]
        self.close_action.setShortcuts(list({k.toString(): k for k in keys}.values()))
        self.close_action.triggered.connect(self.close)
        self.addAction(self.close_action)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Join the what-if sweep's thread: a QThread must not outlive its window."""
        self.whatif.shutdown()
        super().closeEvent(event)
        if event.isAccepted():
            self.closed.emit(self)
