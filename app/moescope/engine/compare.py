"""Answer the same message under several policies and show where the answers part.

Substituting an expert changes the computation; whether that changes the *answer* is what
a user wants to know before choosing speed-first. Perplexity (``moescope eval``) measures
it on held-out text; this measures it on the user's own conversation: greedy decoding
from the same prompt, the expert cache emptied before each policy so each starts alike,
and every answer set against the first policy's (``exact`` by default, the unpatched
engine's answer). Greedy decoding is deterministic, so a difference is the policy's, not
sampling noise; the first token where two answers differ is where the policy first
changed the model's top choice.

A short answer says little about quality on average, so a comparison may also **score the
conversation**: the whole chat, teacher-forced one token at a time under each policy from
an empty cache (``engine.evaluate``), gives each policy's perplexity change against the
reference on the user's own text, with an interval over blocks of tokens.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache.audit import AuditEstimate
from moescope.cache.policy import Policy
from moescope.engine.engine import Engine, Message, Sampling
from moescope.engine.evaluate import RunSpec, change_interval, run_one
from moescope.engine.stats import CacheTotals

SCORE_BLOCK = 32
"""Tokens per block of the perplexity interval (``evaluate.change_interval``)."""


@dataclass(frozen=True)
class PolicyAnswer:
    """One policy's greedy answer and what the cache did for it."""

    policy: str
    text: str
    token_ids: tuple[int, ...]
    tokens_per_second: float
    cache: CacheTotals
    stop_reason: str
    same_prefix: int = 0
    """Tokens at the start identical to the reference answer (all of them: identical)."""
    agreement: float = 1.0
    """Share of the reference's positions where this answer has the same token."""
    nll: npt.NDArray[np.float64] | None = field(default=None, compare=False, repr=False)
    """Per-token negative log-likelihood of the scored conversation (None: not scored)."""
    audit: AuditEstimate | None = None
    """The answer's audited quality cost (None: audits were off)."""

    @property
    def identical(self) -> bool:
        return self.same_prefix == len(self.token_ids)


@dataclass
class Comparison:
    """Answers of every policy, the first being the reference."""

    answers: list[PolicyAnswer] = field(default_factory=list)
    max_tokens: int = 0
    stopped: bool = False
    """The comparison was stopped before every policy answered."""
    scored_tokens: int = 0
    """Tokens of the conversation each policy scored (0: not asked to score)."""

    @property
    def reference(self) -> PolicyAnswer | None:
        return self.answers[0] if self.answers else None

    def perplexity_change(self, answer: PolicyAnswer) -> tuple[float, float, float] | None:
        """``(change %, low, high)`` of ``answer``'s perplexity on the scored conversation
        against the reference's; None when either was not scored (in full)."""
        ref = self.reference
        if ref is None or ref.nll is None or answer.nll is None \
                or len(answer.nll) != len(ref.nll):
            return None
        return change_interval(answer.nll, ref.nll, SCORE_BLOCK)

    @property
    def one_block(self) -> bool:
        """The chat scored over one block of :data:`SCORE_BLOCK` tokens or fewer: the
        interval resamples blocks, so there is none (it would be the point, [x, x])."""
        return 0 < self.scored_tokens <= SCORE_BLOCK

    def perplexity_text(self, answer: PolicyAnswer) -> str:
        """:func:`perplexity_text` of ``answer``'s change, "(no interval)" for one block."""
        change = self.perplexity_change(answer)
        if change is not None and self.one_block:
            return f"{change[0]:+.2f}% (no interval)"
        return perplexity_text(change)

    def scored_note(self) -> str:
        """"the chat scored over N tokens" (and why there is no interval), "" unscored."""
        n = self.scored_tokens
        if not n:
            return ""
        note = f"the chat scored over {n} token{'' if n == 1 else 's'}"
        if self.one_block:
            note += (f", too few for an interval (it resamples blocks of {SCORE_BLOCK} "
                     "tokens; a longer chat gives one)")
        return note

    def speedup(self, answer: PolicyAnswer) -> float:
        ref = self.reference
        if ref is None or ref.tokens_per_second <= 0:
            return 0.0
        return answer.tokens_per_second / ref.tokens_per_second


