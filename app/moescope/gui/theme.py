"""Colours and the two themes, dark and light: one place, so the heatmap legend, plots and
chat agree.

Dark unless the system says light (Preferences ▸ Theme: System, Light or Dark): users run
this next to a terminal and a GPU monitor, and bright cache colours read best on a dark
ground. The module's colour names (``TEXT``, ``MUTED``…) are the current scheme's: widgets
read them when they draw, and :func:`apply_theme` recolours what was drawn before (the
palette, the style sheet, every pyqtgraph view). Cell colours are picked to stay distinct
for the common colour-vision deficiencies (blue / green / amber / red / violet, with
lightness differences) and keep their dark ground in both themes: the heatmap is an image.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFont, QFontInfo, QFontMetrics, QPalette
from PySide6.QtWidgets import QApplication, QGraphicsItem, QWidget

from moescope.util.resources import resources_dir

SCHEMES: dict[str, dict[str, str]] = {
    "dark": {
        "BACKGROUND": "#1b1d21", "PANEL": "#24272d", "TEXT": "#d8dce3", "MUTED": "#8a919c",
        "ACCENT": "#5aa9e6", "MARKER": "#f5d76e", "BUTTON": "#2e323a",
        "BUTTON_HOVER": "#363b44", "BORDER": "#3a3f47", "SPLITTER": "#2b2f36",
        "CHUNK": "#3f6c99", "DISABLED_TEXT": "#5c626c", "ERROR": "#e5534b",
        "WARNING": "#f2b134", "HIGHLIGHTED_TEXT": "#0b0c0e", "USER_BACKGROUND": "#252c36",
        "INLINE_CODE_BACKGROUND": "#2c3038", "TABLE_BORDER": "#3a3f47",
        "INDICATOR_BORDER": "#6b7380", "INDICATOR_DISABLED": "#3a3f47",
        "DISABLED_FILL": "#4a505a", "ASSISTANT": "#4cc38a", "DIVERGED_BACKGROUND": "#4a2b2e",
    },
    "light": {
        "BACKGROUND": "#ffffff", "PANEL": "#f1f2f4", "TEXT": "#1d2024", "MUTED": "#5d6470",
        "ACCENT": "#1f6fb2", "MARKER": "#a86b00", "BUTTON": "#e6e8ec",
        "BUTTON_HOVER": "#dadde2", "BORDER": "#c4c8cf", "SPLITTER": "#d5d8de",
        "CHUNK": "#7fb0dd", "DISABLED_TEXT": "#9aa0a8", "ERROR": "#c0392b",
        "WARNING": "#9a6200", "HIGHLIGHTED_TEXT": "#ffffff", "USER_BACKGROUND": "#e8f0f9",
        "INLINE_CODE_BACKGROUND": "#eceef1", "TABLE_BORDER": "#c4c8cf",
        "INDICATOR_BORDER": "#7a818c", "INDICATOR_DISABLED": "#c4c8cf",
        "DISABLED_FILL": "#c4c8cf", "ASSISTANT": "#1e8a55", "DIVERGED_BACKGROUND": "#f6d5d3",
    },
}
"""Each scheme's colours by name; the light one keeps text at 4.5:1 or more on its
panels (WCAG AA)."""
THEME_CHOICES = ("system", "light", "dark")

BACKGROUND = "#1b1d21"
PANEL = "#24272d"
TEXT = "#d8dce3"
MUTED = "#8a919c"
ACCENT = "#5aa9e6"
MARKER = "#f5d76e"
USER_BACKGROUND = "#252c36"
INLINE_CODE_BACKGROUND = "#2c3038"
TABLE_BORDER = "#3a3f47"
ASSISTANT = "#4cc38a"
DIVERGED_BACKGROUND = "#4a2b2e"
SCHEME = "dark"
"""The scheme in use ("dark" or "light"); the names above are its colours."""
SMALL_PT = 8.0
"""The small print: a point under the app's font, 8 pt at least, so that it follows
Preferences ▸ Font size. The chat's (an answer's stats line, a message's links) is half a
point over this (fixed at 8.5 pt, the answer's numbers stayed at their smallest at 14 pt);
the cache panel's stats line, heatmap legend, Memory tab lines and plot titles and the
budget's line are at this size (fixed at 8 pt, they stayed the smallest print at 12 pt).
Set by :func:`apply_theme`."""
TITLE_PT = 11.0
"""The chat's title: two points over the app's font (fixed at 11 pt, it was smaller than
the text under it from 12 pt on)."""
_choice = "system"
_font_pt = 0.0
_default_font: QFont | None = None
_watching = False

DISABLED_FILL = "#4a505a"
INDICATOR_QSS = """
/* Fusion outlines an unchecked box in the window colour darkened, which on the dark
   ground is the ground itself: unticked boxes (Compare's policy list, "Score the whole
   chat") did not show at all. Styling one state drops Fusion's box for the other too
   (a bare tick), so both are drawn here, the tick from resources/icons/check.svg (a
   light tick for the dark scheme) or check-light.svg (a dark one for the light). */
QCheckBox::indicator, QAbstractItemView::indicator {
    border: 1px solid @INDICATOR_BORDER@;
    border-radius: 2px;
    background: @BACKGROUND@;
    width: 12px;
    height: 12px;
}
QCheckBox::indicator:checked, QAbstractItemView::indicator:checked {
    border-color: @ACCENT@;
    image: url("@CHECK@");
}
QCheckBox::indicator:disabled, QAbstractItemView::indicator:disabled {
    border-color: @INDICATOR_DISABLED@;
}
"""


def indicator_qss() -> str:
    """:data:`INDICATOR_QSS` with the current scheme's tick image filled in (frozen or
    not): the tick is drawn in the scheme's text colour, on its ground."""
    name = "check-light.svg" if SCHEME == "light" else "check.svg"
    return fill_colours(INDICATOR_QSS.replace(
        "@CHECK@", (resources_dir() / "icons" / name).as_posix()))


