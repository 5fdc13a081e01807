"""The frozen desktop bundle's entry point (``packaging/moescope.spec``, ``make dist``).

PyInstaller needs a script, not a console-script entry point; this one does exactly what
the installed ``moescope`` command does, so the bundle's ``moescope`` takes the same
subcommands and options (``moescope info``, ``moescope --self-test`` ...).
"""

from __future__ import annotations

import sys

from moescope.cli import main

if __name__ == "__main__":
    sys.exit(main())
