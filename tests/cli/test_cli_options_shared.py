"""One spelling per option across the subcommands (new-user review): the token count is
``--tokens`` everywhere (``-n`` and the old ``--n`` still taken), ``generate`` has
``chat``'s ``--ctx`` and ``--threads``, a budget that starts with "-" gets the budget's
error, and ``replay`` of a file that is no trace names the suffixes a trace has."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import build_parser, main

SynthModel = Callable[..., Path]


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "" and err.count("\n") == 1, err
    return err


@pytest.mark.parametrize("command", ["generate", "chat", "bench", "eval"])
@pytest.mark.parametrize("spelling", ["--tokens", "-n", "--n"])
def test_every_command_takes_tokens_and_its_old_spellings(
        tmp_path: Path, command: str, spelling: str) -> None:
    extra = ["--text", str(tmp_path / "t.txt")] if command == "eval" else []
    args = build_parser().parse_args([command, str(tmp_path / "m.gguf"), *extra,
                                      spelling, "40"])
    assert args.tokens == 40
    assert not hasattr(args, "n")


@pytest.mark.parametrize("command", ["generate", "chat", "bench", "eval"])
def test_the_help_names_tokens_and_says_n_is_the_old_spelling(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "-n N, --tokens N, --n N" in out
    assert "--n, generate's and chat's old spelling" in out


@pytest.mark.parametrize(("command", "bad", "says"), [
    ("generate", "0", "--tokens must be at least 1, got 0"),
    ("chat", "2000000", "--tokens 2000000 must be from 1 to 1000000"),
    ("bench", "1", "--tokens must be at least 2"),
    ("eval", "0", "--tokens must be 1..1000000, not 0"),
])
def test_the_token_count_is_named_tokens_in_its_errors(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, bad: str,
        says: str) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hello world\n")
    extra = ["--text", str(text)] if command == "eval" else []
    err = _one_line_error(capsys, [command, str(tmp_path / "never-read.gguf"), *extra,
                                   "--n", bad])
    assert says in err


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--ctx", "8", "--ctx 8 must be from 16 to"),
    ("--ctx", "99999999999", "--ctx 99999999999 must be from 16 to"),
    ("--threads", "0", "--threads must be between 1 and 512"),
    ("--threads", "100000", "--threads must be between 1 and 512"),
])
def test_generate_bounds_ctx_and_threads_before_the_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str,
        says: str) -> None:
    err = _one_line_error(capsys, ["generate", str(tmp_path / "never-read.gguf"), option,
                                   value])
    assert says in err


def test_generate_and_chat_share_the_ctx_and_threads_options(
        capsys: pytest.CaptureFixture[str]) -> None:
    helps = []
    for command in ("generate", "chat"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        out = " ".join(capsys.readouterr().out.split())
        start = out.index("--ctx N context length")
        helps.append((out[start:out.index(")", start) + 1],
                      out[out.index("--threads N CPU threads"):][:60]))
    assert helps[0] == helps[1]


@pytest.mark.usefixtures("engine_required")
def test_generate_runs_in_the_context_it_is_given(
        synth_model: SynthModel, capsys: pytest.CaptureFixture[str]) -> None:
    """``--ctx 16`` on a 512-token model: the answer stops when the context is full,
    long before its 40 tokens; ``--ctx`` above the model's is clamped with a note."""
    model = str(synth_model("qwen3moe"))
    assert main(["generate", model, "--ctx", "16", "--threads", "1", "--tokens", "40",
                 "--prompt", "Hi"]) == 0
    out, _ = capsys.readouterr()
    assert out.strip().splitlines()[-1].endswith("stop: context full")
    assert main(["generate", model, "--ctx", "100000", "--threads", "1", "-n", "2"]) == 0
    _, err = capsys.readouterr()
    assert "--ctx 100000 is above the model's 512; using 512" in err


