"""How much memory this process may use: the system's, bounded by its memory cgroups.

In a container, a systemd slice with ``MemoryMax`` or a job scheduler's group, the kernel
stops this process at the group's limit however much RAM the machine has, and counts the
page cache in it; psutil's ``available`` only knows the machine. Reading a model's experts
into RAM past that limit ends in thrashing or the OOM killer, so the fit estimate and the
automatic RAM budget ask here. Both cgroup versions are read: v2's ``memory.max`` /
``memory.current``, v1's ``memory.limit_in_bytes`` / ``memory.usage_in_bytes``, at the
process's group and every group above it (each limit applies); the group's inactive file
pages (page cache the kernel reclaims first) count as available, as psutil's
``available`` counts the machine's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import psutil

NO_LIMIT = 1 << 60
"""Limits at or above this (v1 writes ``9223372036854771712`` for none) are no limit."""
MAX_DEPTH = 64
"""Groups above the process's read at most (a deeper path is not a real hierarchy)."""
MAX_FILE = 1 << 16
"""Bytes read of one cgroup file at most (``memory.stat`` is a few kB)."""


@dataclass(frozen=True)
class MemoryLimit:
    """What the process may hold: ``total`` bytes at most, ``available`` of them now."""

    total: int
    available: int
    group: str | None = None
    """The cgroup whose limit binds (``/user.slice/…``), None when the machine's RAM does."""
    group_limit: int | None = None
    """That group's limit in bytes."""

    @property
    def limited(self) -> bool:
        return self.group is not None


def memory_limit(proc: Path = Path("/proc/self"), root: Path = Path("/")) -> MemoryLimit:
    """The machine's memory (psutil), bounded by every memory cgroup limit over this
    process (``proc``: its ``/proc`` directory; ``root``: where ``/proc/self/mountinfo``'s
    mount points are, for tests and containers). Anything unreadable or malformed in the
    cgroup files is no limit: this only ever lowers psutil's numbers."""
    vm = psutil.virtual_memory()
    groups = _group_limits(proc, root)
    total = min([int(vm.total), *(limit for _, limit, _ in groups)])
    available = min([int(vm.available), *(free for _, _, free in groups)])
    # the group to name: the one leaving the least, if it binds, else the smallest limit
    binding = [g for g in groups if g[2] <= available] or \
        [g for g in groups if g[1] <= total and g[1] < int(vm.total)]
    name, limit = (binding[0][0], binding[0][1]) if binding else (None, None)
    return MemoryLimit(total=total, available=max(0, min(available, total)), group=name,
                       group_limit=limit)


def memory_available() -> int:
    """Bytes this process may still take (see :func:`memory_limit`)."""
    return memory_limit().available


def _group_limits(proc: Path, root: Path) -> list[tuple[str, int, int]]:
    """``(group, limit, available)`` of every limited memory cgroup over the process."""
    out: list[tuple[str, int, int]] = []
    for mount, rel, v2 in _memory_mounts(proc):
        here = (root / mount.lstrip("/")) if root != Path("/") else Path(mount)
        parts = [p for p in rel.split("/") if p and p not in (".", "..")][:MAX_DEPTH]
        for depth in range(len(parts), -1, -1):
            d = here.joinpath(*parts[:depth])
            limit = _number(d / ("memory.max" if v2 else "memory.limit_in_bytes"))
            if limit is None or limit >= NO_LIMIT:
                continue
            used = _number(d / ("memory.current" if v2 else "memory.usage_in_bytes"))
            if used is None:
                continue
            stat = _stat(d / "memory.stat")
            reclaimable = stat.get("inactive_file" if v2 else "total_inactive_file",
                                   stat.get("inactive_file", 0))
            free = limit - max(0, used - min(reclaimable, used))
            out.append(("/" + "/".join(parts[:depth]), limit, max(0, free)))
    return out


def _memory_mounts(proc: Path) -> list[tuple[str, str, bool]]:
    """``(mount point, the process's group under it, is v2)`` for the memory controller:
    from ``/proc/self/cgroup`` and ``mountinfo`` (a mount's root, as in a container's
    cgroup namespace, is taken off the group's path)."""
    groups: dict[str, str] = {}  # "memory" (v1) or "" (v2) -> path
    for line in _read(proc / "cgroup").splitlines():
        fields = line.split(":", 2)
        if len(fields) != 3:
            continue
        _id, controllers, path = fields
        if controllers == "":
            groups.setdefault("", path)
        elif "memory" in controllers.split(","):
            groups["memory"] = path
    mounts: list[tuple[str, str, bool]] = []
    for line in _read(proc / "mountinfo").splitlines():
        head, sep, tail = line.partition(" - ")
        if not sep:
            continue
        left, right = head.split(), tail.split()
        if len(left) < 5 or len(right) < 3:
            continue
        mroot, point, fstype, options = left[3], _unescape(left[4]), right[0], right[2]
        if fstype == "cgroup2" and "" in groups and "memory" not in groups:
            key, v2 = "", True
        elif fstype == "cgroup" and "memory" in options.split(",") and "memory" in groups:
            key, v2 = "memory", False
        else:
            continue
        path = groups[key]
        if mroot != "/" and (path == mroot or path.startswith(mroot.rstrip("/") + "/")):
            path = path[len(mroot.rstrip("/")):] or "/"
        mounts.append((point, path, v2))
    return mounts


def _unescape(field: str) -> str:
    """mountinfo's octal escapes (``\\040`` for a space)."""
    if "\\" not in field:
        return field
    try:
        return field.encode().decode("unicode_escape").encode("latin-1").decode()
    except (UnicodeDecodeError, UnicodeEncodeError):
        return field


def _read(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            return f.read(MAX_FILE).decode("utf-8", "replace")
    except OSError:
        return ""


def _number(path: Path) -> int | None:
    """A cgroup file's one non-negative integer; ``max`` is no limit; else None."""
    text = _read(path).strip()
    if text == "max":
        return NO_LIMIT
    if not text.isdigit() or len(text) > 20:
        return None
    return int(text)


def _stat(path: Path) -> dict[str, int]:
    out: dict[str, int] = {}
    for line in _read(path).splitlines():
        key, _, value = line.partition(" ")
        if value.isdigit() and len(value) <= 20:
            out[key] = int(value)
    return out
