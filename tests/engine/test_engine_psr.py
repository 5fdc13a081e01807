"""Paper 2 in the engine: PSR prefetch and the Cache-Prior routing bonus on real models.

Prefetch only changes what is resident, so with fetch-every-miss it must leave the logits
bitwise equal to the cache off; with copy delays (the prefetches' copies land late) the
psr preset must give the same logits; and on a real model the prediction must be useful:
prefetched experts get routed to far more often than chance.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from engine_helpers import (
    ARCHES,
    PROMPT,
    exact_prompt,
    forced_stream,
    gpu_offload,
    reference_kwargs,
)

from moescope.cache.policy import PREFETCH_TOP_K, Policy
from moescope.engine import Sampling
from moescope.util.resources import demo_model_path

EXACT_PREFETCH = Policy(prefetch=PREFETCH_TOP_K)


@pytest.mark.parametrize("arch", ARCHES)
def test_prefetch_keeps_exact_bitwise_identical_to_cache_off(
        synth_model: Callable[..., Path], engine: Callable[..., object], arch: str) -> None:
    path = synth_model(arch)
    ref = engine(path, **reference_kwargs())
    reference = ref.forced_logits(exact_prompt(), forced_stream(ref._llm.n_vocab(), 48))
    e = engine(path, budget="25%", policy=EXACT_PREFETCH)
    logits = e.forced_logits(exact_prompt(), forced_stream(e._llm.n_vocab(), 48))
    assert np.array_equal(logits, reference)
    assert sum(s.prefetches for s in e.layer_stats().values()) > 0


def test_psr_is_deterministic_under_random_copy_delays(
        synth_model: Callable[..., Path], engine: Callable[..., object]) -> None:
    path = synth_model("qwen3moe")
    plain = engine(path, budget="25%", policy="psr")
    baseline = plain.forced_logits(PROMPT, forced_stream(plain._llm.n_vocab()))
    stats = plain.layer_stats().values()
    assert sum(s.prefetches for s in stats) > 0
    assert sum(s.substitutions for s in stats) > 0  # the bonus really steered routing
    delayed = engine(path, budget="25%", policy="psr")
    delayed.set_copy_delay(400)
    logits = delayed.forced_logits(PROMPT, forced_stream(delayed._llm.n_vocab()))
    assert np.array_equal(logits, baseline)


def test_prediction_on_the_demo_model_beats_chance(engine: Callable[..., object]) -> None:
    """The next layer's router on this layer's input predicts its experts: the prefetched
    experts are used far more often than a random pick of the same size would be."""
    e = engine(demo_model_path(), budget="50%", policy=EXACT_PREFETCH)
    for _ in e.generate("ROMEO:\n", Sampling(max_tokens=48, temperature=0.0, top_k=1)):
        pass
    stats = list(e.layer_stats().values())
    prefetches = sum(s.prefetches for s in stats)
    hits = sum(s.prefetch_hits for s in stats)
    info = e.model.info
    chance = info.top_k / info.n_expert
    assert prefetches > 0
    assert hits / prefetches > 3 * chance, (hits, prefetches)


def test_recorded_prediction_is_the_layer_the_engine_prefetched(
        synth_model: Callable[..., Path], engine: Callable[..., object]) -> None:
    e = engine(synth_model("qwen3moe"), budget="25%", policy="psr")
    for _ in e.generate("Hello", Sampling(max_tokens=4, seed=1)):
        pass
    layers = e.model.info.moe_layers
    got = e.last_prediction(layers[0])
    assert got is not None
    nxt, scores = got
    assert nxt == layers[1] and scores.shape == (e.model.info.n_expert,)
    assert np.isfinite(scores).all()
    assert e.last_prediction(layers[-1]) is None  # the last layer predicts nothing
    if gpu_offload():  # layers on the GPU: experts read into its pinned host memory
        assert e.model.expert_buffer.endswith("_Host") and e.model.pinned_experts
    else:  # a CPU build has no pinned host memory: mapped from the file, or read into RAM
        assert e.model.expert_buffer == "CPU_Mapped" and not e.model.pinned_experts


def test_asking_for_pinned_experts_without_a_gpu_reads_them_into_ram(
        synth_model: Callable[..., Path], engine: Callable[..., object]) -> None:
    """Layers on the CPU: read into RAM, pinned where the build has a GPU (its host buffer
    type serves the CPU too), plain RAM on a CPU build; the logits do not change."""
    path = synth_model("qwen3moe")
    mapped = engine(path, budget="25%", policy="exact", n_gpu_layers=0)
    reference = mapped.forced_logits(PROMPT, forced_stream(mapped._llm.n_vocab(), 16))
    e = engine(path, budget="25%", policy="exact", pinned_experts=True, n_gpu_layers=0)
    if gpu_offload():
        assert e.model.expert_buffer.endswith("_Host") and e.model.pinned_experts
    else:
        assert e.model.expert_buffer == "CPU" and not e.model.pinned_experts
    assert np.array_equal(e.forced_logits(PROMPT, forced_stream(e._llm.n_vocab(), 16)),
                          reference)


@pytest.mark.parametrize("arch", ARCHES)
def test_the_core_is_handed_router_probabilities_on_every_architecture(
        synth_model: Callable[..., Path], engine: Callable[..., object], arch: str) -> None:
    """Cache-Prior compares probabilities and gives a substitute its own probability scaled
    as the router scaled the miss, which is right only if the core's ``probs`` are
    non-negative scores whose ratios are the gate weights' ratios. gpt-oss gates with a
    softmax over the selected logits, and llama.cpp's ``probs`` there are raw logits (some
    negative), so the glue hands the core their softmax instead."""
    e = engine(synth_model(arch), budget="25%", policy="cache-prior")
    for _ in e.generate("Hello", Sampling(max_tokens=3, seed=1)):
        pass
    for layer in e.model.info.moe_layers:
        probs, weights, ids = e.last_route(layer)
        assert (probs >= 0).all() and np.isfinite(probs).all()
        assert set(ids.tolist()) == set(np.argsort(-probs)[:len(ids)].tolist()) or \
            arch in ("deepseek2", "glm4moe")  # they select with an expert bias added
        np.testing.assert_allclose(weights / weights.sum(), probs[ids] / probs[ids].sum(),
                                   rtol=1e-4, atol=1e-6)


def test_batch_reads_of_every_layer_equal_a_read_per_layer(
        synth_model: Callable[..., Path], engine: Callable[..., object]) -> None:
    """``last_routes`` / ``last_predictions`` (what the trace recorder reads after every
    token, at once) give each layer what ``last_route`` / ``last_prediction`` give, as
    fresh arrays; a layer out of range is not found."""
    e = engine(synth_model("qwen3moe"), budget="25%", policy="psr")
    for _ in e.generate("Hello", Sampling(max_tokens=4, seed=1)):
        pass
    layers = [*e.model.info.moe_layers]
    probs, weights, ids, found = e.last_routes([*layers, 999, -1])
    assert found.tolist() == [True] * len(layers) + [False, False]
    nxt, scores = e.last_predictions([*layers, 999])
    for j, layer in enumerate(layers):
        p, w, i = e.last_route(layer)
        np.testing.assert_array_equal(probs[j], p)
        np.testing.assert_array_equal(weights[j], w)
        np.testing.assert_array_equal(ids[j], i)
        one = e.last_prediction(layer)
        assert (one is None) == (nxt[j] <= 0)
        if one is not None:
            assert one[0] == nxt[j]
            np.testing.assert_array_equal(scores[j], one[1])
    assert nxt[-1] <= 0
    again = e.last_routes(layers)
    assert again is not None and again[0] is not probs  # fresh: a token's record keeps them
    again[0][:] = -1
    np.testing.assert_array_equal(e.last_routes(layers)[0], probs[:len(layers)])
