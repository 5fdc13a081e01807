"""The trace's records and their JSON form: header, token, change, router input.

Every record serialises itself with the helpers beside it (events, routes, prefetch
counters, policy); reading them back, with every field bounded, is :mod:`.validate`'s.
"""

from __future__ import annotations

import base64
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from moescope.cache.audit import AuditRecord
from moescope.cache.native import EVENT_DTYPE, MAX_K
from moescope.cache.native import rank_predictions as native_rank_predictions
from moescope.cache.policy import PREFETCH_TOP_K, THETA_DISK_AS_THETA, MissRule, Policy
from moescope.cache.residency import masks_to_json
from moescope.util.errors import MoEScopeError
from moescope.util.words import utf8_name

TRACE_FORMAT = "moescope-trace"
TRACE_VERSION = 1
"""Schema version written in the header; readers refuse a newer major version."""

RouterDtype = Literal["f32", "f16"]
PHASES = ("prefill", "decode")
TIMING_KEYS = ("route_us", "sync_copy_us", "async_copy_us", "wait_us", "n_sync", "n_async")
JOIN_THREADS = 4
"""Threads joining a long trace's probabilities into one array, at most..."""
JOIN_SLICE_BYTES = 64 << 20
"""...one per this many bytes of the array."""
EVENT_ROWS_CHUNK = 4096
"""Rows :meth:`TraceColumns.event_rows` lays out at once when every row's are not (3.5 MB:
about 85 tokens of a 48-layer model, read one token after another)."""

_EVENT_SCALARS = ("step", "layer", "token", "k", "substituted_mass", "n_hit", "n_fetch",
                  "n_substitute", "n_admit", "n_evict", "bytes_sync", "bytes_async", "n_disk",
                  "bytes_disk")


class TraceFormatError(MoEScopeError):
    """A trace file is not a valid MoEScope trace; the message names the line."""


# --------------------------------------------------------------------------- header


@dataclass(frozen=True)
class TraceModel:
    """The model facts a replay needs (and a reader uses to tell models apart)."""

    file_name: str
    metadata_sha256: str
    architecture: str
    n_layers: int
    moe_layers: tuple[int, ...]
    n_expert: int
    top_k: int
    bytes_per_expert: tuple[int, ...]
    """Bytes one copy of an expert moves, per entry of ``moe_layers`` (the engine's unit:
    the expert's weight matrices, not biases or scales)."""
    non_expert_bytes: int = 0
    name: str | None = None

    def expert_bytes(self, layer: int) -> int:
        """Bytes of one expert of ``layer`` (0 for a dense layer)."""
        try:
            return self.bytes_per_expert[self.moe_layers.index(layer)]
        except ValueError:
            return 0

    @classmethod
    def from_info(cls, info: Any) -> TraceModel:
        """From a :class:`~moescope.model.gguf_info.ModelInfo`; bytes per expert count only
        the ``*_exps.weight`` tensors, which is what the engine's slots hold and copy."""
        per_layer = []
        for layer in info.moe_layers:
            tensors = info.expert_tensors.get(layer, ())
            weights = sum(t.bytes_per_expert for t in tensors if t.part == "weight")
            per_layer.append(int(weights or info.bytes_per_expert[layer]))
        return cls(
            file_name=utf8_name(str(info.file_name)),
            metadata_sha256=str(info.metadata_sha256),
            architecture=str(info.architecture), n_layers=int(info.n_layers),
            moe_layers=tuple(int(x) for x in info.moe_layers), n_expert=int(info.n_expert),
            top_k=int(info.top_k), bytes_per_expert=tuple(per_layer),
            non_expert_bytes=int(info.non_expert_bytes), name=info.name,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "file_name": self.file_name, "metadata_sha256": self.metadata_sha256,
            "architecture": self.architecture, "name": self.name, "n_layers": self.n_layers,
            "moe_layers": list(self.moe_layers), "n_expert": self.n_expert,
            "top_k": self.top_k, "bytes_per_expert": list(self.bytes_per_expert),
            "non_expert_bytes": self.non_expert_bytes,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TraceModel:
        return cls(
            file_name=utf8_name(str(d["file_name"])),
            metadata_sha256=str(d["metadata_sha256"]),
            architecture=str(d["architecture"]), n_layers=int(d["n_layers"]),
            moe_layers=tuple(int(x) for x in d["moe_layers"]), n_expert=int(d["n_expert"]),
            top_k=int(d["top_k"]), bytes_per_expert=tuple(int(x) for x in d["bytes_per_expert"]),
            non_expert_bytes=int(d.get("non_expert_bytes") or 0), name=d.get("name"),
        )


@dataclass(frozen=True)
class TraceHeader:
    """The first line of a trace: model, starting cache state, software, machine."""

    model: TraceModel
    budget: str
    slots_per_layer: int
    policy: Policy
    router_inputs: RouterDtype | None = "f32"
    initial_step: int = 0
    """The core's step when recording began; a replay starts from this step."""
    initial_resident: int = 0
    """Experts resident (all layers) when recording began; 0 means the replay, which starts
    from an empty cache, can be exact."""
    software: Mapping[str, str | None] = field(default_factory=dict)
    machine: Mapping[str, Any] = field(default_factory=dict)
    created: str = ""
    version: int = TRACE_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "header", "format": TRACE_FORMAT, "version": self.version,
            "created": self.created, "model": self.model.to_json(), "budget": self.budget,
            "slots_per_layer": self.slots_per_layer, "policy": policy_to_json(self.policy),
            "router_inputs": self.router_inputs,
            "initial_state": {"step": self.initial_step, "resident": self.initial_resident},
            "software": dict(self.software), "machine": dict(self.machine),
        }


