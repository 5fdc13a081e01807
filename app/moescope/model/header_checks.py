"""The header's numbers, bounded before llama.cpp or MoEScope sizes anything by them.

The vendored llama.cpp checks many hyperparameters with GGML_ASSERT, which aborts the
process (a block count above LLAMA_MAX_LAYERS, more routed experts than experts, a negative
or NaN norm epsilon reaching ggml's norm kernels); others reach a division or a loop sized
by them, or a graph that asserts on head sizes no tensor shape reveals. Each is refused
here with its key, its value and what was expected, so a hostile or damaged file costs one
line instead of the app (tests/test_hostile_headers.py, tests/fuzz). Apart from
``gguf_info.py``, which reads the header and describes the experts, because these checks
grow with every architecture and every crash fuzzing finds.
"""

from __future__ import annotations

import struct

import numpy as np
from gguf import GGUFEndian, GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField

from moescope.util.errors import ModelFormatError

# Limits of the vendored llama.cpp (llama-hparams.h): a header value beyond them makes its
# loader fail an internal check (the process aborts), so they are refused here.
MAX_LAYERS = 512  # LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # LLAMA_MAX_EXPERTS
# Not llama.cpp limits but sanity bounds well above any published model.
# llama-cpp-python allocates a buffer of context_length tokens for every tokenize call:
# 2^31-1 is 8 GiB per call. 2^24 is 1.6x the longest published context (10M tokens).
MAX_CONTEXT = 1 << 24
MAX_EMBD = 1 << 20
MAX_HEADS = 1 << 16
MAX_VOCAB = (1 << 31) - 1  # token ids are int32
_INT_TYPES = frozenset({
    GGUFValueType.UINT8, GGUFValueType.INT8, GGUFValueType.UINT16, GGUFValueType.INT16,
    GGUFValueType.UINT32, GGUFValueType.INT32, GGUFValueType.UINT64, GGUFValueType.INT64,
})
_FLOAT_TYPES = frozenset({GGUFValueType.FLOAT32, GGUFValueType.FLOAT64})


def int_value(reader: GGUFReader, key: str, default: int | None = None) -> int | None:
    """An integer KV value (the max of a per-layer array), or ``default`` when absent."""
    values = numbers(reader, key, integer=True)
    if values is None or not values.size:
        return default
    return int(values.max())


def numbers(reader: GGUFReader, key: str, *, integer: bool) -> np.ndarray | None:
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


def check_header_numbers(name: str, reader: GGUFReader, arch: str) -> None:
    """Refuse the hyperparameters the vendored llama.cpp cannot take, with the reason.

    Its loader checks many of them with GGML_ASSERT, which aborts the process (a block
    count above LLAMA_MAX_LAYERS, more routed experts than experts, a negative or NaN
    norm epsilon reaching ggml's norm kernels); others reach a division or a loop sized by
    them. Every count, size and id of the architecture's header is therefore bounded here,
    before llama.cpp or this module allocates or loops over anything.
    """

    def ints(key: str, low: int, high: int, what: str, *, per_layer: bool = False,
             required: bool = False) -> np.ndarray | None:
        values = numbers(reader, key, integer=True)
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
        values = numbers(reader, key, integer=False)
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
        n_vocab = array_len(tokens)
        if not 1 <= n_vocab <= MAX_VOCAB:
            raise ModelFormatError(f"{name}: the vocabulary has {n_vocab} tokens, expected "
                                   f"1..{MAX_VOCAB}")
        _check_distinct_tokens(name, reader, tokens)


