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
import stat
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import (
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
)

from moescope.model.gguf_reader import Corrupt, HeaderReader, StrictReader, Truncated
from moescope.model.header_checks import array_len, check_header_numbers, int_value
from moescope.util.errors import ModelFileNotFoundError, ModelFormatError, NotMoEError

GGUF_MAGIC = b"GGUF"
_MIN_HEADER_BYTES = 24  # magic, version, tensor count, kv count
_SUPPORTED_VERSIONS = (2, 3)
PARTIAL_SUFFIXES = (".incomplete", ".part", ".partial")
"""Names of files still being downloaded or written: never opened as a model."""

_EXPERT_TENSOR = re.compile(r"^blk\.(\d+)\.ffn_(gate_up|gate|up|down)_exps\.(weight|bias|scale)$")
_BLOCK_TENSOR = re.compile(r"^blk\.(\d+)\.")
_SPLIT_NAME = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


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
    nextn_layers: tuple[int, ...] = ()
    """The last blocks, for multi-token prediction (``nextn_predict_layers``): never run
    by llama.cpp's decoder nor loaded, so in neither ``moe_layers`` nor ``dense_layers``."""
    nextn_bytes: int = 0
    """Bytes of those blocks' tensors (in the file, in neither byte count above)."""

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
    count = int_value(files[0][2], "split.count", 0) or 0
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
            no = int_value(files[-1][2], "split.no", -1)
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
                reader = HeaderReader(f, "r")
            except Truncated as err:
                if err.offset <= size:
                    raise HeaderIncomplete(name, index, err.offset) from None
                raise ModelFormatError(
                    f"{name}: file is truncated: it needs at least {err.offset} bytes but "
                    f"has {size}") from None
            except Corrupt as err:
                raise ModelFormatError(f"{name}: corrupt GGUF header ({err})") from None
            except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError,
                    TypeError, MemoryError) as err:
                raise ModelFormatError(f"{name}: corrupt GGUF header ({_reason(err)})"
                                       ) from None
        if reader.data_offset > len(data):  # the padding before the data is hashed too
            raise HeaderIncomplete(name, index, int(reader.data_offset))
        files.append((Path(name), size, reader))
        no = int_value(reader, "split.no", 0)
        if len(parts) > 1 and no != index:
            raise ModelFormatError(f"{name}: says it is split part {no}, expected {index}")
    count = int_value(files[0][2], "split.count", 0) or 0
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
        return p, file_size, StrictReader(p, "r")
    except Truncated as err:
        whole = _whole_size(p)
        should = (f"should be {_size_text(whole)}" if whole is not None and whole > err.size
                  else f"should be at least {_size_text(err.offset)}")
        raise ModelFormatError(
            f"{p.name}: file is truncated: it is {_size_text(err.size)} but {should} "
            f"(incomplete download?)"
        ) from None
    except Corrupt as err:
        raise ModelFormatError(f"{p.name}: corrupt GGUF header ({err})") from None
    except (ValueError, IndexError, KeyError, OverflowError, UnicodeDecodeError,
            TypeError, MemoryError) as err:
        raise ModelFormatError(f"{p.name}: corrupt GGUF header ({_reason(err)})") from None
    except OSError as err:
        raise ModelFileNotFoundError(f"{p.name}: cannot read file ({err.strerror})") from None


def _whole_size(p: Path) -> int | None:
    """Where a truncated file's last tensor ends, from its header's tensor table (the
    size the whole file has), or None when the header itself is cut or unreadable: the
    first tensor past the end says only how much is missing at least."""
    try:
        reader = HeaderReader(p, "r")
        return max((int(t.data_offset) + int(t.n_bytes) for t in reader.tensors),
                   default=None)
    except (Truncated, Corrupt, ValueError, IndexError, KeyError, OverflowError,
            UnicodeDecodeError, TypeError, MemoryError, OSError):
        return None


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
    if not stat.S_ISREG(st.st_mode):  # /dev/null read as "null: file is empty"
        raise ModelFormatError(f"{p}: not a regular file, not a GGUF model file")
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



