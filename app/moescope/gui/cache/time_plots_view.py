"""Per-token curves: substituted gate mass, tokens/s, hit rate, fetched MB, audited KL.

Five x-linked plots over the session's token counter. They show a rolling window of the
latest tokens; long sessions stay cheap because the data is a ring-buffer view,
``setClipToView`` drops what is off screen and ``setDownsampling(mode="peak")`` keeps the
spikes when zoomed out. Policy and budget changes are vertical lines at the token where
they took effect.
"""

from __future__ import annotations

import math

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QFont, QTextOption
from PySide6.QtWidgets import QFrame, QScrollArea, QVBoxLayout, QWidget

from moescope.display.cache_model import CacheModel, Marker
from moescope.gui import theme

WINDOW_TOKENS = 256
"""How many of the latest tokens the x axis shows while streaming."""
X_STEP = 32
"""The window's right edge moves in steps of this many tokens, so the x axis (costly to
draw) changes a few times per second at most, not on every frame."""
MAX_MARKERS = 64
PLOT_MIN_PX = 78
"""Each plot keeps at least this height (title, a curve, its three y labels, two rows of
change labels); below it the plots scroll instead of flattening into lines without axes
(a 1024x700 screen)."""
COMPACT_PLOT_PX = 60
"""The least height in a short window (:meth:`TimePlotsView.set_compact`): the first two
plots whole without scrolling at 1024x700 and 12 pt (at 78 px the second one was below
the fold), one row of change labels."""
KEY_PLOTS = 2
"""The first plots (substituted mass, tokens/s): a short window keeps room for them whole
before optional controls (:meth:`TimePlotsView.key_plots_px`)."""
AXIS_PX = 34
"""The shared x axis under the last plot, with its "token" label."""
LABEL_ROWS = 3
"""Rows of marker labels at most, from the plot's top down, each a label's height below
the one before (as many as the plot's height holds): a label that would overlap the one
before it on a row goes to the next row; with every row taken it is left out (its line
stays, and the marker list in the tooltip names it)."""
LABEL_GAP_PX = 4
"""Room between two labels, on a row and between rows."""

AUDITS_OFF = ("Audits are off: set Quality audit (Cache controls) to every N tokens to "
              "measure quality")
"""Said in the audited-KL plot while the engine audits no token (it stayed empty, unsaid)."""
AUDITS_WAITING = "Quality audit every {every} tokens: the first audited token shows here"
AUDITS_NONE_IN_TRACE = "No audited tokens here: Quality audit was off while recording"

PLOTS: tuple[tuple[str, str], ...] = (
    ("mass", "substituted gate mass / token"),
    ("tokens_per_s", "tokens/s (rolling)"),
    ("hit_rate", "hit rate"),
    ("fetched_mb", "fetched MB / token"),
    ("audit_kl", "audited KL(exact || policy) / token"),
)


