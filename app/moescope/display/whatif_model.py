"""The what-if view's data: a policy x budget sweep of a recorded session, and its cells.

Paper 1's question for a chat the user already had: at another budget or under another
policy, how much faster would each token have been, and how much gate mass would have been
substituted for it? The answer is :func:`moescope.sim.sweep` on the trace, so the view shows
exactly the numbers ``moescope replay`` prints. The whole grid and the recorded point are one
native batch (one plan of the trace for all of them, the threads kept busy to the end); the
batch reports its progress a layer at a time and stops within a layer when asked to.

Nothing here imports Qt: the worker calls :func:`compute` on its thread and hands back the
plain :class:`WhatIfResult`; tests compare it with the simulator directly.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from moescope.cache.audit import AuditEstimate, estimate
from moescope.cache.budget import format_bytes
from moescope.cache.policy import PRESET_NAMES, PRESETS
from moescope.sim import (
    COST_MODEL_NAMES,
    ReplayCancelled,
    Routing,
    SweepRow,
    cost_model,
    nothing_to_replay,
    sweep,
)
from moescope.sim.sweep import RECORDED
from moescope.trace import Trace
from moescope.util.errors import MoEScopeError

POLICIES: tuple[str, ...] = ("exact", "quality-first", "speed-first", "cache-prior", "psr",
                             "substitute-all")
"""Swept by default: the reference, paper 1's two presets, paper 2's two, and the fastest
(and least exact) rule. Any preset can be added in the view (:func:`preset_choices`)."""
REFERENCE = "exact"
"""Always swept: every "speed vs exact" is measured against it."""
BUDGETS: tuple[str, ...] = ("12.5%", "25%", "50%", "100%")
"""Fractions of the experts resident; 25% is the paper's operating point."""

ProgressFn = Callable[[int, int], bool]
"""``progress(done, total)`` in work units (one per replayed configuration and trace layer);
returning False asks the sweep to stop (it is cancelled)."""

Cancelled = ReplayCancelled
"""The sweep was asked to stop (a newer request or a closed window): the batch's own
exception, raised within a layer of each running configuration."""


@dataclass(frozen=True)
class WhatIfResult:
    """One finished sweep, as plain data the worker's signal carries to the view."""

    cost_name: str
    cost_text: str
    """The cost model's parameters, one line (what the estimates assume)."""
    policies: tuple[str, ...]
    budgets: tuple[str, ...]
    rows: list[SweepRow]
    """``sweep(trace, policies, budgets, cost).rows``: budget-major, policy-minor."""
    recorded: SweepRow | None
    """The session as recorded (its own policy and budget, changes included)."""
    recorded_ms_per_token: float | None
    """Measured wall time per decode token while recording, for comparison."""
    warnings: list[str] = field(default_factory=list)
    recorded_audit: AuditEstimate | None = None
    """The recorded session's audited quality cost (None: recorded without audits); a
    replay under another policy has no exact pass, so only the recorded point has one."""
    trace_tokens: int = 0
    """Every token of the trace; the rows average its decode tokens (``SweepRow.tokens``),
    as ``moescope replay`` says under its table."""
    compute_ms: float | None = None
    """The cost model's compute per token, under which it hides background copies."""
    background_exposed: float = 0.0
    """The cost model's share of background copying on the critical path (``calibrated``
    fits it to the waits the trace recorded; 0: hidden under compute)."""

    def series(self) -> dict[str, list[SweepRow]]:
        """Rows per policy in budget order: one connected curve each."""
        out: dict[str, list[SweepRow]] = {p: [] for p in self.policies}
        for row in self.rows:
            out.setdefault(row.policy, []).append(row)
        return out

    def points(self) -> list[SweepRow]:
        """Every plotted point, the recorded one last."""
        return [*self.rows, *([self.recorded] if self.recorded is not None else [])]


