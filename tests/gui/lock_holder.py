"""Child process for the data folder lock tests: another MoEScope holding its data folder.

Run as ``python lock_holder.py`` with MOESCOPE_DATA_DIR set: takes the window's lock on
that folder (:class:`moescope.gui.instance_lock.DataFolderLock`, as a starting window
does), prints ``held`` (or ``busy``), then keeps it until its stdin closes or it is killed.
"""

from __future__ import annotations

import sys

from moescope.gui.instance_lock import DataFolderLock


def main() -> int:
    lock = DataFolderLock()
    print("held" if lock.take() is None else "busy", flush=True)
    sys.stdin.read()
    lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
