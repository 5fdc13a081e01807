"""A real memory cgroup for tests that need a process to see a memory limit (root only)."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def memory_hierarchy() -> tuple[Path, bool] | None:
    """A writable memory cgroup hierarchy: (where to make a group, is it cgroup v2); None
    without root or a memory controller."""
    if os.geteuid() != 0:
        return None
    v1 = Path("/sys/fs/cgroup/memory")
    if (v1 / "memory.limit_in_bytes").exists() and os.access(v1, os.W_OK):
        return v1, False
    v2 = Path("/sys/fs/cgroup")
    control = v2 / "cgroup.subtree_control"
    if control.exists() and "memory" in control.read_text() and os.access(v2, os.W_OK):
        return v2, True
    return None


@contextmanager
def memory_cgroup(limit: int, prefix: str = "moescope-test") -> Iterator[Path]:
    """A fresh memory cgroup limited to ``limit`` bytes, removed afterwards (its
    processes must have exited); write a pid to its ``cgroup.procs`` to move one in."""
    where = memory_hierarchy()
    if where is None:
        raise RuntimeError("needs root and a writable memory cgroup hierarchy")
    base, v2 = where
    group = base / f"{prefix}-{uuid.uuid4().hex[:8]}"
    group.mkdir()
    try:
        (group / ("memory.max" if v2 else "memory.limit_in_bytes")).write_text(str(limit))
        yield group
    finally:
        group.rmdir()
