"""Window sizes that fit the screen: a 1366x768 or 1024x700 laptop shows a window's bottom
(buttons, status bar) only if its size leaves room for the window manager's frame."""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QWidget

WINDOW_FRAME = QSize(16, 48)
"""Room left on the screen for the window manager's title bar and borders."""


def fitting(size: QSize, available: QSize) -> QSize:
    """``size``, or the screen's free area ``available`` less the frame where smaller."""
    return size.boundedTo(available - WINDOW_FRAME)


def resize_within_screen(window: QWidget, size: QSize) -> None:
    """Give ``window`` its preferred ``size`` bounded by its screen's free area."""
    screen = window.screen()
    window.resize(fitting(size, screen.availableGeometry().size()) if screen else size)
