"""Inputs the fuzzer found (issue 14), kept as tests: each used to abort llama.cpp (a
GGML_ASSERT, the process killed by SIGABRT) and now ends in one line naming the value.

The files are rebuilt from the seed model the campaign mutated, with the same change the
fuzzer made (a flipped byte that renamed a key, so llama.cpp used its default, or a value changed).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from fuzz_helpers import explain
from gguf import GGUFValueType as T

from moescope_testing import fuzzgen
from moescope_testing.forkrun import ForkRunner
from moescope_testing.hostile import DROP, rewrite_gguf

U32 = T.UINT32

# (id, seed, changes to it, what the one line must say)
FOUND: list[tuple[str, str, dict[str, Any], str]] = [
    # byte flip: rope.dimension_count -> rope.dimensioncount; the default n_rot (the key
    # length, 24) left no non-rotary part: GGML_ASSERT(n_embd_head_qk_nope >= 1)
    ("rope-dim-renamed", "deepseek2", {"deepseek2.rope.dimension_count": DROP,
                          "deepseek2.rope.dimensioncount": (U32, 8)},
     "rope.dimension_count is 24, expected an even number from 2 to 15"),
    # byte flip: attention.head_count_kv -> attentionnhead_count_kv; the default (the
    # head count) gave MLA's latent cache the wrong row size: GGML_ASSERT(a->ne[0] ==
    # b->ne[0]) in the first decode
    ("kv-heads-renamed", "deepseek2", {"deepseek2.attention.head_count_kv": DROP,
                          "deepseek2.attentionnhead_count_kv": (U32, 1)},
     "head_count_kv is 2 (absent: the head count), expected 1"),
    ("kv-heads-2", "deepseek2", {"deepseek2.attention.head_count_kv": (U32, 2)},
     "head_count_kv is 2"),
    # the same assert from a key length that is not the latent's (found by the targeted
    # sweep that followed)
    ("key-length", "deepseek2", {"deepseek2.attention.key_length": (U32, 25)},
     "key_length is 25, expected kv_lora_rank + rope.dimension_count = 24"),
    # a gating function outside llama.cpp's enum: GGML_ABORT in build_moe_ffn
    ("gating-2000", "deepseek2", {"deepseek2.expert_gating_func": (U32, 2000)},
     "expert_gating_func (the expert gating function: 1 softmax, 2 sigmoid, 3 softmax of "
     "the weights, 4 sqrt-softplus) is 2000, expected 0..4"),
    # rope dimensions one short of the head: GGML_ASSERT(n_embd_head == n_rot) (odd, so
    # also refused by the rope kernel check)
    ("rope-15", "qwen3moe", {"qwen3moe.rope.dimension_count": (U32, 15)},
     "rope.dimension_count is 15, expected an even number from 2 to 16"),
]


@pytest.fixture(scope="module")
def seeds(fuzz_bases: tuple[list[Path], list[Path]]) -> dict[str, Path]:
    """The campaign's seed models by architecture."""
    return {m.name.split("-")[0]: m for m in fuzz_bases[0]}


def _engine_ready() -> bool:
    try:
        from moescope.engine.bindings import is_patched

        return bool(is_patched())
    except Exception:
        return False


@pytest.mark.parametrize(("seed", "changes", "message"), [f[1:] for f in FOUND],
                         ids=[f[0] for f in FOUND])
@pytest.mark.parametrize("command", ["info", "generate"])
def test_found_headers_end_in_one_line(fork_runner: ForkRunner, seeds: dict[str, Path],
                                       command: str, seed: str, changes: dict[str, Any],
                                       message: str) -> None:
    if command == "generate" and not _engine_ready():
        pytest.skip("the patched engine is not installed")
    path = rewrite_gguf(seeds[seed], fork_runner.scratch / "found.gguf", set_keys=changes)
    argv = [command, path.name] + (["--n", "1", "--prompt", "Hi"] if command == "generate"
                                   else [])
    r = fork_runner.run(argv, cwd=fork_runner.scratch)
    assert r.outcome == "error", explain(r)
    assert r.stderr.startswith("moescope: error: found.gguf: ") and message in r.stderr


def test_a_tensor_offset_near_2_64_is_one_line(fork_runner: ForkRunner,
                                              seeds: dict[str, Path]) -> None:
    """Found by the campaign: an offset of 2^64-12 overflowed the stock reader's sum,
    and numpy's RuntimeWarning came out on stderr above the error."""
    doc = fuzzgen.read_doc(seeds["qwen3moe"])
    doc.tensors[0].offset = 2**64 - 12
    path = fork_runner.scratch / "offset.gguf"
    path.write_bytes(fuzzgen.encode_doc(doc))
    r = fork_runner.run(["info", path.name], cwd=fork_runner.scratch)
    assert r.outcome == "error", explain(r)
    assert "has data offset 18446744073709551604, beyond any file" in r.stderr


@pytest.mark.parametrize("seed", ["qwen3moe", "deepseek2"])
def test_the_seeds_themselves_load(fork_runner: ForkRunner, seeds: dict[str, Path],
                                   seed: str) -> None:
    """The checks refuse only the broken values: the seeds, as written, generate."""
    if not _engine_ready():
        pytest.skip("the patched engine is not installed")
    r = fork_runner.run(["generate", str(seeds[seed]), "--n", "1", "--prompt", "Hi"])
    assert r.outcome == "ok", explain(r)


@pytest.mark.parametrize("command", ["info", "generate"])
def test_an_expert_tensor_without_dimensions_is_one_line(fork_runner: ForkRunner,
                                                         seeds: dict[str, Path],
                                                         command: str) -> None:
    """Found by the 10,000-input campaign: an expert tensor info with 0 dimensions (shape
    ``()``) ended ``info`` and ``generate`` in an IndexError traceback."""
    doc = fuzzgen.read_doc(seeds["qwen3moe"])
    tensor = next(t for t in doc.tensors if t.name == b"blk.1.ffn_up_exps.weight")
    tensor.dims = []
    path = fork_runner.scratch / "nodims.gguf"
    path.write_bytes(fuzzgen.encode_doc(doc))
    argv = [command, path.name] + (["--n", "1", "--prompt", "Hi"] if command == "generate"
                                   else [])
    r = fork_runner.run(argv, cwd=fork_runner.scratch)
    assert r.outcome == "error", explain(r)
    assert "tensor blk.1.ffn_up_exps.weight has shape [], which does not hold 4 experts" \
        in r.stderr
