"""PSR's prefetch counters per token, and the one prefetch accuracy every view reports.

The native core counts prefetches only cumulatively, per layer (``moecache_layer_stats``:
``prefetches``, the experts ``moecache_prefetch`` brought in, and ``prefetch_hits``, those
the router then computed before they were evicted); it writes no event row for them. The
live cache panel, the session trace and the simulator all need the same numbers *per
token*, so they all take them the same way, defined once here:

* :class:`PrefetchCounters` reads the cumulative counters of the MoE layers (fast: it is
  read after every token of a recording and of every PSR replay);
* :func:`prefetch_delta` turns two readings into one token's counts (a total that went
  down was reset by ``moecache_reset_stats`` and counts anew);
* :class:`PrefetchMeter` is the two together, read once per token: the engine reads it on
  the decode thread into each ``TokenStats`` (which the window and the recorder consume)
  and the replay reads it after each replayed token;
* :class:`PrefetchSummary` is prefetch accuracy over a set of tokens: hits / prefetches,
  capped at 1 (a hit can land tokens after its prefetch, so a window can hold more hits
  than prefetches), None when nothing was prefetched.

Qt-free and engine-free, so the engine and ``sim`` (the replay) share it.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache.native import CLayerStats


@dataclass(frozen=True)
class PrefetchSummary:
    """PSR over some prefetching tokens: how many experts it brought in, and how many of
    those the router then used (prefetch accuracy = hits / prefetches)."""

    tokens: int
    prefetches: int
    hits: int

    @property
    def per_token(self) -> float:
        return self.prefetches / self.tokens if self.tokens else 0.0

    @property
    def accuracy(self) -> float | None:
        """None before anything was prefetched. A hit can land a few tokens after its
        prefetch, so a window's ratio is capped at 1."""
        return min(1.0, self.hits / self.prefetches) if self.prefetches else None


def prefetch_delta(totals: npt.NDArray[np.int64],
                   base: npt.NDArray[np.int64] | None) -> npt.NDArray[np.int64]:
    """One token's counts from the cumulative ``totals`` after it and ``base`` before it
    (same shape; None: nothing read before, so everything counted so far is this token's).
    Where a total went down the counters were reset, and the total is what came since."""
    if base is None or base.shape != totals.shape:
        return totals.copy()
    return np.where(totals >= base, totals - base, totals)


class PrefetchCounters:
    """Reads the cumulative ``(prefetches, prefetch_hits)`` of ``layers`` from a core.

    ``cache`` is an :class:`~moescope.cache.native.ExpertCache` (read through its library
    with one reused struct: ~0.5 µs a layer instead of ~5 µs through ``layer_stats``,
    which matters after every token of a long replay) or anything with
    ``layer_stats(layer)`` returning an object with ``prefetches`` and ``prefetch_hits``.
    """

    def __init__(self, cache: Any, layers: Sequence[int]) -> None:
        self.cache = cache
        self.layers = tuple(int(x) for x in layers)
        self._stats = CLayerStats()
        lib = getattr(cache, "_lib", None)
        self._fn = getattr(lib, "moecache_get_layer_stats", None) if lib is not None else None

    def read(self) -> npt.NDArray[np.int64]:
        """``(2, len(layers))``: row 0 prefetches, row 1 prefetch hits, cumulative."""
        out = np.empty((2, len(self.layers)), dtype=np.int64)
        if self._fn is not None:
            handle, ref, stats = self.cache.handle, ctypes.byref(self._stats), self._stats
            for i, layer in enumerate(self.layers):
                self._fn(handle, layer, ref)
                out[0, i], out[1, i] = stats.prefetches, stats.prefetch_hits
            return out
        for i, layer in enumerate(self.layers):
            s = self.cache.layer_stats(layer)
            out[0, i], out[1, i] = s.prefetches, s.prefetch_hits
        return out


class PrefetchMeter:
    """One token's PSR counters per layer: reads the cumulative counters after each token
    and keeps that reading as the next token's base."""

    def __init__(self, cache: Any, layers: Sequence[int]) -> None:
        self.counters = PrefetchCounters(cache, layers)
        self._base: npt.NDArray[np.int64] | None = None

    def take(self) -> npt.NDArray[np.int64]:
        """``(2, len(layers))``: this token's prefetches (row 0) and hits (row 1)."""
        totals = self.counters.read()
        delta = prefetch_delta(totals, self._base)
        self._base = totals
        return delta


def summarize(counts: Sequence[tuple[npt.ArrayLike, npt.ArrayLike]]) -> PrefetchSummary:
    """:class:`PrefetchSummary` of tokens given as ``(prefetches, hits)`` (per layer or
    totals): the tokens counted are exactly those passed, so pass only the tokens whose
    policy prefetched."""
    return PrefetchSummary(tokens=len(counts),
                           prefetches=int(sum(int(np.sum(p)) for p, _ in counts)),
                           hits=int(sum(int(np.sum(h)) for _, h in counts)))


__all__ = ["PrefetchCounters", "PrefetchMeter", "PrefetchSummary", "prefetch_delta", "summarize"]
