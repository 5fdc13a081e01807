"""What a GGUF file says about its experts, read from the header alone.

The expert cache is sized in *experts per layer*, so before loading anything MoEScope needs
to know which layers route to experts, how many experts each has, how many are routed per
token, and how many bytes one expert occupies in each layer (the unit of every copy the
cache makes). All of that is in the GGUF header and tensor table; the multi-gigabyte tensor
data is only memory-mapped by :class:`gguf.GGUFReader`, never read, so ``moescope info``
answers in a fraction of a second even for an 80B model.

A model split into several files (``PREFIX-00001-of-00003.gguf`` …, llama.cpp's
``gguf-split`` naming, as 80B models are published) is read as one: any part may be given,
the metadata comes from the first, the tensors from all, and a missing part is named.

Expert tensors are recognized by llama.cpp's names: ``blk.N.ffn_{gate,up,down,gate_up}_exps``
with a ``.weight`` and optionally a per-expert ``.bias`` (gpt-oss) or ``.scale``. Their last
ggml dimension is the expert index, so one expert's slice of each is a contiguous byte range
of ``n_bytes / n_expert`` bytes.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGML_QUANT_SIZES,
    GGMLQuantizationType,
    GGUFEndian,
    GGUFReader,
    GGUFValueType,
)
from gguf.gguf_reader import ReaderField

from moescope.util.errors import ModelFileNotFoundError, ModelFormatError, NotMoEError

GGUF_MAGIC = b"GGUF"
_MIN_HEADER_BYTES = 24  # magic, version, tensor count, kv count
_SUPPORTED_VERSIONS = (2, 3)
PARTIAL_SUFFIXES = (".incomplete", ".part", ".partial")
"""Names of files still being downloaded or written: never opened as a model."""

# Limits of the vendored llama.cpp (llama-hparams.h, ggml.h): a header value beyond them
# makes its loader fail an internal check (the process aborts), so they are refused here.
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
_MAX_DIMS = 4  # GGML_MAX_DIMS
_MAX_NAME = 64  # GGML_MAX_NAME, with the terminating NUL
_TENSOR_ALIGNMENT = 32  # TENSOR_ALIGNMENT: where ggml's CPU buffers expect tensor data
# Not llama.cpp limits but sanity bounds well above any published model, so a corrupt
# count fails in one line instead of allocating Python objects until memory runs out.
MAX_TENSORS = 1 << 20
MAX_KV = 1 << 20
# llama-cpp-python allocates a buffer of context_length tokens for every tokenize call:
# 2^31-1 is 8 GiB per call. 2^24 is 1.6x the longest published context (10M tokens).
MAX_CONTEXT = 1 << 24
MAX_EMBD = 1 << 20
MAX_HEADS = 1 << 16
MAX_VOCAB = (1 << 31) - 1  # token ids are int32
MAX_ALIGNMENT = 1 << 20
# Strings of an array are walked one by one (each carries its own length): a few seconds
# at most. The largest vocabularies and merge lists published have under a million.
MAX_STRINGS = 1 << 23
# The smallest encodings: a KV pair (key length, a one-byte key, type, a one-byte value)
# and a tensor info (name length, a one-byte name, n_dims, type, offset).
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 4 + 8
_INT_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
_FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})

_EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate_up|gate|up|down)_exps\.(weight|bias|scale)$")
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.")
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


class _Truncated(Exception):
    """Raised from inside the reader when the header points past the end of the file."""

    def __init__(self, offset: int, size: int) -> None:
        super().__init__(offset, size)
        self.offset = offset
        self.size = size


class _Corrupt(Exception):
    """Raised from inside the reader for a header value no GGUF file can have."""


class _StrictReader(GGUFReader):
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
            raise _Truncated(end, len(self.data))
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
            raise _Corrupt("an array of arrays, which GGUF does not allow")
        count = int(alen[0])
        types = [GGUFValueType.ARRAY, itype]
        if itype == GGUFValueType.STRING:
            fmt = "<Q" if self.endianess == GGUFEndian.LITTLE else ">Q"
            pos, size = offs, len(self.data)
            # each string needs at least its 8-byte length
            _check_count(count, "strings in one array", offs, size, 8, MAX_STRINGS)
            for _ in range(count):
                if pos + 8 > size:
                    raise _Truncated(pos + 8, size)
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
            raise _Corrupt(f"a tensor name is {name_len} bytes long; the limit is "
                           f"{_MAX_NAME - 1}")
        n_dims = int(self._get(orig_offs + 8 + name_len, np.uint32)[0])
        if n_dims > _MAX_DIMS:
            raise _Corrupt(f"a tensor has {n_dims} dimensions; the limit is {_MAX_DIMS}")
        field = super()._get_tensor_info_field(orig_offs)
        name = field.name
        elements = 1
        for dim in (int(d) for d in field.parts[3]):
            if dim >= 1 << 63:
                raise _Corrupt(f"tensor {name} has a negative dimension")
            elements *= dim
        if elements >= 1 << 63:
            raise _Corrupt(f"tensor {name} has more elements than fit in 64 bits")
        raw_type = int(field.parts[4][0])
        try:
            qtype = GGMLQuantizationType(raw_type)
            block, type_size = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise _Corrupt(f"tensor {name} has unknown ggml type {raw_type}") from None
        ne0 = int(field.parts[3][0]) if n_dims else 1
        if ne0 % block:
            raise _Corrupt(f"tensor {name} has rows of {ne0} {qtype.name} values, not a "
                           f"multiple of its block size {block}")
        if elements // block * type_size >= 1 << 63:
            raise _Corrupt(f"tensor {name} is larger than 2^63 bytes")
        if int(field.parts[5][0]) >= 1 << 62:  # the stock reader's sum would overflow
            raise _Corrupt(f"tensor {name} has data offset {int(field.parts[5][0])}, "
                           f"beyond any file")
        return field


def _check_count(count: int, what: str, offs: int, size: int, min_bytes: int,
                 limit: int) -> None:
    """A count read from the header, bounded by ``limit`` and by the bytes left in the file
    (each item needs at least ``min_bytes``), before anything loops over it."""
    if count > limit:
        raise _Corrupt(f"it declares {count} {what}; the limit is {limit}")
    if offs + count * min_bytes > size:
        raise _Truncated(offs + count * min_bytes, size)


def _check_alignment(f: ReaderField | None) -> None:
    """``general.alignment``: a power of two that keeps tensor data where ggml's CPU
    buffers need it (llama.cpp cannot map the file otherwise), and not so large that the
    padding alone runs past any real file."""
    if f is None:
        return
    if f.types != [GGUFValueType.UINT32]:
        raise _Corrupt("general.alignment must be a uint32")
    value = int(f.parts[-1][0])
    if value & (value - 1) or not _TENSOR_ALIGNMENT <= value <= MAX_ALIGNMENT:
        raise _Corrupt(f"general.alignment is {value}; expected a power of two from "
                       f"{_TENSOR_ALIGNMENT} to {MAX_ALIGNMENT}")


class _HeaderReader(_StrictReader):
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


class HeaderIncomplete(ModelFormatError):
    """A header prefix ended before the header did: read ``needed`` bytes of part ``part``
    (at least) and try again."""

    def __init__(self, name: str, part: int, needed: int) -> None:
        super().__init__(f"{name}: the header needs at least {needed} bytes")
        self.part = part
        self.needed = needed


@dataclass(frozen=True)
class ExpertTensor:
    """One stacked expert tensor of a layer (all experts of that layer in one tensor)."""

    name: str
    layer: int
    kind: str  # "gate", "up", "down" or "gate_up"
    part: str  # "weight", "bias" or "scale"
    ggml_type: str  # lower-case ggml type name, e.g. "q8_0"
    shape: tuple[int, ...]  # ggml order: ne0 first, the expert index last
    n_bytes: int
    bytes_per_expert: int
    data_offset: int  # absolute file offset of expert 0's bytes
    split: int = 0  # index of the file holding it (a split model), else 0

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name, "layer": self.layer, "kind": self.kind, "part": self.part,
            "ggml_type": self.ggml_type, "shape": list(self.shape), "n_bytes": self.n_bytes,
            "bytes_per_expert": self.bytes_per_expert, "data_offset": self.data_offset,
            "split": self.split,
        }


@dataclass(frozen=True)
class ModelInfo:
    """Header facts about a GGUF model that the expert cache and its budget depend on."""

    path: Path
    """The file llama.cpp opens: the first part of a split model."""
    file_name: str
    file_size: int
    """Bytes of all the model's files."""
    architecture: str
    name: str | None
    n_layers: int
    n_embd: int | None
    context_length: int | None
    n_expert: int
    top_k: int
    n_expert_shared: int
    moe_layers: tuple[int, ...]
    dense_layers: tuple[int, ...]
    expert_tensors: Mapping[int, tuple[ExpertTensor, ...]]
    bytes_per_expert: Mapping[int, int]
    total_expert_bytes: int
    non_expert_bytes: int
    n_tensors: int
    # sha256 of the file's first data_offset bytes: magic, version, counts, every KV pair,
    # every tensor info and the alignment padding. Identifies the model in trace headers
    # without hashing gigabytes of weights.
    metadata_sha256: str
    metadata: Mapping[str, Any] = field(default_factory=dict, repr=False)
    parts: tuple[Path, ...] = ()
    """Every file of a split model, in order (empty for a single file)."""

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0 and bool(self.moe_layers)

    @property
    def max_bytes_per_expert(self) -> int:
        """Bytes of the largest expert across layers: the size one cache slot must hold."""
        return max(self.bytes_per_expert.values(), default=0)

    @property
    def uniform_experts(self) -> bool:
        """True when every MoE layer has the same expert tensors, types and sizes."""
        layouts = {
            tuple((t.kind, t.part, t.ggml_type, t.bytes_per_expert) for t in tensors)
            for tensors in self.expert_tensors.values()
        }
        return len(layouts) <= 1

    def expert_bytes_by_type(self, layer: int | None = None) -> dict[str, int]:
        """Bytes of one expert in ``layer`` (default: the first MoE layer) per ggml type."""
        if not self.moe_layers:
            return {}
        tensors = self.expert_tensors[self.moe_layers[0] if layer is None else layer]
        out: dict[str, int] = {}
        for t in tensors:
            out[t.ggml_type] = out.get(t.ggml_type, 0) + t.bytes_per_expert
        return out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready view (without the raw metadata, which may hold a 150k-token vocab)."""
        return {
            "path": str(self.path), "file_name": self.file_name, "file_size": self.file_size,
            "architecture": self.architecture, "name": self.name, "n_layers": self.n_layers,
            "n_embd": self.n_embd, "context_length": self.context_length,
            "n_expert": self.n_expert, "top_k": self.top_k,
            "n_expert_shared": self.n_expert_shared, "moe_layers": list(self.moe_layers),
            "dense_layers": list(self.dense_layers),
            "bytes_per_expert": {str(k): v for k, v in self.bytes_per_expert.items()},
            "expert_tensors": {
                str(k): [t.to_dict() for t in v] for k, v in self.expert_tensors.items()
            },
            "total_expert_bytes": self.total_expert_bytes,
            "non_expert_bytes": self.non_expert_bytes, "n_tensors": self.n_tensors,
            "metadata_sha256": self.metadata_sha256,
            "parts": [str(x) for x in self.parts],
        }


def read_model_info(path: str | os.PathLike[str], *, require_moe: bool = True) -> ModelInfo:
    """Read a GGUF file's header and describe its experts.

    Raises :class:`ModelFileNotFoundError` for a missing/unreadable path,
    :class:`ModelFormatError` for anything that is not a complete GGUF file, and (unless
    ``require_moe`` is false) :class:`NotMoEError` for a model without routed experts.
    """
    p = Path(path)
    files = [_open(p)]
    count = _int(files[0][2], "split.count", 0) or 0
    if count > 1:
        parts = split_paths(p, count)
        if parts[0] != p:  # a later part was given: the metadata is in the first
            files = [_open(parts[0])]
        for index, part in enumerate(parts[1:], start=1):
            if not part.exists():
                raise ModelFileNotFoundError(
                    f"{p.name}: part {index + 1} of {count} of this split model is missing "
                    f"({part.name} should be next to it; incomplete download?)")
            files.append(_open(part))
            no = _int(files[-1][2], "split.no", -1)
            if no != index:
                raise ModelFormatError(f"{part.name}: says it is split part {no}, expected "
                                       f"{index} (parts of different models mixed?)")
    try:
        return _describe(files, require_moe)
    finally:
        files.clear()


def read_header_info(parts: Sequence[tuple[str, int, bytes]], *,
                     require_moe: bool = True) -> ModelInfo:
    """The :class:`ModelInfo` of a model of which only the first bytes of each file are
    at hand: ``parts`` holds ``(file name, full file size, first bytes)`` per file, in
    split order (one entry for a single file).

    What a remote file's fit needs before any download. Raises :class:`HeaderIncomplete`
    when a prefix is shorter than its header (fetch more and call again), and the same
    errors as :func:`read_model_info` otherwise.
    """
    files = []
    for index, (name, size, data) in enumerate(parts):
        _check_head(name, size, data[:8])
        with tempfile.TemporaryFile() as f:  # np.memmap needs a file: an unnamed one
            f.write(data)
            f.flush()
            try:
                reader = _HeaderReader(f, "r")
            except _Truncated as err:
                if err.offset <= size:
                    raise HeaderIncomplete(name, index, err.offset) from None
                raise ModelFormatError(
                    f"{name}: file is truncated: it needs at least {err.offset} bytes but "
                    f"has {size}") from None
            except _Corrupt as err:
                raise ModelFormatError(f"{name}: corrupt GGUF header ({err})") from None
            except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError,
                    TypeError, MemoryError) as err:
                raise ModelFormatError(f"{name}: corrupt GGUF header ({_reason(err)})"
                                       ) from None
        if reader.data_offset > len(data):  # the padding before the data is hashed too
            raise HeaderIncomplete(name, index, int(reader.data_offset))
        files.append((Path(name), size, reader))
        no = _int(reader, "split.no", 0)
        if len(parts) > 1 and no != index:
            raise ModelFormatError(f"{name}: says it is split part {no}, expected {index}")
    count = _int(files[0][2], "split.count", 0) or 0
    if max(count, 1) != len(parts):
        raise ModelFormatError(f"{parts[0][0]}: is split in {count or 1} files, "
                               f"{len(parts)} given")
    return _describe(files, require_moe)


def split_paths(path: str | os.PathLike[str], count: int) -> list[Path]:
    """The files of a model split in ``count`` parts, one of which is ``path``
    (llama.cpp's ``llama_split_path`` naming: ``PREFIX-00001-of-00003.gguf``)."""
    p = Path(path)
    m = _SPLIT_NAME.match(p.name)
    if m is None or int(m["count"]) != count:
        raise ModelFormatError(
            f"{p.name}: is part of a model split in {count} files, but its name does not "
            f"follow llama.cpp's PREFIX-00001-of-{count:05d}.gguf pattern (rename the parts)")
    return [p.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf")
            for i in range(1, count + 1)]


def _open(p: Path) -> tuple[Path, int, GGUFReader]:
    """``(path, size, reader)``, or one clear sentence on why the file cannot be read."""
    file_size = _check_file(p)
    try:
        return p, file_size, _StrictReader(p, "r")
    except _Truncated as err:
        raise ModelFormatError(
            f"{p.name}: file is truncated: it is {_size_text(err.size)} but its header "
            f"needs at least {_size_text(err.offset)} (incomplete download?)"
        ) from None
    except _Corrupt as err:
        raise ModelFormatError(f"{p.name}: corrupt GGUF header ({err})") from None
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError,
            TypeError, MemoryError) as err:
        raise ModelFormatError(f"{p.name}: corrupt GGUF header ({_reason(err)})") from None
    except OSError as err:
        raise ModelFileNotFoundError(f"{p.name}: cannot read file ({err.strerror})") from None


