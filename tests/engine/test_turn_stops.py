"""A control token that opens a turn in the chat template (ChatML's ``<|im_start|>``) ends
the answer where the model writes it, as its end-of-generation tokens do: llama.cpp does
not count it as one, and the model went on with a turn of its own ("assistant", a made-up
exchange) in the window, the terminal chat and the server alike. The model is made to
write it with a logit bias (OpenAI's ``logit_bias``, which the engine applies before
anything samples)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.engine import Engine, Sampling
from moescope.util.errors import MoEScopeError

pytestmark = pytest.mark.engine

HI = [{"role": "user", "content": "Hello there"}]


def _token(e: Engine, text: str) -> int:
    [token] = e.tokenize(text, add_bos=False, special=True)
    return token


def test_the_template_turn_opener_ends_the_answer(
        engine: Callable[..., Engine], tiny_moe: Path) -> None:
    e = engine(tiny_moe, policy="exact")
    start, end = _token(e, "<|im_start|>"), _token(e, "<|im_end|>")
    assert e.turn_stops() == frozenset({start})  # <|im_end|> is llama.cpp's end already
    free = list(e.generate(HI, Sampling(max_tokens=12, temperature=0)))
    assert len(free) > 0 and start not in [t.token_id for t in free]
    # made to write <|im_start|> first: nothing is answered, the answer ended there
    forced = list(e.generate(HI, Sampling(max_tokens=12, temperature=0,
                                          logit_bias={start: 100.0})))
    assert forced == []
    assert e.last_answer.stop_reason == "eos" and e.last_answer.n_tokens == 0
    assert e.last_answer.end_step is not None  # the step that chose it was governed
    # a token the model writes anyway is the whole answer (the bias works at all)
    first = free[0].token_id
    biased = list(e.generate(HI, Sampling(max_tokens=5, temperature=0,
                                          logit_bias={first: 100.0, end: -100.0})))
    assert [t.token_id for t in biased] == [first] * 5


def test_without_the_opener_in_the_template_nothing_more_stops(
        engine: Callable[..., Engine], synth_model: Callable[..., Path]) -> None:
    plain = synth_model("qwen3moe", expert_type="q8_0", chat_template=(
        "{%- for m in messages %}{{ m.role + ': ' + m.content + '\\n' }}{%- endfor %}"
        "{{ 'assistant: ' }}"))
    e = engine(plain, policy="exact")
    assert e.turn_stops() == frozenset()
    start = _token(e, "<|im_start|>")
    out = list(e.generate(HI, Sampling(max_tokens=3, temperature=0,
                                       logit_bias={start: 100.0})))
    assert [t.token_id for t in out] == [start] * 3


@pytest.mark.parametrize(("bias", "says"), [
    ({10**9: 1.0}, "this model's tokens are 0 to"),
    ({1: 101.0}, "numbers from -100 to 100"),
    ({1: float("nan")}, "numbers from -100 to 100"),
    ({-1: 1.0}, "numbers from -100 to 100"),
])
def test_a_bad_logit_bias_is_refused_in_one_line(engine: Callable[..., Engine],
                                                 tiny_moe: Path, bias: dict[int, float],
                                                 says: str) -> None:
    e = engine(tiny_moe, policy="exact")
    with pytest.raises(MoEScopeError, match=says):
        list(e.generate(HI, Sampling(max_tokens=2, logit_bias=bias)))
