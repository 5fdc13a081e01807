"""The router-logit simulator: replay a trace's routing through the native core.

Headless and engine-free (it needs only the core library), so policies and budgets can be
compared from a recorded chat without loading the model. See :mod:`moescope.sim.replay`
(exact replay), :mod:`moescope.sim.cost` (time per token) and :mod:`moescope.sim.sweep`
(policy x budget tables).
"""

from moescope.cache.batch import ProgressFn, ReplayCancelled
from moescope.sim.cost import COST_MODEL_NAMES, CostModel, calibrate, cost_model
from moescope.sim.replay import ReplayResult, Routing, decision_mismatches, replay
from moescope.sim.sweep import Sweep, SweepRow, nothing_to_replay, parse_policy, sweep

__all__ = [
    "COST_MODEL_NAMES",
    "CostModel",
    "ProgressFn",
    "ReplayCancelled",
    "ReplayResult",
    "Routing",
    "Sweep",
    "SweepRow",
    "calibrate",
    "cost_model",
    "decision_mismatches",
    "nothing_to_replay",
    "parse_policy",
    "replay",
    "sweep",
]
