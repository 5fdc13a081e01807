"""What the worker thread hands to the window: plain dataclasses holding copies.

Why copies: the engine's buffers are reused token after token on the worker thread; a
signal that carried a view into them would let the GUI read half-updated memory. Every
array here is owned by the snapshot, and nothing here is a widget or a Qt object, so a
snapshot can also be written to, and rebuilt from, a trace file.

The per-token cell states of the residency heatmap are computed from two things only: the
resident mask after the token, and the token's event rows (:func:`cell_states`). The live
panel and a reopened trace therefore show the same picture.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache.audit import AuditRecord
from moescope.cache.native import FETCH, HIT, SUBSTITUTE
from moescope.engine.changes import RequestNumbers

# heatmap cell states (the colour table's indices); the last two only with the RAM tier on,
# where an expert not in a VRAM slot is either in the RAM tier or only in the model file
(NOT_RESIDENT, RESIDENT, HIT_NOW, FETCHED_NOW, SUBSTITUTED_AWAY, USED_AS_SUBSTITUTE,
 IN_RAM, ON_DISK) = range(8)
CELL_LABELS: tuple[str, ...] = (
    "not resident", "resident", "hit by this token", "fetched by this token",
    "substituted away", "used as substitute", "in RAM, not in VRAM", "on disk only",
)
TIER_STATES = (IN_RAM, ON_DISK)
"""The states the legend shows only while the RAM tier is on."""


@dataclass(frozen=True)
class ModelSummary:
    """The loaded model as the window needs it (no engine objects)."""

    path: str
    name: str
    architecture: str
    n_expert: int
    top_k: int
    moe_layers: tuple[int, ...]
    slot_row_bytes: int
    total_expert_bytes: int
    non_expert_bytes: int
    cache_enabled: bool
    slots_per_layer: int
    policy: str
    n_ctx: int
    notice: str = ""
    ram_note: str = ""
    """Why the RAM tier is what it is when the load chose it (``LoadedModel.ram_note``)."""
    budget_message: str = ""
    trace_path: str = ""
    """The session's trace file while recording ("" when not recording)."""
    expert_buffer: str = ""
    """llama.cpp's buffer holding the experts in host memory (``CUDA_Host``: pinned;
    ``CPU_Mapped`` / ``CPU``: pageable); "" when unknown (cache off, a reopened trace)."""
    slot_buffer: str = ""
    """llama.cpp's buffer holding the slots (``CUDA0``/``Vulkan0``: device; ``CPU``: RAM)."""
    ram_slots_per_layer: int = 0
    """Experts per layer in the RAM tier (0: the tier is off, every expert in host memory);
    the others are read from the model file on demand."""
    thinking_choices: tuple[str, ...] = ("default",)
    """The thinking settings the model's chat template understands (``model.reasoning``)."""
    answer_prefixes: dict[str, str] = field(default_factory=dict)
    """Per thinking setting, what the chat template opens every answer with
    (``"<think>\\n"`` where it opens the thoughts in the prompt): the chat prepends it to
    the stored answer (see ``model.reasoning``)."""
    sampling_defaults: dict[str, float | int] = field(default_factory=dict)
    """The sampling the model's GGUF recommends (``model.sampling_defaults``)."""
    requests: RequestNumbers = field(default_factory=RequestNumbers)
    """Numbers of the latest policy and budget requests the engine had applied (see
    ``Engine.applied_requests``): older than the window's latest request means stale."""
    resident: npt.NDArray[np.bool_] | None = field(default=None, repr=False, compare=False)
    """MoE layers x experts resident now, when a change applied while idle moved them (a
    budget cut evicts): the heatmap shows them before the next token; None otherwise."""

    @property
    def n_moe_layers(self) -> int:
        return len(self.moe_layers)

    @property
    def residency(self) -> float:
        return self.slots_per_layer / self.n_expert if self.n_expert else 0.0