def _size_text(n: int) -> str:
    """``8,019,136 bytes (7.6 MiB)``: exact for comparing, rounded for reading."""
    if n < 1024:
        return f"{n:,} bytes"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n:,} bytes ({n / scale:.1f} {unit})"
    return f"{n:,} bytes"


def _bytes_text(head: bytes) -> str:
    """The first bytes as a person reads them: ``"hell"`` when printable, else hex."""
    if head and all(32 <= b < 127 for b in head):
        return f'"{head.decode("ascii")}"'
    return "bytes " + " ".join(f"{b:02x}" for b in head) if head else "nothing"


def _check_file(p: Path) -> int:
    """Fail with one clear sentence before handing the file to the GGUF parser."""
    if p.name.endswith(PARTIAL_SUFFIXES):
        raise ModelFormatError(f"{p.name}: is an unfinished download, not a model (finish "
                               f"it with Get models or moescope pull)")
    try:
        st = p.stat()
    except FileNotFoundError:
        raise ModelFileNotFoundError(f"{p}: no such file") from None
    except OSError as err:
        raise ModelFileNotFoundError(f"{p}: cannot access file ({err.strerror})") from None
    if p.is_dir():
        raise ModelFormatError(f"{p}: is a directory, not a GGUF model file")
    if st.st_size == 0:
        raise ModelFormatError(f"{p.name}: file is empty, not a GGUF model")
    try:
        with p.open("rb") as f:
            head = f.read(8)
    except OSError as err:
        raise ModelFileNotFoundError(f"{p.name}: cannot read file ({err.strerror})") from None
    _check_head(p.name, st.st_size, head)
    return st.st_size


