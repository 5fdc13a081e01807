"""``eval --text`` reads at most what the tokens asked for can take: a huge file, or
``/dev/zero``, is neither read whole into memory nor tokenized whole, and bad text is one
line."""

from __future__ import annotations

import os
import socket
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.util.errors import MoEScopeError
from moescope_testing.forkrun import ForkRunner

SynthModel = Callable[..., Path]


@pytest.mark.usefixtures("engine_required")
def test_eval_of_an_endless_fifo_reads_a_bounded_head(synth_model: SynthModel,
                                                      tmp_path: Path) -> None:
    """``--text /dev/zero`` read the device until memory ran out (a MemoryError traceback,
    or the machine's memory); a device is refused now, and an endless FIFO (``<(yes)``)
    is read only as far as the tokens asked for, within a 1 GiB resident limit."""
    model = synth_model("qwen3moe")
    fifo = tmp_path / "endless"
    os.mkfifo(fifo)
    with open(os.devnull, "wb") as null:  # opening the FIFO waits for eval to read it
        writer = subprocess.Popen(["sh", "-c", f"exec yes 'a few words' > '{fifo}'"],
                                  stderr=null)
    try:
        with ForkRunner(timeout=120.0, cpu_seconds=90, scratch=tmp_path) as runner:
            r = runner.run(["eval", str(model), "--text", str(fifo), "--tokens", "4",
                            "--policies", "exact", "--budgets", "25%", "--bootstrap", "0",
                            "--threads", "1"])
    finally:
        writer.kill()
        writer.wait()
    assert r.outcome == "ok", (r.outcome, r.stderr[-2000:])


def test_the_head_stops_before_a_character_cut_at_the_limit(tmp_path: Path) -> None:
    from moescope.cli.commands.eval import read_text_head

    text = tmp_path / "t.txt"
    text.write_text("ab" + "é" * 10, encoding="utf-8")  # é is two bytes
    assert read_text_head(text, 5) == "abé"  # byte 5 is half an é: left out
    assert read_text_head(text, 6) == "abéé"
    assert read_text_head(text, 1000) == "ab" + "é" * 10


def test_bad_text_is_one_line_naming_the_file(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.cli.commands.eval import read_text_head

    bad = tmp_path / "latin1.txt"
    bad.write_bytes(b"caf\xe9 au lait")
    with pytest.raises(MoEScopeError, match=r"latin1.txt: not UTF-8 text \(byte 3\)"):
        read_text_head(bad, 1000)
    with pytest.raises(MoEScopeError, match="is a folder, not a text file"):
        read_text_head(tmp_path, 1000)
    assert main(["eval", "--text", str(tmp_path), "--tokens", "4"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Errno" not in err, err


@pytest.mark.parametrize(("make", "kind"), [
    (lambda tmp: Path("/dev/zero"), "a device"),  # was scored as a text of NULs
    (lambda tmp: Path("/dev/null"), "a device"),  # was "null: fewer than 2 tokens", loaded
    (lambda tmp: tmp, "a folder"),
    (lambda tmp: _socket(tmp / "sock"), "a socket"),  # was "No such device or address"
])
def test_a_device_socket_or_folder_is_refused_in_one_line_before_the_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        make: Callable[[Path], Path], kind: str) -> None:
    path = make(tmp_path)
    assert main(["eval", str(tmp_path / "never-read.gguf"), "--text", str(path)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == (f"moescope: error: {path}: is {kind}, not a text file; "
                                 "give a file or a FIFO\n")


def _socket(path: Path) -> Path:
    s = socket.socket(socket.AF_UNIX)
    s.bind(str(path))
    s.close()  # the socket file stays
    return path


def test_an_empty_text_is_refused_before_the_model(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.txt"
    empty.write_text(" \n")
    assert main(["eval", str(tmp_path / "never-read.gguf"), "--text", str(empty)]) == 2
    assert capsys.readouterr().err == (f"moescope: error: {empty}: the text is empty; "
                                       "nothing to score\n")


def test_the_help_of_text_says_a_fifo_waits_for_its_writer(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "--help"]) == 0
    help_text = " ".join(capsys.readouterr().out.split())
    assert ("--text FILE UTF-8 text file to score, or a FIFO such as <(zcat corpus.gz) "
            "(read as it comes: the command waits for its writer)") in help_text


@pytest.mark.usefixtures("engine_required")
def test_a_fifo_is_read_as_it_comes(synth_model: SynthModel, text_file: Path,
                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--text <(zcat corpus.gz)``: the command waits for the writer and scores its text."""
    fifo = tmp_path / "corpus"
    os.mkfifo(fifo)

    def write() -> None:
        with open(fifo, "w", encoding="utf-8") as f:  # waits for eval to open it
            f.write(text_file.read_text(encoding="utf-8"))

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    assert main(["eval", str(synth_model("qwen3moe")), "--text", str(fifo), "--tokens", "4",
                 "--policies", "exact", "--budgets", "25%", "--bootstrap", "0",
                 "--threads", "1"]) == 0
    writer.join(10)
    assert "| exact" in capsys.readouterr().out