@dataclass(frozen=True)
class TokenSnapshot:
    """One decoded token and what the cache did for it, summed per MoE layer."""

    step: int
    """Session-wide token counter: the x axis of every time plot."""
    index: int
    """Index of the token within its answer."""
    text: str
    seconds: float
    policy: str
    slots_per_layer: int
    n_prompt_tokens: int
    n_ctx: int
    events: npt.NDArray[Any] = field(repr=False)
    """This token's event rows (``EVENT_DTYPE``), a copy. A reopened trace's tokens are
    given a function instead (:class:`_EventRows`), which lays the rows out from the
    trace's columns each time they are read."""
    resident: npt.NDArray[np.bool_] | None = field(repr=False, default=None)
    """MoE layers x experts, True where resident after the token (None: cache off, or a
    reopened trace's token before its last: ``ReopenedTrace.resident`` has those)."""
    changes: tuple[str, ...] = ()
    """Policy or budget changes applied just before this token was decoded (the
    markers' labels, ``Change.label``)."""
    errors: tuple[str, ...] = ()
    """Requested changes that failed just before this token (why, one line each)."""
    ttft: float | None = None
    """Time to first token (set on an answer's first token only)."""
    prefetches: npt.NDArray[np.int64] | None = field(repr=False, default=None)
    """PSR: experts prefetched during this token, per MoE layer (None: the policy does not
    prefetch, or unknown as in a reopened trace; the core writes no event row for them)."""
    prefetch_hits: npt.NDArray[np.int64] | None = field(repr=False, default=None)
    """PSR: prefetched experts first routed to during this token, per MoE layer."""
    requests: RequestNumbers = field(default_factory=RequestNumbers)
    """Numbers of the latest policy and budget requests applied as of this token."""
    end: bool = False
    """The step that chose the answer's end-of-generation token (``AnswerStats.end_step``):
    the cache's work is drawn, but it is no token of the answer's text."""
    audit: AuditRecord | None = None
    """The step was audited: its exact output against the policy's (``cache.audit``)."""
    ram_resident: npt.NDArray[np.bool_] | None = field(repr=False, default=None)
    """MoE layers x experts, True where in the RAM tier after the token (None: the tier is
    off, every expert in host memory)."""
    ram_slots_per_layer: int = 0
    """The RAM tier's experts per layer when the token was decoded (0: off)."""
    saved: bool = False
    """The decode thread already appended ``text`` to the chat database (``GenerateRequest
    .save``); the window saves only the tokens that are not (none asked, or a write
    failed), in order, after the saved ones."""

    @property
    def context_used(self) -> int:
        return self.n_prompt_tokens + self.index + 1


class _EventRows:
    """:attr:`TokenSnapshot.events`: the array given, or, given a function, what it
    returns each time the rows are read. A reopened trace holds a snapshot per token, and
    its rows laid out for every token were 864 bytes a row (438 MB at 10,000 tokens of
    Qwen3-Next's geometry) that nothing but the accounting, a chunk at a time, and the
    token the window shows ever read. ``dataclasses.replace`` reads the rows, so a copy
    holds them."""

    def __get__(self, obj: Any, objtype: type | None = None) -> npt.NDArray[Any]:
        if obj is None:
            raise AttributeError("events")
        rows = obj.__dict__["_events_given"]
        return rows() if callable(rows) else rows  # type: ignore[no-any-return]

    def __set__(self, obj: Any, value: npt.NDArray[Any] | Callable[[], npt.NDArray[Any]]
                ) -> None:
        obj.__dict__["_events_given"] = value


TokenSnapshot.events = _EventRows()  # type: ignore[assignment,method-assign]


@dataclass
class LayerNumbers:
    """Per-MoE-layer sums of one token's rows, in the order of ``moe_layers``."""

    mass: npt.NDArray[np.float64]
    hits: npt.NDArray[np.int64]
    selections: npt.NDArray[np.int64]
    fetches: npt.NDArray[np.int64]
    substitutions: npt.NDArray[np.int64]
    bytes_sync: npt.NDArray[np.int64]


def layer_rows(moe_layers: tuple[int, ...], n_layers_hint: int = 0) -> npt.NDArray[np.int64]:
    """Map a model layer index to its heatmap row (-1 for dense layers)."""
    size = max(max(moe_layers, default=-1) + 1, n_layers_hint)
    rows = np.full(size, -1, dtype=np.int64)
    rows[list(moe_layers)] = np.arange(len(moe_layers))
    return rows


