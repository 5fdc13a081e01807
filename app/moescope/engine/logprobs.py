"""Log-probabilities of generated tokens, for clients that ask (the server's ``logprobs``).

A token's log-probability is the log-softmax of the logits it was sampled from, at that
token: the model's own distribution after the expert cache's policy (the policy changes
the logits, and these are the ones the token was drawn from), before temperature, top-k,
top-p, min-p, the repeat penalty and a grammar, as OpenAI reports the model's numbers
rather than the sampler's. Computed only when a :class:`~moescope.engine.Sampling` asks
(``logprobs``): a max, an exp and a sum over the vocabulary per token, and a partial sort
for the alternatives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

MAX_TOP = 20
"""The most alternatives one token reports (OpenAI's bound on ``top_logprobs``)."""


@dataclass(frozen=True)
class Alternative:
    """A token the model could have written at a step, with its log-probability."""

    token_id: int
    piece: bytes
    """The token's bytes (a control token's vocabulary text, which an answer would not
    show, rather than nothing)."""
    logprob: float


@dataclass(frozen=True)
class TokenLogprob:
    """The log-probability of one generated token and the step's likeliest tokens."""

    logprob: float
    piece: bytes
    """The token's bytes, exactly as they went into the answer's text (a character cut
    between tokens is in both tokens' bytes halves, never whole in either)."""
    top: tuple[Alternative, ...]
    """The ``n`` likeliest tokens of the step, most likely first (ties: lower id first)."""


def log_probabilities(logits: npt.NDArray[np.float32], token: int,
                      n_top: int) -> tuple[float, list[tuple[int, float]]]:
    """The log-softmax of ``logits`` at ``token`` and the ``n_top`` largest entries as
    ``(token id, log-probability)``, most likely first. float32 logits less their maximum
    are exponentiated (no overflow) and summed in float64, so a token of probability one
    reads 0.0 (or a hair below it); 1 to 2 ms a token for a 150k vocabulary. Non-finite
    logits (a broken model) give -9999.0, OpenAI's number for "no probability", never NaN
    in JSON."""
    peak = float(np.max(logits))
    if not np.isfinite(peak):
        return _broken(logits, token, n_top)
    lse = peak + float(np.log(np.exp(logits - np.float32(peak)).sum(dtype=np.float64)))
    lp = _finite(float(logits[token]) - lse)
    top: list[tuple[int, float]] = []
    if n_top > 0:
        n = min(n_top, len(logits))
        part = np.argpartition(logits, len(logits) - n)[len(logits) - n:]
        order = part[np.lexsort((part, -logits[part]))]
        top = [(int(i), _finite(float(logits[i]) - lse)) for i in order]
    return lp, top


def _finite(value: float) -> float:
    return value if np.isfinite(value) else -9999.0


def _broken(logits: npt.NDArray[Any], token: int,
            n_top: int) -> tuple[float, list[tuple[int, float]]]:
    return -9999.0, [(i, -9999.0) for i in range(min(n_top, len(logits)))]