def policy_to_json(policy: Policy) -> dict[str, Any]:
    """A policy as readable JSON (enum names, not numbers) that round-trips exactly."""
    return {
        "name": policy.name, "miss_rule": policy.miss_rule.name.lower(),
        "theta": policy.theta, "eviction": policy.eviction.name.lower(),
        "half_life": policy.half_life, "admission": policy.admission, "beta": policy.beta,
        "substitute_weight": policy.substitute_weight.name.lower(),
        "bonus": policy.bonus, "prefetch": policy.prefetch, "theta_disk": policy.theta_disk,
        "fill_free": policy.fill_free,
    }



# --------------------------------------------------------------------------- records


ANSWER_NOW_NOTE = "answer now"
"""The note on the first token of a generation that continues a thinking model's answer
after "Answer now" closed its thoughts: the closing text is written into the prompt, not
generated, so the token texts alone cannot show where that answer began."""


def policy_label(policy: Policy) -> str:
    """A preset's name, or for any other policy its rule's parameters in a few characters
    ("custom θ0.30 disk0.30 β0.50 pf3"): Custom changes in a row must not look alike."""
    if policy.name and policy.name != "custom":
        return policy.name
    parts = ["custom"]
    if policy.miss_rule == MissRule.ROUTING_BONUS:
        parts.append(f"bonus{policy.bonus:.2f}")
    elif policy.miss_rule == MissRule.THRESHOLD:
        parts.append(f"θ{policy.theta:.2f}")
        if policy.theta_disk != THETA_DISK_AS_THETA:
            parts.append(f"disk{policy.theta_disk:.2f}")
    else:
        parts.append(policy.miss_rule.name.lower().replace("_", "-"))
    if policy.admission:
        parts.append(f"β{policy.beta:.2f}")
    if policy.prefetch:
        top_k = policy.prefetch == PREFETCH_TOP_K
        parts.append("pf" + ("top-k" if top_k else str(policy.prefetch)))
    if not policy.fill_free and not policy.exact:
        parts.append("nofill")
    return " ".join(parts)


@dataclass(frozen=True)
class Change:
    """A policy or budget change that took effect at a token (applied before its decode).

    ``error`` is a requested change that failed (a budget that does not fit; ``text`` says
    why): the engine reports it as such, and the file stores it as a ``note``."""

    kind: Literal["policy", "slots", "note", "error"]
    policy: Policy | None = None
    slots: int | None = None
    text: str = ""

    @property
    def label(self) -> str:
        """The short text the live window's markers show for the same change."""
        if self.kind == "policy" and self.policy is not None:
            return f"policy={policy_label(self.policy)}"
        if self.kind == "slots":
            return f"slots={self.slots}"
        return self.text

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": "note" if self.kind == "error" else self.kind}
        if self.policy is not None:
            out["policy"] = policy_to_json(self.policy)
        if self.slots is not None:
            out["slots"] = self.slots
        if self.text:
            out["text"] = self.text
        return out


