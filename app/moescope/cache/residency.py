"""Which experts are resident after each token, rebuilt from a trace: one code path for the
recorder (which must know what a reader will rebuild) and every reader (the trace window).

The event rows say most of it: what a token hit, fetched or used as a substitute is
resident, admitted experts enter and evicted ones leave. Two things change residency
without an event row: a PSR prefetch (``moecache_prefetch``) and a budget shrink (the core
evicts by its eviction rule). For those the recorder compares :class:`Residency`, advanced
exactly as a reader will advance it, with the cache's real resident sets after every token
and writes the real mask of each MoE layer that differs (the token's optional ``resident``
field, see ``docs/trace-format.md``). A reader applies those masks after the token's rows,
so the rebuilt residency equals the live one token by token. A trace written before the
masks has none: a shrink there falls back to keeping the most recently used experts.

Masks travel as hexadecimal bit sets (bit ``e`` is expert ``e``): a fixed, short text of
``ceil(n_expert / 4)`` digits at most, cheaper to write and to read than an id list for
the layers PSR touches on every token.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from moescope.cache.native import FETCH, HIT, SUBSTITUTE

_HEX = re.compile(r"[0-9a-f]+")
_LAST_ACTION = max(HIT, FETCH, SUBSTITUTE)
"""The computing actions are 0 to this (``enum moecache_action``)."""


def mask_to_hex(mask: npt.ArrayLike) -> str:
    """A boolean expert mask as lowercase hex, bit ``e`` = expert ``e`` (``"0"`` if empty)."""
    bits = np.packbits(np.asarray(mask, dtype=np.bool_), bitorder="little")
    return format(int.from_bytes(bits.tobytes(), "little"), "x")


def mask_from_hex(text: str, n_expert: int) -> npt.NDArray[np.bool_]:
    """Inverse of :func:`mask_to_hex`; ``ValueError`` for anything but lowercase hex digits
    (``int(..., 16)`` alone would accept ``0x``, ``_`` and blanks) or a bit past the last
    expert, so a corrupted mask is refused instead of silently drawn."""
    if not isinstance(text, str) or _HEX.fullmatch(text) is None:
        raise ValueError(f"mask {text!r} is not lowercase hexadecimal")
    value = int(text, 16)
    if value >> n_expert:
        raise ValueError(f"mask {text!r} names an expert past the model's {n_expert}")
    raw = np.frombuffer(value.to_bytes((n_expert + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:n_expert].astype(np.bool_)


def masks_to_json(masks: Mapping[int, npt.ArrayLike]) -> list[list[Any]]:
    """``[[layer, hex], ...]`` in layer order (the token's ``resident`` field)."""
    return [[int(layer), mask_to_hex(masks[layer])] for layer in sorted(masks)]


def masks_from_json(items: Any, moe_layers: Sequence[int], n_expert: int,
                    slots: int) -> dict[int, npt.NDArray[np.bool_]]:
    """Inverse of :func:`masks_to_json` (``ValueError`` naming the field on a layer that
    is not a MoE layer or repeats, a malformed mask, or more residents than ``slots``,
    which no cache can hold)."""
    if not isinstance(items, list):
        raise ValueError("resident must be a list of [layer, hex mask]")
    layers = set(moe_layers)
    out: dict[int, npt.NDArray[np.bool_]] = {}
    for item in items:
        if not isinstance(item, list) or len(item) != 2 or type(item[0]) is not int:
            raise ValueError(f"resident entry {item!r} is not [layer, hex mask]")
        layer = item[0]
        if layer not in layers or layer in out:
            raise ValueError(f"resident layer {layer} is not a MoE layer, or repeats")
        try:
            mask = mask_from_hex(item[1], n_expert)
        except ValueError as err:
            raise ValueError(f"resident layer {layer}: {err}") from None
        if int(mask.sum()) > slots:
            raise ValueError(f"resident layer {layer} has {int(mask.sum())} experts, more "
                             f"than the token's {slots} slots")
        out[layer] = mask
    return out


def read_resident(cache: Any, moe_layers: Sequence[int], n_expert: int
                  ) -> npt.NDArray[np.bool_]:
    """The cache's real resident masks, one row per MoE layer, as the live panel reads them.

    Takes the fastest accessor ``cache`` has: :meth:`ExpertCache.resident_masks` (one
    buffer for all layers), else ``layer_experts(layer)``, else ``resident(layer)`` sets
    (any object shaped like the engine's cache)."""
    bulk = getattr(cache, "resident_masks", None)
    if bulk is not None:
        return np.asarray(bulk(moe_layers), dtype=np.bool_)
    out = np.zeros((len(moe_layers), n_expert), dtype=np.bool_)
    per_layer = getattr(cache, "layer_experts", None)
    for row, layer in enumerate(moe_layers):
        if per_layer is not None:
            out[row] = np.asarray(per_layer(layer))[:n_expert] >= 0
        else:
            ids = np.fromiter(cache.resident(layer), dtype=np.int64)
            out[row, ids[(ids >= 0) & (ids < n_expert)]] = True
    return out


def read_ram_resident(cache: Any, moe_layers: Sequence[int], n_expert: int
                      ) -> npt.NDArray[np.bool_]:
    """The RAM tier's masks, one row per MoE layer: True where an expert is in the tier
    (read from ``ExpertCache.layer_ram``; all False with the tier off)."""
    out = np.zeros((len(moe_layers), n_expert), dtype=np.bool_)
    for row, layer in enumerate(moe_layers):
        out[row] = np.asarray(cache.layer_ram(layer))[:n_expert] >= 0
    return out


class RecordedToken(Protocol):
    """What :meth:`Residency.advance_token` reads from a token (``trace.TokenRecord``)."""

    index: int
    changes: Sequence[Any]
    """Changes with ``kind`` and ``slots`` (``trace.Change``)."""
    events: npt.NDArray[Any]


class Residency:
    """The resident mask (MoE layers x experts) rebuilt token by token from a trace.

    ``advance_token`` applies a token's budget changes and event rows; ``apply_masks`` the
    real masks the recorder wrote for it. The recorder and the readers call exactly these,
    in this order, so the recorder knows which layers a reader would get wrong.
    """

    def __init__(self, moe_layers: Sequence[int], n_expert: int, slots: int) -> None:
        self.moe_layers = tuple(int(x) for x in moe_layers)
        self.rows_of = {layer: i for i, layer in enumerate(self.moe_layers)}
        self._row_table = np.full(max(self.moe_layers, default=-1) + 1, -1, np.int64)
        """Model layer index -> residency row (-1: not a MoE layer)."""
        self._row_table[list(self.moe_layers)] = np.arange(len(self.moe_layers))
        self.n_expert = int(n_expert)
        self.slots = int(slots)
        """Slots per layer in force (the header's, then every recorded resize)."""
        self.resident = np.zeros((len(self.moe_layers), self.n_expert), dtype=np.bool_)
        self.last_use = np.full(self.resident.shape, -1, dtype=np.int64)
        """The step that last computed each expert: what a guessed shrink keeps."""

    def advance_token(self, token: RecordedToken,
                      events: npt.NDArray[Any] | None = None) -> bool:
        """:meth:`advance` with a recorded token's resizes, rows and step (its index + 1:
        the step the trace window plots it at, and the one ``last_use`` remembers);
        ``events``: its rows, where the caller has them (default ``token.events``)."""
        slots = [int(c.slots) for c in token.changes
                 if c.kind == "slots" and c.slots is not None]
        return self.advance(slots, token.events if events is None else events,
                            token.index + 1)

    def advance(self, slot_changes: Sequence[int], events: npt.NDArray[Any],
                step: int) -> bool:
        """One token: its budget resizes in order (``slot_changes``), then its rows.

        Returns True when a resize shrank the cache, whose evictions have no rows: then
        the rebuilt residency is a guess (most recently used kept) unless the token also
        carries the real masks.
        """
        shrunk = False
        for slots in slot_changes:
            if slots < self.slots:
                self.shrink(slots)
                shrunk = True
            self.slots = int(slots)
        self.apply_rows(events, step)
        return shrunk

    def apply_rows(self, events: npt.NDArray[Any], step: int) -> None:
        """What one token's rows did to residency: computed experts are resident, admitted
        ones enter, evicted ones leave (in row order, as the core decided them).

        Vectorized, because the recorder runs this on the decode thread for every token:
        rows of different layers do not interact, so the rows are applied in waves (the
        first row of every layer, then every layer's second row, ...), each wave at once.
        A decode token has one row per layer: one wave.
        """
        if len(events) == 0:
            return
        layers = events["layer"].astype(np.int64)
        table = self._row_table
        inside = (layers >= 0) & (layers < len(table))
        rows = np.where(inside, table[np.where(inside, layers, 0)], -1)
        keep = rows >= 0
        if not keep.all():
            events, rows = events[keep], rows[keep]
            if not len(rows):
                return
        if np.bincount(rows).max() == 1:  # no layer twice: one wave
            self._apply_wave(events, rows, step)
            return
        wave = np.zeros(len(rows), dtype=np.int64)
        seen: dict[int, int] = {}
        for i, r in enumerate(rows.tolist()):
            wave[i] = seen.get(r, 0)
            seen[r] = wave[i] + 1
        for w in range(int(wave.max()) + 1):
            sel = np.flatnonzero(wave == w)
            self._apply_wave(events[sel], rows[sel], step)

    def _apply_wave(self, events: npt.NDArray[Any], rows: npt.NDArray[np.int64],
                    step: int) -> None:
        """Rows of distinct layers (``rows``: their residency rows), all at once."""
        n = self.n_expert
        resident = self.resident.reshape(-1)  # views: one flat index per (row, expert)
        last_use = self.last_use.reshape(-1)
        ids = events["ids"]
        col = np.arange(ids.shape[1])
        base = rows[:, None] * n
        action = events["action"]
        computed = np.where(action == SUBSTITUTE, events["used_ids"], ids)
        # HIT, FETCH and SUBSTITUTE are 0, 1 and 2: the computing actions are that range
        ok = ((col < events["k"][:, None]) & (action >= 0) & (action <= _LAST_ACTION)
              & (computed >= 0) & (computed < n))
        flat = (base + computed)[ok]
        resident[flat] = True
        last_use[flat] = step
        for name, count, value in (("evicted", "n_evict", False), ("admitted", "n_admit", True)):
            counts = events[count]
            if not counts.any():
                continue
            ids = events[name]
            ok = (col < counts[:, None]) & (ids >= 0) & (ids < n)
            resident[(base + ids)[ok]] = value

    def shrink(self, slots: int) -> None:
        """A budget shrink evicts without event rows: keep the most recently used (a guess,
        corrected by the token's masks where the recorder wrote them)."""
        for r in range(self.resident.shape[0]):
            ids = np.flatnonzero(self.resident[r])
            if len(ids) > slots:
                order = ids[np.argsort(-self.last_use[r, ids], kind="stable")]
                self.resident[r, order[slots:]] = False

    def differing(self, real: npt.NDArray[np.bool_]) -> dict[int, npt.NDArray[np.bool_]]:
        """The layers (model index -> real mask, a copy) where ``real`` (one row per MoE
        layer) differs from the rebuilt residency: what the recorder writes."""
        rows = np.flatnonzero((real != self.resident).any(axis=1))
        return {self.moe_layers[r]: real[r].copy() for r in rows}

    def apply_masks(self, masks: Mapping[int, npt.NDArray[np.bool_]]) -> None:
        """Take the recorded real masks (model layer index -> mask) as they are. Experts that
        a mask makes resident keep their last use (a prefetched expert has none yet)."""
        for layer, mask in masks.items():
            r = self.rows_of.get(int(layer))
            if r is not None:
                self.resident[r] = mask
