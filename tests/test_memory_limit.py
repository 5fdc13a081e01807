"""The memory this process may use: the machine's, bounded by its memory cgroups.

The parser reads real files: a /proc/self and a cgroup mount laid out in a temporary
directory as the kernel lays them out (v1 and v2, nested groups, a container's mount root,
unlimited and malformed values), and, as root on a machine with a memory controller, a real
cgroup with a limit around a child process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from moescope.util.memory_limit import memory_limit
from moescope_testing.cgroups import memory_cgroup, memory_hierarchy

APP = Path(__file__).resolve().parents[1] / "app"
MIB = 1 << 20


def _tree(tmp: Path, *, v2: bool, group: str, files: dict[str, dict[str, str]],
          mount_root: str = "/") -> tuple[Path, Path]:
    """``(proc, root)``: /proc/self's cgroup and mountinfo naming ``group``, and the
    groups' files under ``root``/sys/fs/cgroup[/memory] (``files``: group path -> name ->
    text)."""
    proc = tmp / "proc"
    proc.mkdir()
    point = "/sys/fs/cgroup" if v2 else "/sys/fs/cgroup/memory"
    if v2:
        (proc / "cgroup").write_text(f"0::{group}\n")
        mount = f"30 23 0:26 {mount_root} {point} rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n"
    else:
        (proc / "cgroup").write_text(f"12:pids:/\n4:memory:{group}\n1:cpu,cpuacct:/\n0::/\n")
        mount = (f"31 23 0:28 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n"
                 f"35 31 0:32 {mount_root} {point} rw,relatime - cgroup cgroup rw,memory\n")
    (proc / "mountinfo").write_text("22 1 8:1 / / rw - ext4 /dev/vda rw\n" + mount)
    root = tmp / "root"
    for path, names in files.items():
        d = root / point.lstrip("/") / path.lstrip("/")
        d.mkdir(parents=True, exist_ok=True)
        for name, text in names.items():
            (d / name).write_text(text)
    return proc, root


def v1(limit: int | str, usage: int, inactive: int = 0) -> dict[str, str]:
    return {"memory.limit_in_bytes": f"{limit}\n", "memory.usage_in_bytes": f"{usage}\n",
            "memory.stat": f"cache 1\ninactive_file 7\ntotal_inactive_file {inactive}\n"}


def v2(limit: int | str, current: int, inactive: int = 0) -> dict[str, str]:
    return {"memory.max": f"{limit}\n", "memory.current": f"{current}\n",
            "memory.stat": f"anon 5\nfile 9\ninactive_file {inactive}\nactive_file 3\n"}


def test_without_a_limited_group_the_machine_decides(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, v2=True, group="/user.slice/app.scope", files={
        "/user.slice/app.scope": v2("max", 500 * MIB), "/user.slice": v2("max", 900 * MIB)})
    got = memory_limit(proc, root)
    vm = psutil.virtual_memory()
    assert got.group is None and not got.limited
    assert got.total == vm.total
    assert abs(got.available - vm.available) < 256 * MIB  # the machine moves meanwhile


def test_a_v2_limit_above_the_group_binds_with_its_page_cache_counted_free(
        tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, v2=True, group="/user.slice/app.scope", files={
        "/user.slice/app.scope": v2("max", 300 * MIB, inactive=50 * MIB),
        "/user.slice": v2(1000 * MIB, 700 * MIB, inactive=100 * MIB)})
    got = memory_limit(proc, root)
    assert got.total == 1000 * MIB
    assert got.available == 1000 * MIB - (700 - 100) * MIB
    assert got.group == "/user.slice" and got.group_limit == 1000 * MIB


def test_the_tightest_of_nested_v1_groups_binds(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, v2=False, group="/docker/abc", files={
        "/docker/abc": v1(800 * MIB, 600 * MIB, inactive=0),
        "/docker": v1(2000 * MIB, 1900 * MIB, inactive=1500 * MIB),
        "/": v1(9223372036854771712, 5000 * MIB)})
    got = memory_limit(proc, root)
    assert got.total == 800 * MIB
    assert got.available == 200 * MIB
    assert got.group == "/docker/abc"


def test_a_container_sees_its_group_at_the_mount_root(tmp_path: Path) -> None:
    # cgroup namespace: /proc/self/cgroup says /, the mount's root is the host's path
    proc, root = _tree(tmp_path, v2=True, group="/kubepods/pod1", mount_root="/kubepods/pod1",
                       files={"/": v2(256 * MIB, 100 * MIB)})
    got = memory_limit(proc, root)
    assert got.total == 256 * MIB and got.available == 156 * MIB


def test_usage_past_the_limit_leaves_nothing_rather_than_a_negative(tmp_path: Path) -> None:
    proc, root = _tree(tmp_path, v2=True, group="/a", files={"/a": v2(100 * MIB, 130 * MIB)})
    assert memory_limit(proc, root).available == 0


@pytest.mark.parametrize("bad", [
    {"memory.max": "-5\n", "memory.current": "1\n"},
    {"memory.max": "lots\n", "memory.current": "1\n"},
    {"memory.max": "9" * 400 + "\n", "memory.current": "1\n"},
    {"memory.max": f"{100 * MIB}\n", "memory.current": "\xff\xfe\n"},
    {"memory.max": f"{100 * MIB}\n"},  # no usage: the limit alone says nothing
    {},
])
def test_malformed_or_missing_files_are_no_limit(tmp_path: Path, bad: dict[str, str]) -> None:
    proc, root = _tree(tmp_path, v2=True, group="/a", files={"/a": bad})
    got = memory_limit(proc, root)
    assert got.group is None and got.total == psutil.virtual_memory().total


def test_unreadable_proc_files_and_odd_lines_are_no_limit(tmp_path: Path) -> None:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_bytes(b"garbage\n\x00\x01:::\n4:memory\n" + b"x" * 100_000)
    (proc / "mountinfo").write_text("short line\n1 2 - \n")
    assert memory_limit(proc, tmp_path).group is None
    assert memory_limit(tmp_path / "missing", tmp_path).group is None


def test_a_hierarchy_deeper_than_any_real_one_is_cut(tmp_path: Path) -> None:
    deep = "/" + "/".join(f"g{i}" for i in range(200))
    proc, root = _tree(tmp_path, v2=True, group=deep,
                       files={"/": v2(64 * MIB, 10 * MIB), "/g0": v2("max", 1)})
    assert memory_limit(proc, root).total == 64 * MIB  # the root's limit is still read


@pytest.mark.skipif(memory_hierarchy() is None,
                    reason="needs root and a writable memory cgroup hierarchy")
def test_a_real_cgroup_limit_bounds_what_a_child_process_sees() -> None:
    limit = 400 * MIB
    with memory_cgroup(limit) as group:
        code = ("import json, sys; from moescope.util.memory_limit import memory_limit; "
                "m = memory_limit(); print(json.dumps([m.total, m.available, m.group]))")
        out = subprocess.run(
            [sys.executable, "-c",
             f"import os; open({str(group / 'cgroup.procs')!r}, 'w').write(str(os.getpid())); "
             + code],
            env={**os.environ, "PYTHONPATH": str(APP)}, capture_output=True, text=True,
            timeout=120, check=True).stdout
    total, available, name = json.loads(out)
    assert total == limit
    assert 0 < available <= limit
    assert name is not None and name.endswith(group.name)


def test_the_memory_view_names_a_binding_cgroup_limit(tmp_path: Path) -> None:
    from moescope.display.memory_model import MemoryModel

    proc, root = _tree(tmp_path, v2=True, group="/user.slice/app.scope",
                       files={"/user.slice/app.scope": v2(3 << 30, 1 << 30)})
    limited = MemoryModel(limit=memory_limit(proc, root))
    limited.sample()
    line = limited.summary().splitlines()[0]
    assert line.startswith("RAM: this process ")
    assert line.endswith(" · limit 3.0 GiB (memory cgroup /user.slice/app.scope)")
    free = MemoryModel(limit=memory_limit(tmp_path / "no-proc", tmp_path))
    free.sample()
    assert "limit" not in free.summary()