def _check_head(name: str, size: int, head: bytes) -> None:
    """The magic, the size and the version, from a file's first 8 bytes."""
    if head[:4] != GGUF_MAGIC:
        raise ModelFormatError(
            f"{name}: not a GGUF model file (it starts with {_bytes_text(head[:4])} "
            f"where a GGUF file starts with \"GGUF\")"
        )
    if size < _MIN_HEADER_BYTES:
        raise ModelFormatError(f"{name}: file is truncated: it is {_size_text(size)}, "
                               f"less than a GGUF header")
    version = int.from_bytes(head[4:8], "little")
    swapped = int.from_bytes(head[4:8], "big")  # a big-endian GGUF
    if version not in _SUPPORTED_VERSIONS and swapped not in _SUPPORTED_VERSIONS:
        raise ModelFormatError(
            f"{name}: unsupported GGUF version {version} (supported: "
            f"{', '.join(map(str, _SUPPORTED_VERSIONS))})"
        )


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text[:160]


def _scalar(reader: GGUFReader, key: str) -> Any:
    """A scalar/string KV value, the max of an integer array (per-layer values), or None."""
    f = reader.fields.get(key)
    if f is None or not f.types:
        return None
    main = f.types[0]
    if main == GGUFValueType.STRING:
        return bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
    if main == GGUFValueType.ARRAY:
        if len(f.types) < 2 or f.types[1] == GGUFValueType.STRING or not f.data:
            return None
        values = np.concatenate([np.asarray(f.parts[i]).ravel() for i in f.data])
        return values.max().item() if values.size else None
    return f.parts[f.data[0]][0].item()


