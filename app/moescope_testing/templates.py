"""llama.cpp's own chat templates (``models/templates/*.jinja``) from the pinned
llama-cpp-python sdist the engine build downloaded, for tests that check our reading of
real templates (thinking switches, tool-call formats). Tests skip where the sdist is not
there yet (``SDIST.exists()``)."""

from __future__ import annotations

import functools
import os
import tarfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[2]
_LOCK = dict(line.split("=", 1) for line in (_ROOT / "engine_patch/sdist.lock").read_text()
             .splitlines() if "=" in line and not line.startswith("#"))
SDIST = Path(os.environ.get("MOESCOPE_CACHE", Path.home() / ".cache/moescope")) / "sdist" \
    / _LOCK["filename"]
"""The sdist as the engine build caches it (``MOESCOPE_CACHE``, as build_engine.py)."""


@functools.cache
def sdist_templates() -> dict[str, str]:
    """Every chat template in the sdist by file name, read in one pass over the archive."""
    out = {}
    with tarfile.open(SDIST) as tar:
        for member in tar:
            if "/models/templates/" in member.name and member.name.endswith(".jinja"):
                f = tar.extractfile(member)
                assert f is not None
                out[member.name.rsplit("/", 1)[1]] = f.read().decode("utf-8")
    return out
