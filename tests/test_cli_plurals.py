"""One token is "1 token": the /compare table's "same start" ("1 tokens"), the summary
line of a one-token answer, chat's /stats and the compare note."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cache.totals import CacheTotals
from moescope.cli import main
from moescope.engine.compare import PolicyAnswer, same_start_text


@pytest.mark.parametrize(("same", "says"), [(0, "0 tokens"), (1, "1 token"),
                                            (2, "2 tokens"), (3, "identical")])
def test_same_start_says_token_for_one(same: int, says: str) -> None:
    answer = PolicyAnswer(policy="psr", text="abc", token_ids=(1, 2, 3),
                          tokens_per_second=1.0, cache=CacheTotals(), stop_reason="length",
                          same_prefix=same)
    assert same_start_text(answer) == says


@pytest.mark.engine
def test_a_one_token_answer_is_1_token(synth_model: Callable[..., Path],
                                       capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["generate", str(synth_model("qwen3moe")), "-n", "1"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.endswith("| 1 token, stop: length"), summary
