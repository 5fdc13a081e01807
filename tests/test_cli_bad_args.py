"""Option values that cannot work are refused in one line before any work is done (no
model loads, no trace is read): a count of tokens below one, a temperature that is not a
number, an output file in a folder that does not exist, a cost model that is not
physical. Each used to end in a traceback after the work, or in a silent wrong result."""

from __future__ import annotations

from pathlib import Path

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
    ("--n", "0", "--n must be at least 1"),
    ("--n", "-3", "--n must be at least 1"),
    ("--temperature", "nan", "--temperature must be a number >= 0"),
    ("--temperature", "-1", "--temperature must be a number >= 0"),
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


@pytest.mark.parametrize(("option", "value"), [
    ("--bandwidth", "0"), ("--bandwidth", "-5"), ("--bandwidth", "nan"),
    ("--latency-us", "-1"), ("--compute-ms", "inf"),
])
def test_replay_refuses_a_cost_model_that_is_not_physical(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    """A bandwidth of 0 GB/s printed a table of meaningless times."""
    err = _one_line_error(capsys, ["replay", str(tmp_path / "t.jsonl"), option, value])
    assert option in err
