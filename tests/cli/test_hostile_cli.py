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
    # a file name's byte that is not UTF-8 as the byte, as traces and the server write it;
    # a surrogate no byte gives, as itself
    assert one_line("a\tb\r\nc\x00\x7f\u2028\udcff\ud800") == \
        "a\\tb\\r\\nc\\x00\\x7f\\u2028\\xff\\ud800"


@pytest.mark.parametrize(("argv", "option"), [
    (["info", ""], "MODEL.gguf"),  # read ".", the current folder, as the model
    (["generate", ""], "MODEL.gguf"),
    (["generate", "{tmp}/m.gguf", "--trace", ""], "--trace"),
    (["chat", "{tmp}/m.gguf", "--trace", ""], "--trace"),
    (["eval", "{tmp}/m.gguf", "--text", ""], "--text"),
    (["eval", "{tmp}/m.gguf", "--text", "{tmp}/t.txt", "--csv", ""], "--csv"),
    (["bench", "{tmp}/m.gguf", "--json", ""], "--json"),
    (["replay", ""], "TRACE"),
    (["replay", "{tmp}/t.jsonl", "--csv", ""], "--csv"),  # ".: is a folder"
    (["replay", "{tmp}/t.jsonl", "--tokens-csv", ""], "--tokens-csv"),
    (["trace", "compact", ""], "JOURNAL"),
    (["trace", "compact", "{tmp}/j.arrows", ""], "OUT"),
    (["calibrate", ""], "FILE"),
])
def test_an_empty_path_is_refused_as_empty_not_read_as_the_current_folder(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str],
        option: str) -> None:
    """``Path("")`` is ``.``: ``--csv ""`` was refused as ".: is a folder", a name the
    user never typed, and an empty model path read the current folder."""
    err = _one_line_error(capsys, [a.replace("{tmp}", str(tmp_path)) for a in argv])
    command = " ".join(argv[:2]) if argv[0] == "trace" else argv[0]
    assert err == (f"moescope {command}: error: argument {option}: is empty; give a path "
                   f"(see: moescope {command} --help)\n")
    assert not any(tmp_path.iterdir())


def test_a_trace_that_is_a_symlink_loop_says_so(tmp_path: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    loop = tmp_path / "t.jsonl"
    loop.symlink_to("t.jsonl")
    for argv in (["replay", str(loop)], ["trace", "compact", str(loop)]):
        err = _one_line_error(capsys, argv)
        assert err == (f"moescope: error: {loop}: a symbolic link that loops (or a chain of "
                       "too many links), not a trace file\n")
    assert loop.is_symlink()


@pytest.mark.parametrize(("first", "second"), [
    ("a.out", "l.out"),  # l.out: a symlink to a.out, which is not there yet
    ("x.csv", "sub/../x.csv"),
    ("x.csv", "./x.csv"),
])
def test_two_outputs_that_land_in_one_file_not_there_yet_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], first: str,
        second: str) -> None:
    """The same-file check compared inodes, so two names of one file that did not exist
    yet passed it, and the second output was written over the first."""
    from moescope_testing.traces import core_trace

    trace = core_trace(tmp_path / "t.jsonl")
    (tmp_path / "sub").mkdir()
    (tmp_path / "l.out").symlink_to("a.out")
    before = sorted(p.name for p in tmp_path.iterdir())
    err = _one_line_error(capsys, ["replay", str(trace), "--policy", "exact",
                                   "--tokens-csv", str(tmp_path / first),
                                   "--json", str(tmp_path / second)])
    assert "name the same file" in err and "give each its own" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_calibrate_checks_where_it_saves_before_it_measures(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """A data folder that is a file was "DIR: cannot write (File exists)", and a
    calibration.json that is a link to the measured file was refused, both only after the
    minutes of measuring."""
    from moescope.sim import calibration
    from moescope.util import paths

    measured: list[Path] = []
    real = calibration.calibrate_machine
    monkeypatch.setattr(calibration, "calibrate_machine",
                        lambda path, **kw: measured.append(path) or real(path, **kw))
    blob = tmp_path / "blob.bin"
    blob.write_bytes(bytes(range(256)) * (1 << 12))
    monkeypatch.setenv(paths.ENV_DATA_DIR, str(blob))  # a file where the folder goes
    err = _one_line_error(capsys, ["calibrate", str(blob), "--reads", "2"])
    assert err == (f"moescope: error: the data folder {blob} cannot be made (it is there "
                   "and is not a folder); set MOESCOPE_DATA_DIR to a folder you can write "
                   "to\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / "calibration.json").symlink_to(blob)
    monkeypatch.setenv(paths.ENV_DATA_DIR, str(data))
    err = _one_line_error(capsys, ["calibrate", str(blob), "--reads", "2"])
    assert err.endswith("is an input of this command "
                        f"({blob}); refusing to overwrite it; the calibration was not saved "
                        "(nothing was measured)\n")
    assert measured == [] and (data / "calibration.json").is_symlink()


@pytest.mark.usefixtures("engine_required")
def test_a_parquet_trace_that_cannot_be_compacted_leaves_its_journal_and_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--trace x.parquet`` where x.parquet is a link to /dev/full: the compaction at the
    end failed as an OSError traceback; the journal, a whole trace, is named instead."""
    from moescope.trace import read_trace
    from moescope.util.resources import demo_model_path

    link = tmp_path / "x.parquet"
    link.symlink_to("/dev/full")
    assert main(["generate", str(demo_model_path()), "-p", "hi", "-n", "4",
                 "--temperature", "0", "--trace", str(link)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]
    journal = tmp_path / "x.parquet.journal.arrows"
    assert err == (f"moescope: error: --trace {link}: the trace could not be finished (No "
                   f"space left on device); what was recorded is in {journal}")
    assert len(read_trace(journal).tokens) == 4 and link.is_symlink()


@pytest.mark.usefixtures("engine_required")
@pytest.mark.parametrize("suffix", [".jsonl", ".arrows", ".parquet"])
def test_a_trace_write_that_fails_mid_answer_is_one_line_and_keeps_the_trace(
        tmp_path: Path, suffix: str) -> None:
    """A disk that fills while ``generate --trace`` records (here: a 20 kB file size
    limit, EFBIG) was a twice-chained OSError traceback; the answer stops, one line says
    why and where the trace so far is, and that trace reads."""
    import resource
    import subprocess
    import sys

    from moescope.trace import read_trace
    from moescope.util.resources import demo_model_path

    trace = tmp_path / f"t{suffix}"
    r = subprocess.run(
        [sys.executable, "-m", "moescope", "generate", str(demo_model_path()), "-p",
         "tell me a long story", "-n", "64", "--temperature", "0", "--trace", str(trace)],
        capture_output=True, text=True, timeout=300, check=False,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000)))
    kept = tmp_path / (f"t{suffix}.journal.arrows" if suffix == ".parquet" else f"t{suffix}")
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-3000:]
    assert r.stderr.splitlines()[-1] == (f"moescope: error: --trace {trace}: recording "
                                         "stopped (File too large), and the answer with it; "
                                         f"the trace so far is in {kept}")
    assert 0 < len(read_trace(kept).tokens) < 64


@pytest.mark.usefixtures("engine_required")
def test_chat_names_the_journal_when_recording_a_parquet_trace_stops(tmp_path: Path) -> None:
    """Chat goes on when a write of its trace fails; its line said "[Errno 27] File too
    large; the trace so far is in x.parquet", a name with nothing there: the journal is."""
    import resource
    import subprocess
    import sys

    from moescope.util.resources import demo_model_path

    trace = tmp_path / "c.parquet"
    r = subprocess.run(
        [sys.executable, "-m", "moescope", "chat", str(demo_model_path()), "-n", "64",
         "--temperature", "0", "--trace", str(trace)],
        input="tell me a long story\nand another one\n", capture_output=True, text=True,
        timeout=300, check=False,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000)))
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert (f"moescope: recording stopped (File too large); the trace so far is in "
            f"{tmp_path / 'c.parquet.journal.arrows'}") in r.stderr.splitlines()
    # both messages were answered, yet the trace is cut: a script must notice (it exited 0)
    assert r.returncode == 1, r.stderr[-3000:]
    assert r.stdout.count("tok/s") == 2, r.stdout
    # the library's own warning of it is prefixed too, not a bare line from Python's
    # last-resort handler
    # said once: the library's own warning of it is not printed again, bare, by Python's
    # last-resort handler
    assert r.stderr.count("recording stopped") == 1, r.stderr


