"""The Python binding: where the library comes from, struct layouts, errors that leave the
cache untouched, and calls from a second thread while the first one routes."""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.cache import native
from moescope.cache.native import (
    COPY_DTYPE,
    EVENT_DTYPE,
    CEvent,
    CLayerStats,
    ExpertCache,
    NativeLibraryNotFoundError,
    NoSlotError,
    RouteResult,
)

MakeCache = Callable[..., ExpertCache]
RouteFn = Callable[..., RouteResult]


def test_the_environment_variable_names_the_library(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    built = native.find_library()
    monkeypatch.setenv(native.ENV_LIBRARY, str(built))
    assert native.find_library() == built
    monkeypatch.setenv(native.ENV_LIBRARY, str(tmp_path / "missing.so"))
    with pytest.raises(NativeLibraryNotFoundError):
        native.find_library()


def test_the_repo_build_is_found_without_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(native.ENV_LIBRARY, raising=False)
    monkeypatch.setattr(native, "_engine_library", lambda: None)
    assert (
        native.find_library().parent
        == Path(native.__file__).resolve().parents[3] / "build" / "native"
    )


def test_numpy_dtypes_match_the_c_structs() -> None:
    assert EVENT_DTYPE.itemsize == ctypes.sizeof(CEvent) == 912
    assert COPY_DTYPE.itemsize == 24
    assert ctypes.sizeof(CLayerStats) == 17 * 8
    assert native.version()


def test_out_of_range_ids_are_rejected(make_cache: MakeCache) -> None:
    cache = make_cache("exact")
    probs = np.full(16, 0.01, dtype=np.float32)
    for ids in ([0, 16], [-1, 0]):
        with pytest.raises(ValueError):
            cache.route(0, probs, np.array(ids), np.array([0.5, 0.5]))
    with pytest.raises(ValueError):
        cache.route(1, probs, np.array([0, 1]), np.array([0.5, 0.5]))


def test_a_duplicate_id_in_a_token_is_rejected(make_cache: MakeCache, route: RouteFn) -> None:
    cache = make_cache("exact")
    with pytest.raises(ValueError):
        route(cache, [3, 3])
    assert cache.layer_stats(0).tokens == 0
    assert cache.resident(0) == set()


def test_a_batch_too_big_for_the_slots_changes_nothing(
    make_cache: MakeCache, route: RouteFn
) -> None:
    cache = make_cache("exact", slots=2)
    route(cache, [0, 1])
    cache.drain_events()
    before = (cache.layer_slots(0).tolist(), cache.layer_stats(0))
    probs = np.full((2, 16), 0.01, dtype=np.float32)
    weights = np.full((2, 2), 0.5, dtype=np.float32)
    with pytest.raises(NoSlotError):
        cache.route(0, probs, np.array([[2, 3], [4, 5]]), weights)
    assert (cache.layer_slots(0).tolist(), cache.layer_stats(0)) == before
    assert len(cache.drain_events()) == 0
    assert weights.tolist() == [[0.5, 0.5], [0.5, 0.5]]


def test_a_closed_cache_refuses_calls(make_cache: MakeCache) -> None:
    cache = make_cache("exact")
    cache.close()
    cache.close()  # idempotent
    with pytest.raises(ValueError):
        cache.begin_step()


def test_an_impossible_shape_is_refused() -> None:
    with pytest.raises(ValueError):
        ExpertCache(1, 16, 4, 2)


def test_route_does_not_modify_the_callers_weights(make_cache: MakeCache) -> None:
    cache = make_cache("substitute-all")
    probs = np.full(16, 0.01, dtype=np.float32)
    cache.route(0, probs, np.array([0, 1]), np.array([0.5, 0.5], dtype=np.float32))
    weights = np.array([0.5, 0.5], dtype=np.float32)
    cache.route(0, probs, np.array([0, 9]), weights)
    assert weights.tolist() == [0.5, 0.5]


def test_stats_and_drain_from_another_thread_while_routing(make_cache: MakeCache) -> None:
    cache = make_cache("quality-first", slots=6, top_k=2, n_layers=2)
    rng = np.random.default_rng(1)
    probs = rng.dirichlet(np.ones(16), size=500).astype(np.float32)
    ids = np.argsort(-probs, axis=1)[:, :2]
    weights = np.take_along_axis(probs, ids, axis=1)
    done = threading.Event()
    drained: list[np.ndarray] = []

    def observer() -> None:
        while not done.is_set():
            drained.append(cache.drain_events())
            cache.layer_stats(0)
            cache.set_policy("speed-first")

    thread = threading.Thread(target=observer)
    thread.start()
    try:
        for t in range(500):
            cache.begin_step()
            for layer in (0, 1):
                cache.route(layer, probs[t], ids[t], weights[t])
    finally:
        done.set()
        thread.join()
    drained.append(cache.drain_events())
    rows = np.concatenate(drained)
    assert len(rows) == 1000
    assert cache.layer_stats(0).tokens + cache.layer_stats(1).tokens == 1000
    assert rows["step"].tolist() == sorted(rows["step"].tolist())


def test_attach_shares_a_core_without_owning_it(make_cache: MakeCache, route: RouteFn) -> None:
    owner = make_cache("exact")
    route(owner, [0, 1])
    view = ExpertCache.attach(owner.handle, n_layers=1, n_experts=16, top_k=2)
    assert view.resident(0) == {0, 1}
    assert len(view.drain_events()) == 1
    view.close()
    assert owner.layer_stats(0).tokens == 1  # still alive: the view did not destroy it
