"""Acceptance (issue 20): audits change time, never output.

With audits every 4th step, each audited step is decoded twice (exactly, into scratch
slots outside the cache, then by the policy); the shipped tokens, the policy's logits of
every step, the cache's decisions (event rows) and a trace's replay must be exactly those
of the same run without audits, on every architecture the engine tests cover.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from engine_helpers import ARCHES

from moescope.cache.audit import AuditRecord, estimate
from moescope.engine import Engine, Sampling, bindings
from moescope.sim import decision_mismatches, replay
from moescope.trace import TraceRecorder, read_trace
from moescope.util.errors import MoEScopeError

POLICIES = ("exact", "quality-first", "speed-first", "psr")
SAMPLING = Sampling(max_tokens=24, seed=3, temperature=0.8)


@dataclass
class Run:
    tokens: list[int] = field(default_factory=list)
    logits: list[np.ndarray] = field(default_factory=list)
    events: list[np.ndarray] = field(default_factory=list)
    audits: list[AuditRecord | None] = field(default_factory=list)


def generate(e: Engine, every: int, recorder: TraceRecorder | None = None,
             prompt: str = "Hello") -> Run:
    e.set_audit(every)
    run = Run()
    n_vocab = e._llm.n_vocab()
    for tok in e.generate(prompt, SAMPLING):
        run.tokens.append(tok.token_id)
        run.logits.append(np.ctypeslib.as_array(bindings.last_logits(e._llm),
                                                shape=(n_vocab,)).copy())
        run.events.append(tok.events)
        run.audits.append(tok.audit)
        if recorder is not None:
            recorder.record(tok, e)
    end = e.last_answer.end_step
    if end is not None:
        run.events.append(end.events)
        run.audits.append(end.audit)
    if recorder is not None:
        recorder.end_answer(e)
    return run


def same_rows(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    assert len(a) == len(b)
    rows_a, rows_b = np.concatenate(a), np.concatenate(b)
    assert decision_mismatches(rows_a, rows_b) == []
    assert np.array_equal(rows_a["step"], rows_b["step"])
    assert np.array_equal(rows_a["substituted_mass"], rows_b["substituted_mass"])


@pytest.mark.parametrize("arch", ARCHES)
def test_audits_change_no_token_logit_or_decision(
        arch: str, synth_model: Callable[..., Path], engine: Callable[..., Any]) -> None:
    path = synth_model(arch)
    for policy in POLICIES:
        off = generate(engine(path, budget="25%", policy=policy), 0)
        on_engine = engine(path, budget="25%", policy=policy)
        on = generate(on_engine, 4)
        assert on.tokens == off.tokens, policy
        assert len(on.logits) == len(off.logits)
        for i, (a, b) in enumerate(zip(on.logits, off.logits, strict=True)):
            assert np.array_equal(a, b), f"{arch} {policy}: logits of step {i} differ"
        same_rows(on.events, off.events)
        audited = [i for i, a in enumerate(on.audits) if a is not None]
        # token i comes from the decode of token i-1: audited when i is a multiple of 4
        assert audited == list(range(4, len(on.audits), 4)), policy
        assert all(a is None for a in off.audits)
        for i in audited:
            a = on.audits[i]
            assert a is not None and a.kl >= 0.0
            if policy == "exact":  # exact's pass is the exact pass: nothing to lose
                assert a.kl == 0.0 and a.logp_exact == a.logp_policy
                assert not a.greedy_differs
        assert on_engine.audit_timings()[0] > 0


def test_audit_measures_substitution(synth_model: Callable[..., Path],
                                     engine: Callable[..., Any]) -> None:
    """Substituting every miss costs something measurable; the estimate's interval holds
    its point, and the answer's stats line says it."""
    e = engine(synth_model("qwen3moe"), budget="25%", policy="substitute-all")
    run = generate(e, 2)
    audits = [a for a in run.audits if a is not None]
    assert len(audits) >= 8
    assert all(a.kl > 0 for a in audits if a.substituted_mass > 0)
    est = estimate(run.audits)
    assert est is not None and est.n == len(audits)
    assert 0 <= est.low <= est.cost <= est.high
    assert est.cost == pytest.approx(np.expm1(np.mean([a.kl for a in audits])))
    assert "quality cost +" in e.last_answer.summary()
    assert e.last_answer.audit == est


