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
EXTRA_KEYS: dict[str, tuple[str, float, float, bool]] = {
    "xtc_probability": ("general.sampling.xtc_probability", 0.0, 1.0, False),
    "xtc_threshold": ("general.sampling.xtc_threshold", 0.0, 1.0, False),
    "mirostat": ("general.sampling.mirostat", 0, 2, True),
    "mirostat_tau": ("general.sampling.mirostat_tau", 0.0, 100.0, False),
    "mirostat_eta": ("general.sampling.mirostat_eta", 0.0, 1.0, False),
}
"""XTC and mirostat: the engine's chain applies them (``Sampling``); the terminal and the
server take them from the model, the window's chat settings do not have them yet."""
UNAPPLIED_KEYS = {"sampling order": "general.sampling.sequence",
                  "penalty window": "general.sampling.penalty_last_n"}
"""Keys the converter writes that MoEScope reads but does not apply: its chain's order is
llama-cpp-python's (penalties, top-k, top-p, min-p, XTC, temperature), its penalties look
at the last 64 tokens."""
LABELS = {"temperature": "temperature", "top_p": "top-p", "top_k": "top-k", "min_p": "min-p",
          "repeat_penalty": "repeat penalty", "xtc_probability": "XTC probability",
          "xtc_threshold": "XTC threshold", "mirostat": "mirostat",
          "mirostat_tau": "mirostat tau", "mirostat_eta": "mirostat eta"}
MAX_SHOWN = 64
"""Characters of an unapplied key's text shown (``general.sampling.sequence``)."""


def model_sampling(metadata: Mapping[str, Any], *,
                   extra: bool = False) -> dict[str, float | int]:
    """``{field: value}`` of :class:`moescope.engine.Sampling` fields the model's metadata
    recommends (``ModelInfo.metadata``), each within :data:`KEYS`' bounds (with ``extra``,
    :data:`EXTRA_KEYS` too: XTC and mirostat); {} for none."""
    out: dict[str, float | int] = {}
    keys = {**KEYS, **EXTRA_KEYS} if extra else KEYS
    for field, (key, lo, hi, whole) in keys.items():
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
    return ", ".join(f"{LABELS[f]} {values[f]:g}" for f in {**KEYS, **EXTRA_KEYS}
                     if f in values)


def unapplied(metadata: Mapping[str, Any]) -> str:
    """The recommended values MoEScope reads but does not apply (:data:`UNAPPLIED_KEYS`),
    as "sampling order edkypmxt, penalty window 64" ("" for none); a text is cut to
    :data:`MAX_SHOWN` characters, a number out of a 32-bit int's range left out."""
    parts = []
    for label, key in UNAPPLIED_KEYS.items():
        value = metadata.get(key)
        if isinstance(value, str) and value:
            parts.append(f"{label} {value[:MAX_SHOWN]}")
        elif isinstance(value, int) and not isinstance(value, bool) \
                and -(1 << 31) <= value < 1 << 31:
            parts.append(f"{label} {value}")
    return ", ".join(parts)
