"""The CLI's front ends under hostile arguments, found by the twenty-second hostile-input
pass: each case below ended in more than one line, or in a line that did not say what was
wrong; each is now one ``moescope: error:`` line with exit status 2, and nothing the user
had is changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from moescope.cli import main
from moescope.util.errors import one_line


def _one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    code = main(argv)
    out, err = capsys.readouterr()
    assert code == 2, (out, err)
    assert out == "" and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("argv", "says"), [
    (["replay", "{tmp}/a\nmoescope: error: spoofed.jsonl"],
     "moescope: error: {tmp}/a\\nmoescope: error: spoofed.jsonl: no such trace file\n"),
    (["replay", "{tmp}/\x1b[31mred.jsonl"],
     "moescope: error: {tmp}/\\x1b[31mred.jsonl: no such trace file\n"),
    (["info", "{tmp}/x\u202eflog.gguf"],  # a right-to-left override reorders the line
     "moescope: error: {tmp}/x\\u202eflog.gguf: no such file\n"),
    (["{tmp}/two\nlines.gguf"],  # `moescope MODEL.gguf`, the window's own check
     "moescope: error: {tmp}/two\\nlines.gguf: no such model file\n"),
    (["generate", "{tmp}/m.gguf", "--bogus\nmoescope: error: spoofed"],
     "moescope generate: error: unrecognized arguments: --bogus\\nmoescope: error: spoofed "
     "(see: moescope generate --help)\n"),
])
def test_a_name_with_a_newline_or_an_escape_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        says: str) -> None:
    """A trace named ``a<newline>moescope: error: spoofed.jsonl`` printed two error lines,
    the second of the name's choosing; an ESC in a name recoloured the terminal."""
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == says.replace("{tmp}", str(tmp_path))


def test_a_corrupt_trace_whose_name_holds_a_newline_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad\nx.jsonl"
    bad.write_bytes(b"garbage\n")
    err = _one_line_error(capsys, ["replay", str(bad)])
    assert err.startswith("moescope: error: bad\\nx.jsonl: not a MoEScope trace")
    assert bad.read_bytes() == b"garbage\n"


def test_one_line_leaves_a_printable_message_as_it_is() -> None:
    for text in ("plain", "café ½ 日本 — “quoted”", "tab-free, 12 GiB"):
        assert one_line(text) is text
    assert one_line("a\tb\r\nc\x00\x7f\u2028\udcff") == "a\\tb\\r\\nc\\x00\\x7f\\u2028\\udcff"