def _check_distinct_tokens(name: str, reader: GGUFReader, tokens: ReaderField) -> None:
    """llama.cpp maps each token's text to its id and then asserts that no two tokens
    shared a text (``GGML_ASSERT(id_to_token.size() == token_to_id.size())``, an abort):
    a flipped byte that makes one token another's twin must be refused here. Its text is
    the string up to a NUL (it goes through ``const char *``), an empty one
    ``[EMPTY_<id>]``."""
    if tokens.types[-1] != GGUFValueType.STRING:
        return
    model = reader.fields.get("tokenizer.ggml.model")
    if model is not None and model.types[0] == GGUFValueType.STRING \
            and bytes(model.parts[-1]) in (b"no_vocab", b"none"):
        return
    seen: dict[bytes, int] = {}
    for i, raw in enumerate(_strings(reader, tokens)):
        text = raw.split(b"\0", 1)[0] or f"[EMPTY_{i}]".encode()
        first = seen.setdefault(text, i)
        if first != i:
            shown = text[:40].decode("utf-8", "replace").encode("unicode_escape").decode()
            raise ModelFormatError(f"{name}: tokens {first} and {i} of the vocabulary are "
                                   f"both '{shown}'; llama.cpp needs each token once "
                                   f"(the file is probably corrupt)")


def _strings(reader: GGUFReader, f: ReaderField) -> list[bytes]:
    """A string array's items: the stock reader's parts, one per string, or the strict
    reader's (:mod:`.gguf_reader`), one payload of ``(u64 length, bytes)`` items that it
    has bounded against the file already."""
    if f.data:
        return [bytes(f.parts[i]) for i in f.data]
    payload = np.asarray(f.parts[-1]).tobytes()
    fmt = "<Q" if reader.endianess == GGUFEndian.LITTLE else ">Q"
    out, pos = [], 0
    for _ in range(array_len(f)):
        (n,) = struct.unpack_from(fmt, payload, pos)
        out.append(payload[pos + 8:pos + 8 + n])
        pos += 8 + n
    return out


