"""`make install-desktop`: a valid launcher for this checkout, icon and AppStream data, all
under $XDG_DATA_HOME, removed again by --uninstall."""

from __future__ import annotations

import configparser
import importlib.util
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _installer():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("install_desktop",
                                                  ROOT / "packaging" / "install_desktop.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_install_writes_a_launcher_for_this_checkout_and_uninstall_removes_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    inst = _installer()
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "share dir"))  # a space: quoting
    exe = tmp_path / "bin with space" / "moescope"
    exe.parent.mkdir()
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    assert inst.main(["--executable", str(exe)]) == 0
    paths = inst.targets(tmp_path / "share dir")
    entry = configparser.ConfigParser(interpolation=None)
    entry.optionxform = str  # type: ignore[assignment,method-assign]
    entry.read(paths["desktop"], encoding="utf-8")
    d = entry["Desktop Entry"]
    assert d["Type"] == "Application" and d["Name"] == "MoEScope"
    assert d["Exec"] == f'"{exe}"' and d["Icon"] == inst.APP_ID
    assert paths["icon"].read_bytes() == (ROOT / "resources/icons/moescope.svg").read_bytes()
    from moescope.gui.app import DESKTOP_ID

    assert DESKTOP_ID == inst.APP_ID == paths["desktop"].stem
    for tool, args in (("desktop-file-validate", [str(paths["desktop"])]),
                       ("appstreamcli", ["validate", "--no-net", "--pedantic",
                                         str(paths["metainfo"])])):
        if shutil.which(tool):
            run = subprocess.run([tool, *args], capture_output=True, text=True, check=False)
            assert run.returncode == 0, run.stdout + run.stderr
    assert inst.main(["--uninstall"]) == 0
    assert not any(p.exists() for p in paths.values())


def test_install_refuses_a_missing_program(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    with pytest.raises(SystemExit, match="make setup"):
        _installer().main(["--executable", str(tmp_path / "nope")])
    assert not (tmp_path / "applications").exists()
