"""Every number read from an argument is bounded before use, and said in one line when it
is out of bounds (``moescope: error: ...``, exit 2): a reviewer's list of options that
ended in a traceback, wrapped silently, or printed 300-digit numbers."""

from __future__ import annotations

from pathlib import Path

import pytest

from moescope.cli import main


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "" and err.count("\n") == 1 and err.startswith("moescope: error: "), err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("value", ["nan", "inf", "1e309", "1e20", "-1", "0", "3601"])
def test_the_self_test_timeout_is_bounded(capsys: pytest.CaptureFixture[str],
                                          value: str) -> None:
    """``nan`` was a ValueError traceback, ``inf``/``1e20`` an OverflowError one, ``-1``
    a Qt warning and "timed out after -1 s"."""
    err = _one_line_error(capsys, ["--self-test", "--self-test-timeout", value])
    assert "--self-test-timeout" in err and "from 1 to 3600 seconds" in err


@pytest.mark.parametrize("command", ["generate", "chat"])
@pytest.mark.parametrize("seed", ["-2", "4294967295", "4294967296", "99999999999999999999"])
def test_a_seed_that_would_wrap_or_mean_random_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, seed: str) -> None:
    """``--seed 4294967296`` was seed 0 (llama.cpp keeps 32 bits), and ``4294967295``
    (LLAMA_DEFAULT_SEED) a random seed each run: -1 is the one way to ask for that."""
    err = _one_line_error(capsys, [command, str(tmp_path / "never-read.gguf"), "--seed", seed])
    assert f"--seed {seed} must be from 0 to 4294967294, or -1 for a random seed" in err


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_the_seed_help_says_its_range_and_the_largest_one_is_taken(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.cli import build_parser
    from moescope.cli.commands.generate import sampling_from_args

    assert main([command, "--help"]) == 0
    assert "0 to 4294967294" in " ".join(capsys.readouterr().out.split())
    args = build_parser().parse_args([command, "--seed", "4294967294"])
    assert sampling_from_args(args).seed == 4294967294
    # -1, as in llama.cpp and the window: a random seed each run (the engine's own)
    assert sampling_from_args(build_parser().parse_args([command, "--seed", "-1"])).seed is None


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--compute-ms", "1e300", "from 0 to 60000 ms"),
    ("--compute-ms", "60001", "from 0 to 60000 ms"),
    ("--bandwidth", "1e-300", "from 0.01 to 10000 GB/s"),
    ("--bandwidth", "1e5", "from 0.01 to 10000 GB/s"),
    ("--latency-us", "1e300", "from 0 to 1000000 µs"),
])
def test_replay_bounds_the_cost_model_to_physical_ranges(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str,
        says: str) -> None:
    """``--compute-ms 1e300`` printed 300-digit times; ``--bandwidth 1e-300`` a footer of
    "0.00 GB/s"."""
    err = _one_line_error(capsys, ["replay", str(tmp_path / "never-read.jsonl"), option,
                                   value])
    assert option in err and says in err


def test_the_replay_footer_says_the_overridden_figures(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from moescope_testing.traces import core_trace

    trace = core_trace(tmp_path / "t.jsonl", n_tokens=6)
    assert main(["replay", str(trace), "--policy", "exact", "--bandwidth", "3",
                 "--compute-ms", "2", "--latency-us", "0.5"]) == 0
    footer = next(line for line in capsys.readouterr().out.splitlines()
                  if "cost model" in line)
    assert "3.00 GB/s" in footer and "compute 2.000 ms/token" in footer
    assert "(--bandwidth 3 GB/s, --latency-us 0.5 µs, --compute-ms 2 ms given; otherwise " \
           "PCIe 4.0" in footer
    assert main(["replay", str(trace), "--policy", "exact"]) == 0
    assert "given" not in capsys.readouterr().out


@pytest.mark.parametrize("command", ["chat", "serve"])
@pytest.mark.parametrize("ctx", ["1", "2", "15", "4194305", "-1"])
def test_chat_and_serve_share_one_context_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, ctx: str) -> None:
    """``chat --ctx 1`` was accepted while ``serve --ctx`` had to be at least 16."""
    err = _one_line_error(capsys, [command, str(tmp_path / "never-read.gguf"), "--ctx", ctx])
    assert f"--ctx {ctx} must be from 16 to 4194304" in err


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--runs", "99999999999", "--runs 99999999999 must be from 1 to 1000"),
    ("--runs", "0", "--runs 0 must be from 1 to 1000"),
    ("--tokens", "99999999999", "--tokens 99999999999 must be from 2 to 1000000"),
])
def test_bench_counts_are_bounded(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                  option: str, value: str, says: str) -> None:
    err = _one_line_error(capsys, ["bench", str(tmp_path / "never-read.gguf"), option, value])
    assert says in err


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_the_token_count_is_bounded_above_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str) -> None:
    err = _one_line_error(capsys, [command, str(tmp_path / "never-read.gguf"), "-n",
                                   "99999999999"])
    assert "--tokens 99999999999 must be from 1 to 1000000" in err


