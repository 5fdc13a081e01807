"""Tool calls and tool results in a conversation's history reach the model's chat
template, which shows them, or the request is a 400 naming the message: never dropped in
silence. (The server offers no tools itself; a client may still replay a conversation
that had them.)"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from server_helpers import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

ASK = {"role": "user", "content": "What is the weather in Paris?"}


def _call(arguments: str = '{"city": "Paris"}') -> dict:  # type: ignore[type-arg]
    return {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function",
         "function": {"name": "get_weather", "arguments": arguments}}]}


def _result(content: str) -> dict:  # type: ignore[type-arg]
    return {"role": "tool", "tool_call_id": "call_1", "content": content}


def _prompt_tokens(server: Server, messages: list[dict]) -> int:  # type: ignore[type-arg]
    [model] = server.client().models.list().data
    r = server.client().chat.completions.create(model=model.id, messages=messages,  # type: ignore[arg-type]
                                                max_tokens=1, temperature=0)
    assert r.usage is not None
    return r.usage.prompt_tokens


TOOL_TEMPLATE = (
    "{%- for message in messages %}"
    "{%- if message.role == 'tool' %}"  # tool results left out
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{ '<|im_start|>assistant\\n' + message.content }}"
    "{%- for call in message.tool_calls %}"
    "{{ '<tool_call><function=' + call.function.name + '>' }}"
    "{%- for key, value in call.function.arguments.items() %}"
    "{{ '<parameter=' + key + '>' + value | string + '</parameter>' }}"
    "{%- endfor %}{{ '</function></tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + message.role + '\\n' + message.content "
    "+ '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
"""Shows an assistant's tool calls with their arguments as an object, as Qwen3.5's and
Qwen3-Coder's do (``<parameter=city>``: a string there fails the template), and leaves
the ``tool`` role's messages out."""


@pytest.fixture
def tool_server(server_factory: Callable[..., Server],
                synth_model: Callable[..., Path]) -> Server:
    model = synth_model("qwen3moe", expert_type="q8_0", chat_template=TOOL_TEMPLATE)
    return server_factory("--ctx", "512", "--policy", "exact", model=model)


def test_calls_a_template_does_not_show_are_400_naming_the_message(server: Server) -> None:
    """The demo model's plain ChatML template prints content only: its calls would be
    lost."""
    with server.http() as h:
        r = h.post("/v1/chat/completions", json={
            "messages": [ASK, _call(), _result("18 C, sunny")], "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages[1].tool_calls"
    assert "does not show tool calls" in err["message"] and "\n" not in err["message"]


def test_a_tool_result_a_template_shows_reaches_the_prompt(server: Server) -> None:
    """ChatML prints a ``tool`` message as any other: its content is in the prompt."""
    short = _prompt_tokens(server, [ASK, {"role": "assistant", "content": "Let me look."},
                                    _result("sunny")])
    long = _prompt_tokens(server, [ASK, {"role": "assistant", "content": "Let me look."},
                                   _result("sunny " * 20)])
    assert long >= short + 19


def test_calls_a_template_shows_reach_the_prompt(tool_server: Server) -> None:
    without = _prompt_tokens(tool_server, [ASK, {"role": "assistant", "content": ""},
                                           {"role": "user", "content": "And?"}])
    short = _prompt_tokens(tool_server, [ASK, _call(), {"role": "user", "content": "And?"}])
    long = _prompt_tokens(tool_server, [ASK, _call('{"city": "' + "Paris " * 20 + '"}'),
                                        {"role": "user", "content": "And?"}])
    assert without < short < long


def test_arguments_that_are_no_json_object_reach_such_a_template_as_text(
        tool_server: Server) -> None:
    """Arguments that are not a JSON object go to the template as the text they are;
    this one takes objects only and refuses them: a 400, in one line."""
    with tool_server.http() as h:
        r = h.post("/v1/chat/completions", json={
            "messages": [ASK, _call("Paris, please"), {"role": "user", "content": "And?"}],
            "max_tokens": 2})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "messages" and "chat template refused" in err["message"]
    assert "\n" not in err["message"]


def test_a_tool_result_a_template_leaves_out_is_400_naming_it(tool_server: Server) -> None:
    with tool_server.http() as h:
        r = h.post("/v1/chat/completions", json={
            "messages": [ASK, _call(), _result("18 C, sunny")], "max_tokens": 2})
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "messages[2]" and "leaves tool results out" in err["message"]
        # the server lives on, and the same conversation without the result is served
        r = h.post("/v1/chat/completions", json={"messages": [ASK, _call()],
                                                 "max_tokens": 2})
        assert r.status_code == 200, r.text
