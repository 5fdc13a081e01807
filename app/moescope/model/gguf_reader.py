"""A :class:`gguf.GGUFReader` that bounds every count, length and offset it reads.

The stock reader trusts the file: a corrupt tensor count allocates Python objects until
memory runs out, an offset past the end reads garbage, a string array of a billion entries
takes minutes. :class:`StrictReader` checks each against the file's size and ggml's limits
first and raises :class:`Truncated` (the file ends early: often a download in progress) or
:class:`Corrupt` (the bytes cannot be a GGUF header), which ``gguf_info.py`` turns into one
clear line. :class:`HeaderReader` reads a header alone (the Hub's range requests), with the
tensor data elsewhere.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFEndian, GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

# Limits of the vendored llama.cpp (ggml.h) on the tensor table; the header numbers' bounds
# are in header_checks.py.
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NAME = 64  # GGML_MAX_NAME, with the terminating NUL
_TENSOR_ALIGNMENT = 32  # TENSOR_ALIGNMENT: where ggml's CPU buffers expect tensor data
# Not llama.cpp limits but sanity bounds well above any published model, so a corrupt
# count fails in one line instead of allocating Python objects until memory runs out.
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20
MAX_ALIGNMENT = 1 << 20
# Strings of an array are walked one by one (each carries its own length): a few seconds
# at most. The largest vocabularies and merge lists published have under a million.
MAX_STRINGS = 1 << 23
# The smallest encodings: a KV pair (key length, a one-byte key, type, a one-byte value)
# and a tensor info (name length, a one-byte name, n_dims, type, offset).
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8

class Truncated(Exception):
    """Raised from inside the reader when the header points past the end of the file."""

    def __init__(self, offset: int, size: int) -> None:
        super().__init__(offset, size)
        self.offset = offset
        self.size = size


class Corrupt(Exception):
    """Raised from inside the reader for a header value no GGUF file can have."""


class StrictReader(GGUFReader):
    """GGUFReader that fails fast on reads past the end of the file.

    The stock reader silently returns short arrays at the end of the memory map, which
    turns truncation into an obscure reshape error (or, for a corrupt array length, a very
    long loop). Checking every read turns both into one precise message.
    """

    def _get(self, offset: int, dtype: Any, count: int = 1,
             override_order: Any = None) -> np.ndarray:
        count = int(count)
        end = int(offset) + np.dtype(dtype).itemsize * count
        if end > len(self.data):
            raise Truncated(end, len(self.data))
        return super()._get(offset, dtype, count, override_order)

    def _get_field_parts(self, orig_offs: int, raw_type: int) -> tuple[int, list[Any],
                                                                      list[int], list[Any]]:
        """Keep arrays as one view instead of one numpy object per element.

        A 150k-token vocabulary plus its merges makes the stock reader build about half a
        million small arrays (seconds); MoEScope never needs the individual strings here.
        Numeric arrays become a single typed view; string arrays a single byte view.
        """
        if GGUFValueType(raw_type) != GGUFValueType.ARRAY:
            return super()._get_field_parts(orig_offs, raw_type)
        offs = orig_offs
        raw_itype = self._get(offs, np.uint32)
        offs += int(raw_itype.nbytes)
        alen = self._get(offs, np.uint64)
        offs += int(alen.nbytes)
        itype = GGUFValueType(int(raw_itype[0]))
        if itype == GGUFValueType.ARRAY:  # llama.cpp's gguf reader refuses them too
            raise Corrupt("an array of arrays, which GGUF does not allow")
        count = int(alen[0])
        types = [GGUFValueType.ARRAY, itype]
        if itype == GGUFValueType.STRING:
            fmt = "<Q" if self.endianess == GGUFEndian.LITTLE else ">Q"
            pos, size = offs, len(self.data)
            # each string needs at least its 8-byte length
            _check_count(count, "strings in one array", offs, size, 8, MAX_STRINGS)
            for _ in range(count):
                if pos + 8 > size:
                    raise Truncated(pos + 8, size)
                pos += 8 + struct.unpack_from(fmt, self.data, pos)[0]
            payload = self._get(offs, np.uint8, pos - offs)
            return pos - orig_offs, [raw_itype, alen, payload], [], types
        nptype = self.gguf_scalar_to_np[itype]
        values = self._get(offs, nptype, count)
        return offs + int(values.nbytes) - orig_offs, [raw_itype, alen, values], [2], types

    def _build_fields(self, offs: int, count: int) -> int:
        """Bound the KV count by the bytes that could hold it before looping over it."""
        _check_count(int(count), "metadata entries", int(offs), len(self.data),
                     _MIN_KV_BYTES, MAX_KV)
        return super()._build_fields(offs, count)

    def _build_tensor_info(self, offs: int, count: int) -> tuple[int, list[ReaderField]]:
        _check_alignment(self.fields.get("general.alignment"))
        _check_count(int(count), "tensors", int(offs), len(self.data),
                     _MIN_TENSOR_INFO_BYTES, MAX_TENSORS)
        return super()._build_tensor_info(offs, count)

    def _get_tensor_info_field(self, orig_offs: int) -> ReaderField:
        """One tensor info, with the checks llama.cpp's gguf reader makes: a name shorter
        than GGML_MAX_NAME, at most four dimensions, an element count that fits int64, a
        known type whose block size divides the row."""
        name_len = int(self._get(orig_offs, np.uint64)[0])
        if name_len >= _MAX_NAME:
            raise Corrupt(f"a tensor name is {name_len} bytes long; the limit is "
                           f"{_MAX_NAME - 1}")
        n_dims = int(self._get(orig_offs + 8 + name_len, np.uint32)[0])
        if n_dims > _MAX_DIMS:
            raise Corrupt(f"a tensor has {n_dims} dimensions; the limit is {_MAX_DIMS}")
        field = super()._get_tensor_info_field(orig_offs)
        name = field.name
        elements = 1
        for dim in (int(d) for d in field.parts[3]):
            if dim >= 1 << 63:
                raise Corrupt(f"tensor {name} has a negative dimension")
            elements *= dim
        if elements >= 1 << 63:
            raise Corrupt(f"tensor {name} has more elements than fit in 64 bits")
        raw_type = int(field.parts[4][0])
        try:
            qtype = GGMLQuantizationType(raw_type)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise Corrupt(f"tensor {name} has unknown ggml type {raw_type}") from None
        ne0 = int(field.parts[3][0]) if n_dims else 1
        if ne0 % block:
            raise Corrupt(f"tensor {name} has rows of {ne0} {qtype.name} values, not a "
                           f"multiple of its block size {block}")
        if elements // block * type_size >= 1 << 63:
            raise Corrupt(f"tensor {name} is larger than 2^63 bytes")
        if int(field.parts[5][0]) >= 1 << 62:  # the stock reader's sum would overflow
            raise Corrupt(f"tensor {name} has data offset {int(field.parts[5][0])}, "
                           f"beyond any file")
        return field


def _check_count(count: int, what: str, offs: int, size: int, min_bytes: int,
                 limit: int) -> None:
    """A count read from the header, bounded by ``limit`` and by the bytes left in the file
    (each item needs at least ``min_bytes``), before anything loops over it."""
    if count > limit:
        raise Corrupt(f"it declares {count} {what}; the limit is {limit}")
    if offs + count * min_bytes > size:
        raise Truncated(offs + count * min_bytes, size)


def _check_alignment(f: ReaderField | None) -> None:
    """``general.alignment``: a power of two that keeps tensor data where ggml's CPU
    buffers need it (llama.cpp cannot map the file otherwise), and not so large that the
    padding alone runs past any real file."""
    if f is None:
        return
    if f.types != [GGUFValueType.UINT32]:
        raise Corrupt("general.alignment must be a uint32")
    value = int(f.parts[-1][0])
    if value & (value - 1) or not _TENSOR_ALIGNMENT <= value <= MAX_ALIGNMENT:
        raise Corrupt(f"general.alignment is {value}; expected a power of two from "
                       f"{_TENSOR_ALIGNMENT} to {MAX_ALIGNMENT}")


class HeaderReader(StrictReader):
    """A reader over the first bytes of a file only (a header fetched with an HTTP range
    request): the tensor table is read, the tensor data is never touched.

    Each tensor's ``data`` becomes a zero-stride view of the right shape (no memory), so
    the stock code builds its tensor list unchanged while the bytes are elsewhere.
    """

    _tensor_data = False

    def _build_tensors(self, start_offs: int, fields: list[ReaderField]) -> None:
        self._tensor_data = True
        super()._build_tensors(start_offs, fields)

    def _get(self, offset: int, dtype: Any, count: int = 1,
             override_order: Any = None) -> np.ndarray:
        if self._tensor_data:
            return np.broadcast_to(np.zeros((), dtype=dtype), (int(count),))
        return super()._get(offset, dtype, count, override_order)