def cost_model_choices(trace: Trace) -> dict[str, str | None]:
    """Every cost model by name, with why it cannot be used here (None: usable).

    ``calibrated`` needs engine timings; a trace written without them (or one that never
    copied an expert) cannot be fitted, and the user should see why rather than an error.
    """
    choices: dict[str, str | None] = {}
    for name in COST_MODEL_NAMES:
        try:
            cost_model(name, trace)
            choices[name] = None
        except MoEScopeError as err:
            choices[name] = str(err)
    return choices


def has_predictions(trace: Trace) -> bool:
    """Whether the trace kept PSR's predictions (traces since PSR do, from any policy)."""
    c = trace.columns
    if c is not None:  # version 2: one look at the column, not a record per row
        return c.next_layer is not None and bool((c.next_layer >= 0).any())
    return any(route.predicted is not None for token in trace.tokens
               for route in token.routes.values())


def preset_choices(trace: Trace) -> dict[str, str | None]:
    """Every preset by name, with why it cannot be replayed from this trace (None: it can).

    A prefetching preset needs the recorded predictions; without them the replay would
    silently be its non-prefetching twin, so it is offered disabled, with the reason.
    """
    predicted = has_predictions(trace)
    return {name: (None if predicted or PRESETS[name].prefetch == 0 else
                   "this trace has no PSR predictions (recorded before PSR, or without "
                   "router inputs), so prefetch cannot be replayed")
            for name in PRESET_NAMES}


def default_policies(trace: Trace) -> tuple[str, ...]:
    """:data:`POLICIES` less what this trace cannot replay."""
    choices = preset_choices(trace)
    return tuple(p for p in POLICIES if choices.get(p) is None)


def nothing_to_compare(trace: Trace) -> str | None:
    """What the view says instead of a grid when ``trace`` has no decoded token (None when
    it has one): every row averages decode tokens, so each policy and budget would show
    zeros, and PSR would be offered as having "no predictions" when there was simply no
    token to predict for. The words of ``moescope replay``'s line."""
    why = nothing_to_replay(trace)
    if why is None:
        return None
    return (f"Nothing to compare: {why}. Every policy and budget is replayed over decode "
            "tokens, so there is nothing to replay; the Plots tab and Export… show what "
            "the trace holds.")


def compute(trace: Trace, cost_name: str, policies: Sequence[str] = POLICIES,
            budgets: Sequence[str] = BUDGETS, progress: ProgressFn | None = None,
            routing: Routing | None = None) -> WhatIfResult:
    """Sweep ``trace`` under ``policies`` x ``budgets`` plus the recorded point.

    ``routing``: the trace's layout from an earlier sweep (``Routing.from_trace(trace)``),
    so that a window's later sweeps (another cost model or policy) skip laying it out and
    ranking its rows again. Raises :class:`Cancelled` when ``progress`` returns False, and
    ``MoEScopeError`` for a cost model or budget the trace cannot use.
    """
    cost = cost_model(cost_name, trace)
    # with "exact" beside it, the recorded row gets its speed vs exact at the recorded budget
    extra = ((RECORDED, RECORDED), ("exact", RECORDED))
    grid = len(policies) * len(budgets)
    total = (grid + len(extra)) * trace.header.model.n_layers
    shown = -1

    def report(done: int, _total: int) -> bool:
        nonlocal shown
        if progress is None or done == shown:
            return True
        shown = done
        return progress(done, total)

    if not report(0, total):
        raise Cancelled("the what-if sweep was cancelled")
    if routing is None:
        routing = Routing.from_trace(trace)
    result = sweep(trace, policies, budgets, cost, routing=routing, extra=extra,
                   progress=report)
    recorded = next((r for r in result.rows[grid:] if r.policy == RECORDED), None)
    if recorded is not None:
        recorded = with_recorded_budget(recorded, trace)
    return WhatIfResult(
        cost_name=cost_name, cost_text=cost.describe(trace.header.model),
        policies=tuple(policies), budgets=tuple(b.strip() for b in budgets),
        rows=result.rows[:grid], recorded=recorded,
        recorded_ms_per_token=result.recorded_ms_per_token, warnings=result.warnings,
        recorded_audit=estimate([t.audit for t in trace.tokens]),
        trace_tokens=result.trace_tokens,
        compute_ms=cost.compute_for(trace.header.model) * 1e3,
        background_exposed=cost.background_exposed)


