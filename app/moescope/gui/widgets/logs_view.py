"""The logs panel: the app's and the engine worker's ``logging`` records, live.

Records can come from any thread; the handler hands them to the GUI thread through a
queued signal, so logging from the worker never touches a widget.
"""

from __future__ import annotations

import contextlib
import logging

from PySide6.QtCore import QObject, Qt, Signal
from PySide6.QtGui import QFontDatabase, QTextCursor
from PySide6.QtWidgets import QPlainTextEdit, QWidget

MAX_LINES = 5000
FORMAT = "%(asctime)s %(levelname)-7s %(name)s: %(message)s"


class _Bridge(QObject):
    line = Signal(str)


class QtLogHandler(logging.Handler):
    """A logging handler that emits formatted lines as a Qt signal."""

    def __init__(self) -> None:
        super().__init__()
        self.bridge = _Bridge()
        self.setFormatter(logging.Formatter(FORMAT, "%H:%M:%S"))

    def emit(self, record: logging.LogRecord) -> None:
        with contextlib.suppress(RuntimeError):  # the bridge is gone (window closed)
            self.bridge.line.emit(self.format(record))


class LogsView(QPlainTextEdit):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setReadOnly(True)
        self.setAccessibleName("Logs")
        self.setMaximumBlockCount(MAX_LINES)
        self.setFont(QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont))
        self.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.handler = QtLogHandler()
        self.handler.bridge.line.connect(self.append_line,
                                         Qt.ConnectionType.QueuedConnection)

    def append_line(self, line: str) -> None:
        """Append ``line``; the view stays at the left edge, where the time stamps are
        (appending moves the cursor to the end of a long line, and the unwrapped view
        would follow it to the far right). The cursor is left at the start of the last
        line, so the view also follows it there when it is first shown (lines appended
        while the tab was hidden scrolled it right then)."""
        bar = self.horizontalScrollBar()
        left = bar.value()
        self.appendPlainText(line)
        cursor = self.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.movePosition(QTextCursor.MoveOperation.StartOfBlock)
        self.setTextCursor(cursor)
        bar.setValue(left)

    def attach(self, logger_name: str = "moescope", level: int = logging.INFO) -> None:
        logger = logging.getLogger(logger_name)
        logger.addHandler(self.handler)
        if logger.level == logging.NOTSET or logger.level > level:
            logger.setLevel(level)

    def detach(self, logger_name: str = "moescope") -> None:
        logging.getLogger(logger_name).removeHandler(self.handler)
