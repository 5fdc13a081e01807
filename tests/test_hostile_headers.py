"""Issue 14: every number in a GGUF header is bounded before it is used.

Each file here is a real tiny model with one header value made hostile, as a fuzzer found
them: values that parse but that llama.cpp cannot take (it aborts on a failed GGML_ASSERT)
or that sized an allocation or a loop (``info`` allocating 15 GB for a block count of
2^32-1). Each must end in one line that names the value, before anything is allocated.
"""

from __future__ import annotations

import resource
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gguf import GGUFValueType as T

from moescope.model.gguf_info import read_model_info
from moescope.model.header_checks import MAX_CONTEXT, MAX_LAYERS
from moescope.util.errors import ModelFormatError, NotMoEError
from moescope_testing import preset, write_synth_model
from moescope_testing.hostile import DROP, rewrite_gguf

U32, I32, F32 = T.UINT32, T.INT32, T.FLOAT32
NAN, INF = float("nan"), float("inf")


@pytest.fixture(scope="module")
def six_layers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 6-layer qwen3moe model with 16 experts, top-4."""
    return write_synth_model(tmp_path_factory.mktemp("hostile") / "six.gguf",
                             preset("tiny", "qwen3moe", n_layers=6))


@pytest.fixture
def hostile(six_layers: Path, tmp_path: Path) -> Callable[..., Path]:
    """``hostile(key=value, ..., rename={old: new}, base=path)`` -> a rewritten copy."""

    def make(base: Path | None = None, rename: dict[str, str] | None = None,
             **keys: Any) -> Path:
        set_keys = {k.replace("__", "."): v for k, v in keys.items()}
        return rewrite_gguf(base or six_layers, tmp_path / "hostile.gguf",
                            set_keys=set_keys, rename_tensors=rename)

    return make


def _refused(path: Path, match: str) -> str:
    with pytest.raises(ModelFormatError, match=match) as err:
        read_model_info(path)
    text = str(err.value)
    assert "\n" not in text and "bug" not in text
    return text


# ------------------------------------------------------------ hyperparameters

@pytest.mark.parametrize(("key", "value", "match"), [
    # 2^32-1 made `info` build a set of four billion layer numbers (15 GB in 24 s)
    ("qwen3moe.block_count", (U32, 2**32 - 1),
     rf"block_count .* is 4294967295, expected 1\.\.{MAX_LAYERS}"),
    # above LLAMA_MAX_LAYERS: GGML_ASSERT in llama_model_base::load_hparams
    ("qwen3moe.block_count", (U32, 1000), r"block_count .* is 1000, expected 1\.\.512"),
    ("qwen3moe.block_count", (U32, 0), r"block_count .* is 0"),
    ("qwen3moe.block_count", DROP, r"has no qwen3moe\.block_count"),
    ("qwen3moe.block_count", (F32, NAN), r"block_count should be an integer"),
    ("qwen3moe.block_count", (T.ARRAY, [6, 6], U32), r"block_count is an array of 2 values"),
    # llama-cpp-python allocates a token buffer of the training context per tokenize call
    ("qwen3moe.context_length", (U32, 2**32 - 1),
     rf"context_length .* is 4294967295, expected 1\.\.{MAX_CONTEXT}"),
    ("qwen3moe.context_length", (U32, 2**31 - 1), r"context_length .* is 2147483647"),
    ("qwen3moe.context_length", (U32, 0), r"context_length .* is 0"),
    # llama.cpp asserts 0 < n_expert_used <= n_expert <= LLAMA_MAX_EXPERTS
    ("qwen3moe.expert_used_count", (U32, 0), r"expert_used_count is 0, expected 1\.\.16"),
    ("qwen3moe.expert_used_count", (U32, 17), r"expert_used_count is 17, expected 1\.\.16"),
    ("qwen3moe.expert_used_count", (T.ARRAY, [4, 4, 4, 4, 4, -1], I32),
     r"expert_used_count .* is -1"),
    ("qwen3moe.expert_used_count", (T.ARRAY, [4, 4], U32),
     r"array of 2 values, expected 6 values, one per layer"),
    ("qwen3moe.expert_count", (U32, 2000), r"expert_count .* is 2000, expected 0\.\.1024"),
    ("qwen3moe.expert_group_count", (U32, 16), r"expert_group_count 16"),
    # ggml's norm kernels assert eps >= 0 (NaN fails it too), on the first decode
    ("qwen3moe.attention.layer_norm_rms_epsilon", (F32, NAN),
     r"layer_norm_rms_epsilon is nan, expected a finite"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", (F32, -1e-6),
     r"layer_norm_rms_epsilon is -1e-06, expected a small number >= 0"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", (F32, INF), r"is inf, expected a finite"),
    ("qwen3moe.attention.layer_norm_epsilon", (F32, -1.0), r"layer_norm_epsilon is -1"),
    ("qwen3moe.rope.freq_base", (F32, NAN), r"rope\.freq_base is nan"),
    ("qwen3moe.embedding_length", (U32, 2**32 - 1), r"embedding_length .* is 4294967295"),
    ("qwen3moe.attention.head_count", (U32, 2**31), r"head_count .* is 2147483648"),
    ("qwen3moe.attention.head_count_kv", (U32, 3),
     r"4 attention heads cannot share 3 key/value heads"),
    ("qwen3moe.vocab_size", (U32, 0), r"vocab_size .* is 0"),
])
def test_a_hostile_hyperparameter_is_one_line_naming_it(
        hostile: Callable[..., Path], key: str, value: Any, match: str) -> None:
    _refused(hostile(**{key.replace(".", "__"): value}), match)


@pytest.mark.parametrize(("value", "match"), [
    (1, "general.alignment is 1"),  # ggml: "buffer pointer must be aligned" (abort)
    (16, "general.alignment is 16"),
    (48, "general.alignment is 48"),  # not a power of two
    (2**31, "general.alignment is 2147483648"),
])
def test_a_hostile_alignment_is_refused(hostile: Callable[..., Path], value: int,
                                        match: str) -> None:
    _refused(hostile(general__alignment=(U32, value)), match)


def test_a_tensor_of_a_layer_past_block_count_is_refused(hostile: Callable[..., Path]) -> None:
    """It used to be listed as a MoE layer."""
    path = hostile(rename={f"blk.5.ffn_{k}_exps.weight": f"blk.9.ffn_{k}_exps.weight"
                           for k in ("gate", "up", "down")})
    _refused(path, r"tensor blk\.9\.ffn_\w+_exps\.weight belongs to layer 9, but "
                   r"qwen3moe\.block_count says the model has 6 layers \(0\.\.5\)")


def test_a_block_count_above_the_layers_present_is_refused(
        hostile: Callable[..., Path]) -> None:
    _refused(hostile(qwen3moe__block_count=(U32, 10)),
             r"says 10 layers, but the file has no tensors for layer 6 \(nor 3 more\)")


def test_expert_used_count_without_experts_is_refused(dense_model: Path,
                                                      hostile: Callable[..., Path]) -> None:
    """llama.cpp asserts n_expert_used == 0 when there are no experts."""
    _refused(hostile(base=dense_model, qwen3__expert_used_count=(U32, 2)),
             r"expert_used_count is 2, but the model has no qwen3\.expert_count")


def test_qwen3next_full_attention_interval_of_zero_is_refused(
        synth_model: Callable[..., Path], hostile: Callable[..., Path]) -> None:
    """It is a modulus in llama.cpp's layer pattern."""
    _refused(hostile(base=synth_model("qwen3next"),
                     qwen3next__full_attention_interval=(U32, 0)),
             r"full_attention_interval .* is 0")


