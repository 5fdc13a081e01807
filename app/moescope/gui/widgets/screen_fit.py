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
    owner = owner.window() if owner is not None else None
    centre = owner.frameGeometry().center() if owner is not None and owner.isVisible() \
        else area.center()
    width = fitted.width() + WINDOW_FRAME.width()
    height = fitted.height() + WINDOW_FRAME.height()
    x = max(area.left(), min(centre.x() - width // 2, area.right() + 1 - width))
    y = max(area.top(), min(centre.y() - height // 2, area.bottom() + 1 - height))
    window.move(x, y)
