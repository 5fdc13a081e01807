"""The what-if view: predicted time per token against substituted mass, from a trace.

Each point is the recorded session replayed by the simulator under another policy and
budget (:mod:`moescope.display.whatif_model`); one curve per policy joins its budgets, and the
session as recorded is a star. The sweep replays every token through the native core once
per point, which takes seconds on a long chat, so it runs on a :class:`SweepWorker` on its
own QThread (the GPT4All worker pattern of :mod:`moescope.gui.worker`): requests go in
through a queued signal, progress and the finished :class:`WhatIfResult` (plain data) come
back through signals, and the event loop never waits on a replay. Which presets are swept
is the user's choice (the "Policies" menu); paper 2's cache-prior and psr are in by default.
"""

from __future__ import annotations

import logging
import math
import textwrap

import pyqtgraph as pg
from PySide6.QtCore import QObject, QPointF, Qt, QThread, Signal, SignalInstance, Slot
from PySide6.QtGui import QAction, QCursor, QFont, QShowEvent, QStandardItemModel
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QMenu,
    QProgressBar,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QToolButton,
    QToolTip,
    QVBoxLayout,
    QWidget,
)

from moescope.display.policy_choices import POLICY_CHOICES, POLICY_TIPS
from moescope.display.whatif_model import (
    BUDGETS,
    COLUMNS,
    REFERENCE,
    Cancelled,
    WhatIfResult,
    cell_text,
    column_tips,
    compute,
    cost_model_choices,
    default_policies,
    label,
    nothing_to_compare,
    preset_choices,
    status_text,
    status_tooltip,
    tooltip,
)
from moescope.gui import theme
from moescope.gui.widgets.note_area import NoteArea
from moescope.sim import Routing, SweepRow
from moescope.trace import Trace
from moescope.util.errors import MoEScopeError

log = logging.getLogger(__name__)

SERIES_COLORS: dict[str, str] = {
    "exact": "#d8dce3", "quality-first": "#5aa9e6", "speed-first": "#e6915a",
    "cache-prior": "#6bd68a", "psr": "#d6c36b", "substitute-all": "#c06bd6",
    "threshold": "#6bc6d6", "first-choice": "#e5534b",
}
"""One colour per policy, fixed, so a curve keeps its colour when others are added."""
POLICY_LABELS: dict[str, str] = {key: text for key, text in POLICY_CHOICES}
HOVER_PX = 12.0
"""A point within this many pixels of the cursor is the one the tooltip describes."""
STOP_TEXT, REPLAY_TEXT = "&Stop", "&Replay"
"""The button beside the progress bar while a sweep runs, and once it was stopped."""
LEGEND_ROWS = 7
"""The legend, beside the plot, takes a second column past this many entries."""
DEFAULT_COST = "pcie4"
"""The paper's hardware; ``calibrated`` (this machine) is one choice away when usable."""
LAYOUT_TEXT = ("Reading the trace's router inputs for the replay (the first sweep only; "
               "a few seconds for a long session)…")
PLAN_TEXT = "Ranking each row's experts and planning the replay (the first sweep only)…"
AHEAD_TEXT = ("Preparing the trace for the replay (reading its router inputs, ranking each "
              "row's experts, planning the replay: once per trace)…")
"""The status line while the first sweep prepares the trace, the progress bar busy: until
the replay reports its first layer, the bar would otherwise sit at 0%."""


def stopped_text(shown: WhatIfResult | None, picked: str) -> str:
    """The line once a sweep is stopped: the points still drawn are the last finished
    sweep's, and the cost model they were priced with is named, since the picker may
    already show another (stopping a sweep started by picking it left pcie4's times under
    "pcie5")."""
    text = "Stopped. Replay the trace, or pick a cost model or policies, to sweep again."
    if shown is None:
        return text
    other = "" if shown.cost_name == picked else f", not {picked}"
    return (f"{text} The points shown are the last finished sweep's, priced by the "
            f"{shown.cost_name} cost model{other}.")


