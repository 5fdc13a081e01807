"""What one generated token and one answer cost: the engine's per-token and per-answer
records, built on :class:`moescope.cache.totals.CacheTotals` (sums over event rows).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache.audit import AuditEstimate, AuditRecord, estimate
from moescope.cache.totals import CacheTotals
from moescope.engine.logprobs import TokenLogprob
from moescope.util.words import plural


@dataclass
class TokenStats:
    """One generated token and what the cache did for it."""

    index: int
    token_id: int
    text: str
    seconds: float
    cache: CacheTotals
    policy: str
    slots_per_layer: int
    events: npt.NDArray[Any] = field(repr=False, default_factory=lambda: np.zeros(0))
    prefetch: npt.NDArray[np.int64] | None = field(repr=False, default=None)
    """PSR's counters for this token per MoE layer (row 0 prefetches, row 1 hits), read
    on the decode thread once (:class:`~moescope.cache.prefetch.PrefetchMeter`) for the
    window and the recorder alike; None without an expert cache."""
    audit: AuditRecord | None = None
    """The step was audited (``Engine.set_audit``): its exact output against the policy's."""
    logprob: TokenLogprob | None = None
    """The token's log-probability and the step's likeliest tokens, when the answer's
    :attr:`Sampling.logprobs` asked for them."""


@dataclass
class AnswerStats:
    """The stats line under an answer in the chat."""

    n_prompt_tokens: int = 0
    n_tokens: int = 0
    time_to_first_token_s: float = 0.0
    seconds: float = 0.0
    cache: CacheTotals = field(default_factory=CacheTotals)
    policies: list[str] = field(default_factory=list)
    stop_reason: str = ""
    dropped_messages: int = 0
    """Earliest messages left out of the prompt so the conversation fits the context."""
    ram_tier: bool = False
    """Experts were read from the model file (RAM tier on): the line shows disk reads."""
    n_cached_tokens: int = 0
    """Prompt tokens reused from the KV cache (the prefix shared with what it holds from
    the previous call): only the rest was prefilled."""
    end_step: TokenStats | None = None
    """The step that chose the end-of-generation token, when the answer ended on one
    (``stop_reason`` "eos"): decoded and governed like any token, so it has rows, but it is
    not part of the answer and ``generate`` does not yield it. A trace records it
    (``TraceRecorder.end_answer``): without it a replay misses a step of the cache's work.
    Its rows are counted in :attr:`cache`."""
    audits: list[AuditRecord] = field(default_factory=list)
    """Every audited step of the answer (the end step's included)."""

    @property
    def audit(self) -> AuditEstimate | None:
        """The answer's estimated perplexity cost from its audits (None: no audits)."""
        return estimate(self.audits)

    @property
    def tokens_per_second(self) -> float:
        decode = self.seconds - self.time_to_first_token_s
        return (self.n_tokens - 1) / decode if self.n_tokens > 1 and decode > 0 else 0.0

    def summary(self) -> str:
        """One line: tokens/s, hit rate, fetched MB/token, % substituted, mass/token."""
        c = self.cache
        n = self.n_tokens
        rate = (f"{self.tokens_per_second:.1f} tok/s" if n > 1
                else "– tok/s (no decode token)")
        return (f"{rate} · {plural(n, 'token')} · "
                f"TTFT {self.time_to_first_token_s * 1000:.0f} ms · hit {c.hit_rate:.1%} · "
                f"fetched {c.fetched_mb_per_token:.2f} MB/tok · "
                f"substituted {c.substituted_fraction:.1%} · "
                f"mass/tok {c.mass_per_token:.3f} · "
                + (f"disk {c.disk_mb_per_token:.2f} MB/tok · RAM hit {c.ram_hit_rate:.1%} · "
                   if self.ram_tier or c.disk_fills else "")
                + (f"{self.audit.describe()} · " if self.audits else "")
                + f"{'/'.join(self.policies) or '-'} · "
                f"{self.stop_reason}"
                + (f" · {plural(self.dropped_messages, 'earliest message')} left out to fit "
                   "the context" if self.dropped_messages else ""))
