"""A reopened trace marks where a thinking model's answer began, as the live panel does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from trace_helpers import psr_header

from moescope.cache.native import EVENT_DTYPE
from moescope.display.trace_io import reopen
from moescope.trace import TokenRecord, TraceWriter

ANSWERS = (["<think>", "\nHmm", "</think>", "\n\n", "Hi", "!"],  # thinks, then answers
           ["Plain", " answer"],                                 # no thoughts: no mark
           ["Thought", "</think>", "\n\n", "Yes"])               # <think> was in the prompt


def test_the_answer_line_is_rebuilt_from_the_token_texts(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    index = 0
    with TraceWriter(path, psr_header()) as writer:
        for answer, texts in enumerate(ANSWERS):
            for position, text in enumerate(texts):
                writer.write_token(TokenRecord(
                    index=index, phase="decode", token_id=1, text=text, seconds=0.01,
                    policy="psr", slots_per_layer=4, events=np.zeros(0, dtype=EVENT_DTYPE),
                    answer=answer, position=position))
                index += 1
    marked = [t.step - 1 for t in reopen(path).tokens if "answer" in t.changes]
    assert marked == [4, 11]  # "Hi" of the first answer, "Yes" of the third
