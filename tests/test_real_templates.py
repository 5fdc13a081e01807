"""The thinking switch and answer prefixes against real chat templates: the ones llama.cpp
ships in the pinned sdist (downloaded by the engine build, never committed). Skipped when
the sdist is not in the build cache."""

from __future__ import annotations

import re

import pytest

from moescope.model.reasoning import (
    reasoning_prefix,
    split_reasoning,
    template_variables,
    thinking_choices,
)
from moescope_testing.templates import SDIST, sdist_templates

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "2+2?"}]

pytestmark = pytest.mark.skipif(not SDIST.exists(), reason=f"{SDIST} not built yet")


def _template(name: str) -> str:
    return sdist_templates()[name]


def _render(template: str, thinking: str) -> str:
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    return Jinja2ChatFormatter(template=template, eos_token="</s>", bos_token="<s>")(
        messages=MESSAGES, **template_variables(thinking)).prompt


@pytest.mark.parametrize(("name", "choices", "prefixes"), [
    ("Qwen-Qwen3-0.6B.jinja", ("default", "off", "on"), ("", "", "")),
    ("Qwen3.5-4B.jinja", ("default", "off", "on"), ("<think>\n", "", "<think>\n")),
    ("NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja", ("default", "off", "on"),
     ("<think>\n", "", "<think>\n")),
    ("openai-gpt-oss-120b.jinja", ("default", "low", "medium", "high"), ("", "", "", "")),
    # GLM-4.5/4.6 open their thoughts themselves; off: "/nothink" and an empty block
    ("GLM-4.6.jinja", ("default", "off", "on"), ("", "", "")),
])
def test_switch_and_prefix_per_setting(name: str, choices: tuple[str, ...],
                                       prefixes: tuple[str, ...]) -> None:
    template = _template(name)
    assert thinking_choices(template) == choices
    prompts = {c: _render(template, c) for c in choices}
    assert tuple(reasoning_prefix(prompts[c]) for c in choices) == prefixes
    if "off" in choices:  # thinking off: the template closes an empty think block itself
        assert re.search(r"<think>\s*</think>\s*$", prompts["off"])
    if "high" in choices:
        assert "Reasoning: high" in prompts["high"] and "Reasoning: low" in prompts["low"]


def test_earlier_answers_go_back_without_thoughts_as_qwen3_itself_does() -> None:
    """Qwen3's template drops an earlier answer's thoughts itself; our history sends the
    answer only, and the prompt comes out the same."""
    template = _template("Qwen-Qwen3-0.6B.jinja")
    raw = "<think>\nThey greet me.\n</think>\n\nHello!"
    ours = [*MESSAGES[:2], {"role": "assistant", "content": split_reasoning(raw).answer},
            MESSAGES[3]]
    theirs = [*MESSAGES[:2], {"role": "assistant", "content": raw}, MESSAGES[3]]
    from llama_cpp.llama_chat_format import Jinja2ChatFormatter

    f = Jinja2ChatFormatter(template=template, eos_token="</s>", bos_token="<s>")
    assert f(messages=ours).prompt == f(messages=theirs).prompt
