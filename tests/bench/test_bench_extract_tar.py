"""The GPU bundle's scripts unpack tarballs on whatever python3 a machine has: Python's
"tar" extraction filter is missing before 3.10.12 / 3.11.4 (Debian 12 ships 3.11.2), where
``extractall(filter="tar")`` fails. bench/_common.extract_tar falls back to checking every
member first, for a chosen subset of members too (the bundle keeps part of the sdist)."""

from __future__ import annotations

import io
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def _common() -> Any:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import _common
    finally:
        sys.path.remove(str(REPO / "bench"))
    return _common


def _tar(path: Path, members: list[tarfile.TarInfo]) -> Path:
    with tarfile.open(path, "w:gz") as tar:
        for info in members:
            tar.addfile(info, io.BytesIO(b"x") if info.isfile() else None)
    return path


def _file(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.mode = 1, 0o4777  # setuid and world-writable: both dropped
    return info


@pytest.mark.parametrize("with_filter", [True, False], ids=["tar-filter", "python-3.11.2"])
def test_bundle_tarballs_unpack_with_or_without_tarfile_filters(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_filter: bool) -> None:
    common = _common()
    if not with_filter:
        monkeypatch.delattr(tarfile, "tar_filter", raising=False)
    link = tarfile.TarInfo("pkg/link")
    link.type, link.linkname = tarfile.SYMTYPE, "a.txt"
    good = _tar(tmp_path / "good.tar.gz", [_file("pkg/a.txt"), _file("pkg/b.txt"), link])
    with tarfile.open(good) as tar:
        common.extract_tar(tar, tmp_path / "all")
    assert (tmp_path / "all" / "pkg" / "link").read_text() == "x"
    assert (tmp_path / "all" / "pkg" / "a.txt").stat().st_mode & 0o7022 == 0
    with tarfile.open(good) as tar:  # a subset: only the chosen members land
        common.extract_tar(tar, tmp_path / "some",
                           [m for m in tar.getmembers() if m.name == "pkg/b.txt"])
    assert sorted(p.name for p in (tmp_path / "some" / "pkg").iterdir()) == ["b.txt"]

    escape = tarfile.TarInfo("pkg/out")
    escape.type, escape.linkname = tarfile.SYMTYPE, "../../../etc/passwd"
    refused = (tarfile.TarError, common.builder.BuildError)
    # Python's "tar" filter lets a link point outside; the fallback refuses that too
    for i, bad in enumerate([[_file("../evil.txt")]] + ([] if with_filter else [[escape]])):
        with tarfile.open(_tar(tmp_path / f"bad{i}.tar.gz", bad)) as tar, \
                pytest.raises(refused):
            common.extract_tar(tar, tmp_path / f"bad{i}", tar.getmembers())
    assert not (tmp_path / "evil.txt").exists()
