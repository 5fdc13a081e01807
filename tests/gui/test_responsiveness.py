"""The event loop stays responsive while decoding, and the panel repaints at most ~30 Hz."""

from __future__ import annotations

import gc
import time
from typing import Any

import numpy as np
import pytest
from gui_helpers import LONG_PROMPT, send, slow_down
from PySide6.QtCore import Qt, QTimer

from moescope.gui.cache.panel import CachePanel

HEARTBEAT_MS = 10


@pytest.mark.timing
def test_event_loop_latency_p99_under_50ms_while_generating_200_tokens(
        window: Any, qtbot: Any) -> None:
    """Robust to a loaded machine: up to three runs of 200 tokens, one of which must keep
    the heartbeat's p99 under 50 ms (a neighbour taking the cores can spoil one; work on
    the GUI thread spoils all of them)."""
    # ~200 tokens/s, a fast real model; the tiny model alone would finish in a few
    # heartbeats and the percentile would be the single worst scheduling hiccup
    slow_down(window, 1500)
    window.chat_settings.max_tokens.setValue(200)
    seen = []
    for attempt in range(3):
        p50, p99 = _heartbeat_while_generating(window, qtbot, first=attempt == 0)
        print(f"heartbeat latency p50 {p50:.1f} ms, p99 {p99:.1f} ms")
        seen.append(p99)
        if p99 < 50.0:
            return
    raise AssertionError(f"p99 {', '.join(f'{x:.1f}' for x in seen)} ms in three runs")


def _heartbeat_while_generating(window: Any, qtbot: Any, *, first: bool) -> tuple[float, float]:
    """(p50, p99) of a 10 ms heartbeat's lateness while 200 tokens are generated."""
    beats: list[float] = []
    heartbeat = QTimer()
    heartbeat.setTimerType(Qt.TimerType.PreciseTimer)
    heartbeat.setInterval(HEARTBEAT_MS)
    heartbeat.timeout.connect(lambda: beats.append(time.perf_counter()))
    # The pytest process holds every earlier test's objects; freezing them keeps a full
    # garbage collection of that history (tens of ms, not the app's) out of the measurement.
    gc.collect()
    gc.freeze()
    heartbeat.start()
    generated = 0
    try:
        while generated < 200:  # an early end-of-text just means another answer
            with qtbot.waitSignal(window.chat.answerFinished, timeout=60_000) as blocker:
                if generated == 0 and first:
                    window.chat.send(LONG_PROMPT)
                else:
                    window.chat.regenerate()
            generated += blocker.args[0].n_tokens
    finally:
        heartbeat.stop()
        gc.unfreeze()
    gaps = np.diff(beats) * 1000.0
    latency = gaps - HEARTBEAT_MS
    assert len(gaps) > 10
    return float(np.percentile(latency, 50)), float(np.percentile(latency, 99))


def test_panel_repaints_at_most_35_times_per_second_when_fed_200_snapshots(
        window: Any, qtbot: Any) -> None:
    send(qtbot, window, LONG_PROMPT, max_tokens=60)
    recorded = list(window.recent_tokens)
    panel = CachePanel()
    qtbot.addWidget(panel)
    panel.show()
    panel.set_model(window.model)
    fed = {"n": 0}
    t0 = time.perf_counter()

    def feed() -> None:  # exactly 200 snapshots per second, whatever the timer's jitter
        due = int((time.perf_counter() - t0) * 200)
        while fed["n"] < due:
            panel.add_snapshots([recorded[fed["n"] % len(recorded)]])
            fed["n"] += 1

    feeder = QTimer()
    feeder.setTimerType(Qt.TimerType.PreciseTimer)
    feeder.setInterval(2)
    feeder.timeout.connect(feed)
    start_repaints = panel.repaints
    feeder.start()
    qtbot.wait(1500)
    feeder.stop()
    elapsed = time.perf_counter() - t0
    rate = (panel.repaints - start_repaints) / elapsed
    assert fed["n"] / elapsed > 190, "the feeder itself kept up"
    assert rate <= 35, f"{rate:.1f} repaints/s"
    assert rate >= 5, "and it does repaint"
    panel.stop()