@pytest.mark.parametrize("top_k", [15, 16])
def test_routing_all_or_all_but_one_expert_is_accepted(hostile: Callable[..., Path],
                                                       top_k: int) -> None:
    """llama.cpp accepts n_expert_used == n_expert (tests/engine checks it generates)."""
    info = read_model_info(hostile(qwen3moe__expert_used_count=(U32, top_k)))
    assert info.top_k == top_k and info.n_expert == 16


def test_dense_models_are_bounded_too(dense_model: Path, hostile: Callable[..., Path]) -> None:
    """The engine loads a dense model with the cache off: its header is checked all the
    same, before NotMoEError lets it through."""
    with pytest.raises(NotMoEError):
        read_model_info(dense_model)
    _refused(hostile(base=dense_model, qwen3__block_count=(U32, 2**32 - 1)), "block_count")


# ------------------------------------------------------------ the file format itself

def _tensor_info_at(data: bytes, name: bytes) -> int:
    """Offset just past a tensor's name in the tensor-info table (its n_dims field)."""
    at = data.rindex(len(name).to_bytes(8, "little") + name)
    return at + 8 + len(name)


@pytest.mark.parametrize(("at", "count", "match"), [
    (8, 2**40, "declares 1099511627776 tensors; the limit"),
    (8, 300_000, "truncated"),  # 25 bytes each at least: more than the file holds
    (16, 2**62, "declares 4611686018427387904 metadata entries; the limit"),
    (16, 300_000, "truncated"),
])
def test_huge_counts_fail_before_any_loop(six_layers: Path, tmp_path: Path, at: int,
                                          count: int, match: str) -> None:
    """The tensor count (bytes 8..16) and the KV count (16..24) of the header."""
    data = six_layers.read_bytes()
    path = tmp_path / "counts.gguf"
    path.write_bytes(data[:at] + count.to_bytes(8, "little") + data[at + 8:])
    _refused(path, match)


