"""Files that look like models but are not: inputs for negative tests.

Every front end must turn these into one clear sentence (``ModelFormatError``), never a
traceback or a hang, so tests need each way a download can go wrong: random bytes, an
empty file, a file cut short inside the header or inside the tensor data, a bad magic.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from moescope_testing.synth import SynthSpec, preset, write_synth_model

BROKEN_KINDS: tuple[str, ...] = (
    "random", "empty", "bad_magic", "truncated_header", "truncated_data", "bad_version",
)


def write_broken_file(path: str | os.PathLike[str], kind: str, *, seed: int = 0,
                      spec: SynthSpec | None = None) -> Path:
    """Write a broken model file of the given ``kind`` (one of :data:`BROKEN_KINDS`).

    The truncated kinds start from a valid tiny model (``spec``, default tiny qwen3moe) and
    cut it: ``truncated_header`` inside the KV section, ``truncated_data`` halfway through
    the tensor data.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if kind == "random":
        rng = np.random.default_rng(seed)
        dest.write_bytes(rng.integers(0, 256, 4096, dtype=np.uint8).tobytes())
        return dest
    if kind == "empty":
        dest.write_bytes(b"")
        return dest
    if kind not in BROKEN_KINDS:
        raise ValueError(f"unknown kind {kind!r}; choose from {', '.join(BROKEN_KINDS)}")
    valid = dest.with_name(dest.name + ".valid")
    write_synth_model(valid, spec or preset("tiny", "qwen3moe", seed=seed))
    data = valid.read_bytes()
    valid.unlink()
    if kind == "bad_magic":
        data = b"GGUX" + data[4:]
    elif kind == "bad_version":
        data = data[:4] + (99).to_bytes(4, "little") + data[8:]
    elif kind == "truncated_header":
        data = data[:200]
    elif kind == "truncated_data":
        data = data[: len(data) // 2]
    dest.write_bytes(data)
    return dest