def _int(reader: GGUFReader, key: str, default: int | None = None) -> int | None:
    """An integer KV value (the max of a per-layer array), or ``default`` when absent."""
    values = _numbers(reader, key, integer=True)
    if values is None or not values.size:
        return default
    return int(values.max())


def _numbers(reader: GGUFReader, key: str, *, integer: bool) -> np.ndarray | None:
    """All values of a numeric KV pair (one for a scalar, each layer's for an array), or
    None when absent. A value of the wrong kind is one clear error, as in llama.cpp, whose
    loader requires each key's exact type."""
    f = reader.fields.get(key)
    if f is None or not f.types:
        return None
    kind = f.types[-1] if f.types[0] == GGUFValueType.ARRAY else f.types[0]
    wanted = _INT_TYPES if integer else _INT_TYPES | _FLOAT_TYPES
    if kind not in wanted or (f.types[0] == GGUFValueType.ARRAY and len(f.types) < 2):
        raise ModelFormatError(
            f"metadata key {key} should be {'an integer' if integer else 'a number'}, "
            f"but it is {'an array of ' if f.types[0] == GGUFValueType.ARRAY else ''}"
            f"{kind.name.lower()}")
    parts = [np.asarray(f.parts[i]).ravel() for i in f.data]
    values = np.concatenate(parts) if parts else np.zeros(0)
    # int64 keeps every uint32/int32 exact; uint64 values of 2^63 and above become
    # negative, which every bound below refuses as they should be.
    return values.astype(np.float64 if kind in _FLOAT_TYPES else np.int64)