class TimePlotsView(QWidget):
    """The rolling per-token plots; ``refresh`` copies nothing but the visible window."""

    tokenClicked = Signal(float)
    """The x (token counter) of a left click in a plot."""

    def __init__(self, model: CacheModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.full_range = False
        """Show every token (a reopened trace) instead of the rolling window."""
        self.setAccessibleName("Per-token cache plots")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setAccessibleName(self.accessibleName())  # it takes the focus
        self.graphics.setAccessibleDescription(", ".join(title for _, title in PLOTS))
        # the plots' own minimums, plus the layout's spacing and margins
        self.compact = False
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the plots inside take it
        self.scroll.setWidget(self.graphics)
        layout.addWidget(self.scroll)
        self.plots: dict[str, pg.PlotItem] = {}
        self.curves: dict[str, pg.PlotDataItem] = {}
        self._marker_items: list[tuple[Marker, list[pg.InfiniteLine]]] = []
        self._y_tops: dict[str, float] = {}
        self.label_layout: list[tuple[str, float, int]] = []
        first: pg.PlotItem | None = None
        for i, (key, title) in enumerate(PLOTS):
            plot = self.graphics.addPlot(row=i, col=0)
            # pyqtgraph reserves 30 px for any title: 4 x 30 px of a short panel went to
            # four lines of 8 pt text, and the curves were squeezed flat
            plot.moescope_title_row = True
            theme.set_plot_title(plot, title)
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.setClipToView(True)
            plot.setDownsampling(auto=True, mode="peak")
            plot.disableAutoRange()
            plot.getAxis("left").setWidth(42)
            if i < len(PLOTS) - 1:
                plot.hideAxis("bottom")  # x is shared: one axis, under the last plot
            else:
                plot.setLabel("bottom", "token")
            theme.cache_axes(plot)
            if first is None:
                first = plot
            else:
                plot.setXLink(first)
            if key == "audit_kl":  # one point per audited token (NaN between them)
                curve = plot.plot(pen=None, symbol="o", symbolSize=4, symbolPen=None,
                                  symbolBrush=theme.CURVE[key])
            else:
                curve = plot.plot(pen=pg.mkPen(theme.CURVE[key], width=1.5), connect="finite")
            self.plots[key] = plot
            self.curves[key] = curve
        self._set_heights()
        # a narrower or shorter plot: the labels laid out again for its size
        self.plots["mass"].vb.sigResized.connect(lambda *_: self._place_labels())
        self.ttft_text = pg.TextItem(color=theme.MUTED, anchor=(1, 0))
        self.plots["tokens_per_s"].addItem(self.ttft_text, ignoreBounds=True)
        self.audit_every: int | None = 0
        """The engine audits every this many tokens (0: off; None: a reopened trace)."""
        self.audit_note = pg.TextItem(color=theme.MUTED, anchor=(0.5, 0.5))
        """Why the audited-KL plot is empty, in it; hidden once an audited token shows."""
        font = QFont(self.font())
        font.setPointSizeF(theme.SMALL_PT)
        self.audit_note.setFont(font)
        # wrapped to the plot's width, centred: one line was wider than the plot (1024 px)
        self.audit_note.textItem.document().setDefaultTextOption(
            QTextOption(Qt.AlignmentFlag.AlignHCenter))
        self.plots["audit_kl"].addItem(self.audit_note, ignoreBounds=True)
        self.plots["audit_kl"].vb.sigResized.connect(lambda *_: self._wrap_audit_note())
        self.cursor_lines: list[pg.InfiniteLine] = []
        """A dashed line in every plot at the token the heatmap shows (a reopened trace's,
        chosen with its slider or by a click on a plot); hidden otherwise."""
        for plot in self.plots.values():
            line = pg.InfiniteLine(angle=90, movable=False,
                                   pen=pg.mkPen(theme.MUTED, width=1, style=Qt.PenStyle.DashLine))
            line.setVisible(False)
            line.setZValue(10)
            plot.addItem(line, ignoreBounds=True)
            self.cursor_lines.append(line)
        self.graphics.scene().sigMouseClicked.connect(self._clicked)
        self._empty_axes()

    def set_audit_every(self, every: int | None) -> None:
        """The audit period now (0: off; None: a reopened trace's, recorded before)."""
        self.audit_every = every
        self._place_audit_note()

    def _place_audit_note(self, shown: bool | None = None,
                          at: tuple[float, float] | None = None) -> None:
        """The note in the middle of the audited-KL plot (``at``: that middle, where the
        plot's range is being changed) while it shows no audited token (``shown``: whether
        it does; None: as the curve's data says)."""
        if shown is None:
            shown = self.curves["audit_kl"].xData is not None and \
                len(self.curves["audit_kl"].xData) > 0
        if shown:
            self.audit_note.setVisible(False)
            return
        every = self.audit_every
        self.audit_note.setText(AUDITS_NONE_IN_TRACE if every is None else
                                AUDITS_WAITING.format(every=every) if every else AUDITS_OFF)
        if at is None:
            (lo, hi), (bottom, top) = self.plots["audit_kl"].vb.viewRange()
            at = ((lo + hi) / 2, (bottom + top) / 2)
        self.audit_note.setPos(*at)
        self.audit_note.setVisible(True)

    def _wrap_audit_note(self) -> None:
        self.audit_note.setTextWidth(max(80.0, self.plots["audit_kl"].vb.width() - 12))

    def audit_note_text(self) -> str:
        """What the audited-KL plot says in place of points ("" when it shows points)."""
        return self.audit_note.textItem.toPlainText() if self.audit_note.isVisible() else ""

    def _set_heights(self) -> None:
        least = COMPACT_PLOT_PX if self.compact else PLOT_MIN_PX
        # the plots' own minimums, plus the layout's spacing and margins
        self.graphics.setMinimumHeight((least + 6) * len(PLOTS) + AXIS_PX + 20)
        for i, plot in enumerate(self.plots.values()):
            plot.setMinimumHeight(least + (AXIS_PX if i == len(PLOTS) - 1 else 0))

    def set_compact(self, compact: bool) -> None:
        """A short window: the plots may be :data:`COMPACT_PLOT_PX` tall."""
        if compact != self.compact:
            self.compact = compact
            self._set_heights()

    @staticmethod
    def key_plots_px(*, compact: bool) -> int:
        """The height that shows the first :data:`KEY_PLOTS` plots whole, from the top."""
        return KEY_PLOTS * ((COMPACT_PLOT_PX if compact else PLOT_MIN_PX) + 6) + 6

    def show_cursor(self, step: float | None) -> None:
        """Mark ``step`` in every plot (None: no mark)."""
        for line in self.cursor_lines:
            if step is not None:
                line.setValue(step)
            line.setVisible(step is not None)

    def _clicked(self, event: object) -> None:
        """A left click in a plot: its token to whoever listens (``tokenClicked``)."""
        if getattr(event, "button", lambda: None)() != Qt.MouseButton.LeftButton:
            return
        pos = event.scenePos()  # type: ignore[attr-defined]
        for plot in self.plots.values():
            if plot.vb.sceneBoundingRect().contains(pos):
                self.tokenClicked.emit(float(plot.vb.mapSceneToView(pos).x()))
                return

    def _empty_axes(self) -> None:
        """Before the first token: the axes of an empty window (0..1, tokens 0..32), not
        pyqtgraph's default of four crowded labels between 0.2 and 0.8 per plot."""
        for key, plot in self.plots.items():
            plot.setYRange(0.0, 1.0, padding=0.02)
            self._set_y_ticks(key, 1.0)
        self.plots["mass"].setXRange(0, X_STEP, padding=0.0)
        self._place_audit_note(False, at=(X_STEP / 2, 0.5))

    def reset(self) -> None:
        while self._marker_items:
            self._drop_oldest_marker()
        for curve in self.curves.values():
            curve.setData([], [])
        self.ttft_text.setText("")
        self._empty_axes()

    def refresh(self) -> None:
        """Redraw the curves from the model's ring buffers (display timer)."""
        t = self.model.time
        if t.count == 0:
            return
        x = t.view("step")
        if self.full_range:
            lo, hi = float(x[0]), max(float(x[-1]), float(x[0]) + 8)
        else:
            hi = math.ceil(x[-1] / X_STEP) * X_STEP
            lo = max(0.0, hi - WINDOW_TOKENS)
        tops: dict[str, float] = {}
        audited_shown = False
        for key, curve in self.curves.items():
            y = t.view(key)
            if key == "audit_kl":
                audited = np.isfinite(y)
                curve.setData(x[audited], y[audited])
                audited_shown = bool((audited & (x >= lo)).any())
            else:
                curve.setData(x, y, connect="finite")
            visible = y[x >= lo]
            top = np.nanmax(visible) if np.isfinite(visible).any() else 0.0
            tops[key] = 1.0 if key == "hit_rate" else theme.nice_ceiling(float(top))
            self.plots[key].setYRange(0.0, tops[key], padding=0.02)
            self._set_y_ticks(key, tops[key])
        self.plots["mass"].setXRange(lo, hi, padding=0.0)
        self._place_audit_note(audited_shown, at=((lo + hi) / 2, tops["audit_kl"] / 2))
        if self.model.ttft_s is not None:
            self.ttft_text.setText(f"TTFT {self.model.ttft_s * 1000:.0f} ms")
            self.ttft_text.setPos(hi, tops["tokens_per_s"])
        self._sync_markers(lo)

    def _set_y_ticks(self, key: str, top: float) -> None:
        """Ticks (and grid lines) at 0, half and top only: the plots are short, and
        pyqtgraph's automatic ticks put four or five labels on top of each other at that
        height. The edge labels do not fit and are left out, so the half-way label reads
        alone: the top is twice it."""
        if self._y_tops.get(key) == top:
            return
        self._y_tops[key] = top
        ticks = [(v, f"{v:g}") for v in (0.0, top / 2, top)]
        self.plots[key].getAxis("left").setTicks([ticks, []])

    def y_tick_labels(self, key: str) -> list[str]:
        """The left axis's labels of plot ``key`` (for tests)."""
        ticks = self.plots[key].getAxis("left")._tickLevels
        return [label for _, label in ticks[0]] if ticks else []

    def _sync_markers(self, lo: float) -> None:
        known = {id(m) for m, _ in self._marker_items}
        for marker in self.model.markers[-MAX_MARKERS:]:
            if id(marker) in known:
                continue
            lines = []
            for key, plot in self.plots.items():
                line = pg.InfiniteLine(
                    pos=marker.step - 0.5, angle=90,
                    pen=pg.mkPen(theme.MARKER, width=1, style=pg.QtCore.Qt.PenStyle.DashLine),
                    label=marker.label if key == "mass" else None,
                    labelOpts={"position": 0.9, "color": theme.MARKER,
                               "anchors": [(0, 0.5), (0, 0.5)]})
                line.moescope_marker = True  # type: ignore[attr-defined]  # recoloured
                plot.addItem(line, ignoreBounds=True)
                lines.append(line)
            self._marker_items.append((marker, lines))
        while len(self._marker_items) > MAX_MARKERS:
            self._drop_oldest_marker()
        self._place_labels()

    def _place_labels(self) -> None:
        """Lay the visible markers' labels out so none overlaps another or leaves the
        plot: each sits right of its line (left of it near the right edge), on the first
        row where it clears the label before it; with no row free it is hidden. Sizes
        are the labels' own, in pixels: rows as a share of the plot's height (12 px
        apart in a 62 px plot) put 22 px labels over each other."""
        plot = self.plots["mass"]
        (lo, hi), width, height = plot.vb.viewRange()[0], plot.vb.width(), plot.vb.height()
        self.label_layout = []
        """(label, left px, row) of each label shown, for tests."""
        if width <= 0 or height <= 0 or hi <= lo:
            return
        px = width / (hi - lo)
        row_ends: list[float] = []
        for marker, lines in sorted(self._marker_items, key=lambda item: item[0].step):
            label = lines[0].label if lines else None
            if label is None:
                continue
            box = label.boundingRect()
            text_px, text_h = box.width(), box.height()
            if not row_ends:  # as many rows as the plot's height holds
                rows = int((height - LABEL_GAP_PX) // (text_h + LABEL_GAP_PX))
                row_ends = [-1e9] * max(1, min(LABEL_ROWS, rows))
            x = (marker.step - 0.5 - lo) * px
            if x < 0 or x > width:
                label.setVisible(False)
                continue
            right = x + text_px <= width
            left_px = x if right else x - text_px
            row = next((i for i, end in enumerate(row_ends)
                        if left_px >= end + LABEL_GAP_PX), None)
            if row is None or left_px < 0:
                label.setVisible(False)
                continue
            row_ends[row] = left_px + text_px
            label.anchors = [(0, 0.5), (0, 0.5)] if right else [(1, 0.5), (1, 0.5)]
            label.setVisible(True)
            # the row's middle, from the top, as the share of the line from its bottom
            middle = LABEL_GAP_PX / 2 + text_h / 2 + row * (text_h + LABEL_GAP_PX)
            label.setPosition(max(0.0, 1.0 - middle / height))
            self.label_layout.append((marker.label, left_px, row))
        tips = [f"token {m.step}: {m.label}" for m, _ in self._marker_items]
        self.graphics.setToolTip("Changes on these plots:\n" + "\n".join(tips[-12:])
                                 if tips else "")

    def _drop_oldest_marker(self) -> None:
        _, lines = self._marker_items.pop(0)
        for line in lines:
            vb = line.getViewBox()
            if vb is not None:
                vb.removeItem(line)

    def marker_labels(self) -> list[tuple[int, str]]:
        return [(m.step, m.label) for m, _ in self._marker_items]
