"""Policy x budget sweeps over one trace, and the table, CSV and JSON they print as.

``moescope replay`` answers "what would policy P at budget B have done to this chat?" for
several P and B at once. The trace's routing is laid out once (:class:`Routing`) and
replayed per combination; each replay is reduced to the paper's numbers plus a cost-model
estimate of time per token.
"""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from moescope.cache.batch import ProgressFn, ReplayCancelled
from moescope.cache.budget import format_bytes, plan_slots
from moescope.cache.policy import PRESET_NAMES, Policy, parse_preset
from moescope.sim.cost import CostModel
from moescope.sim.replay import ReplayResult, Routing, replay, replay_many
from moescope.trace import Trace, TraceModel
from moescope.util.errors import MoEScopeError

RECORDED = "recorded"
"""A policy or budget spec meaning "as the trace recorded it, changes included"."""


def parse_policy(spec: str, *, recorded: bool = True) -> Policy | None:
    """``recorded`` (None), or a policy in the grammar of
    :func:`moescope.cache.policy.parse_preset` (a preset name, or
    ``preset:key=value[:key=value]``). ``recorded=False`` (eval, which scores presets):
    an unknown name's message does not offer ``recorded``."""
    spec = spec.strip()
    if spec == RECORDED:
        return None
    name = spec.split(":", 1)[0]
    if name not in PRESET_NAMES:
        known = ([RECORDED] if recorded else []) + list(PRESET_NAMES)
        raise MoEScopeError(f"unknown policy {name!r} (known: {', '.join(known)})")
    return parse_preset(spec)


def nothing_to_replay(trace: Trace) -> str | None:
    """Why a sweep of ``trace`` has nothing to replay, said after "nothing to replay: ";
    None when it holds a decoded token. A sweep's rows average decode tokens, so a trace of
    prefills only (a session stopped after its prompt) would give a table of zeros; its
    tokens still export (``--perfetto``, ``--tokens-csv``, the window's *Export…*)."""
    if not trace.tokens:
        return "the trace holds no token"
    if any(t.phase == "decode" for t in trace.tokens):
        return None
    prompts = "its prompt" if len(trace.tokens) == 1 else f"its {len(trace.tokens)} prompts"
    return f"no token was decoded (the trace holds only the prefill of {prompts})"


def split_list(values: Sequence[str] | str) -> list[str]:
    """``["a,b", "c"]`` -> ``["a", "b", "c"]`` (options may repeat or hold lists)."""
    items = [values] if isinstance(values, str) else list(values)
    return [v.strip() for item in items for v in item.split(",") if v.strip()]


@dataclass(frozen=True)
class SweepRow:
    """One policy x budget of a sweep (per-token numbers average decode tokens)."""

    policy: str
    budget: str
    slots: int | None
    tokens: int
    hit_rate: float
    fetches_per_token: float
    fetched_bytes_per_token: float
    substituted_pct: float
    mass_per_token: float
    admissions_per_token: float
    est_ms_per_token: float
    speedup_vs_exact: float | None
    approximate_rows: int
    prefetches_per_token: float | None = None
    """PSR: experts prefetched per decode token under a prefetching policy; None when no
    token's policy prefetched (not 0: "does not prefetch" is not "prefetched nothing")."""
    prefetch_accuracy: float | None = None
    """PSR: prefetch hits / prefetches (capped at 1), the live panel's definition; None
    when the policy does not prefetch or nothing was prefetched."""
    disk_bytes_per_token: float | None = None
    """Replayed under a RAM tier (``sweep``'s ``ram_slots``): bytes read from the model file
    per decode token; None without one."""


@dataclass(frozen=True)
class Sweep:
    """A sweep's rows and what they were computed with."""

    rows: list[SweepRow]
    cost_model: CostModel
    trace_tokens: int
    recorded_ms_per_token: float | None
    """Mean measured wall time of the trace's decode tokens, for comparison."""
    warnings: list[str]


