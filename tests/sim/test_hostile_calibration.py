"""A hostile ``calibration.json`` (found by the second hostile-input campaign): an integer
that no float holds ended ``replay --cost-model calibrated`` in an OverflowError traceback
(``math.isfinite`` converts it); it is one line naming the file and the key."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.cli import main
from moescope.sim.calibration import calibration_path, load_calibration
from moescope.util.errors import MoEScopeError

GOOD = {"disk_bandwidth": 2e9, "disk_latency": 1e-4, "memcpy_bandwidth": 1e10,
        "block_bytes": 1 << 20}


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MOESCOPE_DATA_DIR", str(tmp_path / "data"))
    (tmp_path / "data").mkdir()
    return tmp_path / "data"


def _write(key: str, literal: str) -> None:
    text = json.dumps(GOOD | {key: 0})
    calibration_path().write_text(text.replace(f'"{key}": 0', f'"{key}": {literal}'))


@pytest.mark.parametrize("key", ["disk_bandwidth", "disk_latency", "memcpy_bandwidth",
                                 "h2d_bandwidth", "block_bytes"])
@pytest.mark.parametrize("literal", ["9" * 400, "-" + "9" * 400])
def test_an_integer_beyond_any_float_is_one_line(data_dir: Path, key: str,
                                                 literal: str) -> None:
    _write(key, literal)
    with pytest.raises(MoEScopeError, match=f"{key} must be a number in") as err:
        load_calibration()
    assert "\n" not in str(err.value)


def test_integers_in_range_are_read(data_dir: Path) -> None:
    _write("disk_bandwidth", "2000000000")
    cal = load_calibration()
    assert cal is not None and cal.disk_bandwidth == 2e9 and cal.block_bytes == 1 << 20


def test_replay_with_the_calibrated_model_says_it_in_one_line(
        data_dir: Path, record: Callable[..., Path],
        capsys: pytest.CaptureFixture[str]) -> None:
    trace = record("qwen3moe", policy="quality-first", budget="25%", tokens=8)
    _write("disk_bandwidth", "9" * 400)
    assert main(["replay", str(trace), "--policy", "exact", "--cost-model",
                 "calibrated"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("moescope: error: calibration.json: disk_bandwidth must be") \
        and err.count("\n") == 1, err
