"""A reopened trace draws the residency the live panel drew, token by token, also where the
event rows cannot say it: PSR's prefetches and a budget shrink mid-answer (the recorder
writes the real masks there). An older trace without the masks still opens, flagged
approximate after its shrink, as before."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gui_helpers import LONG_PROMPT, LONG_SEED, load, send, slow_down

from moescope.display.trace_io import reopen
from moescope.trace import read_trace
from moescope.trace.names import live_trace_file
from moescope_testing.traces import as_older_trace


def _shrink_mid_answer(window: Any, qtbot: Any, slots: int, after: int = 6) -> None:
    """A long answer; once ``after`` tokens arrived, move the budget slider to ``slots``."""
    slow_down(window, 3000)
    window.chat_settings.max_tokens.setValue(30)
    acted: list[bool] = []

    def maybe_act(_snaps: list[Any]) -> None:
        if not acted and window.chat.tokens_received >= after:
            acted.append(True)
            window.controls.budget.setValue(slots)

    window.chat.tokensArrived.connect(maybe_act)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=60_000):
        window.chat.send(LONG_PROMPT)
    window.chat.tokensArrived.disconnect(maybe_act)
    window.client.worker.engine.set_copy_delay(0)
    assert acted, "the answer ended before the budget could be changed"


@pytest.mark.parametrize("policy", ["psr", "quality-first"])
def test_reopened_residency_is_the_live_one_with_prefetch_and_a_shrink(
        make_window: Callable[..., Any], qtbot: Any, tiny_moe: Path, policy: str) -> None:
    window = make_window()
    load(qtbot, window, tiny_moe, budget="75%", policy=policy, n_ctx=512)
    window.chat_settings.seed.setValue(LONG_SEED)
    _shrink_mid_answer(window, qtbot, slots=5)
    send(qtbot, window, "and then?", max_tokens=12)
    live = list(window.recent_tokens)
    slots = [t.slots_per_layer for t in live]
    second = [t.index for t in live].index(0, 1)
    assert slots[0] == 12 and set(slots[:second]) == {12, 5}  # shrunk mid-answer
    assert window.trace_path is not None
    reopened = reopen(window.trace_path)
    assert len(reopened.tokens) == len(live)
    for i, a in enumerate(live):
        assert a.resident is not None
        np.testing.assert_array_equal(reopened.resident(i), a.resident, err_msg=f"step {a.step}")
    np.testing.assert_array_equal(reopened.tokens[-1].resident, live[-1].resident)
    assert reopened.approximate_from is None
    # the masks were needed: the rows alone miss the prefetches and guess the shrink
    trace = read_trace(live_trace_file(window.trace_path))  # a journal, if still one
    masked = [t.index for t in trace.tokens if t.resident is not None]
    assert slots.index(5) in masked


@pytest.fixture(scope="module")
def shrink_path(record: Callable[..., Path]) -> Path:
    """quality-first at 50% (8 slots), shrunk to 25% (4 slots) after 9 tokens."""
    return record("qwen3moe", name="shrink.jsonl", policy="quality-first", budget="50%",
                  tokens=24, switch_at=9, switch_policy="quality-first", switch_budget="25%")


def test_an_older_trace_without_masks_reopens_approximate_after_its_shrink(
        shrink_path: Path, tmp_path: Path) -> None:
    new = reopen(shrink_path)
    assert new.approximate_from is None
    assert read_trace(shrink_path).tokens[9].resident is not None  # the shrink was checked
    old_path = tmp_path / "old.jsonl"
    as_older_trace(shrink_path, old_path, "resident")
    old = reopen(old_path)
    assert old.approximate_from == 10  # token index 9, plotted at step 10
    assert len(old.tokens) == len(new.tokens) == 24
    for i in range(9):  # exact before the shrink
        np.testing.assert_array_equal(old.resident(i), new.resident(i))
    # from the shrink on, the guess (most recently used kept) is not what the core kept
    assert any(not np.array_equal(new.resident(i), old.resident(i)) for i in range(9, 24))
