"""The chat template's thinking switch reaches the prompt (and only templates that have it
offer it)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.engine import Engine, Sampling
from moescope.model.reasoning import template_variables, thinking_choices
from moescope_testing.vocab import HYBRID_THINKING_CHAT_TEMPLATE

MESSAGES = [{"role": "user", "content": "What is two and two?"}]


@pytest.fixture
def hybrid(synth_model: Callable[..., Path]) -> Path:
    return synth_model("qwen3moe", expert_type="q8_0",
                       chat_template=HYBRID_THINKING_CHAT_TEMPLATE)


def test_choices_follow_the_template() -> None:
    assert thinking_choices(None) == ("default",)
    assert thinking_choices("{{ enable_thinking }}") == ("default", "off", "on")
    assert thinking_choices("{{ reasoning_effort }}") == ("default", "low", "medium", "high")
    assert template_variables("default") == {}
    assert template_variables("off") == {"enable_thinking": False}
    with pytest.raises(ValueError, match="thinking must be one of"):
        template_variables("maximum")


@pytest.mark.parametrize(("choice", "tail"), [
    ("default", "<|im_start|>assistant\n"),
    ("off", "<|im_start|>assistant\n<think>\n\n</think>\n\n"),
    ("on", "<|im_start|>assistant\n"),
])
def test_the_switch_shapes_the_prompt_the_answer_is_decoded_from(
        engine: Callable[..., Engine], hybrid: Path, choice: str, tail: str) -> None:
    e = engine(hybrid)
    assert e.thinking_choices() == ("default", "off", "on", "low", "medium", "high")
    prompt = e.format_chat(MESSAGES, choice)
    assert prompt.endswith(tail)
    list(e.generate(MESSAGES, Sampling(max_tokens=2, thinking=choice)))
    assert e.last_answer.n_prompt_tokens == len(e.tokenize(prompt))


def test_effort_goes_to_the_template(engine: Callable[..., Engine], hybrid: Path) -> None:
    e = engine(hybrid)
    assert "Reasoning: high" in e.format_chat(MESSAGES, "high")
    assert "Reasoning:" not in e.format_chat(MESSAGES)


def test_a_model_without_the_switch_offers_none(engine: Callable[..., Engine],
                                                tiny_moe: Path) -> None:
    assert engine(tiny_moe).thinking_choices() == ("default",)
