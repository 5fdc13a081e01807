"""Exports are written whole or not at all: a full disk or a vanished folder leaves no half
file and keeps the file that was there."""

from __future__ import annotations

import errno
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from moescope.cache.policy import Policy
from moescope.trace import TraceHeader, TraceModel, TraceWriter
from moescope.util import files
from moescope.util.files import copy_atomic, write_atomic


def test_a_write_replaces_the_file_whole_with_the_usual_permissions(tmp_path: Path) -> None:
    dest = tmp_path / "chat.md"
    dest.write_text("old")
    assert write_atomic(dest, "nëw\n") == dest
    assert dest.read_text(encoding="utf-8") == "nëw\n"
    assert dest.stat().st_mode & 0o777 == 0o666 & ~files._umask()
    assert copy_atomic(dest, tmp_path / "copy.md").read_bytes() == dest.read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chat.md", "copy.md"]


def test_a_full_disk_keeps_the_old_file_and_leaves_nothing_behind(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dest = tmp_path / "trace.jsonl"
    dest.write_text("what the user had")

    def full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files.os, "fsync", full)
    with pytest.raises(OSError) as err:
        write_atomic(dest, "x" * 100_000)
    assert err.value.errno == errno.ENOSPC
    with pytest.raises(OSError):
        copy_atomic(dest, tmp_path / "copy.jsonl")
    assert dest.read_text() == "what the user had"
    assert [p.name for p in tmp_path.iterdir()] == ["trace.jsonl"]


def test_a_missing_folder_is_an_os_error(tmp_path: Path) -> None:
    with pytest.raises(OSError):
        write_atomic(tmp_path / "gone" / "chat.md", "text")
    src: Any = tmp_path / "missing.jsonl"
    with pytest.raises(OSError):
        copy_atomic(src, tmp_path / "copy.jsonl")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ what sits at the path
def test_a_symlink_is_written_through_and_stays_a_symlink(tmp_path: Path) -> None:
    """The writer used to replace the link by a regular file and never write the file it
    pointed to."""
    real_dir = tmp_path / "real"
    real_dir.mkdir()
    target = real_dir / "chat.md"
    target.write_text("old")
    link = tmp_path / "link.md"
    link.symlink_to(target)
    write_atomic(link, "new")
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert target.read_text() == "new"
    assert sorted(p.name for p in real_dir.iterdir()) == ["chat.md"]  # no temp file left
    dangling = tmp_path / "later.md"
    dangling.symlink_to(real_dir / "later.md")
    copy_atomic(target, dangling)
    assert dangling.is_symlink() and (real_dir / "later.md").read_text() == "new"


def test_a_fifo_is_written_directly_and_stays_a_fifo(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()))
    reader.start()
    write_atomic(fifo, "through the pipe\n")
    reader.join(10)
    assert got == [b"through the pipe\n"]
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]


def test_a_character_device_is_written_directly_and_never_replaced() -> None:
    """As root, ``--json /dev/full`` replaced the device node by a regular file."""
    write_atomic("/dev/null", "gone")
    assert stat.S_ISCHR(os.lstat("/dev/null").st_mode)
    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    with pytest.raises(OSError) as err:
        write_atomic("/dev/full", "x" * 100_000)
    assert err.value.errno == errno.ENOSPC
    assert stat.S_ISCHR(os.lstat("/dev/full").st_mode)
    stream = files.open_stream("/dev/full")
    with pytest.raises(OSError) as err:
        stream.write(b"x")
        stream.close()  # buffered: the failure shows on flush
    assert err.value.errno == errno.ENOSPC


