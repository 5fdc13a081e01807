"""``Policy.fill_free`` in traces: written by every new trace, read back as written, and
off for a trace recorded before it existed, whose decisions were the rule's alone (so its
replay stays the recording's)."""

from __future__ import annotations

import pytest

from moescope.cache.policy import PRESETS, Policy, parse_preset
from moescope.trace import policy_from_json, policy_to_json
from moescope.trace.schema import policy_label


@pytest.mark.parametrize("name", list(PRESETS))
def test_presets_fill_free_slots_and_round_trip(name: str) -> None:
    policy = Policy.preset(name)
    assert policy.fill_free
    as_json = policy_to_json(policy)
    assert as_json["fill_free"] is True
    assert policy_from_json(as_json) == policy


def test_a_policy_recorded_before_the_setting_reads_as_the_rule_alone() -> None:
    old = policy_to_json(Policy.preset("speed-first"))
    del old["fill_free"]
    policy = policy_from_json(old)
    assert not policy.fill_free
    assert policy == Policy.preset("speed-first").replace(fill_free=False)


@pytest.mark.parametrize("bad", ["yes", 2, None, 0.5])
def test_a_bad_value_is_refused_naming_the_field(bad: object) -> None:
    d = policy_to_json(Policy.preset("quality-first"))
    d["fill_free"] = bad
    with pytest.raises(ValueError, match="fill_free"):
        policy_from_json(d)


def test_the_spec_and_the_label_say_when_it_is_off() -> None:
    off = parse_preset("quality-first:fill_free=off")
    assert not off.fill_free and parse_preset("quality-first:fill_free=on").fill_free
    assert "nofill" in policy_label(off.replace(name=None))
    assert "nofill" not in policy_label(Policy.preset("quality-first").replace(name=None))