def _check_mla_latent(name: str, reader: GGUFReader, arch: str) -> None:
    """deepseek2 with MLA heads (``key_length_mla``) caches one shared latent key/value
    head of ``kv_lora_rank + rope.dimension_count`` values; other sizes pass the tensor
    shape checks and abort the first decode (``GGML_ASSERT(a->ne[0] == b->ne[0])``).
    Fuzzing found a file whose ``head_count_kv`` key was misspelled by a flipped byte:
    llama.cpp's default, the head count, gave the cache the wrong row size."""
    heads = int_value(reader, f"{arch}.attention.head_count", 0) or 0
    if heads <= 0 or not (int_value(reader, f"{arch}.attention.key_length_mla", 0)
                          and int_value(reader, f"{arch}.attention.value_length_mla", 0)):
        return
    kv_heads = numbers(reader, f"{arch}.attention.head_count_kv", integer=True)
    if kv_heads is None or (kv_heads != 1).any():
        shown = heads if kv_heads is None else int(kv_heads[kv_heads != 1][0])
        raise ModelFormatError(
            f"{name}: {arch}.attention.head_count_kv is {shown}"
            f"{' (absent: the head count)' if kv_heads is None else ''}, expected 1: "
            f"attention with key_length_mla shares one latent key/value head")
    n_embd = int_value(reader, f"{arch}.embedding_length", 0) or 0
    head_k = int_value(reader, f"{arch}.attention.key_length", n_embd // heads) or 0
    n_rot = int_value(reader, f"{arch}.rope.dimension_count", head_k) or 0
    rank = int_value(reader, f"{arch}.attention.kv_lora_rank")
    if rank is not None and head_k != rank + n_rot:
        raise ModelFormatError(
            f"{name}: {arch}.attention.key_length is {head_k}, expected kv_lora_rank + "
            f"rope.dimension_count = {rank + n_rot} (the latent key of MLA attention)")


_ATTENTION_ARCHES = ("qwen3moe", "olmoe", "llama", "qwen3", "gpt-oss", "deepseek2", "qwen3next",
                     "glm4moe", "qwen35moe")


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
    n_embd = int_value(reader, f"{arch}.embedding_length", 0) or 0
    head_k = int_value(reader, f"{arch}.attention.key_length", n_embd // n_head) or 0
    head_v = int_value(reader, f"{arch}.attention.value_length", n_embd // n_head) or 0
    n_rot = int_value(reader, f"{arch}.rope.dimension_count", head_k) or 0
    rope_room = head_k
    if arch == "deepseek2":  # MLA: the rotated part is taken off the key head
        rope_room = (int_value(reader, f"{arch}.attention.key_length_mla", head_k) or 0) - 1
    why = ""
    if n_rot < 2 or n_rot % 2 or n_rot > rope_room:
        why = (f"{arch}.rope.dimension_count is {n_rot}, expected an even number from 2 to "
               f"{rope_room}" + (" (below the MLA key length)" if arch == "deepseek2" else
                                 " (the key head size)"))
    elif (arch in ("qwen3moe", "olmoe", "llama", "qwen3", "gpt-oss")
          and not head_k == head_v == n_rot):
        why = (f"key head size {head_k}, value head size {head_v} and rope dimensions "
               f"{n_rot} differ; {arch} needs them equal")
    elif arch == "glm4moe" and head_k != head_v:  # GGML_ASSERT in glm4-moe.cpp's graph
        why = f"key head size {head_k} and value head size {head_v} differ; {arch} needs them equal"
    elif arch == "olmoe" and head_k * n_head != n_embd:  # its query weight is n_embd wide
        why = (f"{n_head} heads of {head_k} do not make up the hidden size {n_embd}, as "
               f"{arch} needs")
    elif arch in ("qwen3next", "qwen35moe"):
        groups = int_value(reader, f"{arch}.ssm.group_count", 0) or 0
        rank = int_value(reader, f"{arch}.ssm.time_step_rank", 0) or 0
        inner = int_value(reader, f"{arch}.ssm.inner_size", 0) or 0
        state = int_value(reader, f"{arch}.ssm.state_size", 0) or 0
        if head_k != head_v:
            why = f"key head size {head_k} and value head size {head_v} differ"
        elif groups < 1 or rank % groups:
            why = (f"{arch}.ssm.time_step_rank {rank} is not a multiple of "
                   f"{arch}.ssm.group_count {groups}")
        elif inner != state * rank:  # the graph's value head size is inner / rank
            why = (f"{arch}.ssm.inner_size is {inner}, expected ssm.state_size x "
                   f"ssm.time_step_rank = {state * rank}")
    if not why and arch in ("qwen35moe", "glm4moe"):
        why = _rope_sections(reader, arch, head_k)
    if why:
        raise ModelFormatError(f"{name}: {why}")


def _rope_sections(reader: GGUFReader, arch: str, head_k: int) -> str:
    """Multimodal RoPE's sections (Qwen3.5's interleaved ones; GLM-4.5's when it has them)
    as ggml's rope kernel asserts on them: none negative, at most the key head size in all,
    and one of the first three above 0 ("" when they are fine or absent)."""
    key = f"{arch}.rope.dimension_sections"
    sections = numbers(reader, key, integer=True)
    if sections is None or sections.size > 4:  # more than 4: llama.cpp's own load error
        return ""
    s = [int(v) for v in sections] + [0] * (4 - sections.size)
    if arch == "glm4moe" and not (s[0] > 0 and s[1] > 0):  # no multimodal RoPE then
        return ""
    if min(s) < 0 or sum(s) > head_k or max(s[:3]) <= 0:
        return (f"{key} is {s}, expected sections of 0 or more, one of the first three "
                f"above 0, adding up to at most the key head size {head_k}")
    return ""


def _max(values: np.ndarray | None) -> int:
    return int(values.max()) if values is not None and values.size else 0


def array_len(f: ReaderField) -> int:
    """Element count of an array field (parts: key len, key, type, item type, count, ...)."""
    return int(f.parts[4][0])
