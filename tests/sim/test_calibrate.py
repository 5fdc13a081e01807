"""``moescope calibrate``: disk reads and memory copies measured, saved, and used by the
calibrated cost model; a damaged save is refused with one line."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.sim.calibration import calibration_path, load_calibration
from moescope.sim.cost import cost_model
from moescope.trace import read_trace
from moescope.util.errors import MoEScopeError


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MOESCOPE_DATA_DIR", str(tmp_path / "data"))
    return tmp_path / "data"


def test_calibrate_measures_saves_and_the_calibrated_model_reads_it(
        data_dir: Path, tmp_path: Path, record: Callable[..., Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    big = tmp_path / "blob.bin"
    big.write_bytes(bytes(range(256)) * (64 * 1024))  # 16 MiB
    assert main(["calibrate", str(big), "--reads", "8", "--block-mib", "1"]) == 0
    out = capsys.readouterr().out
    assert "disk " in out and "memory copy" in out and "host to device" in out
    cal = load_calibration()
    assert cal is not None and calibration_path().parent == data_dir
    assert cal.block_bytes == 1 << 20 and cal.file == str(big)
    for value in (cal.disk_bandwidth, cal.memcpy_bandwidth):
        assert math.isfinite(value) and value > 1e6
    assert 0.0 <= cal.disk_latency < 1.0
    trace = read_trace(record("qwen3moe", policy="quality-first", budget="25%", tokens=24))
    cm = cost_model("calibrated", trace)
    assert cm.disk_bandwidth == cal.disk_bandwidth and cm.disk_latency == cal.disk_latency
    assert "moescope calibrate" in cm.note


def test_without_a_calibration_the_calibrated_model_says_its_disk_is_assumed(
        data_dir: Path, record: Callable[..., Path]) -> None:
    """The what-if's status line and ``replay`` print the model's note: its disk figures
    are the presets' until ``moescope calibrate`` has measured this machine's."""
    trace = read_trace(record("qwen3moe", policy="quality-first", budget="25%", tokens=24))
    cm = cost_model("calibrated", trace)
    assert load_calibration() is None
    assert "disk not measured" in cm.note and "moescope calibrate" in cm.note
    assert cm.note.startswith("fitted to ")


def test_bad_calibrations_and_arguments_are_refused_with_one_line(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small = tmp_path / "small.bin"
    small.write_bytes(b"x" * 10_000)
    assert main(["calibrate", str(small)]) == 2
    assert "too small" in capsys.readouterr().err
    assert main(["calibrate", str(tmp_path / "missing.bin")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert main(["calibrate", str(small), "--block-mib", "1000"]) == 2
    data_dir.mkdir(parents=True, exist_ok=True)
    calibration_path().write_text(json.dumps({"disk_bandwidth": -1, "disk_latency": 0,
                                              "memcpy_bandwidth": 1e9}))
    with pytest.raises(MoEScopeError, match="disk_bandwidth must be a number"):
        load_calibration()
    calibration_path().write_text("{not json")
    with pytest.raises(MoEScopeError, match="bad JSON"):
        load_calibration()


def _load_within(seconds: float) -> BaseException | None:
    """What ``load_calibration`` raised, run on a daemon thread so that a read that blocks
    (a FIFO) fails the test instead of hanging it."""
    import threading

    raised: list[BaseException | None] = []

    def load() -> None:
        try:
            load_calibration()
            raised.append(None)
        except BaseException as err:  # the test inspects what it was
            raised.append(err)

    t = threading.Thread(target=load, daemon=True)
    t.start()
    t.join(seconds)
    assert raised, f"load_calibration still running after {seconds} s"
    return raised[0]


@pytest.mark.parametrize("kind", ["not-utf8", "deep", "huge", "fifo", "dev-zero", "folder"])
def test_a_hostile_calibration_file_is_one_line_not_a_traceback_or_a_hang(
        data_dir: Path, kind: str) -> None:
    """Bad bytes, JSON nested past the parser's depth, a FIFO or a link to /dev/zero in the
    calibration's place: a MoEScopeError naming the file, read at most 64 KiB (a
    UnicodeDecodeError and a RecursionError were tracebacks, /dev/zero a MemoryError, a
    FIFO a hang of ``replay --cost-model calibrated``)."""
    import os

    data_dir.mkdir(parents=True, exist_ok=True)
    path = calibration_path()
    if kind == "not-utf8":
        path.write_bytes(b"\xff\xfe{\"disk_bandwidth\": 1}")
    elif kind == "deep":
        path.write_text("[" * 100_000 + "]" * 100_000)
    elif kind == "huge":
        path.write_text(" " * (1 << 20) + "{}")
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    else:
        path.mkdir()
    err = _load_within(20.0)
    assert isinstance(err, MoEScopeError), repr(err)
    assert str(path) in str(err) and "\n" not in str(err)


def test_calibrate_never_saves_over_the_file_it_measured_and_a_full_disk_is_one_line(
        data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``calibration.json`` a link to the file measured: the save replaced that file (a
    model, in use) with 250 bytes of JSON. A link to /dev/full: an OSError traceback."""
    blob = tmp_path / "blob.bin"
    content = bytes(range(256)) * (3 << 12)  # 3 MiB
    blob.write_bytes(content)
    data_dir.mkdir(parents=True, exist_ok=True)
    calibration_path().symlink_to(blob)
    assert main(["calibrate", str(blob), "--reads", "2", "--block-mib", "1"]) == 2
    err = capsys.readouterr().err
    assert "is an input of this command" in err and "not saved" in err and \
        err.count("\n") == 1, err
    assert blob.read_bytes() == content
    calibration_path().unlink()
    calibration_path().symlink_to("/dev/full")
    assert main(["calibrate", str(blob), "--reads", "2", "--block-mib", "1"]) == 2
    err = capsys.readouterr().err
    assert err == (f"moescope: error: {calibration_path()}: cannot write (No space left on "
                   "device); the calibration was not saved\n")
