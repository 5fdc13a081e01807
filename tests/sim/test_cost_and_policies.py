"""The cost model's arithmetic and the policy specs the replay command accepts."""

from __future__ import annotations

import numpy as np
import pytest

from moescope.cache.policy import Eviction, MissRule, Policy
from moescope.sim.cost import PRESETS, CostModel, cost_model
from moescope.sim.replay import TOKEN_COST_DTYPE
from moescope.sim.sweep import parse_policy, split_list
from moescope.trace import TraceModel
from moescope.util.errors import MoEScopeError

MODEL = TraceModel(file_name="m.gguf", metadata_sha256="0" * 64, architecture="qwen3moe",
                     n_layers=2, moe_layers=(0, 1), n_expert=16, top_k=4,
                     bytes_per_expert=(1_000_000, 1_000_000), non_expert_bytes=2_000_000)


def _tokens(n_sync: int, bytes_sync: int, n_async: int = 0, bytes_async: int = 0) -> np.ndarray:
    out = np.zeros(1, dtype=TOKEN_COST_DTYPE)
    out[0]["n_sync"], out[0]["bytes_sync"] = n_sync, bytes_sync
    out[0]["n_async"], out[0]["bytes_async"] = n_async, bytes_async
    return out


def test_a_token_costs_compute_plus_its_synchronous_copies() -> None:
    cm = CostModel("t", bandwidth=1e9, latency=1e-5, compute_s=2e-3)
    seconds = cm.token_seconds(_tokens(3, 3_000_000), MODEL)
    assert seconds[0] == pytest.approx(2e-3 + 3 * 1e-5 + 3e-3)


def test_background_copies_cost_only_what_does_not_fit_under_compute() -> None:
    cm = CostModel("t", bandwidth=1e9, latency=0.0, compute_s=2e-3)
    hidden = cm.token_seconds(_tokens(0, 0, 1, 1_000_000), MODEL)[0]
    spilled = cm.token_seconds(_tokens(0, 0, 5, 5_000_000), MODEL)[0]
    assert hidden == pytest.approx(2e-3)
    assert spilled == pytest.approx(5e-3)


def test_presets_follow_the_research_anchors() -> None:
    assert PRESETS["pcie4"].bandwidth == 25e9
    assert PRESETS["pcie5"].bandwidth > PRESETS["pcie4"].bandwidth
    # compute from the active bytes: non-expert + top-k experts per layer at GPU bandwidth
    assert PRESETS["pcie4"].compute_for(MODEL) == pytest.approx(10_000_000 / 936e9)
    with pytest.raises(MoEScopeError, match="unknown cost model"):
        cost_model("pcie9")
    with pytest.raises(MoEScopeError, match="needs a trace"):
        cost_model("calibrated")


def test_policy_specs_name_presets_or_override_their_parameters() -> None:
    assert parse_policy("recorded") is None
    assert parse_policy("speed-first") == Policy.preset("speed-first")
    custom = parse_policy("threshold:theta=0.3:eviction=frequency:admission=on")
    assert custom is not None
    assert (custom.miss_rule, custom.theta, custom.eviction, custom.admission) == (
        MissRule.THRESHOLD, 0.3, Eviction.FREQUENCY, True)
    assert custom.name == "threshold:theta=0.3:eviction=frequency:admission=on"
    disk = parse_policy("quality-first:theta_disk=0.15")  # the disk tier's own threshold
    assert disk is not None and disk.theta_disk == 0.15 and disk.theta == 0.15
    for bad in ("fastest", "threshold:theta", "threshold:theta=2", "exact:colour=red",
                "quality-first:theta_disk=1.5"):
        with pytest.raises(MoEScopeError):
            parse_policy(bad)
    assert split_list(["a,b", "c"]) == ["a", "b", "c"]