def test_a_model_name_that_is_not_utf8_prints_as_given_in_a_utf8_locale(
        tmp_path: Path) -> None:
    """``moescope info $'\\xff.gguf'`` in an en_US.UTF-8 terminal (standard output's
    errors "strict"): a UnicodeEncodeError traceback at the first line naming the file."""
    import os
    import shutil
    import subprocess
    import sys

    from moescope.util.resources import demo_model_path

    model = tmp_path / os.fsdecode(b"\xff.gguf")
    shutil.copy(str(demo_model_path()), model)
    r = subprocess.run([sys.executable, "-m", "moescope", "info", os.fsencode(model)],
                       capture_output=True, check=False, timeout=120,
                       env={**os.environ, "PYTHONIOENCODING": "utf-8:strict"})
    assert r.returncode == 0 and b"Traceback" not in r.stderr, r.stderr[-2000:]
    assert b"\\xff.gguf" in r.stdout.splitlines()[0]  # shown as the byte, escaped


def test_info_shows_a_models_own_name_escaped(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A GGUF's ``general.name`` is its author's: one holding an ESC sequence recoloured
    the terminal, and a newline printed a line of its choosing."""
    import dataclasses

    from moescope_testing import preset, write_synth_model

    spec = dataclasses.replace(preset("tiny", "qwen3moe"),
                               name="evil\x1b[31m\nmoescope: error: spoofed\u202e")
    model = write_synth_model(tmp_path / "m.gguf", spec)
    assert main(["info", str(model)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    assert not any(line.startswith("moescope: error") for line in out.splitlines())
    assert "(evil\\x1b[31m\\nmoescope: error: spoofed\\u202e)" in out


@pytest.mark.parametrize("host", ["", " "])
def test_serve_says_an_empty_host_is_empty(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           host: str) -> None:
    """``--host ''`` said "--host  is not an address of this machine" (a blank name)."""
    err = _one_line_error(capsys, ["serve", str(tmp_path / "never-read.gguf"), "--host",
                                   host])
    assert err.startswith("moescope: error: --host is empty: keep 127.0.0.1")


@pytest.mark.parametrize("reads", ["0", "-1", "10001"])
def test_calibrate_names_the_reads_option(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                          reads: str) -> None:
    """It said "reads must be 1..10000", naming no option."""
    err = _one_line_error(capsys, ["calibrate", "--reads", reads])
    assert err == f"moescope: error: --reads must be 1..10000, not {int(reads)}\n"
