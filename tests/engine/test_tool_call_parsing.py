"""Reading tool calls out of an answer as it streams (``engine.tool_calls``): Hermes JSON
blocks, Qwen3-Coder XML blocks and GLM-4.5's, whatever the pieces the text comes in; the
words before a call are content, a block that is not a call stays the text it is; which
format a chat template uses."""

from __future__ import annotations

import json

import pytest

from moescope.engine.gbnf import parse_error
from moescope.engine.tool_calls import (
    GLM,
    HARMONY,
    HERMES,
    XML,
    HarmonyCallStream,
    ToolCallStream,
    call_grammar,
    harmony_call_grammar,
    parser,
    template_format,
    xml_call_grammar,
)

WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"},
                                     "tags": {"type": "array", "items": {"type": "string"}}},
    "required": ["city"]}}}
TOOLS = [WEATHER, {"type": "function", "function": {"name": "add"}}]

HERMES_ANSWER = ('I will look.\n\n<tool_call>\n{"name": "get_weather", "arguments": '
                 '{"city": "Paris <3", "days": 2}}\n</tool_call>\n<tool_call>\n'
                 '{"name": "add", "arguments": {}}\n</tool_call>')
XML_ANSWER = ("I will look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n"
              "Paris\nFrance\n</parameter>\n<parameter=days>\n2\n</parameter>\n"
              '<parameter=tags>\n["a", "b"]\n</parameter>\n</function>\n</tool_call>\n'
              "<tool_call>\n<function=add>\n</function>\n</tool_call>")

GLM_ANSWER = ("I will look.\n<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>"
              "Paris\nFrance</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n"
              '<arg_key>tags</arg_key><arg_value>["a", "b"]</arg_value></tool_call>\n'
              "<tool_call>add</tool_call>")


def _run(fmt: str, text: str, step: int, parallel: bool = True) -> tuple[str, list[tuple]]:  # type: ignore[type-arg]
    stream = ToolCallStream(parser(fmt, TOOLS), parallel)
    content, calls = "", []
    for i in range(0, len(text), step):
        out, made = stream.feed(text[i:i + step])
        content += out
        calls += made
        if stream.done:
            break
    content += stream.finish()
    assert content == stream.content
    return content, [(c.name, json.loads(c.arguments)) for c in calls]


@pytest.mark.parametrize("step", [1, 2, 3, 7, 1000])
@pytest.mark.parametrize(("fmt", "text", "city"), [(HERMES, HERMES_ANSWER, "Paris <3"),
                                                   (XML, XML_ANSWER, "Paris\nFrance"),
                                                   (GLM, GLM_ANSWER, "Paris\nFrance")])
def test_calls_are_read_whatever_the_pieces(fmt: str, text: str, city: str,
                                            step: int) -> None:
    content, calls = _run(fmt, text, step)
    assert content == "I will look."
    want_weather = {"city": city, "days": 2}
    if fmt != HERMES:
        want_weather["tags"] = ["a", "b"]
    assert calls == [("get_weather", want_weather), ("add", {})]
    # not parallel: the first call, and the answer is done
    assert _run(fmt, text, step, parallel=False) == ("I will look.", calls[:1])


@pytest.mark.parametrize("text", [
    "no call here, just 1 < 2 and <tool",
    '<tool_call>\n{"name": "nope", "arguments": {}}\n</tool_call>',  # not a tool
    "<tool_call>\nnot json\n</tool_call> and after",
    '<tool_call>\n{"name": "add", "arguments": {}}',  # never closed (cut short)
    "\n\n  text with blank lines around  \n\n",
])
def test_what_is_no_call_is_the_text_it_is(text: str) -> None:
    for step in (1, 4, 1000):
        assert _run(HERMES, text, step) == (text, [])


def test_arguments_as_json_text_are_read_too() -> None:
    text = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1}"}</tool_call>'
    assert _run(HERMES, text, 5) == ("", [("add", {"a": 1})])


@pytest.mark.parametrize(("template", "fmt"), [
    ("{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools> "
     "<tool_call>\n{\"name\": ...}\n</tool_call>{% endif %}", HERMES),
    ("{% if tools %}<tool_call>\n<function=example_function_name>\n"
     "<parameter=example_parameter_1>{% endif %}", XML),
    ("{% if tools %}<tool_call>{{ name }}<arg_key>k</arg_key>{% endif %}", GLM),
    ("{% if tools %}<|start|>assistant<|channel|>commentary to=functions.f{% endif %}",
     HARMONY),
    ("{% if tools %}<|python_tag|>{{ tools | tojson }}{% endif %}", "other"),
    ("{% for m in messages %}<|im_start|>{{ m.content }}{% endfor %}", "none"),
    (None, "none"),
])
def test_a_template_s_format(template: str | None, fmt: str) -> None:
    assert template_format(template) == fmt


def test_the_grammars_parse() -> None:
    for text in (call_grammar(TOOLS, True), call_grammar(TOOLS[:1], False),
                 xml_call_grammar(TOOLS, True), xml_call_grammar(TOOLS[1:], False),
                 xml_call_grammar(TOOLS, True, GLM)):
        assert parse_error(text) is None, text


HARMONY_CALL = ('<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant'
                '<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>'
                '{"city": "Paris", "days": 2}')


def _harmony(text: str, step: int) -> tuple[str, list[tuple]]:  # type: ignore[type-arg]
    stream = HarmonyCallStream(["get_weather", "add"])
    out = ""
    for i in range(0, len(text), step):
        out += stream.feed(text[i:i + step])
    out += stream.finish()
    return out, [(c.name, json.loads(c.arguments)) for c in stream.calls]


@pytest.mark.parametrize("step", [1, 2, 5, 1000])
def test_a_harmony_call_is_taken_out_of_the_raw_answer(step: int) -> None:
    text, calls = _harmony(HARMONY_CALL, step)
    assert text == "<|channel|>analysis<|message|>Need the weather.<|end|>"
    assert calls == [("get_weather", {"city": "Paris", "days": 2})]
    # the recipient may come before the channel
    other = ('<|start|>assistant to=functions.add<|channel|>commentary json<|message|>'
             '{"a": 1}')
    assert _harmony(other, step) == ("", [("add", {"a": 1})])
    # or, right after the prompt's "<|start|>assistant", begin the answer
    first = ' to=functions.add<|channel|>commentary json<|message|>{"a": 2}'
    assert _harmony(first, step) == ("", [("add", {"a": 2})])


@pytest.mark.parametrize("text", [
    "<|channel|>analysis<|message|>thinking<|end|><|start|>assistant<|channel|>final"
    "<|message|>The answer.",
    "<|channel|>commentary to=functions.nope <|constrain|>json<|message|>{}",  # not a tool
    "<|channel|>commentary to=functions.add <|constrain|>json<|message|>{not json",
    "plain <|chan",
    " to=browser.search<|channel|>commentary<|message|>{}",  # not a function
    "to",
])
def test_what_is_no_harmony_call_passes_as_it_is(text: str) -> None:
    for step in (1, 3, 1000):
        assert _harmony(text, step) == (text, [])


def test_the_harmony_grammar_parses() -> None:
    assert parse_error(harmony_call_grammar(TOOLS)) is None
