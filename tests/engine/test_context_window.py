"""A conversation longer than the context: the earliest turns are left out (rolling window),
the system prompt and the last message stay, and the answer says so."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moescope.engine import Engine, Sampling
from moescope.util.errors import MoEScopeError

SYSTEM = {"role": "system", "content": "You are terse."}


def _conversation(turns: int) -> list[dict[str, str]]:
    out = [SYSTEM]
    for i in range(turns):
        out.append({"role": "user", "content": f"Question {i}: " + "tell me more " * 8})
        out.append({"role": "assistant", "content": f"Answer {i}: " + "here is more " * 8})
    out.append({"role": "user", "content": "Last question?"})
    return out


def test_the_earliest_turns_make_room_for_the_answer(engine: Callable[..., Engine],
                                                     tiny_moe: Path) -> None:
    e = engine(tiny_moe, n_ctx=256)
    messages = _conversation(12)
    full = e.tokenize(e.format_chat(messages))
    assert len(full) > 256, "the conversation must not fit, or the test shows nothing"
    sampling = Sampling(max_tokens=8, temperature=0, seed=1)
    list(e.generate(messages, sampling))
    a = e.last_answer
    assert a.dropped_messages > 0 and a.dropped_messages % 2 == 0  # whole turns
    assert a.n_prompt_tokens <= 256 - min(sampling.max_tokens, 256 // 4)
    kept = [SYSTEM, *messages[1 + a.dropped_messages:]]
    assert a.n_prompt_tokens == len(e.tokenize(e.format_chat(kept)))
    # no more than needed: keeping one more turn would not have left the room
    one_more = [SYSTEM, *messages[1 + a.dropped_messages - 2:]]
    assert len(e.tokenize(e.format_chat(one_more))) > 256 - sampling.max_tokens
    assert "earliest messages left out" in a.summary()


def test_a_conversation_that_fits_is_sent_whole(engine: Callable[..., Engine],
                                                tiny_moe: Path) -> None:
    e = engine(tiny_moe, n_ctx=512)
    messages = _conversation(1)
    list(e.generate(messages, Sampling(max_tokens=4, temperature=0)))
    assert e.last_answer.dropped_messages == 0
    assert e.last_answer.n_prompt_tokens == len(e.tokenize(e.format_chat(messages)))


@pytest.mark.parametrize(("n_ctx", "words"), [(64, 200), (160, 90)])
def test_a_last_message_too_long_alone_is_still_refused(engine: Callable[..., Engine],
                                                        tiny_moe: Path, n_ctx: int,
                                                        words: int) -> None:
    """(160, 90): longer than the context asked for, shorter than llama.cpp's padded one
    (256): once a crash deep in llama-cpp-python's eval, now the same clear refusal."""
    e = engine(tiny_moe, n_ctx=n_ctx)
    messages: list[Any] = [*_conversation(2)[:-1],
                           {"role": "user", "content": "word " * words}]
    if n_ctx == 160:
        assert n_ctx < len(e.tokenize(e.format_chat(messages[-1:]))) < e._llm.n_ctx()
    with pytest.raises(MoEScopeError, match="does not fit the context"):
        list(e.generate(messages, Sampling(max_tokens=4)))