@dataclass(frozen=True)
class RouterInput:
    """The exact inputs the core got for one event row: what a replay feeds back."""

    row: int
    probs: npt.NDArray[np.float32]
    weights: npt.NDArray[np.float32]
    """Gate weights as the router produced them (before normalization or any decision)."""
    ids: npt.NDArray[np.int32]
    next_layer: int = -1
    """PSR: the MoE layer this row's prediction is for (-1: none recorded)."""
    predicted: npt.NDArray[np.int32] | None = None
    """PSR: that layer's experts as its router ranked them from this layer's input, best
    first (the first :data:`PREDICTED_KEEP`), which is all ``moecache_prefetch`` uses."""


class RouteBlock(Mapping[int, RouterInput]):
    """A token's router inputs as blocks, one row each, as the recorder reads them (every
    layer at once): ``rows`` [m] the event rows, ascending; ``probs`` [m, experts];
    ``weights`` and ``ids`` [m, top_k]; ``next_layer`` [m] (-1: no prediction);
    ``predicted`` [m, width], the first ``n_pred[i]`` of row i its ranked prediction. A
    writer fills its columns from the blocks at once; as a mapping (event row ->
    :class:`RouterInput`) it reads as the dict of rows it stands for."""

    __slots__ = (
        "_at",
        "ids",
        "n_pred",
        "next_layer",
        "predicted",
        "probs",
        "rows",
        "weights",
    )

    def __init__(self, rows: npt.NDArray[np.intp], probs: npt.NDArray[np.float32],
                 weights: npt.NDArray[np.float32], ids: npt.NDArray[np.int32],
                 next_layer: npt.NDArray[np.int32], predicted: npt.NDArray[np.int32],
                 n_pred: npt.NDArray[np.int32]) -> None:
        self.rows, self.probs, self.weights, self.ids = rows, probs, weights, ids
        self.next_layer, self.predicted, self.n_pred = next_layer, predicted, n_pred
        self._at = {row: i for i, row in enumerate(rows.tolist())}

    def __getitem__(self, row: int) -> RouterInput:
        i = self._at[row]
        n = int(self.n_pred[i])
        return RouterInput(row=row, probs=self.probs[i], weights=self.weights[i],
                           ids=self.ids[i], next_layer=int(self.next_layer[i]),
                           predicted=self.predicted[i, :n] if n else None)

    def __iter__(self) -> Iterator[int]:
        return iter(self._at)

    def __len__(self) -> int:
        return len(self._at)

    def __contains__(self, row: object) -> bool:
        return row in self._at


PREDICTED_KEEP = 32
"""How many ranked predictions a trace keeps per row: a replay prefetches exactly for any
``Policy.prefetch`` up to this (the ``psr`` preset prefetches top-k <= 32)."""


def rank_predictions(scores: npt.ArrayLike, keep: int = PREDICTED_KEEP) -> npt.NDArray[np.int32]:
    """Expert ids by descending score, ties by lower id (the core's order), NaN last.
    ``scores`` may be one layer's row or a [layers, experts] block, ranked row by row in
    one call (a token has a prediction per layer: 48 x 512 scores on Qwen3-Next). The core
    ranks them (``moecache_rank_predictions``: moecache_prefetch's own ranking), in under
    half the time numpy's partition and sort took on the recorder's thread."""
    return native_rank_predictions(scores, keep)