def _small_metadata(reader: GGUFReader) -> dict[str, Any]:
    """Scalar KV pairs only; arrays (vocabularies, merges) are summarized by their length."""
    out: dict[str, Any] = {}
    for key, f in reader.fields.items():
        if key.startswith("GGUF.") or not f.types:
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            out[key] = f"[{array_len(f)} items]"
        else:
            out[key] = _scalar(reader, key)
    return out


def _describe(files: list[tuple[Path, int, GGUFReader]], require_moe: bool) -> ModelInfo:
    p, _, reader = files[0]
    arch = _scalar(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise ModelFormatError(f"{p.name}: GGUF file has no general.architecture")
    check_header_numbers(p.name, reader, arch)
    n_layers = int_value(reader, f"{arch}.block_count") or 0
    n_expert = int_value(reader, f"{arch}.expert_count", 0) or 0
    top_k = int_value(reader, f"{arch}.expert_used_count", 0) or 0
    # the last nextn_predict_layers blocks predict further tokens (MTP, e.g. GLM-4.5's and
    # Qwen3-Next's): llama.cpp's decoder runs layers 0..block_count - nextn - 1 only and does
    # not load those blocks unless asked to, so their experts are never routed to, cached
    # or read (check_header_numbers bounded the count to 0..block_count)
    n_nextn = int_value(reader, f"{arch}.nextn_predict_layers", 0) or 0
    first_nextn = n_layers - n_nextn
    nextn_bytes = 0

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
        if m := _BLOCK_TENSOR.match(t.name):
            if int(m.group(1)) >= n_layers:
                raise ModelFormatError(
                    f"{path.name}: tensor {t.name} belongs to layer {int(m.group(1))}, but "
                    f"{arch}.block_count says the model has {n_layers} layers (0..{n_layers - 1})")
            if int(m.group(1)) >= first_nextn:
                nextn_bytes += n_bytes
                continue
            block_layers.add(int(m.group(1)))
        total_bytes += n_bytes
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

    missing = sorted(set(range(first_nextn)) - block_layers)
    if missing:
        raise ModelFormatError(
            f"{p.name}: {arch}.block_count says {n_layers} layers, but the file has no "
            f"tensors for layer {missing[0]}"
            + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else ""))
    if n_layers and first_nextn == 0 and require_moe:
        raise NotMoEError(
            f"{p.name}: every one of its {n_layers} blocks is a multi-token prediction block "
            f"({arch}.nextn_predict_layers): a draft for speculative decoding, not a model "
            f"to chat with; open the full model")
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
    all_layers = set(range(first_nextn)) | block_layers
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
        n_embd=int_value(reader, f"{arch}.embedding_length"),
        context_length=int_value(reader, f"{arch}.context_length"),
        n_expert=n_expert if expert_tensors else 0,
        top_k=top_k if expert_tensors else 0,
        n_expert_shared=int_value(reader, f"{arch}.expert_shared_count", 0) or 0,
        moe_layers=moe_layers,
        dense_layers=dense_layers,
        expert_tensors=frozen,
        bytes_per_expert={layer: sum(t.bytes_per_expert for t in ts)
                          for layer, ts in frozen.items()},
        total_expert_bytes=expert_bytes,
        non_expert_bytes=total_bytes - expert_bytes,
        nextn_layers=tuple(range(first_nextn, n_layers)),
        nextn_bytes=nextn_bytes,
        n_tensors=len(tensors),
        metadata_sha256=hashlib.sha256(header.tobytes()).hexdigest(),
        metadata=_small_metadata(reader),
        parts=tuple(path for path, _, _ in files) if len(files) > 1 else (),
    )


_KIND_ORDER = {"gate": 0, "up": 1, "gate_up": 2, "down": 3}
_PART_ORDER = {"weight": 0, "bias": 1, "scale": 2}
