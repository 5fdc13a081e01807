"""The cache panel's data: ring buffers and heatmap state filled from token snapshots.

Friture's split: this model only accumulates numbers (cheap, once per token); the views
read it when the display timer fires, and only the parts marked dirty. Nothing here
imports Qt, so a reopened trace fills the same model through the same code as a live
session, and tests read the numbers the plots show.

Prefetch accuracy is :class:`moescope.cache.prefetch.PrefetchSummary` (imported here, as
before): a reopened trace and the simulator's what-if table use the same definition.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache.audit import AuditEstimate, AuditRecord
from moescope.cache.budget import format_bytes
from moescope.cache.prefetch import PrefetchSummary
from moescope.display.ring import RingBuffer
from moescope.session.snapshots import (
    CELL_LABELS,
    NOT_RESIDENT,
    RESIDENT,
    LayerNumbers,
    ModelSummary,
    TokenSnapshot,
    cell_states,
    layer_numbers,
    layer_rows,
    layer_sums_many,
    used_experts,
    used_experts_many,
)

TIME_COLUMNS = (
    "step", "tokens_per_s", "mass", "hit_rate", "fetched_mb", "substituted_fraction",
    "slots", "prefetches", "prefetch_hits", "audit_kl", "disk_mb", "fills", "disk_fills",
)
"""One row per token: what the time plots draw (x = ``step``). The prefetch columns are
NaN for a token whose policy does not prefetch, so a mean over them never mixes in zeros
that only mean "off". ``audit_kl`` is the audited step's KL(exact || policy), NaN where the
step was not audited. ``disk_mb``, ``fills`` and ``disk_fills``: MB read from the model file,
slot fills (fetches and admissions), and how many of them came from the file rather than
the RAM tier (zero with the tier off)."""

ROLLING_TOKENS = 16
"""Tokens/s is shown as a rolling mean over this many decode steps (one token is noisy)."""
ACCOUNT_CHUNK = 512
"""Tokens :meth:`CacheModel.add_many` sums at once: their event rows are held together
(21 MB at 48 MoE layers; a reopened trace lays a token's rows out when read)."""


def audit_text(est: AuditEstimate, last_kl: float) -> str:
    """The stats line's audit part: ``quality cost +0.42% expected on the model's own text
    [0.10 to 0.81%] · KL 0.0031 · 12 audits``, the estimate (saying which) with its 95%
    interval and the latest audited KL."""
    ci = f" [{est.interval_text()}]" if est.n >= 2 else ""
    kl = f" · KL {last_kl:.4f}" if last_kl == last_kl else ""
    return (f"quality cost {est.cost_text()} {est.words}{ci}{kl} · {est.n} audit"
            f"{'s' if est.n != 1 else ''}")


AUDIT_TIP = (
    "Quality cost, expected on the model's own text: every Nth token is also computed "
    "exactly (every missing expert fetched into scratch slots), and KL(exact || policy) of "
    "the two next-token distributions is the expected rise of that token's log-perplexity "
    "when the text is what the model writes (its answers). exp(mean KL) - 1 over the audits "
    "of this policy and budget estimates the perplexity cost of the answers, in brackets "
    "its 95% interval; KL is the latest audited token's. On given text (teacher-forced, "
    "e.g. moescope eval) the cost is measured on the text's own tokens instead, and can "
    "differ: held-out text is not what the model would write.")


def prefetch_text(summary: PrefetchSummary) -> str:
    """The stats line's PSR part: ``prefetch accuracy 94% · 2.9/token``."""
    acc = summary.accuracy
    return (f"prefetch accuracy {acc:.0%} · {summary.per_token:.1f}/token" if acc is not None
            else f"prefetch accuracy – · {summary.per_token:.1f}/token")


SUMMARY_TIP = (
    "First line: what the cache does now (policy, slots) and the latest token.\n"
    "Second line: hit rate and substituted gate mass per token are means over the last {n} "
    "tokens, under the policies named; tokens/s is over the last {r} decode steps.\n"
    "The line under each answer in the chat is over that whole answer (its tok/s, the "
    "answer average, leaves out the first token; its hit rate counts every expert "
    "selection), so the two differ. The plots below show every token.")
TRACE_SUMMARY_TIP = (
    "First line: what the cache did at the end of the trace (policy, slots), its last token, "
    "and the time to first token of the last answer in the trace.\n"
    "Second line: hit rate and substituted gate mass per token are means over the trace's "
    "last {n} tokens, under the policies named; tokens/s is over its last {r} decode steps. "
    "The plots below show every token.")
""":data:`SUMMARY_TIP` for a reopened trace: nothing in it happens now."""
PREFETCH_TIP = (
    "Prefetch accuracy (PSR): of the experts prefetched over the last {n} tokens, the share "
    "the router then used before they were evicted. /token: experts prefetched per decoded "
    "token, all layers together. Low accuracy means wasted copies and evictions.")


@dataclass(frozen=True)
class TierNumbers:
    """Hit rates of the three tiers over recent tokens: how often a routed expert was in
    a VRAM slot, of the slot fills how many the RAM tier served, MB read from disk."""

    vram_hit_rate: float
    ram_hit_rate: float
    disk_mb_per_token: float
    tokens: int


def _tier_numbers(events: npt.NDArray[Any]) -> dict[str, float]:
    """One token's disk MB, slot fills and fills read from the file (RAM tier columns)."""
    if len(events) == 0:
        return {"disk_mb": 0.0, "fills": 0.0, "disk_fills": 0.0}
    fills = float(events["n_fetch"].sum() + events["n_admit"].sum())
    if "n_disk" not in (events.dtype.names or ()):
        return {"disk_mb": 0.0, "fills": fills, "disk_fills": 0.0}
    return {"disk_mb": float(events["bytes_disk"].sum()) / 1e6, "fills": fills,
            "disk_fills": float(events["n_disk"].sum())}


def _tier_columns(events: list[npt.NDArray[Any]]) -> dict[str, npt.NDArray[np.float64]]:
    """:func:`_tier_numbers` of many tokens, as columns (the same sums: whole numbers)."""
    m = len(events)
    lens = np.fromiter((len(ev) for ev in events), np.int64, m)
    filled = np.flatnonzero(lens)
    names = ("disk_mb", "fills", "disk_fills")
    if not len(filled):
        return {name: np.zeros(m) for name in names}
    first = events[filled[0]].dtype
    if any(events[i].dtype is not first and events[i].dtype != first for i in filled):
        each = [_tier_numbers(ev) for ev in events]
        return {name: np.array([x[name] for x in each]) for name in names}
    token = np.repeat(filled, lens[filled])

    def total(field: str) -> npt.NDArray[np.float64]:
        col = np.concatenate([events[i][field] for i in filled]).astype(np.float64)
        return np.bincount(token, col, minlength=m)

    fills = total("n_fetch") + total("n_admit")
    if "n_disk" not in (first.names or ()):
        return {"disk_mb": np.zeros(m), "fills": fills, "disk_fills": np.zeros(m)}
    return {"disk_mb": total("bytes_disk") / 1e6, "fills": fills,
            "disk_fills": total("n_disk")}


def _sums_or_nan(arrays: list[npt.NDArray[np.int64] | None]) -> npt.NDArray[np.float64]:
    """Each array's sum, NaN for None (a token whose policy does not prefetch)."""
    out = np.full(len(arrays), np.nan)
    at = [i for i, x in enumerate(arrays) if x is not None]
    if at:
        shapes = {arrays[i].shape for i in at}  # type: ignore[union-attr]
        if len(shapes) == 1 and len(next(iter(shapes))) == 1:
            out[at] = np.stack([arrays[i] for i in at]).sum(axis=1)  # type: ignore[misc]
        else:
            out[at] = [float(arrays[i].sum()) for i in at]  # type: ignore[union-attr]
    return out


def tier_text(model: ModelSummary, slots: int, ram_slots: int, n: TierNumbers) -> str:
    """The memory view's three lines: where the experts are, how many bytes each tier
    holds, and its hit rate over recent tokens."""
    row = model.slot_row_bytes
    total = model.total_expert_bytes or row * model.n_expert

    def pct(x: float) -> str:
        return "–" if x != x else f"{x:.0%}"

    vram = (f"VRAM slots: {slots}/{model.n_expert} per layer · {format_bytes(slots * row)} · "
            f"hit {pct(n.vram_hit_rate)} of routed experts")
    if not ram_slots:
        return (f"{vram}\nRAM: every expert ({format_bytes(total)}) · serves every slot "
                "fill\nDisk: not read (RAM tier off)")
    ram_bytes = min(total, ram_slots * row)
    disk = "–" if n.disk_mb_per_token != n.disk_mb_per_token else f"{n.disk_mb_per_token:.2f}"
    return (f"{vram}\nRAM tier: {ram_slots}/{model.n_expert} per layer · "
            f"{format_bytes(ram_bytes)} · served {pct(n.ram_hit_rate)} of slot fills\n"
            f"Disk only: {format_bytes(max(0, total - ram_bytes))} · {disk} MB/token read")


@dataclass(frozen=True)
class Marker:
    """A policy or budget change, drawn as a vertical line at the token it applied to."""

    step: int
    label: str


class CacheModel:
    """Numbers behind every cache plot, for one model; views read, never write."""

    def __init__(self, capacity: int = 4096, layer_window: int = 32) -> None:
        self.capacity = capacity
        self.layer_window = layer_window
        self.time = RingBuffer(TIME_COLUMNS, capacity)
        self.dirty: set[str] = set()
        self.reset(None)

    # ------------------------------------------------------------------ lifecycle
    def reset(self, model: ModelSummary | None) -> None:
        """Forget everything and size the heatmap for ``model`` (None: no cache)."""
        self.model = model
        n_rows = model.n_moe_layers if model and model.cache_enabled else 0
        n_expert = model.n_expert if model and model.cache_enabled else 0
        self.rows_of = layer_rows(model.moe_layers if model else ())
        self.n_rows, self.n_expert = n_rows, n_expert
        self.uses = np.zeros((n_rows, n_expert), np.int64)
        self.last_use = np.full((n_rows, n_expert), -1, np.int64)
        self._cells = np.zeros((n_rows, n_expert), np.uint8)
        self._cells_stale = False
        self.latest: TokenSnapshot | None = None
        self.shown: TokenSnapshot | None = None
        """The token whose states the heatmap draws in place of the latest (a reopened
        trace's, chosen with its token slider; its ``resident`` set); None: the latest."""
        w = self.layer_window
        self._layer_mass = np.zeros((w, n_rows))
        self._layer_hits = np.zeros((w, n_rows))
        self._layer_sel = np.zeros((w, n_rows))
        self._layer_bytes = np.zeros((w, n_rows))
        self._layer_prefetches = np.zeros((w, n_rows))
        self._layer_prefetch_hits = np.zeros((w, n_rows))
        self._layer_prefetching = np.zeros(w, np.bool_)
        self._layer_head = 0
        self._layer_count = 0
        self.time.clear()
        self._decode_seconds: deque[float] = deque(maxlen=ROLLING_TOKENS)
        self._policies: deque[str] = deque(maxlen=self.layer_window)
        """The policy of each of the last ``layer_window`` tokens: the numbers over them
        are labelled with the policies that produced them, not with the one chosen since."""
        self.markers: list[Marker] = []
        self.ttft_s: float | None = None
        self.policy = model.policy if model else ""
        self.slots_per_layer = model.slots_per_layer if model else 0
        self.ram_slots_per_layer = model.ram_slots_per_layer if model else 0
        self.context_used = 0
        self.n_ctx = model.n_ctx if model else 0
        self.prefetching = False
        """Whether the latest token's policy prefetched (PSR numbers are shown only then)."""
        self.audits: list[AuditRecord] = []
        """Audits since the policy or budget last changed: the running estimate's."""
        self.dirty = {"heatmap", "time", "layers", "labels"}

    def set_model(self, model: ModelSummary) -> None:
        """The same model with a new budget or policy: keep history, update the labels."""
        if self.model is None or model.moe_layers != self.model.moe_layers \
                or model.n_expert != self.model.n_expert:
            self.reset(model)
            return
        if model.policy != self.policy or model.slots_per_layer != self.slots_per_layer:
            self.audits = []  # another policy or budget: another cost (as in add)
        self.model = model
        self.policy = model.policy
        self.slots_per_layer = model.slots_per_layer
        self.ram_slots_per_layer = model.ram_slots_per_layer
        self.dirty.update(("labels", "memory"))
        if model.resident is not None and model.resident.shape == self._cells.shape:
            # applied while idle: the residents the engine keeps now (no token touched them)
            self._cells = np.where(model.resident, RESIDENT, NOT_RESIDENT).astype(np.uint8)
            self._cells_stale = False
            self.dirty.add("heatmap")

    # ------------------------------------------------------------------ input
    def add_marker(self, step: int, label: str) -> None:
        """A labelled vertical line on the time plots at ``step`` (a policy or budget
        change, or where a thinking model's answer began)."""
        self.markers.append(Marker(step, label))
        self.dirty.add("markers")

    def add_many(self, snaps: Iterable[TokenSnapshot]) -> None:
        """:meth:`add` of each, in order, to the same state: a reopened trace's thousands of
        tokens summed per layer, their time rows and their experts' uses in one pass each
        (a 10,000-token trace of Qwen3-Next's shape: 2.3 s of the window's opening, token
        by token). Only what is sequential (tokens/s's rolling window, audits, markers)
        goes a token at a time, and the rings get only what they keep."""
        snaps = list(snaps)
        if not self.n_rows or len(snaps) < 2:
            for snap in snaps:
                self.add(snap)
            return
        for i in range(0, len(snaps), ACCOUNT_CHUNK):
            chunk = snaps[i:i + ACCOUNT_CHUNK]
            if len(chunk) > 1:
                self._add_chunk(chunk)
            else:
                self.add(chunk[0])

    def _add_chunk(self, snaps: list[TokenSnapshot]) -> None:
        """:meth:`add_many` of at most :data:`ACCOUNT_CHUNK` tokens, whose event rows it
        holds at once."""
        m = len(snaps)
        events = [snap.events for snap in snaps]
        sums = layer_sums_many(events, self.rows_of)
        tok_s = np.empty(m)
        kl = np.full(m, np.nan)
        for i, snap in enumerate(snaps):
            if snap.index == 0:
                self.ttft_s = snap.ttft if snap.ttft is not None else snap.seconds
                self._decode_seconds.clear()
                tok_s[i] = float("nan")
            else:
                self._decode_seconds.append(snap.seconds)
                total = sum(self._decode_seconds)
                tok_s[i] = len(self._decode_seconds) / total if total > 0 else float("nan")
            if snap.policy != self.policy or snap.slots_per_layer != self.slots_per_layer:
                self.audits = []  # another policy or budget: another cost
            if snap.audit is not None:
                self.audits.append(snap.audit)
                kl[i] = snap.audit.kl
            for change in snap.changes:
                self.add_marker(snap.step, change)
            self._policies.append(snap.policy)
            self.policy = snap.policy
            self.slots_per_layer = snap.slots_per_layer
        selections = sums.selections.sum(axis=1)
        some = selections > 0
        per = np.where(some, selections, 1)
        self.time.extend({
            "step": np.fromiter((s.step for s in snaps), np.float64, m),
            "tokens_per_s": tok_s,
            "mass": sums.mass.sum(axis=1),
            "hit_rate": np.where(some, sums.hits.sum(axis=1) / per, np.nan),
            "fetched_mb": sums.bytes_sync.sum(axis=1) / 1e6,
            "substituted_fraction": np.where(some, sums.substitutions.sum(axis=1) / per,
                                             np.nan),
            "slots": np.fromiter((s.slots_per_layer for s in snaps), np.float64, m),
            "prefetches": _sums_or_nan([s.prefetches for s in snaps]),
            "prefetch_hits": _sums_or_nan([s.prefetch_hits for s in snaps]),
            "audit_kl": kl,
            **_tier_columns(events),
        }, m)
        # the per-layer window keeps the last layer_window tokens
        keep = min(m, self.layer_window)
        self._layer_head = (self._layer_head + m - keep) % self.layer_window
        for i in range(m - keep, m):
            self._account_layers(snaps[i], LayerNumbers(
                mass=sums.mass[i], hits=sums.hits[i], selections=sums.selections[i],
                fetches=sums.fetches[i], substitutions=sums.substitutions[i],
                bytes_sync=sums.bytes_sync[i]))
        rows, experts, token = used_experts_many(events, self.rows_of, self.n_expert)
        cells = self.n_rows * self.n_expert
        flat = rows * self.n_expert + experts
        self.uses += np.bincount(flat, minlength=cells).reshape(self.uses.shape)
        # each expert's last use: its latest token's step, as add() leaves it
        latest = np.full(cells, -1, np.int64)
        np.maximum.at(latest, flat, token)
        used = np.flatnonzero(latest >= 0)
        steps = np.fromiter((snap.step for snap in snaps), np.int64, m)
        self.last_use.flat[used] = steps[latest[used]]
        self._finish(snaps[-1])

    def add(self, snap: TokenSnapshot) -> None:
        """Account one token (called for every token; keep it cheap)."""
        nums = layer_numbers(snap.events, self.rows_of)
        if snap.index == 0:
            self.ttft_s = snap.ttft if snap.ttft is not None else snap.seconds
            self._decode_seconds.clear()
            tok_s = float("nan")
        else:
            self._decode_seconds.append(snap.seconds)
            total = sum(self._decode_seconds)
            tok_s = len(self._decode_seconds) / total if total > 0 else float("nan")
        selections = int(nums.selections.sum())
        pf, pf_hits = snap.prefetches, snap.prefetch_hits
        self.time.append({
            "step": snap.step,
            "tokens_per_s": tok_s,
            "mass": float(nums.mass.sum()),
            "hit_rate": nums.hits.sum() / selections if selections else float("nan"),
            "fetched_mb": nums.bytes_sync.sum() / 1e6,
            "substituted_fraction": (nums.substitutions.sum() / selections
                                     if selections else float("nan")),
            "slots": snap.slots_per_layer,
            "prefetches": float(pf.sum()) if pf is not None else float("nan"),
            "prefetch_hits": float(pf_hits.sum()) if pf_hits is not None else float("nan"),
            "audit_kl": snap.audit.kl if snap.audit is not None else float("nan"),
            **_tier_numbers(snap.events),
        })
        if snap.policy != self.policy or snap.slots_per_layer != self.slots_per_layer:
            self.audits = []  # another policy or budget: another cost
        if snap.audit is not None:
            self.audits.append(snap.audit)
        if self.n_rows:
            self._account_layers(snap, nums)
            rows, experts = used_experts(snap.events, self.rows_of, self.n_expert)
            np.add.at(self.uses, (rows, experts), 1)
            self.last_use[rows, experts] = snap.step
        for change in snap.changes:
            self.add_marker(snap.step, change)
        self._policies.append(snap.policy)
        self._finish(snap)

    def _account_layers(self, snap: TokenSnapshot, nums: LayerNumbers) -> None:
        """The per-layer window's row of one token (the ring's next)."""
        pf, pf_hits = snap.prefetches, snap.prefetch_hits
        i = self._layer_head
        self._layer_mass[i] = nums.mass[: self.n_rows]
        self._layer_hits[i] = nums.hits[: self.n_rows]
        self._layer_sel[i] = nums.selections[: self.n_rows]
        self._layer_bytes[i] = nums.bytes_sync[: self.n_rows]
        self._layer_prefetching[i] = pf is not None and pf_hits is not None
        if pf is not None and pf_hits is not None and pf.shape == (self.n_rows,):
            self._layer_prefetches[i] = pf
            self._layer_prefetch_hits[i] = pf_hits
        else:
            self._layer_prefetches[i] = 0
            self._layer_prefetch_hits[i] = 0
        self._layer_head = (i + 1) % self.layer_window
        self._layer_count = min(self._layer_count + 1, self.layer_window)

    def _finish(self, snap: TokenSnapshot) -> None:
        """What the latest accounted token leaves: its policy, budget and context."""
        self.latest = snap
        self._cells_stale = True
        self.prefetching = snap.prefetches is not None and snap.prefetch_hits is not None
        self.policy = snap.policy
        self.slots_per_layer = snap.slots_per_layer
        self.ram_slots_per_layer = snap.ram_slots_per_layer
        self.context_used = snap.context_used
        self.n_ctx = snap.n_ctx
        self.dirty.update(("heatmap", "time", "layers", "labels", "memory"))

    # ------------------------------------------------------------------ output
    def show_token(self, snap: TokenSnapshot | None) -> None:
        """Draw ``snap``'s states in the heatmap (its ``resident`` set), or the latest
        token's again (None)."""
        self.shown = snap
        self._cells_stale = True
        self.dirty.update(("heatmap", "labels"))

    def cells(self) -> npt.NDArray[np.uint8]:
        """The shown (else the latest) token's heatmap states (computed lazily, once per
        repaint)."""
        snap = self.shown or self.latest
        if self._cells_stale and snap is not None and snap.resident is not None \
                and snap.resident.shape == self._cells.shape:
            ram = snap.ram_resident if snap.ram_resident is not None \
                and snap.ram_resident.shape == self._cells.shape else None
            self._cells = cell_states(snap.resident, snap.events, self.rows_of, ram)
        self._cells_stale = False
        return self._cells

    def layer_means(self) -> dict[str, npt.NDArray[np.float64]]:
        """Per MoE layer over the last ``layer_window`` tokens: substituted mass per
        token, hit rate, fetched MB per token."""
        n = self._layer_count
        if n == 0 or self.n_rows == 0:
            z = np.zeros(self.n_rows)
            return {"mass": z, "hit_rate": z.copy(), "fetched_mb": z.copy()}
        # rows [0, n) are filled: the ring starts at 0 and wraps only once full
        sel = self._layer_sel[:n].sum(axis=0)
        hits = self._layer_hits[:n].sum(axis=0)
        return {
            "mass": self._layer_mass[:n].sum(axis=0) / n,
            "hit_rate": np.divide(hits, sel, out=np.zeros_like(hits), where=sel > 0),
            "fetched_mb": self._layer_bytes[:n].sum(axis=0) / n / 1e6,
        }

    def audit_estimate(self) -> AuditEstimate | None:
        """The running estimate of the perplexity cost from the audits of the current
        policy and budget (None: none yet)."""
        return AuditEstimate.from_records(self.audits)

    def recent_mean(self, key: str) -> float:
        """Mean of a time column over the last ``layer_window`` tokens (NaN where none is
        known): the stats line's numbers, which one token's values would make flicker
        (one token's hit rate on the demo model jumps between 25% and 75%)."""
        t = self.time
        n = min(t.count, self.layer_window)
        values = t.view(key)[t.count - n:]
        finite = values[np.isfinite(values)]
        return float(finite.mean()) if len(finite) else float("nan")

    def recent_sum(self, key: str) -> float:
        """Sum of a time column over the last ``layer_window`` tokens (NaNs left out)."""
        t = self.time
        n = min(t.count, self.layer_window)
        values = t.view(key)[t.count - n:]
        return float(values[np.isfinite(values)].sum())

    def tiers(self) -> TierNumbers:
        """The three tiers over the last ``layer_window`` tokens (the memory view's)."""
        n = self.recent_tokens()
        fills = self.recent_sum("fills")
        disk = self.recent_sum("disk_fills")
        return TierNumbers(
            vram_hit_rate=self.recent_mean("hit_rate"),
            ram_hit_rate=(1.0 - disk / fills) if fills else float("nan"),
            disk_mb_per_token=self.recent_sum("disk_mb") / n if n else float("nan"),
            tokens=n)

    def recent_tokens(self) -> int:
        """How many tokens :meth:`recent_mean` averages over now."""
        return min(self.time.count, self.layer_window)

    def recent_policies(self) -> list[str]:
        """The policies the last ``layer_window`` tokens were decoded under, in order."""
        return list(dict.fromkeys(self._policies))

    def rolling_rate_tokens(self) -> int:
        """How many decode steps the latest tokens/s is over (the answer's first token is
        the prompt's time and starts the rate again)."""
        return len(self._decode_seconds)

    def prefetch_summary(self) -> PrefetchSummary | None:
        """PSR over the prefetching tokens among the last ``layer_window``; None while the
        latest token's policy does not prefetch (nothing to show, not a zero)."""
        if not self.prefetching:
            return None
        t = self.time
        n = min(t.count, self.layer_window)
        pf = t.view("prefetches")[t.count - n:]
        hits = t.view("prefetch_hits")[t.count - n:]
        on = np.isfinite(pf)
        return PrefetchSummary(tokens=int(on.sum()), prefetches=int(pf[on].sum()),
                               hits=int(hits[on].sum()))

    def layer_prefetch(self) -> list[PrefetchSummary] | None:
        """Per MoE layer, PSR over the prefetching tokens among the last ``layer_window``
        (a layer nothing is predicted for, like the first, has no prefetches); None while
        the policy does not prefetch."""
        if not self.prefetching or self.n_rows == 0:
            return None
        n = self._layer_count
        on = self._layer_prefetching[:n]
        pf = self._layer_prefetches[:n][on].sum(axis=0)
        hits = self._layer_prefetch_hits[:n][on].sum(axis=0)
        tokens = int(on.sum())
        return [PrefetchSummary(tokens=tokens, prefetches=int(pf[r]), hits=int(hits[r]))
                for r in range(self.n_rows)]

    def tooltip(self, row: int, expert: int) -> str:
        """Hover text of a heatmap cell: layer, expert, state, uses, last use."""
        if not (0 <= row < self.n_rows and 0 <= expert < self.n_expert):
            return ""
        assert self.model is not None
        layer = self.model.moe_layers[row]
        state = CELL_LABELS[int(self.cells()[row, expert])]
        last = int(self.last_use[row, expert])
        last_text = f"token {last}" if last >= 0 else "never"
        return (f"layer {layer}, expert {expert}\n{state}\n"
                f"uses: {int(self.uses[row, expert])}\nlast use: {last_text}")

    def take_dirty(self) -> set[str]:
        out, self.dirty = self.dirty, set()
        return out
