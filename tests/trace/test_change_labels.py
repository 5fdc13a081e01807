"""Marker labels of policy changes: a preset by name, anything else by its parameters, so
that several Custom changes in a row do not stack up as identical "policy=custom" labels."""

from __future__ import annotations

from moescope.cache.policy import PRESETS
from moescope.display.policy_choices import custom_policy
from moescope.trace.schema import Change, policy_label


def test_presets_are_named_and_custom_changes_tell_apart() -> None:
    assert Change("policy", policy=PRESETS["psr"]).label == "policy=psr"
    first = Change("policy", policy=custom_policy(theta=0.3)).label
    second = Change("policy", policy=custom_policy(theta=0.3, theta_disk=0.4)).label
    third = Change("policy", policy=custom_policy(bonus=0.1, prefetch=3)).label
    assert len({first, second, third}) == 3
    assert first == "policy=custom θ0.30 β0.50"
    assert "disk0.40" in second and "bonus0.10" in third and "pf3" in third
    # a preset with one parameter changed is no longer that preset
    assert policy_label(PRESETS["quality-first"].replace(theta=0.2)).startswith("custom θ0.20")
