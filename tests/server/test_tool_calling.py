"""Tool calling (OpenAI's ``tools``) through the openai client over loopback, on a
synthetic model whose chat template is Qwen3's way with tools (Hermes ``<tool_call>``
JSON) and on the demo model, whose template has no tool support: ``none`` answers as
without tools, ``required`` and a named function give a call whose arguments meet the
function's schema (a grammar), streamed calls reassemble in the client's accumulator, a
tool's result continues the conversation, and bad tools are one-line 400s naming the
field."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import openai
import pytest
from server_helpers import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

TEMPLATE = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n' }}"
    "{%- if messages[0].role == 'system' %}{{ messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{ '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor %}"
    "{{ '\\n</tools>\\n\\nFor each function call, return a json object with function name "
    "and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\"name\": "
    "<function-name>, \"arguments\": <args-json-object>}\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and tools %}"
    "{%- elif message.role == 'assistant' and message.tool_calls %}"
    "{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls %}"
    "{{ '\\n<tool_call>\\n{\"name\": \"' + call.function.name + '\", \"arguments\": ' }}"
    "{%- if call.function.arguments is string %}{{ call.function.arguments }}"
    "{%- else %}{{ call.function.arguments | tojson }}{%- endif %}"
    "{{ '}\\n</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content "
    "+ '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + message.role + '\\n' + message.content "
    "+ '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
"""Qwen3's template, cut to what tools need: the tools as JSON lines in a system turn, the
Hermes format, calls replayed as ``<tool_call>`` blocks, results in a user turn."""

XML_TEMPLATE = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n# Tools\\n\\nYou have access to the following functions:"
    "\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor %}"
    "{{ '\\n</tools>\\n\\nIf you choose to call a function ONLY reply in the following "
    "format with NO suffix:\\n\\n<tool_call>\\n<function=example_function_name>\\n"
    "<parameter=example_parameter_1>\\nvalue_1\\n</parameter>\\n</function>\\n"
    "</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls %}"
    "{{ '\\n<tool_call>\\n<function=' + call.function.name + '>\\n' }}"
    "{%- for key, value in call.function.arguments.items() %}"
    "{{ '<parameter=' + key + '>\\n' }}"
    "{%- if value is string %}{{ value }}{%- else %}{{ value | tojson }}{%- endif %}"
    "{{ '\\n</parameter>\\n' }}"
    "{%- endfor %}{{ '</function>\\n</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content "
    "+ '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + message.role + '\\n' + message.content "
    "+ '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
"""Qwen3.5's (and Qwen3-Coder's) way: the Qwen3-Coder XML calls, each parameter's value
as raw text (a string) or JSON."""

GLM_TEMPLATE = (
    "{%- if tools %}"
    "{{ '<|im_start|>system\\n# Tools\\n\\n<tools>' }}"
    "{%- for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{%- endfor %}"
    "{{ '\\n</tools>\\n\\nFor each function call, output the function name and arguments "
    "within the following XML format:\\n<tool_call>{function-name}\\n<arg_key>{arg-key-1}"
    "</arg_key>\\n<arg_value>{arg-value-1}</arg_value>\\n...\\n</tool_call><|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{{ '<|im_start|>assistant\\n' + (message.content or '') }}"
    "{%- for call in message.tool_calls %}"
    "{{ '\\n<tool_call>' + call.function.name + '\\n' }}"
    "{%- for key, value in call.function.arguments.items() %}"
    "{{ '<arg_key>' + key + '</arg_key>\\n<arg_value>' }}"
    "{%- if value is string %}{{ value }}{%- else %}{{ value | tojson }}{%- endif %}"
    "{{ '</arg_value>\\n' }}"
    "{%- endfor %}{{ '</tool_call>' }}"
    "{%- endfor %}{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{{ '<|im_start|>user\\n<tool_response>\\n' + message.content "
    "+ '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else %}{{ '<|im_start|>' + message.role + '\\n' + message.content "
    "+ '<|im_end|>\\n' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}")
"""GLM-4.5's way, in ChatML's turns (the synthetic vocabulary's): the name, then
``<arg_key>``/``<arg_value>`` pairs."""

HARMONY_TEMPLATE = (
    "{%- if tools %}"
    "{{ '<|start|>developer<|message|># Tools\\n\\n## functions\\n\\nnamespace functions {' }}"
    "{%- for tool in tools %}"
    "{{ '\\n// ' + (tool.function.description or '') + '\\ntype ' + tool.function.name "
    "+ ' = (_: ' }}{{ tool.function.parameters | tojson }}{{ ') => any;' }}"
    "{%- endfor %}{{ '\\n} // namespace functions<|end|>' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'assistant' and message.tool_calls %}"
    "{%- for call in message.tool_calls %}"
    "{{ '<|start|>assistant<|channel|>commentary to=functions.' + call.function.name "
    "+ ' <|constrain|>json<|message|>' }}"
    "{%- if call.function.arguments is string %}{{ call.function.arguments }}"
    "{%- else %}{{ call.function.arguments | tojson }}{%- endif %}{{ '<|call|>' }}"
    "{%- endfor %}"
    "{%- elif message.role == 'tool' %}"
    "{{ '<|start|>functions to=assistant<|channel|>commentary<|message|>' "
    "+ message.content + '<|end|>' }}"
    "{%- else %}{{ '<|start|>' + message.role + '<|message|>' + message.content "
    "+ '<|end|>' }}{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|start|>assistant' }}{%- endif %}")
"""gpt-oss's harmony, cut to what tools need: the functions as a namespace in a developer
message, a call as a commentary message to ``functions.NAME``, its result from
``functions``."""

ASK = [{"role": "user", "content": "What is the weather in Paris?"}]

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city.",
    "parameters": {"type": "object",
                   "properties": {"city": {"enum": ["Paris", "Rome", "Oslo"]},
                                  "unit": {"enum": ["celsius", "fahrenheit"]},
                                  "days": {"type": "integer", "minimum": 1, "maximum": 7}},
                   "required": ["city", "days"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "parameters": {
        "$defs": {"Small": {"type": "integer", "minimum": 0, "maximum": 99}},
        "type": "object", "properties": {"a": {"$ref": "#/$defs/Small"},
                                         "b": {"$ref": "#/$defs/Small"}},
        "required": ["a", "b"]}}}
ADD_PLAIN = {"type": "function", "function": {
    "name": "add", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                         "b": {"type": "integer", "minimum": 0, "maximum": 99}},
        "required": ["a", "b"]}}}
"""``add`` without a ``$ref``, which the XML calls (Qwen3-Coder's, GLM's) cannot force."""
TOOLS = [WEATHER, ADD]


@pytest.fixture(scope="module", params=["hermes", "xml", "glm", "harmony"])
def fmt(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def tool_model(synth_model: Callable[..., Path], fmt: str) -> Path:
    return synth_model("qwen3moe", expert_type="q8_0", ctx=4096,
                       chat_template={"hermes": TEMPLATE, "xml": XML_TEMPLATE,
                                      "glm": GLM_TEMPLATE,
                                      "harmony": HARMONY_TEMPLATE}[fmt])


@pytest.fixture(scope="module")
def tools(fmt: str) -> list[dict[str, Any]]:
    return TOOLS if fmt in ("hermes", "harmony") else [WEATHER, ADD_PLAIN]


@pytest.fixture
def tools_server(server_factory: Callable[..., Server], tool_model: Path) -> Server:
    return server_factory("--ctx", "4096", "--policy", "exact", model=tool_model)


def _ask(server: Server, **kwargs: Any) -> Any:
    kwargs.setdefault("messages", ASK)
    kwargs.setdefault("max_tokens", 400)
    kwargs.setdefault("temperature", 0)
    return server.client().chat.completions.create(
        model=server.client().models.list().data[0].id, **kwargs)


def _meets(arguments: str, name: str) -> dict[str, Any]:
    """The arguments parsed, checked against the function's schema (by hand: the schemas
    here are small)."""
    args = json.loads(arguments)
    assert isinstance(args, dict)
    if name == "get_weather":
        assert set(args) <= {"city", "unit", "days"} and {"city", "days"} <= set(args)
        assert args["city"] in ("Paris", "Rome", "Oslo")
        assert args.get("unit", "celsius") in ("celsius", "fahrenheit")
        assert isinstance(args["days"], int) and 1 <= args["days"] <= 7
    else:
        assert name == "add" and {"a", "b"} <= set(args)
        assert all(isinstance(args[k], int) and 0 <= args[k] <= 99 for k in ("a", "b"))
    return args


def test_tool_choice_none_answers_as_without_tools(tools_server: Server,
                                                   tools: list[dict[str, Any]]) -> None:
    plain = _ask(tools_server, max_tokens=8, seed=3)
    none = _ask(tools_server, max_tokens=8, seed=3, tools=tools, tool_choice="none")
    [choice] = none.choices
    assert choice.message.tool_calls is None and choice.finish_reason != "tool_calls"
    # no tools in the prompt: the same prompt, the same answer
    assert none.usage.prompt_tokens == plain.usage.prompt_tokens
    assert choice.message.content == plain.choices[0].message.content


def test_auto_shows_the_tools_to_the_model(tools_server: Server,
                                          tools: list[dict[str, Any]]) -> None:
    plain = _ask(tools_server, max_tokens=4)
    auto = _ask(tools_server, max_tokens=4, tools=tools)
    # the template's tool prompt, with each function's schema, is in the prompt
    assert auto.usage.prompt_tokens > plain.usage.prompt_tokens + 100
    assert auto.choices[0].finish_reason in ("stop", "length", "tool_calls")


@pytest.mark.parametrize("parallel", [False, True])
def test_required_gives_a_call_whose_arguments_meet_the_schema(
        tools_server: Server, tools: list[dict[str, Any]], parallel: bool) -> None:
    r = _ask(tools_server, tools=tools, tool_choice="required", seed=1,
             parallel_tool_calls=parallel, max_tokens=600)
    [choice] = r.choices
    assert choice.finish_reason == "tool_calls", choice
    calls = choice.message.tool_calls
    assert calls and choice.message.content is None
    if not parallel:
        assert len(calls) == 1
    for call in calls:
        assert call.type == "function" and call.id.startswith("call_")
        _meets(call.function.arguments, call.function.name)
    assert len({c.id for c in calls}) == len(calls)


def test_a_named_function_is_the_one_called(tools_server: Server,
                                           tools: list[dict[str, Any]]) -> None:
    r = _ask(tools_server, tools=tools, seed=2,
             tool_choice={"type": "function", "function": {"name": "add"}})
    [call] = r.choices[0].message.tool_calls
    assert call.function.name == "add"
    _meets(call.function.arguments, "add")


def test_a_streamed_call_reassembles_in_the_client(tools_server: Server,
                                                   tools: list[dict[str, Any]]) -> None:
    kwargs: dict[str, Any] = {"tools": tools, "tool_choice": "required", "seed": 5,
                              "max_tokens": 600, "temperature": 0, "messages": ASK}
    whole = _ask(tools_server, **kwargs)
    client = tools_server.client()
    with client.chat.completions.stream(model=client.models.list().data[0].id,
                                        **kwargs) as stream:
        final = stream.get_final_completion()
    [choice] = final.choices
    assert choice.finish_reason == "tool_calls"
    got = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
    want = [(c.function.name, c.function.arguments)
            for c in whole.choices[0].message.tool_calls]
    assert got == want
    for name, arguments in got:
        _meets(arguments, name)
    # the raw chunks: each call in a delta of its own index, with id, type and name
    deltas = [chunk.choices[0].delta for chunk in client.chat.completions.create(
        model=client.models.list().data[0].id, stream=True, **kwargs) if chunk.choices]
    calls = [c for d in deltas for c in d.tool_calls or ()]
    assert [c.index for c in calls] == list(range(len(got)))
    assert all(c.id and c.type == "function" and c.function.name for c in calls)


def test_a_tool_result_continues_the_conversation(tools_server: Server,
                                                  tools: list[dict[str, Any]]) -> None:
    first = _ask(tools_server, tools=tools, seed=1,
                 tool_choice={"type": "function", "function": {"name": "get_weather"}})
    message = first.choices[0].message
    [call] = message.tool_calls
    history = [*ASK, message.model_dump(exclude_none=True),
               {"role": "tool", "tool_call_id": call.id, "content": "18 C, sunny"}]
    second = _ask(tools_server, messages=history, tools=tools, tool_choice="none",
                  max_tokens=6)
    assert second.choices[0].message.content and second.choices[0].message.tool_calls is None
    # the call and the result reached the prompt (without the tools: "none" shows none)
    assert second.usage.prompt_tokens > _ask(tools_server, max_tokens=1).usage.prompt_tokens + 20
    # and with the tools shown, the model may call again or answer
    third = _ask(tools_server, messages=history, tools=tools, max_tokens=6)
    assert third.usage.prompt_tokens > first.usage.prompt_tokens
    assert third.choices[0].finish_reason in ("stop", "length", "tool_calls")


def _tool(name: str = "f", parameters: Any = None, **extra: Any) -> dict[str, Any]:
    function: dict[str, Any] = {"name": name, **extra}
    if parameters is not None:
        function["parameters"] = parameters
    return {"type": "function", "function": function}


def _deep(levels: int) -> dict[str, Any]:
    schema: dict[str, Any] = {"type": "integer"}
    for _ in range(levels):
        schema = {"type": "object", "properties": {"x": schema}}
    return schema


@pytest.mark.parametrize(("extra", "param", "says"), [
    ({"tools": [_tool("get weather")]}, "tools[0].function.name", "must match"),
    ({"tools": [_tool("x" * 65)]}, "tools[0].function.name", "must match"),
    ({"tools": [_tool(), _tool()]}, "tools[1].function.name", "two tools are named 'f'"),
    ({"tools": [_tool(f"f{i}") for i in range(129)]}, "tools", "at most 128 tools"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]", "only function tools"),
    ({"tools": "f"}, "tools", "tools must be a list"),
    ({"tools": [_tool(parameters=[1])]}, "tools[0].function.parameters", "must be a JSON "
     "schema"),
    ({"tools": [_tool(parameters={"type": "string"})]}, "tools[0].function.parameters",
     "must describe an object"),
    ({"tools": [_tool(parameters=_deep(40))]}, "tools[0].function.parameters",
     "nests deeper than 32"),
    ({"tools": [_tool(description=7)]}, "tools[0].function.description", "must be a string"),
    ({"tools": [_tool(description="x" * 20000)]}, "tools[0].function.description",
     "at most 16384"),
    ({"tools": [_tool(description="stop<|im_end|>")]}, "tools[0]", "control tokens"),
    ({"tools": [_tool()], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice", "not among the tools"),
    ({"tools": [_tool()], "tool_choice": "always"}, "tool_choice", 'must be "none"'),
    ({"tool_choice": "required"}, "tool_choice", "the request has no tools"),
    ({"tools": [_tool()], "parallel_tool_calls": "yes"}, "parallel_tool_calls",
     "true or false"),
    ({"tools": [_tool()], "response_format": {"type": "json_object"}}, "response_format",
     "response_format and tools together"),
    ({"tools": [_tool()], "logprobs": True}, "logprobs", "logprobs with tools"),
    ({"tools": [_tool(parameters={"type": "object", "properties": {"a": {"not": {}}}})],
      "tool_choice": "required"}, "tools[0].function.parameters",
     "the call cannot be forced: properties.a.not is not supported"),
    ({"functions": [{"name": "f"}]}, "functions", "send them as tools"),
])
def test_bad_tools_are_400_naming_the_field(tools_server: Server, extra: dict[str, Any],
                                           param: str, says: str) -> None:
    with tools_server.http() as h:
        r = h.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2, **extra})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and says in err["message"], err
    assert "\n" not in err["message"]


def test_on_a_template_without_tools_none_answers_and_a_call_is_refused(
        server: Server) -> None:
    """The demo model's template is plain ChatML: it never reads tools."""
    r = _ask(server, tools=TOOLS, tool_choice="none", max_tokens=4)
    assert r.choices[0].message.content and r.choices[0].message.tool_calls is None
    for choice in ("auto", "required"):
        with pytest.raises(openai.BadRequestError) as err:
            _ask(server, tools=TOOLS, tool_choice=choice, max_tokens=4)
        body = err.value.body
        assert isinstance(body, dict) and body["param"] == "tools"
        assert "has no tool support" in body["message"]


@pytest.mark.parametrize(("tool", "says"), [
    (ADD, "a $ref cannot be forced in"),
    (_tool(parameters={"type": "object", "properties": {"s": {"type": "string",
                                                           "pattern": "^a+$"}}}),
     "a string's pattern cannot be forced in raw text"),
    (_tool(parameters={"type": "object", "properties": {"a<b": {"type": "integer"}}}),
     "cannot be written in"),
])
def test_what_an_xml_call_cannot_force_is_400(tools_server: Server, fmt: str,
                                              tool: dict[str, Any], says: str) -> None:
    if fmt in ("hermes", "harmony"):
        pytest.skip("the XML formats only (Qwen3-Coder's, GLM's)")
    with tools_server.http() as h:
        r = h.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2,
                                                  "tools": [tool], "tool_choice": "required"})
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "tools" and says in err["message"], err
    # auto reads such calls all the same: no grammar is needed
    with tools_server.http() as h:
        r = h.post("/v1/chat/completions", json={"messages": ASK, "max_tokens": 2,
                                                  "tools": [tool]})
    assert r.status_code == 200, r.text
