"""Hostile inputs generated from the GGUF and trace schemas, as Hypothesis strategies.

The fuzz tests (``tests/fuzz``) and the long campaign (``bench/fuzz_campaign.py``) draw
from the same strategies here, so a campaign failure is reproduced by a test with the same
generator. Each strategy starts from a small *real* file (a synthetic model, a trace the
native core decided) and changes it the way a corrupt download, a hand edit or a hostile
author would:

* GGUF **schema** mutations rewrite the decoded file (:class:`GGUFDoc`): any key set to any
  of GGUF's 13 value types (arrays and nested arrays included) with boundary values,
  keys dropped or duplicated, tensor infos with other dims, types, offsets and names,
  header counts and version that disagree with the body;
* GGUF **byte** mutations flip, overwrite, insert, delete and truncate bytes of the
  encoded file, mostly inside the header;
* trace **schema** mutations replace, remove or add values anywhere in the header, token,
  event and ``initial_state`` records (boundary integers, 1e-300, 1e308, NaN, deep
  nesting, wrong JSON types), and drop, repeat, reorder or cut lines;
* trace **byte** and **gzip** mutations work on the encoded text and its gzip stream
  (flipped bits, a wrong CRC, a cut stream, garbage after it, bombs that inflate to
  millions of blank lines or to one endless line);
* **argument** strategies for ``--budget``, ``--policy`` and ``--threads`` strings.

Needs ``hypothesis`` (a dev dependency); nothing in the application imports this module.
"""

from __future__ import annotations

import functools
import gzip
import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

# --------------------------------------------------------------------------- GGUF files

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
_INT_FORMATS = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i",
                U64: "<Q", I64: "<q", BOOL: "<B"}
_INT_BITS = {U8: 8, I8: 8, U16: 16, I16: 16, U32: 32, I32: 32, U64: 64, I64: 64, BOOL: 8}
_SIGNED = {I8, I16, I32, I64}


@dataclass
class KV:
    key: bytes
    vtype: int
    value: Any  # int, float, bytes, or for ARR a list of values of ``sub``
    sub: int | None = None  # ARR: element type; nested: (sub, inner sub) via value tuples


@dataclass
class TensorInfo:
    name: bytes
    dims: list[int]
    ttype: int
    offset: int


@dataclass
class GGUFDoc:
    """A decoded GGUF file that can hold values no writer would write."""

    version: int
    kvs: list[KV]
    tensors: list[TensorInfo]
    data: bytes
    alignment: int = 32
    n_tensors: int | None = None  # None: len(tensors)
    n_kv: int | None = None  # None: len(kvs)
    cut: int | None = None  # truncate the encoded file to this many bytes

    def arch(self) -> str:
        for kv in self.kvs:
            if kv.key == b"general.architecture" and isinstance(kv.value, bytes):
                return kv.value.decode("utf-8", "replace")
        return "llama"

    def copy(self) -> GGUFDoc:
        return replace(self, kvs=[replace(kv) for kv in self.kvs],
                       tensors=[replace(t, dims=list(t.dims)) for t in self.tensors])


def read_doc(path: str | Path) -> GGUFDoc:
    """Decode a well-formed GGUF file (the seed of the mutations)."""
    from gguf import GGUFReader, GGUFValueType

    reader = GGUFReader(path)
    kvs: list[KV] = []
    for key, f in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        vtype = int(f.types[0])
        value = f.contents()
        sub = int(f.types[1]) if vtype == GGUFValueType.ARRAY else None
        if vtype == STR:
            value = value.encode("utf-8")
        elif vtype == ARR and sub == STR:
            value = [v.encode("utf-8") for v in value]
        kvs.append(KV(key.encode(), vtype, value, sub))
    start = reader.data_offset
    raw = Path(path).read_bytes()
    tensors = [TensorInfo(t.name.encode(), [int(d) for d in t.shape], int(t.tensor_type),
                          int(t.data_offset) - start) for t in reader.tensors]
    return GGUFDoc(version=3, kvs=kvs, tensors=tensors, data=raw[start:])


def _wrap_int(value: int, vtype: int) -> int:
    bits = _INT_BITS[vtype]
    value &= (1 << bits) - 1
    if vtype in _SIGNED and value >= 1 << (bits - 1):
        value -= 1 << bits
    return value


