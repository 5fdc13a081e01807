"""The shipped demo model (resources/models/): metadata, and that stock llama.cpp runs it.

Why: the demo model is the one binary the repository carries and the default model of the
app; a regenerated or corrupted file must still be a qwen3moe that the cache can exercise
(enough experts and layers), with the tokenizer and chat template the chat UI relies on.
The file is produced by packaging/train_demo_model.py (see docs/demo-model.md).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

MODEL = Path(__file__).resolve().parents[1] / "resources" / "models" / "moescope-demo-qwen3moe.gguf"
ARCH = "qwen3moe"


@pytest.fixture(scope="module")
def reader() -> gguf.GGUFReader:
    if not MODEL.exists():
        pytest.fail(f"the demo model is missing: {MODEL}")
    return gguf.GGUFReader(str(MODEL))


def field(reader: gguf.GGUFReader, key: str) -> Any:
    """A metadata value, or None when the key is absent."""
    f = reader.fields.get(key)
    return None if f is None else f.contents()


def test_file_is_small_enough_to_ship() -> None:
    assert MODEL.stat().st_size <= 24 * 1024 * 1024


def test_architecture_and_moe_shape(reader: gguf.GGUFReader) -> None:
    assert field(reader, "general.architecture") == ARCH
    n_expert = field(reader, f"{ARCH}.expert_count")
    n_used = field(reader, f"{ARCH}.expert_used_count")
    n_layer = field(reader, f"{ARCH}.block_count")
    n_embd = field(reader, f"{ARCH}.embedding_length")
    n_ff_exp = field(reader, f"{ARCH}.expert_feed_forward_length")
    assert n_expert >= 64
    assert n_used >= 4
    assert n_layer >= 4
    for key in ("context_length", "attention.head_count", "attention.head_count_kv",
                "attention.key_length", "attention.value_length",
                "attention.layer_norm_rms_epsilon", "rope.freq_base"):
        assert field(reader, f"{ARCH}.{key}") is not None, key
    tensors = {t.name: t for t in reader.tensors}
    for layer in range(n_layer):
        for kind in ("gate", "up"):
            t = tensors[f"blk.{layer}.ffn_{kind}_exps.weight"]
            assert [int(x) for x in t.shape] == [n_embd, n_ff_exp, n_expert]
        t = tensors[f"blk.{layer}.ffn_down_exps.weight"]
        assert [int(x) for x in t.shape] == [n_ff_exp, n_embd, n_expert]
        assert [int(x) for x in tensors[f"blk.{layer}.ffn_gate_inp.weight"].shape] == [
            n_embd, n_expert]


def test_tokenizer_and_chat_template(reader: gguf.GGUFReader) -> None:
    assert field(reader, "tokenizer.ggml.model") == "gpt2"
    assert field(reader, "tokenizer.ggml.pre")
    tokens = field(reader, "tokenizer.ggml.tokens")
    assert 256 < len(tokens) <= 4096
    assert len(field(reader, "tokenizer.ggml.token_type")) == len(tokens)
    assert len(field(reader, "tokenizer.ggml.merges")) > 0
    for key in ("bos_token_id", "eos_token_id", "padding_token_id"):
        assert 0 <= field(reader, f"tokenizer.ggml.{key}") < len(tokens)
    template = field(reader, "tokenizer.chat_template")
    assert "<|im_start|>" in template and "add_generation_prompt" in template
    for special in ("<|im_start|>", "<|im_end|>", "<|endoftext|>"):
        assert special in tokens
    assert tokens[field(reader, "tokenizer.ggml.eos_token_id")] == "<|im_end|>"
    embd = {t.name: t for t in reader.tensors}["token_embd.weight"]
    assert int(embd.shape[1]) == len(tokens)


def test_weights_are_finite(reader: gguf.GGUFReader) -> None:
    for t in reader.tensors:
        values = gguf.quants.dequantize(t.data, t.tensor_type)
        assert np.isfinite(values).all(), t.name


def _llama() -> Any:
    try:
        import llama_cpp
    except ImportError:
        pytest.skip("llama_cpp is not importable (build the engine or pip install "
                    "llama-cpp-python) - cannot run the demo model")

    return llama_cpp.Llama(model_path=str(MODEL), n_ctx=512, n_threads=2, seed=0,
                           verbose=False)


def _greedy(llm: Any, prompt: str, n: int = 48) -> str:
    llm.reset()
    out = llm.create_completion(prompt, max_tokens=n, temperature=0.0, top_k=1,
                                repeat_penalty=1.0, seed=0)
    return out["choices"][0]["text"]


@pytest.mark.engine
def test_greedy_generation_is_deterministic_and_on_topic() -> None:
    llm = _llama()
    verse = _greedy(llm, "ROMEO:")
    code = _greedy(llm, "def ")
    assert verse == _greedy(llm, "ROMEO:")
    assert code == _greedy(llm, "def ")
    # Shakespeare continues in words; Python continues a definition.
    assert sum(c.isalpha() for c in verse) > len(verse) / 2, verse
    assert "(" in code and ":" in code, code


@pytest.mark.engine
def test_chat_template_renders_and_stops() -> None:
    llm = _llama()
    res = llm.create_chat_completion(
        messages=[{"role": "user", "content": "Write some Python code."}],
        max_tokens=200, temperature=0.0, top_k=1, repeat_penalty=1.0, seed=0,
    )
    choice = res["choices"][0]
    assert choice["message"]["content"].strip()
    assert "<|im_start|>" not in choice["message"]["content"]
