"""Shared by the trace tests: a hand-made header for writer/reader tests without a model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from moescope.cache.policy import Policy
from moescope.trace import TraceHeader, TraceModel

MOE_LAYERS = (1, 2, 3)
"""A leading dense layer: per-layer fields are keyed by the model's layer index."""


def psr_header(*, n_expert: int = 16, top_k: int = 4, slots: int = 4,
               sha: str = "cd" * 32) -> TraceHeader:
    """A deepseek2-shaped header (layers 1-3 are MoE) under psr, without router inputs."""
    model = TraceModel(file_name="m.gguf", metadata_sha256=sha, architecture="deepseek2",
                         n_layers=4, moe_layers=MOE_LAYERS, n_expert=n_expert, top_k=top_k,
                         bytes_per_expert=(1000, 1000, 1000))
    return TraceHeader(model=model, budget="25%", slots_per_layer=slots,
                       policy=Policy.preset("psr"), router_inputs=None)


def set_token_field(path: Path, line: int, field: str, value: Any) -> None:
    """Rewrite one field of the JSON record on ``line`` (0-based) of the trace at ``path``:
    how the malformed-field tests make a bad file from a good one."""
    lines = path.read_text().splitlines()
    record = json.loads(lines[line])
    record[field] = value
    lines[line] = json.dumps(record)
    path.write_text("\n".join(lines) + "\n")
