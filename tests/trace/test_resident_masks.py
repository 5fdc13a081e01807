"""The token's optional ``resident`` masks: written only where the event rows do not explain
the cache's residency (PSR prefetches, budget shrinks), so that the rows plus the masks
rebuild the real resident sets token by token; absent otherwise, byte for byte as before;
strictly validated when read."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trace_helpers import MOE_LAYERS, psr_header, set_token_field

from moescope.cache.native import EVENT_DTYPE, FETCH, HIT, SUBSTITUTE, ExpertCache
from moescope.cache.policy import Policy
from moescope.cache.residency import Residency, mask_from_hex, mask_to_hex, read_resident
from moescope.engine.changes import ChangeLog
from moescope.trace import (
    Change,
    TokenRecord,
    TraceFormatError,
    TraceHeader,
    TraceRecorder,
    TraceWriter,
    read_trace,
)
from moescope_testing.traces import as_older_trace

RecordFn = Callable[..., Path]
N_EXPERT, TOP_K, SLOTS = 16, 4, 8
PROMPT = "The quick brown fox jumps over the lazy dog, again and again and again."


def _header(slots: int = SLOTS) -> TraceHeader:
    return psr_header(n_expert=N_EXPERT, top_k=TOP_K, slots=slots, sha="ef" * 32)


def _mask(*experts: int) -> np.ndarray:
    out = np.zeros(N_EXPERT, dtype=np.bool_)
    out[list(experts)] = True
    return out


def _token(i: int, resident: dict[int, np.ndarray] | None = None,
           events: np.ndarray | None = None, slots: int = SLOTS) -> TokenRecord:
    return TokenRecord(index=i, phase="prefill" if i == 0 else "decode", token_id=i, text="x",
                       seconds=0.001, policy="psr", slots_per_layer=slots,
                       events=np.zeros(0, dtype=EVENT_DTYPE) if events is None else events,
                       resident=resident)


def _row(layer: int, ids: list[int], action: list[int]) -> np.ndarray:
    row = np.zeros(1, dtype=EVENT_DTYPE)
    row["layer"], row["k"] = layer, len(ids)
    row["ids"][0, : len(ids)] = ids
    row["used_ids"][0, : len(ids)] = ids
    row["action"][0, : len(ids)] = action
    for count, code in (("n_hit", HIT), ("n_fetch", FETCH), ("n_substitute", SUBSTITUTE)):
        row[count] = action.count(code)  # the reader checks the counts against the actions
    return row


# --------------------------------------------------------------------------- format


@pytest.mark.parametrize("n_expert", [1, 16, 60, 128, 512])
def test_masks_round_trip_as_hex_bit_sets(n_expert: int) -> None:
    rng = np.random.default_rng(n_expert)
    for _ in range(20):
        mask = rng.random(n_expert) < 0.3
        text = mask_to_hex(mask)
        assert len(text) <= (n_expert + 3) // 4
        np.testing.assert_array_equal(mask_from_hex(text, n_expert), mask)
    assert mask_to_hex(np.zeros(n_expert, dtype=np.bool_)) == "0"
    assert mask_to_hex(_mask(0, 5)) == "21"  # bit e is expert e


def test_masks_are_written_sparse_in_layer_order_and_read_back(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    tokens = [_token(0), _token(1, {3: _mask(0, 15), 1: _mask(4, 5, 6)}), _token(2, {})]
    with TraceWriter(path, _header()) as writer:
        for t in tokens:
            writer.write_token(t)
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("resident", "absent") for line in lines[1:4]] == \
        ["absent", [[1, "70"], [3, "8001"]], []]
    trace = read_trace(path)
    assert trace.tokens[0].resident is None
    assert trace.tokens[2].resident == {}
    got = trace.tokens[1].resident
    assert got is not None and sorted(got) == [1, 3]
    np.testing.assert_array_equal(got[1], _mask(4, 5, 6))
    np.testing.assert_array_equal(got[3], _mask(0, 15))


@pytest.mark.parametrize("bad", [
    {"1": "70"}, [[1]], [[1, "70", 2]], [[0, "1"]], [[1, "1"], [1, "2"]], [["1", "1"]],
    [[True, "1"]], [[1, 112]], [[1, "0x70"]], [[1, "7F"]], [[1, ""]], [[1, " 70"]],
    [[1, "7_0"]], [[1, "-1"]], [[1, "10000"]], [[1, "1ff"]],
])
def test_a_malformed_mask_is_refused_naming_its_line(tmp_path: Path, bad: Any) -> None:
    """Not a list of [MoE layer, lowercase hex]; a repeated layer; an expert past the model
    (bit 16 of 16 experts); more residents (9) than the token's 8 slots."""
    path = tmp_path / "t.jsonl"
    with TraceWriter(path, _header()) as writer:
        writer.write_token(_token(0))
        writer.write_token(_token(1, {1: _mask(4, 5, 6)}))
    set_token_field(path, 2, "resident", bad)
    with pytest.raises(TraceFormatError, match=r"line 3: bad token record: .*resident"):
        read_trace(path)