@dataclass
class TokenRecord:
    """One token of a trace (see the module docstring)."""

    index: int
    phase: str
    token_id: int
    text: str
    seconds: float
    policy: str
    slots_per_layer: int
    events: npt.NDArray[Any]
    routes: Mapping[int, RouterInput] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    timings: dict[str, int] | None = None
    answer: int = 0
    position: int = 0
    prefetches: npt.NDArray[np.int64] | None = None
    """PSR: experts ``moecache_prefetch`` brought in during this token, per MoE layer (in
    the order of ``model.moe_layers``), whatever the policy (0 where it does not prefetch).
    None: not recorded (a trace written before these counters): unknown, not zero."""
    prefetch_hits: npt.NDArray[np.int64] | None = None
    """PSR: prefetched experts the router first computed during this token (as a hit or
    a substitute), per MoE layer; None exactly when ``prefetches`` is."""
    resident: dict[int, npt.NDArray[np.bool_]] | None = None
    """The cache's real resident mask after this token (model layer index -> ``n_expert``
    booleans), only for the MoE layers where it differs from what the event rows rebuild
    (:class:`~moescope.cache.residency.Residency`): PSR prefetches and budget shrinks
    change residency without rows. None: nothing to correct (or, on a token that shrank
    the budget, a trace written before the masks: its residency is then a guess)."""
    audit: AuditRecord | None = None
    """The step was audited (issue 20): its exact output against the policy's. Extra
    information only: the replay never reads it (audits change no decision)."""

    def to_json(self, router_dtype: RouterDtype | None = "f32",
                moe_layers: Sequence[int] | None = None) -> dict[str, Any]:
        """The token record; ``moe_layers`` (the header's) names the layers of the prefetch
        counters, which are written only when known (see :func:`_prefetch_to_json`)."""
        out: dict[str, Any] = {
            "type": "token", "index": self.index, "answer": self.answer,
            "position": self.position, "phase": self.phase, "token_id": self.token_id,
            "text": self.text, "seconds": self.seconds, "policy": self.policy,
            "slots_per_layer": self.slots_per_layer,
        }
        if self.changes:
            out["changes"] = [c.to_json() for c in self.changes]
        if self.timings is not None:
            out["timings"] = {k: int(self.timings.get(k, 0)) for k in TIMING_KEYS}
        if self.prefetches is not None and self.prefetch_hits is not None:
            if moe_layers is None:
                raise ValueError("prefetch counters need the model's MoE layers to be written")
            out["prefetch"] = _prefetch_to_json(self.prefetches, self.prefetch_hits, moe_layers)
        if self.resident is not None:
            out["resident"] = masks_to_json(self.resident)
        if self.audit is not None:
            out["audit"] = self.audit.to_json()
        out["events"] = _events_to_json(self.events)
        if self.routes and router_dtype is not None:
            routes = list(self.routes.values())
            weights = _f32_lists([r.weights for r in routes])
            out["routes"] = [_route_to_json(r, router_dtype, w)
                             for r, w in zip(routes, weights, strict=True)]
        return out