def _scalar(vtype: int, value: Any) -> bytes:
    if vtype in _INT_FORMATS:
        v = value if isinstance(value, int) else (int(value) if math.isfinite(value) else 0)
        return struct.pack(_INT_FORMATS[vtype], _wrap_int(v, vtype))
    if vtype in (F32, F64):
        v = float(value) if not isinstance(value, bytes) else 0.0
        if vtype == F32:
            import numpy as np

            with np.errstate(over="ignore"):
                return np.float32(v).tobytes()
        return struct.pack("<d", v)
    if vtype == STR:
        b = value if isinstance(value, bytes) else str(value).encode("utf-8", "surrogatepass")
        return struct.pack("<Q", len(b)) + b
    return b""  # an unknown type has no value bytes: the reader must stop there


def _value(vtype: int, value: Any, sub: Any) -> bytes:
    if vtype != ARR:
        return _scalar(vtype, value)
    if isinstance(sub, tuple):  # nested array: (ARR, inner type)
        inner = sub[1]
        items = value if isinstance(value, list) else []
        return (struct.pack("<IQ", ARR, len(items))
                + b"".join(struct.pack("<IQ", inner, len(v if isinstance(v, list) else []))
                           + b"".join(_scalar(inner, x) for x in (v if isinstance(v, list)
                                                                  else []))
                           for v in items))
    items = value if isinstance(value, list) else [value]
    t = ARR if sub is None else sub
    return struct.pack("<IQ", t & 0xFFFFFFFF, len(items)) + b"".join(
        _scalar(t, x) for x in items)


