"""Synthetic models are deterministic, small, shaped like llama.cpp expects, and they load
and generate in llama-cpp-python (the ``engine`` tests)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
from gguf import GGMLQuantizationType, GGUFReader

from moescope_testing import (
    ARCHES,
    BROKEN_KINDS,
    MOE_ARCHES,
    SynthSpec,
    ensure_synth_model,
    estimate_file_bytes,
    expert_bytes_per_layer,
    preset,
    write_broken_file,
    write_dense_model,
    write_synth_model,
)
from moescope_testing.synth import main as synth_main
from moescope_testing.vocab import CONTROL_TOKENS, build_vocab

MiB = 2**20


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _tensors(path: Path) -> dict[str, tuple[tuple[int, ...], GGMLQuantizationType]]:
    reader = GGUFReader(path)
    return {t.name: (tuple(int(d) for d in t.shape), t.tensor_type) for t in reader.tensors}


# ----------------------------------------------------------------------- files


@pytest.mark.parametrize("arch", ARCHES)
def test_every_tiny_preset_is_under_2_mib(synth_model: Callable[..., Path], arch: str) -> None:
    assert synth_model(arch).stat().st_size < 2 * MiB


def test_same_spec_writes_identical_bytes(tmp_path: Path) -> None:
    spec = preset("tiny", "gpt-oss", expert_type="q8_0")
    a = write_synth_model(tmp_path / "a.gguf", spec)
    b = write_synth_model(tmp_path / "b.gguf", spec)
    assert _sha(a) == _sha(b)


def test_a_different_seed_gives_different_weights(tmp_path: Path) -> None:
    a = write_synth_model(tmp_path / "a.gguf", preset("tiny", "qwen3moe", seed=1))
    b = write_synth_model(tmp_path / "b.gguf", preset("tiny", "qwen3moe", seed=2))
    assert _sha(a) != _sha(b)


def test_estimate_matches_the_tensor_data_written(tmp_path: Path) -> None:
    spec = preset("tiny", "deepseek2", expert_type="q4_0")
    path = write_synth_model(tmp_path / "m.gguf", spec)
    reader = GGUFReader(path)
    assert path.stat().st_size - reader.data_offset == estimate_file_bytes(spec)


@pytest.mark.parametrize(
    ("expert_type", "qtype", "bytes_per_row_of_32"),
    [("f32", GGMLQuantizationType.F32, 128), ("q8_0", GGMLQuantizationType.Q8_0, 34),
     ("q4_0", GGMLQuantizationType.Q4_0, 18)],
)
def test_expert_tensors_have_llama_cpp_shapes_and_type(
    synth_model: Callable[..., Path], expert_type: str, qtype: GGMLQuantizationType,
    bytes_per_row_of_32: int,
) -> None:
    spec = preset("tiny", "qwen3moe", expert_type=expert_type)
    tensors = _tensors(synth_model("qwen3moe", expert_type=expert_type))
    D, F, E = spec.n_embd, spec.n_ff_exp, spec.n_expert
    assert tensors["blk.0.ffn_gate_exps.weight"] == ((D, F, E), qtype)
    assert tensors["blk.0.ffn_up_exps.weight"] == ((D, F, E), qtype)
    assert tensors["blk.0.ffn_down_exps.weight"] == ((F, D, E), qtype)
    assert tensors["blk.0.ffn_gate_inp.weight"] == ((D, E), GGMLQuantizationType.F32)
    assert expert_bytes_per_layer(spec) == 3 * D * F * E // 32 * bytes_per_row_of_32


def test_gpt_oss_has_biases_sinks_and_router_bias(synth_model: Callable[..., Path]) -> None:
    names = set(_tensors(synth_model("gpt-oss")))
    for suffix in ("ffn_gate_exps.bias", "ffn_up_exps.bias", "ffn_down_exps.bias",
                   "ffn_gate_inp.bias", "attn_sinks.weight", "attn_output.bias",
                   "post_attention_norm.weight"):
        assert f"blk.1.{suffix}" in names


def test_deepseek2_has_dense_leading_layers_mla_and_selection_bias(
    synth_model: Callable[..., Path],
) -> None:
    names = set(_tensors(synth_model("deepseek2", n_layers=4, n_dense_lead=2)))
    assert "blk.1.ffn_gate.weight" in names and "blk.1.ffn_gate_exps.weight" not in names
    assert "blk.2.ffn_gate_exps.weight" in names and "blk.2.exp_probs_b.bias" in names
    assert {"blk.2.attn_k_b.weight", "blk.2.attn_v_b.weight", "blk.2.attn_kv_a_mqa.weight",
            "blk.2.ffn_up_shexp.weight"} <= names


def test_qwen3next_mixes_linear_and_full_attention(synth_model: Callable[..., Path]) -> None:
    names = set(_tensors(synth_model("qwen3next", n_layers=4, merged_gate_up=True)))
    assert "blk.0.ssm_conv1d.weight" in names and "blk.0.attn_q.weight" not in names
    assert "blk.1.attn_q.weight" in names and "blk.1.ssm_conv1d.weight" not in names
    assert "blk.0.ffn_gate_up_exps.weight" in names and "blk.0.ffn_gate_exps.weight" not in names
    assert "blk.3.ffn_gate_inp_shexp.weight" in names


def test_mixtral_is_written_as_llama_with_experts(synth_model: Callable[..., Path]) -> None:
    reader = GGUFReader(synth_model("mixtral"))
    arch = reader.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
    assert reader.fields["llama.expert_count"].parts[-1][0] == 8


def test_dense_model_has_no_expert_tensors(tmp_path: Path) -> None:
    path = write_dense_model(tmp_path / "dense.gguf")
    assert not [n for n in _tensors(path) if "_exps" in n]


def test_ensure_synth_model_reuses_the_cached_file(tmp_path: Path) -> None:
    spec = preset("tiny", "olmoe")
    first = ensure_synth_model(tmp_path, spec)
    mtime = first.stat().st_mtime_ns
    assert ensure_synth_model(tmp_path, spec) == first
    assert first.stat().st_mtime_ns == mtime


def test_sparse_model_is_full_size_without_writing_data(tmp_path: Path) -> None:
    spec = preset("qwen3-30b-a3b-like", "qwen3moe", n_layers=4)
    path = write_synth_model(tmp_path / "sparse.gguf", spec, sparse=True)
    reader = GGUFReader(path)
    assert path.stat().st_size - reader.data_offset == estimate_file_bytes(spec)


# ----------------------------------------------------------------------- specs and presets


def test_presets_have_the_documented_geometry() -> None:
    cb = preset("copy-bound", "qwen3moe")
    assert (cb.n_layers, cb.n_expert, cb.top_k, cb.n_embd, cb.expert_type) == (
        16, 128, 8, 1024, "q8_0")
    q = preset("qwen3-30b-a3b-like", "qwen3moe", n_layers=6, expert_type="q8_0")
    assert (q.n_embd, q.n_expert, q.top_k, q.n_ff_exp, q.n_layers, q.expert_type) == (
        2048, 128, 8, 768, 6, "q8_0")


@pytest.mark.parametrize("arch", MOE_ARCHES)
@pytest.mark.parametrize("name", ["tiny", "copy-bound", "qwen3-30b-a3b-like"])
def test_every_preset_is_valid_for_every_moe_arch(arch: str, name: str) -> None:
    spec = preset(name, arch)
    assert spec.is_moe and spec.moe_layers


@pytest.mark.parametrize(
    "changes",
    [dict(expert_type="q8_0", n_embd=48, head_dim=12), dict(top_k=17), dict(n_head_kv=3),
     dict(arch="qwen3"), dict(arch="nope"), dict(expert_type="q5_k"), dict(merged_gate_up=True),
     dict(arch="qwen3next", full_attn_interval=4), dict(arch="olmoe")],
)
def test_invalid_specs_are_rejected(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        SynthSpec().replace(**changes)


def test_vocab_is_exact_size_with_valid_merges_and_chatml_tokens() -> None:
    vocab = build_vocab(400)
    assert vocab.size == 400 == len(vocab.token_types)
    assert len(set(vocab.tokens)) == vocab.size
    known = set(vocab.tokens)
    for merge in vocab.merges:
        a, b = merge.split(" ")
        assert {a, b, a + b} <= known
    assert all(t in known for t in CONTROL_TOKENS)
    assert vocab.tokens[vocab.eos_id] == "<|im_end|>"


def test_synth_cli_writes_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "x.gguf"
    assert synth_main(["--arch", "olmoe", "--preset", "tiny", "--expert-type", "q8_0",
                       "--set", "seed=3", "--out", str(out)]) == 0
    assert out.is_file() and str(out) in capsys.readouterr().out


@pytest.mark.parametrize("kind", BROKEN_KINDS)
def test_broken_files_are_not_valid_gguf(tmp_path: Path, kind: str) -> None:
    path = write_broken_file(tmp_path / f"{kind}.gguf", kind)
    with pytest.raises(Exception):  # noqa: B017 - any parser failure is the point
        GGUFReader(path)


# ----------------------------------------------------------------------- engine

ENGINE_CASES = [(arch, "f32") for arch in MOE_ARCHES] + [
    (arch, "q8_0") for arch in MOE_ARCHES] + [("qwen3moe", "q4_0"), ("gpt-oss", "q4_0")]


@pytest.fixture(scope="session")
def llama_cpp() -> ModuleType:
    """The llama_cpp module, or a clean skip when the engine is not built/installed."""
    try:
        import llama_cpp as module
    except (ImportError, OSError) as err:
        pytest.skip(f"llama_cpp is not importable: {err}")
    return module


def _greedy(llama_cpp: ModuleType, path: Path, n_new: int = 4) -> tuple[list[int], np.ndarray]:
    """Load, evaluate a prompt and decode ``n_new`` tokens greedily; return tokens and the
    logits of every step (checked finite by the callers)."""
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, verbose=False, logits_all=True)
    try:
        tokens = llm.tokenize(b"Hello, which expert is worth waiting for?", add_bos=False)
        llm.eval(tokens)
        steps: list[np.ndarray] = []
        generated: list[int] = []
        for _ in range(n_new):
            logits = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float32)
            steps.append(logits)
            token = int(np.argmax(logits))
            generated.append(token)
            llm.eval([token])
        return generated, np.stack(steps)
    finally:
        llm.close()


@pytest.mark.engine
@pytest.mark.parametrize(("arch", "expert_type"), ENGINE_CASES)
def test_model_loads_and_generates_with_finite_logits(
    llama_cpp: ModuleType, synth_model: Callable[..., Path], arch: str, expert_type: str,
) -> None:
    spec = preset("tiny", arch, expert_type=expert_type)
    tokens, logits = _greedy(llama_cpp, synth_model(arch, expert_type=expert_type))
    assert len(tokens) == 4 and all(0 <= t < spec.vocab_size for t in tokens)
    assert logits.shape == (4, spec.vocab_size)
    assert np.isfinite(logits).all()
    assert 0.1 < float(logits.std()) < 10.0, "activations should stay in a sane range"


@pytest.mark.engine
@pytest.mark.parametrize(
    ("arch", "overrides"),
    [("qwen3next", dict(merged_gate_up=True, n_layers=4, expert_type="q8_0")),
     ("deepseek2", dict(merged_gate_up=True, q_lora_rank=0, n_dense_lead=0, n_layers=2)),
     ("deepseek2", dict(n_dense_lead=2, n_layers=4, weight_type="f16")),
     ("qwen3", {}), ("llama", {})],
)
def test_variants_and_dense_models_load_and_generate(
    llama_cpp: ModuleType, synth_model: Callable[..., Path], arch: str,
    overrides: dict[str, object],
) -> None:
    _, logits = _greedy(llama_cpp, synth_model(arch, **overrides), n_new=2)
    assert np.isfinite(logits).all()


@pytest.mark.engine
def test_greedy_generation_is_repeatable(llama_cpp: ModuleType, tiny_moe: Path) -> None:
    first, logits_a = _greedy(llama_cpp, tiny_moe)
    second, logits_b = _greedy(llama_cpp, tiny_moe)
    assert first == second
    np.testing.assert_array_equal(logits_a, logits_b)


@pytest.mark.engine
def test_chat_template_and_metadata_reach_llama_cpp(llama_cpp: ModuleType, tiny_moe: Path) -> None:
    llm = llama_cpp.Llama(model_path=str(tiny_moe), n_ctx=128, verbose=False)
    try:
        assert llm.metadata["general.architecture"] == "qwen3moe"
        assert llm.metadata["qwen3moe.expert_count"] == "16"
        reply = llm.create_chat_completion(
            messages=[{"role": "user", "content": "Hi"}], max_tokens=3, temperature=0.0)
        assert reply["usage"]["completion_tokens"] >= 1
    finally:
        llm.close()