def _check_header_numbers(name: str, reader: GGUFReader, arch: str) -> None:
    """Refuse the hyperparameters the vendored llama.cpp cannot take, with the reason.

    Its loader checks many of them with GGML_ASSERT, which aborts the process (a block
    count above LLAMA_MAX_LAYERS, more routed experts than experts, a negative or NaN
    norm epsilon reaching ggml's norm kernels); others reach a division or a loop sized by
    them. Every count, size and id of the architecture's header is therefore bounded here,
    before llama.cpp or this module allocates or loops over anything.
    """

    def ints(key: str, low: int, high: int, what: str, *, per_layer: bool = False,
             required: bool = False) -> np.ndarray | None:
        values = _numbers(reader, key, integer=True)
        if values is None:
            if required:
                raise ModelFormatError(f"{name}: metadata has no {key} ({what})")
            return None
        if reader.fields[key].types[0] == GGUFValueType.ARRAY and (
                not per_layer or values.size != n_layers):
            expected = f"{n_layers} values, one per layer" if per_layer else "one value"
            raise ModelFormatError(f"{name}: {key} is an array of {values.size} values, "
                                   f"expected {expected}")
        bad = values[(values < low) | (values > high)]
        if bad.size:
            raise ModelFormatError(f"{name}: {key} ({what}) is {int(bad[0])}, expected "
                                   f"{low}..{high}")
        return values

    n_layers = int(ints(f"{arch}.block_count", 1, MAX_LAYERS, "the number of layers",
                        required=True).max())
    ints(f"{arch}.nextn_predict_layers", 0, n_layers, "layers for multi-token prediction")
    n_expert = int(_max(ints(f"{arch}.expert_count", 0, MAX_EXPERTS, "experts per layer")))
    used = ints(f"{arch}.expert_used_count", 0, MAX_EXPERTS, "experts routed per token",
                per_layer=True)
    top_k = int(_max(used))
    if n_expert and not 1 <= top_k <= n_expert:
        raise ModelFormatError(f"{name}: {arch}.expert_used_count is {top_k}, expected "
                               f"1..{n_expert} (the model has {n_expert} experts per layer)")
    if not n_expert and top_k:
        raise ModelFormatError(f"{name}: {arch}.expert_used_count is {top_k}, but the model "
                               f"has no {arch}.expert_count")
    groups = int(_max(ints(f"{arch}.expert_group_count", 0, MAX_EXPERTS, "expert groups")))
    group_used = int(_max(ints(f"{arch}.expert_group_used_count", 0, MAX_EXPERTS,
                               "expert groups used")))
    if groups and (groups >= max(n_expert, 1) or (groups > 1 and (
            n_expert % groups or not 0 < group_used < groups))):
        raise ModelFormatError(
            f"{name}: {arch}.expert_group_count {groups} and expert_group_used_count "
            f"{group_used} do not divide {n_expert} experts (llama.cpp needs fewer groups "
            f"than experts, a divisor of the expert count, and 0 < used < groups)")
    ints(f"{arch}.expert_shared_count", 0, MAX_EXPERTS, "shared experts")
    ints(f"{arch}.context_length", 1, MAX_CONTEXT, "the training context in tokens")
    ints(f"{arch}.embedding_length", 1, MAX_EMBD, "the hidden size")
    for key in ("feed_forward_length", "expert_feed_forward_length",
                "expert_shared_feed_forward_length"):
        ints(f"{arch}.{key}", 0, MAX_EMBD * 64, "a feed-forward width", per_layer=True)
    heads = ints(f"{arch}.attention.head_count", 0, MAX_HEADS, "attention heads",
                 per_layer=True)
    kv_heads = ints(f"{arch}.attention.head_count_kv", 0, MAX_HEADS, "key/value heads",
                    per_layer=True)
    if heads is not None and kv_heads is not None:
        for h, kv in zip(np.broadcast_to(heads, n_layers), np.broadcast_to(kv_heads, n_layers),
                         strict=True):
            if kv and h % kv:
                raise ModelFormatError(
                    f"{name}: {int(h)} attention heads cannot share {int(kv)} key/value "
                    f"heads evenly ({arch}.attention.head_count_kv)")
    for key in ("attention.key_length", "attention.value_length", "rope.dimension_count",
                "attention.key_length_mla", "attention.value_length_mla",
                "attention.q_lora_rank", "attention.kv_lora_rank",
                "attention.sliding_window", "ssm.conv_kernel", "ssm.inner_size",
                "ssm.state_size", "ssm.time_step_rank", "ssm.group_count"):
        ints(f"{arch}.{key}", 0, MAX_EMBD, "a size")
    # llama.cpp's MoE graph aborts on a gating function outside its enum; deepseek2 and
    # glm4moe read 0 (none) as their default, the others have no default for it
    ints(f"{arch}.expert_gating_func", 0 if arch in ("deepseek2", "glm4moe") else 1, 4,
         "the expert gating function: 1 softmax, 2 sigmoid, 3 softmax of the weights, "
         "4 sqrt-softplus")
    ints(f"{arch}.leading_dense_block_count", 0, n_layers, "leading dense layers")
    ints(f"{arch}.full_attention_interval", 1, n_layers, "layers per full-attention layer")
    ints(f"{arch}.vocab_size", 1, MAX_VOCAB, "the vocabulary size")
    for key, f in reader.fields.items():
        if not key.startswith(f"{arch}.") or f.types[-1] not in _FLOAT_TYPES:
            continue
        values = _numbers(reader, key, integer=False)
        if values is None or not values.size:
            continue
        if not np.isfinite(values).all():
            raise ModelFormatError(f"{name}: {key} is {values[~np.isfinite(values)][0]:g}, "
                                   f"expected a finite number")
        if key.endswith(("_eps", "epsilon")) and (values < 0).any():
            raise ModelFormatError(f"{name}: {key} is {values.min():g}, expected a small "
                                   f"number >= 0 (a normalization epsilon)")
    if arch in _ATTENTION_ARCHES:
        _check_attention(name, reader, arch, heads)
    if arch == "deepseek2":
        _check_mla_latent(name, reader, arch)
    tokens = reader.fields.get("tokenizer.ggml.tokens")
    if tokens is not None and tokens.types[0] == GGUFValueType.ARRAY:
        n_vocab = _array_len(tokens)
        if not 1 <= n_vocab <= MAX_VOCAB:
            raise ModelFormatError(f"{name}: the vocabulary has {n_vocab} tokens, expected "
                                   f"1..{MAX_VOCAB}")


