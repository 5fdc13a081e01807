"""The window's session trace holds every governed step, also of answers that end on EOS.

The worker records the step that chose an answer's end-of-generation token (the engine
holds it back as ``AnswerStats.end_step``) and draws it, so the live panel and the trace
show the same steps, and a replay of a chat that ends every way the window can end an
answer (EOS, the token limit, Stop, Answer now and its continuation, Regenerate) writes
the very rows the engine wrote. The shipped demo model answers with an end of its own.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gui_helpers import load, send, slow_down

from moescope.engine import Engine
from moescope.sim import decision_mismatches, replay
from moescope.trace import read_trace
from moescope.trace.names import live_trace_file
from moescope.util.resources import demo_model_path
from moescope_testing.vocab import THINKING_CHAT_TEMPLATE


@pytest.fixture
def thinking_demo(monkeypatch: pytest.MonkeyPatch) -> Path:
    """The demo model with a template that opens <think> in the prompt (its ChatML tokens
    are the template's): the same model, whose thoughts "Answer now" can cut short."""
    path = demo_model_path()
    if path is None:
        pytest.fail("the demo model is missing from resources/models/")
    load_model = Engine.load

    def thinking_load(self: Engine, *args: Any, **kw: Any) -> Any:
        loaded = load_model(self, *args, **kw)
        self._llm.metadata["tokenizer.chat_template"] = THINKING_CHAT_TEMPLATE
        return loaded

    monkeypatch.setattr(Engine, "load", thinking_load)
    return path


def _acting(qtbot: Any, window: Any, act: Callable[[], bool], text: str | None,
            max_tokens: int) -> Any:
    """Send ``text`` (None: Regenerate) and call ``act`` on each batch of tokens until it
    returns True; returns the AnswerSummary."""
    done: list[bool] = []

    def on_tokens(_snaps: list[Any]) -> None:
        if not done and act():
            done.append(True)

    window.chat_settings.max_tokens.setValue(max_tokens)
    window.chat.tokensArrived.connect(on_tokens)
    try:
        with qtbot.waitSignal(window.chat.answerFinished, timeout=60_000) as blocker:
            assert window.chat.send(text) if text is not None else window.chat.regenerate()
    finally:
        window.chat.tokensArrived.disconnect(on_tokens)
    assert done
    return blocker.args[0]


def test_a_window_chat_ending_every_way_replays_to_the_recorded_rows(
        make_window: Callable[..., Any], qtbot: Any, thinking_demo: Path) -> None:
    window = make_window()
    load(qtbot, window, thinking_demo, budget="25%", policy="quality-first", n_ctx=512)
    window.chat_settings.seed.setValue(3)
    chat, engine = window.chat, window.client.worker.engine
    stops: list[str] = []
    ends: list[Any] = []
    window.chat.answerFinished.connect(lambda s: stops.append(s.stop_reason))
    window.chat.tokensArrived.connect(lambda snaps: ends.extend(s for s in snaps if s.end))

    slow_down(window, 2000)  # long enough to act mid-answer
    _acting(qtbot, window, lambda: chat.reasoning_tokens >= 3 and chat.answer_now(),
            "Hello there, how are you?", 400)
    slow_down(window, 0)
    send(qtbot, window, "Tell me a story about a cat.", max_tokens=8)
    slow_down(window, 20_000)  # a stop lands long before the answer could end
    _acting(qtbot, window, lambda: chat.tokens_received >= 1 and (chat.stop() or True),
            "Tell me a long story about the king.", 400)
    slow_down(window, 0)
    chat.new_chat()  # room in the demo model's 512-token context; the session goes on
    send(qtbot, window, "Recite something.", max_tokens=200)
    with qtbot.waitSignal(chat.answerFinished, timeout=60_000):
        assert chat.regenerate()
    send(qtbot, window, "Thanks, bye.", max_tokens=200)

    assert stops[1:3] == ["length", "stopped"], stops
    assert stops[0] == "eos" or "eos" in stops[3:-1], stops  # and a turn after it
    assert len(ends) == stops.count("eos") and all(len(s.events) for s in ends)
    assert all(s.text == "" for s in ends)
    messages = window.store.messages(chat.chat_id)
    assert all(m.status == "done" or m.role == "user" for m in messages[:-1])

    assert window.trace_path is not None
    window.client.worker.recorder.flush()
    trace = read_trace(live_trace_file(window.trace_path))  # a journal, if still one
    recorded = trace.events()
    steps = np.unique(recorded["step"])
    assert steps.tolist() == list(range(int(steps[0]), int(steps[-1]) + 1))
    assert engine.cache is not None and int(steps[-1]) == engine.cache.step
    # what the live panel drew is what the trace holds, the end steps too
    live = list(window.recent_tokens)
    tail = trace.tokens[-len(live):]
    assert [t.text for t in tail] == [s.text for s in live]
    assert all(np.array_equal(t.events, s.events) for t, s in zip(tail, live, strict=True))
    result = replay(trace, None, None, keep_events=True)
    assert result.warnings == []
    assert result.events is not None
    assert decision_mismatches(recorded, result.events) == []
    replayed = [(int(r["hits"]), int(r["fetches"])) for r in result.per_token]
    assert replayed == [(int(t.events["n_hit"].sum()), int(t.events["n_fetch"].sum()))
                        for t in trace.tokens]
