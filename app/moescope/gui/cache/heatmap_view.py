"""The residency heatmap: MoE layers (rows) x experts (columns), one colour per state.

An ``ImageItem`` with a fixed colour table and fixed levels, so pyqtgraph maps the uint8
states straight through the LUT (no autoscaling per frame). The legend is a row of
labelled swatches rather than a gradient bar: the states are categories, not a scale.
"""

from __future__ import annotations

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QPointF, QSize
from PySide6.QtGui import QCursor
from PySide6.QtWidgets import QHBoxLayout, QLabel, QToolTip, QVBoxLayout, QWidget

from moescope.display.cache_model import CacheModel
from moescope.gui import theme
from moescope.gui.widgets.elided_label import ElidedLabel
from moescope.gui.widgets.flow_layout import FlowLayout
from moescope.session.snapshots import CELL_LABELS, TIER_STATES

HEATMAP_MIN_PX = 96
"""The heatmap's least height, whatever the model: with it the window still fits a
1024x700 screen under a title bar (it grew to 360 px with a 48-layer model before)."""


class HeatmapView(QWidget):
    """Draws ``CacheModel.cells()``; hover shows layer, expert, uses and last use."""

    def __init__(self, model: CacheModel, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model
        self.setAccessibleName("Expert residency heatmap")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        self.title = ElidedLabel("Expert cache: layers × experts")
        self.title.setObjectName("panelTitle")
        layout.addWidget(self.title)
        self.graphics = pg.GraphicsLayoutWidget()
        self.graphics.setMinimumHeight(HEATMAP_MIN_PX)
        # the view takes the keyboard focus (Tab), so it is what a screen reader names
        self.graphics.setAccessibleName(self.accessibleName())
        self.graphics.setAccessibleDescription(self.title.text())
        self.plot = self.graphics.addPlot()
        self.plot.setMenuEnabled(False)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.invertY(True)
        self.plot.setLabel("bottom", "expert")
        self.plot.setLabel("left", "layer")
        theme.cache_axes(self.plot)
        self.image = pg.ImageItem(axisOrder="row-major")
        self.image.setLookupTable(theme.cell_lut())
        self.plot.addItem(self.image)
        layout.addWidget(self.graphics, 1)
        self.legend = self._legend()
        layout.addWidget(self.legend)
        self.graphics.scene().sigMouseMoved.connect(self._hover)
        self.plot.vb.sigResized.connect(lambda *_: self.layer_ticks())
        self.hover_text = ""
        self.reset()

    def _legend(self) -> QWidget:
        """Labelled swatches that wrap onto a second row in a narrow panel (one fixed row
        would set the whole window's minimum width). The in-RAM and on-disk swatches show,
        and take room, only while the RAM tier is on."""
        legend = QWidget()
        legend.setAccessibleName("Heatmap legend")
        # no rows kept for the in-RAM and on-disk swatches while hidden: they made the
        # legend a row taller at 12 pt, over the plots; where the RAM tier comes on, the
        # panel scrolls rather than grow the window (ScrollColumn)
        flow = FlowLayout(legend)
        self.tier_swatches: list[QWidget] = []
        """The in-RAM and on-disk swatches, shown only while the RAM tier is on."""
        for state, (colour, label) in enumerate(zip(theme.CELL_COLOURS, CELL_LABELS,
                                                    strict=True)):
            pair_widget = QWidget()
            if state in TIER_STATES:
                self.tier_swatches.append(pair_widget)
                pair_widget.hide()
            swatch = QLabel()
            swatch.setFixedSize(11, 11)
            swatch.setStyleSheet(f"background:{colour}; border:1px solid #555;")
            text = QLabel(label)
            text.setObjectName("legendText")
            pair = QHBoxLayout(pair_widget)
            pair.setContentsMargins(0, 0, 0, 0)
            pair.setSpacing(3)
            pair.addWidget(swatch)
            pair.addWidget(text)
            flow.addWidget(pair_widget)
        return legend

    def reset(self) -> None:
        """Resize to the model's layers x experts and draw the empty state."""
        rows, cols = max(self.model.n_rows, 1), max(self.model.n_expert, 1)
        self.image.setImage(np.zeros((rows, cols), np.uint8), levels=(0, len(CELL_LABELS)),
                            autoLevels=False)
        self.image.setRect(0, 0, cols, rows)
        self.plot.setRange(xRange=(0, cols), yRange=(0, rows), padding=0)
        layers = self.model.model.moe_layers if self.model.model else ()
        # a floor that fits a 700-pixel screen whatever the layer count (48 layers at the
        # floor: 2 px a row); the splitter and a larger window give it the rest
        self.graphics.setMinimumHeight(HEATMAP_MIN_PX)
        self.layer_ticks()
        # no model: no expert numbers (not 0.1 … 0.9 across one empty cell)
        self.plot.getAxis("bottom").setTicks(None if layers else [[]])
        self.refresh()

    def layer_ticks(self) -> list[str]:
        """Label as many layers as the rows' height has room for (every layer up to 16,
        else about 12; fewer in a short view: on a 1024x700 screen six labels in 40 px
        were drawn over each other). Returns the labels shown."""
        layers = self.model.model.moe_layers if self.model.model else ()
        step = 1 if len(layers) <= 16 else max(1, len(layers) // 12)
        height = self.plot.vb.height()
        if layers and height > 0:
            room = max(1, int(height // (self.fontMetrics().height() + 2)))
            step = max(step, -(-len(layers) // room))
        ticks = [(i + 0.5, str(layer)) for i, layer in enumerate(layers) if i % step == 0]
        self.plot.getAxis("left").setTicks([ticks])
        return [label for _, label in ticks]

    def refresh(self) -> None:
        """Repaint from the model (called by the panel's display timer)."""
        cells = self.model.cells()
        if cells.size == 0:
            return
        self.image.setImage(cells, levels=(0, len(CELL_LABELS)), autoLevels=False)

    def update_title(self) -> None:
        """The title line (at the panel's label rate: text changes cost a relayout). The
        slot count is what the cache holds now (a budget changed while idle included);
        the cells are as of the token named, or of the change if it came after."""
        snap = self.model.shown or self.model.latest
        m = self.model.model
        tiered = bool(m and m.cache_enabled and self.model.ram_slots_per_layer)
        for swatch in self.tier_swatches:
            swatch.setVisible(tiered)
        if m is None or not m.cache_enabled:
            self.title.setText("Expert cache: layers × experts")
            return
        shown = self.model.shown  # an earlier token's: the slots it had
        slots = shown.slots_per_layer if shown is not None else self.model.slots_per_layer
        text = (f"Expert cache: {m.n_moe_layers} layers × {m.n_expert} experts · "
                f"{slots} slots/layer")
        if tiered:
            text += f" · {self.model.ram_slots_per_layer} in RAM/layer, the rest on disk"
        if snap is not None:
            text += f" · token {snap.step}"
        self.title.setText(text)
        self.graphics.setAccessibleDescription(self.title.text())

    def cell_at(self, scene_pos: QPointF) -> tuple[int, int] | None:
        if not self.plot.sceneBoundingRect().contains(scene_pos):
            return None
        p = self.plot.vb.mapSceneToView(scene_pos)
        row, expert = int(np.floor(p.y())), int(np.floor(p.x()))
        if 0 <= row < self.model.n_rows and 0 <= expert < self.model.n_expert:
            return row, expert
        return None

    def _hover(self, scene_pos: QPointF) -> None:
        cell = self.cell_at(scene_pos)
        self.hover_text = self.model.tooltip(*cell) if cell else ""
        if self.hover_text:
            QToolTip.showText(QCursor.pos(), self.hover_text, self.graphics)
        else:
            QToolTip.hideText()

    def sizeHint(self) -> QSize:
        """Room for the rows (about 14 px each, 120-360 px) above the title and legend:
        what the splitter gives it first; the least is ``HEATMAP_MIN_PX``."""
        layers = len(self.model.model.moe_layers) if self.model.model else 6
        rows = min(max(120, 14 * layers + 70), 360)
        title = 0 if self.title.isHidden() else self.title.sizeHint().height()
        # the legend's rows at the width it has (its own hint is one row of everything:
        # the rows' room lost a legend row's height at 12 pt, its tier rows no longer kept)
        legend = self.legend.sizeHint().height()
        if self.width() > 0:
            legend = max(legend, self.legend.heightForWidth(self.width()))
        return QSize(480, rows + title + legend + 4)