class SweepWorker(QObject):
    """Runs :func:`compute` for the latest request on the worker thread.

    ``latest`` is the generation the view wants; a sweep whose generation is older stops
    within a layer of each configuration it is replaying (its progress callback, polled about
    20 times a second, says so; ``latest`` is a plain int written by the GUI thread and read
    here: assignment is atomic under the GIL). Signals carry the generation so the view
    drops stale answers.
    """

    progress = Signal(int, int, int)  # generation, done, total
    preparing = Signal(int, str)  # generation, what the first sweep does before replaying
    finished = Signal(int, object)  # generation, WhatIfResult
    failed = Signal(int, str)  # generation, message
    prepared = Signal()  # the preparation ahead ended (done, stopped or failed)

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace
        self.latest = 0
        self.routing: Routing | None = None
        """The trace laid out for the replay and its rows ranked, made by the first sweep
        and kept for the later ones (seconds on a long trace)."""

    @Slot()
    def prepare(self) -> None:
        """Lay the trace out, rank its rows and plan the replay before any sweep is asked
        for (the window opens on its plots): the first sweep then replays at once (a
        10,000-token trace of Qwen3-Next's shape: about 0.7 s spared). A sweep asked for
        meanwhile waits for it, on this thread; a failure here is the sweep's to say."""
        def closed() -> bool:  # the view shut down: it waits only for the step in flight
            return self.latest < 0

        try:
            if closed():
                return
            if self.routing is None:
                self.routing = Routing.from_trace(self.trace)
            self.routing.prepare(cancelled=closed)
        except MoEScopeError as err:  # the trace's: the sweep meets it again and says it
            log.info("the what-if could not be prepared ahead: %s", err)
        except Exception:  # a bug: the sweep lays out and plans again, and says what fails
            log.exception("preparing the what-if ahead failed")
        finally:
            self.prepared.emit()

    @Slot(int, str, object)
    def run(self, generation: int, cost_name: str, policies: tuple[str, ...]) -> None:
        if generation != self.latest:
            return

        def report(done: int, total: int) -> bool:
            if generation != self.latest:
                return False
            self.progress.emit(generation, done, total)
            return True

        try:
            if self.routing is None:
                self.preparing.emit(generation, LAYOUT_TEXT)
                self.routing = Routing.from_trace(self.trace)
            if self.routing.plan is None:  # the batch ranks and plans before its first layer
                self.preparing.emit(generation, PLAN_TEXT)
            result = compute(self.trace, cost_name, policies, BUDGETS, progress=report,
                             routing=self.routing)
        except Cancelled:
            return
        except Exception as err:  # a replay error must reach the user, not kill the thread
            log.exception("what-if sweep failed")
            self.failed.emit(generation, str(err) or type(err).__name__)
            return
        self.finished.emit(generation, result)


