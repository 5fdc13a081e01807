"""Reasoning split: Qwen3 think tags, the harmony format, and text cut mid-stream."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from moescope.model.reasoning import answer_text, reasoning_prefix, split_reasoning

QWEN = "<think>\nThe user greets me. I should greet back.\n</think>\n\nHello! How can I help?"
HARMONY = ("<|channel|>analysis<|message|>User asks 2+2. Answer 4."
           "<|start|>assistant<|channel|>final<|message|>**4**")


def test_plain_text_is_all_answer() -> None:
    s = split_reasoning("Just an answer with a < sign and </b>")
    assert (s.reasoning, s.answer, s.thinking, s.has_reasoning) == (
        "", "Just an answer with a < sign and </b>", False, False)


def test_think_tags_split_reasoning_from_answer() -> None:
    s = split_reasoning(QWEN)
    assert s.reasoning == "The user greets me. I should greet back."
    assert s.answer == "Hello! How can I help?"
    assert not s.thinking and s.has_reasoning
    assert answer_text(QWEN) == "Hello! How can I help?"


def test_unclosed_think_is_still_thinking() -> None:
    s = split_reasoning("<think>\nHmm, let me see", partial=True)
    assert s.thinking and s.answer == "" and s.reasoning == "Hmm, let me see"


def test_empty_think_block_is_no_reasoning() -> None:
    s = split_reasoning("<think>\n\n</think>\n\nHi")
    assert s.answer == "Hi" and not s.has_reasoning


def test_harmony_channels() -> None:
    s = split_reasoning(HARMONY)
    assert s.reasoning == "User asks 2+2. Answer 4."
    assert s.answer == "**4**" and not s.thinking
    only_final = split_reasoning("<|channel|>final<|message|>Hi there")
    assert only_final.answer == "Hi there" and not only_final.has_reasoning


def test_harmony_header_still_arriving_counts_as_thinking() -> None:
    s = split_reasoning("<|channel|>analysis<|message|>Think.<|start|>assistant<|chan",
                        partial=True)
    assert s.thinking and s.answer == "" and s.reasoning == "Think."


def test_a_cut_marker_is_held_back_only_while_streaming() -> None:
    assert split_reasoning("<think>a</thi", partial=True).reasoning == "a"
    assert split_reasoning("x <", partial=True).answer == "x "
    assert split_reasoning("x <").answer == "x <"


def test_prefix_of_a_thinking_template() -> None:
    assert reasoning_prefix("<|im_start|>assistant\n<think>\n") == "<think>\n"
    assert reasoning_prefix("<|im_start|>assistant\n<think>\n\n</think>\n\n") == ""
    assert reasoning_prefix("<|im_start|>assistant\n") == ""


@given(st.sampled_from([QWEN, HARMONY]), st.data())
def test_streaming_never_shows_what_the_whole_text_hides(full: str, data: st.DataObject) -> None:
    """Every prefix of a stream shows a prefix of the final answer (no marker flashes by,
    no answer text appears and then vanishes)."""
    final = split_reasoning(full)
    cut = data.draw(st.integers(0, len(full)))
    s = split_reasoning(full[:cut], partial=True)
    assert final.answer.startswith(s.answer)
    assert "<|" not in s.answer and "<think" not in s.answer
    assert "<|" not in s.reasoning and "</think" not in s.reasoning
    if s.answer:
        assert not s.thinking


def test_closing_the_thoughts_makes_the_rest_the_answer() -> None:
    from moescope.model.reasoning import close_reasoning

    for raw in ("<think>\nHmm, let me", "<think>\nHmm\n",
                "<|channel|>analysis<|message|>Hmm, let me"):
        closed = raw + close_reasoning(raw) + "The answer."
        s = split_reasoning(closed)
        assert s.answer == "The answer." and not s.thinking and s.reasoning.startswith("Hmm")
        assert "<" not in s.reasoning
    assert close_reasoning("Plain answer") == ""
    assert close_reasoning(QWEN) == ""


def test_where_the_answer_begins_in_a_traces_tokens() -> None:
    from moescope.model.reasoning import answer_begins

    assert answer_begins(["<think>", "\nHmm", ".\n", "</think>", "\n\n", "Hi", "!"]) == 5
    # a Thinking template opened <think> in the prompt: the trace never saw it
    assert answer_begins(["Hmm", ".\n", "</th", "ink>\n\n", "Hi"]) == 4
    assert answer_begins(["Just", " an answer"]) is None
    assert answer_begins(["<think>", "still thinking"]) is None
    assert answer_begins(["<|channel|>analysis<|message|>", "x", "<|start|>assistant",
                          "<|channel|>final<|message|>", "4"]) == 4
