"""This machine's disk reads and memory copies, measured once and saved for the replay.

``moescope calibrate`` reads expert-sized blocks of a model file with O_DIRECT (the page
cache bypassed, as the engine's RAM tier reads them) at random aligned offsets, and small
reads for the fixed cost per read; it times expert-sized memory copies in RAM. The result is
saved as JSON in the data folder; ``replay --cost-model calibrated`` prices reads from disk
with it. Host-to-device copies need a GPU build and are left out (None) here.
"""

from __future__ import annotations

import json
import math
import mmap
import os
import random
import stat
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from moescope.util.errors import MoEScopeError
from moescope.util.files import write_atomic
from moescope.util.paths import data_dir, data_dir_path

CALIBRATION_FILE = "calibration.json"
ALIGN = 4096
SMALL = 4096
MAX_BLOCK = 256 << 20
MAX_READS = 10_000
MAX_CALIBRATION_BYTES = 64 << 10
"""A saved calibration is a few hundred bytes; a larger file is not one (and is not read
whole: a link to /dev/zero would never end)."""


@dataclass(frozen=True)
class Calibration:
    """Measured rates (bytes per second) and the fixed cost of one disk read (seconds)."""

    disk_bandwidth: float
    disk_latency: float
    memcpy_bandwidth: float
    h2d_bandwidth: float | None = None
    direct_io: bool = True
    """The reads bypassed the page cache (False: the file system refused O_DIRECT)."""
    block_bytes: int = 0
    file: str = ""
    created: str = ""

    def describe(self) -> str:
        h2d = ("not measured (no GPU build)" if self.h2d_bandwidth is None
               else f"{self.h2d_bandwidth / 1e9:.2f} GB/s")
        return (f"disk {self.disk_bandwidth / 1e9:.2f} GB/s + {self.disk_latency * 1e6:.0f} µs "
                f"per read ({'O_DIRECT' if self.direct_io else 'page cache, not O_DIRECT'}, "
                f"{self.block_bytes / 2**20:.2f} MiB blocks) · memory copy "
                f"{self.memcpy_bandwidth / 1e9:.2f} GB/s · host to device {h2d}")


def _open_direct(path: Path) -> tuple[int, bool]:
    try:
        return os.open(path, os.O_RDONLY | getattr(os, "O_DIRECT", 0)), hasattr(os, "O_DIRECT")
    except OSError:
        return os.open(path, os.O_RDONLY), False


