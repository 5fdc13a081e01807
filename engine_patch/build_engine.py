#!/usr/bin/env python3
"""Build MoEScope's engine (``make engine``): the command line of engine_patch/builder.py.

Usage: build_engine.py [--venv .venv] [--backend auto|cpu|cuda|vulkan] [--configure-only]
                       [--print-key] [--print-backend] [--lib-dir] [--stock]
The build itself, its cache and its environment variables: engine_patch/builder.py; which
backend and its flags: engine_patch/backends.py. This file only puts the repository on the
path (it runs as a script, from any folder) so that ``engine_patch`` imports as a package.
"""

from __future__ import annotations

import sys
from pathlib import Path

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from engine_patch.builder import main

    sys.exit(main())
