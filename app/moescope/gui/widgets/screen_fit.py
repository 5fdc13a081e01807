"""Window sizes that fit the screen: a 1366x768 or 1024x700 laptop shows a window's bottom
(buttons, status bar) only if its size leaves room for the window manager's frame."""

from __future__ import annotations

from PySide6.QtCore import QSize
from PySide6.QtWidgets import QApplication, QWidget

WINDOW_FRAME = QSize(16, 48)
"""Room left on the screen for the window manager's title bar and borders."""
CASCADE_PX = 32
"""How far a window opened from another of its kind sits below and right of it."""


def fitting(size: QSize, available: QSize) -> QSize:
    """``size``, or the screen's free area ``available`` less the frame where smaller."""
    return size.boundedTo(available - WINDOW_FRAME)


def resize_within_screen(window: QWidget, size: QSize) -> None:
    """Give ``window`` its preferred ``size`` bounded by its screen's free area, placed
    over the middle of the window it belongs to (else of the screen) with its frame inside
    that area: a window manager's own placement put the trace window's 720 px at y=63 on a
    768 px screen, its bottom and status line below the edge."""
    screen = window.screen()
    if screen is None:
        window.resize(size)
        return
    area = screen.availableGeometry()
    fitted = fitting(size, area.size())
    window.resize(fitted)
    owner = window.parentWidget()
    # a window without a parent (a trace window) goes over the one the user is in
    owner = owner.window() if owner is not None else QApplication.activeWindow()
    if owner is window or (owner is not None and not owner.isVisible()):
        owner = None
    centre = owner.frameGeometry().center() if owner is not None else area.center()
    width = fitted.width() + WINDOW_FRAME.width()
    height = fitted.height() + WINDOW_FRAME.height()
    x = centre.x() - width // 2
    y = centre.y() - height // 2
    if owner is not None and type(owner) is type(window):  # a second trace: not on the first
        x, y = owner.x() + CASCADE_PX, owner.y() + CASCADE_PX
    x = max(area.left(), min(x, area.right() + 1 - width))
    y = max(area.top(), min(y, area.bottom() + 1 - height))
    window.move(x, y)


def fit_wrapped_height(window: QWidget) -> None:
    """Make a shown ``window`` as tall as its layout needs at its width (word-wrapped
    labels), within its screen, wider where that is what it takes, and keep its frame on
    the screen.

    Qt sizes a new window by its size hint, the height its wrapped lines need at its
    narrowest width, then cuts that to about two thirds of the screen, and does not look
    again at the width it gave: at 12 pt on a 1024x700 screen the open-model dialog's fit
    lines and About's table showed half their last line. Call it from ``showEvent``."""
    layout = window.layout()
    if layout is None or not layout.hasHeightForWidth():
        return
    width, need = window.width(), layout.totalHeightForWidth(window.width())
    screen = window.screen()
    area = screen.availableGeometry() if screen is not None else None
    frame = (window.frameGeometry().size() - window.size()).expandedTo(WINDOW_FRAME)
    if area is not None:
        high, wide = area.height() - frame.height(), area.width() - frame.width()
        while need > high and width < wide:
            width = min(width + 40, wide)
            need = layout.totalHeightForWidth(width)
        need = min(need, high)
    if need <= window.height() and width <= window.width():
        return
    window.resize(max(width, window.width()), max(need, window.height()))
    if area is not None:  # grown downwards and rightwards: its frame back on the screen
        x = max(area.left(), min(window.x(), area.right() + 1 - window.width()
                                 - frame.width()))
        y = max(area.top(), min(window.y(), area.bottom() + 1 - window.height()
                                - frame.height()))
        window.move(x, y)