def agreement(reference: Sequence[int], other: Sequence[int]) -> tuple[int, float]:
    """``(same_prefix, agreement)``: tokens identical at the start, and the share of the
    reference's positions holding the same token (a shorter answer disagrees on the rest)."""
    prefix = 0
    for a, b in zip(reference, other, strict=False):
        if a != b:
            break
        prefix += 1
    if not reference:
        return prefix, 1.0 if not other else 0.0
    same = sum(a == b for a, b in zip(reference, other, strict=False))
    return prefix, same / len(reference)


def perplexity_text(change: tuple[float, float, float] | None) -> str:
    """"+0.84% [−0.20, +1.90]" (change against Exact, 95% interval), or "–" unscored."""
    if change is None:
        return "–"
    point, low, high = change
    return f"{point:+.2f}% [{low:+.2f}, {high:+.2f}]"


def same_start_text(a: PolicyAnswer) -> str:
    """"identical", or "12 tokens" (identical up to there; "1 token")."""
    n = a.same_prefix
    return "identical" if a.identical else f"{n} token{'' if n == 1 else 's'}"


def conversation_tokens(engine: Engine, messages: Sequence[Message | dict[str, str]],
                        thinking: str = "default") -> list[int]:
    """The chat as the model reads it, for scoring: the template's rendering of every
    message, the earliest turns left out (then the earliest tokens) so it fits the
    context."""
    tokens, _ = engine.fit_conversation(messages, room=0, thinking=thinking)
    return tokens[-engine.n_ctx:]


def compare_policies(engine: Engine, messages: str | Sequence[Message | dict[str, str]],
                     policies: Sequence[Policy | str], *, max_tokens: int = 64,
                     thinking: str = "default", score: Sequence[int] = (),
                     progress: Callable[[int, int, str], None] | None = None,
                     stopped: Callable[[], bool] | None = None) -> Comparison:
    """Greedy answers to ``messages`` (or a raw prompt string, for a base model) under
    each policy, the first as the reference; with ``score`` (tokens, e.g. from
    :func:`conversation_tokens`), each policy also scores them teacher-forced.

    Runs on the engine's thread. The cache is emptied before each policy, and again at the
    end, and the engine's policy is restored: the chat goes on from an empty cache, as
    after loading. ``progress(done, total, policy)`` is called before each answer (and
    each scoring, labelled "scoring …"); ``stopped()`` true ends the comparison early (the
    answers so far are kept).
    """
    if not policies:
        raise ValueError("compare at least one policy")
    before: Any = engine.guard or engine.policy  # the guard resumes where it was
    audit_before = engine.audit_every  # the guard turns audits on; put back as it was
    sampling = Sampling(temperature=0.0, seed=0, max_tokens=max_tokens, thinking=thinking)
    out = Comparison(max_tokens=max_tokens, scored_tokens=max(0, len(score) - 1))
    try:
        for done, policy in enumerate(policies):
            if stopped is not None and stopped():
                out.stopped = True
                break
            engine.set_policy(policy)
            name = engine.policy_name
            if progress is not None:
                progress(done, len(policies), name)
            engine.clear_cache()
            ids: list[int] = []
            pieces: list[str] = []
            for tok in engine.generate(messages, sampling):
                ids.append(tok.token_id)
                pieces.append(tok.text)
                if stopped is not None and stopped():
                    engine.stop()
            a = engine.last_answer
            if a.stop_reason == "stopped":
                out.stopped = True
                break
            answer = PolicyAnswer(policy=name, text="".join(pieces), token_ids=tuple(ids),
                                  tokens_per_second=a.tokens_per_second, cache=a.cache,
                                  stop_reason=a.stop_reason, audit=a.audit)
            if out.answers:
                prefix, share = agreement(out.answers[0].token_ids, ids)
                answer = replace(answer, same_prefix=prefix, agreement=share)
            else:
                answer = replace(answer, same_prefix=len(ids))
            if len(score) > 1:
                if progress is not None:
                    progress(done, len(policies), f"scoring the chat under {name}")
                run = run_one(engine, score, RunSpec(engine.policy, ""), stopped=stopped)
                if run.n_tokens < len(score) - 1:
                    out.stopped = True
                    break
                answer = replace(answer, nll=run.nll)
            out.answers.append(answer)
        if progress is not None:
            progress(len(out.answers), len(policies), "")
    finally:
        engine.set_policy(before)
        engine.set_audit(audit_before)
        engine.clear_cache()
    return out