class TraceColumns:
    """Every row of a trace in flat arrays, as a version-2 reader gets them (no loop per
    row): what the replay and the native batch replay consume directly.

    Row ``r`` belongs to token ``t`` when ``token_rows[t] <= r < token_rows[t + 1]``.
    Where ``exact[r]``, the row's router inputs were recorded: ``probs[r]`` and the raw
    gate weights ``gate[r]``; elsewhere ``gate[r]`` holds the event's normalized weights
    and ``probs[r]`` is zero. ``ids[r]`` are the router's top-k experts.
    ``predicted[r]`` ranks PSR's prediction for layer ``next_layer[r]`` (-1 padded; -1
    layer: none).

    ``events`` may be given as a function that lays the event rows out
    (``EVENT_DTYPE``, 864 bytes a row) when something first asks for them: a reader that
    checked the columns need not lay out every row to open a trace. ``rows(start, stop)``
    lays out only those rows (:meth:`event_rows`), for a reader that looks at a few
    tokens' rows at a time and should not hold every row's (438 MB at 10,000 tokens of
    Qwen3-Next's geometry).
    ``fields``: event-row fields the reader has as columns already (by their
    ``EVENT_DTYPE`` names), read by :meth:`row_field` without laying out the rows.

    ``probs`` may be given as one array per token (views into the reader's memory map,
    ``starts`` their first rows, converted to numpy when first indexed): they are the bulk
    of a trace (98 kB a token at Qwen3-Next's geometry), so they are joined into one array
    only when something asks for ``probs`` (the replay's layout; a sequence with a
    ``join()`` method joins itself, as a Parquet trace's decodes every block at once), and
    :meth:`row_probs` reads a row in place; opening a trace to look at it copies none.
    Such rows are checked (a recorded row's values finite) when first used, not when
    read: touching every page of the map was a third of the time to open a trace; a bad
    value raises :class:`TraceFormatError` naming ``source`` and the row."""

    def __init__(self, events: npt.NDArray[Any] | Callable[[], npt.NDArray[Any]],
                 token_rows: npt.NDArray[np.int64], exact: npt.NDArray[np.bool_],
                 probs: npt.NDArray[Any] | Sequence[npt.NDArray[Any]],
                 gate: npt.NDArray[np.float32], next_layer: npt.NDArray[np.int32] | None = None,
                 predicted: npt.NDArray[Any] | None = None, source: str = "",
                 ids: npt.NDArray[Any] | None = None,
                 starts: npt.NDArray[np.int64] | None = None,
                 fields: Mapping[str, npt.NDArray[Any]] | None = None,
                 rows: Callable[[int, int], npt.NDArray[Any]] | None = None) -> None:
        self._events: npt.NDArray[Any] | None = None
        self._rows = rows
        self._chunk: tuple[int, int, npt.NDArray[Any]] | None = None
        self._lay_out: Callable[[], npt.NDArray[Any]] | None = None
        if callable(events):
            self._lay_out = events
        else:
            self._events = events
        self._ids = ids
        self._fields = fields
        self.source = source
        self.token_rows = token_rows
        self.exact = exact
        self.gate = gate
        self.next_layer = next_layer
        self.predicted = predicted
        self._probs: npt.NDArray[np.float32] | None = None
        self._parts: Sequence[npt.NDArray[Any]] = []
        self._join = threading.Lock()
        self._build = threading.Lock()
        if isinstance(probs, np.ndarray):
            self._probs = np.asarray(probs, dtype=np.float32)
        else:
            self._parts = probs
            if starts is None:
                starts = np.zeros(len(probs) + 1, dtype=np.int64)
                np.cumsum([len(a) for a in probs], out=starts[1:])
            self._starts = starts

    @property
    def events(self) -> npt.NDArray[Any]:
        """Every row as the core's event rows (laid out on first use)."""
        with self._build:
            if self._events is None:
                assert self._lay_out is not None
                self._events = self._lay_out()
                self._lay_out = self._rows = None
                self._chunk = None
            return self._events

    def event_rows(self, start: int, stop: int) -> npt.NDArray[Any]:
        """Rows ``start:stop`` as event rows: a view of every row's where those are laid
        out; else laid out now, :data:`EVENT_ROWS_CHUNK` rows at a time, and not kept for
        the trace (only the last chunk is, for the next token's rows). The same values
        as :attr:`events` ``[start:stop]``."""
        with self._build:
            if self._events is None and self._rows is not None:
                c = self._chunk
                if c is None or not c[0] <= start <= stop <= c[1]:
                    stop_at = min(len(self.exact), max(stop, start + EVENT_ROWS_CHUNK))
                    c = self._chunk = (start, stop_at, self._rows(start, stop_at))
                return c[2][start - c[0]:stop - c[0]]
        return self.events[start:stop]

    @property
    def ids(self) -> npt.NDArray[Any]:
        """Every row's top-k expert ids (from the columns: no event rows laid out)."""
        if self._ids is not None:
            return self._ids
        return self.events["ids"][:, :self.gate.shape[1]]

    def row_field(self, name: str) -> npt.NDArray[Any]:
        """One field of every event row (``step``, ``layer``, ``token``...), from the
        columns where the reader kept it (``fields``): a replay's layout then lays out no
        event rows (864 bytes each)."""
        if self._fields is not None and name in self._fields:
            return self._fields[name]
        return self.events[name]

    @property
    def probs(self) -> npt.NDArray[np.float32]:
        """Every row's probabilities in one float32 array (joined on first use)."""
        with self._join:  # the what-if's worker and another reader may ask at once
            if self._probs is None:
                join = getattr(self._parts, "join", None)  # blocks that join faster whole
                if len(self._parts) and join is None:
                    probs = self._joined(list(self._parts))
                else:
                    joined = join() if join is not None else \
                        np.zeros((0, self.gate.shape[1]), np.float32)
                    probs = np.asarray(joined, dtype=np.float32)
                    self._check(probs, 0)
                self._probs = probs
                self._parts = []
            return self._probs

    def _joined(self, parts: list[npt.NDArray[Any]]) -> npt.NDArray[np.float32]:
        """``parts`` copied into one array and checked, a slice of them per thread (up to
        four, one per 64 MiB): the copy out of the memory map into fresh memory is the
        whole cost of a join (a second at 10,000 tokens of Qwen3-Next, most of it the
        kernel providing the pages), and both parallelize."""
        starts = np.zeros(len(parts) + 1, dtype=np.int64)
        np.cumsum([len(a) for a in parts], out=starts[1:])
        out = np.empty((int(starts[-1]), *parts[0].shape[1:]), dtype=np.float32)
        n = int(min(JOIN_THREADS, os.cpu_count() or 1, 1 + out.nbytes // JOIN_SLICE_BYTES,
                    len(parts)))

        def fill(i: int) -> None:
            a, b = len(parts) * i // n, len(parts) * (i + 1) // n
            part = out[starts[a]:starts[b]]
            np.concatenate(parts[a:b], out=part, casting="unsafe")
            self._check(part, int(starts[a]))

        if n == 1:
            fill(0)
        else:  # a bad row raises from the first slice holding one, as a whole check would
            with ThreadPoolExecutor(n) as pool:
                list(pool.map(fill, range(n)))
        return out

    def row_probs(self, r: int) -> npt.NDArray[np.float32]:
        """Row ``r``'s probabilities, read in place when the rows were not joined yet."""
        with self._join:
            joined, parts = self._probs, self._parts
        if joined is not None:
            return joined[r]
        part = int(np.searchsorted(self._starts, r, side="right")) - 1
        row = np.asarray(parts[part][r - int(self._starts[part])], dtype=np.float32)
        self._check(row[None, :], r)
        return row

    def _check(self, probs: npt.NDArray[np.float32], first: int) -> None:
        """Rows ``first`` on: a recorded row's probabilities must all be finite (a sum is
        finite only if every value is; rows are looked at one by one only if not)."""
        with np.errstate(over="ignore", invalid="ignore"):  # inf - inf, 3e38 + 3e38: no
            total = probs.sum(dtype=np.float32)  # RuntimeWarning above the one line
        if not len(probs) or np.isfinite(total):
            return
        bad = self.exact[first:first + len(probs)] & ~np.isfinite(probs).all(axis=1)
        if bad.any():
            where = f"{self.source}: " if self.source else ""
            raise TraceFormatError(f"{where}row {first + int(np.argmax(bad))}.probs hold a "
                                   f"value that is not finite")

    @classmethod
    def empty(cls, events: npt.NDArray[Any], token_rows: npt.NDArray[np.int64]
              ) -> TraceColumns:
        return cls(events=events, token_rows=token_rows, exact=np.zeros(0, np.bool_),
                   probs=np.zeros((0, 0), np.float32), gate=np.zeros((0, 0), np.float32))


