"""The what-if of a trace with no decoded token (a session stopped after its prompt): it says
plainly that there is nothing to compare, as ``moescope replay`` does, instead of sweeping a
grid of zeros and offering PSR as "no PSR predictions" when there was no token to predict
for."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtWidgets import QLabel

from moescope.display.whatif_model import has_predictions
from moescope.trace import read_trace
from moescope_testing.traces import prefill_only_trace


@pytest.fixture(scope="module")
def prefill_only(engine_required: None, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return prefill_only_trace(tmp_path_factory.mktemp("prefill") / "prompt-only.parquet")


@pytest.mark.engine
def test_a_prefill_only_trace_says_there_is_nothing_to_compare(
        qtbot: Any, open_trace_window: Callable[[Path], Any], prefill_only: Path) -> None:
    window = open_trace_window(prefill_only)
    view = window.whatif
    assert window.tabs.isTabEnabled(1)  # readable: it says why
    finished: list[Any] = []
    view.sweepFinished.connect(finished.append)
    window.tabs.setCurrentWidget(view)
    qtbot.waitUntil(view.isVisible)
    text = view.status.text()
    assert text.startswith("Nothing to compare: no token was decoded (the trace holds only "
                           "the prefill of its prompt)")
    assert "nothing to replay" in text and "Plots" in text
    assert view.status.isVisible()
    assert window.tabs.tabToolTip(1) == text
    # no grid, no sweep, no controls offering one
    assert not view.table.isVisible() and not view.plot.isVisible()
    assert not view.cost.isEnabled() and not view.policy_button.isEnabled()
    assert not view.progress.isVisible() and not view.stop_button.isVisible()
    view.start()
    qtbot.wait(300)
    assert not view.running and view.result is None and finished == []
    assert not view._thread.isRunning()
    assert "predictions" not in text and not has_predictions(read_trace(prefill_only))


@pytest.mark.engine
def test_a_trace_with_a_decoded_token_still_sweeps(
        qtbot: Any, open_trace_window: Callable[[Path], Any], trace_path: Path) -> None:
    window = open_trace_window(trace_path)
    view = window.whatif
    assert view.nothing is None and view.cost.isEnabled()
    with qtbot.waitSignal(view.sweepFinished, timeout=15_000):
        window.tabs.setCurrentWidget(view)
    assert view.table.rowCount() > 0 and view.table.isVisible()


@pytest.mark.engine
def test_the_trace_window_says_no_token_was_decoded(
        open_trace_window: Callable[[Path], Any], prefill_only: Path) -> None:
    """Its header said "1 tokens" and its prefetch line "PSR, 1 prefetching tokens: prefetch
    accuracy – · 0.0/token", as if PSR had run and prefetched nothing."""
    window = open_trace_window(prefill_only)
    header = window.findChild(QLabel, "statsLabel").text()
    assert " · 1 token, none decoded · policies: psr · " in header, header
    label = window.prefetch_label
    assert label.isVisible()
    assert label.text() == ("PSR: no token was decoded, so nothing was prefetched (PSR "
                            "prefetches while decoding; the trace holds only the prefill)")
