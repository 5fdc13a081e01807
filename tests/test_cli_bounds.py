"""Every number read from an argument is bounded before use, and said in one line when it
is out of bounds (``moescope: error: ...``, exit 2): a reviewer's list of options that
ended in a traceback, wrapped silently, or printed 300-digit numbers."""

from __future__ import annotations

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
