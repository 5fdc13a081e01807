"""RAM and VRAM curves (process and system) with a two-line summary, and where the
experts live in host memory (pinned or pageable, with why it matters in the tooltip)."""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFrame, QLabel, QScrollArea, QVBoxLayout, QWidget

from moescope.display.cache_model import CacheModel, tier_text
from moescope.display.memory_model import MemoryModel, expert_memory
from moescope.engine.backend import backend_text, engine_build
from moescope.gui import theme

TRACE_NOTE = ("RAM and VRAM over time are sampled only while a model runs; a trace does "
              "not record them, nor the machine it was recorded on.")
"""Said by a reopened trace's Memory tab instead of empty charts and this machine's build."""
CHARTS_MIN_PX = 190
"""The RAM and VRAM charts' least height (two titles, curves, axes); below it the tab
scrolls."""


class MemoryView(QWidget):
    """``live=False`` (a reopened trace): the tiers line only, from the trace; the charts
    and the engine-build line describe this machine now, not the recording, so they are
    left out and :data:`TRACE_NOTE` says why."""

    def __init__(self, model: MemoryModel, cache: CacheModel | None = None,
                 parent: QWidget | None = None, *, live: bool = True) -> None:
        super().__init__(parent)
        self.model = model
        self.cache = cache
        self.setAccessibleName("Memory use")
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        # the lines and charts scroll: a line shown once a model is loaded (where the
        # experts live, the tiers) made the cache tabs, and so the window, taller by itself
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.scroll.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # the charts inside take it
        outer.addWidget(self.scroll)
        inner = QWidget()
        self.scroll.setWidget(inner)
        layout = QVBoxLayout(inner)
        layout.setContentsMargins(0, 0, 0, 0)
        self.label = QLabel("")
        self.label.setObjectName("statsLabel")
        self.label.setWordWrap(True)
        layout.addWidget(self.label)
        self.experts_label = QLabel("")
        self.experts_label.setObjectName("statsLabel")
        self.experts_label.setAccessibleName("Where the experts live in host memory")
        self.experts_label.setWordWrap(True)
        self.experts_label.hide()
        layout.addWidget(self.experts_label)
        self.tiers_label = QLabel("")
        self.tiers_label.setObjectName("statsLabel")
        self.tiers_label.setAccessibleName("Expert tiers: VRAM slots, RAM, disk")
        self.tiers_label.setWordWrap(True)
        self.tiers_label.setToolTip(
            "Where the experts are. VRAM slots: hit = routed experts already in a slot. RAM: "
            "experts in host memory; with a RAM budget below the experts, the RAM tier holds "
            "some and serves that share of the slot fills (fetches and admissions). Disk: "
            "the rest stay in the model file and are read on demand (MB per token). Over "
            "the last tokens of the stats line.")
        self.tiers_label.hide()
        layout.addWidget(self.tiers_label)
        self.backend_label = QLabel(backend_text(engine_build()))  # engine backend, and why
        self.backend_label.setObjectName("statsLabel")
        self.backend_label.setWordWrap(True)
        layout.addWidget(self.backend_label)
        self._slots_on_device = False  # e.g. a Vulkan GPU: slots in VRAM, but no NVML to plot
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setAccessibleName("RAM and VRAM over time")  # it takes the focus
        self.graphics.setMinimumHeight(CHARTS_MIN_PX)
        layout.addWidget(self.graphics, 1)
        self.no_gpu = False
        """No GPU was found: only the RAM chart is drawn."""
        self.curves: dict[str, pg.PlotDataItem] = {}
        self.plots: dict[str, pg.PlotItem] = {}
        for row, (kind, title) in enumerate((("ram", "RAM (GiB)"), ("vram", "VRAM (GiB)"))):
            plot = self.graphics.addPlot(row=row, col=0)
            theme.set_plot_title(plot, title)
            self.plots[kind] = plot
            plot.setMenuEnabled(False)
            plot.hideButtons()
            plot.showGrid(x=True, y=True, alpha=0.15)
            plot.addLegend(offset=(5, 5), labelTextSize=f"{theme.legend_pt():g}pt")
            plot.getAxis("left").setWidth(42)
            theme.cache_axes(plot)
            for who in ("process", "system"):
                self.curves[f"{kind}_{who}"] = plot.plot(
                    pen=pg.mkPen(theme.CURVE[who], width=1.5), name=f"{who}",
                    connect="finite")
            if row == 1:
                plot.setLabel("bottom", "seconds")
        if not live:
            self.label.setText(TRACE_NOTE)
            self.backend_label.hide()
            self.graphics.hide()
            layout.addStretch(1)

    def set_expert_buffer(self, buffer: str, slot_buffer: str = "") -> None:
        """A model was loaded (or closed): say where its experts live; hidden if unknown."""
        self.backend_label.setText(backend_text(engine_build(), slot_buffer))
        self._slots_on_device = bool(slot_buffer) and not slot_buffer.upper().startswith("CPU")
        self.model.slots_on_device = self._slots_on_device
        self.model.expert_buffer = buffer
        text, tip = expert_memory(buffer)
        self.experts_label.setText(f"Experts in host memory: {text}" if text else "")
        self.experts_label.setToolTip(tip)
        self.experts_label.setVisible(bool(text))

    def refresh_tiers(self) -> None:
        """The three tiers' bytes and hit rates (hidden without an expert cache)."""
        c = self.cache
        m = c.model if c is not None else None
        if c is None or m is None or not m.cache_enabled:
            self.tiers_label.hide()
            return
        self.tiers_label.setText(tier_text(m, c.slots_per_layer, c.ram_slots_per_layer,
                                           c.tiers()))
        self.tiers_label.show()

    def refresh(self) -> None:
        self.refresh_tiers()
        s = self.model.samples
        if s.count == 0:
            return
        t = s.view("t")
        for key, curve in self.curves.items():
            y = s.view(key)
            if np.isfinite(y).any():
                curve.setData(t, y, connect="finite")
        self.label.setText(self.model.summary())
        if self.model.gpu is None:
            self._no_gpu()

    def _no_gpu(self) -> None:
        """No GPU seen: no empty VRAM chart; the RAM chart takes its place and says why."""
        vram = self.plots.pop("vram", None)
        if vram is None:
            return
        self.graphics.removeItem(vram)
        for who in ("process", "system"):
            self.curves.pop(f"vram_{who}", None)
        where = ("not measured: no NVIDIA GPU" if self._slots_on_device
                 else "no GPU found (the expert slots are in RAM)")
        theme.set_plot_title(self.plots["ram"], f"RAM (GiB) · VRAM: {where}")
        self.plots["ram"].setLabel("bottom", "seconds")
        self.no_gpu = True
