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
