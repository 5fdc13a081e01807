"""Writing a user's file so that a failure loses nothing.

An export that fails halfway (a full disk, a folder that vanished) must neither leave a
half-written file behind nor destroy the file it was replacing: everything is written to
a temporary file beside the destination and renamed over it only once complete.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def _atomic(dest: str | os.PathLike[str], fill: Callable[[IO[bytes]], None]) -> Path:
    out = Path(dest)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".part", dir=out.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            fill(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, out)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    return out


def _umask() -> int:
    """The process's umask, read without changing it (``os.umask`` would, for a moment,
    for every thread); 0o022 where /proc does not say."""
    with contextlib.suppress(OSError, ValueError, StopIteration):
        with open("/proc/self/status", encoding="ascii") as f:
            line = next(x for x in f if x.startswith("Umask:"))
        return int(line.split()[1], 8)
    return 0o022


def write_atomic(dest: str | os.PathLike[str], data: str | bytes) -> Path:
    """Write ``data`` (text as UTF-8) to ``dest``, all or nothing (``OSError`` on failure,
    with ``dest`` as it was)."""
    raw = data.encode("utf-8") if isinstance(data, str) else data
    return _atomic(dest, lambda f: f.write(raw))


def copy_atomic(src: str | os.PathLike[str], dest: str | os.PathLike[str]) -> Path:
    """Copy ``src`` to ``dest``, all or nothing (``OSError`` on failure)."""
    def fill(f: IO[bytes]) -> None:
        with open(src, "rb") as s:
            shutil.copyfileobj(s, f, 1 << 20)
    return _atomic(dest, fill)
