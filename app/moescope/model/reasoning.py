"""Reasoning ("thinking") in an answer: where it ends and the answer proper begins.

The models our users run think before they answer. Qwen3 and Qwen3-Next write
``<think>…</think>`` first (the *Thinking* variants' chat template already opens the tag in
the prompt, so the model's text starts inside it); gpt-oss writes the harmony format,
``<|channel|>analysis<|message|>…`` then ``<|start|>assistant<|channel|>final<|message|>…``
(llama.cpp renders those four markers as text and drops ``<|end|>``). Shown raw, that is
a wall of markers; sent back raw in the next turn, it spends context on thoughts the
model's own template would have dropped.

The raw text stays what is stored, exported as JSON and traced; :func:`split_reasoning`
is a pure function of it, so the live view, a reopened chat, the history sent to the model
and the CLI all agree on the split. It works on partial text: a marker cut in half at the
end of a stream is held back, not shown.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
HARMONY_CHANNEL = "<|channel|>"
HARMONY_MESSAGE = "<|message|>"
HARMONY_START = "<|start|>"
HARMONY_END = "<|end|>"  # llama.cpp drops it from generated text; "Answer now" writes it
FINAL_CHANNEL = "final"
_MARKERS = (THINK_OPEN, THINK_CLOSE, HARMONY_CHANNEL, HARMONY_MESSAGE, HARMONY_START,
            HARMONY_END)
_HARMONY_SEGMENT = re.compile(r"(?:assistant)?<\|channel\|>(?P<channel>.*?)<\|message\|>",
                              re.DOTALL)


@dataclass(frozen=True)
class ReasoningSplit:
    """An answer's raw text, split into what the model thought and what it answered."""

    reasoning: str
    """The thinking, markers removed ("" when the model did not think)."""
    answer: str
    """What the model answered: the text to render, copy and send back next turn."""
    thinking: bool
    """The text ends inside the reasoning: the answer has not begun yet."""

    @property
    def has_reasoning(self) -> bool:
        return bool(self.reasoning.strip()) or self.thinking


def held_back(text: str) -> int:
    """Length of a trailing prefix of a marker (a marker cut by the stream), else 0."""
    tail = text[-max(len(m) for m in _MARKERS):]
    for i in range(len(tail)):
        piece = tail[i:]
        if any(m.startswith(piece) and m != piece for m in _MARKERS):
            return len(piece)
    return 0


def split_reasoning(raw: str, *, partial: bool = False) -> ReasoningSplit:
    """Split ``raw`` into reasoning and answer (``partial``: the text is still streaming,
    so a marker cut at its end is held back instead of shown).

    Recognised: ``<think>…</think>answer`` (also with the opening tag left to the prompt,
    see :func:`reasoning_prefix`) and harmony channels (every channel but ``final`` counts
    as reasoning). Anything else is all answer.
    """
    text = raw[:len(raw) - held_back(raw)] if partial else raw
    stripped = text.lstrip()
    if stripped.startswith(HARMONY_CHANNEL) or stripped.startswith(HARMONY_START):
        return _split_harmony(stripped)
    if stripped.startswith(THINK_OPEN):
        body = stripped[len(THINK_OPEN):]
        head, sep, answer = body.partition(THINK_CLOSE)
        if not sep:
            return ReasoningSplit(head.strip(), "", thinking=True)
        return ReasoningSplit(head.strip(), answer.lstrip(), thinking=False)
    return ReasoningSplit("", text, thinking=False)


def _split_harmony(text: str) -> ReasoningSplit:
    thoughts: list[str] = []
    answer: list[str] = []
    segments = [s for s in text.split(HARMONY_START) if s.strip()]
    thinking = False
    for segment in segments:
        match = _HARMONY_SEGMENT.match(segment.lstrip())
        if match is None:  # the header is still arriving
            thinking = not answer
            continue
        body = segment.lstrip()[match.end():].replace(HARMONY_END, "")
        if match.group("channel").split()[0:1] == [FINAL_CHANNEL]:
            answer.append(body)
            thinking = False
        else:
            thoughts.append(body.strip())
            thinking = True
    return ReasoningSplit("\n\n".join(t for t in thoughts if t), "".join(answer).lstrip(),
                          thinking=thinking)


