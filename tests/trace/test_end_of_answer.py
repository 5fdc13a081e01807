"""Every governed step reaches the trace, the one that chose an answer's end-of-text too.

The decode of an answer's last token is governed like any other (the cache fetches and
evicts for it) and its logits choose the end-of-generation token, which the engine does not
yield as a token of the answer. Its rows used to stay in the event ring until the next
answer's first drain discarded them: a multi-turn trace then lacked one step per answer
that ended on EOS, and its replay diverged from the next turn on ("the trace jumps from
step 181 to 183"). Here a chat mixes every way an answer ends (EOS, the token limit, a
stop, "answer now" and its continuation) on the shipped demo model, whose answers end on
their own, and its trace must replay to the very rows the engine wrote.
"""

from __future__ import annotations

import dataclasses
import io
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moescope.cli import main
from moescope.engine import Engine
from moescope.sim import decision_mismatches, replay
from moescope.trace import ANSWER_NOW_NOTE, Trace, read_trace
from moescope.util.resources import demo_model_path
from moescope_testing.vocab import THINKING_CHAT_TEMPLATE

pytestmark = [pytest.mark.engine, pytest.mark.usefixtures("engine_required")]

ANSWERS = {1: (400, 3), 2: (400, None), 3: (8, None), 4: (400, None), 5: (400, 3),
           6: (400, 2), 7: (400, None)}
"""Generate call -> (max tokens, Ctrl+C after this token index or None). With a template
that opens <think>, Ctrl+C in the thoughts is "answer now" (calls 1 and 5 are continued by
calls 2 and 6), Ctrl+C in the continuation (call 6) stops it; call 3 hits its limit."""


@dataclasses.dataclass
class Session:
    stop_reasons: list[str] = dataclasses.field(default_factory=list)
    final_step: int | None = None
    eos_ids: set[int] = dataclasses.field(default_factory=set)


def demo_model() -> Path:
    path = demo_model_path()
    if path is None:
        pytest.fail("the demo model is missing from resources/models/")
    return path


def thinking_demo(monkeypatch: pytest.MonkeyPatch) -> None:
    """The demo model with a chat template that opens <think> in the prompt (as Qwen3
    Thinking models do): its ChatML tokens are the template's, so it is the same model
    with a thinking template, whose answers can be cut short by "answer now"."""
    load = Engine.load

    def thinking_load(self: Engine, *args: Any, **kw: Any) -> Any:
        loaded = load(self, *args, **kw)
        self._llm.metadata["tokenizer.chat_template"] = THINKING_CHAT_TEMPLATE
        return loaded

    monkeypatch.setattr(Engine, "load", thinking_load)


def scripted(monkeypatch: pytest.MonkeyPatch, plan: dict[int, tuple[int, int | None]],
             session: Session) -> None:
    """Each ``Engine.generate`` call gets its token limit from ``plan`` and, where planned,
    a real SIGINT after a token (Ctrl+C); the engine's last step is kept at close."""
    generate, close = Engine.generate, Engine.close
    calls = 0

    def planned(self: Engine, prompt: Any, sampling: Any = None, **kw: Any) -> Iterator[Any]:
        nonlocal calls
        calls += 1
        limit, interrupt = plan[calls]
        sampling = dataclasses.replace(sampling, max_tokens=limit)
        for tok in generate(self, prompt, sampling, **kw):
            yield tok
            if tok.index == interrupt:
                signal.raise_signal(signal.SIGINT)
        session.stop_reasons.append(self.last_answer.stop_reason)
        if self.last_answer.end_step is not None:
            session.eos_ids.add(self.last_answer.end_step.token_id)

    def keep_step(self: Engine) -> None:
        if self.cache is not None:
            session.final_step = self.cache.step
        close(self)

    monkeypatch.setattr(Engine, "generate", planned)
    monkeypatch.setattr(Engine, "close", keep_step)


def assert_replays_exactly(trace: Trace, final_step: int | None) -> None:
    """No governed step is missing (the rows' steps run without a gap to the engine's
    last), and a replay under the recorded policy and budget writes the same rows, so the
    same per-token decisions and totals."""
    recorded = trace.events()
    steps = np.unique(recorded["step"])
    assert steps.tolist() == list(range(int(steps[0]), int(steps[-1]) + 1))
    assert final_step is not None and int(steps[-1]) == final_step
    result = replay(trace, None, None, keep_events=True)
    assert result.warnings == []
    assert result.events is not None
    assert decision_mismatches(recorded, result.events) == []
    k = trace.header.model.top_k
    assert np.array_equal(recorded["weights"][:, :k], result.events["weights"][:, :k])
    per_token = [(int(t.events["n_hit"].sum()), int(t.events["n_fetch"].sum()),
                  int(t.events["bytes_sync"].sum())) for t in trace.tokens]
    replayed = [(int(r["hits"]), int(r["fetches"]), int(r["bytes_sync"]))
                for r in result.per_token]
    assert replayed == per_token


def test_a_chat_ending_every_way_replays_to_the_recorded_rows(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    session = Session()
    thinking_demo(monkeypatch)
    scripted(monkeypatch, ANSWERS, session)
    path = tmp_path / "chat.jsonl"
    lines = ["Hello there, how are you?", "Tell me a story about a cat.",
             "What is two plus two?", "Recite something.", "Thanks, bye."]
    monkeypatch.setattr("sys.stdin", io.StringIO("".join(f"{x}\n" for x in lines)))
    code = main(["chat", str(demo_model()), "--policy", "quality-first", "--budget", "25%",
                 "--seed", "3", "--threads", "1", "--trace", str(path)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.count("answer now") == 2
    reasons = session.stop_reasons
    assert len(reasons) == len(ANSWERS)
    assert reasons[0] == reasons[4] == reasons[5] == "stopped" and reasons[2] == "length"
    assert reasons.count("eos") >= 2, reasons  # the demo model's answers end on their own

    trace = read_trace(path)
    assert trace.end is not None and not trace.truncated
    assert_replays_exactly(trace, session.final_step)
    ends = [t for t in trace.tokens if t.token_id in session.eos_ids]
    assert len(ends) == reasons.count("eos") and all(len(t.events) for t in ends)
    assert all(t.text == "" for t in ends)
    notes = [t.answer for t in trace.tokens if any(c.text == ANSWER_NOW_NOTE
                                                   for c in t.changes)]
    assert len(notes) == 2
