"""GUI fixtures: the real window on the real engine with a tiny synthetic MoE model.

Qt runs offscreen; every window gets its own data directory (chat database, settings);
dialogs that would block (QMessageBox) are replaced by a recorder the tests read.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import LONG_SEED, load

from moescope.util import paths
from moescope.util.resources import demo_model_path


@dataclass
class Dialogs:
    """What QMessageBox would have shown: (kind, title, text) in order."""

    shown: list[tuple[str, str, str]] = field(default_factory=list)
    question_answer: Any = None

    def texts(self, kind: str | None = None) -> list[str]:
        return [f"{t}: {x}" for k, t, x in self.shown if kind is None or k == kind]


@pytest.fixture
def dialogs(monkeypatch: pytest.MonkeyPatch) -> Dialogs:
    """Record message boxes instead of opening them (they would block offscreen)."""
    from PySide6.QtWidgets import QMessageBox

    rec = Dialogs(question_answer=QMessageBox.StandardButton.Yes)

    def make(kind: str) -> Callable[..., Any]:
        def show(_parent: Any, title: str, text: str, *args: Any, **kw: Any) -> Any:
            rec.shown.append((kind, title, text))
            return rec.question_answer if kind == "question" else QMessageBox.StandardButton.Ok
        return show

    for kind in ("critical", "warning", "information", "question"):
        monkeypatch.setattr(QMessageBox, kind, staticmethod(make(kind)))
    return rec


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh MOESCOPE_DATA_DIR: chats and settings never touch the real profile."""
    d = tmp_path / "data"
    monkeypatch.setenv(paths.ENV_DATA_DIR, str(d))
    return d


@pytest.fixture
def make_window(qtbot: Any, data_dir: Path, dialogs: Dialogs) -> Iterator[Callable[..., Any]]:
    """Factory: a shown MainWindow (closed at teardown, engine thread joined)."""
    from moescope.gui.app import create_app
    from moescope.gui.main_window import MainWindow

    create_app([])
    windows: list[MainWindow] = []

    def make() -> MainWindow:
        w = MainWindow()
        qtbot.addWidget(w)
        w.show()
        windows.append(w)
        return w

    yield make
    from shiboken6 import isValid

    for w in windows:
        if not isValid(w):
            # pytest-qt closed it (joining its threads) and called deleteLater before the
            # fixtures' teardown; an event loop spun by a later fixture's teardown (a trace
            # window's waitUntil on a loaded host) then deleted it (CI, 2026-12-03)
            continue
        w.close()
        assert not w.client.thread.isRunning()
    # Destroy the windows here, at a quiet point, rather than whenever a later test's
    # allocation triggers the cyclic GC: once (CI, 2026-12-01) a collection inside a Qt
    # callback of the next test deleted an old window's menus and hung in ~QObject's lock.
    from PySide6.QtCore import QCoreApplication, QEvent

    windows.clear()
    gc.collect()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)


@pytest.fixture
def demo() -> Path:
    """The bundled demo model (skips where a checkout has none)."""
    path = demo_model_path()
    if path is None:
        pytest.skip("this checkout has no demo model")
    return path


@pytest.fixture
def font_pt(make_window: Any) -> Iterator[Any]:
    """Sets the app's font size through the window's preferences; the system's size
    again afterwards (the font is the application's, shared by later tests)."""
    windows: list[Any] = []

    def set_font(window: Any, pt: float) -> None:
        windows.append(window)
        window.apply_preferences(dataclasses.replace(window.preferences, font_pt=pt))

    yield set_font
    if windows:
        windows[-1].apply_preferences(dataclasses.replace(windows[-1].preferences,
                                                          font_pt=0))


@pytest.fixture
def window(make_window: Callable[..., Any], qtbot: Any, tiny_moe: Path) -> Any:
    """A window with the tiny MoE model loaded (quality-first, 25% of experts)."""
    w = make_window()
    load(qtbot, w, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    w.chat_settings.seed.setValue(LONG_SEED)
    return w


@pytest.fixture(scope="module")
def trace_path(record: Callable[..., Path]) -> Path:
    """A real session for the trace window's tests: the tiny qwen3moe model under
    quality-first at 25%, from the engine (recorded once per test session)."""
    return record("qwen3moe", name="whatif.jsonl", tokens=24)


@pytest.fixture
def open_trace_window(qtbot: Any) -> Iterator[Callable[[Path], Any]]:
    """Factory: the trace window of a reopened trace file; every one's sweep thread must be
    gone after closing."""
    from moescope.display.trace_io import reopen
    from moescope.gui.traces.trace_window import TraceWindow

    windows: list[TraceWindow] = []

    def make(path: Path) -> TraceWindow:
        window = TraceWindow(path, reopen(path))
        qtbot.addWidget(window)
        window.show()
        windows.append(window)
        return window

    yield make
    for window in windows:
        window.close()
    for window in windows:  # hidden at once, its what-if's thread ending soon after
        qtbot.waitUntil(lambda w=window: not w.whatif._thread.isRunning(), timeout=30_000)


@pytest.fixture
def trace_window(open_trace_window: Callable[[Path], Any], trace_path: Path) -> Any:
    """The reopened session's trace window."""
    return open_trace_window(trace_path)


@pytest.fixture
def held_load(make_window: Callable[..., Any]
              ) -> Iterator[tuple[Any, threading.Event, list[float]]]:
    """A window whose next load waits at llama.cpp's first weight-loading progress step
    until ``release`` is set or the load is cancelled (a stand-in for a big model, whose
    load takes minutes). Returns (window, release, the progress fractions seen)."""
    window = make_window()
    release = threading.Event()
    steps: list[float] = []
    engine = window.client.worker.engine

    def hold(stage: str, fraction: float) -> None:  # runs on the worker thread
        if stage == "loading weights":
            steps.append(fraction)
            while not release.is_set() and not engine._cancel_load.is_set():
                time.sleep(0.005)

    window.client.worker.loadProgress.connect(hold)
    yield window, release, steps
    release.set()