def reasoning_prefix(prompt: str) -> str:
    """What the prompt already opened for the answer: ``"<think>\\n"`` when a chat
    template ends its generation prompt inside a think tag (Qwen3 *Thinking* models), so
    the stored answer reads ``<think>…</think>answer`` like everyone else's; else ""."""
    tail = prompt.rstrip()
    if tail.endswith(THINK_OPEN):
        return THINK_OPEN + "\n"
    return ""


def close_reasoning(raw: str) -> str:
    """What to append to ``raw``, an answer still thinking, so that the model answers next
    ("Answer now"): the closing tag, or harmony's switch to the final channel; "" when the
    answer is not in its thoughts."""
    split = split_reasoning(raw, partial=True)
    if not split.thinking:
        return ""
    if raw.lstrip().startswith((HARMONY_CHANNEL, HARMONY_START)):
        return f"{HARMONY_END}{HARMONY_START}assistant{HARMONY_CHANNEL}{FINAL_CHANNEL}" \
               f"{HARMONY_MESSAGE}"
    held = len(raw) - len(raw.rstrip())  # a newline ends the thoughts, once
    return ("" if held else "\n") + THINK_CLOSE + "\n\n"


def answer_begins(texts: Sequence[str]) -> int | None:
    """Index of the token where the answer proper begins after thoughts, given one answer's
    token texts (as a trace records them), else None (no thoughts, or no answer yet).

    A trace has the model's tokens only, not what the template opened in the prompt, so an
    answer that closes ``</think>`` without having opened it is read as a Qwen3 *Thinking*
    answer whose ``<think>`` the prompt held."""
    whole = "".join(texts)
    prefix = THINK_OPEN + "\n" if THINK_CLOSE in whole and THINK_OPEN not in whole else ""
    raw = prefix
    thought = False
    for i, text in enumerate(texts):
        raw += text
        split = split_reasoning(raw, partial=True)
        if split.answer:
            return i if thought else None
        thought = thought or split.has_reasoning
    return None


def answer_text(raw: str) -> str:
    """The answer without its reasoning: what the next turn's prompt should carry."""
    return split_reasoning(raw).answer


THINKING_DEFAULT = "default"
_SWITCH = ("off", "on")  # Qwen3's hybrid templates: ``enable_thinking``
_EFFORT = ("low", "medium", "high")  # gpt-oss: ``reasoning_effort``


def thinking_choices(template: str | None) -> tuple[str, ...]:
    """The thinking settings a chat template understands, "default" first.

    Qwen3's hybrid templates read ``enable_thinking`` (off: the template writes an empty
    ``<think></think>`` and the model answers at once); gpt-oss reads ``reasoning_effort``.
    Thinking costs tokens, and on an offloaded MoE every token costs expert copies, so
    the switch is worth having wherever the template offers it, and only there.
    """
    text = template or ""
    out = [THINKING_DEFAULT]
    if "enable_thinking" in text:
        out += _SWITCH
    if "reasoning_effort" in text:
        out += _EFFORT
    return tuple(out)


def template_variables(choice: str) -> dict[str, object]:
    """The chat template variables of a thinking setting ({} for "default")."""
    if choice == THINKING_DEFAULT:
        return {}
    if choice in _SWITCH:
        return {"enable_thinking": choice == "on"}
    if choice in _EFFORT:
        return {"enable_thinking": True, "reasoning_effort": choice}
    raise ValueError(f"thinking must be one of {', '.join((THINKING_DEFAULT, *_SWITCH, *_EFFORT))}"
                     f", got {choice!r}")


THINKING_SETTINGS = (THINKING_DEFAULT, *_SWITCH, *_EFFORT)
