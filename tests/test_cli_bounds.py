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
@pytest.mark.parametrize("seed", ["-1", "4294967295", "4294967296", "99999999999999999999"])
def test_a_seed_that_would_wrap_or_mean_random_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, seed: str) -> None:
    """``--seed 4294967296`` was seed 0 (llama.cpp keeps 32 bits), and ``-1`` and
    ``4294967295`` (LLAMA_DEFAULT_SEED) a random seed each run."""
    err = _one_line_error(capsys, [command, str(tmp_path / "never-read.gguf"), "--seed", seed])
    assert f"--seed {seed} must be from 0 to 4294967294" in err


@pytest.mark.parametrize("command", ["generate", "chat"])
def test_the_seed_help_says_its_range_and_the_largest_one_is_taken(
        command: str, capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.cli import build_parser
    from moescope.cli.commands.generate import sampling_from_args

    assert main([command, "--help"]) == 0
    assert "0 to 4294967294" in " ".join(capsys.readouterr().out.split())
    args = build_parser().parse_args([command, "--seed", "4294967294"])
    assert sampling_from_args(args).seed == 4294967294


@pytest.mark.parametrize(("option", "value", "says"), [
    ("--compute-ms", "1e300", "from 0 to 60000 ms"),
    ("--compute-ms", "60001", "from 0 to 60000 ms"),
    ("--bandwidth", "1e-300", "from 0.01 to 10000 GB/s"),
    ("--bandwidth", "1e5", "from 0.01 to 10000 GB/s"),
    ("--latency-us", "1e300", "from 0 to 1e+06 µs"),
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