def _timed_reads(fd: int, size: int, block: int, n: int, rng: random.Random) -> list[float]:
    buf = mmap.mmap(-1, block)  # page-aligned, as O_DIRECT wants
    view = memoryview(buf)
    last = max(0, (size - block) // ALIGN)
    out = []
    try:
        for _ in range(n):
            offset = rng.randint(0, last) * ALIGN
            t0 = time.perf_counter()
            got = os.preadv(fd, [view], offset)
            out.append(time.perf_counter() - t0)
            if got <= 0:
                raise MoEScopeError("the file could not be read (it ended early)")
    finally:
        view.release()
        buf.close()
    return out


def measure_disk(path: Path, block: int = 2 << 20, reads: int = 64,
                 seed: int = 0) -> tuple[float, float, bool]:
    """``(bandwidth, latency, direct)`` of random aligned reads of ``path``: latency is the
    median 4 KiB read, bandwidth the block over the median block read less that latency."""
    if not 1 <= reads <= MAX_READS:
        raise MoEScopeError(f"reads must be 1..{MAX_READS}, not {reads}")
    if not ALIGN <= block <= MAX_BLOCK or block % ALIGN:
        raise MoEScopeError(f"the block must be a multiple of 4 KiB up to 256 MiB, not {block}")
    try:
        size = path.stat().st_size
        if not path.is_file():
            raise MoEScopeError(f"{path}: not a regular file")
        if size < block + ALIGN:
            raise MoEScopeError(f"{path.name}: {size} bytes is too small to read blocks of "
                                f"{block} bytes from; choose a larger file or --block-mib")
        fd, direct = _open_direct(path)
    except FileNotFoundError:
        raise MoEScopeError(f"{path}: no such file") from None
    except OSError as err:
        raise MoEScopeError(f"{path}: cannot read ({err.strerror or err})") from None
    rng = random.Random(seed)
    try:
        small = _timed_reads(fd, size, SMALL, reads, rng)
        big = _timed_reads(fd, size, block, reads, rng)
    except OSError as err:
        raise MoEScopeError(f"{path}: read failed ({err.strerror or err})") from None
    finally:
        os.close(fd)
    latency = float(np.median(small))
    whole = float(np.median(big))
    # a noisy small read can come near a big one: never credit more than 90% of it to latency
    latency = min(latency, 0.9 * whole)
    transfer = max(whole - latency, 1e-9)
    return block / transfer, latency, direct


def measure_memcpy(block: int = 2 << 20, repeats: int = 64) -> float:
    """Bytes per second of expert-sized copies in RAM (median of ``repeats``)."""
    src = np.ones(block, dtype=np.uint8)
    dst = np.empty_like(src)
    times = []
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return block / max(float(np.median(times)), 1e-9)


def calibrate_machine(path: Path, block: int = 2 << 20, reads: int = 64) -> Calibration:
    """Measure disk reads of ``path`` and memory copies of ``block`` bytes."""
    bandwidth, latency, direct = measure_disk(path, block, reads)
    return Calibration(disk_bandwidth=bandwidth, disk_latency=latency,
                       memcpy_bandwidth=measure_memcpy(block), direct_io=direct,
                       block_bytes=block, file=str(path),
                       created=time.strftime("%Y-%m-%dT%H:%M:%S"))


def calibration_path() -> Path:
    return data_dir() / CALIBRATION_FILE


def save_calibration(cal: Calibration, dest: Path | None = None) -> Path:
    """Write ``cal`` (to the data folder's calibration file by default), never over the
    file it measured (``calibration.json`` a link to the model would have replaced it);
    ``OSError`` when it cannot be written, the file as it was."""
    return write_atomic(dest or calibration_path(), json.dumps(asdict(cal), indent=1) + "\n",
                        inputs=[cal.file] if cal.file else [])


def _rate(raw: dict[str, object], key: str, low: float, high: float) -> float:
    value = raw.get(key)
    # an integer is compared as one (math.isfinite(10**400) raised OverflowError)
    if not isinstance(value, int | float) or isinstance(value, bool) or not (
            (isinstance(value, int) or math.isfinite(value)) and low <= value <= high):
        raise MoEScopeError(f"{CALIBRATION_FILE}: {key} must be a number in "
                            f"{low:g}..{high:g}; run moescope calibrate again")
    return float(value)


def load_calibration(path: Path | None = None) -> Calibration | None:
    """The saved calibration (None when there is none); every number bounded."""
    path = path or data_dir_path() / CALIBRATION_FILE  # read without making the folder
    again = "run moescope calibrate again"
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # a FIFO would block, /dev/zero not end
            raise MoEScopeError(f"{path}: not a regular file, not a calibration; {again}")
        with open(path, "rb") as f:
            data = f.read(MAX_CALIBRATION_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise MoEScopeError(f"{path}: cannot read ({err.strerror or err})") from None
    if len(data) > MAX_CALIBRATION_BYTES:
        raise MoEScopeError(f"{path}: larger than {MAX_CALIBRATION_BYTES // 1024} KiB, not a "
                            f"calibration; {again}")
    try:
        raw = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise MoEScopeError(f"{path}: not a calibration (not UTF-8 text at byte "
                            f"{err.start}); {again}") from None
    except (ValueError, RecursionError):  # bad JSON, or nested past the parser's depth
        raise MoEScopeError(f"{path}: not a calibration (bad JSON); {again}") from None
    if not isinstance(raw, dict):
        raise MoEScopeError(f"{path}: not a calibration; run moescope calibrate again")
    h2d = raw.get("h2d_bandwidth")
    return Calibration(
        disk_bandwidth=_rate(raw, "disk_bandwidth", 1e5, 1e12),
        disk_latency=_rate(raw, "disk_latency", 0.0, 1.0),
        memcpy_bandwidth=_rate(raw, "memcpy_bandwidth", 1e5, 1e13),
        h2d_bandwidth=None if h2d is None else _rate(raw, "h2d_bandwidth", 1e5, 1e13),
        direct_io=bool(raw.get("direct_io", True)),
        block_bytes=int(_rate(raw, "block_bytes", 0, MAX_BLOCK)),
        file=str(raw.get("file", ""))[:4096], created=str(raw.get("created", ""))[:64])
