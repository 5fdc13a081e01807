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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache.native import (
    COPY_DTYPE,
    EVENT_DTYPE,
    OK,
    ExpertCache,
    NativeError,
)
from moescope.cache.policy import MissRule, Policy
from moescope.cache.prefetch import PrefetchMeter, PrefetchSummary
from moescope.trace import MAX_STEP_SLACK, Change, Trace, TraceFormatError, TraceHeader

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
])
"""What the cache did for one trace token, summed over its rows and copy plans.
``prefetching``: the policy in force prefetches (and the trace has the predictions to);
``prefetches`` / ``prefetch_hits``: the core's PSR counters for the token, all layers."""


@dataclass(frozen=True)
class RouteCall:
    """One ``moecache_route`` call: rows ``start:stop`` of one layer at one step."""

    step: int
    layer: int
    start: int
    stop: int


@dataclass(frozen=True)
class TokenRouting:
    """A trace token's changes and route calls, in the order the engine made them."""

    changes: tuple[Change, ...]
    calls: tuple[RouteCall, ...]
    decode: bool


@dataclass
class Routing:
    """A trace's routing laid out in flat arrays, prepared once for any number of replays.

    Row ``r`` (in trace order) has the router's ``ids[r]``, raw gate ``weights[r]`` and full
    ``probs[r]``; ``exact[r]`` is False where they were rebuilt from the event row.
    """

    header: TraceHeader
    tokens: list[TokenRouting]
    ids: npt.NDArray[np.int32]
    weights: npt.NDArray[np.float32]
    probs: npt.NDArray[np.float32]
    exact: npt.NDArray[np.bool_]
    recorded: npt.NDArray[Any]
    """The engine's event rows, for comparisons."""
    next_layer: npt.NDArray[np.int32] | None = None
    """PSR: per row, the layer its recorded prediction is for (-1: none); None: no row has
    one (a trace from before PSR, or recorded without router inputs)."""
    predicted: npt.NDArray[np.float32] | None = None
    """PSR: per row, scores that rank the recorded predictions (``PREDICTED_KEEP`` ranks;
    -inf for the rest), so ``moecache_prefetch`` picks what the engine picked."""

    @property
    def n_rows(self) -> int:
        return len(self.recorded)

    @classmethod
    def from_trace(cls, trace: Trace) -> Routing:
        """Lay out ``trace``'s rows and group them into route calls."""
        m = trace.header.model
        events = trace.events()
        n = len(events)
        k = m.top_k
        ids = np.zeros((n, k), dtype=np.int32)
        weights = np.zeros((n, k), dtype=np.float32)
        probs = np.zeros((n, m.n_expert), dtype=np.float32)
        exact = np.zeros(n, dtype=np.bool_)
        has_pred = any(rt.predicted is not None for tok in trace.tokens
                       for rt in tok.routes.values())
        next_layer = np.full(n, -1, dtype=np.int32) if has_pred else None
        predicted = (np.full((n, m.n_expert), -np.inf, dtype=np.float32) if has_pred
                     else None)
        tokens: list[TokenRouting] = []
        r = 0
        for tok in trace.tokens:
            calls: list[RouteCall] = []
            start = r
            prev: tuple[int, int, int] | None = None
            for i, row in enumerate(tok.events):
                step, layer, t = int(row["step"]), int(row["layer"]), int(row["token"])
                if prev is None or (step, layer) != prev[:2] or t <= prev[2]:
                    if prev is not None:
                        calls.append(RouteCall(prev[0], prev[1], start, r))
                    start = r
                prev = (step, layer, t)
                route = tok.routes.get(i)
                if route is not None:
                    ids[r] = route.ids
                    weights[r] = route.weights
                    probs[r] = route.probs
                    exact[r] = True
                    if route.predicted is not None and next_layer is not None \
                            and predicted is not None:
                        next_layer[r] = route.next_layer
                        ranks = route.predicted.size
                        predicted[r, route.predicted] = np.arange(ranks, 0, -1)
                else:
                    ids[r] = row["ids"][:k]
                    weights[r] = row["weights"][:k]
                    probs[r, row["ids"][:k]] = row["weights"][:k]
                r += 1
            if prev is not None:
                calls.append(RouteCall(prev[0], prev[1], start, r))
            tokens.append(TokenRouting(tuple(tok.changes), tuple(calls), tok.phase == "decode"))
        return cls(header=trace.header, tokens=tokens, ids=ids, weights=weights, probs=probs,
                   exact=exact, recorded=events, next_layer=next_layer, predicted=predicted)


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

    @property
    def decode(self) -> npt.NDArray[Any]:
        return self.per_token[self.per_token["decode"]]

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
           slots: int | None = None, *, keep_events: bool = False) -> ReplayResult:
    """Replay ``routing`` under ``policy`` with ``slots`` per layer.

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
    per_token = np.zeros(len(routing.tokens), dtype=TOKEN_COST_DTYPE)
    kept: list[npt.NDArray[Any]] = []
    rows_per_token = max((sum(c.stop - c.start for c in t.calls) for t in routing.tokens),
                         default=1)
    with ExpertCache(m.n_layers, m.n_expert, m.top_k, start_slots, start_policy) as cache:
        for layer, n_bytes in zip(m.moe_layers, m.bytes_per_expert, strict=True):
            cache.set_expert_bytes(layer, n_bytes)
        cache.set_event_capacity(max(1024, 2 * rows_per_token))
        cache.begin_steps(h.initial_step - cache.step)
        route = _Router(cache, routing, max(rows_per_token, 1))
        prefetched = 0
        meter = PrefetchMeter(cache, m.moe_layers)
        counting = False  # the counters stay 0 until the first prefetch: no need to read
        layer_pf = (np.zeros((len(routing.tokens), len(m.moe_layers)), dtype=np.int64)
                    if keep_events else None)
        layer_hits = layer_pf.copy() if layer_pf is not None else None
        requested = before = start_policy  # the latest policy set, and the one before
        if routing.predicted is None and (start_policy.prefetch or any(
                c.kind == "policy" and c.policy and c.policy.prefetch
                for tok in routing.tokens for c in tok.changes)):
            warnings.append("the trace has no PSR predictions (recorded before PSR or "
                            "without router inputs): the replay cannot prefetch")
        step = cache.step
        for t, tok in enumerate(routing.tokens):
            for change in tok.changes:
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
            for call in tok.calls:
                if step > call.step or call.step > step + 1:
                    _warn_once(warnings, "order",
                               f"the trace jumps from step {step} to {call.step}: rows are "
                               "missing or out of order, so later decisions may differ")
                if step < call.step:
                    cache.begin_steps(call.step - step)
                    step = call.step
                route(call.layer, call.start, call.stop)
                if prefetching:
                    counting = True
                    prefetched += route.prefetch(call.start, call.stop)
            rows = cache.drain_events()
            _summarize(per_token[t], rows, tok.decode)
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
        code = self._prefetch_fn(self._handle, nxt, 1,
                                 r.predicted.ctypes.data + (stop - 1) * r.predicted.strides[0],
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
    steps = routing.recorded["step"]
    reach = h.initial_step + MAX_STEP_SLACK + routing.n_rows + len(routing.tokens)
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
    policies = [h.policy] + [c.policy for tok in routing.tokens for c in tok.changes
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
