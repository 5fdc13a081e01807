"""Where the bundled resources are: the demo model, icons, the style sheet.

The repo's ``resources/`` folder sits next to ``app/``. A frozen desktop bundle
(PyInstaller, ``make dist``) has no repo around it: there the folder is copied next to the
bundled Python modules, in ``sys._MEIPASS`` (``dist/MoEScope/_internal/resources``), and
``__file__`` no longer tells where it is. ``MOESCOPE_RESOURCES`` overrides both.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

DEMO_MODEL_NAME = "moescope-demo-qwen3moe.gguf"
ENV_RESOURCES = "MOESCOPE_RESOURCES"


def frozen_base() -> Path | None:
    """The folder of a frozen app's bundled files, or None when running from source.

    PyInstaller sets ``sys.frozen`` and ``sys._MEIPASS`` (the ``_internal`` folder of a
    one-dir bundle); a freezer without ``_MEIPASS`` keeps its files next to the executable.
    """
    if not getattr(sys, "frozen", False):
        return None
    base = getattr(sys, "_MEIPASS", None)
    return Path(base) if base else Path(sys.executable).resolve().parent


def resources_dir() -> Path:
    """The ``resources/`` folder: ``$MOESCOPE_RESOURCES``, else the frozen bundle's, else
    the checkout's."""
    env = os.environ.get(ENV_RESOURCES)
    if env:
        return Path(env)
    base = frozen_base()
    if base is not None:
        return base / "resources"
    return Path(__file__).resolve().parents[3] / "resources"


def demo_model_path() -> Path | None:
    """The embedded demo MoE model, or None when this checkout has none."""
    models = resources_dir() / "models"
    preferred = models / DEMO_MODEL_NAME
    if preferred.is_file():
        return preferred
    found = sorted(models.glob("*.gguf")) if models.is_dir() else []
    return found[0] if found else None


def engine_lib_dir() -> Path | None:
    """The folder llama_cpp loads libllama.so from: $LLAMA_CPP_LIB_PATH, else its package's
    lib/ (found without importing llama_cpp, which would load the library). The engine's
    backend record and the native core's library are both read from here, so they are the
    library the engine really runs."""
    override = os.environ.get("LLAMA_CPP_LIB_PATH")
    if override:
        return Path(override)
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "lib"
