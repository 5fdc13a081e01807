"""Over the API: a model that writes its template's turn opener (``<|im_start|>``) has
ended its answer there (no made-up "assistant" turn in the content), streamed or whole;
OpenAI's ``logit_bias`` (which makes it write one here) is bounded, and refused in one
line past the vocabulary."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from server_helpers import Server

from moescope.engine import Engine

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HI = [{"role": "user", "content": "Hello there"}]


@pytest.fixture(scope="module")
def chatml(synth_model: Callable[..., Path]) -> Path:
    return synth_model("qwen3moe", expert_type="q8_0")


@pytest.fixture(scope="module")
def im_start(chatml: Path) -> int:
    e = Engine()
    e.load(chatml, n_ctx=256, n_threads=1, policy="exact")
    try:
        [token] = e.tokenize("<|im_start|>", add_bos=False, special=True)
        return token
    finally:
        e.close()


@pytest.fixture
def served(server_factory: Callable[..., Server], chatml: Path) -> Server:
    return server_factory("--ctx", "256", "--policy", "exact", model=chatml)


@pytest.mark.parametrize("stream", [False, True])
def test_the_turn_opener_ends_the_answer(served: Server, im_start: int,
                                         stream: bool) -> None:
    client = served.client()
    model = client.models.list().data[0].id
    kwargs = {"model": model, "messages": HI, "max_tokens": 16, "temperature": 0,
              "logit_bias": {str(im_start): 100}}
    if stream:
        chunks = list(client.chat.completions.create(stream=True, **kwargs))
        content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        finish = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
    else:
        r = client.chat.completions.create(**kwargs)
        content, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert r.usage.completion_tokens == 0
    assert content == "" and finish == "stop"
    # without the bias the model answers
    plain = client.chat.completions.create(model=model, messages=HI, max_tokens=4,
                                           temperature=0)
    assert plain.usage.completion_tokens == 4


@pytest.mark.parametrize(("bias", "says"), [
    ({"99999999": 1}, "this model's tokens are 0 to"),
    ({"1": 150}, "numbers from -100 to 100"),
    ({"x": 1}, "keys are token ids"),
    ({"-1": 1}, "keys are token ids"),
    ({str(i): 1 for i in range(1025)}, "at most 1024"),
    ([1], "must be an object"),
])
def test_a_bad_logit_bias_is_400(served: Server, bias: object, says: str) -> None:
    with served.http() as h:
        r = h.post("/v1/chat/completions", json={"messages": HI, "max_tokens": 2,
                                                  "logit_bias": bias})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "logit_bias" and says in err["message"], err