def test_dash_is_stdout(capfd: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    write_atomic("-", "to stdout\n")
    src = tmp_path / "a.txt"
    src.write_text("copied\n")
    copy_atomic(src, "-")
    with files.open_stream("-") as f:
        f.write(b"streamed\n")
    assert capfd.readouterr().out == "to stdout\ncopied\nstreamed\n"
    assert not (Path.cwd() / "-").exists()


_CHILD = """
import sys
from moescope.util.files import open_stream, write_atomic
write_atomic(sys.argv[1], "written\\n", inputs=sys.argv[2:])
with open_stream(sys.argv[1]) as f:
    f.write(b"streamed\\n")
"""


def _child(dest: str, stdout: Any, *inputs: str) -> Any:
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-c", _CHILD, dest, *inputs], stdout=stdout,
                          stderr=subprocess.PIPE, text=True, check=False)


@pytest.mark.parametrize("dest", ["/dev/stdout", "/dev/fd/1", "/proc/self/fd/1", "link"])
def test_dev_stdout_is_written_through_the_descriptor(tmp_path: Path, dest: str) -> None:
    """``--json /dev/stdout >> out.txt`` replaced out.txt (the path resolved through
    /proc/self/fd/1 to the file, then renamed over it), and ``| cat`` could not write
    ("No such file"): such a path is now written through the descriptor itself."""
    import subprocess

    if dest == "link":  # a symlink of the user's own to stdout
        (tmp_path / "link").symlink_to("/dev/stdout")
        dest = str(tmp_path / "link")
    out = tmp_path / "out.txt"
    out.write_text("keep me\n")
    ino = out.stat().st_ino
    with open(out, "a") as f:  # the shell's ">>"
        done = _child(dest, f)
    assert done.returncode == 0, done.stderr
    assert out.read_text() == "keep me\nwritten\nstreamed\n"
    assert out.stat().st_ino == ino  # the same file, not a new one renamed over it
    piped = _child(dest, subprocess.PIPE)  # "| cat"
    assert piped.returncode == 0, piped.stderr
    assert piped.stdout == "written\nstreamed\n"


def test_staged_outputs_write_a_descriptor_path_through_it(tmp_path: Path) -> None:
    """A window export to /dev/stderr (stderr redirected to a file) staged a temporary
    beside the file and renamed it over it at commit, as _atomic once did."""
    import subprocess
    import sys

    code = ("from moescope.util.files import StagedOutputs\n"
            "with StagedOutputs() as s:\n"
            "    s.stage('/dev/stderr', lambda f: f.write(b'staged\\n'))\n"
            "    s.commit()\n")
    log = tmp_path / "log.txt"
    log.write_text("keep me\n")
    ino = log.stat().st_ino
    with open(log, "a") as f:
        done = subprocess.run([sys.executable, "-c", code], stderr=f, check=False)
    assert done.returncode == 0
    assert log.read_text() == "keep me\nstaged\n" and log.stat().st_ino == ino
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.txt"]


def test_dev_stdout_on_an_input_is_refused(tmp_path: Path) -> None:
    """``replay t.jsonl --json /dev/stdout 1<> t.jsonl``: the descriptor's file is an
    input, refused as a named one is."""
    trace = tmp_path / "t.jsonl"
    trace.write_text("a trace\n")
    with open(trace, "r+") as f:
        done = _child("/dev/stdout", f, str(trace))
    assert done.returncode != 0 and "is an input of this command" in done.stderr
    assert trace.read_text() == "a trace\n"
    assert files.descriptor_of("/dev/fd/99999") == 99999
    with pytest.raises(files.OutputPathError, match="descriptor 99999, which is not open"):
        files.check_output("/dev/fd/99999")
    assert files.descriptor_of(tmp_path / "plain.json") is None
    assert files.descriptor_of("/dev/fd/x") is None