def _check_mla_latent(name: str, reader: GGUFReader, arch: str) -> None:
    """deepseek2 with MLA heads (``key_length_mla``) caches one shared latent key/value
    head of ``kv_lora_rank + rope.dimension_count`` values; other sizes pass the tensor
    shape checks and abort the first decode (``GGML_ASSERT(a->ne[0] == b->ne[0])``).
    Fuzzing found a file whose ``head_count_kv`` key was misspelled by a flipped byte:
    llama.cpp's default, the head count, gave the cache the wrong row size."""
    heads = _int(reader, f"{arch}.attention.head_count", 0) or 0
    if heads <= 0 or not (_int(reader, f"{arch}.attention.key_length_mla", 0)
                          and _int(reader, f"{arch}.attention.value_length_mla", 0)):
        return
    kv_heads = _numbers(reader, f"{arch}.attention.head_count_kv", integer=True)
    if kv_heads is None or (kv_heads != 1).any():
        shown = heads if kv_heads is None else int(kv_heads[kv_heads != 1][0])
        raise ModelFormatError(
            f"{name}: {arch}.attention.head_count_kv is {shown}"
            f"{' (absent: the head count)' if kv_heads is None else ''}, expected 1: "
            f"attention with key_length_mla shares one latent key/value head")
    n_embd = _int(reader, f"{arch}.embedding_length", 0) or 0
    head_k = _int(reader, f"{arch}.attention.key_length", n_embd // heads) or 0
    n_rot = _int(reader, f"{arch}.rope.dimension_count", head_k) or 0
    rank = _int(reader, f"{arch}.attention.kv_lora_rank")
    if rank is not None and head_k != rank + n_rot:
        raise ModelFormatError(
            f"{name}: {arch}.attention.key_length is {head_k}, expected kv_lora_rank + "
            f"rope.dimension_count = {rank + n_rot} (the latent key of MLA attention)")


_ATTENTION_ARCHES = ("qwen3moe", "olmoe", "llama", "qwen3", "gpt-oss", "deepseek2", "qwen3next")


def _check_attention(name: str, reader: GGUFReader, arch: str,
                     heads: np.ndarray | None) -> None:
    """Head sizes that no tensor shape reveals but that llama.cpp's graph for ``arch``
    asserts on (``models/<arch>.cpp``, ggml's rope kernel), derived as its loader does."""
    if heads is None:  # llama.cpp then expects no attention tensors: a clean error
        return
    n_head = _max(heads)
    if n_head < 1:
        raise ModelFormatError(f"{name}: {arch}.attention.head_count is 0; {arch} layers "
                               f"have attention heads")
    n_embd = _int(reader, f"{arch}.embedding_length", 0) or 0
    head_k = _int(reader, f"{arch}.attention.key_length", n_embd // n_head) or 0
    head_v = _int(reader, f"{arch}.attention.value_length", n_embd // n_head) or 0
    n_rot = _int(reader, f"{arch}.rope.dimension_count", head_k) or 0
    rope_room = head_k
    if arch == "deepseek2":  # MLA: the rotated part is taken off the key head
        rope_room = (_int(reader, f"{arch}.attention.key_length_mla", head_k) or 0) - 1
    why = ""
    if n_rot < 2 or n_rot % 2 or n_rot > rope_room:
        why = (f"{arch}.rope.dimension_count is {n_rot}, expected an even number from 2 to "
               f"{rope_room}" + (" (below the MLA key length)" if arch == "deepseek2" else
                                 " (the key head size)"))
    elif (arch in ("qwen3moe", "olmoe", "llama", "qwen3", "gpt-oss")
          and not head_k == head_v == n_rot):
        why = (f"key head size {head_k}, value head size {head_v} and rope dimensions "
               f"{n_rot} differ; {arch} needs them equal")
    elif arch == "olmoe" and head_k * n_head != n_embd:  # its query weight is n_embd wide
        why = (f"{n_head} heads of {head_k} do not make up the hidden size {n_embd}, as "
               f"{arch} needs")
    elif arch == "qwen3next":
        groups = _int(reader, f"{arch}.ssm.group_count", 0) or 0
        rank = _int(reader, f"{arch}.ssm.time_step_rank", 0) or 0
        inner = _int(reader, f"{arch}.ssm.inner_size", 0) or 0
        state = _int(reader, f"{arch}.ssm.state_size", 0) or 0
        if head_k != head_v:
            why = f"key head size {head_k} and value head size {head_v} differ"
        elif groups < 1 or rank % groups:
            why = (f"{arch}.ssm.time_step_rank {rank} is not a multiple of "
                   f"{arch}.ssm.group_count {groups}")
        elif inner != state * rank:  # the graph's value head size is inner / rank
            why = (f"{arch}.ssm.inner_size is {inner}, expected ssm.state_size x "
                   f"ssm.time_step_rank = {state * rank}")
    if why:
        raise ModelFormatError(f"{name}: {why}")


def _max(values: np.ndarray | None) -> int:
    return int(values.max()) if values is not None and values.size else 0


def _array_len(f: ReaderField) -> int:
    """Element count of an array field (parts: key len, key, type, item type, count, ...)."""
    return int(f.parts[4][0])


def _small_metadata(reader: GGUFReader) -> dict[str, Any]:
    """Scalar KV pairs only; arrays (vocabularies, merges) are summarized by their length."""
    out: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or not f.types:
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            out[key] = f"[{_array_len(f)} items]"
        else:
            out[key] = _scalar(reader, key)
    return out


def _describe(files: list[tuple[Path, int, GGUFReader]], require_moe: bool) -> ModelInfo:
    p, _, reader = files[0]
    arch = _scalar(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFormatError(f"{p.name}: GGUF file has no general.architecture")
    _check_header_numbers(p.name, reader, arch)
    n_layers = _int(reader, f"{arch}.block_count") or 0
    n_expert = _int(reader, f"{arch}.expert_count", 0) or 0
    top_k = _int(reader, f"{arch}.expert_used_count", 0) or 0

    expert_tensors: dict[int, list[ExpertTensor]] = {}
    block_layers: set[int] = set()
    total_bytes = 0
    expert_bytes = 0
    tensors = [(index, path, size, t) for index, (path, size, r) in enumerate(files)
               for t in r.tensors]
    for split, path, file_size, t in tensors:
        n_bytes = int(t.n_bytes)
        end = int(t.data_offset) + n_bytes
        if end > file_size:
            raise ModelFormatError(
                f"{path.name}: file is truncated (tensor {t.name} ends at byte {end}, "
                f"the file has {file_size})"
            )
        total_bytes += n_bytes
        if m := _BLOCK_TENSOR.match(t.name):
            if int(m.group(1)) >= n_layers:
                raise ModelFormatError(
                    f"{path.name}: tensor {t.name} belongs to layer {int(m.group(1))}, but "
                    f"{arch}.block_count says the model has {n_layers} layers (0..{n_layers - 1})")
            block_layers.add(int(m.group(1)))
        m = _EXPERT_TENSOR.match(t.name)
        if m is None:
            continue
        layer, kind, part = int(m.group(1)), m.group(2), m.group(3)
        shape = tuple(int(d) for d in t.shape)
        if n_expert <= 0:
            raise ModelFormatError(
                f"{p.name}: has expert tensors ({t.name}) but no {arch}.expert_count"
            )
        if not shape or shape[-1] != n_expert or n_bytes % n_expert:  # () has 0 dims
            raise ModelFormatError(
                f"{p.name}: tensor {t.name} has shape {list(shape)}, which does not hold "
                f"{n_expert} experts"
            )
        expert_tensors.setdefault(layer, []).append(ExpertTensor(
            name=t.name, layer=layer, kind=kind, part=part,
            ggml_type=GGMLQuantizationType(t.tensor_type).name.lower(), shape=shape,
            n_bytes=n_bytes, bytes_per_expert=n_bytes // n_expert,
            data_offset=int(t.data_offset), split=split,
        ))
        expert_bytes += n_bytes

    missing = sorted(set(range(n_layers)) - block_layers)
    if missing and not _int(reader, f"{arch}.nextn_predict_layers", 0):
        raise ModelFormatError(
            f"{p.name}: {arch}.block_count says {n_layers} layers, but the file has no "
            f"tensors for layer {missing[0]}"
            + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if n_expert > 0 and not expert_tensors and require_moe:
        raise NotMoEError(
            f"{p.name}: metadata declares {n_expert} experts but the file has no "
            f"expert tensors (blk.N.ffn_*_exps); this layout is not supported"
        )
    if not expert_tensors and require_moe:
        raise NotMoEError(
            f"{p.name}: {arch} model has no routed experts (dense model); MoEScope needs a "
            f"Mixture-of-Experts model"
        )
    if expert_tensors and not 0 < top_k <= n_expert:
        raise ModelFormatError(
            f"{p.name}: {arch}.expert_used_count is {top_k}, expected 1..{n_expert}"
        )

    moe_layers = tuple(sorted(expert_tensors))
    all_layers = set(range(n_layers)) | block_layers
    dense_layers = tuple(sorted(all_layers - set(moe_layers)))
    frozen = {
        layer: tuple(sorted(ts, key=lambda t: (_KIND_ORDER[t.kind], _PART_ORDER[t.part])))
        for layer, ts in sorted(expert_tensors.items())
    }
    header = np.asarray(reader.data[: reader.data_offset])
    return ModelInfo(
        path=p,
        file_name=p.name,
        file_size=sum(size for _, size, _ in files),
        architecture=arch,
        name=_scalar(reader, "general.name"),
        n_layers=n_layers,
        n_embd=_int(reader, f"{arch}.embedding_length"),
        context_length=_int(reader, f"{arch}.context_length"),
        n_expert=n_expert if expert_tensors else 0,
        top_k=top_k if expert_tensors else 0,
        n_expert_shared=_int(reader, f"{arch}.expert_shared_count", 0) or 0,
        moe_layers=moe_layers,
        dense_layers=dense_layers,
        expert_tensors=frozen,
        bytes_per_expert={layer: sum(t.bytes_per_expert for t in ts)
                          for layer, ts in frozen.items()},
        total_expert_bytes=expert_bytes,
        non_expert_bytes=total_bytes - expert_bytes,
        n_tensors=len(tensors),
        metadata_sha256=hashlib.sha256(header.tobytes()).hexdigest(),
        metadata=_small_metadata(reader),
        parts=tuple(path for path, _, _ in files) if len(files) > 1 else (),
    )


_KIND_ORDER = {"gate": 0, "up": 1, "gate_up": 2, "down": 3}
_PART_ORDER = {"weight": 0, "bias": 1, "scale": 2}
