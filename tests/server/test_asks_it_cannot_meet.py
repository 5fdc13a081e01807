"""A request that asks for what this server cannot give (a tool call without tools, audio) is a 400
naming the field, not an answer without it; a body sent to the other endpoint says where
it goes."""

from __future__ import annotations

import openai
import pytest
from server_helpers import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HELLO = [{"role": "user", "content": "Hello"}]


@pytest.mark.parametrize(("extra", "param", "says"), [
    ({"tool_choice": "required"}, "tool_choice",
     "tool_choice 'required' asks for a function call, and the request has no tools"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice",
     "asks for a function call, and the request has no tools"),
    ({"function_call": {"name": "f"}}, "function_call", "send tools and tool_choice"),
    ({"functions": [{"name": "f", "parameters": {}}]}, "functions",
     "not supported; send them as tools"),
    ({"modalities": ["text", "audio"]}, "modalities", "audio output is not supported"),
    ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "audio output is not supported"),
])
def test_a_tool_call_or_audio_asked_for_is_400_naming_the_field(
        server: Server, extra: dict, param: str, says: str) -> None:  # type: ignore[type-arg]
    """They were answered with plain text, as if the field were not there."""
    with pytest.raises(openai.BadRequestError) as err:
        server.client().chat.completions.create(
            model=server.client().models.list().data[0].id, messages=HELLO, max_tokens=2,
            **extra)
    body = err.value.body
    assert isinstance(body, dict) and body["param"] == param and says in body["message"]


@pytest.mark.parametrize("extra", [
    {"tool_choice": "auto"}, {"tool_choice": "none"}, {"tools": []},
    {"modalities": ["text"]},
])
def test_fields_that_ask_for_nothing_extra_still_answer(server: Server,
                                                        extra: dict) -> None:  # type: ignore[type-arg]
    with server.http() as h:
        r = h.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": 2, **extra})
    assert r.status_code == 200, r.text


def test_a_body_for_the_other_endpoint_says_where_it_goes(server: Server) -> None:
    with server.http() as h:
        r = h.post("/v1/chat/completions", json={"prompt": "Hello", "max_tokens": 2})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == ("messages must be a non-empty list (a raw "
                                                "prompt goes to POST /v1/completions)")
        r = h.post("/v1/completions", json={"messages": HELLO, "max_tokens": 2})
        assert r.status_code == 400
        assert r.json()["error"]["message"] == ("prompt is required (chat messages go to "
                                                "POST /v1/chat/completions)")
        r = h.post("/v1/chat/completions", json={"messages": [], "prompt": "x"})
        assert r.json()["error"]["message"] == "messages must be a non-empty list"