def test_folders_block_devices_and_inputs_are_refused(tmp_path: Path) -> None:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF precious")
    link = tmp_path / "link.gguf"
    link.symlink_to(model)
    hard = tmp_path / "hard.gguf"
    os.link(model, hard)
    for dest in (model, link, hard):
        with pytest.raises(files.OutputPathError, match="input of this command"):
            write_atomic(dest, "trace", inputs=[model])
        with pytest.raises(files.OutputPathError, match="input of this command"):
            files.open_stream(dest, inputs=[link])
    with pytest.raises(files.OutputPathError, match="input"):
        copy_atomic(model, hard)  # the source is an input of a copy
    assert model.read_bytes() == b"GGUF precious" and link.is_symlink()
    with pytest.raises(files.OutputPathError, match="folder") as err:
        write_atomic(tmp_path, "x")
    assert err.value.errno == errno.EISDIR and isinstance(err.value, OSError)
    with pytest.raises(OSError):
        files.open_stream(tmp_path)
    block = tmp_path / "block"
    try:
        os.mknod(block, stat.S_IFBLK | 0o600, os.makedev(7, 200))
    except (PermissionError, OSError):
        pytest.skip("cannot make a block device node here (not root)")
    with pytest.raises(files.OutputPathError, match="block device"):
        write_atomic(block, "x")
    assert stat.S_ISBLK(os.lstat(block).st_mode)


def test_the_trace_writer_follows_the_same_rules(tmp_path: Path) -> None:
    """A trace through a symlink lands in the target and the link stays; a folder is
    refused; the file is written in place (a crash keeps what was written)."""
    model = TraceModel(file_name="m.gguf", metadata_sha256="cd" * 32,
                         architecture="qwen3moe", n_layers=2, moe_layers=(0, 1), n_expert=8,
                         top_k=2, bytes_per_expert=(1000, 1000))
    header = TraceHeader(model=model, budget="25%", slots_per_layer=2,
                         policy=Policy.preset("exact"), router_inputs=None)
    target = tmp_path / "real.jsonl"
    link = tmp_path / "t.jsonl"
    link.symlink_to(target)
    with TraceWriter(link, header):
        pass
    assert link.is_symlink() and target.read_text().count("\n") == 2
    with pytest.raises(OSError):
        TraceWriter(tmp_path, header)


def test_staged_outputs_appear_together_or_not_at_all(tmp_path: Path) -> None:
    """Nothing at any output changes before the commit; leaving without one (a cancel, a
    failure in a later file) removes every temporary and keeps what was there; a symlink
    is written through and a character device gets its bytes at the commit."""
    from moescope.util.files import OutputPathError, StagedOutputs

    a, b, target = tmp_path / "a.txt", tmp_path / "b.txt", tmp_path / "target.txt"
    a.write_text("old a")
    target.write_text("old target")
    (tmp_path / "link.txt").symlink_to(target)
    with StagedOutputs() as staged:
        tmp = staged.stage(a, lambda f: f.write(b"new a"))
        assert tmp.read_bytes() == b"new a" and a.read_text() == "old a"
        with pytest.raises(RuntimeError):
            staged.stage(b, lambda f: (f.write(b"half"), _fail()))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "link.txt", "target.txt"]
    assert a.read_text() == "old a"

    with StagedOutputs() as staged:
        staged.stage(a, lambda f: f.write(b"new a"))
        staged.stage(tmp_path / "link.txt", lambda f: f.write(b"through"))
        staged.stage("/dev/null", lambda f: f.write(b"gone"))
        assert a.read_text() == "old a" and target.read_text() == "old target"
        staged.commit()
    assert a.read_text() == "new a" and target.read_text() == "through"
    assert (tmp_path / "link.txt").is_symlink()
    assert a.stat().st_mode & 0o777 == 0o666 & ~files._umask()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt", "link.txt", "target.txt"]
    with StagedOutputs([a]) as staged, pytest.raises(OutputPathError):
        staged.stage(a, lambda f: f.write(b"over an input"))
    assert a.read_text() == "new a"


def _fail() -> None:
    raise RuntimeError("a later file failed")


def test_a_folder_that_takes_no_new_files_is_refused_naming_the_output() -> None:
    """``/proc`` is a folder whose permissions let root write, yet it takes no new file:
    the refusal names the output and the folder (it was the temporary's name and only
    ``No such file or directory``)."""
    from moescope.util.files import OutputPathError, check_output, write_atomic

    for call in (lambda: check_output("/proc/x"), lambda: write_atomic("/proc/x", "data")):
        with pytest.raises(OutputPathError) as caught:
            call()
        assert caught.value.filename == "/proc/x"
        assert "folder /proc" in str(caught.value)