@pytest.mark.parametrize(("argv", "says"), [
    (["x/y", "--budget", "nan"], "cannot read budget 'nan'"),
    (["x/y:f.gguf", "--dir", "/dev/null"], "--dir /dev/null: not a folder"),
    (["x/y:f.gguf", "--dir", "/dev/null/models"],
     "--dir /dev/null/models: not a folder (/dev/null is not a folder)"),
    (["x/y:f.gguf", "--check", "--dir", "{file}"], "not a folder"),
    # /proc: its permissions let root write, yet it takes no new folder (a user is told
    # it cannot write there); either way before the Hub is asked, naming the folder
    (["x/y:f.gguf", "--dir", "/proc/models"], "--dir /proc/models: "),
])
def test_pull_checks_its_arguments_before_asking_the_hub(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, argv: list[str], says: str) -> None:
    """``pull x/y --budget nan`` and ``--dir /dev/null`` were refused only after the Hub
    was asked ("cannot reach huggingface.co" offline)."""
    from moescope.hub import remote

    def no_network(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("the Hub was asked before the arguments were checked")

    monkeypatch.setattr(remote.HubClient, "__init__", no_network)
    (tmp_path / "file").write_text("")
    err = _one_line_error(capsys, ["pull", *(a.format(file=tmp_path / "file")
                                             for a in argv)])
    assert says in err


@pytest.mark.parametrize(("target", "says"), [
    ("-5%", "got -5%"), ("0.9", "got 90%"), ("60%", "got 60%"), ("nan", "got nan")])
def test_the_guard_target_is_said_as_a_percentage(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str, says: str) -> None:
    """``guard:target=-5%`` said "got -0.05"."""
    err = _one_line_error(capsys, ["generate", str(tmp_path / "never-read.gguf"),
                                   "--policy", f"guard:target={target}"])
    assert err.rstrip().endswith(f"guard target must be between 0.01% and 50%, {says}")


@pytest.mark.parametrize(("name", "says"), [
    ("a\nb", "--model-id holds the control character '\\n'"),
    ("m\x1b[2J", "--model-id holds the control character '\\x1b'"),
    ("x" * 257, "--model-id is 257 characters; at most 256"),
])
def test_serve_model_id_is_a_short_printable_name(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, says: str) -> None:
    """A newline or an escape sequence in ``--model-id`` broke the one-line banner and
    request log (and reached every client's ``/v1/models``); its length was unbounded.
    Refused before the model is looked for."""
    err = _one_line_error(capsys, ["serve", str(tmp_path / "never-read.gguf"),
                                   "--port", "1", "--model-id", name])
    assert says in err


@pytest.mark.parametrize(("key", "says"), [
    ("", "--api-key is empty"),
    ("a\nb", "--api-key may hold only visible ASCII characters"),
    ("sk live", "--api-key may hold only visible ASCII characters"),
    ("clé", "--api-key may hold only visible ASCII characters"),
    ("k" * 1025, "--api-key is 1,025 characters; at most 1024"),
])
def test_serve_api_key_is_one_a_client_can_send(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, says: str) -> None:
    """``--api-key ""`` (an unset ``$KEY``) served without a key, silently; a key with a
    newline or a non-ASCII character started a server no request could authenticate to."""
    err = _one_line_error(capsys, ["serve", str(tmp_path / "never-read.gguf"),
                                   "--port", "1", "--api-key", key])
    assert says in err


def test_serve_api_key_from_the_environment_is_checked_too(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOESCOPE_API_KEY", "\udcff")
    err = _one_line_error(capsys, ["serve", str(tmp_path / "never-read.gguf"), "--port", "1"])
    assert "MOESCOPE_API_KEY may hold only visible ASCII characters" in err