def sweep(trace: Trace, policies: Sequence[str], budgets: Sequence[str],
          cost: CostModel, *, routing: Routing | None = None, threads: int = 0,
          ram_slots: int = 0, extra: Sequence[tuple[str, str]] = (),
          progress: ProgressFn | None = None) -> Sweep:
    """Replay ``trace`` under every policy x budget spec and summarize each: one native
    batch call for the whole grid (:func:`~moescope.sim.replay.replay_many`), on
    ``threads`` threads (0: one per core). ``routing`` reuses a layout already made.
    ``ram_slots`` > 0 replays each under a logical RAM tier of that many experts per layer
    (one replay at a time), so the cost model prices the reads from disk.

    ``extra`` (policy, budget) pairs are replayed in the same batch, their rows after the
    grid's (a window's recorded point beside its grid: one plan of the trace, not two).
    ``progress(done, total)`` is called as the replays advance (work units, one per
    configuration and layer); returning False stops them and raises
    :class:`~moescope.cache.batch.ReplayCancelled`."""
    if routing is None:
        routing = Routing.from_trace(trace)
    m = trace.header.model
    parsed = [(spec, parse_policy(spec)) for spec in policies]
    rows: list[SweepRow] = []
    warnings: list[str] = []
    exact_ms: dict[str, float] = {}
    pending: list[tuple[str, Policy | None, str, int | None, Any]] = []
    grid: list[tuple[str, Policy | None, str, int | None]] = []
    for budget in budgets:
        slots = _slots(budget, m)
        grid.extend((spec, policy, budget, slots) for spec, policy in parsed)
    grid.extend((spec, parse_policy(spec), budget, _slots(budget, m)) for spec, budget in extra)
    if ram_slots:
        results = _one_at_a_time(routing, grid, ram_slots, m.n_layers, progress)
    else:
        results = replay_many(routing, [(policy, slots) for _, policy, _, slots in grid],
                              threads=threads, progress=progress)
    for (spec, policy, budget, slots), result in zip(grid, results, strict=True):
        for w in result.warnings:
            if w not in warnings:
                warnings.append(w)
        seconds = cost.token_seconds(result.decode, m)
        ms = float(seconds.mean() * 1e3) if len(seconds) else 0.0
        if policy is not None and policy.exact:
            exact_ms.setdefault(budget, ms)
        pending.append((spec, policy, budget, slots, (result, ms)))
    for spec, _policy, budget, slots, (result, ms) in pending:
        base = exact_ms.get(budget)
        prefetch = result.prefetch
        rows.append(SweepRow(
            policy=spec, budget=budget.strip(), slots=slots, tokens=result.n_tokens,
            hit_rate=result.hit_rate, fetches_per_token=result.fetches_per_token,
            fetched_bytes_per_token=result.fetched_bytes_per_token,
            substituted_pct=100.0 * result.substituted_fraction,
            mass_per_token=result.mass_per_token,
            admissions_per_token=result.admissions_per_token, est_ms_per_token=ms,
            speedup_vs_exact=(base / ms) if base and ms > 0 else None,
            approximate_rows=result.approximate_rows,
            prefetches_per_token=prefetch.per_token if prefetch is not None else None,
            prefetch_accuracy=prefetch.accuracy if prefetch is not None else None,
            disk_bytes_per_token=(float(result.decode["bytes_disk"].mean())
                                  if ram_slots and len(result.decode) else None),
        ))
    decode = [t.seconds for t in trace.tokens if t.phase == "decode"]
    return Sweep(rows=rows, cost_model=cost, trace_tokens=len(trace.tokens),
                 recorded_ms_per_token=float(np.mean(decode) * 1e3) if decode else None,
                 warnings=warnings)


def _slots(budget: str, m: TraceModel) -> int | None:
    """Slots per layer for a budget spec; None for ``recorded`` (the trace's, resizes
    included)."""
    if budget.strip() == RECORDED:
        return None
    return plan_slots(budget, n_expert=m.n_expert, top_k=m.top_k,
                      bytes_per_expert=m.bytes_per_expert).slots_per_layer


