"""A reopened trace's panel speaks of the recording, not of now: the live panel's "now:"
and "latest answer's TTFT" read, in the trace window, as if something were running."""

from __future__ import annotations

from typing import Any

from moescope.display.cache_model import SUMMARY_TIP, TRACE_SUMMARY_TIP
from moescope.gui.cache.panel import CachePanel
from moescope.gui.traces.trace_window import TraceWindow


def _lines(panel: CachePanel) -> list[str]:
    panel.draw(force=True)
    return panel.summary.text().split("\n")


def test_the_trace_window_says_end_of_the_trace_and_the_live_panel_says_now(
        qtbot: Any, trace_window: TraceWindow) -> None:
    panel = trace_window.panel
    model = panel.model
    assert model.latest is not None and model.ttft_s is not None
    ttft = f"TTFT {model.ttft_s * 1000:.0f} ms"
    first, second = _lines(panel)
    assert first.startswith(f"end of the trace: {model.policy} · {model.slots_per_layer}/")
    assert f"· token {model.latest.step}" in first
    assert first.endswith(f"· last answer in the trace: {ttft}")
    assert "now" not in first and "latest answer" not in first
    assert second.startswith(f"last {model.recent_tokens()} token")
    tip = panel.summary.toolTip()
    assert tip.startswith(TRACE_SUMMARY_TIP.split("{", 1)[0])
    assert "what the cache did at the end of the trace" in tip and " now " not in tip

    # the same tokens in a live panel keep the live wording
    live = CachePanel(live=True)
    qtbot.addWidget(live)
    live.set_model(trace_window.reopened.model)
    live.add_snapshots(trace_window.tokens)
    try:
        live_first, live_second = _lines(live)
        assert live_first == first.replace("end of the trace: ", "now: ", 1).replace(
            f"last answer in the trace: {ttft}", f"latest answer's {ttft}")
        assert live_second == second
        assert live.summary.toolTip().startswith(SUMMARY_TIP.split("{", 1)[0])
    finally:
        live.stop()