# --------------------------------------------------------------------------- rebuild


@pytest.mark.parametrize("policy", ["exact", "quality-first", "speed-first", "cache-prior"])
def test_rows_alone_rebuild_the_cores_residency_when_nothing_prefetches(policy: str) -> None:
    """The rows-only rebuild (vectorized by layer) against the real core, batched steps
    included (several rows per layer, whose order matters); ``resident_masks`` agrees with
    ``layer_experts`` read layer by layer."""
    rng = np.random.default_rng(5)
    layers = (0, 1, 2)
    with ExpertCache(len(layers), N_EXPERT, TOP_K, 10, policy) as cache:
        residency = Residency(layers, N_EXPERT, 10)
        for step in range(1, 80):
            cache.begin_step()
            n_tokens = 1 if step % 4 else 2  # 8 experts at most: they fit
            for layer in layers:
                probs = rng.dirichlet(np.full(N_EXPERT, 0.3), size=n_tokens).astype(np.float32)
                ids = np.argsort(-probs, axis=1)[:, :TOP_K].astype(np.int32)
                cache.route(layer, probs, ids, np.take_along_axis(probs, ids, axis=1))
            residency.apply_rows(cache.drain_events(), step)
            real = cache.resident_masks(layers)
            np.testing.assert_array_equal(
                real, np.array([cache.layer_experts(layer) >= 0 for layer in layers]))
            np.testing.assert_array_equal(residency.resident, real, err_msg=f"step {step}")
        assert residency.resident.sum() == 10 * len(layers)  # the cache filled up


# --------------------------------------------------------------------------- recorder


class _Cache:
    """The cache as the recorder duck-types it; ``resident(layer)`` sets only, so this also
    covers the slowest accessor."""

    def __init__(self) -> None:
        self.sets: dict[int, set[int]] = {layer: set() for layer in MOE_LAYERS}

    def resident(self, layer: int) -> set[int]:
        return set(self.sets[layer])


class _Source:
    def __init__(self) -> None:
        self.policy = Policy.preset("psr")
        self.slots_per_layer = SLOTS
        self.cache = _Cache()
        self.changes = ChangeLog()


class _Stats:
    def __init__(self, index: int, events: np.ndarray, slots: int) -> None:
        self.index, self.token_id, self.text, self.seconds = index, index, "x", 0.001
        self.policy, self.slots_per_layer, self.events = "psr", slots, events


def test_the_recorder_writes_only_the_layers_the_rows_do_not_explain(tmp_path: Path) -> None:
    source = _Source()
    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(path, _header(), source=source)
    # token 0: layer 1 fetches 8 experts (rows explain it); layer 2 gets 7 prefetched
    source.cache.sets[1] = {2, 3, 4, 5, 9, 10, 11, 12}
    source.cache.sets[2] = {7}
    rows = np.concatenate([_row(1, [2, 3, 4, 5], [FETCH] * 4),
                           _row(1, [9, 10, 11, 12], [FETCH] * 4)])
    recorder.record(_Stats(0, rows, SLOTS), source)
    # token 1: nothing happens, the rows and last masks still explain it
    recorder.record(_Stats(1, np.zeros(0, dtype=EVENT_DTYPE), SLOTS), source)
    # token 2: a shrink to 4 slots that the guess (most recently used, then lower ids) gets
    # right: the field is written, empty, so a reader knows the shrink was checked
    source.changes.append(2, [Change("slots", slots=4)])
    source.slots_per_layer = 4
    source.cache.sets[1] = {2, 3, 4, 5}
    recorder.record(_Stats(2, _row(1, [2, 3, 4, 5], [HIT] * 4), 4), source)
    # token 3: a prefetch replaced 5 by 14 in layer 1, no row says so
    source.cache.sets[1] = {2, 3, 4, 14}
    recorder.record(_Stats(3, np.zeros(0, dtype=EVENT_DTYPE), 4), source)
    recorder.close()
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line.get("resident", "absent") for line in lines[1:5]] == \
        [[[2, "80"]], "absent", [], [[1, "401c"]]]
    trace = read_trace(path)
    residency = Residency(MOE_LAYERS, N_EXPERT, SLOTS)
    for tok in trace.tokens:
        residency.advance_token(tok)
        if tok.resident is not None:
            residency.apply_masks(tok.resident)
    np.testing.assert_array_equal(residency.resident, read_resident(source.cache, MOE_LAYERS,
                                                                    N_EXPERT))


def test_without_a_cache_to_read_nothing_is_written(tmp_path: Path) -> None:
    path = tmp_path / "t.jsonl"
    recorder = TraceRecorder(path, _header())
    recorder.record(_Stats(0, _row(1, [2, 3, 4, 5], [FETCH] * 4), SLOTS))
    recorder.close()
    assert "resident" not in json.loads(path.read_text().splitlines()[1])


