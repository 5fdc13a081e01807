"""The sampling its authors recommend for a model, as its GGUF carries it.

llama.cpp's converter copies a model's ``generation_config.json`` into ``general.sampling.*``
(Qwen3: temperature 0.6, top-p 0.95, top-k 20; gpt-oss: temperature 1, top-p 1), and
llama-server and llama-cli use those values for whatever the user leaves unset
(``common_params_sampling`` in common.cpp). MoEScope's front ends do the same: the server for
a request that omits a field, the terminal for an option not given, the window's chat
settings while they are still MoEScope's own defaults. Each value is bounded before use; one
out of range, not finite or of the wrong type is ignored (the front end's default stays).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

# Sampling field -> (GGUF key, lowest, highest, whole number?)
KEYS: dict[str, tuple[str, float, float, bool]] = {
    "temperature": ("general.sampling.temp", 0.0, 2.0, False),
    "top_p": ("general.sampling.top_p", 0.0, 1.0, False),
    "top_k": ("general.sampling.top_k", 0, 1000, True),
    "min_p": ("general.sampling.min_p", 0.0, 1.0, False),
    "repeat_penalty": ("general.sampling.penalty_repeat", 0.0, 10.0, False),
}
LABELS = {"temperature": "temperature", "top_p": "top-p", "top_k": "top-k", "min_p": "min-p",
          "repeat_penalty": "repeat penalty"}


def model_sampling(metadata: Mapping[str, Any]) -> dict[str, float | int]:
    """``{field: value}`` of :class:`moescope.engine.Sampling` fields the model's metadata
    recommends (``ModelInfo.metadata``), each within :data:`KEYS`' bounds; {} for none."""
    out: dict[str, float | int] = {}
    for field, (key, lo, hi, whole) in KEYS.items():
        value = metadata.get(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        number = float(value)
        if not math.isfinite(number) or not lo <= number <= hi:
            continue
        if whole:
            if number != int(number):
                continue
            out[field] = int(number)
        else:  # float32 in the file: 0.6 is 0.60000002
            out[field] = float(f"{number:.6g}")
    return out


def describe(values: Mapping[str, float | int]) -> str:
    """"temperature 0.6, top-p 0.95, top-k 20" ("" for none)."""
    return ", ".join(f"{LABELS[f]} {values[f]:g}" for f in KEYS if f in values)
