"""Comparing policies on one message: greedy answers, the reference first, where they part."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.engine import Engine, Sampling
from moescope.engine.compare import agreement, compare_policies

MESSAGES = [{"role": "user", "content": "Tell me about the sea and the ships on it."}]


def test_agreement_counts_the_common_start_and_matching_positions() -> None:
    assert agreement([1, 2, 3, 4], [1, 2, 3, 4]) == (4, 1.0)
    assert agreement([1, 2, 3, 4], [1, 9, 3, 4]) == (1, 0.75)
    assert agreement([1, 2, 3, 4], [1, 2]) == (2, 0.5)
    assert agreement([], []) == (0, 1.0)


def test_exact_twice_is_identical_and_substitution_parts_the_answers(
        engine: Callable[..., Engine], tiny_moe: Path) -> None:
    e = engine(tiny_moe, budget="25%", policy="quality-first")
    seen: list[tuple[int, int, str]] = []
    c = compare_policies(e, MESSAGES, ["exact", "exact", "substitute-all"], max_tokens=24,
                         progress=lambda d, t, p: seen.append((d, t, p)))
    ref, again, sub = c.answers
    assert [a.policy for a in c.answers] == ["exact", "exact", "substitute-all"]
    assert len(ref.token_ids) > 8, "the reference ended early; pick another prompt"
    assert again.identical and again.agreement == 1.0 and again.text == ref.text
    assert sub.cache.substitutions > 0
    expected = agreement(ref.token_ids, sub.token_ids)
    assert (sub.same_prefix, sub.agreement) == expected
    assert not sub.identical, "substituting every miss at 25% should change the answer"
    assert seen[0] == (0, 3, "exact") and seen[-1] == (3, 3, "")
    # the user's policy is back, and the cache starts empty again
    assert e.policy_name == "quality-first"
    assert all(not e.cache.resident(layer) for layer in e.model.info.moe_layers)


def test_the_reference_is_the_plain_greedy_answer(engine: Callable[..., Engine],
                                                  tiny_moe: Path) -> None:
    e = engine(tiny_moe, budget="25%", policy="exact")
    c = compare_policies(e, MESSAGES, ["exact"], max_tokens=12)
    e.clear_cache()
    ids = [t.token_id for t in e.generate(MESSAGES, Sampling(temperature=0.0, seed=0,
                                                             max_tokens=12))]
    assert list(c.answers[0].token_ids) == ids


def test_stopping_keeps_the_answers_so_far(engine: Callable[..., Engine],
                                           tiny_moe: Path) -> None:
    """Stop asked once the second policy has begun: it ends mid-answer and is dropped."""
    e = engine(tiny_moe, budget="25%")
    started: list[str] = []
    c = compare_policies(e, MESSAGES, ["exact", "speed-first"], max_tokens=6,
                         progress=lambda d, t, p: started.append(p),
                         stopped=lambda: len(started) >= 2)
    assert started == ["exact", "speed-first", ""]  # "" reports the end
    assert c.stopped and [a.policy for a in c.answers] == ["exact"]
    with pytest.raises(ValueError, match="at least one policy"):
        compare_policies(e, MESSAGES, [])


def test_scoring_the_conversation_gives_each_policy_its_perplexity_change(
        engine: Callable[..., Engine], tiny_moe: Path) -> None:
    """Exact scored twice is the same to the bit (change 0, interval 0); substitute-all
    costs perplexity on the same tokens; the budget, policy and empty cache are kept."""
    from moescope.engine.compare import conversation_tokens
    from moescope.engine.evaluate import RunSpec, run_one

    e = engine(tiny_moe, budget="25%", policy="quality-first")
    plan = e.model.plan
    chat = [*MESSAGES, {"role": "assistant", "content": "The sea is wide and grey."},
            {"role": "user", "content": "And the ships?"}]
    tokens = conversation_tokens(e, chat)
    assert len(tokens) > 20
    labels: list[str] = []
    c = compare_policies(e, MESSAGES, ["exact", "exact", "substitute-all"], max_tokens=4,
                         score=tokens, progress=lambda d, t, p: labels.append(p))
    assert c.scored_tokens == len(tokens) - 1
    assert "scoring the chat under substitute-all" in labels
    ref, again, sub = c.answers
    assert ref.nll is not None and len(ref.nll) == len(tokens) - 1
    assert c.perplexity_change(ref) == (0.0, 0.0, 0.0)
    assert c.perplexity_change(again) == (0.0, 0.0, 0.0)
    change, low, high = c.perplexity_change(sub)
    assert change > 0 and low <= change <= high
    # the scores are the evaluation's: the same tokens through run_one give the same NLL
    e.set_policy("substitute-all")
    direct = run_one(e, tokens, RunSpec(e.policy, ""))
    assert list(direct.nll) == list(sub.nll)
    # the engine kept its budget as the user gave it (scoring never resized the cache)
    assert e.model.plan is plan


def test_stopping_while_scoring_drops_the_unfinished_policy(
        engine: Callable[..., Engine], tiny_moe: Path) -> None:
    from moescope.engine.compare import conversation_tokens

    e = engine(tiny_moe, budget="25%")
    tokens = conversation_tokens(e, MESSAGES)
    labels: list[str] = []
    c = compare_policies(e, MESSAGES, ["exact", "speed-first"], max_tokens=4, score=tokens,
                         progress=lambda d, t, p: labels.append(p),
                         stopped=lambda: "scoring the chat under speed-first" in labels)
    assert c.stopped and [a.policy for a in c.answers] == ["exact"]
    assert c.answers[0].nll is not None
