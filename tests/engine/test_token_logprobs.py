"""Per-token log-probabilities (``Sampling.logprobs``, the server's ``logprobs``) on the real
engine: each token's number is the log-softmax of the logits it was sampled from, after
the expert cache's policy (an audit's ``logp_policy`` of the same step), not the exact
model's; its alternatives are the step's likeliest tokens; nothing is computed unasked."""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import pytest

from moescope.engine import Engine, Sampling
from moescope.engine.logprobs import MAX_TOP, log_probabilities
from moescope.util.errors import MoEScopeError
from moescope.util.resources import demo_model_path

PROMPT = "def main():"


def _log_softmax(row: np.ndarray) -> np.ndarray:
    x = row.astype(np.float64)
    x -= x.max()
    return x - np.log(np.exp(x).sum())


def test_each_token_has_the_log_probability_it_was_sampled_with(
        engine: Callable[..., Engine]) -> None:
    e = engine(demo_model_path(), policy="exact")
    s = Sampling(temperature=0.8, seed=5, max_tokens=12, repeat_penalty=1.0, logprobs=5)
    toks = list(e.generate(PROMPT, s))
    assert len(toks) == 12
    prompt = e.tokenize(PROMPT, add_bos=True, special=True)
    ids = [t.token_id for t in toks]
    # the exact policy: teacher forcing the same tokens after the same one-batch prefill
    # of the prompt gives the same logits (a GPU's batch and one-token kernels round
    # differently, so the first token's row, which comes from the prefill batch, is not
    # compared: forcing cannot reproduce it without decoding the prompt's last token alone)
    rows = e.forced_logits(prompt, ids[:-1])
    assert len(rows) == 11
    for tok, row in zip(toks[1:], rows, strict=True):
        lp = tok.logprob
        assert lp is not None
        want = _log_softmax(row)
        assert lp.logprob == pytest.approx(want[tok.token_id], abs=1e-5)
        assert [a.token_id for a in lp.top] == list(np.argsort(-want, kind="stable")[:5])
        assert [a.logprob for a in lp.top] == pytest.approx(np.sort(want)[::-1][:5], abs=1e-5)
        assert lp.piece.decode("utf-8", "replace") == tok.text  # ASCII answer here
        assert lp.logprob <= 0.0


def test_the_logprob_is_the_policys_not_the_exact_models(
        engine: Callable[..., Engine]) -> None:
    """Under a substituting policy the token was sampled from the policy's logits: an
    audit of every step decodes the exact pass beside it, and the reported number is the
    policy's (``logp_policy``), which differs from the exact one where the policy
    substituted."""
    e = engine(demo_model_path(), budget="25%", policy="substitute-all")
    e.set_audit(1)
    s = Sampling(temperature=0.0, max_tokens=16, repeat_penalty=1.0, logprobs=0)
    toks = list(e.generate(PROMPT, s))
    audited = [t for t in toks if t.audit is not None]
    assert len(audited) >= 10
    for t in audited:
        assert t.logprob is not None and t.logprob.top == ()
        assert t.logprob.logprob == pytest.approx(t.audit.logp_policy, abs=1e-5)
    assert any(abs(t.audit.logp_policy - t.audit.logp_exact) > 1e-3 for t in audited)


def test_nothing_is_computed_unasked_and_bounds_are_checked(
        engine: Callable[..., Engine]) -> None:
    e = engine(demo_model_path(), policy="exact")
    assert all(t.logprob is None for t in e.generate(PROMPT, Sampling(max_tokens=4)))
    for bad in (-1, MAX_TOP + 1):
        with pytest.raises(MoEScopeError, match="logprobs"):
            list(e.generate(PROMPT, Sampling(max_tokens=4, logprobs=bad)))


def test_log_probabilities_of_a_known_row() -> None:
    logits = np.array([2.0, 0.0, 2.0, -1.0], dtype=np.float32)
    lp, top = log_probabilities(logits, 1, 3)
    z = math.log(2 * math.e ** 2 + 1 + math.e ** -1)
    assert lp == pytest.approx(-z, abs=1e-6)
    assert [t for t, _ in top] == [0, 2, 1]  # ties: the lower id first
    assert [p for _, p in top] == pytest.approx([2 - z, 2 - z, -z], abs=1e-6)
    # a token of probability one reads 0, a large logit range does not overflow
    lp, top = log_probabilities(np.array([1e4, -1e4], dtype=np.float32), 0, 5)
    assert lp == 0.0 and len(top) == 2 and top[1][1] < -1e4
    # a broken model's row never gives NaN (JSON has none)
    lp, top = log_probabilities(np.array([np.nan, 1.0], dtype=np.float32), 1, 1)
    assert lp == -9999.0 and top == [(0, -9999.0)]
