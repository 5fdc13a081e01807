"""Option values that cannot work are refused in one line before any work is done (no
model loads, no trace is read): a count of tokens below one, a temperature that is not a
number, an output file in a folder that does not exist, a cost model that is not
physical. Each used to end in a traceback after the work, or in a silent wrong result."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from moescope.cli import main


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "" and err.count("\n") == 1 and err.startswith("moescope: error: ")
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize(("option", "value", "says"), [
    ("--n", "0", "--tokens must be at least 1"),
    ("--n", "-3", "--tokens must be at least 1"),
    ("--temperature", "nan", "--temperature nan must be from 0 to 100 (0 is greedy)"),
    ("--temperature", "-1", "--temperature -1 must be from 0 to 100 (0 is greedy)"),
    ("--temperature", "1e300", "--temperature 1e+300 must be from 0 to 100"),
])
def test_sampling_values_that_cannot_work(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          command: str, option: str, value: str,
                                          says: str) -> None:
    """``generate --n 0`` printed its prompt and generated one token anyway."""
    err = _one_line_error(capsys, [command, str(tmp_path / "never-read.gguf"),
                                   option, value])
    assert says in err


@pytest.mark.parametrize("argv", [
    ["generate", "--trace", "{missing}/t.jsonl"],
    ["generate", "--trace", "{tmp}"],
    ["chat", "--trace", "{missing}/t.jsonl"],
    ["bench", "--json", "{missing}/b.json"],
    ["replay", "{tmp}/t.jsonl", "--csv", "{missing}/r.csv"],
    ["replay", "{tmp}/t.jsonl", "--json", "{missing}/r.json"],
    ["replay", "{tmp}/t.jsonl", "--perfetto", "{missing}/r.json"],
    ["replay", "{tmp}/t.jsonl", "--tokens-csv", "{tmp}"],
])
def test_an_output_file_that_cannot_be_created_is_refused_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    """It was a traceback once the model had loaded (or after a whole benchmark)."""
    args = [a.format(missing=tmp_path / "no-such-folder", tmp=tmp_path) for a in argv]
    if argv[0] != "replay":
        args.insert(1, str(tmp_path / "never-read.gguf"))
    err = _one_line_error(capsys, args)
    assert "does not exist" in err or "is a folder" in err


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_a_parquet_trace_whose_journal_a_crash_left_is_refused_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    """Rerunning a killed ``--trace x.parquet`` command: its journal is there, and the
    writer never overwrites it. That was said only once the model had loaded (minutes for a
    big one); now before (the model path here does not exist, so nothing loads)."""
    journal = tmp_path / "x.parquet.journal.arrows"
    journal.write_bytes(b"a killed session's tokens")
    err = _one_line_error(capsys, [command, str(tmp_path / "never-read.gguf"), "--trace",
                                   str(tmp_path / "x.parquet")])
    assert "a trace journal is already there" in err and "trace compact" in err
    assert journal.read_bytes() == b"a killed session's tokens"


@pytest.mark.parametrize(("option", "value"), [
    ("--bandwidth", "0"), ("--bandwidth", "-5"), ("--bandwidth", "nan"),
    ("--latency-us", "-1"), ("--compute-ms", "inf"),
])
def test_replay_refuses_a_cost_model_that_is_not_physical(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    """A bandwidth of 0 GB/s printed a table of meaningless times."""
    err = _one_line_error(capsys, ["replay", str(tmp_path / "t.jsonl"), option, value])
    assert option in err


# ------------------------------------------------------------------ outputs vs inputs
def _same_file_cases(tmp: Path) -> list[list[str]]:
    model = tmp / "m.gguf"
    split1, split2 = tmp / "s-00001-of-00002.gguf", tmp / "s-00002-of-00002.gguf"
    link = tmp / "link.gguf"
    text, trace = tmp / "text.txt", tmp / "t.jsonl"
    return [
        ["generate", str(model), "--trace", str(model)],
        ["generate", str(model), "--trace", str(link)],  # a symlink to the model
        ["generate", str(model), "--trace", str(tmp / "hard.gguf")],  # a hard link
        ["generate", str(split1), "--trace", str(split2)],  # another part of the model
        ["chat", str(model), "--trace", str(model)],
        ["bench", str(model), "--json", str(model)],
        ["eval", str(model), "--text", str(text), "--csv", str(text)],
        ["eval", str(model), "--text", str(text), "--markdown", str(model)],
        ["replay", str(trace), "--json", str(trace)],
        ["replay", str(trace), "--csv", str(trace)],
        ["replay", str(trace), "--perfetto", str(trace)],
        ["replay", str(trace), "--tokens-csv", str(trace)],
    ]


@pytest.mark.parametrize("case", range(12))
def test_an_output_that_is_an_input_is_refused_before_anything_is_written(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], case: int) -> None:
    """``generate x.gguf --trace x.gguf`` truncated the model it was reading (the process
    died with SIGBUS and the model was gone)."""
    files = {name: f"{name} precious".encode() for name in
             ("m.gguf", "s-00001-of-00002.gguf", "s-00002-of-00002.gguf", "text.txt",
              "t.jsonl")}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    (tmp_path / "link.gguf").symlink_to(tmp_path / "m.gguf")
    os.link(tmp_path / "m.gguf", tmp_path / "hard.gguf")
    err = _one_line_error(capsys, _same_file_cases(tmp_path)[case])
    assert "is an input of this command" in err and "refusing to overwrite it" in err
    for name, data in files.items():
        assert (tmp_path / name).read_bytes() == data
    assert (tmp_path / "link.gguf").is_symlink()


@pytest.mark.parametrize("argv", [
    ["replay", "{tmp}/t.jsonl", "--csv", "{tmp}/r.out", "--json", "{tmp}/r.out"],
    ["replay", "{tmp}/t.jsonl", "--csv", "-", "--json", "-"],
    ["eval", "{tmp}/m.gguf", "--text", "{tmp}/t.jsonl", "--csv", "{tmp}/r", "--markdown",
     "{tmp}/r"],
    ["generate", "{tmp}/m.gguf", "--trace", "-"],
    ["chat", "{tmp}/m.gguf", "--trace", "-"],
])
def test_one_file_for_two_outputs_or_trace_to_stdout_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]) -> None:
    (tmp_path / "t.jsonl").write_text("not read\n")
    err = _one_line_error(capsys, [a.format(tmp=tmp_path) for a in argv])
    assert "same file" in err or "stdout" in err


# ------------------------------------------------------------------ numbers in arguments
@pytest.mark.parametrize("command", ["chat", "eval", "bench", "serve"])
@pytest.mark.parametrize("threads", ["99999999999", "1000", "513", "0", "-4"])
def test_a_thread_count_llama_cpp_cannot_run_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
        threads: str) -> None:
    """``--threads 99999999999`` aborted with std::bad_alloc and ``--threads 1000`` ended
    in a bare libgomp line; 512 is ggml's own maximum (GGML_MAX_N_THREADS)."""
    argv = [command, str(tmp_path / "never-read.gguf"), "--threads", threads]
    if command == "eval":
        argv += ["--text", str(tmp_path / "never-read.txt")]
    err = _one_line_error(capsys, argv)
    assert "--threads must be between 1 and 512" in err