def status_text(result: WhatIfResult) -> str:
    """The line under a finished sweep, saying which numbers are modelled for which
    hardware and which were measured.

    A pcie4 estimate of 0.1 ms/token beside 3.4 ms/token measured on a CPU read as a 30x
    contradiction while nothing said that they are two different machines.
    """
    if result.cost_name == "calibrated":
        where = "the machine that recorded the trace (fitted to its timings)"
    else:
        where = f"the {result.cost_name} cost model's hardware, not this machine"
    text = f"Est. ms/token is modelled for {where} — {result.cost_text}."
    decode = next((r.tokens for r in result.points()), None)
    if decode is not None and result.trace_tokens:
        text += (f" Every row averages the trace's {decode} decode tokens (of "
                 f"{result.trace_tokens}).")
    if result.recorded_ms_per_token is not None:
        text += (" Measured on the machine that recorded the trace: "
                 f"{result.recorded_ms_per_token:.3f} ms/token.")
    if result.recorded_audit is not None:
        text += f" Audited while recording: {result.recorded_audit.describe()}."
    note = prefetch_note(result)
    if note:
        text += f" {note}"
    return text + "".join(f" Warning: {w}" for w in result.warnings)


def prefetch_note(result: WhatIfResult) -> str:
    """What the cost model assumes about PSR's prefetches, when a row prefetched ("" when
    none did): the Compare dialog, which times real answers on this machine, can rank PSR
    below Exact where this view ranks it above, and nothing said why."""
    if not any(r.prefetches_per_token is not None for r in result.points()):
        return ""
    compute = (f"its {result.compute_ms:.3f} ms of compute per token"
               if result.compute_ms is not None else "its compute")
    exposed = result.background_exposed
    if exposed > 0:  # calibrated to a trace whose decode waited for its background copies
        rest = f", the rest hidden under {compute}" if exposed < 1 else ""
        return (f"PSR's prefetches are priced as background copies with {exposed:.2f}x "
                f"their copy time on the critical path{rest}, fitted to the time the decode "
                "waited for background copies while the trace was recorded. Compare "
                "policies (main window) times real answers on this machine, where those "
                "copies also take the decode's CPU time (always on a CPU-only build) and "
                "PSR's predictions add to its routing time, which the model does not price "
                "per policy, so PSR can rank lower there.")
    return (f"PSR's prefetches are priced as background copies on a copy stream of their "
            f"own: the {result.cost_name} model hides them under {compute}, charges only "
            "what is longer, and models no wait for them. Compare policies (main window) "
            "times real answers on this machine, where those copies can take the decode's "
            "CPU time (always on a CPU-only build) and the decode waits for any still in "
            "flight, so PSR can rank lower there.")


def status_tooltip(result: WhatIfResult) -> str:
    """The status line's tooltip: why the modelled and measured times differ."""
    if result.cost_name == "calibrated":
        return ("Estimates: the simulator's replay of each policy and budget, timed with a "
                "cost model fitted to the copy, wait and compute times measured while this "
                "trace was recorded. Measured: real wall time per decode token while "
                "recording.")
    return (f"Estimates: the simulator's replay of each policy and budget, timed for the "
            f"{result.cost_name} cost model's modelled GPU and link, not for this machine. "
            "Measured: real wall time per decode token on the machine that recorded the "
            "trace (often CPU only), so it can be many times the estimates. Pick "
            "'calibrated' for estimates fitted to that machine.")


COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "Policy"), ("budget", "Budget"), ("slots", "Slots"), ("hit_rate", "Hit rate"),
    ("substituted_pct", "% substituted"), ("mass_per_token", "Mass/token"),
    ("est_ms_per_token", "Est. ms/token"), ("speedup_vs_exact", "Speed vs exact"),
    ("prefetch_accuracy", "Prefetch accuracy"),
)
"""Table columns: (SweepRow field, header). Prefetch accuracy is "–" for a policy that
does not prefetch (PSR's number, as the cache panel shows it live)."""


