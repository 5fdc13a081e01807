"""``frequency_penalty`` and ``presence_penalty`` (OpenAI's, -2..2) reach llama.cpp's
penalties sampler: they change a greedy answer on the demo model, as they should, and 0
is the same answer as leaving them out."""

from __future__ import annotations

import json
from collections import Counter

import pytest
from server_helpers import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

MODEL = "moescope-demo-qwen3moe"
PROMPT = "ROMEO:"
"""Greedy, the demo model repeats itself here ("a very babe, a very babe")."""


def _tokens(server: Server, **penalties: float) -> tuple[str, list[str]]:
    r = server.client().completions.create(model=MODEL, prompt=PROMPT, max_tokens=60,
                                           temperature=0, logprobs=0, **penalties)
    assert r.choices[0].logprobs is not None
    return r.choices[0].text, list(r.choices[0].logprobs.tokens or [])


def _repeats(tokens: list[str]) -> int:
    """Tokens that are a repeat of an earlier one."""
    return sum(n - 1 for n in Counter(tokens).values())


def test_zero_penalties_are_the_same_answer_as_none(server: Server) -> None:
    plain = _tokens(server)
    assert _tokens(server, frequency_penalty=0, presence_penalty=0.0) == plain
    chat = server.client().chat.completions
    kwargs = dict(model=MODEL, messages=[{"role": "user", "content": "Hello"}],
                  max_tokens=24, temperature=0.9, seed=5)
    assert chat.create(**kwargs, presence_penalty=0, frequency_penalty=0  # type: ignore[call-overload]
                       ).choices[0].message.content == \
        chat.create(**kwargs).choices[0].message.content  # type: ignore[call-overload]


@pytest.mark.parametrize("name", ["presence_penalty", "frequency_penalty"])
def test_a_positive_penalty_makes_a_greedy_answer_repeat_itself_less(server: Server,
                                                                    name: str) -> None:
    text, tokens = _tokens(server)
    penalized_text, penalized = _tokens(server, **{name: 2.0})
    assert penalized_text != text
    assert _repeats(tokens) >= 20, text  # the unpenalized answer loops
    assert _repeats(penalized) * 3 < _repeats(tokens), (penalized_text, text)


def test_a_negative_penalty_makes_it_repeat_itself_more(server: Server) -> None:
    text, tokens = _tokens(server)
    more_text, more = _tokens(server, presence_penalty=-2.0)
    assert _repeats(more) > _repeats(tokens), (more_text, text)
    assert len(set(more)) < len(set(tokens))


def test_a_penalty_under_a_schema_still_gives_the_schemas_json(server: Server) -> None:
    """A penalty the grammar's shortcut does not model: the whole vocabulary is masked
    each token, and the answer still fits."""
    word = {"type": "string", "maxLength": 12}
    schema = {"type": "object",
              "properties": {"name": word, "tags": {"type": "array", "items": word,
                                                    "maxItems": 3}},
              "required": ["name", "tags"], "additionalProperties": False}
    r = server.client().chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Tag a play."}], max_tokens=200,
        temperature=0, presence_penalty=1.5, frequency_penalty=0.5,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "tagged", "schema": schema}})
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    value = json.loads(r.choices[0].message.content or "")
    assert set(value) == {"name", "tags"} and isinstance(value["name"], str)
    assert len(value["name"]) <= 12 and len(value["tags"]) <= 3
    assert all(isinstance(t, str) and len(t) <= 12 for t in value["tags"])
