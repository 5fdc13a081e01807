"""A model load can be cancelled: a large model takes minutes to read into (pinned)
memory, and a user who opened the wrong file, or closes the window, must not wait for it.
llama.cpp's own progress drives the status bar, and its progress callback ends the load."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from gui_helpers import load, send


def test_cancel_stops_a_load_and_the_next_one_works(held_load: Any, qtbot: Any,
                                                    dialogs: Any, tiny_moe: Path) -> None:
    window, release, steps = held_load
    assert window.load_model(str(tiny_moe))
    qtbot.waitUntil(lambda: bool(steps))
    assert window.loading and window.cancel_load_button.isVisible()
    window.cancel_load_button.click()
    assert window.model_label.text() == "Cancelling…"
    qtbot.waitUntil(lambda: not window.loading, timeout=30_000)
    assert window.model is None
    assert not window.client.worker.engine.loaded
    assert not window.cancel_load_button.isVisible() and not window.progress.isVisible()
    assert "cancelled" in window.statusBar().currentMessage()
    assert not dialogs.shown  # a cancel is not an error
    assert not window.chat_view.send_button.isEnabled() or not window.chat.model_loaded
    release.set()
    load(qtbot, window, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    assert min(steps) >= 0.1 and max(steps) <= 0.8 and len(steps) > 3  # llama.cpp's steps
    assert send(qtbot, window, "Hello", max_tokens=3).n_tokens == 3


def test_closing_the_window_mid_load_does_not_wait_for_it(held_load: Any, qtbot: Any,
                                                          tiny_moe: Path) -> None:
    window, _release, steps = held_load
    assert window.load_model(str(tiny_moe))
    qtbot.waitUntil(lambda: bool(steps))
    t0 = time.perf_counter()
    window.close()  # the held load would never end by itself
    assert not window.client.thread.isRunning()
    assert time.perf_counter() - t0 < 10
