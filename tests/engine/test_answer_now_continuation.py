""""Answer now" continues from the tokens the model generated, not from a new tokenization
of their text: re-tokenized, the thoughts split differently (BPE merges across token
boundaries), the KV cache is reused only up to the first difference, and the rest of a
long chain of thoughts would be read again in batches the expert cache does not govern."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from moescope.engine import Engine, Sampling
from moescope_testing.vocab import THINKING_CHAT_TEMPLATE

MESSAGES = [{"role": "user", "content": "Think about the sea, then answer."}]
CLOSING = "\n</think>\n\n"


def _spy_prompts(e: Engine) -> list[list[int]]:
    seen: list[list[int]] = []
    real = e._llm.generate

    def generate(tokens: Any, *args: Any, **kw: Any) -> Any:
        seen.append(list(tokens))
        return real(tokens, *args, **kw)

    e._llm.generate = generate
    return seen


def test_answer_now_continues_from_the_generated_tokens(
        engine: Callable[..., Engine], synth_model: Callable[..., Path]) -> None:
    e = engine(synth_model("qwen3moe", chat_template=THINKING_CHAT_TEMPLATE),
               budget="25%", policy="exact")
    seen = _spy_prompts(e)
    thinking = Sampling(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                        max_tokens=24, seed=3)
    ids, text = [], ""
    for tok in e.generate(MESSAGES, thinking):
        ids.append(tok.token_id)
        text += tok.text
    assert len(ids) == 24
    prompt = seen[0]
    fresh = e.tokenize(e.format_chat(MESSAGES) + text + CLOSING)
    assert fresh[:len(prompt) + len(ids)] != prompt + ids, \
        "this text tokenizes like the generated tokens: pick a seed where it does not"
    for _ in e.generate(MESSAGES, Sampling(temperature=0.0, max_tokens=4),
                        answer_start=text + CLOSING):
        pass
    continued = seen[1]
    assert continued[:len(prompt) + len(ids)] == prompt + ids
    assert e.detokenize(continued[len(prompt):]) == text + CLOSING
    assert e.last_answer.n_prompt_tokens == len(continued)


def test_another_prompt_is_tokenized_afresh(
        engine: Callable[..., Engine], synth_model: Callable[..., Path]) -> None:
    """The previous answer's tokens are reused only for that answer's own continuation."""
    e = engine(synth_model("qwen3moe", chat_template=THINKING_CHAT_TEMPLATE),
               budget="25%", policy="exact")
    seen = _spy_prompts(e)
    text = "".join(t.text for t in e.generate(MESSAGES, Sampling(max_tokens=8, seed=3)))
    other = [{"role": "user", "content": "Something else."}]
    for _ in e.generate(other, Sampling(max_tokens=2), answer_start=text + CLOSING):
        pass
    assert seen[1] == e.tokenize(e.format_chat(other) + text + CLOSING)