@pytest.mark.parametrize(("field", "value", "match"), [
    (0, (5).to_bytes(4, "little"), "has 5 dimensions; the limit is 4"),
    (4, (2**63 + 1).to_bytes(8, "little"), "negative dimension"),
    (4, (2**40).to_bytes(8, "little"), "more elements than fit in 64 bits|truncated"),
    (20, (9999).to_bytes(4, "little"), "unknown ggml type 9999"),
])
def test_a_hostile_tensor_info_is_refused(six_layers: Path, tmp_path: Path, field: int,
                                          value: bytes, match: str) -> None:
    """Offsets past n_dims of output.weight (2 dims): 0 n_dims, 4 ne0, 12 ne1, 20 type."""
    data = bytearray(six_layers.read_bytes())
    at = _tensor_info_at(bytes(data), b"output.weight") + field
    data[at:at + len(value)] = value
    if field == 4 and value == (2**40).to_bytes(8, "little"):
        data[at + 8:at + 16] = (2**40).to_bytes(8, "little")  # ne1 too: 2^80 elements
    path = tmp_path / "tensor.gguf"
    path.write_bytes(bytes(data))
    _refused(path, match)


def test_a_tensor_name_longer_than_ggml_allows_is_refused(six_layers: Path,
                                                          tmp_path: Path) -> None:
    data = bytearray(six_layers.read_bytes())
    name = b"output.weight"
    at = _tensor_info_at(bytes(data), name) - len(name) - 8
    data[at:at + 8] = (100).to_bytes(8, "little")
    path = tmp_path / "name.gguf"
    path.write_bytes(bytes(data))
    _refused(path, "tensor name is 100 bytes long; the limit is 63")


def test_nested_arrays_are_refused(hostile: Callable[..., Path]) -> None:
    """The stock reader made one Python object per element of each inner array."""
    _refused(hostile(x__nested=(T.ARRAY, [[1, 2], [3]], T.ARRAY)), "array of arrays")


# ------------------------------------------------------------ the CLI, bounded in memory

def _limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


@pytest.mark.parametrize(("key", "value"), [
    ("qwen3moe__block_count", (U32, 2**32 - 1)),
    ("qwen3moe__context_length", (U32, 2**32 - 1)),
])
def test_info_answers_in_one_line_within_bounded_memory(
        hostile: Callable[..., Path], key: str, value: Any) -> None:
    path = hostile(**{key: value})
    out = subprocess.run([sys.executable, "-m", "moescope", "info", str(path)],
                         capture_output=True, text=True, timeout=60, preexec_fn=_limited)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moescope: error: hostile.gguf: ")
    assert key.replace("__", ".") in lines[0]


