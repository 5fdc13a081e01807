"""Exports are written whole or not at all: a full disk or a vanished folder leaves no half
file and keeps the file that was there."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest

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
