"""Answer the same message under several policies and show where the answers part.

Substituting an expert changes the computation; whether that changes the *answer* is what
a user wants to know before choosing speed-first. Perplexity (``moescope eval``) measures
it on held-out text; this measures it on the user's own conversation: greedy decoding
from the same prompt, the expert cache emptied before each policy so each starts alike,
and every answer set against the first policy's (``exact`` by default, the unpatched
engine's answer). Greedy decoding is deterministic, so a difference is the policy's, not
sampling noise; the first token where two answers differ is where the policy first
changed the model's top choice.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from moescope.core.policy import Policy
from moescope.engine.engine import Engine, Message, Sampling
from moescope.engine.stats import CacheTotals


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

    @property
    def reference(self) -> PolicyAnswer | None:
        return self.answers[0] if self.answers else None

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


def compare_policies(engine: Engine, messages: str | Sequence[Message | dict[str, str]],
                     policies: Sequence[Policy | str], *, max_tokens: int = 64,
                     thinking: str = "default",
                     progress: Callable[[int, int, str], None] | None = None,
                     stopped: Callable[[], bool] | None = None) -> Comparison:
    """Greedy answers to ``messages`` (or a raw prompt string, for a base model) under
    each policy, the first as the reference.

    Runs on the engine's thread. The cache is emptied before each policy, and again at the
    end, and the engine's policy is restored: the chat goes on from an empty cache, as
    after loading. ``progress(done, total, policy)`` is called before each answer;
    ``stopped()`` true ends the comparison early (the answers so far are kept).
    """
    if not policies:
        raise ValueError("compare at least one policy")
    before = engine.policy
    sampling = Sampling(temperature=0.0, seed=0, max_tokens=max_tokens, thinking=thinking)
    out = Comparison(max_tokens=max_tokens)
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
                                  stop_reason=a.stop_reason)
            if out.answers:
                prefix, share = agreement(out.answers[0].token_ids, ids)
                answer = replace(answer, same_prefix=prefix, agreement=share)
            else:
                answer = replace(answer, same_prefix=len(ids))
            out.answers.append(answer)
        if progress is not None:
            progress(len(out.answers), len(policies), "")
    finally:
        engine.set_policy(before)
        engine.clear_cache()
    return out
