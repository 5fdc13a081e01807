"""Colours and the dark theme: one place, so the heatmap legend, plots and chat agree.

Dark by default: users run this next to a terminal and a GPU monitor, and bright cache
colours read best on a dark ground. Cell colours are picked to stay distinct for the
common colour-vision deficiencies (blue / green / amber / red / violet, with lightness
differences).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyqtgraph as pg
from PySide6.QtGui import QColor, QPalette
from PySide6.QtWidgets import QApplication, QGraphicsItem

from moescope.util.resources import resources_dir

BACKGROUND = "#1b1d21"
PANEL = "#24272d"
TEXT = "#d8dce3"
MUTED = "#8a919c"
ACCENT = "#5aa9e6"
MARKER = "#f5d76e"

DISABLED_FILL = "#4a505a"
INDICATOR_QSS = """
/* Fusion outlines an unchecked box in the window colour darkened, which on this dark
   ground is the ground itself: unticked boxes (Compare's policy list, "Score the whole
   chat") did not show at all. Styling one state drops Fusion's box for the other too
   (a bare tick), so both are drawn here, the tick from resources/icons/check.svg. */
QCheckBox::indicator, QAbstractItemView::indicator {
    border: 1px solid #6b7380;
    border-radius: 2px;
    background: #1b1d21;
    width: 12px;
    height: 12px;
}
QCheckBox::indicator:checked, QAbstractItemView::indicator:checked {
    border-color: #5aa9e6;
    image: url("@CHECK@");
}
QCheckBox::indicator:disabled, QAbstractItemView::indicator:disabled {
    border-color: #3a3f47;
}
"""


def indicator_qss() -> str:
    """:data:`INDICATOR_QSS` with the tick image's path filled in (frozen or not)."""
    return INDICATOR_QSS.replace("@CHECK@", (resources_dir() / "icons" / "check.svg")
                                 .as_posix())


CELL_COLOURS: tuple[str, ...] = (
    "#2b2f36",  # not resident
    "#3f6c99",  # resident
    "#4cc38a",  # hit by this token
    "#f2b134",  # fetched by this token
    "#e5534b",  # substituted away
    "#b77fe0",  # used as substitute
)

CURVE = {
    "mass": "#e5534b",
    "tokens_per_s": "#5aa9e6",
    "hit_rate": "#4cc38a",
    "fetched_mb": "#f2b134",
    "audit_kl": "#c678dd",
    "process": "#5aa9e6",
    "system": "#8a919c",
}


def cache_axes(plot: pg.PlotItem) -> None:
    """Render each axis to a cached pixmap, redrawn only when its range changes.

    Axis text is the costliest thing pyqtgraph paints (a QPicture replayed on every
    repaint of the view, ~1.5 ms per axis in software rendering); with the cache a curve
    update repaints only the curve.
    """
    for name in ("left", "bottom", "right", "top"):
        axis = plot.getAxis(name)
        axis.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)


def nice_ceiling(value: float) -> float:
    """The next of 1, 2, 2.5, 5 x 10^k at or above ``value``: y-axis tops that change
    rarely (a fixed range does not repaint its axis)."""
    if not math.isfinite(value) or value <= 0:
        return 1.0
    exp = math.floor(math.log10(value))
    for m in (1.0, 2.0, 2.5, 5.0, 10.0):
        top = m * 10.0**exp
        if top >= value * (1 - 1e-12):
            return top
    return 10.0 ** (exp + 1)


def cell_lut() -> npt.NDArray[np.uint8]:
    """The heatmap's colour table: index = cell state (see ``snapshots``)."""
    return np.array([QColor(c).getRgb()[:3] for c in CELL_COLOURS], dtype=np.uint8)


def configure_pyqtgraph() -> None:
    pg.setConfigOptions(antialias=False, background=BACKGROUND, foreground=TEXT)


def apply_theme(app: QApplication) -> None:
    """Fusion with a dark palette, then ``resources/style.qss`` when present."""
    app.setStyle("Fusion")
    pal = QPalette()
    roles = {
        QPalette.ColorRole.Window: PANEL,
        QPalette.ColorRole.WindowText: TEXT,
        QPalette.ColorRole.Base: BACKGROUND,
        QPalette.ColorRole.AlternateBase: PANEL,
        QPalette.ColorRole.ToolTipBase: PANEL,
        QPalette.ColorRole.ToolTipText: TEXT,
        QPalette.ColorRole.Text: TEXT,
        QPalette.ColorRole.Button: "#2e323a",
        QPalette.ColorRole.ButtonText: TEXT,
        QPalette.ColorRole.Highlight: ACCENT,
        QPalette.ColorRole.HighlightedText: "#0b0c0e",
        QPalette.ColorRole.PlaceholderText: MUTED,
        QPalette.ColorRole.Link: ACCENT,
    }
    for role, colour in roles.items():
        pal.setColor(role, QColor(colour))
    for role in (QPalette.ColorRole.Text, QPalette.ColorRole.ButtonText,
                 QPalette.ColorRole.WindowText):
        pal.setColor(QPalette.ColorGroup.Disabled, role, QColor(MUTED))
    # a disabled slider's groove is filled with the highlight: in the accent colour it
    # looked as live as an enabled one (the θ and β sliders of a preset)
    pal.setColor(QPalette.ColorGroup.Disabled, QPalette.ColorRole.Highlight,
                 QColor(DISABLED_FILL))
    app.setPalette(pal)
    qss = style_sheet_path()
    sheet = qss.read_text(encoding="utf-8") if qss is not None else ""
    app.setStyleSheet(sheet + indicator_qss())
    configure_pyqtgraph()


def style_sheet_path() -> Path | None:
    path = resources_dir() / "style.qss"
    return path if path.is_file() else None