class WhatIfView(QWidget):
    """Cost-model picker, progress (with Stop while a sweep runs), the mass x time scatter
    and the table of points.

    The first sweep starts when the view is first shown; before that (:attr:`prepare_ahead`)
    its worker lays the trace out and plans the replay, so that sweep replays at once
    (opening a trace stays instant). Picking another cost model starts a new sweep and
    abandons the old.
    """

    sweepFinished = Signal(object)  # WhatIfResult
    sweepFailed = Signal(str)
    _request = Signal(int, str, object)
    _prepare = Signal()
    prepare_ahead = True
    """Whether a new view's worker prepares the first sweep's layout and plan at once."""

    def __init__(self, trace: Trace, parent: QWidget | None = None, *,
                 cost_choices: dict[str, str | None] | None = None) -> None:
        """``cost_choices``: :func:`cost_model_choices` of ``trace`` if worked out already
        (calibrating the models reads every token: the opener does it off this thread)."""
        super().__init__(parent)
        self.trace = trace
        self.result: WhatIfResult | None = None
        self.hovered: SweepRow | None = None
        self._generation = 0
        self._running = False
        self._stopped = False
        """The user stopped the last sweep: showing the view again does not restart it."""
        self._preparing = False  # the bar is busy until the replay's first layer
        self._replay_text = ""
        self.setAccessibleName("What-if: policies and budgets replayed from this trace")

        self.cost = QComboBox()
        self.cost.setAccessibleName("Cost model")
        self.cost.setToolTip("How replayed copies turn into time per token")
        choices = cost_choices if cost_choices is not None else cost_model_choices(trace)
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
        self.policy_button = QToolButton()
        self.policy_button.setText("&Policies")
        self.policy_button.setAccessibleName("Policies to replay")
        self.policy_button.setToolTip("Which presets the sweep replays (exact is always in: "
                                      "speed-ups are measured against it)")
        self.policy_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.policy_menu = QMenu(self.policy_button)
        self.policy_menu.setToolTipsVisible(True)
        self.policy_actions: dict[str, QAction] = {}
        defaults = default_policies(trace)
        for name, reason in preset_choices(trace).items():
            action = self.policy_menu.addAction(POLICY_LABELS.get(name, name))
            action.setCheckable(True)
            action.setChecked(name in defaults or name == REFERENCE)
            action.setEnabled(reason is None and name != REFERENCE)
            action.setToolTip(reason or POLICY_TIPS.get(name, ""))
            action.toggled.connect(lambda _on: self.start())
            self.policy_actions[name] = action
        self.policy_button.setMenu(self.policy_menu)
        self.progress = QProgressBar()
        self.progress.setAccessibleName("What-if sweep progress")
        self.progress.setTextVisible(True)
        self.progress.setFormat("replaying: %p%")
        self.progress.hide()
        self.stop_button = QToolButton()
        self.stop_button.setText(STOP_TEXT)
        self.stop_button.setAccessibleName("Stop or replay the what-if sweep")
        self.stop_button.setToolTip("Stop replaying (the batch stops within a layer); once "
                                    "stopped, replay the trace again")
        self.stop_button.clicked.connect(self._stop_or_replay)
        self.stop_button.hide()
        for widget in (self.progress, self.stop_button):  # hidden, they keep their room:
            policy = widget.sizePolicy()  # the controls beside them never move under the
            policy.setRetainSizeWhenHidden(True)  # pointer when a sweep starts or ends
            widget.setSizePolicy(policy)
        self.status = QLabel("Shown when the sweep has run.")
        self.status.setObjectName("statsLabel")
        self.status.setWordWrap(True)
        self.status_area = NoteArea(self.status)
        """The note scrolls where the window is too small for all of it (500x400 cut it)."""
        top = QHBoxLayout()
        top.addWidget(cost_label)
        top.addWidget(self.cost)
        top.addWidget(self.policy_button)
        top.addWidget(self.progress, 1)
        top.addWidget(self.stop_button)

        self.plot = pg.PlotWidget()
        self.plot.setAccessibleName("Predicted time per token against substituted mass")
        item = self.plot.getPlotItem()
        item.setMenuEnabled(False)
        item.hideButtons()
        item.showGrid(x=True, y=True, alpha=0.15)
        n_layers = trace.header.model.n_layers  # the mass sums them: up to n_layers, not 1
        item.setLabel("bottom", f"substituted gate mass / token (summed over {n_layers} "
                                f"MoE layers)")
        item.setLabel("left", "predicted ms / token")
        for axis in ("left", "bottom"):
            item.getAxis(axis).enableAutoSIPrefix(False)  # the label already names the unit
        # beside the axes, not over them: inside, it hid whichever points fell under it
        # (substitute-all's, far right, at 1024x600)
        self.legend = pg.LegendItem()
        item.layout.addItem(self.legend, 2, 3)
        item.legend = self.legend  # plot(name=...) adds each curve to it
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.recorded_item = pg.ScatterPlotItem(
            symbol="star", size=18, brush=pg.mkBrush(theme.MARKER),
            pen=pg.mkPen("#000000"), name="recorded session")
        self.plot.scene().sigMouseMoved.connect(self._hover)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setAccessibleName("What-if points")
        self.table.setHorizontalHeaderLabels([title for _, title in COLUMNS])
        tips = column_tips(n_layers)
        for c, (key, _) in enumerate(COLUMNS):
            header = self.table.horizontalHeaderItem(c)
            if header is not None:
                # a plain tooltip is one line, however long: wrapped here
                header.setToolTip("\n".join(textwrap.wrap(tips[key], 64)))
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
        layout.addWidget(self.status_area)
        layout.addWidget(splitter, 1)
        self.nothing = nothing_to_compare(trace)
        """Why there is nothing to sweep (a trace of prefills only), said instead of the
        grid; None when the trace has a decoded token."""
        if self.nothing is not None:
            self.status.setObjectName("warningLabel")
            self.status.setText(self.nothing)
            for widget in (self.cost, self.policy_button):
                widget.setEnabled(False)
                widget.setToolTip(self.nothing)
            splitter.hide()
            layout.addStretch(1)

        self._thread = QThread()
        self._thread.setObjectName("moescope-whatif")
        self._worker = SweepWorker(trace)
        self._worker.moveToThread(self._thread)
        self._request.connect(self._worker.run)
        self._prepare.connect(self._worker.prepare)
        self._worker.prepared.connect(self._on_prepared)
        self._worker.progress.connect(self._on_progress)
        self._worker.preparing.connect(self._on_preparing)
        self._worker.finished.connect(self._on_finished)
        self._worker.failed.connect(self._on_failed)
        self._ahead = False
        """The worker is preparing ahead: a sweep asked for meanwhile says so."""
        if self.nothing is None and self.prepare_ahead:
            # on the worker, while the window shows its plots: opening stays instant
            self._thread.start()
            self._ahead = True
            self._prepare.emit()

    @property
    def running(self) -> bool:
        return self._running

    def policies(self) -> tuple[str, ...]:
        """The presets the next sweep replays, in menu order (the reference first)."""
        return tuple(name for name, action in self.policy_actions.items()
                     if action.isChecked())

    def set_policies(self, names: tuple[str, ...] | list[str]) -> None:
        """Check exactly ``names`` (plus the reference; not what this trace cannot replay)
        and sweep once, as picking them in the menu would, without a sweep per click."""
        unknown = set(names) - set(self.policy_actions)
        if unknown:
            raise ValueError(f"unknown policies: {', '.join(sorted(unknown))}")
        for name, action in self.policy_actions.items():
            action.blockSignals(True)
            action.setChecked((name in names and action.isEnabled()) or name == REFERENCE)
            action.blockSignals(False)
        self.start()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        if self.result is None and not self._running and not self._stopped \
                and self.nothing is None:
            self.start()

    def start(self, cost_name: str | None = None) -> None:
        """Sweep with ``cost_name`` (default: the picker's); an older sweep is abandoned.
        Nothing when the trace has no decoded token (:attr:`nothing` says so)."""
        if self.nothing is not None:
            return
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
        self._stopped = False
        # busy until the replay's first layer: the worker may still be laying the trace out
        # and planning, for this sweep or for one abandoned mid-way (whose work this reuses)
        self._preparing = True
        self.progress.setRange(0, 0)
        self.progress.show()
        self.stop_button.setText(STOP_TEXT)
        self.stop_button.show()
        policies = self.policies()
        self._replay_text = (f"Replaying the trace under {len(policies)} policies × "
                             f"{len(BUDGETS)} budgets ({name})…")
        # the worker still preparing ahead: the sweep waits for it, and says what it is
        self.status.setText(AHEAD_TEXT if self._ahead else self._replay_text)
        self.status.setToolTip("")
        self._request.emit(self._generation, name, policies)

    def stop(self) -> None:
        """Stop the running sweep: its batch stops within a layer of each configuration it
        was replaying, and nothing it computed is shown. The button then replays again."""
        if not self._running:
            return
        self._generation += 1
        self._worker.latest = self._generation  # no request carries it: the sweep is stale
        self._running = False
        self._stopped = True
        self.progress.hide()
        self.stop_button.setText(REPLAY_TEXT)
        self.status.setText(stopped_text(self.result, str(self.cost.currentData())))
        self.status.setToolTip(status_tooltip(self.result) if self.result is not None else "")

    def _stop_or_replay(self) -> None:
        if self._running:
            self.stop()
        else:
            self.start()

    def stop_thread(self) -> bool:
        """Abandon any sweep or preparation (it stops within a layer, or after the
        preparation's step in flight) and ask the worker thread to end, without waiting:
        True when it has ended, else ``threadEnded`` says when."""
        self._worker.latest = -1
        self._generation += 1
        self._running = False
        if not self._thread.isRunning():
            return True
        self._thread.quit()
        return self._thread.isFinished()

    @property
    def thread_running(self) -> bool:
        return bool(self._thread.isRunning())

    @property
    def threadEnded(self) -> SignalInstance:
        """The worker thread's ``finished`` (emitted from it: connect bound slots)."""
        return self._thread.finished

    def shutdown(self, timeout_ms: int = 10_000) -> bool:
        """Abandon any sweep (it stops within a layer) and join the worker thread."""
        if self.stop_thread():
            return True
        ok = bool(self._thread.wait(timeout_ms))
        if not ok:
            log.error("the what-if thread did not stop within %d ms", timeout_ms)
        return ok

    # ------------------------------------------------------------------ worker signals
    @Slot(int, int, int)
    def _on_progress(self, generation: int, done: int, total: int) -> None:
        if generation != self._generation or (self._preparing and done == 0):
            return
        if self._preparing:
            self._preparing = False
            self.status.setText(self._replay_text)
        self.progress.setRange(0, total)
        self.progress.setValue(done)

    @Slot()
    def _on_prepared(self) -> None:
        self._ahead = False

    @Slot(int, str)
    def _on_preparing(self, generation: int, text: str) -> None:
        # an abandoned sweep's preparation is named too while this one waits for it: the
        # worker finishes it (layout, ranking, plan: kept for this sweep) before this starts
        if not (generation == self._generation or (self._running and self._preparing)):
            return
        self._preparing = True
        self.progress.setRange(0, 0)  # busy: no share of the work is known yet
        self.status.setText(text)

    @Slot(int, object)
    def _on_finished(self, generation: int, result: WhatIfResult) -> None:
        if generation != self._generation:
            return
        self._running = False
        self.progress.hide()
        self.stop_button.hide()
        self.result = result
        self._fill_table(result)
        self._fill_plot(result)
        self.status.setText(status_text(result))
        self.status.setToolTip(status_tooltip(result))
        self.sweepFinished.emit(result)

    @Slot(int, str)
    def _on_failed(self, generation: int, message: str) -> None:
        if generation != self._generation:
            return
        self._running = False
        self.progress.hide()
        self.stop_button.hide()
        self.status.setText(f"The what-if sweep failed: {message}")
        self.status.setToolTip("")
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
                cell.setToolTip(tooltip(row, result.recorded_audit
                                        if row is result.recorded else None))
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
        for policy, rows in result.series().items():
            color = (theme.TEXT if policy == "exact"  # the reference: the text's colour
                     else SERIES_COLORS.get(policy, theme.MUTED))
            self.curves[policy] = item.plot(
                [r.mass_per_token for r in rows], [r.est_ms_per_token for r in rows],
                pen=pg.mkPen(color, width=1.5), symbol="o", symbolSize=8,
                symbolBrush=pg.mkBrush(color), symbolPen=pg.mkPen(color), name=policy)
        if result.recorded is not None:
            rec = result.recorded
            self.recorded_item.setData([rec.mass_per_token], [rec.est_ms_per_token])
            item.addItem(self.recorded_item)
        # beside the plot, one column would be taller than a laptop's plot: two past seven
        self.legend.setColumnCount(2 if len(self.legend.items) > LEGEND_ROWS else 1)
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
        audit = self.result.recorded_audit if self.result is not None and \
            row is self.result.recorded else None
        text = tooltip(row, audit) if row is not None else ""
        self.plot.setToolTip(text)
        if text:
            QToolTip.showText(QCursor.pos(), text, self.plot)
        else:
            QToolTip.hideText()