def fill_colours(template: str, scheme: str | None = None) -> str:
    """``template`` with each ``@NAME@`` replaced by that colour of ``scheme`` (the
    current one by default)."""
    for name, colour in SCHEMES[scheme or SCHEME].items():
        template = template.replace(f"@{name}@", colour)
    return template


CELL_COLOURS: tuple[str, ...] = (
    "#2b2f36",  # not resident
    "#3f6c99",  # resident
    "#4cc38a",  # hit by this token
    "#f2b134",  # fetched by this token
    "#e5534b",  # substituted away
    "#b77fe0",  # used as substitute
    "#5c6470",  # in RAM, not in VRAM (RAM tier on)
    "#141619",  # on disk only (RAM tier on)
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


def applied() -> tuple[str, float]:
    """The theme choice and font size last applied."""
    return _choice, _font_pt


def system_scheme(app: QApplication) -> str:
    """"light" when the desktop says light (Qt 6.5+ reads GNOME's, KDE's, Windows' and
    macOS's setting), else "dark" (dark too when it says nothing: the app's own look)."""
    scheme = app.styleHints().colorScheme()
    return "light" if scheme == Qt.ColorScheme.Light else "dark"


def apply_theme(app: QApplication, choice: str | None = None,
                font_pt: float | None = None) -> str:
    """Fusion with the ``choice`` scheme ("system", "light" or "dark"; the last one when
    None) and the app's font at ``font_pt`` points (0: the system's size), then
    ``resources/style.qss``; recolours every pyqtgraph view already shown. Returns the
    scheme applied ("light" or "dark")."""
    global _choice, _font_pt, _default_font, _watching
    _choice = choice if choice in THEME_CHOICES else _choice
    if font_pt is not None:
        _font_pt = max(0.0, float(font_pt))
    scheme = system_scheme(app) if _choice == "system" else _choice
    changed = scheme != SCHEME
    globals().update(SCHEMES[scheme])
    globals()["SCHEME"] = scheme
    app.setStyle("Fusion")
    app.setPalette(_palette())
    if _default_font is None:
        _default_font = QFont(app.font())
    font = QFont(_default_font)
    if _font_pt > 0:
        font.setPointSizeF(_font_pt)
    app.setFont(font)
    size = QFontInfo(font).pointSizeF()
    resized = max(8.0, size - 1) != SMALL_PT
    globals().update(SMALL_PT=max(8.0, size - 1), TITLE_PT=size + 2)
    qss = style_sheet_path()
    sheet = fill_colours(qss.read_text(encoding="utf-8")) if qss is not None else ""
    sheet = sheet.replace("@TITLE_PT@", f"{TITLE_PT:g}pt")
    sheet = sheet.replace("@SMALL_PT@", f"{SMALL_PT:g}pt")
    app.setStyleSheet(sheet + indicator_qss())
    configure_pyqtgraph()
    if changed or resized:  # plot titles in the new colours, or at the new small print
        recolour_plots(app)
    if not _watching:  # follow the desktop while the choice is "system"
        _watching = True
        app.styleHints().colorSchemeChanged.connect(
            lambda _s: _choice == "system" and apply_theme(app))
    return scheme


def _palette() -> QPalette:
    pal = QPalette()
    roles = {
        QPalette.ColorRole.Window: PANEL,
        QPalette.ColorRole.WindowText: TEXT,
        QPalette.ColorRole.Base: BACKGROUND,
        QPalette.ColorRole.AlternateBase: PANEL,
        QPalette.ColorRole.ToolTipBase: PANEL,
        QPalette.ColorRole.ToolTipText: TEXT,
        QPalette.ColorRole.Text: TEXT,
        QPalette.ColorRole.Button: SCHEMES[SCHEME]["BUTTON"],
        QPalette.ColorRole.ButtonText: TEXT,
        QPalette.ColorRole.Highlight: ACCENT,
        QPalette.ColorRole.HighlightedText: SCHEMES[SCHEME]["HIGHLIGHTED_TEXT"],
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
                 QColor(SCHEMES[SCHEME]["DISABLED_FILL"]))
    return pal


def recolour_plots(app: QApplication) -> None:
    """Give every shown pyqtgraph view the current ground, axes and titles (they took the
    colours of the theme they were made in). Windows closed but not yet deleted are
    skipped: their scenes may be half torn down."""
    for top in app.topLevelWidgets():
        if top.isVisible():
            recolour_views(top)


def recolour_views(top: QWidget) -> None:
    """:func:`recolour_plots` for the pyqtgraph views in ``top``, shown or not (a window
    applying its preferences before it is first shown: its plots were made in the theme
    before them)."""
    for view in top.findChildren(pg.GraphicsView):
        view.setBackground(BACKGROUND)
        if isinstance(view, pg.PlotWidget):
            plots = [view.getPlotItem()]
        elif isinstance(view, pg.GraphicsLayoutWidget):
            plots = [i for i in view.ci.items if isinstance(i, pg.PlotItem)]
        else:
            plots = []
        for plot in plots:
            for axis in plot.axes.values():
                axis["item"].setPen(TEXT)
                axis["item"].setTextPen(TEXT)
            if plot.titleLabel.text:
                set_plot_title(plot, plot.titleLabel.text)
            if plot.legend is not None:
                set_legend_size(plot.legend)
            for item in plot.items:  # change markers: pale yellow on white otherwise
                if isinstance(item, pg.TextItem):  # notes in a plot (TTFT, audits off)
                    item.setColor(MUTED)
                elif isinstance(item, pg.InfiniteLine) and getattr(item, "moescope_marker",
                                                                 False):
                    pen = pg.mkPen(item.pen)
                    pen.setColor(QColor(MARKER))
                    item.setPen(pen)
                    label = getattr(item, "label", None)  # only where it has one
                    if label is not None:
                        label.setColor(MARKER)


def small_print_px() -> int:
    """The height of a line of the small print (:data:`SMALL_PT`), in pixels."""
    font = QFont(QApplication.font())
    font.setPointSizeF(SMALL_PT)
    return QFontMetrics(font).height()


def plot_title_px() -> int:
    """A plot's title row: one line of the small print (16 px at 8 pt)."""
    return max(16, small_print_px() + 2)


def set_plot_title(plot: pg.PlotItem, text: str) -> None:
    """``text`` as ``plot``'s title in the small print (:data:`SMALL_PT`, muted). A plot
    whose title row was held to one line (``moescope_title_row``) gets that row's height
    for the print's size again."""
    plot.setTitle(text, size=f"{SMALL_PT:g}pt", color=MUTED)
    if getattr(plot, "moescope_title_row", False):
        px = plot_title_px()
        plot.titleLabel.setMaximumHeight(px)
        plot.layout.setRowFixedHeight(0, px)


def legend_pt() -> float:
    """A plot legend's labels: a point under the small print (7 pt at 8 pt)."""
    return SMALL_PT - 1


def set_legend_size(legend: pg.LegendItem) -> None:
    """``legend``'s labels at :func:`legend_pt`, drawn again at that size."""
    size = f"{legend_pt():g}pt"
    legend.opts["labelTextSize"] = size
    for _, label in legend.items:
        label.setText(label.text, size=size)
    legend.updateSize()


def style_sheet_path() -> Path | None:
    path = resources_dir() / "style.qss"
    return path if path.is_file() else None