@pytest.mark.parametrize("command", ["generate", "chat", "bench", "eval", "info"])
@pytest.mark.parametrize("budget", ["", "4.7", "16.0"])
def test_an_empty_or_unitless_decimal_budget_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str,
        budget: str) -> None:
    """``--budget ""`` was taken as no budget, and ``4.7`` as 4.7 bytes."""
    option = "--budgets" if command == "eval" else "--budget"
    argv = [command, str(tmp_path / "never-read.gguf"), option, budget]
    if command == "eval":
        argv += ["--text", str(tmp_path / "never-read.txt")]
    err = _one_line_error(capsys, argv)
    if budget:
        assert "has no unit" in err
    else:  # eval's --budgets is a list: an empty one names no budget
        assert "empty" in err or "names no budget" in err


def test_more_slots_than_the_model_has_experts_names_the_maximum(
        tiny_moe: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.model.gguf_info import read_model_info

    n = read_model_info(tiny_moe).n_expert
    err = _one_line_error(capsys, ["info", str(tiny_moe), "--budget", str(n + 1)])
    assert f"at most {n} slots" in err
    assert main(["info", str(tiny_moe), "--budget", str(n)]) == 0
    assert f"{n} slots per layer of {n}" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "says"), [
    (["replay", "{tmp}/t.jsonl", "--policy", ""], "--policy names no policy"),
    (["replay", "{tmp}/t.jsonl", "--policy", " , "], "--policy names no policy"),
    (["replay", "{tmp}/t.jsonl", "--budget", ""], "--budget names no budget"),
    (["replay", "{tmp}/t.jsonl", "--budget", "4.7"], "has no unit"),
    (["eval", "{tmp}/m.gguf", "--text", "{tmp}/x", "--policies", ""], "names no policy"),
])
def test_an_empty_list_of_policies_or_budgets_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        says: str) -> None:
    """``replay --policy ''`` printed an empty table."""
    err = _one_line_error(capsys, [a.format(tmp=tmp_path) for a in argv])
    assert says in err


