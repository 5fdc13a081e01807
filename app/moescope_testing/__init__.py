"""Test and benchmark fixtures that are real files: synthetic MoE models and broken ones.

Importing this package needs only numpy and gguf (no llama.cpp, no Qt). Names are loaded
lazily so that ``python -m moescope_testing.synth`` runs its module exactly once.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from moescope_testing.broken import BROKEN_KINDS, write_broken_file
    from moescope_testing.synth import (
        ARCHES,
        DENSE_ARCHES,
        EXPERT_TYPES,
        MOE_ARCHES,
        SYNTH_PRESETS,
        SynthSpec,
        ensure_synth_model,
        ensure_wide_vocab_model,
        estimate_file_bytes,
        expert_bytes_per_layer,
        preset,
        write_dense_model,
        write_synth_model,
    )

_EXPORTS: dict[str, str] = {
    "BROKEN_KINDS": "broken",
    "write_broken_file": "broken",
    "ARCHES": "synth",
    "DENSE_ARCHES": "synth",
    "EXPERT_TYPES": "synth",
    "MOE_ARCHES": "synth",
    "SYNTH_PRESETS": "synth",
    "SynthSpec": "synth",
    "ensure_synth_model": "synth",
    "ensure_wide_vocab_model": "synth",
    "estimate_file_bytes": "synth",
    "expert_bytes_per_layer": "synth",
    "preset": "synth",
    "write_dense_model": "synth",
    "write_synth_model": "synth",
}

__all__ = [
    "ARCHES",
    "BROKEN_KINDS",
    "DENSE_ARCHES",
    "EXPERT_TYPES",
    "MOE_ARCHES",
    "SYNTH_PRESETS",
    "SynthSpec",
    "ensure_synth_model",
    "ensure_wide_vocab_model",
    "estimate_file_bytes",
    "expert_bytes_per_layer",
    "preset",
    "write_broken_file",
    "write_dense_model",
    "write_synth_model",
]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