def test_a_string_array_count_is_bounded_before_its_strings_are_walked(
        six_layers: Path, tmp_path: Path) -> None:
    """Zero bytes read as empty strings: in a sparse 17 GiB file a count of 2^31 used to
    walk two billion of them one by one (half an hour)."""
    data = bytearray(six_layers.read_bytes())
    key = b"tokenizer.ggml.tokens"
    at = data.index(key) + len(key) + 4 + 4  # value type, item type, then the count
    data[at:at + 8] = (2**31).to_bytes(8, "little")
    path = tmp_path / "strings.gguf"
    path.write_bytes(bytes(data))
    _refused(path, "declares 2147483648 strings in one array; the limit is")


@pytest.mark.parametrize(("arch", "key", "value", "match"), [
    # GGML_ASSERT(n_embd_head == n_rot) when the graph is built (qwen3moe.cpp, olmoe.cpp,
    # llama.cpp): no tensor shape depends on the rope dimensions
    ("qwen3moe", "rope.dimension_count", 8, "rope dimensions 8 differ; qwen3moe needs"),
    ("olmoe", "rope.dimension_count", 8, "differ; olmoe needs them equal"),
    ("olmoe", "attention.head_count", 512, "512 heads of 16 do not make up the hidden size 64"),
    # gpt-oss sizes its tensors by n_rot, its KV cache by the key and value lengths
    ("gpt-oss", "attention.value_length", 15, "value head size 15 and rope dimensions 16"),
    ("gpt-oss", "attention.key_length", 512, "key head size 512, value head size 16"),
    ("mixtral", "rope.dimension_count", 6, "differ; llama needs them equal"),
    # ggml's rope kernel: n_dims even and at most the head size
    ("gpt-oss", "rope.dimension_count", 7, r"rope\.dimension_count is 7, expected an even"),
    ("gpt-oss", "rope.dimension_count", 64, r"rope\.dimension_count is 64, expected an even"),
    # deepseek2: n_embd_head_qk_nope = key_length_mla - n_rot >= 1
    ("deepseek2", "rope.dimension_count", 16, r"rope\.dimension_count .*is 16, expected"),
    # qwen3next: num_v_heads % num_k_heads (a modulus by zero for 0)
    ("qwen3next", "ssm.group_count", 0, r"time_step_rank 4 is not a multiple of .*group_count 0"),
    ("qwen3next", "ssm.group_count", 3, r"time_step_rank 4 is not a multiple of .*group_count 3"),
    ("qwen3next", "ssm.inner_size", 8, r"inner_size is 8, expected .* = 64"),
    ("qwen35moe", "ssm.group_count", 3, r"time_step_rank 4 is not a multiple of .*group_count 3"),
    # ggml's rope kernel: GGML_ASSERT(sections[0] > 0 || ...), GGML_ASSERT(sect_dims <= ne0)
    ("qwen35moe", "rope.dimension_sections", [0, 0, 0, 0], r"sections is \[0, 0, 0, 0\]"),
    ("qwen35moe", "rope.dimension_sections", [40, 0, 0, 0], "at most the key head size 16"),
    ("qwen35moe", "rope.dimension_sections", [-1, 4, 4, 0], r"sections is \[-1, 4, 4, 0\]"),
    ("qwen3moe", "attention.head_count", 0, "head_count is 0"),
    # glm4moe: GGML_ASSERT(n_embd_head_v == n_embd_head_k); it rotates half of each head
    ("glm4moe", "attention.value_length", 8, "value head size 8 differ; glm4moe needs"),
    ("glm4moe", "rope.dimension_count", 18, r"rope\.dimension_count is 18, expected an even"),
])
def test_head_sizes_llama_cpp_asserts_on_are_refused(
        synth_model: Callable[..., Path], hostile: Callable[..., Path], arch: str, key: str,
        value: int | list[int], match: str) -> None:
    gguf_arch = "llama" if arch == "mixtral" else arch
    typed = (T.ARRAY, value, I32) if isinstance(value, list) \
        else (U32, value)
    path = hostile(base=synth_model(arch), **{f"{gguf_arch}.{key}".replace(".", "__"): typed})
    _refused(path, match)
