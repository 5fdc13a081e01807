"""A request that leaves a sampling field out gets the model's recommended value (its
GGUF's ``general.sampling.*``), as from llama-server; one that sets it keeps its own."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from gguf import GGUFValueType
from server_helpers import Server

from moescope.server.params import Limits, chat_params, completion_params
from moescope.util.resources import demo_model_path
from moescope_testing.hostile import rewrite_gguf

pytestmark = [pytest.mark.engine, pytest.mark.slow]

F32, I32 = GGUFValueType.FLOAT32, GGUFValueType.INT32


def test_a_field_left_out_takes_the_models_value() -> None:
    rec = {"temperature": 0.6, "top_k": 20, "repeat_penalty": 1.0, "min_p": 0.0}
    body = {"messages": [{"role": "user", "content": "hi"}]}
    p = chat_params(body, Limits(), rec)
    assert (p.temperature, p.top_k, p.repeat_penalty, p.min_p, p.top_p) == \
        (0.6, 20, 1.0, 0.0, 0.95)
    p = chat_params({**body, "temperature": 1.2, "top_k": 0}, Limits(), rec)
    assert (p.temperature, p.top_k) == (1.2, 0)  # the request's own, 0 included
    p = completion_params({"prompt": "x"}, Limits(), rec)
    assert p.temperature == 0.6
    p = chat_params(body, Limits())  # no recommendation: llama-server's defaults
    assert (p.temperature, p.top_k, p.repeat_penalty) == (0.8, 40, 1.0)


def test_a_greedy_recommendation_makes_answers_that_leave_it_out_greedy(
        server_factory: Callable[..., Server], tmp_path_factory: pytest.TempPathFactory
        ) -> None:
    demo = demo_model_path()
    assert demo is not None
    greedy = rewrite_gguf(demo, tmp_path_factory.mktemp("rec") / "greedy-demo.gguf",
                          set_keys={"general.sampling.temp": (F32, 0.0),
                                    "general.sampling.top_k": (I32, 1)})
    server = server_factory("--policy", "exact", model=Path(greedy))
    server.wait_idle()
    chat = server.client().chat.completions
    ask = dict(model="greedy-demo", messages=[{"role": "user", "content": "Speak, Romeo"}],
               max_tokens=24)
    left_out = {chat.create(**ask, seed=s).choices[0].message.content  # type: ignore[call-overload]
                for s in (1, 2, 3)}
    assert len(left_out) == 1, "the model's temperature 0: one answer whatever the seed"
    own = {chat.create(**ask, seed=s, temperature=1.5, extra_body={"top_k": 0},  # type: ignore[call-overload]
                       ).choices[0].message.content for s in (1, 2, 3)}
    assert len(own) > 1, "a request's own temperature still samples"
