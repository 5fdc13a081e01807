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


@pytest.mark.engine
def test_a_one_token_answer_says_no_token_was_decoded(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    """``-n 1``: the one token comes out of the prefill, so there is no decode time to rate;
    the line said "0.0 tok/s", which read as a measurement."""
    assert main(["generate", str(synth_model("qwen3moe")), "-n", "1"]) == 0
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert summary.endswith("] – tok/s (no decode token) | 1 token, stop: length"), summary
    assert "0.0 tok/s" not in summary


def test_the_answer_and_session_lines_say_no_token_was_decoded() -> None:
    from moescope.cli.commands.chat import SessionStats
    from moescope.engine.stats import AnswerStats

    one = AnswerStats(n_tokens=1, time_to_first_token_s=0.01, seconds=0.01)
    assert one.summary().startswith("– tok/s (no decode token) · 1 token · TTFT 10 ms")
    session = SessionStats()
    session.add(one)
    assert session.line("psr").startswith("[psr] – tok/s (no decode token) | 1 answer, 1 token")
    two = AnswerStats(n_tokens=3, time_to_first_token_s=0.01, seconds=0.03)
    assert two.summary().startswith("100.0 tok/s · 3 tokens")
    session.add(two)
    assert session.line("psr").startswith("[psr] 100.0 tok/s | 2 answers, 4 tokens")


@pytest.mark.parametrize(("windows", "says"), [(1, "1 window of 16 tokens"),
                                               (2, "2 windows of 16 tokens")])
def test_the_mass_hypothesis_counts_one_window(windows: int, says: str) -> None:
    from moescope.engine.evaluate import MassHypothesis

    nan = float("nan")
    h = MassHypothesis(runs=("a", "b", "c"), n_windows=windows, window=16, r_runs=nan,
                       ci_runs=(nan, nan), r_windows=nan, ci_windows=(nan, nan), n_boot=0)
    assert says in h.describe()


def test_plural_says_one_of_a_thing() -> None:
    from moescope.util.words import plural

    assert plural(1, "earliest message") == "1 earliest message"
    assert plural(0, "earliest message") == "0 earliest messages"
    assert plural(2, "GGUF model") == "2 GGUF models"
    assert plural(1, "entry", "entries") == "1 entry"
    assert plural(3, "entry", "entries") == "3 entries"


@pytest.mark.parametrize(("dropped", "says"), [
    (1, " · 1 earliest message left out to fit the context"),
    (2, " · 2 earliest messages left out to fit the context")])
def test_the_summary_counts_one_earliest_message(dropped: int, says: str) -> None:
    """The review saw "1 earliest messages left out to fit the context"."""
    from moescope.engine.stats import AnswerStats

    a = AnswerStats(n_tokens=3, time_to_first_token_s=0.01, seconds=0.03,
                    stop_reason="length", dropped_messages=dropped)
    assert a.summary().endswith("length" + says)


@pytest.mark.parametrize(("dropped", "says"), [
    (1, "(1 earliest message was left out of the prompt"),
    (4, "(4 earliest messages were left out of the prompt")])
def test_the_chat_note_counts_one_earliest_message(dropped: int, says: str) -> None:
    from moescope.cli.commands.chat import dropped_note

    assert dropped_note(dropped).startswith(says)
    assert dropped_note(dropped).endswith("; /reset starts a new conversation)")


def test_bench_notes_count_one_run_and_one_token() -> None:
    from moescope.cli.commands.bench import PolicyResult, Run, _notes

    row = PolicyResult("psr", [Run(tok_s=1.0, tokens=1, stop_reason="eos",
                                   cache=CacheTotals())])
    notes = _notes([row], tokens=8)
    assert notes[0].startswith("psr: 1 of 1 run ended early (eos after 1 token); its ")


def test_info_counts_one_layer_and_one_expert_in_ram(
        synth_model: Callable[..., Path], capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.cli.commands.info import _memory_line

    assert main(["info", str(synth_model("qwen3moe", n_layers=1))]) == 0
    out = capsys.readouterr().out
    assert "(1 layer x " in out and "1 layers" not in out
    line = _memory_line({"n_ctx": 512, "needs_bytes": 2 << 30, "available_bytes": 1 << 30,
                         "cgroup": None, "cgroup_limit_bytes": None,
                         "ram_experts_per_layer": 1})
    assert line.endswith(": by default 1 expert per layer stays in RAM, the others are read "
                         "from the file (--ram-budget auto)")