def _gstr(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def encode_doc(doc: GGUFDoc) -> bytes:
    """The file bytes of ``doc``, counts and layout as the doc says (however wrong)."""
    out = bytearray(b"GGUF")
    out += struct.pack("<I", doc.version & 0xFFFFFFFF)
    out += struct.pack("<Q", (len(doc.tensors) if doc.n_tensors is None else doc.n_tensors)
                       & (2**64 - 1))
    out += struct.pack("<Q", (len(doc.kvs) if doc.n_kv is None else doc.n_kv) & (2**64 - 1))
    for kv in doc.kvs:
        out += _gstr(kv.key) + struct.pack("<I", kv.vtype & 0xFFFFFFFF)
        out += _value(kv.vtype, kv.value, kv.sub)
    for t in doc.tensors:
        out += _gstr(t.name) + struct.pack("<I", len(t.dims) & 0xFFFFFFFF)
        out += b"".join(struct.pack("<Q", d & (2**64 - 1)) for d in t.dims)
        out += struct.pack("<IQ", t.ttype & 0xFFFFFFFF, t.offset & (2**64 - 1))
    out += b"\0" * (-len(out) % doc.alignment)
    out += doc.data
    return bytes(out if doc.cut is None else out[:doc.cut])


def header_size(doc: GGUFDoc) -> int:
    """Bytes before the tensor data (where byte mutations are aimed)."""
    return len(encode_doc(replace(doc, data=b"", cut=None)))


# ---- values

INTERESTING_INTS: tuple[int, ...] = (
    0, 1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 255, 256, 257,
    511, 512, 513, 1000, 1023, 1024, 4096, 65535, 65536, 2**24, 2**31 - 1, 2**31,
    2**32 - 1, 2**32, 2**53 + 1, 2**62, 2**63 - 1, 2**63, 2**64 - 1, -1, -2, -128, -2**31,
    -2**63, 10**12,
)
INTERESTING_FLOATS: tuple[float, ...] = (
    0.0, -0.0, 1.0, -1.0, 0.5, 1e-6, 1e-300, 5e-324, 1e300, 1e38, 3.5e38, -1e-6,
    float("nan"), float("inf"), float("-inf"), 10000.0, 1e-45,
)
interesting_ints = st.one_of(st.sampled_from(INTERESTING_INTS),
                             st.integers(-2**64, 2**64), st.integers(0, 64))
interesting_floats = st.one_of(st.sampled_from(INTERESTING_FLOATS), st.floats())
GGUF_STRINGS: tuple[bytes, ...] = (
    b"", b"qwen3moe", b"llama", b"deepseek2", b"gpt-oss", b"olmoe", b"qwen3next", b"qwen3",
    b"mamba", b"bert", b"gpt2", b"qwen2", b"none", b"\xff\xfe", b"a" * 5000, b"\0",
)
gguf_strings = st.one_of(st.sampled_from(GGUF_STRINGS), st.binary(max_size=24),
                         st.text(max_size=24).map(lambda s: s.encode("utf-8", "replace")))


def _scalar_values(vtype: int) -> st.SearchStrategy[Any]:
    if vtype in (F32, F64):
        return interesting_floats
    if vtype == STR:
        return gguf_strings
    return interesting_ints


@st.composite
def gguf_values(draw: st.DrawFn, keep: KV | None = None) -> tuple[int, Any, Any]:
    """(type, value, sub): a value of any GGUF type, or of ``keep``'s type half the time."""
    if keep is not None and draw(st.booleans()):
        vtype, sub = keep.vtype, keep.sub
    else:
        vtype = draw(st.one_of(st.integers(0, 12), st.sampled_from([13, 255, 2**32 - 1])))
        sub = None
    if vtype != ARR:
        return vtype, draw(_scalar_values(vtype)), None
    if sub is None or draw(st.booleans()):
        sub = draw(st.one_of(st.integers(0, 12), st.just(13)))
    length = draw(st.sampled_from([0, 1, 2, 3, 4, 6, 16, 64, 257, 1000]))
    if sub == ARR:  # nested arrays
        inner = draw(st.integers(0, 12).filter(lambda t: t not in (ARR,)))
        pattern = draw(st.lists(st.lists(_scalar_values(inner), max_size=3), min_size=1,
                                max_size=3))
        return ARR, [pattern[i % len(pattern)] for i in range(min(length, 64))], (ARR, inner)
    pattern = draw(st.lists(_scalar_values(sub) if sub <= 12 else st.just(0), min_size=1,
                            max_size=4))
    return ARR, [pattern[i % len(pattern)] for i in range(length)], sub


def _known_keys(arch: str) -> list[bytes]:
    names = [
        "block_count", "context_length", "embedding_length", "feed_forward_length",
        "expert_count", "expert_used_count", "expert_feed_forward_length",
        "expert_shared_count", "leading_dense_block_count", "vocab_size",
        "attention.head_count", "attention.head_count_kv", "attention.key_length",
        "attention.value_length", "attention.layer_norm_rms_epsilon",
        "attention.sliding_window", "rope.freq_base", "rope.dimension_count",
        "expert_gating_func", "expert_weights_scale", "expert_weights_norm",
        "full_attention_interval", "attention.kv_lora_rank", "attention.q_lora_rank",
    ]
    general = ["general.architecture", "general.alignment", "general.file_type",
               "tokenizer.ggml.model", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
               "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id",
               "tokenizer.ggml.eos_token_id", "tokenizer.chat_template",
               "split.count", "split.no", "split.tensors.count"]
    return [f"{arch}.{n}".encode() for n in names] + [g.encode() for g in general]


@st.composite
def gguf_schema_mutation(draw: st.DrawFn, base: GGUFDoc) -> GGUFDoc:
    """``base`` with one to four schema-level changes."""
    doc = base.copy()
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(
            ["set"] * 8 + ["near"] * 6 + ["drop", "dup", "add", "dims", "ttype", "offset",
                                          "rename", "tensor-drop", "tensor-dup", "counts",
                                          "version", "cut"]))
        if op == "near":  # a number key near its own value: parses, and may load
            numeric = [kv for kv in doc.kvs if kv.vtype in _INT_FORMATS or kv.vtype in (F32, F64)]
            kv = draw(st.sampled_from(numeric))
            if kv.vtype in (F32, F64):
                kv.value = draw(st.sampled_from([kv.value * 2, kv.value / 2, -kv.value, 0.0,
                                                 kv.value * 1e30, kv.value * 1e-30]))
            else:
                kv.value = draw(st.sampled_from([kv.value + 1, kv.value - 1, kv.value * 2,
                                                 kv.value // 2, 0, 1, kv.value * 1000]))
        elif op == "set":
            key = draw(st.sampled_from(_known_keys(doc.arch()) + [kv.key for kv in doc.kvs]))
            old = next((kv for kv in doc.kvs if kv.key == key), None)
            vtype, value, sub = draw(gguf_values(old))
            if old is None:
                doc.kvs.append(KV(key, vtype, value, sub))
            else:
                old.vtype, old.value, old.sub = vtype, value, sub
        elif op in ("drop", "dup") and doc.kvs:
            i = draw(st.integers(0, len(doc.kvs) - 1))
            if op == "drop":
                del doc.kvs[i]
            else:
                doc.kvs.insert(draw(st.integers(0, len(doc.kvs))), replace(doc.kvs[i]))
        elif op == "add":
            vtype, value, sub = draw(gguf_values())
            doc.kvs.append(KV(draw(gguf_strings), vtype, value, sub))
        elif op in ("dims", "ttype", "offset", "rename", "tensor-drop", "tensor-dup") \
                and doc.tensors:
            i = draw(st.integers(0, len(doc.tensors) - 1))
            t = doc.tensors[i]
            if op == "dims":
                if draw(st.booleans()):
                    t.dims = draw(st.lists(interesting_ints, max_size=6))
                else:
                    j = draw(st.integers(0, max(0, len(t.dims) - 1)))
                    if t.dims:
                        t.dims[j] = draw(interesting_ints)
            elif op == "ttype":
                t.ttype = draw(st.one_of(st.integers(0, 45), st.sampled_from(
                    [2**31, 2**32 - 1, -1])))
            elif op == "offset":
                t.offset = draw(st.one_of(interesting_ints,
                                          st.integers(-64, 64).map(lambda d, o=t.offset: o + d)))
            elif op == "rename":
                t.name = draw(st.one_of(
                    st.sampled_from([x.name for x in doc.tensors]),
                    st.builds(lambda n, s: f"blk.{n}.{s}".encode(), interesting_ints,
                              st.sampled_from(["ffn_gate_exps.weight", "ffn_up_exps.weight",
                                               "ffn_down_exps.weight", "attn_q.weight",
                                               "ffn_gate_inp.weight", "x"])),
                    gguf_strings))
            elif op == "tensor-drop":
                del doc.tensors[i]
            else:
                doc.tensors.insert(draw(st.integers(0, len(doc.tensors))), replace(t))
        elif op == "counts":
            if draw(st.booleans()):
                doc.n_kv = draw(interesting_ints)
            else:
                doc.n_tensors = draw(interesting_ints)
        elif op == "version":
            doc.version = draw(st.one_of(st.integers(0, 4), st.sampled_from([2**32 - 1, 2**31])))
        elif op == "cut":
            doc.cut = draw(st.integers(0, header_size(doc) + 64))
    return doc


@st.composite
def byte_mutation(draw: st.DrawFn, data: bytes, hot: int) -> bytes:
    """``data`` with one to eight byte-level changes, aimed at ``data[:hot]`` nine times
    in ten (the header: mutating tensor data only changes numbers)."""
    buf = bytearray(data)
    rnd = draw(st.randoms(use_true_random=False))  # uniform positions (not small-biased)
    for _ in range(draw(st.integers(1, 8))):
        if not buf:
            break
        limit = min(hot, len(buf)) if rnd.randrange(10) else len(buf)
        pos = rnd.randrange(max(1, limit))
        op = draw(st.sampled_from(["flip", "flip", "byte", "int", "int", "insert",
                                   "delete", "cut"]))
        if op == "flip":
            buf[pos] ^= 1 << rnd.randrange(8)
        elif op == "byte":
            buf[pos] = draw(st.sampled_from([0, 1, 0x7F, 0x80, 0xFF, ord("\n"), ord("{")]))
        elif op == "int":
            width = draw(st.sampled_from([4, 8]))
            value = draw(interesting_ints) & ((1 << (8 * width)) - 1)
            buf[pos:pos + width] = value.to_bytes(width, "little")
        elif op == "insert":
            buf[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif op == "delete":
            del buf[pos:pos + rnd.randint(1, 16)]
        else:
            del buf[pos:]
    return bytes(buf)


@st.composite
def gguf_files(draw: st.DrawFn, bases: Sequence[GGUFDoc]) -> tuple[str, bytes]:
    """(kind, file bytes): a schema or a byte mutation of one of ``bases``."""
    base = draw(st.sampled_from(list(bases)))
    if draw(st.integers(0, 2)):
        return "gguf-schema", encode_doc(draw(gguf_schema_mutation(base)))
    return "gguf-bytes", draw(byte_mutation(encode_doc(base), header_size(base)))


# --------------------------------------------------------------------------- traces

DEEP = "\x00deep\x00"
"""A placeholder value written as JSON nested thousands of levels deep."""
BIG_EXP = "\x00bigexp\x00"
"""A placeholder written as ``1e999`` (parses to infinity)."""

_TRACE_STRINGS = ("", "prefill", "decode", "psr", "exact", "quality-first", "f16", "f32",
                  "bf16", "token", "header", "end", "moescope-trace", "qwen3moe",
                  "frequency", "lru", "routing_bonus", "own", "slots=4", "answer now")
json_scalars = st.one_of(
    st.sampled_from([None, True, False, DEEP, BIG_EXP]),
    st.sampled_from(INTERESTING_INTS), st.integers(),
    st.sampled_from([f for f in INTERESTING_FLOATS]), st.floats(),
    st.sampled_from(_TRACE_STRINGS), st.text(max_size=12),
)
json_values = st.recursive(
    json_scalars,
    lambda children: st.one_of(st.lists(children, max_size=5),
                               st.dictionaries(st.sampled_from(
                                   ["step", "layer", "k", "ids", "slots", "row", "x"]),
                                   children, max_size=4)),
    max_leaves=12)


def _paths(obj: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path into ``obj`` (dict keys and list indices), capped for big records."""
    out = [prefix]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:6]):
            out += _paths(v, (*prefix, i))
    return out


def _set(obj: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = obj
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return obj


def _get_path(obj: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        obj = obj[p]
    return obj


def _delete(obj: Any, path: tuple[Any, ...]) -> None:
    parent = obj
    for p in path[:-1]:
        parent = parent[p]
    del parent[path[-1]]


@dataclass
class TraceDoc:
    """A trace as records (dicts), plus the line-level damage to apply when encoding."""

    records: list[Any]
    blank_lines: int = 0
    cut_last: int | None = None  # drop the last line's newline and cut it to this length
    extra_lines: list[str] = field(default_factory=list)


def read_trace_doc(path: str | Path) -> TraceDoc:
    return TraceDoc([json.loads(line) for line in Path(path).read_text("utf-8").splitlines()
                     if line.strip()])


def _dumps(value: Any) -> str:
    text = json.dumps(value, separators=(",", ":"), allow_nan=True)
    text = text.replace(json.dumps(BIG_EXP), "1e999")
    deep = json.dumps(DEEP)
    if deep in text:
        text = text.replace(deep, "[" * 50_000 + "]" * 50_000)
    return text


def encode_trace(doc: TraceDoc) -> bytes:
    lines = [_dumps(r) for r in doc.records] + list(doc.extra_lines)
    text = "\n".join(lines) + "\n" + "\n" * doc.blank_lines
    if doc.cut_last is not None and lines:
        text = "\n".join(lines[:-1]) + ("\n" if len(lines) > 1 else "") \
            + lines[-1][:doc.cut_last]
    return text.encode("utf-8", "surrogatepass")


@st.composite
def trace_schema_mutation(draw: st.DrawFn, base: TraceDoc) -> TraceDoc:
    """``base`` with one to four record- or line-level changes."""
    doc = TraceDoc(json.loads(json.dumps(base.records)))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["set"] * 5 + ["near"] * 5 + [
            "delete", "add", "line-drop", "line-dup", "line-swap", "unknown", "blank",
            "cut"]))
        if not doc.records:
            doc.records.append({"type": "header"})
        r = draw(st.integers(0, len(doc.records) - 1)) if draw(st.booleans()) else 0
        if op == "near":  # a number near its own value: passes the type checks
            leaves = [p for p in _paths(doc.records[r]) if p and isinstance(
                _get_path(doc.records[r], p), (int, float))
                and not isinstance(_get_path(doc.records[r], p), bool)]
            if leaves:
                path = draw(st.sampled_from(leaves))
                v = _get_path(doc.records[r], path)
                near = draw(st.sampled_from(["+1", "-1", "*2", "0", "neg", "big", "float"]))
                new_v = {"+1": v + 1, "-1": v - 1, "*2": v * 2, "0": 0, "neg": -v,
                         "big": v * 10**6, "float": float(v) + 0.5}[near]
                _set(doc.records[r], path, new_v)
        elif op in ("set", "delete", "add"):
            paths = _paths(doc.records[r])
            path = draw(st.sampled_from(paths))
            if op == "set":
                doc.records[r] = _set(doc.records[r], path, draw(json_values))
            elif op == "delete" and path:
                _delete(doc.records[r], path)
            elif op == "add":
                target = doc.records[r]
                for p in path:
                    target = target[p]
                if isinstance(target, dict):
                    target[draw(st.sampled_from(["x", "step", "resident", "changes",
                                                 "timings", "prefetch", "routes"]))] = \
                        draw(json_values)
                elif isinstance(target, list):
                    target.append(draw(json_values))
        elif op == "line-drop" and len(doc.records) > 1:
            del doc.records[r]
        elif op == "line-dup":
            doc.records.insert(r, json.loads(json.dumps(doc.records[r])))
        elif op == "line-swap":
            s = draw(st.integers(0, len(doc.records) - 1))
            doc.records[r], doc.records[s] = doc.records[s], doc.records[r]
        elif op == "unknown":
            doc.records.insert(r + 1, {"type": draw(st.sampled_from(["note", "x", ""])),
                                       "v": draw(json_values)})
        elif op == "blank":
            doc.blank_lines = draw(st.sampled_from([1, 5, 1024, 1025, 5000]))
        elif op == "cut":
            doc.cut_last = draw(st.integers(0, 400))
    return doc


def _gzip_mutation(draw: st.DrawFn, raw: bytes) -> bytes:
    z = bytearray(gzip.compress(raw, compresslevel=6, mtime=0))
    op = draw(st.sampled_from(["none", "flip", "flip", "crc", "cut", "garbage", "member"]))
    if op == "flip" and len(z) > 10:
        pos = draw(st.integers(10, len(z) - 1))
        z[pos] ^= 1 << draw(st.integers(0, 7))
    elif op == "crc" and len(z) >= 8:
        z[-8] ^= 0xFF
    elif op == "cut":
        del z[draw(st.integers(0, len(z))):]
    elif op == "garbage":
        z += draw(st.binary(min_size=1, max_size=32))
    elif op == "member":
        z += gzip.compress(raw[: draw(st.integers(0, len(raw)))], mtime=0)
    return bytes(z)


BOMBS = ("blank", "long-line", "unknown-records")


@functools.lru_cache(maxsize=16)
def bomb(kind: str, header_line: bytes) -> bytes:
    """A small gzip file that inflates to something no trace reader should walk whole."""
    if kind == "blank":
        body = header_line + b"\n" * (64 << 20)
    elif kind == "long-line":
        body = header_line + b" " * (80 << 20) + b"\n"
    else:
        body = header_line + b'{"type":"x"}\n' * 500_000
    return gzip.compress(body, compresslevel=1, mtime=0)


@st.composite
def trace_files(draw: st.DrawFn, bases: Sequence[TraceDoc],
                bombs: bool = True) -> tuple[str, bytes, str]:
    """(kind, file bytes, suffix): a schema, byte or gzip mutation of one of ``bases``."""
    base = draw(st.sampled_from(list(bases)))
    choice = draw(st.integers(0, 19))
    if bombs and choice == 19:
        header = _dumps(base.records[0]).encode()
        return "trace-bomb", bomb(draw(st.sampled_from(BOMBS)), header), ".jsonl.gz"
    if choice >= 12:
        raw = encode_trace(draw(trace_schema_mutation(base)) if choice >= 16 else base)
        if choice < 16:
            raw = draw(byte_mutation(raw, len(raw)))
        return "trace-gzip", _gzip_mutation(draw, raw), ".jsonl.gz"
    if choice >= 9:
        raw = encode_trace(base)
        return "trace-bytes", draw(byte_mutation(raw, len(raw))), ".jsonl"
    return "trace-schema", encode_trace(draw(trace_schema_mutation(base))), ".jsonl"


# --------------------------------------------------------------------------- arguments

_SIZES = ("0", "1", "2", "3", "4", "15", "16", "17", "64", "65", "16.0", "4.7", "-1", "0.5",
          "1e400", "nan", "inf", "-inf", "25%", "0%", "100%", "101%", "-5%", "1e-300%",
          "nan%", "50.5%", "12GiB", "0B", "1B", "512MiB", "99999999999999999999GiB",
          "1e30GiB", "1 GiB", " 25 % ", "٣", "0x10", "1_000", "", " ", "%", "GiB",
          "recorded", "18446744073709551616", "2147483648")
budget_strings = st.one_of(st.sampled_from(_SIZES), st.text(max_size=12),
                           st.builds(lambda n, u: f"{n}{u}", st.integers(-10, 2**70),
                                     st.sampled_from(["", "%", "B", "KiB", "MiB", "GiB",
                                                      "GB", "TiB", "x"])))
_PRESETS = ("exact", "quality-first", "speed-first", "cache-prior", "psr", "substitute-all",
            "threshold", "first-choice", "recorded")
_POLICY_KEYS = ("theta", "half_life", "beta", "bonus", "prefetch", "miss_rule", "eviction",
                "admission", "substitute_weight", "x", "")
_POLICY_VALUES = ("0", "1", "-1", "0.3", "1e-300", "1e300", "nan", "inf", "-inf", "",
                  "true", "false", "lru", "frequency", "own", "routing_bonus", "2**31",
                  "9999999999999999999999", "=", ",")
policy_strings = st.one_of(
    st.sampled_from((*_PRESETS, "", ",", ":", "exact,", ",exact", "EXACT")),
    st.builds(lambda p, kvs: p + ":" + ",".join(f"{k}={v}" for k, v in kvs),
              st.sampled_from(_PRESETS),
              st.lists(st.tuples(st.sampled_from(_POLICY_KEYS),
                                 st.sampled_from(_POLICY_VALUES)), max_size=3)),
    st.text(max_size=16))
thread_strings = st.one_of(
    st.sampled_from(["0", "1", "2", "-1", "512", "513", "1000", "99999999999", "1e3", "",
                     "abc", "2.0", "9" * 40, " 2"]),
    st.integers(-2**40, 2**40).map(str))


def _option(flag: str, value: str) -> list[str]:
    """``--flag=value`` keeps a value that starts with '-' from being read as an option."""
    return [f"{flag}={value}"]


@st.composite
def cli_args(draw: st.DrawFn, model: str, trace: str, engine: bool = True) -> list[str]:
    """An argument vector for info, replay, and (with ``engine``) generate and chat, with
    fuzzed --budget, --policy and --threads strings."""
    commands = ["info", "replay"] + (["generate", "chat"] if engine else [])
    command = draw(st.sampled_from(commands))
    if command == "info":
        return ["info", model, *_option("--budget", draw(budget_strings))]
    if command == "replay":
        argv = ["replay", trace]
        for _ in range(draw(st.integers(0, 2))):
            argv += _option("--policy", draw(policy_strings))
        for _ in range(draw(st.integers(0, 2))):
            argv += _option("--budget", draw(budget_strings))
        return argv
    argv = [command, model]
    if draw(st.booleans()):
        argv += _option("--policy", draw(policy_strings))
    if draw(st.booleans()):
        argv += _option("--budget", draw(budget_strings))
    if command == "chat":
        argv += _option("--threads", draw(thread_strings))
        argv += ["--ctx", "64"]
    else:
        argv += ["--n", "1", "--prompt", "Hi"]
    return argv


# --------------------------------------------------------------------------- bases

def small_model_specs() -> list[Any]:
    """Seeds of the GGUF mutations: tiny (about 100 KiB) models of two architectures."""
    from moescope_testing.synth import preset

    return [
        preset("tiny", "qwen3moe", n_layers=2, n_embd=32, n_head=2, n_head_kv=1,
               head_dim=16, n_expert=4, top_k=2, n_ff_exp=16, vocab_size=260, ctx=64),
        preset("tiny", "deepseek2", n_layers=2, n_embd=32, n_head=2, head_dim=16,
               n_expert=4, top_k=2, n_ff_exp=32, n_ff=32, vocab_size=260, ctx=64,
               expert_type="q8_0", q_lora_rank=0, kv_lora_rank=16, qk_rope_dim=8),
    ]


def make_bases(directory: Path) -> tuple[list[Path], list[Path]]:
    """Write the seed models and traces under ``directory`` (model paths, trace paths)."""
    from moescope_testing.synth import ensure_synth_model
    from moescope_testing.traces import core_trace

    directory.mkdir(parents=True, exist_ok=True)
    models = [ensure_synth_model(directory, spec) for spec in small_model_specs()]
    traces = []
    for i, kw in enumerate([dict(n_tokens=3), dict(n_tokens=4, n_layers=2, moe_layers=(0, 1),
                                                   n_expert=8, top_k=2, slots=3,
                                                   policy="quality-first"),
                            dict(n_tokens=2, n_expert=6, top_k=1, slots=1, policy="exact")]):
        path = directory / f"base{i}.jsonl"
        if not path.exists():
            core_trace(path, seed=i, **kw)
        traces.append(path)
    return models, traces

