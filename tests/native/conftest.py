"""Fixtures for the native expert-cache core tests: small caches and hand-made router rows.

A router row here is what one MoE layer's router gives for one token: ``ids`` in router
order with their gate ``weights``, and ``probs`` over every expert. Experts that are not
selected get small probabilities that decrease with the id (0 most likely), so which
resident expert becomes a substitute is predictable unless a test says otherwise.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt
import pytest

from moescope.cache.native import ExpertCache, NativeLibraryNotFoundError, RouteResult, find_library
from moescope.cache.policy import Policy

N_EXPERTS = 16

try:
    find_library()
    _MISSING: str | None = None
except NativeLibraryNotFoundError as err:  # pragma: no cover - depends on the build
    _MISSING = str(err)


@pytest.fixture(autouse=True, scope="session")
def _needs_native_core() -> None:
    """Skip, saying how to build it, rather than fail on a checkout without a build."""
    if _MISSING is not None:  # pragma: no cover - depends on the build
        pytest.skip(f"native core not built: {_MISSING}")


def router_probs(
    ids: Sequence[int],
    weights: Sequence[float],
    n_experts: int = N_EXPERTS,
    probs: Mapping[int, float] | None = None,
) -> npt.NDArray[np.float32]:
    """Router probabilities for one token: selected experts get their weight, the others a
    small value decreasing with the id, then ``probs`` overrides."""
    row = 0.001 * (n_experts - np.arange(n_experts, dtype=np.float32))
    row[list(ids)] = weights
    for e, p in (probs or {}).items():
        row[e] = p
    return row.astype(np.float32)


RouteFn = Callable[..., RouteResult]


@pytest.fixture
def route() -> RouteFn:
    """Route one token: ``route(cache, ids, weights, layer=0, probs=None)``."""

    def _route(
        cache: ExpertCache,
        ids: Sequence[int],
        weights: Sequence[float] | None = None,
        layer: int = 0,
        probs: Mapping[int, float] | None = None,
    ) -> RouteResult:
        w = list(weights) if weights is not None else [1.0 / len(ids)] * len(ids)
        p = router_probs(ids, w, cache.n_experts, probs)
        return cache.route(layer, p, np.asarray(ids), np.asarray(w))

    return _route


@pytest.fixture
def make_cache() -> Iterator[Callable[..., ExpertCache]]:
    """``make_cache(policy, slots=4, top_k=2, n_layers=1, n_experts=16)``, closed after."""
    made: list[ExpertCache] = []

    def _make(
        policy: Policy | str = "exact",
        slots: int = 4,
        top_k: int = 2,
        n_layers: int = 1,
        n_experts: int = N_EXPERTS,
    ) -> ExpertCache:
        cache = ExpertCache(n_layers, n_experts, top_k, slots, policy)
        made.append(cache)
        return cache

    yield _make
    for cache in made:
        cache.close()