def layer_numbers(events: npt.NDArray[Any], rows_of: npt.NDArray[np.int64]) -> LayerNumbers:
    """Sum one token's event rows per MoE layer."""
    n = int((rows_of >= 0).sum())
    out = LayerNumbers(
        mass=np.zeros(n), hits=np.zeros(n, np.int64), selections=np.zeros(n, np.int64),
        fetches=np.zeros(n, np.int64), substitutions=np.zeros(n, np.int64),
        bytes_sync=np.zeros(n, np.int64))
    if len(events) == 0:
        return out
    layers = events["layer"].astype(np.int64)
    keep = (layers >= 0) & (layers < len(rows_of))
    r = rows_of[layers[keep]]
    ev = events[keep][r >= 0]
    r = r[r >= 0]
    np.add.at(out.mass, r, ev["substituted_mass"].astype(np.float64))
    np.add.at(out.hits, r, ev["n_hit"])
    np.add.at(out.selections, r, ev["k"])
    np.add.at(out.fetches, r, ev["n_fetch"])
    np.add.at(out.substitutions, r, ev["n_substitute"])
    np.add.at(out.bytes_sync, r, ev["bytes_sync"])
    return out


def _fields(events: Sequence[npt.NDArray[Any]], names: tuple[str, ...]) -> tuple[
        list[int], dict[str, npt.NDArray[Any]]] | None:
    """The tokens that have rows, and those rows' ``names`` columns joined (a column at a
    time: joining structured arrays promotes their dtypes pair by pair, 30 us a token);
    None where the tokens' rows are not all alike."""
    filled = [i for i, ev in enumerate(events) if len(ev)]
    if not filled:
        return filled, {}
    first = events[filled[0]].dtype
    if any(events[i].dtype is not first and events[i].dtype != first for i in filled):
        return None
    return filled, {name: np.concatenate([events[i][name] for i in filled]) for name in names}


def layer_sums_many(events: Sequence[npt.NDArray[Any]],
                    rows_of: npt.NDArray[np.int64]) -> LayerNumbers:
    """:func:`layer_numbers` of many tokens at once (a reopened trace's thousands), as
    matrices (a token per row, a MoE layer per column): the same sums, added in the same
    order (``bincount`` adds its weights in order, as ``add.at`` does), in one pass over
    all their rows."""
    n, m = int((rows_of >= 0).sum()), len(events)
    joined = _fields(events, ("layer", "substituted_mass", "n_hit", "k", "n_fetch",
                              "n_substitute", "bytes_sync"))
    if joined is None:  # unlike rows: one token at a time
        each = [layer_numbers(ev, rows_of) for ev in events]
        return LayerNumbers(**{
            name: np.stack([getattr(x, name) for x in each]) if each
            else np.zeros((0, n), np.float64 if name == "mass" else np.int64)
            for name in LAYER_SUMS})
    filled, col = joined
    sums: dict[str, npt.NDArray[Any]] = {}
    if filled:
        token = np.repeat(np.asarray(filled, np.int64), [len(events[i]) for i in filled])
        layers = col["layer"].astype(np.int64)
        keep = (layers >= 0) & (layers < len(rows_of))
        keep[keep] = rows_of[layers[keep]] >= 0
        cell = token[keep] * n + rows_of[layers[keep]]
        for name, field in LAYER_SUMS.items():
            total = np.bincount(cell, col[field][keep].astype(np.float64), minlength=m * n)
            total = total.reshape(m, n)
            sums[name] = total if name == "mass" else total.astype(np.int64)
    return LayerNumbers(**{
        name: sums.get(name, np.zeros((m, n), np.float64 if name == "mass" else np.int64))
        for name in LAYER_SUMS})


LAYER_SUMS = {"mass": "substituted_mass", "hits": "n_hit", "selections": "k",
              "fetches": "n_fetch", "substitutions": "n_substitute", "bytes_sync": "bytes_sync"}
""":class:`LayerNumbers`' fields and the event columns they sum."""


def _routed(events: npt.NDArray[Any], rows_of: npt.NDArray[np.int64]) -> tuple[
        npt.NDArray[np.int64], npt.NDArray[np.bool_], npt.NDArray[Any]]:
    """Rows of MoE layers only: (heatmap row per event as a column, j < k mask, events)."""
    layers = events["layer"].astype(np.int64)
    ok = (layers >= 0) & (layers < len(rows_of))
    ok[ok] = rows_of[layers[ok]] >= 0
    ev = events[ok]
    rows = rows_of[ev["layer"].astype(np.int64)][:, None]
    width = ev["ids"].shape[1] if len(ev) else 0
    in_k = np.arange(width)[None, :] < ev["k"][:, None]
    return np.broadcast_to(rows, in_k.shape), in_k, ev


