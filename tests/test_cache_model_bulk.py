"""A reopened trace's snapshots accounted in one pass (``CacheModel.add_many``) leave the
panel's numbers exactly as accounting them one token at a time does."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from moescope.display.cache_model import CacheModel
from moescope.display.trace_io import reopen

pytestmark = pytest.mark.engine


def state(model: CacheModel) -> dict[str, Any]:
    out: dict[str, Any] = {f"time.{c}": model.time.view(c).copy() for c in model.time.columns}
    for name in ("uses", "last_use", "_layer_mass", "_layer_hits", "_layer_sel",
                 "_layer_bytes", "_layer_prefetches", "_layer_prefetch_hits",
                 "_layer_prefetching"):
        out[name] = getattr(model, name).copy()
    for name in ("_layer_head", "_layer_count", "ttft_s", "policy", "slots_per_layer",
                 "ram_slots_per_layer", "context_used", "n_ctx", "prefetching", "markers",
                 "audits"):
        out[name] = getattr(model, name)
    out["_decode_seconds"] = list(model._decode_seconds)
    out["_policies"] = list(model._policies)
    out["latest"] = model.latest.index if model.latest is not None else None
    out["time.total"] = model.time.total
    out["dirty"] = set(model.dirty)
    return out


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
def test_add_many_leaves_what_adding_each_token_leaves(
        record: Callable[..., Path], arch: str) -> None:
    """Real traces (a prefill, two answers, a policy and budget switch; deepseek2 with a
    dense layer before its MoE layers), with a small window so the rings wrap."""
    path = record(arch, name="bulk.jsonl", policy="psr", budget="25%", tokens=40, answers=2,
                  switch_at=9)
    reopened = reopen(path)
    tokens = reopened.tokens
    one = CacheModel(capacity=50, layer_window=8)
    one.reset(reopened.model)
    assert one.n_rows > 0 and len(tokens) > 60
    for snap in tokens:
        one.add(snap)
    a = state(one)
    # in one call, and in four that leave the rings at other places (the per-layer
    # window's 8 and the time ring's 50 divide none of their lengths; the last is shorter
    # than the window)
    for cuts in ((), (13, 27, 75)):
        bulk = CacheModel(capacity=50, layer_window=8)
        bulk.reset(reopened.model)
        bounds = (0, *cuts, len(tokens))
        for lo, hi in itertools.pairwise(bounds):
            bulk.add_many(tokens[lo:hi])
        b = state(bulk)
        assert a.keys() == b.keys()
        for key in a:
            if isinstance(a[key], np.ndarray):
                np.testing.assert_array_equal(a[key], b[key], err_msg=f"{cuts} {key}")
            else:
                assert a[key] == b[key], (cuts, key)
        assert (bulk.uses > 0).any() and (bulk.last_use >= 0).any() and len(bulk.markers) > 0
