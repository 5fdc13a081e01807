"""The what-if view: predicted time per token against substituted mass, from a trace.

Each point is the recorded session replayed by the simulator under another policy and
budget (:mod:`moescope.gui.whatif_model`); one curve per policy joins its budgets, and the
session as recorded is a star. The sweep replays every token through the native core once
per point, which takes seconds on a long chat, so it runs on a :class:`SweepWorker` on its
own QThread (the GPT4All worker pattern of :mod:`moescope.gui.worker`): requests go in
through a queued signal, progress and the finished :class:`WhatIfResult` (plain data) come
back through signals, and the event loop never waits on a replay.
"""

from __future__ import annotations

import logging
import math

import pyqtgraph as pg
from PySide6.QtCore import QObject, QPointF, Qt, QThread, Signal, Slot
from PySide6.QtGui import QCursor, QFont, QShowEvent, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from moescope.core.trace import Trace
from moescope.gui import theme
from moescope.gui.whatif_model import (
    BUDGETS,
    COLUMNS,
    POLICIES,
    Cancelled,
    WhatIfResult,
    cell_text,
    compute,
    cost_model_choices,
    label,
    tooltip,
)
from moescope.sim import SweepRow

log = logging.getLogger(__name__)

SERIES_COLORS: tuple[str, ...] = ("#d8dce3", "#5aa9e6", "#e6915a", "#c06bd6", "#6bd68a",
                                  "#d6c36b")
"""One colour per policy curve, in the order of the sweep's policies (exact first)."""
HOVER_PX = 12.0
"""A point within this many pixels of the cursor is the one the tooltip describes."""
DEFAULT_COST = "pcie4"
"""The paper's hardware; ``calibrated`` (this machine) is one choice away when usable."""


class SweepWorker(QObject):
    """Runs :func:`compute` for the latest request on the worker thread.

    ``latest`` is the generation the view wants; a sweep whose generation is older stops at
    its next budget (a plain int written by the GUI thread and read here: assignment is
    atomic under the GIL). Signals carry the generation so the view drops stale answers.
    """

    progress = Signal(int, int, int)  # generation, done, total
    finished = Signal(int, object)  # generation, WhatIfResult
    failed = Signal(int, str)  # generation, message

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace
        self.latest = 0

    @Slot(int, str)
    def run(self, generation: int, cost_name: str) -> None:
        if generation != self.latest:
            return

        def report(done: int, total: int) -> bool:
            if generation != self.latest:
                return False
            self.progress.emit(generation, done, total)
            return True

        try:
            result = compute(self.trace, cost_name, POLICIES, BUDGETS, progress=report)
        except Cancelled:
            return
        except Exception as err:  # a replay error must reach the user, not kill the thread
            log.exception("what-if sweep failed")
            self.failed.emit(generation, str(err) or type(err).__name__)
            return
        self.finished.emit(generation, result)