@dataclass
class Trace:
    """A trace read back: header, complete tokens, the end record if the session closed."""

    header: TraceHeader
    tokens: list[TokenRecord]
    end: dict[str, Any] | None = None
    truncated: bool = False
    """True when the last line was incomplete (the writer was killed mid-token)."""
    path: Path | None = None
    columns: TraceColumns | None = None
    """Version 2: the rows as read, in flat arrays (None for a version-1 trace)."""

    @property
    def total_seconds(self) -> float:
        return float(sum(t.seconds for t in self.tokens))

    def token_sums(self, name: str) -> npt.NDArray[np.int64]:
        """Each token's sum of one whole-number field of its event rows (``bytes_sync``,
        ``n_fetch``...), from the rows' columns where the reader kept that field
        (:meth:`TraceColumns.row_field`: no event rows laid out)."""
        c = self.columns
        if c is not None and len(c.token_rows) == len(self.tokens) + 1:
            col = c.row_field(name)
            total = np.zeros(len(col) + 1, np.int64)
            np.cumsum(col, dtype=np.int64, out=total[1:])
            return total[c.token_rows[1:]] - total[c.token_rows[:-1]]
        return np.fromiter((int(t.events[name].sum()) for t in self.tokens), np.int64,
                           len(self.tokens))

    def events(self) -> npt.NDArray[Any]:
        """Every event row of the trace, in order, as ``EVENT_DTYPE``."""
        if self.columns is not None and len(self.columns.token_rows) == len(self.tokens) + 1:
            return self.columns.events
        parts = [t.events for t in self.tokens if len(t.events)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=EVENT_DTYPE)


