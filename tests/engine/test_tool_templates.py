"""Tool calling against real chat templates: the ones llama.cpp ships in the pinned sdist
(downloaded by the engine build, never committed; skipped without it). Each template's
format is told right (a namespaced ``<seed:tool_call>``, MiniMax's ``<invoke>`` or
Apriel's ``<tool_calls>`` list is no format the server reads), and where the server
reads it, the call the template itself writes into a conversation's history reads back
as the same call: the parsers read what the models were trained to write."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from moescope.engine.tool_calls import (
    GLM,
    HARMONY,
    HERMES,
    XML,
    HarmonyCallStream,
    parser,
    template_format,
)
from moescope.model.reasoning import template_variables
from moescope_testing.templates import SDIST, sdist_templates

pytestmark = pytest.mark.skipif(not SDIST.exists(), reason=f"{SDIST} not built yet")

TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather of a city, the next days.",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "days": {"type": "integer"}},
                   "required": ["city"]}}}]
ARGS = {"city": "Paris", "days": 2}
HISTORY = [{"role": "user", "content": "Weather in Paris?"},
           {"role": "assistant", "content": "", "tool_calls": [
               {"id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": ARGS}}]},
           {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
           {"role": "user", "content": "Thanks. And Rome?"}]


def _render(template: str, messages: list[dict[str, Any]]) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    return Jinja2ChatFormatter(template=template, eos_token="</s>", bos_token="<s>")(
        messages=messages, tools=TOOLS, **template_variables("default")).prompt


READ = [("Qwen-Qwen3-0.6B.jinja", HERMES), ("Qwen-Qwen2.5-7B-Instruct.jinja", HERMES),
        ("Qwen-QwQ-32B.jinja", HERMES), ("ibm-granite-granite-4.0.jinja", HERMES),
        ("Qwen3.5-4B.jinja", XML), ("Qwen3-Coder.jinja", XML),
        ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", XML), ("GLM-4.6.jinja", GLM),
        ("GLM-4.7-Flash.jinja", GLM), ("openai-gpt-oss-120b.jinja", HARMONY)]


@pytest.mark.parametrize(("name", "fmt"), [
    *READ,
    ("ByteDance-Seed-OSS.jinja", "other"), ("MiniMax-M3.jinja", "other"),
    ("MiniMax-M2.jinja", "other"), ("unsloth-Apriel-1.5.jinja", "other"),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", "other"),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "other"),
    ("moonshotai-Kimi-K2.jinja", "other"), ("deepseek-ai-DeepSeek-V3.2.jinja", "other"),
    ("google-gemma-2-2b-it.jinja", "none"),
])
def test_each_template_s_format(name: str, fmt: str) -> None:
    assert template_format(sdist_templates()[name]) == fmt


@pytest.mark.parametrize(("name", "fmt"), READ)
def test_the_template_s_own_call_reads_back(name: str, fmt: str) -> None:
    template = sdist_templates()[name]
    plain = _render(template, HISTORY[:1])
    assert "get_weather" in plain and "Weather of a city" in plain  # the tools are shown
    prompt = _render(template, HISTORY)
    if fmt == HARMONY:
        [segment] = re.findall(r"<\|start\|>assistant(.*?)<\|call\|>", prompt, re.S)
        stream = HarmonyCallStream(["get_weather"])
        stream.feed(segment)
        stream.finish()
        calls = stream.calls
    else:
        read = parser(fmt, TOOLS)
        calls = [c for c in (read(body) for body in
                             re.findall(r"<tool_call>(.*?)</tool_call>", prompt, re.S)) if c]
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", ARGS)]
