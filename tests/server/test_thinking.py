"""A thinking model's thoughts come back in ``reasoning_content``, as llama-server does."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from server_helpers import Server

from moescope_testing.vocab import THINKING_CHAT_TEMPLATE

pytestmark = [pytest.mark.engine, pytest.mark.slow]

QUESTION = [{"role": "user", "content": "What is two and two?"}]


@pytest.fixture
def thinker(server_factory: Callable[..., Server], synth_model: Callable[..., Path]) -> Server:
    model = synth_model("qwen3moe", expert_type="q8_0", chat_template=THINKING_CHAT_TEMPLATE)
    return server_factory("--ctx", "512", "--policy", "exact", model=model)


def test_thoughts_go_to_reasoning_content(thinker: Server) -> None:
    c = thinker.client()
    [model] = [m.id for m in c.models.list().data]
    r = c.chat.completions.create(model=model, messages=QUESTION, max_tokens=20, seed=1)
    message = r.choices[0].message
    # the template opens <think> in the prompt and this random model never closes it
    assert message.model_extra.get("reasoning_content")
    assert message.content == ""
    chunks = list(c.chat.completions.create(model=model, messages=QUESTION, max_tokens=20,
                                            seed=1, stream=True))
    streamed = "".join((ch.choices[0].delta.model_extra or {}).get("reasoning_content") or ""
                       for ch in chunks if ch.choices)
    assert streamed == message.model_extra["reasoning_content"]
    assert not "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
