"""Valid models with hostile header values: inputs for the "bounded before used" tests.

A fuzzer that mutates bytes finds header values that parse but that llama.cpp cannot take
(a block count of 2^32-1, more routed experts than experts, a NaN epsilon). Tests need each
such file on purpose, so :func:`rewrite_gguf` copies a small real model and changes its
metadata and tensor names, keeping every tensor's bytes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

DROP = object()
"""A value in ``set_keys`` that removes the key."""


def rewrite_gguf(src: str | os.PathLike[str], dest: str | os.PathLike[str], *,
                 set_keys: Mapping[str, Any] | None = None,
                 rename_tensors: Mapping[str, str] | None = None) -> Path:
    """Copy the GGUF ``src`` to ``dest`` with some KV pairs changed, added or dropped.

    ``set_keys`` maps a key to a new value: ``(GGUFValueType, value)`` to give the type
    (e.g. ``(GGUFValueType.UINT32, 2**32 - 1)``, or ``(GGUFValueType.ARRAY, [..],
    GGUFValueType.INT32)`` for an array), a bare value to keep the key's current type, or
    :data:`DROP`. Tensor data is written at the default 32-byte alignment whatever a new
    ``general.alignment`` says, as a corrupted header would leave it.
    """
    changes = dict(set_keys or {})
    renames = dict(rename_tensors or {})
    reader = GGUFReader(src)
    arch_field = reader.fields["general.architecture"]
    arch = str(arch_field.contents())
    out = Path(dest)
    writer = GGUFWriter(out, arch=arch)
    try:
        for key, field in reader.fields.items():
            if key.startswith("GGUF.") or key == "general.architecture":
                continue
            if key in changes:
                change = changes.pop(key)
                if change is DROP:
                    continue
                if not isinstance(change, tuple):
                    sub = field.types[1] if len(field.types) > 1 else None
                    change = (field.types[0], change, sub)
                _add(writer, key, change)
                continue
            sub = field.types[1] if len(field.types) > 1 else None
            writer.add_key_value(key, field.contents(), field.types[0], sub)
        for key, change in changes.items():
            if change is not DROP:
                _add(writer, key, change)
        for t in reader.tensors:
            writer.add_tensor_info(renames.get(t.name, t.name),
                                   tuple(reversed([int(d) for d in t.shape])),
                                   np.dtype(np.float32), int(t.n_bytes),
                                   raw_dtype=t.tensor_type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        assert writer.fout is not None
        fout = writer.fout[0]
        for t in reader.tensors:
            writer.write_padding(fout, fout.tell())
            fout.write(np.asarray(t.data).tobytes())
            writer.write_padding(fout, int(t.n_bytes))
    finally:
        writer.close()
    return out


def _add(writer: GGUFWriter, key: str, change: tuple[Any, ...]) -> None:
    vtype, value = change[0], change[1]
    sub = change[2] if len(change) > 2 else None
    if vtype == GGUFValueType.ARRAY and sub is None:
        raise ValueError(f"{key}: an array value needs its element type")
    writer.add_key_value(key, value, vtype, sub)
