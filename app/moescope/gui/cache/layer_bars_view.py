"""Per-layer bars: where the substituted mass, the hits and the copies happen.

Averages over the model's last ``layer_window`` tokens (one token per layer is too noisy to
read), so a layer whose experts keep missing stands out. While the policy prefetches (PSR),
the view's tooltip lists each layer's prefetch accuracy: a layer whose predictions miss is
where prefetch wastes copies.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QFontMetrics
from PySide6.QtWidgets import QFrame, QScrollArea, QVBoxLayout, QWidget

from moescope.display.cache_model import CacheModel, PrefetchSummary
from moescope.gui import theme

BAR_MIN_PX = 84
"""Each chart keeps at least this height; the charts are stacked (three side by side in
a 450 px panel clipped their labels) and scroll when the panel is shorter."""

BARS: tuple[tuple[str, str], ...] = (
    ("mass", "mass / token per layer"),
    ("hit_rate", "hit rate per layer"),
    ("fetched_mb", "fetched MB / token per layer"),
)


class LayerBarsView(QWidget):
    def __init__(self, model: CacheModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.setAccessibleName("Per-layer cache bars")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setAccessibleName(self.accessibleName())  # it takes the focus
        self.graphics.setAccessibleDescription(", ".join(title for _, title in BARS))
        self.graphics.setMinimumHeight((BAR_MIN_PX + 6) * len(BARS) + 40)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the plots inside take it
        self.scroll.setWidget(self.graphics)
        layout.addWidget(self.scroll)
        self.plots: dict[str, pg.PlotItem] = {}
        self.bars: dict[str, pg.BarGraphItem] = {}
        self._y_tops: dict[str, float] = {}
        self._y_ticks: dict[str, tuple[float, int]] = {}
        for row, (key, title) in enumerate(BARS):
            plot = self.graphics.addPlot(row=row, col=0)
            theme.set_plot_title(plot, title)
            plot.setMenuEnabled(False)
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            plot.getAxis("left").setWidth(42)
            plot.setMinimumHeight(BAR_MIN_PX)
            if row == len(BARS) - 1:
                plot.setLabel("bottom", "layer")
            theme.cache_axes(plot)
            bars = pg.BarGraphItem(x=[0], height=[0], width=0.8,
                                   brush=theme.CURVE[key], pen=None)
            plot.addItem(bars)
            self.plots[key] = plot
            self.bars[key] = bars
            # a taller or shorter chart (a font size, the panel's height): its labels again
            plot.vb.sigResized.connect(lambda *_a, k=key: self._set_y_ticks(k))
        self.values: dict[str, np.ndarray] = {}
        self.prefetch_tip = ""
        self.reset()

    def reset(self) -> None:
        layers = self.model.model.moe_layers if self.model.model else ()
        n = max(len(layers), 1)
        step = max(1, len(layers) // 16)
        ticks = [[(i, str(layer)) for i, layer in enumerate(layers) if i % step == 0]]
        for key, plot in self.plots.items():
            plot.getAxis("bottom").setTicks(ticks)
            plot.setXRange(-0.6, n - 0.4, padding=0)
            self.bars[key].setOpts(x=np.arange(n), height=np.zeros(n))
        self.values = {}

    def refresh(self) -> None:
        means = self.model.layer_means()
        self.values = means
        for key, values in means.items():
            if len(values) == 0:
                continue
            self.bars[key].setOpts(x=np.arange(len(values)), height=values)
            top = 1.0 if key == "hit_rate" else theme.nice_ceiling(float(values.max()))
            self.plots[key].setYRange(0, top, padding=0)
            self._set_y_ticks(key, top)
        tip = self._prefetch_tip(self.model.layer_prefetch())
        if tip != self.prefetch_tip:  # a tooltip change is cheap, but not free at 30 Hz
            self.prefetch_tip = tip
            self.setToolTip(tip)

    def _set_y_ticks(self, key: str, top: float | None = None) -> None:
        """Labels at 0, half and top where the chart has a line of its font and a gap
        between them, else at 0 and top: pyqtgraph's own ticks put five labels (0, 0.05 … 0.20)
        over each other in a 40 px chart at 12 pt."""
        top = self._y_tops.get(key) if top is None else top
        plot = self.plots[key]
        if top is None or plot.vb.height() <= 0:
            return
        line = QFontMetrics(plot.getAxis("left").font()).height()
        # labels are centred on their ticks: a line and a gap between ticks keeps them apart
        values = (0.0, top / 2, top) if plot.vb.height() >= 2 * (line + 2) else (0.0, top)
        if self._y_ticks.get(key) == (top, len(values)):
            return  # the axis is cached: set again, it would be drawn again
        self._y_tops[key] = top
        self._y_ticks[key] = (top, len(values))
        plot.getAxis("left").setTicks([[(v, f"{v:g}") for v in values], []])

    def y_tick_labels(self, key: str) -> list[str]:
        """The left axis's labels of chart ``key`` (for tests)."""
        ticks = self.plots[key].getAxis("left")._tickLevels
        return [label for _, label in ticks[0]] if ticks else []

    def _prefetch_tip(self, layers: list[PrefetchSummary] | None) -> str:
        """One line per MoE layer: accuracy and experts prefetched per token ("" when the
        policy does not prefetch)."""
        model = self.model.model
        if layers is None or model is None:
            return ""
        lines = [f"Prefetch (PSR), last {layers[0].tokens if layers else 0} tokens:"]
        for layer, pf in zip(model.moe_layers, layers, strict=False):
            acc = pf.accuracy
            if acc is None:
                lines.append(f"layer {layer}: nothing prefetched")
            else:
                lines.append(f"layer {layer}: {acc:.0%} used · {pf.per_token:.1f}/token")
        return "\n".join(lines)