@pytest.mark.parametrize("command", ["generate", "chat", "bench", "eval", "serve", "replay"])
@pytest.mark.parametrize(("value", "says"), [
    ("4.7", "has no unit"), ("0", "at least 1"), ("", "empty"),
])
def test_a_ram_budget_that_cannot_work_names_its_option_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, value: str,
        says: str) -> None:
    """``--ram-budget 4.7`` said "budget '4.7' has no unit", as ``--budget 4.7`` does, and
    only from the engine's load: with both options given, nothing said which was wrong
    (here the model and trace do not exist, so the option is read first)."""
    argv = [command, str(tmp_path / ("never-read.parquet" if command == "replay"
                                     else "never-read.gguf")), "--ram-budget", value]
    if command == "eval":
        argv += ["--text", str(tmp_path / "never-read.txt")]
    err = _one_line_error(capsys, argv)
    assert err.startswith("moescope: error: --ram-budget: ") and says in err, err


def test_replay_of_a_parquet_trace_a_crash_left_as_its_journal_says_how_to_use_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``replay x.parquet`` after the recording command was killed said only "no such
    trace file": the tokens are in ``x.parquet.journal.arrows`` beside it."""
    journal = tmp_path / "x.parquet.journal.arrows"
    journal.write_bytes(b"a killed session's tokens")
    err = _one_line_error(capsys, ["replay", str(tmp_path / "x.parquet")])
    assert "no such trace file" in err and journal.name in err
    assert f"moescope trace compact {journal}" in err
    assert journal.read_bytes() == b"a killed session's tokens"
    err = _one_line_error(capsys, ["replay", str(tmp_path / "y.parquet")])  # no journal
    assert "no such trace file" in err and "journal" not in err


@pytest.mark.parametrize(("spec", "parameter", "allowed"), [
    ("quality-first:half_life=1e-300", "half_life", "between 0.1 and 1e+09 steps"),
    ("quality-first:half_life=inf", "half_life", "between 0.1 and 1e+09 steps"),
    ("quality-first:beta=1e-300", "beta", "between 0.001 and 1000"),
    ("threshold:theta=nan", "theta", "between 0 and 1"),
    ("cache-prior:bonus=1e300", "bonus", "between 0 and 10"),
    ("psr:prefetch=99999999999", "prefetch", "between -1"),
])
@pytest.mark.parametrize("command", ["replay", "generate"])
def test_a_policy_parameter_out_of_range_names_the_parameter_and_its_range(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, spec: str,
        parameter: str, allowed: str) -> None:
    """``quality-first:half_life=1e-300`` (0 in the core's float32) was reported as a
    budget problem after the model had loaded."""
    err = _one_line_error(capsys, [command, str(tmp_path / "never-read"), "--policy", spec])
    assert f"{parameter} must be {allowed}" in err and "budget" not in err


# ------------------------------------------------------------------ real outputs
def test_replay_writes_to_stdout_through_symlinks_and_into_devices(
        record: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``replay T --json /dev/full`` replaced the device node (as root) and ``--csv
    /dev/stdout`` would have replaced the machine's /dev/stdout symlink."""
    trace = str(record("qwen3moe", tokens=20, answers=2, switch_at=7))
    assert main(["replay", trace, "--policy", "exact", "--json", "/dev/full"]) == 2
    table, err = capsys.readouterr()
    assert "exact" in table and err.count("\n") == 1  # what was printed stays printed
    assert err == "moescope: error: --json /dev/full: cannot write (No space left on device)\n"
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)

    assert main(["replay", trace, "--policy", "exact", "--csv", "-"]) == 0
    out, table = capsys.readouterr()
    assert out.startswith("policy,") and "exact" in table  # the table moved to stderr

    real = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert main(["replay", trace, "--policy", "exact", "--json", str(link)]) == 0
    assert link.is_symlink() and json.loads(real.read_text())


