"""A status bar whose message, clipped at the window's width, shows whole on hover."""

from __future__ import annotations

from PySide6.QtWidgets import QStatusBar


def tooltip_follows_message(bar: QStatusBar) -> None:
    """The bar's tooltip is its current message (an export's paths, longer than the bar).

    Through a Python callable: ``setToolTip`` is no Qt slot, and connecting the signal to
    it on the bar that ``QMainWindow.statusBar()`` makes put a libpyside warning on stderr
    at every start ("Cannot add dynamic method setToolTip(QString) … No Wrapper found")."""
    bar.messageChanged.connect(lambda text: bar.setToolTip(text))
