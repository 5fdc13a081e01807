"""Replay a trace's routing through the native core: the router-logit simulator.

*Which Expert Misses Are Worth Waiting For?* compares policies with a simulator that replays
router decisions instead of running the model. Ours replays a MoEScope trace through the
SAME core the engine runs (:class:`~moescope.cache.native.ExpertCache`), so with the trace's
own policy and budget it makes exactly the engine's decisions, and under another policy or
budget it says what that one would have done to the same routing.

Exactness needs the engine's order and cache state, which the trace provides:

* the cache starts empty at the step recording began (the engine enables an empty cache);
* the core's step advances only when the engine called ``begin_step`` (governed decode
  ubatches); prefill keeps llama.cpp's path, but its last layer sees only the output token
  and is routed without a new step: rows carry the step, so the replay follows it;
* one ``route`` call per (step, layer) group of consecutive rows, so a batched ubatch is
  decided as one batch;
* policy and budget changes are applied at the token where they took effect, before its
  rows, just as the engine applies them between tokens;
* after each route call, PSR's ``prefetch`` for the next MoE layer with the prediction the
  row recorded (ranked ids; a policy that does not prefetch ignores them), as the engine's
  route op does. Its copies are counted as background copies of that token, and the core's
  prefetch counters (prefetches, prefetch hits) are taken per token exactly as the trace
  recorder takes the engine's (:mod:`moescope.cache.prefetch`), so the two can be compared.

Rows recorded without router inputs (earlier tokens of a batched ubatch, or a trace written
without them) are replayed from the event row itself: ids and normalized weights are exact,
but probabilities are unknown, so a substitute choice can differ; such rows are counted in
:attr:`ReplayResult.approximate_rows`.

A little above 600 lines on purpose: the rules above are one walk over the trace, each
depending on the state the previous one left (step, policy, slots, prefetch counters);
split, the order that makes the replay exact would have to be read across files.
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache.batch import CReplayTrace, ProgressFn, Ranking, ReplayPlan
from moescope.cache.native import (
    COPY_DTYPE,
    EVENT_DTYPE,
    OK,
    CPolicy,
    ExpertCache,
    NativeError,
    policy_to_c,
)
from moescope.cache.policy import MissRule, Policy
from moescope.cache.prefetch import PrefetchMeter, PrefetchSummary
from moescope.trace import MAX_STEP_SLACK, Change, Trace, TraceFormatError, TraceHeader
from moescope.trace.schema import TraceColumns

TOKEN_COST_DTYPE = np.dtype([
    ("decode", np.bool_),
    ("rows", np.int32),
    ("selections", np.int64),
    ("hits", np.int64),
    ("fetches", np.int64),
    ("substitutions", np.int64),
    ("admissions", np.int64),
    ("substituted_mass", np.float64),
    ("bytes_sync", np.int64),
    ("bytes_async", np.int64),
    ("n_sync", np.int64),
    ("n_async", np.int64),
    ("prefetching", np.bool_),
    ("prefetches", np.int64),
    ("prefetch_hits", np.int64),
    ("n_disk", np.int64),
    ("bytes_disk", np.int64),
])
"""What the cache did for one trace token, summed over its rows and copy plans.
``n_disk`` / ``bytes_disk``: slot fills read from the model file (a replay with a RAM tier,
:func:`replay`'s ``ram_slots``; 0 otherwise).
``prefetching``: the policy in force prefetches (and the trace has the predictions to);
``prefetches`` / ``prefetch_hits``: the core's PSR counters for the token, all layers."""


@dataclass
class Routing:
    """A trace's routing laid out in flat arrays, prepared once for any number of replays
    (the per-configuration :func:`replay` and the native :func:`replay_many` read the
    same arrays).

    Row ``r`` (in trace order) has the router's ``ids[r]``, raw gate ``weights[r]`` and full
    ``probs[r]``; ``exact[r]`` is False where they were rebuilt from the event row. Route
    call ``c`` decides rows ``call_start[c]:call_stop[c]`` of layer ``call_layer[c]`` at
    step ``call_step[c]``; token ``t`` owns calls ``token_calls[t]:token_calls[t + 1]``.
    """

    header: TraceHeader
    ids: npt.NDArray[np.int32]
    weights: npt.NDArray[np.float32]
    probs: npt.NDArray[np.float32]
    exact: npt.NDArray[np.bool_]
    recorded_rows: npt.NDArray[Any] | Callable[[], npt.NDArray[Any]]
    """The engine's event rows (:attr:`recorded`), or a function laying them out when
    first asked for: a replay reads none of them, and laying them out (864 bytes a row)
    took as long as the rest of the layout."""
    call_step: npt.NDArray[np.int64]
    call_layer: npt.NDArray[np.int32]
    call_start: npt.NDArray[np.int64]
    call_stop: npt.NDArray[np.int64]
    token_calls: npt.NDArray[np.int64]
    token_rows: npt.NDArray[np.int64]
    """Token ``t``'s rows are ``token_rows[t]:token_rows[t + 1]``."""
    changes: list[tuple[Change, ...]]
    """Per token, the changes that took effect before its rows."""
    decode: npt.NDArray[np.bool_]
    next_layer: npt.NDArray[np.int32] | None = None
    """PSR: per row, the layer its recorded prediction is for (-1: none); None: no row has
    one (a trace from before PSR, or recorded without router inputs)."""
    predicted: npt.NDArray[np.int32] | None = None
    """PSR: per row, the recorded prediction's expert ids, best first (-1 padded)."""
    ranking: Ranking | None = field(default=None, repr=False)
    """Each row's experts in substitution order (:meth:`substitute_ranking`), once
    made."""
    plan: ReplayPlan | None = field(default=None, repr=False, compare=False)
    """The batch replay's plan of these arrays and the ranking (:meth:`replay_plan`), once
    made."""
    _lock: threading.RLock = field(default_factory=threading.RLock, init=False, repr=False,
                                   compare=False)
    _recorded: npt.NDArray[Any] | None = field(default=None, init=False, repr=False,
                                               compare=False)

    @property
    def recorded(self) -> npt.NDArray[Any]:
        """The engine's event rows, for comparisons (laid out on first use)."""
        with self._lock:
            if self._recorded is None:
                rows = self.recorded_rows
                self._recorded = rows() if callable(rows) else rows
                self.recorded_rows = self._recorded
            return self._recorded

    def substitute_ranking(self, threads: int = 0) -> Ranking | None:
        """Every row's best experts in the order a substitute is chosen
        (``moecache_rank_rows``), made at the first call and kept: every batch replay of
        this routing shares it, so a configuration picks a substitute as the first resident
        its row ranks instead of scanning a layer's slots per row (and the routing bonus
        reads the selection's probabilities from a copy, not from the row). None where the
        core cannot rank (the replay scans, deciding the same)."""
        from moescope.cache.batch import rank_rows

        with self._lock:
            if self.ranking is None:
                self.ranking = rank_rows(self.probs, self.ids, threads=threads)
            return self.ranking

    def replay_plan(self, trace: CReplayTrace, threads: int = 0) -> ReplayPlan | None:
        """The batch replay's plan of ``trace`` (the ``CReplayTrace`` :func:`replay_many`
        builds over these arrays and :meth:`substitute_ranking`), made at the first call and
        kept, like the ranking, for every later batch of any policies: the rows validated
        once and packed layer by layer, so a what-if starts replaying at once. It is a copy
        of what the replay loop reads, kept as long as the routing: ``20 * top_k + 257``
        bytes a row and up to ``104 + 4 * pred_width`` a route call (``nbytes`` exactly;
        689 B a row at top-10 with PSR predictions, a third of the ``4 * n_expert`` of the
        probabilities at 512 experts). Made again if the arrays moved (a caller replaced
        one). None where the core keeps no plans."""
        from moescope.cache.batch import plan_key

        with self._lock:
            if self.plan is None or self.plan.key != plan_key(trace):
                self.plan = None  # the old one is freed before the new one is made
                self.plan = ReplayPlan.make(trace, threads=threads)
            return self.plan

    def prepare(self, threads: int = 0, *,
                cancelled: Callable[[], bool] = lambda: False) -> None:
        """The ranking and the plan the first :func:`replay_many` would make before its
        first layer, made now (a window prepares them while its user looks at its plots:
        the first what-if then replays at once). Nothing where the core keeps no plans.
        ``cancelled`` is asked before each (a closing window waits only for the step in
        flight); whatever was not made is made by the first replay."""
        from moescope.cache.batch import has_plan

        if not self.n_rows or not has_plan() or cancelled():
            return
        ranking = self.substitute_ranking(threads)
        if cancelled():
            return
        ct, keep = native_trace(self, ranking)
        self.replay_plan(ct, threads)
        del keep  # the buffers ct points into, alive until the plan is made

    @property
    def n_rows(self) -> int:
        return len(self.ids)

    @property
    def n_tokens(self) -> int:
        return len(self.decode)

    def scores(self, row: int) -> npt.NDArray[np.float32]:
        """Scores under which ``moecache_prefetch`` ranks row ``row``'s recorded
        prediction as the engine did (its ranks, -inf for the rest)."""
        assert self.predicted is not None
        out = np.full(self.probs.shape[1], -np.inf, dtype=np.float32)
        ranked = self.predicted[row]
        ranked = ranked[ranked >= 0]
        out[ranked] = np.arange(len(ranked), 0, -1)
        return out

    @classmethod
    def from_trace(cls, trace: Trace) -> Routing:
        """Lay out ``trace``'s rows and group them into route calls (a version-2 trace's
        columns are used as read; a version-1 trace's rows are gathered first)."""
        m = trace.header.model
        k = m.top_k
        columns = trace.columns if trace.columns is not None and \
            len(trace.columns.token_rows) == len(trace.tokens) + 1 else _columns(trace)
        exact = columns.exact
        n = len(exact)
        ids = np.ascontiguousarray(columns.ids[:, :k], dtype=np.int32).reshape(n, k)
        weights = np.array(columns.gate, dtype=np.float32, copy=True).reshape(n, k)
        probs = columns.probs if n else np.zeros((0, m.n_expert), np.float32)
        if (~exact).any():  # rebuilt from the event row: its weights stand in for probs
            events = columns.events
            probs = np.array(probs, copy=True)
            rows = np.flatnonzero(~exact)
            weights[rows] = events["weights"][rows, :k]
            probs[rows] = 0
            probs[rows[:, None], ids[rows]] = events["weights"][rows, :k]
        probs = np.ascontiguousarray(probs, dtype=np.float32)
        token_rows = columns.token_rows
        step = columns.row_field("step").astype(np.int64)
        layer = columns.row_field("layer").astype(np.int32)
        batch = columns.row_field("token").astype(np.int64)
        new = np.ones(n, dtype=np.bool_)
        if n > 1:
            new[1:] = (step[1:] != step[:-1]) | (layer[1:] != layer[:-1]) | \
                (batch[1:] <= batch[:-1])
        firsts = token_rows[:-1][np.diff(token_rows) > 0]
        new[firsts] = True
        call_start = np.flatnonzero(new).astype(np.int64)
        call_stop = np.append(call_start[1:], n).astype(np.int64)
        token_calls = np.searchsorted(call_start, token_rows).astype(np.int64)
        predicted = columns.predicted
        has_pred = predicted is not None and columns.next_layer is not None and \
            bool((columns.next_layer >= 0).any())
        return cls(
            header=trace.header, ids=ids, weights=weights, probs=probs, exact=exact,
            recorded_rows=lambda: columns.events, call_step=step[call_start],
            call_layer=layer[call_start],
            call_start=call_start, call_stop=call_stop, token_calls=token_calls,
            token_rows=np.asarray(token_rows, dtype=np.int64),
            changes=[tuple(t.changes) for t in trace.tokens],
            decode=np.array([t.phase == "decode" for t in trace.tokens], dtype=np.bool_),
            next_layer=columns.next_layer if has_pred else None,
            predicted=np.ascontiguousarray(predicted, dtype=np.int32) if has_pred else None)


def _columns(trace: Trace) -> TraceColumns:
    """A version-1 trace's rows in the flat layout a version-2 reader produces."""
    m = trace.header.model
    events = trace.events()
    n = len(events)
    k, e = m.top_k, m.n_expert
    probs = np.zeros((n, e), dtype=np.float32)
    gate = np.zeros((n, k), dtype=np.float32)
    exact = np.zeros(n, dtype=np.bool_)
    width = max((len(rt.predicted) for tok in trace.tokens for rt in tok.routes.values()
                 if rt.predicted is not None), default=0)
    next_layer = np.full(n, -1, dtype=np.int32) if width else None
    predicted = np.full((n, width), -1, dtype=np.int32) if width else None
    token_rows = np.zeros(len(trace.tokens) + 1, dtype=np.int64)
    r = 0
    for t, tok in enumerate(trace.tokens):
        for i, route in tok.routes.items():
            probs[r + i] = route.probs
            gate[r + i] = route.weights
            exact[r + i] = True
            if route.predicted is not None and next_layer is not None \
                    and predicted is not None:
                next_layer[r + i] = route.next_layer
                predicted[r + i, :len(route.predicted)] = route.predicted
        r += len(tok.events)
        token_rows[t + 1] = r
    return TraceColumns(events=events, token_rows=token_rows, exact=exact, probs=probs,
                        gate=gate, next_layer=next_layer, predicted=predicted)


@dataclass
class ReplayResult:
    """What one policy and budget did to a trace's routing.

    Per-token arrays cover every trace token; the summary properties average over decode
    tokens, the steady state the cache governs (prefill rows are replayed, since they
    change the cache, but not counted).
    """

    policy: str
    slots: int | None
    """Slots per layer, or None when the budget followed the trace (resizes included)."""
    per_token: npt.NDArray[Any]
    events: npt.NDArray[Any] | None = None
    approximate_rows: int = 0
    warnings: list[str] = field(default_factory=list)
    layer_prefetches: npt.NDArray[np.int64] | None = None
    """With ``keep_events``: per token and MoE layer (``(n_tokens, len(moe_layers))``), the
    experts prefetched, to compare with the trace's ``TokenRecord.prefetches``."""
    layer_prefetch_hits: npt.NDArray[np.int64] | None = None
    """With ``keep_events``: per token and MoE layer, the prefetch hits."""

    @cached_property
    def decode(self) -> npt.NDArray[Any]:
        """The decode tokens' rows (a copy, made at the first use: every summary reads it,
        and a what-if's table asks a dozen summaries of each of ~50 results)."""
        # take() of the positions: a boolean mask over a structured array copies field by
        # field, ten times slower (a what-if's 50 results: 56 ms against 5)
        return self.per_token.take(np.flatnonzero(self.per_token["decode"]))

    @property
    def n_tokens(self) -> int:
        """Decode tokens the averages are over."""
        return len(self.decode)

    def _sum(self, name: str) -> float:
        return float(self.decode[name].sum())

    def _per_token(self, name: str) -> float:
        return self._sum(name) / self.n_tokens if self.n_tokens else 0.0

    @property
    def hit_rate(self) -> float:
        sel = self._sum("selections")
        return self._sum("hits") / sel if sel else 0.0

    @property
    def substituted_fraction(self) -> float:
        sel = self._sum("selections")
        return self._sum("substitutions") / sel if sel else 0.0

    @property
    def fetches_per_token(self) -> float:
        return self._per_token("fetches")

    @property
    def fetched_bytes_per_token(self) -> float:
        return self._per_token("bytes_sync")

    @property
    def admissions_per_token(self) -> float:
        return self._per_token("admissions")

    @property
    def mass_per_token(self) -> float:
        """Substituted gate mass per token, summed over layers (paper 1's metric)."""
        return self._per_token("substituted_mass")

    @property
    def prefetch(self) -> PrefetchSummary | None:
        """PSR over the decode tokens whose policy prefetched (the live panel's definition
        of prefetch accuracy, :class:`~moescope.cache.prefetch.PrefetchSummary`); None when
        none did, so a policy without prefetch shows no number rather than 0%."""
        d = self.decode
        on = d[d["prefetching"]]
        if not len(on):
            return None
        return PrefetchSummary(tokens=len(on), prefetches=int(on["prefetches"].sum()),
                               hits=int(on["prefetch_hits"].sum()))


def replay(routing: Routing | Trace, policy: Policy | str | None = None,
           slots: int | None = None, *, keep_events: bool = False,
           ram_slots: int = 0) -> ReplayResult:
    """Replay ``routing`` under ``policy`` with ``slots`` per layer.

    ``ram_slots`` > 0 replays under a logical RAM tier of that many experts per layer (the
    rest only on disk): decisions may then tell RAM misses from disk misses (quality-first's
    ``theta_disk``), and the result counts the fills read from disk for the cost model.
    The trace's own RAM budget changes are not followed.

    ``None`` for either follows the trace: its starting policy or slots, then every change
    it recorded at the token where it took effect. With both ``None`` the replay must
    reproduce the engine's event rows (``keep_events`` returns the replayed rows).
    """
    if isinstance(routing, Trace):
        routing = Routing.from_trace(routing)
    h = routing.header
    m = h.model
    fixed_policy = Policy.preset(policy) if isinstance(policy, str) else policy
    start_policy = fixed_policy if fixed_policy is not None else h.policy
    start_slots = slots if slots is not None else h.slots_per_layer
    warnings: list[str] = []
    if h.initial_resident:
        warnings.append(f"recording began with {h.initial_resident} experts resident; the "
                        "replay starts empty, so early decisions may differ")
    if fixed_policy is None and _recorded_with_probability_bonus(routing):
        warnings.append(f"recorded by core {h.software.get('moecache')}, whose routing bonus "
                        "was in router-probability units; it is now in gate-weight units, so "
                        "the recorded cache-prior/psr decisions are not reproduced exactly")
    _check_steps(routing)
    n_tokens = routing.n_tokens
    per_token = np.zeros(n_tokens, dtype=TOKEN_COST_DTYPE)
    kept: list[npt.NDArray[Any]] = []
    rows_per_token = max(int(np.diff(routing.token_rows).max(initial=1)), 1)
    with ExpertCache(m.n_layers, m.n_expert, m.top_k, start_slots, start_policy) as cache:
        for layer, n_bytes in zip(m.moe_layers, m.bytes_per_expert, strict=True):
            cache.set_expert_bytes(layer, n_bytes)
        cache.set_event_capacity(max(1024, 2 * rows_per_token))
        if ram_slots:
            cache.set_ram_slots(ram_slots)
        cache.begin_steps(h.initial_step - cache.step)
        route = _Router(cache, routing, max(rows_per_token, 1))
        prefetched = 0
        meter = PrefetchMeter(cache, m.moe_layers)
        counting = False  # the counters stay 0 until the first prefetch: no need to read
        layer_pf = (np.zeros((n_tokens, len(m.moe_layers)), dtype=np.int64)
                    if keep_events else None)
        layer_hits = layer_pf.copy() if layer_pf is not None else None
        requested = before = start_policy  # the latest policy set, and the one before
        if routing.predicted is None and routing.decode.any() and (start_policy.prefetch or any(
                c.kind == "policy" and c.policy and c.policy.prefetch
                for changes in routing.changes for c in changes)):
            warnings.append("the trace has no PSR predictions (recorded before PSR or "
                            "without router inputs): the replay cannot prefetch")
        step = cache.step
        for t in range(n_tokens):
            for change in routing.changes[t]:
                if change.kind == "note" and "dropped" in change.text:
                    _warn_once(warnings, "dropped", f"the engine dropped event rows "
                                                    f"({change.text}); the replay diverges")
                if change.kind == "policy" and fixed_policy is None and change.policy:
                    cache.set_policy(change.policy)
                    requested = change.policy
                elif (change.kind == "slots" and slots is None and change.slots
                      and change.slots != cache.slots):
                    cache.set_slots(change.slots)
            # a switch applies at the token's first begin_step, so either policy may be in
            # force for its rows; the core's prefetch is a no-op under one that does not
            prefetching = routing.predicted is not None and bool(
                requested.prefetch or before.prefetch)
            before = requested
            for c in range(int(routing.token_calls[t]), int(routing.token_calls[t + 1])):
                call_step = int(routing.call_step[c])
                start, stop = int(routing.call_start[c]), int(routing.call_stop[c])
                if step > call_step or call_step > step + 1:
                    _warn_once(warnings, "order",
                               f"the trace jumps from step {step} to {call_step}: rows are "
                               "missing or out of order, so later decisions may differ")
                if step < call_step:
                    cache.begin_steps(call_step - step)
                    step = call_step
                route(int(routing.call_layer[c]), start, stop)
                if prefetching:
                    counting = True
                    prefetched += route.prefetch(start, stop)
            rows = cache.drain_events()
            _summarize(per_token[t], rows, bool(routing.decode[t]))
            per_token[t]["prefetching"] = routing.predicted is not None and bool(
                requested.prefetch)
            if counting:
                delta = meter.take()
                per_token[t]["prefetches"] = int(delta[0].sum())
                per_token[t]["prefetch_hits"] = int(delta[1].sum())
                if layer_pf is not None and layer_hits is not None:
                    layer_pf[t], layer_hits[t] = delta[0], delta[1]
            if prefetched:
                per_token[t]["n_async"] += prefetched
                per_token[t]["bytes_async"] += route.prefetched_bytes
                prefetched, route.prefetched_bytes = 0, 0
            if keep_events:
                kept.append(rows)
        if cache.events_dropped:
            warnings.append(f"{cache.events_dropped} event rows were dropped")
    label = (fixed_policy.name or "custom") if fixed_policy is not None else "recorded"
    return ReplayResult(
        policy=label, slots=slots, per_token=per_token,
        events=(np.concatenate(kept) if kept else np.zeros(0, EVENT_DTYPE)) if keep_events
        else None,
        approximate_rows=int((~routing.exact).sum()), warnings=warnings,
        layer_prefetches=layer_pf, layer_prefetch_hits=layer_hits,
    )


def native_trace(routing: Routing, ranking: Ranking | None) -> tuple[CReplayTrace, list[Any]]:
    """``routing`` (with ``ranking``, its :meth:`Routing.substitute_ranking`) as the core's
    ``moecache_replay_trace``, and the buffers it points into, to keep alive while it is
    used. The routing's arrays are passed as they are where their type and layout already
    fit (the addresses a kept plan is tied to stay the same from one call to the next)."""
    h = routing.header
    m = h.model
    keep: list[Any] = []

    def addr(a: npt.NDArray[Any] | None, dtype: Any) -> int | None:
        if a is None:
            return None
        a = np.ascontiguousarray(a, dtype=dtype)
        keep.append(a)
        return int(a.ctypes.data)

    expert_bytes = np.zeros(m.n_layers, dtype=np.int64)
    expert_bytes[list(m.moe_layers)] = m.bytes_per_expert
    change_token, change_slots, change_policy = [], [], []
    for t, changes in enumerate(routing.changes):
        for c in changes:
            if c.kind == "policy" and c.policy is not None:
                change_token.append(t)
                change_slots.append(0)
                change_policy.append(policy_to_c(c.policy))
            elif c.kind == "slots" and c.slots:
                change_token.append(t)
                change_slots.append(int(c.slots))
                change_policy.append(policy_to_c(h.policy))
    policies = (CPolicy * max(len(change_policy), 1))(*change_policy)
    width = routing.predicted.shape[1] if routing.predicted is not None else 0
    ct = CReplayTrace(
        n_layers=m.n_layers, n_experts=m.n_expert, top_k=m.top_k, pred_width=width,
        initial_step=h.initial_step, start_slots=h.slots_per_layer,
        start_policy=policy_to_c(h.policy), expert_bytes=addr(expert_bytes, np.int64),
        n_rows=routing.n_rows, probs=addr(routing.probs, np.float32),
        ids=addr(routing.ids, np.int32), weights=addr(routing.weights, np.float32),
        next_layer=addr(routing.next_layer, np.int32) if width else None,
        predicted=addr(routing.predicted, np.int32) if width else None,
        n_calls=len(routing.call_start), call_step=addr(routing.call_step, np.int64),
        call_layer=addr(routing.call_layer, np.int32),
        call_start=addr(routing.call_start, np.int64),
        call_stop=addr(routing.call_stop, np.int64), n_tokens=routing.n_tokens,
        token_calls=addr(routing.token_calls, np.int64), n_changes=len(change_token),
        change_token=addr(np.array(change_token, dtype=np.int64), np.int64),
        change_slots=addr(np.array(change_slots, dtype=np.int32), np.int32),
        change_policy=ctypes.addressof(policies),
        ranks=addr(ranking[0], np.uint16) if ranking else None,
        rank_counts=addr(ranking[1], np.uint8) if ranking else None,
        selected_probs=addr(ranking[2], np.float32) if ranking else None)
    keep.append(policies)
    return ct, keep


def replay_many(routing: Routing | Trace,
                configs: Sequence[tuple[Policy | str | None, int | None]], *,
                threads: int = 0, keep_events: bool = False,
                progress: ProgressFn | None = None) -> list[ReplayResult]:
    """:func:`replay` for every ``(policy, slots)`` of ``configs`` in one native call
    (``moecache_replay_batch``): no Python per token, configurations in parallel on
    ``threads`` threads (0: one per core). The results equal :func:`replay`'s (the
    same core walks the same calls); ``keep_events`` also returns each one's rows.

    ``progress(done, total)`` (work units: one per configuration and layer) is called on
    this thread while the batch runs; returning False stops it within a layer of each
    running configuration and raises :class:`ReplayCancelled`."""
    from moescope.cache.batch import CReplayConfig, has_plan, plan_key, replay_batch

    if isinstance(routing, Trace):
        routing = Routing.from_trace(routing)
    h = routing.header
    _check_steps(routing)
    fixed = [Policy.preset(p) if isinstance(p, str) else p for p, _ in configs]
    substituting = any(p is None or p.miss_rule != MissRule.FETCH_ALL for p in fixed)
    # a batch the replay loop may take keeps a plan, which serves any later policies: it
    # packs the ranking too (a batch with event rows only replays through the per-call core)
    planning = not keep_events and has_plan()
    ranking = routing.substitute_ranking(threads) if (
        substituting or planning) and routing.n_rows else None
    ct, keep = native_trace(routing, ranking)
    cfgs = []
    for policy, (_, slots) in zip(fixed, configs, strict=True):
        cfg = CReplayConfig(follow_policy=1 if policy is None else 0,
                            slots=0 if slots is None else int(slots))
        if policy is not None:
            cfg.policy = policy_to_c(policy)
        cfgs.append(cfg)
    plan = routing.replay_plan(ct, threads) if planning else None
    if plan is None and routing.plan is not None and routing.plan.key == plan_key(ct):
        plan = routing.plan  # one already kept: it spares validating the rows again
    totals, rows = replay_batch(ct, cfgs, threads=threads, events=keep_events,
                                progress=progress, plan=plan)
    del keep  # the buffers ct points into, alive until here
    # the policy requested at each token (the trace's, changes included), for the flag
    requested: list[Policy] = []
    current = h.policy
    for changes in routing.changes:
        for c in changes:
            if c.kind == "policy" and c.policy is not None:
                current = c.policy
        requested.append(current)
    recorded_flag = np.array([bool(p.prefetch) for p in requested], dtype=np.bool_)
    base_warnings = _batch_warnings(routing)
    approximate = int((~routing.exact).sum())  # the trace's, the same for every result
    results = []
    for i, (policy, (_, slots)) in enumerate(zip(fixed, configs, strict=True)):
        per_token = np.zeros(routing.n_tokens, dtype=TOKEN_COST_DTYPE)
        for name in REPLAY_FIELDS:
            per_token[name] = totals[i][name]
        per_token["decode"] = routing.decode
        if routing.predicted is not None:
            per_token["prefetching"] = recorded_flag if policy is None else bool(
                policy.prefetch)
        warnings = list(base_warnings)
        if policy is None and _recorded_with_probability_bonus(routing):
            warnings.append(f"recorded by core {h.software.get('moecache')}, whose routing "
                            "bonus was in router-probability units; it is now in gate-weight "
                            "units, so the recorded cache-prior/psr decisions are not "
                            "reproduced exactly")
        start = policy if policy is not None else h.policy
        if routing.predicted is None and routing.decode.any() and (
                start.prefetch or (policy is None and any(
                p.prefetch for p in requested))):
            warnings.append("the trace has no PSR predictions (recorded before PSR or "
                            "without router inputs): the replay cannot prefetch")
        label = (policy.name or "custom") if policy is not None else "recorded"
        results.append(ReplayResult(
            policy=label, slots=slots, per_token=per_token,
            events=rows[i] if rows is not None else None,
            approximate_rows=approximate, warnings=warnings))
    return results


REPLAY_FIELDS = ("rows", "selections", "hits", "fetches", "substitutions", "admissions",
                 "substituted_mass", "bytes_sync", "bytes_async", "n_sync", "n_async",
                 "prefetches", "prefetch_hits")
"""The per-token fields the native batch replay fills (the rest are the trace's)."""


def _batch_warnings(routing: Routing) -> list[str]:
    """What :func:`replay` warns of that depends on the trace only."""
    h = routing.header
    warnings: list[str] = []
    if h.initial_resident:
        warnings.append(f"recording began with {h.initial_resident} experts resident; the "
                        "replay starts empty, so early decisions may differ")
    for changes in routing.changes:
        for change in changes:
            if change.kind == "note" and "dropped" in change.text:
                _warn_once(warnings, "dropped", f"the engine dropped event rows "
                                                f"({change.text}); the replay diverges")
    steps = np.concatenate([[h.initial_step], routing.call_step])
    jumps = np.flatnonzero(np.diff(steps) > 1)
    if len(jumps):
        i = int(jumps[0])
        _warn_once(warnings, "order", f"the trace jumps from step {int(steps[i])} to "
                                      f"{int(steps[i + 1])}: rows are missing or out of "
                                      "order, so later decisions may differ")
    return warnings


class _Router:
    """``router(layer, start, stop)`` decides rows ``start:stop`` in one ``moecache_route``
    call, passing addresses into the routing's arrays.

    Gate weights are in/out for the core (a substitute may take another weight), so it
    works on a private copy of the routing's weights. The instance holds every buffer whose
    address it passes, so none is freed while it routes.
    """

    def __init__(self, cache: ExpertCache, routing: Routing, max_rows: int) -> None:
        self._fn, self._prefetch_fn = cache.by_address()
        self._handle = cache.handle
        k = routing.ids.shape[1]
        self._routing = routing
        self._weights = routing.weights.copy()
        self._out_ids = np.empty(max_rows * k, dtype=np.int32)
        self._out_slots = np.empty(max_rows * k, dtype=np.int32)
        self._plan = np.empty(max(max_rows * k, 1), dtype=COPY_DTYPE)
        self._n_plan = np.zeros(1, dtype=np.int32)
        self._row_probs, self._row_k = routing.probs.strides[0], routing.ids.strides[0]
        self._pplan = np.empty(max(cache.n_experts, 1), dtype=COPY_DTYPE)
        self.prefetched_bytes = 0
        m = routing.header.model
        self._bytes = dict(zip(m.moe_layers, m.bytes_per_expert, strict=True))
        self._at = (routing.probs.ctypes.data, routing.ids.ctypes.data,
                    self._weights.ctypes.data, self._out_ids.ctypes.data,
                    self._out_slots.ctypes.data, self._plan.ctypes.data, len(self._plan),
                    self._n_plan.ctypes.data)

    def __call__(self, layer: int, start: int, stop: int) -> None:
        probs, ids, weights, out_ids, out_slots, plan, plan_cap, n_plan = self._at
        row_k = self._row_k
        code = self._fn(self._handle, layer, stop - start, probs + start * self._row_probs,
                        ids + start * row_k, weights + start * row_k, out_ids, out_slots, plan,
                        plan_cap, n_plan)
        if code != OK:
            raise NativeError(code, f"route(layer={layer}, rows {start}:{stop}) failed "
                                    f"(code {code})")


    def prefetch(self, start: int, stop: int) -> int:
        """PSR after the route call of rows ``start:stop`` (the caller checks that the policy
        prefetches): the recorded prediction of its last row (the engine's route op
        prefetches once per call, for one decode token).
        Returns the number of copies; their bytes accumulate in ``prefetched_bytes``."""
        r = self._routing
        if r.next_layer is None or r.predicted is None or stop <= start:
            return 0
        nxt = int(r.next_layer[stop - 1])
        if nxt < 0:
            return 0
        self._scores = r.scores(stop - 1)
        code = self._prefetch_fn(self._handle, nxt, 1, self._scores.ctypes.data,
                                 self._pplan.ctypes.data, len(self._pplan),
                                 self._n_plan.ctypes.data)
        if code != OK:
            raise NativeError(code, f"prefetch(layer={nxt}) failed (code {code})")
        n = int(self._n_plan[0])
        if n:
            self.prefetched_bytes += n * self._bytes.get(nxt, 0)
        return n


def _check_steps(routing: Routing) -> None:
    """The steps a replay will walk are within what ``read_trace`` allows (a trace built in
    memory skipped it): no step before the initial one, none past the trace's reach."""
    h = routing.header
    steps = routing.call_step  # every row's, as the rows of a call share their step
    reach = h.initial_step + MAX_STEP_SLACK + routing.n_rows + routing.n_tokens
    if not 0 <= h.initial_step <= MAX_STEP_SLACK or (len(steps) and (
            int(steps.min()) < h.initial_step or int(steps.max()) > reach)):
        raise TraceFormatError("the trace's steps run outside what its records can reach: "
                               "not a trace a replay can walk")


def _recorded_with_probability_bonus(routing: Routing) -> bool:
    """True if a routing-bonus policy of the trace ran on a core before 0.2, whose bonus
    was added to raw router probabilities (0.2 scales it by the selection's probability)."""
    h = routing.header
    version = str(h.software.get("moecache") or "")
    try:
        older = tuple(int(x) for x in version.split(".")[:2]) < (0, 2)
    except ValueError:
        return False
    policies = [h.policy] + [c.policy for changes in routing.changes for c in changes
                             if c.kind == "policy" and c.policy is not None]
    return older and any(p.miss_rule == MissRule.ROUTING_BONUS for p in policies)


def _warn_once(warnings: list[str], key: str, text: str) -> None:
    if not any(w.startswith(f"[{key}]") for w in warnings):
        warnings.append(f"[{key}] {text}")


def _summarize(out: Any, rows: npt.NDArray[Any], decode: bool) -> None:
    """Sums of one token's replayed rows; every fetch is one synchronous copy and every
    admission one background copy (a batch never fetches one expert twice)."""
    out["decode"] = decode
    out["rows"] = len(rows)
    out["selections"] = int(rows["k"].sum())
    out["hits"] = int(rows["n_hit"].sum())
    out["fetches"] = int(rows["n_fetch"].sum())
    out["substitutions"] = int(rows["n_substitute"].sum())
    out["admissions"] = int(rows["n_admit"].sum())
    out["substituted_mass"] = float(rows["substituted_mass"].astype(np.float64).sum())
    out["bytes_sync"] = int(rows["bytes_sync"].sum())
    out["bytes_async"] = int(rows["bytes_async"].sum())
    out["n_sync"] = out["fetches"]
    out["n_async"] = out["admissions"]
    if "n_disk" in (rows.dtype.names or ()):
        out["n_disk"] = int(rows["n_disk"].sum())
        out["bytes_disk"] = int(rows["bytes_disk"].sum())


DECISION_FIELDS: Sequence[str] = (
    "step", "layer", "token", "k", "ids", "action", "used_ids", "slots", "substituted_mass",
    "n_hit", "n_fetch", "n_substitute", "n_admit", "n_evict", "admitted", "evicted",
    "bytes_sync", "bytes_async",
)
"""Event-row fields that make up a decision (``weights`` is compared separately)."""


def decision_mismatches(recorded: npt.NDArray[Any], replayed: npt.NDArray[Any],
                        limit: int = 5) -> list[str]:
    """Where two event-row sequences decide differently (empty list: identical decisions).

    Only the meaningful prefix of each fixed-size array is compared (``k`` entries,
    ``n_admit``/``n_evict`` admitted and evicted ids), as the trace stores.
    """
    problems: list[str] = []
    if len(recorded) != len(replayed):
        problems.append(f"{len(recorded)} recorded rows, {len(replayed)} replayed")
    for i, (a, b) in enumerate(zip(recorded, replayed, strict=False)):
        k = int(a["k"])
        for name in DECISION_FIELDS:
            x, y = a[name], b[name]
            if name in ("ids", "action", "used_ids", "slots"):
                x, y = x[:k], y[:k]
            elif name in ("admitted", "evicted"):
                n = min(int(a["n_admit" if name == "admitted" else "n_evict"]), len(x))
                x, y = x[:n], y[:n]
            if not np.array_equal(x, y):
                problems.append(f"row {i} (step {int(a['step'])}, layer {int(a['layer'])}): "
                                f"{name} {np.asarray(x).tolist()} != {np.asarray(y).tolist()}")
                break
        if len(problems) >= limit:
            break
    return problems