def _f32_lists(groups: Sequence[npt.ArrayLike]) -> list[list[float]]:
    """Each group as the shortest decimals that round-trip to the same float32 (``0.15`` not
    ``0.1500000059``). All groups are converted in one numpy call: a token has a group per
    layer, and a Python ``str`` per value was most of the cost of writing it."""
    arrays = [np.asarray(g, dtype=np.float32).ravel() for g in groups]
    if not arrays:
        return []
    flat = [float(v) for v in np.concatenate(arrays).astype(str)]
    out, at = [], 0
    for a in arrays:
        out.append(flat[at:at + a.size])
        at += a.size
    return out


def _events_to_json(events: npt.NDArray[Any]) -> list[dict[str, Any]]:
    """A token's event rows, one dict per row; each column is read out of numpy once for
    all rows (a token has a row per MoE layer: 48 on Qwen3-Next)."""
    if not len(events):
        return []
    cols = {name: events[name].tolist() for name in _EVENT_SCALARS}
    ks = cols["k"]
    cols["substituted_mass"] = _f32_lists([events["substituted_mass"]])[0]
    weights = _f32_lists([w[:k] for w, k in zip(events["weights"], ks, strict=True)])
    arrays = {name: events[name].tolist() for name in ("ids", "action", "used_ids", "slots",
                                                        "admitted", "evicted", "tier")}
    out = []
    for i, k in enumerate(ks):
        d: dict[str, Any] = {name: cols[name][i] for name in _EVENT_SCALARS}
        d["ids"] = arrays["ids"][i][:k]
        d["weights"] = weights[i]
        d["action"] = arrays["action"][i][:k]
        d["used_ids"] = arrays["used_ids"][i][:k]
        d["slots"] = arrays["slots"][i][:k]
        d["tier"] = arrays["tier"][i][:k]
        d["admitted"] = arrays["admitted"][i][:min(cols["n_admit"][i], MAX_K)]
        d["evicted"] = arrays["evicted"][i][:min(cols["n_evict"][i], MAX_K)]
        out.append(d)
    return out



def _route_to_json(r: RouterInput, dtype: RouterDtype,
                   weights: list[float]) -> dict[str, Any]:
    """One row's router inputs; ``weights`` are its gate weights as ``_f32_lists`` wrote
    them (converted for all rows of the token at once)."""
    probs = np.asarray(r.probs, dtype=np.float32).astype("<f2" if dtype == "f16" else "<f4")
    out: dict[str, Any] = {
        "row": r.row, "ids": np.asarray(r.ids).tolist(), "weights": weights,
        "probs_dtype": dtype, "probs": base64.b64encode(probs.tobytes()).decode("ascii"),
    }
    if r.predicted is not None and r.next_layer >= 0:
        out["next_layer"] = int(r.next_layer)
        out["predicted"] = np.asarray(r.predicted).tolist()
    return out



def _prefetch_to_json(prefetches: npt.ArrayLike, hits: npt.ArrayLike,
                      moe_layers: Sequence[int]) -> list[list[int]]:
    """``[[layer, prefetches, hits], ...]`` for the MoE layers with a nonzero count, in layer
    order; ``[]`` when nothing was prefetched or hit. Sparse because most tokens of most
    sessions prefetch nothing (every policy but PSR), and a present empty list still says
    "recorded: zero", unlike an absent field ("unknown")."""
    pf = np.asarray(prefetches, dtype=np.int64).ravel()
    h = np.asarray(hits, dtype=np.int64).ravel()
    if not len(pf) == len(h) == len(moe_layers):
        raise ValueError(f"prefetch counters have {len(pf)}/{len(h)} entries for "
                         f"{len(moe_layers)} MoE layers")
    return [[int(layer), int(a), int(b)]
            for layer, a, b in zip(moe_layers, pf, h, strict=True) if a or b]
