"""Quality evaluation: teacher-forced perplexity per policy, on the same tokens, and the
substituted-mass hypothesis.

*Which Expert Misses Are Worth Waiting For?* measures what a policy costs in quality with
exact emulation: the same token stream is forced through the model under each policy and
budget, and perplexity is compared with fetch-every-miss (``exact``), whose output equals
the unpatched engine's at any budget. Tokens are decoded one at a time, because the cache
governs only small ubatches (a wide prefill batch would bypass it and measure nothing).

The paper's claim checked here: among policies that always fetch the router's first choice,
the more normalized gate mass a policy substitutes, the more perplexity rises (r ≈ 0.92).
We compute Pearson r between substituted mass per token and perplexity change over fixed
windows of the text, with bootstrap confidence intervals that resample windows.

A text longer than the model's context is scored as consecutive segments
(:func:`split_segments`): each from an empty KV context, the expert cache carrying on across
them within a run as it would over a long chat, so a small-context model still gives enough
windows for a narrow interval. Windows never straddle a segment boundary.
"""

from __future__ import annotations

import csv
import io
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from moescope.cache.audit import AuditEstimate, AuditRecord, compare, estimate
from moescope.cache.budget import format_bytes
from moescope.cache.policy import MissRule, Policy
from moescope.engine.engine import Engine
from moescope.util.errors import MoEScopeError

ProgressFn = Callable[[int, int, str], None]
"""``progress(tokens done, tokens in total, label of the current run)``."""

FIRST_CHOICE_RULES = (MissRule.FETCH_ALL, MissRule.THRESHOLD, MissRule.FIRST_CHOICE)
"""Miss rules that always fetch a missing first choice: the mass hypothesis's population."""

MAX_SEGMENTS = 4096
"""Most segments one evaluation scores: beyond it the run list and progress are silly."""

Segments = Sequence[Sequence[int]]
"""A text as consecutive segments: each decoded from an empty context, its first token
context only (BOS, or the previous segment's last token) and the rest scored."""