def test_audits_with_the_ram_tier_change_nothing(synth_model: Callable[..., Path],
                                                 engine: Callable[..., Any]) -> None:
    """Misses only on disk are read straight into scratch slots: the RAM tier admits
    nothing for an audit, so its rows (disk reads included) stay as without audits."""
    path = synth_model("qwen3moe")
    off = generate(engine(path, budget="25%", policy="quality-first", ram_budget="40%"), 0)
    on = generate(engine(path, budget="25%", policy="quality-first", ram_budget="40%"), 4)
    assert on.tokens == off.tokens
    assert all(np.array_equal(a, b) for a, b in zip(on.logits, off.logits, strict=True))
    same_rows(on.events, off.events)
    rows = np.concatenate(on.events)
    assert np.array_equal(rows["tier"], np.concatenate(off.events)["tier"])


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_a_trace_with_audits_replays_exactly(
        arch: str, tmp_path: Path, synth_model: Callable[..., Path],
        engine: Callable[..., Any]) -> None:
    e = engine(synth_model(arch), budget="25%", policy="quality-first")
    e.set_audit(4)
    recorder = TraceRecorder.for_engine(tmp_path / "t.jsonl", e)
    first = generate(e, 4, recorder)
    second = generate(e, 4, recorder, prompt="Hello there")  # reuses the KV cache
    recorder.close(stop_reason=e.last_answer.stop_reason)
    trace = read_trace(tmp_path / "t.jsonl")
    recorded = [t.audit for t in trace.tokens]
    shipped = [a for a in first.audits + second.audits if a is not None]
    assert [a for a in recorded if a is not None] == shipped
    result = replay(trace, None, None, keep_events=True)
    assert result.warnings == []
    assert result.events is not None
    assert decision_mismatches(trace.events(), result.events) == []


def test_audit_period_is_bounded(synth_model: Callable[..., Path],
                                 engine: Callable[..., Any]) -> None:
    e = engine(synth_model("qwen3moe"), budget="25%", policy="quality-first")
    for bad in (-1, 4097, True, 2.5):
        with pytest.raises(MoEScopeError, match="audit period"):
            e.set_audit(bad)
    assert e.audit_every == 0
    e.set_audit(8)
    e.set_budget("50%")  # a resize keeps the scratch slots
    assert generate(e, 8).audits[8] is not None
    e.set_audit(0)
    assert all(a is None for a in generate(e, 0).audits)


@pytest.mark.parametrize("arch", ["qwen3moe", "qwen3next"])
def test_teacher_forced_audits_measure_the_given_tokens(
        arch: str, synth_model: Callable[..., Path], engine: Callable[..., Any]) -> None:
    """``moescope eval``-style runs (``run_one``) audit too: the NLLs are bitwise those of
    the run without audits, each record is of the text's next token (``given``; its
    policy log-probability is the step's NLL), and the estimate is the measured one."""
    from moescope.cache.policy import Policy
    from moescope.engine.evaluate import RunSpec, run_one

    e = engine(synth_model(arch), budget="25%", policy="quality-first")
    tokens = [int(t) for t in np.random.default_rng(1).integers(3, 200, size=41)]
    for policy in ("exact", "substitute-all"):
        spec = RunSpec(Policy.preset(policy), "25%")
        off = run_one(e, tokens, spec)
        on = run_one(e, tokens, spec, audit_every=4)
        assert e.audit_every == 0  # the engine's period is put back
        assert np.array_equal(on.nll, off.nll) and off.audits == []
        assert on.audit_steps == list(range(4, 40, 4))
        assert all(a.given for a in on.audits)
        for i, a in zip(on.audit_steps, on.audits, strict=True):
            assert a.logp_policy == pytest.approx(-on.nll[i], abs=1e-9)
        est = on.audit
        assert est is not None and est.source == "given" and est.n == 9
        assert est.matched == est.measured and "measured on the given text" in est.describe()
        if policy == "exact":
            assert est.cost == 0.0 and est.kl.cost == 0.0
        else:
            assert est.kl.cost > 0.0 and est.measured.cost != est.kl.cost