@pytest.mark.parametrize("argv", [
    ["generate", "{model}", "--budget", "-5GiB"],
    ["chat", "{model}", "--budget", "-5GiB"],
    ["serve", "{model}", "--budget", "-5GiB"],
    ["bench", "{model}", "--budget", "-5GiB"],
    ["info", "{model}", "--budget", "-5GiB"],
    ["eval", "{model}", "--text", "{model}", "--budgets", "-5GiB"],
    ["replay", "{model}", "--budget", "-5GiB"],
    ["pull", "x/y", "--budget", "-5GiB"],
    ["generate", "{model}", "--budget", "-25%"],
    ["generate", "{model}", "--budget", "-.5GiB"],
])
def test_a_budget_that_starts_with_a_minus_gets_the_budgets_error(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """argparse took "-5GiB" for an option: "argument --budget: expected one argument"."""
    model = str(tmp_path / "never-read.gguf")
    err = _one_line_error(capsys, [a.replace("{model}", model) for a in argv])
    assert f"cannot read budget '{argv[-1]}'" in err
    assert "expected one argument" not in err


def test_a_ram_budget_that_starts_with_a_minus_names_its_option(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = _one_line_error(capsys, ["generate", str(tmp_path / "m.gguf"), "--ram-budget",
                                   "-5GiB"])
    assert "--ram-budget: cannot read budget '-5GiB'" in err


def test_an_option_after_an_option_is_still_missing_its_value(
        capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["generate", "--budget", "--policy", "exact"])
    err = capsys.readouterr().err
    assert code == 2 and "argument --budget: expected one argument" in err


@pytest.mark.parametrize(("name", "ends"), [("README.md", "this one ends with .md"),
                                            ("notes", "this one has no suffix")])
def test_replay_of_a_file_that_is_no_trace_names_a_traces_suffixes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, ends: str) -> None:
    """``replay README.md`` said "its first line is not a JSON record"."""
    path = tmp_path / name
    path.write_text("# MoEScope\n\nChat locally.\n")
    err = _one_line_error(capsys, ["replay", str(path)])
    assert (f"{name}: not a MoEScope trace: a trace's name ends with .arrows, .parquet, "
            f".jsonl or .jsonl.gz; {ends}") in err
    assert "JSON record" not in err


def test_replay_of_a_damaged_jsonl_or_a_model_keeps_the_readers_reason(
        tmp_path: Path, tiny_moe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"a": 1}\n')
    assert "first record must be the header" in _one_line_error(capsys, ["replay", str(bad)])
    model = tmp_path / "model.bin"
    shutil.copyfile(tiny_moe, model)
    assert "a GGUF model file, not a MoEScope trace" in _one_line_error(
        capsys, ["replay", str(model)])


@pytest.mark.usefixtures("engine_required")
def test_a_trace_renamed_without_its_suffix_still_replays(
        synth_model: SynthModel, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trace = tmp_path / "t.jsonl"
    assert main(["generate", str(synth_model("qwen3moe")), "-n", "6", "--threads", "1",
                 "--trace", str(trace)]) == 0
    renamed = tmp_path / "session-copy"
    trace.rename(renamed)
    capsys.readouterr()
    assert main(["replay", str(renamed), "--policy", "exact"]) == 0
    assert "exact" in capsys.readouterr().out


def test_replay_of_a_folder_or_a_missing_file_without_a_suffix_says_so(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert "is a folder" in _one_line_error(capsys, ["replay", str(tmp_path)])
    assert "suffix" not in _one_line_error(capsys, ["replay", str(tmp_path / "gone")])


@pytest.mark.parametrize("argv", [["info", "{model}"], ["pull", "x/y"]])
def test_info_and_pull_take_the_shared_ctx_and_its_bounds(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """The context their RAM figure prices is ``--ctx``, bounded as chat's."""
    model = str(tmp_path / "never-read.gguf")
    err = _one_line_error(capsys, [a.replace("{model}", model) for a in argv]
                          + ["--ctx", "8"])
    assert "--ctx 8 must be from 16 to 4194304" in err
    args = build_parser().parse_args([a.replace("{model}", model) for a in argv])
    assert args.ctx is None  # left out: 4096, at most the model's (options.check_ctx)