class WhatIfView(QWidget):
    """Cost-model picker, progress, the mass x time scatter and the table of points.

    The first sweep starts when the view is first shown (opening a trace stays instant);
    picking another cost model starts a new one and abandons the old.
    """

    sweepFinished = Signal(object)  # WhatIfResult
    sweepFailed = Signal(str)
    _request = Signal(int, str)

    def __init__(self, trace: Trace, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.trace = trace
        self.result: WhatIfResult | None = None
        self.hovered: SweepRow | None = None
        self._generation = 0
        self._running = False
        self.setAccessibleName("What-if: policies and budgets replayed from this trace")

        self.cost = QComboBox()
        self.cost.setAccessibleName("Cost model")
        self.cost.setToolTip("How replayed copies turn into time per token")
        choices = cost_model_choices(trace)
        model = self.cost.model()
        for name, reason in choices.items():
            self.cost.addItem(name, name)
            if reason is not None and isinstance(model, QStandardItemModel):
                item = model.item(self.cost.count() - 1)
                item.setEnabled(False)
                item.setToolTip(reason)
        self.cost.setCurrentIndex(max(0, self.cost.findData(DEFAULT_COST)))
        self.cost.currentIndexChanged.connect(lambda _i: self.start())
        cost_label = QLabel("&Cost model:")
        cost_label.setBuddy(self.cost)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("What-if sweep progress")
        self.progress.setTextVisible(True)
        self.progress.setFormat("replaying %v of %m")
        self.progress.hide()
        self.status = QLabel("Shown when the sweep has run.")
        self.status.setObjectName("statsLabel")
        self.status.setWordWrap(True)
        top = QHBoxLayout()
        top.addWidget(cost_label)
        top.addWidget(self.cost)
        top.addWidget(self.progress, 1)

        self.plot = pg.PlotWidget()
        self.plot.setAccessibleName("Predicted time per token against substituted mass")
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.showGrid(x=True, y=True, alpha=0.15)
        item.setLabel("bottom", "substituted gate mass / token")
        item.setLabel("left", "predicted ms / token")
        for axis in ("left", "bottom"):
            item.getAxis(axis).enableAutoSIPrefix(False)  # the label already names the unit
        self.legend = item.addLegend(offset=(-10, 10))
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.recorded_item = pg.ScatterPlotItem(
            symbol="star", size=18, brush=pg.mkBrush(theme.MARKER),
            pen=pg.mkPen("#000000"), name="recorded session")
        self.plot.scene().sigMouseMoved.connect(self._hover)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setAccessibleName("What-if points")
        self.table.setHorizontalHeaderLabels([title for _, title in COLUMNS])
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.verticalHeader().hide()
        self.table.horizontalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents)

        splitter = QSplitter(Qt.Orientation.Vertical)
        splitter.addWidget(self.plot)
        splitter.addWidget(self.table)
        splitter.setSizes([360, 240])
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.status)
        layout.addWidget(splitter, 1)

        self._thread = QThread()
        self._thread.setObjectName("moescope-whatif")
        self._worker = SweepWorker(trace)
        self._worker.moveToThread(self._thread)
        self._request.connect(self._worker.run)
        self._worker.progress.connect(self._on_progress)
        self._worker.finished.connect(self._on_finished)
        self._worker.failed.connect(self._on_failed)

    @property
    def running(self) -> bool:
        return self._running

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self.result is None and not self._running:
            self.start()

    def start(self, cost_name: str | None = None) -> None:
        """Sweep with ``cost_name`` (default: the picker's); an older sweep is abandoned."""
        if cost_name is not None and cost_name != self.cost.currentData():
            index = self.cost.findData(cost_name)
            if index < 0:
                raise ValueError(f"unknown cost model {cost_name!r}")
            self.cost.setCurrentIndex(index)  # re-enters start() through the signal
            return
        name = str(self.cost.currentData())
        if not self._thread.isRunning():
            self._thread.start()
        self._generation += 1
        self._worker.latest = self._generation
        self._running = True
        self.progress.setRange(0, len(BUDGETS) + 1)
        self.progress.setValue(0)
        self.progress.show()
        self.status.setText(f"Replaying the trace under {len(POLICIES)} policies × "
                            f"{len(BUDGETS)} budgets ({name})…")
        self._request.emit(self._generation, name)

    def shutdown(self, timeout_ms: int = 10_000) -> bool:
        """Abandon any sweep (it stops at its next budget) and join the worker thread."""
        self._worker.latest = -1
        self._generation += 1
        self._running = False
        if not self._thread.isRunning():
            return True
        self._thread.quit()
        ok = bool(self._thread.wait(timeout_ms))
        if not ok:
            log.error("the what-if thread did not stop within %d ms", timeout_ms)
        return ok

    # ------------------------------------------------------------------ worker signals
    @Slot(int, int, int)
    def _on_progress(self, generation: int, done: int, total: int) -> None:
        if generation == self._generation:
            self.progress.setRange(0, total)
            self.progress.setValue(done)

    @Slot(int, object)
    def _on_finished(self, generation: int, result: WhatIfResult) -> None:
        if generation != self._generation:
            return
        self._running = False
        self.progress.hide()
        self.result = result
        self._fill_table(result)
        self._fill_plot(result)
        text = f"Cost model {result.cost_text}."
        if result.recorded_ms_per_token is not None:
            text += f" Measured while recording: {result.recorded_ms_per_token:.3f} ms/token."
        text += "".join(f" Warning: {w}" for w in result.warnings)
        self.status.setText(text)
        self.sweepFinished.emit(result)

    @Slot(int, str)
    def _on_failed(self, generation: int, message: str) -> None:
        if generation != self._generation:
            return
        self._running = False
        self.progress.hide()
        self.status.setText(f"The what-if sweep failed: {message}")
        self.sweepFailed.emit(message)

    # ------------------------------------------------------------------ drawing
    def _fill_table(self, result: WhatIfResult) -> None:
        points = result.points()
        self.table.setRowCount(len(points))
        bold = QFont()
        bold.setBold(True)
        for r, row in enumerate(points):
            for c, (key, _) in enumerate(COLUMNS):
                cell = QTableWidgetItem(cell_text(row, key))
                cell.setToolTip(tooltip(row))
                if c >= 2:
                    cell.setTextAlignment(Qt.AlignmentFlag.AlignRight
                                          | Qt.AlignmentFlag.AlignVCenter)
                if row is result.recorded:
                    cell.setFont(bold)
                self.table.setItem(r, c, cell)

    def _fill_plot(self, result: WhatIfResult) -> None:
        item = self.plot.getPlotItem()
        for curve in self.curves.values():
            item.removeItem(curve)
        self.curves.clear()
        if self.recorded_item.scene() is not None:
            item.removeItem(self.recorded_item)
        self.legend.clear()
        for i, (policy, rows) in enumerate(result.series().items()):
            color = SERIES_COLORS[i % len(SERIES_COLORS)]
            self.curves[policy] = item.plot(
                [r.mass_per_token for r in rows], [r.est_ms_per_token for r in rows],
                pen=pg.mkPen(color, width=1.5), symbol="o", symbolSize=8,
                symbolBrush=pg.mkBrush(color), symbolPen=pg.mkPen(color), name=policy)
        if result.recorded is not None:
            rec = result.recorded
            self.recorded_item.setData([rec.mass_per_token], [rec.est_ms_per_token])
            item.addItem(self.recorded_item)
        item.enableAutoRange()
        fastest = min(result.points(), key=lambda r: r.est_ms_per_token, default=None)
        if fastest is not None:
            self.plot.setAccessibleDescription(
                f"{len(result.points())} points; fastest {label(fastest)} at "
                f"{fastest.est_ms_per_token:.3f} ms/token with mass "
                f"{fastest.mass_per_token:.3f}")

    # ------------------------------------------------------------------ hover
    def point_at(self, scene_pos: QPointF) -> SweepRow | None:
        """The point drawn nearest ``scene_pos``, if within :data:`HOVER_PX`."""
        if self.result is None:
            return None
        vb = self.plot.getPlotItem().vb
        best: tuple[float, SweepRow] | None = None
        for row in self.result.points():
            p = vb.mapViewToScene(QPointF(row.mass_per_token, row.est_ms_per_token))
            d = math.hypot(p.x() - scene_pos.x(), p.y() - scene_pos.y())
            if d <= HOVER_PX and (best is None or d < best[0]):
                best = (d, row)
        return best[1] if best is not None else None

    def _hover(self, scene_pos: QPointF) -> None:
        row = self.point_at(scene_pos)
        if row is self.hovered:
            return
        self.hovered = row
        text = tooltip(row) if row is not None else ""
        self.plot.setToolTip(text)
        if text:
            QToolTip.showText(QCursor.pos(), text, self.plot)
        else:
            QToolTip.hideText()