def test_the_window_without_a_display_says_so_in_one_line(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """Over SSH without X, ``moescope`` let Qt abort the process with "xcb-cursor0 or
    libxcb-cursor0 is needed", which sent the user to install packages they had."""
    from moescope.cli import no_display

    for name in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM"):
        monkeypatch.delenv(name, raising=False)
    err = _one_line_error(capsys, [])
    assert "no display" in err and "moescope chat" in err
    monkeypatch.setenv("QT_QPA_PLATFORM", "offscreen")  # the user's explicit choice
    assert no_display() is None
    monkeypatch.delenv("QT_QPA_PLATFORM")
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    assert no_display() is None


@pytest.mark.parametrize(("argv", "dest", "says"), [
    (["generate", "-n", "40"], "tokens", "--tokens must be at least 1"),
    (["generate", "-n40"], "tokens", "--tokens must be at least 1"),
    (["chat", "-n", "40"], "tokens", "--tokens must be at least 1"),
    (["bench", "-n", "40"], "tokens", "--tokens must be at least 2"),
])
def test_llama_cpp_short_n_is_the_token_count(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str],
                                              argv: list[str], dest: str, says: str) -> None:
    """``generate MODEL -n 40`` (llama.cpp's habit) was 'unrecognized arguments'."""
    from moescope.cli import build_parser

    model = str(tmp_path / "never-read.gguf")
    args = build_parser().parse_args([argv[0], model, *argv[1:]])
    assert getattr(args, dest) == 40
    bad = "1" if argv[0] == "bench" else "0"
    err = _one_line_error(capsys, [argv[0], model, "-n", bad])
    assert says in err
    with pytest.raises(SystemExit):
        build_parser().parse_args([argv[0], "--help"])
    assert "-n N" in capsys.readouterr().out