def column_tips(n_layers: int) -> dict[str, str]:
    """What each column's number is, for its header's tooltip: a new user met "5.565" under
    "Mass/token" with nothing to say that it sums ``n_layers`` layers, nor why a policy
    still misses at a 100% budget (every replay starts from an empty cache)."""
    return {
        "policy": "The policy replayed; 'recorded' is the session as it ran (its own "
                  "policy and budget, changes included)",
        "budget": "Share of each layer's experts the cache holds. Every replay starts "
                  "from an empty cache, as the recording did, so even at 100% an expert "
                  "misses the first time it is routed to",
        "slots": "Expert slots per layer at this budget ('recorded': as the session had "
                 "them, changes included)",
        "hit_rate": "Routed experts found in the cache, of all experts routed to",
        "substituted_pct": "Routed experts replaced by a resident one instead of fetched, "
                           "of all experts routed to",
        "mass_per_token": f"Router weight given to substituted experts per decode token, "
                          f"summed over the {n_layers} MoE layers (each layer's top-k "
                          f"weights sum to 1): 0 is exact, {n_layers} would be every "
                          f"expert substituted",
        "est_ms_per_token": "Predicted time per decode token under the cost model picked "
                            "above (its hardware, not this machine, unless 'calibrated')",
        "speedup_vs_exact": "Exact's predicted time at the same budget divided by this "
                            "row's: above 1× is faster than fetching every miss",
        "prefetch_accuracy": "PSR: prefetched experts the router then used, of those "
                             "prefetched (– for a policy that does not prefetch)",
    }


def with_recorded_budget(row: SweepRow, trace: Trace) -> SweepRow:
    """The recorded point with the budget and slots the session ran at, where they never
    changed (the table said "recorded" under both, which a user had to look up in the
    Plots tab); a session resized on the way keeps "recorded"."""
    h = trace.header
    if any(t.slots_per_layer != h.slots_per_layer for t in trace.tokens):
        return row
    return replace(row, budget=h.budget, slots=h.slots_per_layer)


def cell_text(row: SweepRow, key: str) -> str:
    """One table cell, formatted like ``moescope replay``'s table."""
    value = getattr(row, key)
    if value is None:
        return "recorded" if key == "slots" else "–"
    if key in ("hit_rate", "prefetch_accuracy"):
        return f"{value:.1%}"
    if key == "substituted_pct":
        return f"{value:.1f}%"
    if key == "mass_per_token":
        return f"{value:.3f}"
    if key == "est_ms_per_token":
        return f"{value:.3f}"
    if key == "speedup_vs_exact":
        return f"{value:.2f}×"
    return str(value)


def label(row: SweepRow) -> str:
    """``speed-first @ 25%``; the recorded session says so."""
    if row.policy == RECORDED:
        return "recorded session"
    return f"{row.policy} @ {row.budget}"


def tooltip(row: SweepRow, audit: AuditEstimate | None = None) -> str:
    """What hovering a point says: its place in the sweep and every number behind it
    (``audit``: the recorded session's audited cost, said beside its mass)."""
    slots = "as recorded" if row.slots is None else str(row.slots)
    lines = [
        label(row),
        f"slots per layer: {slots}",
        f"est. time/token: {row.est_ms_per_token:.3f} ms",
        f"substituted mass/token: {row.mass_per_token:.3f}",
        *([f"audited: {audit.describe()}"] if audit is not None else []),
        f"hit rate: {row.hit_rate:.1%}, substituted: {row.substituted_pct:.1f}%",
        f"fetched/token: {format_bytes(round(row.fetched_bytes_per_token))}",
    ]
    if row.speedup_vs_exact is not None:
        lines.append(f"speed vs exact at this budget: {row.speedup_vs_exact:.2f}×")
    if row.prefetches_per_token is not None:
        acc = row.prefetch_accuracy
        lines.append(f"prefetch accuracy: {acc:.1%}" if acc is not None
                     else "prefetch accuracy: – (nothing prefetched)")
        lines.append(f"prefetched/token: {row.prefetches_per_token:.1f} experts")
    return "\n".join(lines)