def split_segments(tokens: Sequence[int], scored_per_segment: int, *,
                   bos: int | None = None) -> list[list[int]]:
    """Cut a tokenized text into segments of at most ``scored_per_segment`` scored tokens
    (the model's context less one), so a text longer than the context is scored whole.

    With ``bos`` (the model adds one and ``tokens`` starts with it) every segment starts
    with BOS, as a fresh chat would; without, a segment starts with the previous one's last
    token as unscored context. Either way each of ``tokens[1:]`` is scored exactly once and
    a text that fits is one segment equal to ``tokens`` (today's scoring, unchanged).
    """
    if scored_per_segment < 1:
        raise MoEScopeError(f"a segment must score at least 1 token, not {scored_per_segment}")
    n_scored = len(tokens) - 1
    if n_scored < 1:
        return [list(tokens)]
    n_segments = -(-n_scored // scored_per_segment)
    if n_segments > MAX_SEGMENTS:
        raise MoEScopeError(f"{n_scored} tokens make {n_segments} segments of "
                            f"{scored_per_segment}; at most {MAX_SEGMENTS}: score fewer tokens")
    with_bos = bos is not None and int(tokens[0]) == bos
    out: list[list[int]] = []
    for a in range(1, len(tokens), scored_per_segment):
        head = [int(tokens[0])] if with_bos else [int(tokens[a - 1])]
        out.append(head + [int(t) for t in tokens[a:a + scored_per_segment]])
    return out


def _as_segments(tokens: Sequence[int] | Segments) -> list[Sequence[int]]:
    """One flat token list (one segment) or a list of segments, as a list of segments."""
    if len(tokens) and isinstance(tokens[0], (list, tuple, np.ndarray)):
        return list(tokens)  # type: ignore[arg-type]
    return [tokens]  # type: ignore[list-item]


@dataclass(frozen=True)
class RunSpec:
    """One evaluation run: a policy at a budget ("" keeps the engine's)."""

    policy: Policy
    budget: str

    @property
    def label(self) -> str:
        return self.policy.name or "custom"


@dataclass
class RunResult:
    """Per scored token of one run: negative log-likelihood, substituted mass, bytes, time."""

    spec: RunSpec
    slots: int
    nll: npt.NDArray[np.float64]
    mass: npt.NDArray[np.float64]
    bytes_sync: npt.NDArray[np.int64]
    seconds: npt.NDArray[np.float64]
    selections: int = 0
    hits: int = 0
    substitutions: int = 0
    bytes_async: int = 0
    bytes_disk: int = 0
    """Bytes read from the model file (RAM tier on): fetches, admissions and prefetches."""
    fills: int = 0
    disk_fills: int = 0
    timings: dict[str, int] = field(default_factory=dict)
    first_choice_substituted: int | None = None
    """Rows whose router's first choice was substituted (None: not counted): zero for a
    run that preserved every first choice (any run of a first-choice-fetching rule; a
    routing-bonus run when its bonus never outweighed a first choice)."""
    audits: list[AuditRecord] = field(default_factory=list)
    """The run's audited steps (``run_one``'s ``audit_every``): their tokens were given,
    so the estimate is the cost measured on the text."""
    audit_steps: list[int] = field(default_factory=list)
    """Index into :attr:`nll` of each audit."""
    segment_starts: tuple[int, ...] = (0,)
    """Index into :attr:`nll` of each segment's first scored token (windows of the mass
    hypothesis stay inside one segment); only segments reached when stopped early."""

    @property
    def audit(self) -> AuditEstimate | None:
        """The audits' estimate of the run's cost on its text (None: no audits)."""
        return estimate(self.audits)

    @property
    def preserves_first_choice(self) -> bool:
        return self.first_choice_substituted == 0

    @property
    def n_tokens(self) -> int:
        return len(self.nll)

    @property
    def perplexity(self) -> float:
        return float(math.exp(self.nll.mean())) if self.n_tokens else float("nan")

    @property
    def substituted_fraction(self) -> float:
        """Share of expert calls that ran a substitute."""
        return self.substitutions / self.selections if self.selections else 0.0

    @property
    def hit_rate(self) -> float:
        return self.hits / self.selections if self.selections else 0.0

    @property
    def mass_per_token(self) -> float:
        return float(self.mass.mean()) if self.n_tokens else 0.0

    @property
    def fetched_bytes_per_token(self) -> float:
        return float(self.bytes_sync.mean()) if self.n_tokens else 0.0

    @property
    def seconds_per_token(self) -> float:
        return float(self.seconds.mean()) if self.n_tokens else 0.0

    @property
    def disk_bytes_per_token(self) -> float:
        return self.bytes_disk / self.n_tokens if self.n_tokens else 0.0

    @property
    def ram_hit_rate(self) -> float:
        """Of the slot fills, the share served from the RAM tier rather than the file."""
        return 1.0 - self.disk_fills / self.fills if self.fills else 1.0


class ForcedStep(NamedTuple):
    """One teacher-forced step of :func:`forced_steps`."""

    i: int
    logits: npt.NDArray[np.float32]
    """The policy's logits after ``tokens[:i+1]`` (the engine's buffer: copy to keep)."""
    rows: npt.NDArray[Any]
    """The core's event rows of the step."""
    seconds: float
    """The policy's pass (an audit's exact pass not included: ``ms/tok`` stays the
    policy's with audits on)."""
    exact: npt.NDArray[np.float32] | None = None
    """The step's exact logits when it was audited (every miss fetched into scratch
    slots; the policy's pass and the cache are as without the audit), else None."""


def forced_steps(engine: Engine, tokens: Sequence[int], *, audit_every: int = 0
                 ) -> Iterator[ForcedStep]:
    """Decode ``tokens`` one at a time from an empty context, streaming each step.

    Same decoding as :meth:`Engine.forced_logits` (a test checks they agree), but it holds
    one logits row at a time instead of ``len(tokens) x n_vocab`` floats, and it can report
    progress and the cache's work per token. With ``audit_every`` N (audits on in the
    engine: :meth:`Engine.set_audit`), every Nth step after the first (which follows an
    empty cache: all misses) is also computed exactly, as while generating.
    """
    from llama_cpp import llama_cpp as low

    from moescope.engine import bindings

    llm = engine._llm
    if llm is None:
        raise MoEScopeError("no model is loaded")
    if audit_every and not engine.audit_every:
        raise MoEScopeError("audited forced steps need audits on (Engine.set_audit)")
    llm.reset()
    llm._ctx.kv_cache_clear()
    n_vocab = llm.n_vocab()
    engine.drain_events()
    for i, tok in enumerate(tokens):
        exact = None
        if audit_every and i > 0 and i % audit_every == 0:
            exact = bindings.audit_decode(llm, int(tok), int(llm.n_tokens))
        t0 = time.perf_counter()
        llm.eval([int(tok)])
        ptr = low.llama_get_logits_ith(engine._ctx, -1)
        logits = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
        seconds = time.perf_counter() - t0
        yield ForcedStep(i, logits, engine.drain_events(), seconds, exact)


def _nll(logits: npt.NDArray[np.float32], target: int) -> float:
    """-log softmax(logits)[target], in float64."""
    x = logits.astype(np.float64)
    top = float(x.max())
    return float(top + math.log(float(np.exp(x - top).sum())) - x[target])


def run_one(engine: Engine, tokens: Sequence[int] | Segments, spec: RunSpec, *,
            progress: Callable[[int], None] | None = None,
            stopped: Callable[[], bool] | None = None, audit_every: int = 0) -> RunResult:
    """Score ``tokens[1:]`` under one policy and budget, from an empty cache.

    ``tokens`` may also be consecutive segments (:func:`split_segments`): each is decoded
    from an empty context and scores its ``[1:]``, the cache carrying on between them; the
    result holds them end to end. ``progress`` counts scored tokens over all segments.
    The cache is resized, given the policy and emptied first, so every run starts from the
    same logical state and only the policy and budget differ. ``stopped()`` true ends the
    run early: the result then holds the tokens scored so far (see ``RunResult.n_tokens``).
    ``audit_every`` N also audits every Nth step (``RunResult.audits``, their tokens the
    text's: ``given``); the engine's audit period is restored afterwards.
    """
    cache = engine.cache
    if cache is None:
        raise MoEScopeError("evaluation needs the expert cache (a MoE model, cache on)")
    slots = engine.set_budget(spec.budget).slots_per_layer if spec.budget \
        else engine.slots_per_layer
    engine.set_policy(spec.policy)
    audits_before = engine.audit_every
    if audit_every:
        engine.set_audit(audit_every)  # before the clear: it may re-lay the slot tensors
    cache.clear()
    cache.reset_stats()
    before = engine.timings()
    segments = _as_segments(tokens)
    n = sum(max(0, len(s) - 1) for s in segments)
    nll = np.zeros(n, dtype=np.float64)
    mass = np.zeros(n, dtype=np.float64)
    bytes_sync = np.zeros(n, dtype=np.int64)
    seconds = np.zeros(n, dtype=np.float64)
    result = RunResult(spec=spec, slots=slots, nll=nll, mass=mass,
                       bytes_sync=bytes_sync, seconds=seconds, first_choice_substituted=0)
    try:
        _score_segments(engine, segments, result, audit_every, progress, stopped)
    finally:
        if audit_every:
            engine.set_audit(audits_before)
    after = engine.timings()
    result.timings = {k: after[k] - before.get(k, 0) for k in after}
    return result


def _score_segments(engine: Engine, segments: Sequence[Sequence[int]], result: RunResult,
                    audit_every: int, progress: Callable[[int], None] | None,
                    stopped: Callable[[], bool] | None) -> None:
    """Score each segment in turn into ``result`` (end to end); an early stop truncates
    the arrays to the tokens scored and ends the run."""
    starts: list[int] = []
    offset = 0
    for seg in segments:
        if len(seg) < 2:
            continue
        starts.append(offset)
        done, halted = _score(engine, seg, result, offset, audit_every, progress, stopped)
        offset += done
        if halted:
            for name in ("nll", "mass", "bytes_sync", "seconds"):
                setattr(result, name, getattr(result, name)[:offset])
            break
    result.segment_starts = tuple(starts) or (0,)


def _score(engine: Engine, tokens: Sequence[int], result: RunResult, offset: int,
           audit_every: int, progress: Callable[[int], None] | None,
           stopped: Callable[[], bool] | None) -> tuple[int, bool]:
    """``run_one``'s loop over one segment: fill ``result`` from index ``offset`` step by
    step; returns the tokens scored and whether ``stopped()`` ended the run."""
    nll, mass, bytes_sync, seconds = result.nll, result.mass, result.bytes_sync, result.seconds
    for j, logits, rows, dt, exact in forced_steps(engine, tokens[:-1],
                                                   audit_every=audit_every):
        i = offset + j
        target = int(tokens[j + 1])
        nll[i] = _nll(logits, target)
        mass[i] = float(rows["substituted_mass"].astype(np.float64).sum())
        if exact is not None:
            result.audits.append(compare(exact, logits, target, mass[i], given=True))
            result.audit_steps.append(i)
        bytes_sync[i] = int(rows["bytes_sync"].sum())
        seconds[i] = dt
        result.selections += int(rows["k"].sum())
        result.hits += int(rows["n_hit"].sum())
        result.substitutions += int(rows["n_substitute"].sum())
        result.bytes_async += int(rows["bytes_async"].sum())
        result.fills += int(rows["n_fetch"].sum()) + int(rows["n_admit"].sum())
        if "n_disk" in (rows.dtype.names or ()):
            result.disk_fills += int(rows["n_disk"].sum())
            result.bytes_disk += int(rows["bytes_disk"].sum())
        result.first_choice_substituted = (result.first_choice_substituted or 0) + int(
            (rows["action"][:, 0] == 2).sum())
        if progress is not None:
            progress(i + 1)
        if stopped is not None and stopped():
            return j + 1, True
    return len(tokens) - 1, False


# --------------------------------------------------------------------------- statistics


def change_interval(nll: npt.ArrayLike, base: npt.ArrayLike, block: int, *,
                    n_boot: int = 2000, seed: int = 0) -> tuple[float, float, float]:
    """Perplexity change (%) of ``nll`` against ``base`` (per-token NLL of the same tokens
    under a policy and under Exact) and its 95% interval.

    The interval resamples blocks of ``block`` consecutive tokens, not tokens: neighbouring
    tokens share context and routing, so a per-token bootstrap would claim more certainty
    than the text holds. Returns ``(change, low, high)``; identical runs give zeros.
    """
    d = np.asarray(nll, dtype=np.float64) - np.asarray(base, dtype=np.float64)
    if d.size == 0:
        return 0.0, 0.0, 0.0
    starts = np.arange(0, d.size, max(1, block))
    sums = np.add.reduceat(d, starts)
    counts = np.diff(np.append(starts, d.size))
    point = float(np.expm1(sums.sum() / counts.sum()) * 100.0)
    rng = np.random.default_rng(seed)
    pick = rng.integers(0, len(sums), size=(n_boot, len(sums)))
    samples = np.expm1(sums[pick].sum(axis=1) / counts[pick].sum(axis=1)) * 100.0
    low, high = np.percentile(samples, [2.5, 97.5])
    return point, float(low), float(high)


MIN_RUNS_FOR_R = 5
"""First-choice-preserving runs, with as many different substituted masses and
perplexity changes, that r across runs needs. Fewer points and r is near ±1 whatever the
runs did: 2 points always give ±1 and 3 give |r| near 1 for most orderings, so the
bootstrap of 3 runs put r = +1.000 outside its own interval [-0.987, +0.999]. With
fewer, the report says so in words instead of printing r."""


def distinct_values(x: npt.ArrayLike) -> int:
    """How many different values ``x`` holds, values within 1e-9 of its largest magnitude
    counting as one (a run that substitutes nothing has mass 0 and the same perplexity as
    Exact, bit for bit or to rounding)."""
    v = np.sort(np.asarray(x, dtype=np.float64).ravel())
    if v.size == 0:
        return 0
    tol = 1e-9 * float(np.abs(v).max())
    return 1 + int((np.diff(v) > tol).sum())


def pearson(x: npt.ArrayLike, y: npt.ArrayLike, *, min_distinct: int = 3) -> float:
    """Pearson's r; NaN when either side has fewer than ``min_distinct`` (at least 3)
    different values (:func:`distinct_values`): with 2 the line through them makes r
    exactly ±1, which says nothing about the data (no variance at all is NaN too)."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    need = max(3, min_distinct)
    if a.size < need or a.size != b.size:
        return float("nan")
    if distinct_values(a) < need or distinct_values(b) < need:
        return float("nan")
    a = a - a.mean()
    b = b - b.mean()
    den = math.sqrt(float((a * a).sum()) * float((b * b).sum()))
    return float((a * b).sum() / den) if den > 0 else float("nan")


def bootstrap_interval(point: float, samples: Sequence[float], *,
                       least: int) -> tuple[float, float]:
    """The 95% percentile interval of the bootstrap ``samples`` (NaN ones, degenerate
    resamples, left out), taken out to ``point`` where the samples lie to one side of it,
    so the interval always contains the estimate it belongs to (a skewed bootstrap: r
    near ±1 from few runs). NaN when ``point`` is NaN or fewer than ``least`` samples are
    usable."""
    v = np.asarray([s for s in samples if not math.isnan(s)], dtype=np.float64)
    if math.isnan(point) or v.size < max(1, least):
        return (float("nan"), float("nan"))
    lo, hi = np.percentile(v, [2.5, 97.5])
    return (min(float(lo), point), max(float(hi), point))


@dataclass(frozen=True)
class MassHypothesis:
    """Pearson r between substituted mass and perplexity change (paper 1's r ≈ 0.92).

    ``r_runs``: one point per run (policy x budget), mass per token against perplexity
    change over the whole text; ``r_windows``: one point per run and window. Both have
    95% bootstrap intervals from resampling windows with replacement. ``r_runs`` is NaN,
    and said in words, with fewer than :data:`MIN_RUNS_FOR_R` runs or different values.
    """

    runs: tuple[str, ...]
    n_windows: int
    window: int
    r_runs: float
    ci_runs: tuple[float, float]
    r_windows: float
    ci_windows: tuple[float, float]
    n_boot: int
    n_segments: int = 1
    """Segments of the text the windows were cut from (none straddles two)."""
    distinct_runs: int = -1
    """Different points among the runs (the fewer of their different masses and
    perplexity changes); -1: as many as runs."""

    @property
    def too_few_runs(self) -> str:
        """Why r across runs is not given (too few runs, or too few that differ), or ""."""
        n = len(self.runs)
        differ = n if self.distinct_runs < 0 else self.distinct_runs
        if n < MIN_RUNS_FOR_R:
            return (f"r needs at least {MIN_RUNS_FOR_R} first-choice-preserving runs; this "
                    f"eval has {n} (add budgets, or a theta sweep: --sweep-theta)")
        if differ < MIN_RUNS_FOR_R:
            return (f"r needs at least {MIN_RUNS_FOR_R} first-choice-preserving runs that "
                    f"differ in substituted mass and perplexity; this eval's {n} give "
                    f"{differ} different points (runs that substitute nothing are one: "
                    f"Exact's)")
        return ""

    def describe(self) -> str:
        def fmt(r: float, ci: tuple[float, float]) -> str:
            if math.isnan(r):
                return "n/a"
            lo, hi = ci
            return f"{r:+.3f}" + ("" if math.isnan(lo) else f" [95% CI {lo:+.3f}, {hi:+.3f}]")

        n = len(self.runs)
        head = (f"mass hypothesis over {n} first-choice-preserving "
                f"run{'' if n == 1 else 's'}, "
                f"{self.n_windows} window{'' if self.n_windows == 1 else 's'} of "
                f"{self.window} tokens"
                + (f" in {self.n_segments} segments" if self.n_segments > 1 else ""))
        if why := self.too_few_runs:
            return (f"{head}: {why}; across run x window points r = "
                    f"{fmt(self.r_windows, self.ci_windows)}")
        width = self.ci_runs[1] - self.ci_runs[0]
        return (head + ": r = "
                f"{fmt(self.r_runs, self.ci_runs)} across runs"
                + ("" if math.isnan(width) else f" (interval width {width:.3f})")
                + f", {fmt(self.r_windows, self.ci_windows)} across run x window points")


def _segment_lengths(starts: Sequence[int], n: int) -> list[int]:
    bounds = [*starts, n]
    return [bounds[k + 1] - bounds[k] for k in range(len(starts))]


def _window_starts(starts: Sequence[int], n: int, window: int) -> npt.NDArray[np.intp]:
    """First index of each whole window of ``window`` tokens inside one segment (a
    segment's tail shorter than a window is left out, as is the text's when it is one)."""
    out = [s + k * window for s, length in zip(starts, _segment_lengths(starts, n),
                                                strict=True)
           for k in range(length // window)]
    return np.asarray(out, dtype=np.intp)


def _window_means(values: npt.NDArray[np.float64], firsts: npt.NDArray[np.intp],
                  window: int) -> npt.NDArray[np.float64]:
    return values[firsts[:, None] + np.arange(window)].mean(axis=1)


def mass_hypothesis(runs: Sequence[RunResult], baseline: RunResult, window: int, *,
                    n_boot: int = 1000, seed: int = 0) -> MassHypothesis:
    """Correlate substituted mass with perplexity change among runs whose miss rule always
    fetches the first choice (``exact`` included: it is the zero point)."""
    eligible = [r for r in runs if r.spec.policy.miss_rule in FIRST_CHOICE_RULES
                or r.preserves_first_choice]
    starts = baseline.segment_starts
    # no longer than the longest segment, so there is at least one window
    window = max(1, min(window, max(_segment_lengths(starts, baseline.n_tokens))))
    firsts = _window_starts(starts, baseline.n_tokens, window)
    base_nll = _window_means(baseline.nll, firsts, window)  # (W,)
    nan2 = (float("nan"), float("nan"))
    if not eligible:
        return MassHypothesis(runs=(), n_windows=base_nll.size, window=window,
                              r_runs=nan2[0], ci_runs=nan2, r_windows=nan2[0],
                              ci_windows=nan2, n_boot=0, n_segments=len(starts))
    nll = np.array([_window_means(r.nll, firsts, window) for r in eligible]
                   ).reshape(len(eligible), -1)
    mass = np.array([_window_means(r.mass, firsts, window) for r in eligible]
                    ).reshape(len(eligible), -1)
    n_windows = base_nll.size

    def stats(idx: npt.NDArray[np.intp]) -> tuple[float, float]:
        d_nll = nll[:, idx] - base_nll[idx]  # per-window log perplexity ratio
        change_w = 100.0 * np.expm1(d_nll)
        change_runs = 100.0 * np.expm1(d_nll.mean(axis=1))
        # a resample where fewer runs differ than r needs is degenerate: NaN, not ±1
        return (pearson(mass[:, idx].mean(axis=1), change_runs,
                        min_distinct=MIN_RUNS_FOR_R),
                pearson(mass[:, idx].ravel(), change_w.ravel()))

    everything = np.arange(n_windows)
    r_runs, r_windows = stats(everything)
    d_all = nll - base_nll
    distinct = min(distinct_values(mass.mean(axis=1)),
                   distinct_values(100.0 * np.expm1(d_all.mean(axis=1))))
    rng = np.random.default_rng(seed)
    boots: list[tuple[float, float]] = []
    if n_windows > 1:
        boots = [stats(rng.integers(0, n_windows, n_windows)) for _ in range(n_boot)]
    least = max(10, n_boot // 10)

    return MassHypothesis(
        runs=tuple(f"{r.spec.label}@{r.spec.budget}" for r in eligible), n_windows=n_windows,
        window=window, r_runs=r_runs,
        ci_runs=bootstrap_interval(r_runs, [b[0] for b in boots], least=least),
        r_windows=r_windows,
        ci_windows=bootstrap_interval(r_windows, [b[1] for b in boots], least=least),
        n_boot=len(boots), n_segments=len(starts), distinct_runs=distinct,
    )


# --------------------------------------------------------------------------- the report


@dataclass
class EvalReport:
    """Every run, the exact baseline they are compared with, and the mass hypothesis."""

    runs: list[RunResult]
    baseline: RunResult
    hypothesis: MassHypothesis
    n_tokens: int
    model: str = ""
    ram_tier: str = ""
    """The RAM tier's size when it was on (experts beyond it read from the model file):
    the table then shows disk bytes and RAM hits per run."""
    audit_every: int = 0
    """Every Nth step was audited (0: off): the table then shows each run's audited cost,
    measured on the text's own tokens (they are given), and the KL estimate beside it."""
    segments: int = 1
    """Segments the text was scored in (each from an empty context; 1: it fit)."""
    segment_tokens: int = 0
    """Scored tokens of the longest segment (0: unknown)."""

    def change_pct(self, run: RunResult) -> float:
        """Perplexity change against ``exact``, in percent."""
        return 100.0 * (run.perplexity / self.baseline.perplexity - 1.0)

    def rows(self) -> list[dict[str, Any]]:
        """One dict per run with raw numbers (the CSV's rows)."""
        return [{
            "policy": r.spec.label, "budget": r.spec.budget, "slots": r.slots,
            "tokens": r.n_tokens, "perplexity": r.perplexity,
            "ppl_change_pct": self.change_pct(r),
            "substituted_pct": 100.0 * r.substituted_fraction,
            "mass_per_token": r.mass_per_token, "hit_rate": r.hit_rate,
            "fetched_bytes_per_token": r.fetched_bytes_per_token,
            "seconds_per_token": r.seconds_per_token,
            **({"disk_bytes_per_token": r.disk_bytes_per_token, "ram_hit_rate": r.ram_hit_rate}
               if self.ram_tier else {}),
            **(self._audit_row(r) if self.audit_every else {}),
        } for r in self.runs]

    @staticmethod
    def _audit_row(r: RunResult) -> dict[str, Any]:
        """The CSV's audit columns: the measured estimate (matched: the tokens are given)
        with its interval, and the KL estimate, in percent."""
        est = r.audit
        if est is None:
            return dict.fromkeys(("audits", "audit_measured_pct", "audit_measured_low_pct",
                                  "audit_measured_high_pct", "audit_kl_pct"), "")
        return {"audits": est.n, "audit_measured_pct": 100 * est.cost,
                "audit_measured_low_pct": 100 * est.low,
                "audit_measured_high_pct": 100 * est.high, "audit_kl_pct": 100 * est.kl.cost}

    @staticmethod
    def _audit_cells(r: RunResult) -> str:
        est = r.audit
        if est is None:
            return " – | – |"
        ci = f" [{100 * est.low:+.2f}, {100 * est.high:+.2f}]" if est.n >= 2 else ""
        return f" {est.cost_text()}{ci} | {100 * est.kl.cost:+.2f}% |"

    def to_csv(self) -> str:
        out = io.StringIO()
        rows = self.rows()
        writer = csv.DictWriter(out, fieldnames=list(rows[0]) if rows else ["policy"],
                                lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
        return out.getvalue()

    def to_markdown(self) -> str:
        """The table the CLI prints, with the mass hypothesis underneath."""
        lines = [
            f"Teacher-forced perplexity on {self.n_tokens} tokens"
            + (f" of {self.model}" if self.model else "")
            + (f" in {self.segments} segments of at most {self.segment_tokens} (each from an "
               "empty context, the expert cache carrying on)" if self.segments > 1 else "")
            + (f"; RAM tier {self.ram_tier}, experts beyond it read from the file"
               if self.ram_tier else "")
            + f"; baseline exact = {self.baseline.perplexity:.4f}",
            "",
            "| policy | budget | slots | perplexity | Δ vs exact | substituted | mass/tok "
            "| hit rate | fetched/tok | ms/tok |" + (" disk/tok | RAM hits |" if self.ram_tier
                                                   else "")
            + (" audited, measured on the text [95% CI] | KL estimate |"
               if self.audit_every else ""),
            "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|---:|" if self.ram_tier
                                                               else "")
            + ("---:|---:|" if self.audit_every else ""),
        ]
        for r in self.runs:
            lines.append(
                f"| {r.spec.label} | {r.spec.budget} | {r.slots} | {r.perplexity:.4f} | "
                f"{self.change_pct(r):+.2f}% | {100 * r.substituted_fraction:.1f}% | "
                f"{r.mass_per_token:.3f} | {100 * r.hit_rate:.1f}% | "
                f"{format_bytes(round(r.fetched_bytes_per_token))} | "
                f"{1e3 * r.seconds_per_token:.2f} |"
                + (f" {format_bytes(round(r.disk_bytes_per_token))} | "
                   f"{100 * r.ram_hit_rate:.1f}% |" if self.ram_tier else "")
                + (self._audit_cells(r) if self.audit_every else ""))
        lines += ["", self.hypothesis.describe()]
        if self.audit_every:
            lines += ["", f"Audits every {self.audit_every} tokens: the text's tokens are "
                      "given, so the audited cost is measured on them, exp(mean(log p_exact "
                      "- log p_policy)) - 1 over the audited steps (it leaves out the KV "
                      "drift of earlier substitutions that Δ vs exact includes); the KL "
                      "estimate is the cost expected on the model's own text."]
        return "\n".join(lines)


def evaluate(engine: Engine, tokens: Sequence[int] | Segments, specs: Sequence[RunSpec], *,
             window: int = 64, n_boot: int = 1000, seed: int = 0,
             progress: ProgressFn | None = None, audit_every: int = 0) -> EvalReport:
    """Run every spec on ``tokens`` (one at a time, cache governing each) and compare.

    ``tokens`` is one segment or consecutive segments (:func:`split_segments`, for a text
    longer than the context). If no spec is ``exact``, an exact run at the first spec's
    budget is added as the baseline (any budget gives the same logits). ``window`` is the
    mass-hypothesis window. ``audit_every`` N also audits every Nth step of each run
    (``run_one``).
    """
    segments = [s for s in _as_segments(tokens) if len(s) >= 2]
    if not segments:
        raise MoEScopeError("evaluation needs at least 2 tokens of text")
    if len(segments) > MAX_SEGMENTS:
        raise MoEScopeError(f"{len(segments)} segments; at most {MAX_SEGMENTS}")
    if window < 1:
        raise MoEScopeError("the window must be at least 1 token")
    if not specs:
        raise MoEScopeError("no policy x budget to evaluate")
    specs = list(specs)
    if not any(s.policy.exact for s in specs):
        specs.insert(0, RunSpec(Policy.preset("exact"), specs[0].budget))
    per_run = sum(len(s) - 1 for s in segments)
    total = per_run * len(specs)
    runs: list[RunResult] = []
    for n, spec in enumerate(specs):
        label = f"{spec.label} @ {spec.budget}"
        done = n * per_run

        def tick(i: int, done: int = done, label: str = label) -> None:
            if progress is not None:
                progress(done + i, total, label)

        tick(0)
        runs.append(run_one(engine, segments, spec, progress=tick, audit_every=audit_every))
    baseline = next(r for r in runs if r.spec.policy.exact)
    model = engine.model.path.name if engine.model is not None else ""
    ram = engine.model.ram_plan if engine.model is not None else None
    ram_tier = f"{ram.slots_per_layer}/{ram.n_expert} experts per layer" if ram else ""
    return EvalReport(runs=runs, baseline=baseline, ram_tier=ram_tier,
                      hypothesis=mass_hypothesis(runs, baseline, window, n_boot=n_boot,
                                                 seed=seed),
                      n_tokens=per_run, model=model, audit_every=audit_every,
                      segments=len(segments),
                      segment_tokens=max(len(s) - 1 for s in segments))
