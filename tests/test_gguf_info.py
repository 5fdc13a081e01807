"""``read_model_info`` describes a GGUF's experts from its header, and only its header."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from moescope.model.gguf_info import read_model_info
from moescope.util.errors import ModelFileNotFoundError, ModelFormatError, NotMoEError
from moescope_testing import MOE_ARCHES, preset, write_synth_model

# Bytes of one row of 32 weights, by expert type.
ROW32 = {"f32": 128, "q8_0": 34, "q4_0": 18}


def _expected_bytes_per_expert(arch: str, expert_type: str) -> int:
    spec = preset("tiny", arch, expert_type=expert_type)
    D, F = spec.n_embd, spec.n_ff_exp
    weights = 3 * D * F // 32 * ROW32[expert_type]
    biases = (2 * F + D) * 4 if arch == "gpt-oss" else 0
    return weights + biases


@pytest.mark.parametrize("arch", MOE_ARCHES)
@pytest.mark.parametrize("expert_type", ["f32", "q8_0", "q4_0"])
def test_reports_layers_experts_top_k_and_bytes_per_expert(
    synth_model: Callable[..., Path], arch: str, expert_type: str,
) -> None:
    spec = preset("tiny", arch, expert_type=expert_type)
    info = read_model_info(synth_model(arch, expert_type=expert_type))
    assert info.architecture == spec.gguf_arch
    assert info.n_layers == spec.n_layers
    assert info.moe_layers == spec.moe_layers
    assert (info.n_expert, info.top_k) == (spec.n_expert, spec.top_k)
    expected = _expected_bytes_per_expert(arch, expert_type)
    assert set(info.bytes_per_expert.values()) == {expected}
    assert info.total_expert_bytes == expected * spec.n_expert * len(spec.moe_layers)
    assert sum(info.expert_bytes_by_type().values()) == expected


def test_deepseek2_leading_dense_layers_are_not_moe_layers(
    synth_model: Callable[..., Path],
) -> None:
    info = read_model_info(synth_model("deepseek2", n_layers=5, n_dense_lead=2))
    assert info.dense_layers == (0, 1)
    assert info.moe_layers == (2, 3, 4)
    assert info.n_expert_shared == 1


def test_merged_gate_up_counts_as_gate_plus_up(synth_model: Callable[..., Path]) -> None:
    merged = read_model_info(synth_model("qwen3next", merged_gate_up=True, expert_type="q8_0"))
    split = read_model_info(synth_model("qwen3next", expert_type="q8_0"))
    assert [t.kind for t in merged.expert_tensors[0]] == ["gate_up", "down"]
    assert merged.bytes_per_expert == split.bytes_per_expert


def test_gpt_oss_expert_biases_are_listed_per_tensor(synth_model: Callable[..., Path]) -> None:
    info = read_model_info(synth_model("gpt-oss", expert_type="q8_0"))
    parts = [(t.kind, t.part, t.ggml_type) for t in info.expert_tensors[0]]
    assert parts == [("gate", "weight", "q8_0"), ("gate", "bias", "f32"),
                     ("up", "weight", "q8_0"), ("up", "bias", "f32"),
                     ("down", "weight", "q8_0"), ("down", "bias", "f32")]
    assert info.expert_bytes_by_type() == {"q8_0": 6528, "f32": 512}


def test_expert_and_non_expert_bytes_add_up_to_all_tensor_bytes(tiny_moe: Path) -> None:
    info = read_model_info(tiny_moe)
    reader = GGUFReader(tiny_moe)
    assert info.total_expert_bytes + info.non_expert_bytes == sum(
        int(t.n_bytes) for t in reader.tensors)
    assert info.n_tensors == len(reader.tensors)
    assert info.file_size == tiny_moe.stat().st_size


def test_each_expert_is_a_contiguous_byte_range_at_the_reported_offset(
    synth_model: Callable[..., Path],
) -> None:
    path = synth_model("olmoe", expert_type="q8_0")
    info = read_model_info(path)
    down = next(t for t in info.expert_tensors[1] if t.kind == "down")
    stacked = {t.name: t for t in GGUFReader(path).tensors}[down.name].data  # [E, D, bytes]
    raw = path.read_bytes()
    for e in (0, 5, info.n_expert - 1):
        start = down.data_offset + e * down.bytes_per_expert
        assert raw[start:start + down.bytes_per_expert] == np.ascontiguousarray(
            stacked[e]).tobytes()


def test_metadata_hash_covers_header_but_not_tensor_data(tmp_path: Path) -> None:
    spec = preset("tiny", "qwen3moe")
    a = write_synth_model(tmp_path / "a.gguf", spec)
    b = write_synth_model(tmp_path / "b.gguf", spec)
    data_offset = GGUFReader(b).data_offset
    with b.open("r+b") as f:  # scribble over the tensor data
        f.seek(data_offset + 100)
        f.write(b"\xff" * 64)
    c = write_synth_model(tmp_path / "c.gguf", spec.replace(top_k=2))
    hash_a, hash_b = read_model_info(a).metadata_sha256, read_model_info(b).metadata_sha256
    assert hash_a == hash_b
    assert read_model_info(c).metadata_sha256 != hash_a
    assert len(hash_a) == 64


def test_a_17_gib_model_is_described_without_reading_its_data(tmp_path: Path) -> None:
    """The file is sparse: reading its tensor data would take minutes, not milliseconds."""
    spec = preset("qwen3-30b-a3b-like", "qwen3moe")
    path = write_synth_model(tmp_path / "big.gguf", spec, sparse=True)
    assert path.stat().st_size > 16 * 2**30
    info = read_model_info(path)
    assert info.moe_layers == tuple(range(48))
    assert info.bytes_per_expert[0] == 3 * 2048 * 768 // 32 * 18
    assert info.total_expert_bytes == info.bytes_per_expert[0] * 128 * 48


def test_per_layer_expert_used_count_array_reads_as_its_maximum(tmp_path: Path) -> None:
    import gguf

    path = tmp_path / "arr.gguf"
    w = gguf.GGUFWriter(path, arch="qwen3moe")
    w.add_block_count(2)
    w.add_expert_count(4)
    w.add_array("qwen3moe.expert_used_count", [2, 3])
    for il in range(2):
        w.add_tensor(f"blk.{il}.ffn_down_exps.weight", np.zeros((4, 8, 32), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    info = read_model_info(path)
    assert info.top_k == 3
    assert info.bytes_per_expert == {0: 8 * 32 * 4, 1: 8 * 32 * 4}


def test_to_dict_is_json_serializable(tiny_moe: Path) -> None:
    data = json.loads(json.dumps(read_model_info(tiny_moe).to_dict()))
    assert data["n_expert"] == 16 and data["moe_layers"] == [0, 1]


# ----------------------------------------------------------------------- errors


def test_dense_model_raises_not_moe(dense_model: Path) -> None:
    with pytest.raises(NotMoEError, match="dense"):
        read_model_info(dense_model)


def test_dense_model_can_be_described_when_moe_is_not_required(dense_model: Path) -> None:
    info = read_model_info(dense_model, require_moe=False)
    assert not info.is_moe and info.moe_layers == () and info.total_expert_bytes == 0


@pytest.mark.parametrize(
    ("kind", "match"),
    [("random", "not a GGUF"), ("empty", "empty"), ("bad_magic", "not a GGUF"),
     ("truncated_header", "truncated"),
     # where the cut is in the tensors' data, not "its header needs" that many bytes: the
     # whole file's size, from the header's tensor table
     ("truncated_data", r"file is truncated: it is .* but should be [0-9,]+ bytes.* \(incomplete"),
     ("bad_version", "version")],
)
def test_broken_files_raise_one_clear_model_format_error(
    broken_file: Callable[[str], Path], kind: str, match: str,
) -> None:
    with pytest.raises(ModelFormatError, match=match) as err:
        read_model_info(broken_file(kind))
    assert "\n" not in str(err.value)


def test_missing_file_raises_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(ModelFileNotFoundError, match="no such file"):
        read_model_info(tmp_path / "nope.gguf")


def test_directory_is_not_a_model(tmp_path: Path) -> None:
    with pytest.raises(ModelFormatError, match="directory"):
        read_model_info(tmp_path)


def test_a_device_or_fifo_is_not_a_model(tmp_path: Path) -> None:
    """/dev/null read as "null: file is empty" (its size, and its name cut to the last
    part); a FIFO would have been read as empty too."""
    with pytest.raises(ModelFormatError, match=r"^/dev/null: not a regular file, not a GGUF"):
        read_model_info(Path("/dev/null"))
    fifo = tmp_path / "pipe.gguf"
    os.mkfifo(fifo)
    with pytest.raises(ModelFormatError, match="not a regular file"):
        read_model_info(fifo)


@pytest.mark.parametrize("cut", [24, 64, 1000, 5000])
def test_any_cut_inside_the_header_is_reported_as_truncated(tiny_moe: Path, tmp_path: Path,
                                                             cut: int) -> None:
    path = tmp_path / "cut.gguf"
    path.write_bytes(tiny_moe.read_bytes()[:cut])
    with pytest.raises(ModelFormatError, match="truncated"):
        read_model_info(path)


@pytest.mark.parametrize("key", [b"tokenizer.ggml.token_type", b"tokenizer.ggml.tokens"])
def test_corrupt_array_length_fails_fast_instead_of_looping(tiny_moe: Path, tmp_path: Path,
                                                            key: bytes) -> None:
    data = bytearray(tiny_moe.read_bytes())
    at = data.index(key) + len(key) + 4 + 4  # value type, item type, then the count
    data[at:at + 8] = (2**62).to_bytes(8, "little")
    path = tmp_path / "corrupt.gguf"
    path.write_bytes(bytes(data))
    with pytest.raises(ModelFormatError):
        read_model_info(path)


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="needs a non-root POSIX user")
def test_unreadable_file_is_reported(tiny_moe: Path, tmp_path: Path) -> None:
    path = tmp_path / "locked.gguf"
    path.write_bytes(tiny_moe.read_bytes())
    path.chmod(0)
    with pytest.raises(ModelFileNotFoundError, match="cannot"):
        read_model_info(path)
