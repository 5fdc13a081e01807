"""Helpers shared by the GUI tests (drive the real window, wait on its signals)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

LONG_PROMPT = "Tell me a story"
LONG_SEED = 3
"""With the tiny qwen3moe model this prompt and seed run to the token limit (no early EOS)
under quality-first at 25%; tests that need a long answer use them."""


def load(qtbot: Any, window: Any, path: Path | str, **request: Any) -> Any:
    """Load ``path`` in the worker and wait for it; returns the ModelSummary."""
    from moescope.gui.worker import LoadRequest

    with qtbot.waitSignal(window.modelLoaded, timeout=30_000) as blocker:
        window.load_model(LoadRequest(path=str(path), **request) if request else path)
    return blocker.args[0]


def send(qtbot: Any, window: Any, text: str, *, max_tokens: int = 40,
         timeout: int = 30_000) -> Any:
    """Send ``text`` and wait for the answer; returns its AnswerSummary."""
    window.chat_settings.max_tokens.setValue(max_tokens)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=timeout) as blocker:
        assert window.chat.send(text)
    return blocker.args[0]


def slow_down(window: Any, max_us: int) -> None:
    """Make each expert copy sleep up to ``max_us`` (engine test hook; decisions and
    tokens are unchanged), so an answer lasts long enough to act on mid-stream."""
    assert not window.chat.generating
    window.client.worker.engine.set_copy_delay(max_us)


def export_trace(qtbot: Any, window: Any, path: Path | str, *,
                 timeout: int = 30_000) -> Any:
    """File ▸ Export trace to ``path`` (it runs on a thread) and wait for it to end;
    returns the three files, or None when it failed (the window said why)."""
    with qtbot.waitSignal(window.traceExportFinished, timeout=timeout) as blocker:
        assert window.export_trace(path) is not None
    return blocker.args[0]


def export_shown(qtbot: Any, trace_window: Any, path: Path | str, *,
                 timeout: int = 30_000) -> Any:
    """A trace window's Export to ``path``, waited for as :func:`export_trace`."""
    with qtbot.waitSignal(trace_window.exportFinished, timeout=timeout) as blocker:
        assert trace_window.export(path) is not None
    return blocker.args[0]


def click_link(qtbot: Any, view: Any, href: str) -> None:
    """Click the link ``href`` in the transcript with the mouse, as a user would."""
    from PySide6.QtCore import Qt
    from PySide6.QtGui import QTextCursor

    doc = view.transcript.document()
    block = doc.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            frag = it.fragment()
            if frag.charFormat().anchorHref() == href:
                cursor = QTextCursor(doc)
                cursor.setPosition(frag.position() + 1)
                view.transcript.setTextCursor(cursor)
                view.transcript.ensureCursorVisible()
                rect = view.transcript.cursorRect(cursor)
                point = rect.center()
                point.setX(max(rect.left() - 3, 1))  # on the link's second character
                qtbot.mouseClick(view.transcript.viewport(), Qt.MouseButton.LeftButton,
                                 pos=point)
                return
            it += 1
        block = block.next()
    raise AssertionError(f"no link {href} in the transcript")


def drag_accepted(window: Any, path: Path | str) -> bool:
    """Whether ``window`` takes ``path`` dragged over it (its drag-enter answer)."""
    from PySide6.QtCore import QMimeData, QPoint, Qt, QUrl
    from PySide6.QtGui import QDragEnterEvent

    data = QMimeData()  # the event keeps a pointer: the data must outlive it
    data.setUrls([QUrl.fromLocalFile(str(path))])
    event = QDragEnterEvent(QPoint(10, 10), Qt.DropAction.CopyAction, data,
                            Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    event.setAccepted(False)
    window.dragEnterEvent(event)
    return bool(event.isAccepted())


def drop(window: Any, path: Path | str) -> None:
    """Drop ``path`` on ``window``."""
    from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
    from PySide6.QtGui import QDropEvent

    data = QMimeData()
    data.setUrls([QUrl.fromLocalFile(str(path))])
    window.dropEvent(QDropEvent(QPointF(10, 10), Qt.DropAction.CopyAction, data,
                                Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier))
