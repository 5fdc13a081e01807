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


@pytest.mark.parametrize("arch", ["glm4moe", "qwen3next", "qwen35moe"])
def test_a_nextn_block_is_neither_routed_nor_counted(
        synth_model: Callable[..., Path], engine: Callable[..., object], tmp_path: Path,
        arch: str) -> None:
    if arch == "glm4moe":  # a dense layer, two MoE layers, a NextN block
        full, plain = synth_model(arch), synth_model(arch, n_layers=3, n_nextn=0)
        moe, dense, nextn = (1, 2), (0,), (3,)
    else:  # a linear and a full attention layer, a NextN block
        full, plain = synth_model(arch, n_layers=3, n_nextn=1), synth_model(arch)
        moe, dense, nextn = (0, 1), (), (2,)
    files = [full, plain]
    if arch == "glm4moe":  # the NextN block declared, its tensors left out (as converted)
        files.append(rewrite_gguf(plain, tmp_path / "trunk-only.gguf", set_keys={
            f"{arch}.block_count": (U32, 4), f"{arch}.nextn_predict_layers": (U32, 1)}))
    infos = [read_model_info(p) for p in files]
    for info in infos:
        assert info.moe_layers == moe and info.dense_layers == dense
    assert infos[0].nextn_layers == nextn and infos[1].nextn_layers == ()
    assert infos[1].nextn_bytes == 0 and all(i.nextn_layers == nextn for i in infos[2:])
    tensors = sum(int(t.n_bytes) for t in GGUFReader(full).tensors)
    f = infos[0]
    assert f.nextn_bytes > f.bytes_per_expert[moe[0]] * f.n_expert  # its own experts and more
    assert f.total_expert_bytes + f.non_expert_bytes + f.nextn_bytes == tensors
    assert f.total_expert_bytes == infos[1].total_expert_bytes
    assert f.non_expert_bytes == infos[1].non_expert_bytes
    # the engine runs the same trunk: the same logits from every file, the cache exact
    reference = _logits(engine, plain, **reference_kwargs())
    assert np.isfinite(reference).all()
    for path in files:
        assert np.array_equal(_logits(engine, path, budget="25%", policy="exact"), reference)
    assert np.array_equal(_logits(engine, full, budget="25%", policy="exact",
                                  ram_budget="50%"), reference)
    e = engine(full, budget="25%", policy="psr")
    for _ in e.generate("Hello", Sampling(max_tokens=3, seed=1)):  # type: ignore[attr-defined]
        pass
    routes = e.last_routes([*moe, *nextn])  # type: ignore[attr-defined]
    assert routes is not None and routes[3].tolist() == [True, True, False]


def test_a_file_of_nextn_blocks_only_is_refused_in_one_line(
        synth_model: Callable[..., Path], tmp_path: Path) -> None:
    """llama.cpp can write the MTP block alone, as a draft model: not a model to chat with."""
    draft = rewrite_gguf(synth_model("glm4moe", n_layers=3, n_nextn=0), tmp_path / "d.gguf",
                         set_keys={"glm4moe.nextn_predict_layers": (U32, 3)})
    with pytest.raises(NotMoEError, match="multi-token prediction block") as err:
        read_model_info(draft)
    assert "\n" not in str(err.value) and "d.gguf" in str(err.value)
