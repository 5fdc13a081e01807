"""Save the whole X screen to a PNG: ``python packaging/grab_screen.py OUT.png``.

packaging/check_clean_install.sh runs it as a second Qt client beside ``make run``'s window,
so the picture shows what a user sees (window manager included) through Qt's own xcb
plugin, with no screenshot tool to install.
"""

from __future__ import annotations

import sys


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: grab_screen.py OUT.png", file=sys.stderr)
        return 2
    from PySide6.QtGui import QGuiApplication

    app = QGuiApplication([sys.argv[0]])
    screen = app.primaryScreen()
    ok = screen.grabWindow(0).save(argv[0], "PNG")
    print(f"{'wrote' if ok else 'could not write'} {argv[0]} ({screen.size().width()}x"
          f"{screen.size().height()}, platform {app.platformName()})")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
