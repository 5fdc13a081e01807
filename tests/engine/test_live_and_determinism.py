"""Acceptance: runs are deterministic whatever the copy timing; policy and budget changes
apply from the next token without losing the conversation."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from engine_helpers import PROMPT, forced_stream

from moescope.cache.native import SUBSTITUTE
from moescope.cache.policy import Policy
from moescope.engine import Sampling


def test_two_runs_give_identical_tokens_and_logits(
        synth_model: Callable[..., Path], engine: Callable[..., object]) -> None:
    path = synth_model("qwen3moe")
    runs = []
    for _ in range(2):
        e = engine(path, budget="25%", policy="quality-first")
        logits = e.forced_logits(PROMPT, forced_stream(e._llm.n_vocab()))
        tokens = [t.token_id for t in e.generate("Hello", Sampling(max_tokens=24, seed=3))]
        runs.append((logits, tokens))
    assert np.array_equal(runs[0][0], runs[1][0])
    assert runs[0][1] == runs[1][1]


def test_random_copy_delays_do_not_change_logits(
        synth_model: Callable[..., Path], engine: Callable[..., object]) -> None:
    """Background admission (here with a low beta, so it happens often) copies off the
    critical path; delayed copies may only cost time."""
    path = synth_model("qwen3moe")
    policy = Policy.preset("quality-first").replace(beta=0.1)
    plain = engine(path, budget="50%", policy=policy)
    baseline = plain.forced_logits(PROMPT, forced_stream(plain._llm.n_vocab()))
    admitted = int(plain.drain_events()["n_admit"].sum())
    delayed = engine(path, budget="50%", policy=policy)
    delayed.set_copy_delay(400)
    logits = delayed.forced_logits(PROMPT, forced_stream(delayed._llm.n_vocab()))
    assert admitted > 0, "the test needs background admissions to be meaningful"
    assert np.array_equal(logits, baseline)
    assert delayed.timings()["n_async"] > 0


def test_policy_switch_mid_generation_applies_from_next_token(
        synth_model: Callable[..., Path], engine: Callable[..., object]) -> None:
    e = engine(synth_model("qwen3moe"), budget="25%", policy="exact")
    rows_per_token = []
    for tok in e.generate("Hello", Sampling(max_tokens=20, seed=1)):
        rows_per_token.append(tok.events)
        if tok.index == 9:
            e.request_policy("substitute-all")
    assert len(rows_per_token) == 20
    before = np.concatenate(rows_per_token[:10])
    after = np.concatenate(rows_per_token[11:])
    assert not (before["action"] == SUBSTITUTE).any()
    assert (after["action"] == SUBSTITUTE).any()
    assert e.last_answer.policies == ["exact", "substitute-all"]


def test_budget_change_mid_conversation_keeps_model_and_kv_cache(
        synth_model: Callable[..., Path], engine: Callable[..., object]) -> None:
    e = engine(synth_model("qwen3moe"), budget="25%", policy="quality-first")
    first = list(e.generate("Hello", Sampling(max_tokens=12, seed=1)))
    evaluated = e._llm.n_tokens
    e.request_budget("50%")
    e.apply_requests()
    assert e.slots_per_layer == 8
    # the next turn extends the same token history: only the new tokens are evaluated
    history = e._llm.input_ids[:evaluated].tolist()
    e._llm.eval([5, 6])
    assert e._llm.n_tokens == evaluated + 2
    assert e._llm.input_ids[:evaluated].tolist() == history
    more = list(e.generate("Hello", Sampling(max_tokens=8, seed=1)))
    assert first and more
    assert e.slots_per_layer == 8