def test_a_file_that_is_no_model_is_named_as_such_not_as_a_subcommand(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``moescope notes.txt`` (a path that exists, without ``.gguf``) said "argument
    COMMAND: invalid choice: 'notes.txt' (choose from 'info', 'pull', ...)"; a folder the
    same. Each is named for what it is, in one line, and no window opens."""
    notes = tmp_path / "notes.txt"
    notes.write_text("hello, this is not a model\n")
    err = _one_line_error(capsys, [str(notes)])
    assert err == f"moescope: error: {notes}: not a GGUF model file\n"
    err = _one_line_error(capsys, [str(tmp_path)])
    assert err == f"moescope: error: {tmp_path}: is a directory, not a GGUF model file\n"
    # a subcommand's name stays the subcommand, even with a file of that name here
    monkeypatch.chdir(tmp_path)
    (tmp_path / "info").write_text("x")
    assert main(["info"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moescope info: error: the following arguments are required")


@pytest.mark.parametrize("option", ["--csv", "--json", "--perfetto", "--tokens-csv"])
def test_an_output_in_a_folder_that_takes_no_files_names_the_option_path_and_folder(
        record: Any, capsys: pytest.CaptureFixture[str], option: str) -> None:
    """``--csv /proc/x`` said only ``cannot write (No such file or directory)`` (of a
    folder that exists), and ``--perfetto /proc/x`` named a temporary ``/proc/.x.*.part``
    the user never gave; ``--perfetto /dev/full`` said ``output: cannot write``. Each now
    names the option, the path and what is wrong (as root, /proc's permissions let the
    check pass and the creation fail; as a user, its permissions refuse it)."""
    trace = str(record("qwen3moe", tokens=20, answers=2, switch_at=7))
    assert main(["replay", trace, "--policy", "exact", option, "/proc/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"moescope: error: {option} /proc/x: ") and err.count("\n") == 1
    assert "folder /proc" in err and ".part" not in err, err
    assert main(["replay", trace, "--policy", "exact", option, "/dev/full"]) == 2
    err = capsys.readouterr().err
    assert err == (f"moescope: error: {option} /dev/full: cannot write (No space left on "
                   "device)\n")
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)


def test_trace_compact_into_a_folder_that_takes_no_files_names_the_output(
        record: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``trace compact T /proc/x`` named the temporary ``/proc/.x.*.part``."""
    trace = str(record("qwen3moe", name="t.arrows", tokens=8))
    assert main(["trace", "compact", trace, "/proc/x"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moescope: error: /proc/x: ") and err.count("\n") == 1
    assert "folder /proc" in err and ".part" not in err, err


SIXTY_FIVE = ",".join(f"threshold:theta=0.{i:03d}" for i in range(65))


@pytest.mark.parametrize(("argv", "says"), [
    (["replay", "{tmp}/never-read.arrows", "--policy", "exact,psr,exact"],
     "--policy names exact more than once"),
    (["replay", "{tmp}/never-read.arrows", "--budget", "25%,recorded,25%"],
     "--budget names 25% more than once"),
    (["replay", "{tmp}/never-read.arrows", "--policy", SIXTY_FIVE],
     "--policy names 65 policies; at most 64"),
    (["replay", "{tmp}/never-read.arrows", "--budget",
      ",".join(f"{i}" for i in range(1, 66))], "--budget names 65 budgets; at most 64"),
    (["eval", "{tmp}/m.gguf", "--text", "{tmp}/x", "--policies", "exact,exact"],
     "--policies names exact more than once"),
    (["eval", "{tmp}/m.gguf", "--text", "{tmp}/x", "--budgets", "25%,25%"],
     "--budgets names 25% more than once"),
    (["bench", "{tmp}/m.gguf", "--policies", SIXTY_FIVE],
     "--policies names 65 policies; at most 64"),
])
def test_lists_of_policies_and_budgets_are_bounded_and_without_repeats(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        says: str) -> None:
    """``replay -p exact,exact,...`` (3000) ``-b 25%,25%,...`` (3000) ran nine million
    replays, past 5 GB and minutes, before printing a row; a name given twice was a row
    (or an eval run) repeated for nothing."""
    err = _one_line_error(capsys, [a.format(tmp=tmp_path) for a in argv])
    assert says in err, err


def test_every_option_of_every_command_says_what_it_does() -> None:
    """``generate --help`` listed ``--temperature`` with no words at all."""
    import argparse

    from moescope.cli import build_parser

    def silent(parser: argparse.ArgumentParser, path: str) -> list[str]:
        out = []
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, command in action.choices.items():
                    out += silent(command, f"{path} {name}".strip())
            if not isinstance(action, argparse._HelpAction) and not action.help:
                out.append(f"{path} {'/'.join(action.option_strings) or action.dest}")
        return out

    assert silent(build_parser(), "") == []


@pytest.mark.parametrize(("argv", "option", "instead"), [
    (["replay", "{tmp}/never-read.parquet", "--policy", "exact,guard:target=1%"], "--policy",
     "'recorded' replays a guarded session"),
    (["eval", "{tmp}/never-read.gguf", "--text", "{tmp}/never-read.txt", "--policies",
      "guard"], "--policies", "eval scores fixed policies"),
])
def test_replay_and_eval_refuse_the_quality_guard_by_its_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], option: str,
        instead: str) -> None:
    """``generate``, ``chat``, ``serve`` and ``bench`` take ``guard:target=1%``; ``replay``
    and ``eval`` said "unknown policy 'guard'", as if it did not exist."""
    err = _one_line_error(capsys, [a.format(tmp=tmp_path) for a in argv])
    assert f"error: {option} guard" in err and "the quality guard steers from audits" in err
    assert instead in err and "unknown policy" not in err


def test_eval_does_not_offer_recorded_for_an_unknown_policy(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """eval scores presets and refuses ``recorded``: its unknown-policy message named it
    among the choices all the same (replay's still does: there it is one)."""
    err = _one_line_error(capsys, ["eval", str(tmp_path / "never-read.gguf"), "--text",
                                   str(tmp_path / "never-read.txt"), "--policies", "fastest"])
    assert "unknown policy 'fastest'" in err and "quality-first" in err
    assert "recorded" not in err


@pytest.mark.parametrize("argv", [
    ["generate", "{tmp}/never-read.gguf"],
    ["chat", "{tmp}/never-read.gguf"],
    ["serve", "{tmp}/never-read.gguf"],
    ["eval", "{tmp}/never-read.gguf", "--text", "{tmp}/never-read.txt"],
])
@pytest.mark.parametrize("value", ["-1", "5000"])
def test_an_audit_period_out_of_range_names_the_option(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        value: str) -> None:
    """It said "audit period -1", naming no option, like the guard's own ``every=``."""
    err = _one_line_error(capsys, [a.format(tmp=tmp_path) for a in argv]
                          + ["--audit", value])
    assert f"--audit {value}: give 0 (off) or a number of tokens from 1 to" in err
