"""Where the bundled resources are: the demo model, icons, the style sheet.

The repo's ``resources/`` folder sits next to ``app/``; a packaged build may point
``MOESCOPE_RESOURCES`` elsewhere.
"""

from __future__ import annotations

import os
from pathlib import Path

DEMO_MODEL_NAME = "moescope-demo-qwen3moe.gguf"


def resources_dir() -> Path:
    env = os.environ.get("MOESCOPE_RESOURCES")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "resources"


def demo_model_path() -> Path | None:
    """The embedded demo MoE model, or None when this checkout has none."""
    models = resources_dir() / "models"
    preferred = models / DEMO_MODEL_NAME
    if preferred.is_file():
        return preferred
    found = sorted(models.glob("*.gguf")) if models.is_dir() else []
    return found[0] if found else None
