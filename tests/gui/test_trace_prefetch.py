"""PSR in a reopened trace: the trace window shows prefetch accuracy from the recorded
per-token counters, as the live panel showed it (hidden when no policy prefetched, "not
recorded" for an older trace), and the what-if table has a prefetch-accuracy column whose
recorded point agrees with what the engine recorded."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gui_helpers import LONG_PROMPT, send

from moescope.cache.prefetch import PrefetchSummary
from moescope.display.cache_model import prefetch_text
from moescope.display.trace_io import reopen
from moescope.display.whatif_model import COLUMNS, cell_text
from moescope.gui.traces.trace_window import TraceWindow
from moescope.sim.sweep import RECORDED
from moescope.trace import read_trace
from moescope_testing.traces import as_older_trace

PREFETCH_COLUMN = [key for key, _ in COLUMNS].index("prefetch_accuracy")


@pytest.fixture(scope="module")
def to_psr_path(record: Callable[..., Path]) -> Path:
    """quality-first for 9 tokens, then psr to the end (so the panel's last window is psr)."""
    return record("qwen3moe", name="to-psr.jsonl", policy="quality-first", tokens=24,
                  switch_at=9, switch_policy="psr")


def _psr_tokens(path: Path) -> tuple[list[bool], np.ndarray, np.ndarray]:
    trace = read_trace(path)
    on = [t.policy == "psr" for t in trace.tokens]
    assert all(t.prefetches is not None for t in trace.tokens)
    return (on, np.array([t.prefetches for t in trace.tokens]),
            np.array([t.prefetch_hits for t in trace.tokens]))


def _sweep(qtbot: Any, window: TraceWindow) -> Any:
    view = window.whatif
    with qtbot.waitSignal(view.sweepFinished, timeout=20_000) as blocker:
        window.tabs.setCurrentWidget(view)
    return blocker.args[0]


def test_a_psr_trace_shows_the_recorded_prefetch_accuracy(
        open_trace_window: Callable[[Path], TraceWindow], to_psr_path: Path) -> None:
    window = open_trace_window(to_psr_path)
    on, pf, hits = _psr_tokens(to_psr_path)
    assert on == [False] * 9 + [True] * 15
    session = PrefetchSummary(tokens=15, prefetches=int(pf[9:].sum()), hits=int(hits[9:].sum()))
    assert session.prefetches > 0 and session.accuracy is not None
    label = window.prefetch_label
    assert label.isVisible()
    assert label.text() == f"PSR, 15 prefetching tokens: {prefetch_text(session)}"
    assert "whole recorded session" in label.toolTip()
    # the panel got the counters of the psr tokens only, per layer, as the live worker sends
    snaps = window.tokens
    assert all(s.prefetches is None for s in snaps[:9])
    for s, want, want_hits in zip(snaps[9:], pf[9:], hits[9:], strict=True):
        assert s.prefetches is not None and s.prefetch_hits is not None
        assert s.prefetches.tolist() == want.tolist()
        assert s.prefetch_hits.tolist() == want_hits.tolist()
    # and its stats line shows the live panel's number over its last window
    panel = window.panel
    panel.draw(force=True)
    assert panel.model.prefetch_summary() == session  # 15 tokens fit the 32-token window
    assert prefetch_text(session) in panel.summary.text()
    assert "Prefetch accuracy" in panel.summary.toolTip()
    panel.tabs.setCurrentWidget(panel.layer_bars)
    panel.draw(force=True)
    assert "layer 1: " in panel.layer_bars.toolTip() and "% used" in panel.layer_bars.toolTip()


def test_without_a_prefetching_policy_the_prefetch_line_is_hidden(
        trace_window: TraceWindow) -> None:
    assert not trace_window.prefetch_label.isVisible()
    assert trace_window.reopened.prefetch is None
    assert trace_window.reopened.prefetch_unrecorded == 0
    trace_window.panel.draw(force=True)
    assert "prefetch" not in trace_window.panel.summary.text()


def test_an_older_psr_trace_says_prefetch_was_not_recorded(
        open_trace_window: Callable[[Path], TraceWindow], to_psr_path: Path,
        tmp_path: Path) -> None:
    old = tmp_path / "old.jsonl"
    assert as_older_trace(to_psr_path, old, "prefetch") == 24
    window = open_trace_window(old)
    assert window.reopened.prefetch is None and window.reopened.prefetch_unrecorded == 15
    assert window.prefetch_label.isVisible()
    assert "not recorded" in window.prefetch_label.text()
    assert "%" not in window.prefetch_label.text()  # unknown, never a made-up 0%
    assert all(s.prefetches is None for s in window.tokens)
    window.panel.draw(force=True)
    assert "prefetch" not in window.panel.summary.text()


def test_the_whatif_table_has_a_prefetch_accuracy_column(
        qtbot: Any, open_trace_window: Callable[[Path], TraceWindow], to_psr_path: Path) -> None:
    window = open_trace_window(to_psr_path)
    result = _sweep(qtbot, window)
    table = window.whatif.table
    assert table.horizontalHeaderItem(PREFETCH_COLUMN).text() == "Prefetch accuracy"
    points = result.points()
    assert table.rowCount() == len(points)
    seen = set()
    for r, row in enumerate(points):
        text = table.item(r, PREFETCH_COLUMN).text()
        assert text == cell_text(row, "prefetch_accuracy")
        if row.policy in ("psr", RECORDED):  # the recorded session switched into psr
            assert row.prefetch_accuracy is not None and text.endswith("%"), row
            seen.add(row.policy)
        else:
            assert row.prefetch_accuracy is None and text == "–", row
    assert seen == {"psr", RECORDED}
    # the recorded point is the engine's own record: decode tokens under psr
    on, pf, hits = _psr_tokens(to_psr_path)
    trace = read_trace(to_psr_path)
    decode = np.array([p and t.phase == "decode" for p, t in zip(on, trace.tokens, strict=True)])
    engine = PrefetchSummary(tokens=int(decode.sum()), prefetches=int(pf[decode].sum()),
                             hits=int(hits[decode].sum()))
    assert result.recorded.prefetch_accuracy == engine.accuracy
    assert result.recorded.prefetches_per_token == engine.per_token
    assert "prefetch accuracy" in table.item(len(points) - 1, 0).toolTip()


def test_the_live_panel_and_the_reopened_trace_count_prefetches_alike(
        window: Any, qtbot: Any) -> None:
    """One session, quality-first then psr: every token's counters in the trace window are
    the ones the live window's worker computed for the same token."""
    send(qtbot, window, LONG_PROMPT, max_tokens=8)
    window.controls.select_policy("psr")
    qtbot.waitUntil(lambda: window.client.worker.engine.policy_name == "psr", timeout=10_000)
    send(qtbot, window, "and then?", max_tokens=20)
    live = list(window.recent_tokens)
    assert window.trace_path is not None
    again = reopen(window.trace_path).tokens
    assert len(again) == len(live) == 28
    assert any(s.prefetches is not None and s.prefetches.sum() > 0 for s in live)
    for a, b in zip(live, again, strict=True):
        assert a.policy == b.policy
        if a.prefetches is None:
            assert b.prefetches is None and b.prefetch_hits is None, a.step
        else:
            assert b.prefetches is not None and b.prefetch_hits is not None, a.step
            assert a.prefetches.tolist() == b.prefetches.tolist(), a.step
            assert a.prefetch_hits.tolist() == b.prefetch_hits.tolist(), a.step