# --------------------------------------------------------------------------- engine


def _record_with_truth(synth_model: Callable[..., Path], path: Path, *, policy: str,
                       budget: str, tokens: int = 24, answers: int = 1,
                       shrink_at: int | None = None, shrink_to: str = "25%"
                       ) -> list[np.ndarray]:
    """Record a session from the engine; returns, per token, the resident masks the live
    worker reads after it (``cache.layer_experts(layer) >= 0`` per MoE layer)."""
    from moescope.engine import Engine, Sampling

    engine = Engine()
    truth: list[np.ndarray] = []
    try:
        engine.load(synth_model("qwen3moe"), budget=budget, policy=policy, n_ctx=256,
                    n_threads=1)
        layers = engine.model.info.moe_layers
        recorder = TraceRecorder.for_engine(path, engine)
        prompt = PROMPT
        for answer in range(answers):
            sampling = Sampling(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0,
                                repeat_penalty=1.0, max_tokens=tokens, seed=(3, 7)[answer])
            for stats in engine.generate(prompt, sampling):
                recorder.record(stats, engine)
                truth.append(np.array([engine.cache.layer_experts(il) >= 0 for il in layers]))
                if shrink_at is not None and answer == 0 and stats.index + 1 == shrink_at:
                    engine.request_budget(shrink_to)
            if recorder.end_answer(engine) is not None:  # it ended on EOS: that step too
                truth.append(np.array([engine.cache.layer_experts(il) >= 0 for il in layers]))
            prompt += " And then the dog woke up and ran off into the woods, barking."
        recorder.close()
    finally:
        engine.close()
    return truth


def _rebuilt(path: Path) -> list[np.ndarray]:
    trace = read_trace(path)
    m = trace.header.model
    residency = Residency(m.moe_layers, m.n_expert, trace.header.slots_per_layer)
    out = []
    for tok in trace.tokens:
        residency.advance_token(tok)
        if tok.resident is not None:
            residency.apply_masks(tok.resident)
        out.append(residency.resident.copy())
    return out


def _masked_tokens(path: Path) -> list[int]:
    return [i for i, line in enumerate(path.read_text().splitlines()[1:])
            if "resident" in json.loads(line)]


@pytest.mark.usefixtures("engine_required")
@pytest.mark.parametrize(("policy", "budget", "shrink_at"), [
    ("psr", "25%", None), ("quality-first", "50%", 9), ("psr", "50%", 9)])
def test_rows_and_masks_rebuild_the_engines_residency_token_by_token(
        synth_model: Callable[..., Path], tmp_path: Path, policy: str, budget: str,
        shrink_at: int | None) -> None:
    path = tmp_path / "s.jsonl"
    truth = _record_with_truth(synth_model, path, policy=policy, budget=budget,
                               answers=2, tokens=16, shrink_at=shrink_at)
    rebuilt = _rebuilt(path)
    assert len(rebuilt) == len(truth) > 16  # into the second answer
    for i, (want, got) in enumerate(zip(truth, rebuilt, strict=True)):
        np.testing.assert_array_equal(got, want, err_msg=f"token {i}")
    masked = _masked_tokens(path)
    assert masked, "the rows alone explained everything: nothing tested"
    if shrink_at is not None:
        assert shrink_at in masked  # the shrink token always says it was recorded
        assert read_trace(path).tokens[shrink_at].slots_per_layer < \
            read_trace(path).tokens[0].slots_per_layer


@pytest.mark.usefixtures("engine_required")
@pytest.mark.parametrize("kwargs", [
    {"name": "whatif.jsonl", "tokens": 24},  # quality-first at 25% (the GUI fixture's)
    {"tokens": 20, "answers": 2, "switch_at": 7},  # then speed-first, budget grown to 50%
    {"name": "exact.jsonl", "policy": "exact", "tokens": 16},
])
def test_sessions_the_rows_explain_write_no_masks(record: RecordFn,
                                                  kwargs: dict[str, Any]) -> None:
    path = record("qwen3moe", **kwargs)
    assert _masked_tokens(path) == []


@pytest.mark.usefixtures("engine_required")
def test_an_old_trace_without_masks_still_reads(synth_model: Callable[..., Path],
                                                tmp_path: Path) -> None:
    path = tmp_path / "new.jsonl"
    _record_with_truth(synth_model, path, policy="psr", budget="50%", tokens=16,
                       shrink_at=9)
    old = tmp_path / "old.jsonl"
    as_older_trace(path, old, "resident")
    trace = read_trace(old)
    assert len(trace.tokens) == 16 and all(t.resident is None for t in trace.tokens)
    np.testing.assert_array_equal(trace.events(), read_trace(path).events())
