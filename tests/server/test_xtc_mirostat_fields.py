"""llama-server's XTC and mirostat request fields: applied by the engine's sampler chain,
bounded (a bad value is a 400 naming the field, in one line), and the model's recommended
values (``general.sampling.xtc_*``, ``mirostat*``) for a request that leaves them out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFValueType
from server_helpers import Server

from moescope.server.params import Limits, chat_params
from moescope.util.resources import demo_model_path
from moescope_testing.hostile import rewrite_gguf

pytestmark = [pytest.mark.engine, pytest.mark.slow]

F32, I32 = GGUFValueType.FLOAT32, GGUFValueType.INT32
ASK: dict[str, Any] = {"messages": [{"role": "user", "content": "Speak, Romeo"}],
                       "max_tokens": 12, "temperature": 0, "seed": 1}


def _answer(server: Server, **extra: Any) -> str:
    [model] = server.client().models.list().data
    r = server.client().chat.completions.create(model=model.id, extra_body=extra, **ASK)
    assert r.choices[0].message.content is not None
    return r.choices[0].message.content


def test_xtc_changes_a_greedy_answer_and_off_leaves_it(server: Server) -> None:
    greedy = _answer(server)
    assert _answer(server, xtc_probability=1, xtc_threshold=0.01) != greedy
    assert _answer(server, xtc_probability=1, xtc_threshold=0.6) == greedy
    assert _answer(server, xtc_probability=0, mirostat=0) == greedy


def test_mirostat_is_applied_after_the_temperature(server: Server) -> None:
    greedy = _answer(server)
    assert _answer(server, temperature=0.01, mirostat=2, mirostat_tau=9,
                   mirostat_eta=0.1) == greedy
    free = {_answer(server, temperature=1.0, mirostat=2, mirostat_tau=9, seed=s)
            for s in range(1, 5)}
    assert free - {greedy}


@pytest.mark.parametrize(("field", "value"), [
    ("xtc_probability", 1.5), ("xtc_probability", "1"), ("xtc_threshold", -0.5),
    ("mirostat", 3), ("mirostat", 1.5), ("mirostat", True), ("mirostat_tau", 1e9),
    ("mirostat_eta", -1)])
def test_bad_values_are_400s_naming_the_field(server: Server, field: str,
                                              value: Any) -> None:
    with server.http() as h:
        r = h.post("/v1/chat/completions", json={**ASK, field: value})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == field and "\n" not in err["message"]
        r = h.post("/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 2,
                                            field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field


def test_the_models_recommendation_is_the_default() -> None:
    rec = {"xtc_probability": 0.5, "xtc_threshold": 0.2, "mirostat": 2,
           "mirostat_tau": 3.0, "mirostat_eta": 0.3}
    p = chat_params(ASK, Limits(), rec)
    assert (p.xtc_probability, p.xtc_threshold, p.mirostat, p.mirostat_tau,
            p.mirostat_eta) == (0.5, 0.2, 2, 3.0, 0.3)
    p = chat_params({**ASK, "mirostat": 0, "xtc_probability": 0}, Limits(), rec)
    assert (p.mirostat, p.xtc_probability) == (0, 0.0)
    p = chat_params(ASK, Limits())  # llama-server's defaults: off
    assert (p.xtc_probability, p.xtc_threshold, p.mirostat, p.mirostat_tau,
            p.mirostat_eta) == (0.0, 0.1, 0, 5.0, 0.1)


def test_a_model_recommending_xtc_gets_it_unless_a_request_says_otherwise(
        server: Server, server_factory: Callable[..., Server],
        tmp_path_factory: pytest.TempPathFactory) -> None:
    greedy = _answer(server)
    rec = rewrite_gguf(demo_model_path(), tmp_path_factory.mktemp("xtc") / "xtc-demo.gguf",
                       set_keys={"general.sampling.xtc_probability": (F32, 1.0),
                                 "general.sampling.xtc_threshold": (F32, 0.01),
                                 "general.sampling.mirostat": (I32, 7)})  # out of bounds
    served = server_factory("--policy", "exact", model=Path(rec))
    assert _answer(served) != greedy
    assert _answer(served, xtc_probability=0) == greedy
