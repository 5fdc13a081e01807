"""Install (or remove) MoEScope's launcher for this user: ``make install-desktop``.

Writes, under ``$XDG_DATA_HOME`` (default ``~/.local/share``):

* ``applications/io.github.moescope.MoEScope.desktop``, whose ``Exec`` is this checkout's
  ``.venv/bin/moescope`` (a launcher must name an absolute program; the repository can
  live anywhere, so the file is made from ``packaging/linux/*.desktop.in`` here);
* ``icons/hicolor/scalable/apps/io.github.moescope.MoEScope.svg``;
* ``metainfo/io.github.moescope.MoEScope.metainfo.xml`` (AppStream: software centres).

Nothing outside that folder is touched, so no root is needed; ``--uninstall`` removes the
three files again.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

APP_ID = "io.github.moescope.MoEScope"
ROOT = Path(__file__).resolve().parent.parent
LINUX = ROOT / "packaging" / "linux"


def data_home() -> Path:
    return Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")


def targets(base: Path) -> dict[str, Path]:
    return {
        "desktop": base / "applications" / f"{APP_ID}.desktop",
        "icon": base / "icons" / "hicolor" / "scalable" / "apps" / f"{APP_ID}.svg",
        "metainfo": base / "metainfo" / f"{APP_ID}.metainfo.xml",
    }


def desktop_entry(executable: Path) -> str:
    """The launcher text for ``executable`` (quoted as the Desktop Entry spec asks)."""
    quoted = '"' + str(executable).replace("\\", "\\\\").replace('"', '\\"') + '"'
    template = (LINUX / f"{APP_ID}.desktop.in").read_text(encoding="utf-8")
    return template.replace("@EXEC@", quoted)


def install(base: Path, executable: Path) -> dict[str, Path]:
    if not executable.is_file() or not os.access(executable, os.X_OK):
        raise SystemExit(f"{executable} is missing: run `make setup` first")
    paths = targets(base)
    for path in paths.values():
        path.parent.mkdir(parents=True, exist_ok=True)
    tmp = paths["desktop"].with_suffix(".tmp")
    tmp.write_text(desktop_entry(executable), encoding="utf-8")
    os.replace(tmp, paths["desktop"])
    shutil.copyfile(ROOT / "resources" / "icons" / "moescope.svg", paths["icon"])
    shutil.copyfile(LINUX / f"{APP_ID}.metainfo.xml", paths["metainfo"])
    return paths


def uninstall(base: Path) -> list[Path]:
    removed = []
    for path in targets(base).values():
        if path.exists():
            path.unlink()
            removed.append(path)
    return removed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--uninstall", action="store_true", help="remove the launcher")
    parser.add_argument("--executable", type=Path,
                        default=ROOT / ".venv" / "bin" / "moescope",
                        help="the program the launcher starts (default: this checkout's)")
    args = parser.parse_args(argv)
    base = data_home()
    if args.uninstall:
        for path in uninstall(base):
            print(f"removed {path}")
        return 0
    for path in install(base, args.executable.absolute()).values():
        print(f"installed {path}")
    if shutil.which("update-desktop-database"):  # menus notice the new launcher at once
        subprocess.run(["update-desktop-database", "-q", str(base / "applications")],
                       check=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