def cell_states(resident: npt.NDArray[np.bool_], events: npt.NDArray[Any],
                rows_of: npt.NDArray[np.int64],
                ram: npt.NDArray[np.bool_] | None = None) -> npt.NDArray[np.uint8]:
    """Heatmap states (layers x experts) of one token, from residency and its events.

    Where one expert plays two parts in a token, what the token computed with it (hit,
    fetch, used as substitute) wins over "substituted away". ``ram`` (the RAM tier's
    masks, same shape; None with the tier off) splits the experts outside VRAM into
    in RAM and on disk only.
    """
    outside = NOT_RESIDENT if ram is None else np.where(ram, IN_RAM, ON_DISK)
    cells = np.where(resident, RESIDENT, outside).astype(np.uint8)
    if len(events) == 0:
        return cells
    n_expert = cells.shape[1]
    rows, in_k, ev = _routed(events, rows_of)
    ids, used, action = ev["ids"], ev["used_ids"], ev["action"]
    valid = in_k & (ids >= 0) & (ids < n_expert)
    away = valid & (action == SUBSTITUTE)
    cells[rows[away], ids[away]] = SUBSTITUTED_AWAY
    used_ok = away & (used >= 0) & (used < n_expert)
    cells[rows[used_ok], used[used_ok]] = USED_AS_SUBSTITUTE
    hit = valid & (action == HIT)
    cells[rows[hit], ids[hit]] = HIT_NOW
    fetch = valid & (action == FETCH)
    cells[rows[fetch], ids[fetch]] = FETCHED_NOW
    return cells


def used_experts(events: npt.NDArray[Any], rows_of: npt.NDArray[np.int64],
                 n_expert: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """(rows, experts) that actually computed for this token (hits, fetches, substitutes)."""
    if len(events) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    rows, in_k, ev = _routed(events, rows_of)
    used = ev["used_ids"].astype(np.int64)
    ok = in_k & (used >= 0) & (used < n_expert)
    return rows[ok], used[ok]


def used_experts_many(events: Sequence[npt.NDArray[Any]], rows_of: npt.NDArray[np.int64],
                      n_expert: int) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64],
                                              npt.NDArray[np.int64]]:
    """:func:`used_experts` of many tokens at once: (rows, experts, each one's token
    position in ``events``), in the order one token after another would give them."""
    none = np.zeros(0, np.int64)
    joined = _fields(events, ("layer", "k", "used_ids"))
    if joined is None:  # unlike rows: one token at a time
        parts = [(*used_experts(ev, rows_of, n_expert), i) for i, ev in enumerate(events)
                 if len(ev)]
        if not parts:
            return none, none, none
        return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
                np.concatenate([np.full(len(p[0]), p[2], np.int64) for p in parts]))
    filled, col = joined
    if not filled:
        return none, none, none
    token = np.repeat(np.asarray(filled, np.int64), [len(events[i]) for i in filled])
    layers = col["layer"].astype(np.int64)
    ok = (layers >= 0) & (layers < len(rows_of))
    ok[ok] = rows_of[layers[ok]] >= 0
    rows = rows_of[layers[ok]][:, None]
    k = col["k"][ok]
    width = min(int(k.max(initial=0)), col["used_ids"].shape[1])  # the columns any row uses
    used = col["used_ids"][ok][:, :width].astype(np.int64)
    in_k = np.arange(width)[None, :] < k[:, None]
    take = in_k & (used >= 0) & (used < n_expert)
    return (np.broadcast_to(rows, in_k.shape)[take], used[take],
            np.broadcast_to(token[ok][:, None], in_k.shape)[take])


@dataclass(frozen=True)
class AnswerSummary:
    """The finished answer's stats (a copy of the engine's ``AnswerStats``)."""

    n_prompt_tokens: int
    n_tokens: int
    time_to_first_token_s: float
    seconds: float
    tokens_per_second: float
    hit_rate: float
    substituted_fraction: float
    mass_per_token: float
    fetched_mb_per_token: float
    policies: tuple[str, ...]
    stop_reason: str
    summary: str
    audit: str = ""
    """The answer's audited quality cost in the stats lines' words ("": not audited)."""

    def as_dict(self) -> dict[str, Any]:
        return {name: (list(v) if isinstance(v, tuple) else v)
                for name, v in self.__dict__.items()}