@pytest.mark.parametrize("name", ["a" * 300 + ".csv", "/".join(["d" * 200] * 25) + "/x"])
def test_an_output_name_too_long_is_refused_in_words(tmp_path: Path, name: str) -> None:
    """A file name over 255 bytes, or a path over 4096, was an ``OSError`` traceback from
    ``Path.is_symlink`` (which swallows only a few errnos) in every command's output check."""
    from moescope.util.files import OutputPathError, check_output

    with pytest.raises(OutputPathError, match=r"cannot write \(File name too long\)"):
        check_output(tmp_path / name)


def test_replay_to_an_output_name_too_long_is_one_line(
        record: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from moescope.cli import main

    trace = str(record("qwen3moe", tokens=8))
    long = str(tmp_path / ("a" * 300 + ".csv"))
    assert main(["replay", trace, "--policy", "exact", "--tokens-csv", long]) == 2
    err = capsys.readouterr().err
    assert err == f"moescope: error: --tokens-csv {long}: cannot write (File name too long)\n"


@pytest.mark.parametrize("mode", [0o600, 0o640, 0o755])
def test_a_replaced_file_keeps_its_permissions(tmp_path: Path, mode: int) -> None:
    """A private (0600) export written again came back 0644, readable by every user of
    the machine (the temporary got the umask's default before it was renamed over it)."""
    from moescope.util.files import StagedOutputs

    dest = tmp_path / "tokens.csv"
    for write in (lambda: write_atomic(dest, "new\n"),
                  lambda: copy_atomic(tmp_path / "src", dest)):
        (tmp_path / "src").write_text("copied\n")
        dest.write_text("old\n")
        dest.chmod(mode)
        write()
        assert stat.S_IMODE(dest.stat().st_mode) == mode
    with StagedOutputs() as staged:
        staged.stage(dest, lambda f: f.write(b"staged\n"))
        staged.commit()
    assert dest.read_text() == "staged\n" and stat.S_IMODE(dest.stat().st_mode) == mode
    new = tmp_path / "new.csv"
    write_atomic(new, "x")
    assert stat.S_IMODE(new.stat().st_mode) == 0o666 & ~files._umask()


def test_a_read_only_file_is_not_replaced(tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """Renaming over a file needs only its folder writable: a read-only (0444) output
    was replaced, though ``> file`` would have refused (and root's too: no write bit)."""
    from moescope.cli import main
    from moescope.util.files import OutputPathError
    from moescope_testing.traces import core_trace

    dest = tmp_path / "keep.csv"
    dest.write_text("kept\n")
    dest.chmod(0o444)
    with pytest.raises(OutputPathError, match="is read-only; not replaced"):
        write_atomic(dest, "new\n")
    trace = core_trace(tmp_path / "t.jsonl")
    assert main(["replay", str(trace), "--policy", "exact", "--csv", str(dest)]) == 2
    assert capsys.readouterr().err == (f"moescope: error: --csv {dest}: is read-only; not "
                                       "replaced (make it writable to replace it)\n")
    assert dest.read_text() == "kept\n" and stat.S_IMODE(dest.stat().st_mode) == 0o444


def test_a_staged_file_for_a_device_waits_private(tmp_path: Path) -> None:
    """What waits in the shared temporary folder for a device or FIFO output (its bytes
    until the commit) was made readable by everyone (0644)."""
    from moescope.util.files import StagedOutputs

    with StagedOutputs() as staged:
        tmp = staged.stage("/dev/null", lambda f: f.write(b"private\n"))
        assert stat.S_IMODE(tmp.stat().st_mode) == 0o600
        staged.commit()
    assert not tmp.exists()
