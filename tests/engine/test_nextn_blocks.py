"""Multi-token prediction (NextN) blocks: GLM-4.5's and Qwen3-Next's GGUFs may end with
blocks (``nextn_predict_layers``) whose experts llama.cpp's decoder never routes to and does
not load. They were counted as MoE layers: slots, the RAM tier's plan and traces had a layer
the engine never runs, and their bytes were priced as memory the model would take."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import exact_prompt, forced_stream, reference_kwargs
from gguf import GGUFReader, GGUFValueType

from moescope.engine import Sampling
from moescope.model.gguf_info import read_model_info
from moescope.util.errors import NotMoEError
from moescope_testing.hostile import rewrite_gguf

U32 = GGUFValueType.UINT32


def _logits(engine: Callable[..., object], path: Path, **kw: object) -> np.ndarray:
    e = engine(path, **kw)
    return e.forced_logits(exact_prompt(), forced_stream(e._llm.n_vocab(), 24))  # type: ignore[attr-defined]


def test_a_nextn_block_is_neither_routed_nor_counted(
        synth_model: Callable[..., Path], engine: Callable[..., object],
        tmp_path: Path) -> None:
    full = synth_model("glm4moe")  # a dense layer, two MoE layers, a NextN block
    plain = synth_model("glm4moe", n_layers=3, n_nextn=0)  # the same trunk, no NextN
    trunk_only = rewrite_gguf(plain, tmp_path / "trunk-only.gguf", set_keys={
        "glm4moe.block_count": (U32, 4), "glm4moe.nextn_predict_layers": (U32, 1)})
    infos = {p: read_model_info(p) for p in (full, plain, trunk_only)}
    for info in infos.values():
        assert info.moe_layers == (1, 2) and info.dense_layers == (0,)
    assert infos[full].nextn_layers == infos[trunk_only].nextn_layers == (3,)
    assert infos[plain].nextn_layers == () and infos[plain].nextn_bytes == 0
    assert infos[trunk_only].nextn_bytes == 0
    tensors = sum(int(t.n_bytes) for t in GGUFReader(full).tensors)
    f = infos[full]
    assert f.nextn_bytes > f.bytes_per_expert[1] * f.n_expert  # its own experts and more
    assert f.total_expert_bytes + f.non_expert_bytes + f.nextn_bytes == tensors
    assert f.total_expert_bytes == infos[plain].total_expert_bytes
    assert f.non_expert_bytes == infos[plain].non_expert_bytes
    # the engine runs the same trunk: the same logits from all three files, the cache exact
    reference = _logits(engine, plain, **reference_kwargs())
    assert np.isfinite(reference).all()
    for path in (full, trunk_only):
        assert np.array_equal(_logits(engine, path, budget="25%", policy="exact"), reference)
    assert np.array_equal(_logits(engine, full, budget="25%", policy="exact",
                                  ram_budget="50%"), reference)
    e = engine(full, budget="25%", policy="psr")
    for _ in e.generate("Hello", Sampling(max_tokens=3, seed=1)):  # type: ignore[attr-defined]
        pass
    routes = e.last_routes([1, 2, 3])  # type: ignore[attr-defined]
    assert routes is not None and routes[3].tolist() == [True, True, False]


def test_a_file_of_nextn_blocks_only_is_refused_in_one_line(
        synth_model: Callable[..., Path], tmp_path: Path) -> None:
    """llama.cpp can write the MTP block alone, as a draft model: not a model to chat with."""
    draft = rewrite_gguf(synth_model("glm4moe", n_layers=3, n_nextn=0), tmp_path / "d.gguf",
                         set_keys={"glm4moe.nextn_predict_layers": (U32, 3)})
    with pytest.raises(NotMoEError, match="multi-token prediction block") as err:
        read_model_info(draft)
    assert "\n" not in str(err.value) and "d.gguf" in str(err.value)
