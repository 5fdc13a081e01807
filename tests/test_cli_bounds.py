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