def _one_at_a_time(routing: Routing, grid: Sequence[tuple[str, Policy | None, str, int | None]],
                   ram_slots: int, n_layers: int, progress: ProgressFn | None
                   ) -> list[ReplayResult]:
    """The grid replayed one configuration at a time under a RAM tier (the batch has none),
    with the batch's progress units."""
    total = len(grid) * n_layers
    results = []
    for i, (_, policy, _, slots) in enumerate(grid):
        if progress is not None and not progress(i * n_layers, total):
            raise ReplayCancelled("the replay was cancelled")
        results.append(replay(routing, policy, slots, ram_slots=ram_slots))
    if progress is not None and not progress(total, total):
        raise ReplayCancelled("the replay was cancelled")
    return results


_COLUMNS: tuple[tuple[str, str], ...] = (
    ("policy", "policy"), ("budget", "budget"), ("slots", "slots"), ("hit", "hit_rate"),
    ("fetch/tok", "fetches_per_token"), ("fetched/tok", "fetched_bytes_per_token"),
    ("subst %", "substituted_pct"), ("mass/tok", "mass_per_token"),
    ("admit/tok", "admissions_per_token"), ("est ms/tok", "est_ms_per_token"),
    ("vs exact", "speedup_vs_exact"), ("prefetch acc", "prefetch_accuracy"),
)


def _cell(name: str, value: Any) -> str:
    if value is None:
        return "recorded" if name == "slots" else "-"
    if name in ("hit_rate", "prefetch_accuracy"):
        return f"{value:.1%}"
    if name in ("fetched_bytes_per_token", "disk_bytes_per_token"):
        return format_bytes(round(value))
    if name == "speedup_vs_exact":
        return f"{value:.2f}x"
    if name in ("est_ms_per_token",):
        return f"{value:.3f}"
    if isinstance(value, float):
        return f"{value:.2f}" if name != "mass_per_token" else f"{value:.3f}"
    return str(value)


def format_table(result: Sweep, model: Any = None) -> str:
    """The sweep as an aligned text table with a footer naming the cost model."""
    columns = _COLUMNS + ((("disk/tok", "disk_bytes_per_token"),) if any(
        r.disk_bytes_per_token is not None for r in result.rows) else ())
    header = [title for title, _ in columns]
    body = [[_cell(key, getattr(r, key)) for _, key in columns] for r in result.rows]
    widths = [max(len(h), *(len(row[i]) for row in body)) if body else len(h)
              for i, h in enumerate(header)]
    lines = ["  ".join(h.ljust(w) if i < 2 else h.rjust(w)
                       for i, (h, w) in enumerate(zip(header, widths, strict=True)))]
    for row in body:
        lines.append("  ".join(c.ljust(w) if i < 2 else c.rjust(w)
                               for i, (c, w) in enumerate(zip(row, widths, strict=True))))
    tokens = result.rows[0].tokens if result.rows else 0
    lines.append("")
    lines.append(f"{tokens} decode tokens of {result.trace_tokens} in the trace; cost model "
                 f"{result.cost_model.describe(model)}")
    if result.recorded_ms_per_token is not None:
        lines.append(f"measured while recording: {result.recorded_ms_per_token:.3f} ms/token")
    approx = max((r.approximate_rows for r in result.rows), default=0)
    if approx:
        lines.append(f"note: {approx} rows had no router inputs and were replayed from their "
                     "event rows (substitute choices may differ)")
    lines.extend(f"warning: {w}" for w in result.warnings)
    return "\n".join(lines)


def to_csv(result: Sweep) -> str:
    """One CSV row per policy x budget, raw numbers (bytes, ratios, ms)."""
    out = io.StringIO()
    names = list(SweepRow.__dataclass_fields__)
    writer = csv.DictWriter(out, fieldnames=names, lineterminator="\n")
    writer.writeheader()
    for r in result.rows:
        writer.writerow(asdict(r))
    return out.getvalue()


def to_json(result: Sweep) -> str:
    """The sweep, its cost model and warnings as JSON."""
    cm = result.cost_model
    return json.dumps({
        "cost_model": {"name": cm.name, "bandwidth": cm.bandwidth, "latency": cm.latency,
                       "gpu_bandwidth": cm.gpu_bandwidth, "compute_s": cm.compute_s,
                       "background_exposed": cm.background_exposed},
        "trace_tokens": result.trace_tokens,
        "recorded_ms_per_token": result.recorded_ms_per_token,
        "rows": [asdict(r) for r in result.rows], "warnings": result.warnings,
    }, indent=2)
