"""Paper 2 in the window: the Cache-prior and PSR presets, Custom's routing bonus and
prefetch, the prefetch accuracy the cache panel shows, and where the experts live."""

from __future__ import annotations

from typing import Any

import pytest
from gui_helpers import LONG_PROMPT, send, slow_down
from PySide6.QtCore import Qt

from moescope.cache.policy import (
    DEFAULT_BONUS,
    PREFETCH_TOP_K,
    PRESETS,
    THETA_DISK_AS_THETA,
    MissRule,
    SubstituteWeight,
)
from moescope.display.cache_model import PrefetchSummary, prefetch_text
from moescope.display.memory_model import expert_memory
from moescope.display.policy_choices import (
    BONUS_MAX,
    CUSTOM,
    POLICY_CHOICES,
    POLICY_TIPS,
    PREFETCH_FIXED,
    PREFETCH_OFF,
    PREFETCH_TOPK,
    THETA_DISK_OFF,
    control_values,
    custom_policy,
    prefetch_value,
)


def _choose(combo: Any, key: str) -> None:
    """Pick an entry of a combo box by its data, as a user's click would."""
    index = combo.findData(key)
    assert index >= 0, key
    combo.setCurrentIndex(index)


def _applied(qtbot: Any, window: Any, check: Any) -> None:
    """Wait until the engine holds what ``check`` asserts (requests apply between tokens)."""
    qtbot.waitUntil(check, timeout=10_000)


def _switch(qtbot: Any, window: Any, act: Any, policy: str) -> None:
    """Run ``act`` and wait until the window hears that the engine applied ``policy``.

    Waiting for that very signal matters: an earlier change's signal may still be queued,
    and the window would otherwise be checked between the two."""
    with qtbot.waitSignal(window.changesApplied, timeout=10_000,
                          check_params_cb=lambda summary, _changes: summary.policy == policy):
        act()


# ---------------------------------------------------------------------------- the mapping


def test_the_menu_offers_both_papers_presets_with_tooltips() -> None:
    keys = [key for key, _ in POLICY_CHOICES]
    assert keys[:6] == ["exact", "quality-first", "speed-first", "cache-prior", "psr", CUSTOM]
    for key in keys:
        assert len(POLICY_TIPS[key]) > 40, key  # says what it does and what it trades


def test_custom_mapping_spans_quality_first_cache_prior_and_psr() -> None:
    assert custom_policy() == PRESETS["quality-first"]
    assert custom_policy(bonus=DEFAULT_BONUS) == PRESETS["cache-prior"]
    assert custom_policy(bonus=DEFAULT_BONUS, prefetch=PREFETCH_TOP_K) == PRESETS["psr"]
    assert custom_policy().name == CUSTOM
    # bonus 0 keeps the 0.15 rule, with or without prefetch
    p = custom_policy(theta=0.3, beta=1.2, prefetch=3)
    assert (p.miss_rule, p.theta, p.beta, p.prefetch) == (MissRule.THRESHOLD, 0.3, 1.2, 3)
    assert p.substitute_weight == SubstituteWeight.MISSING
    # any bonus > 0 is the Cache-Prior rule with that bonus
    q = custom_policy(theta=0.3, beta=1.2, bonus=BONUS_MAX)
    assert (q.miss_rule, q.bonus, q.beta, q.prefetch) == (MissRule.ROUTING_BONUS, 0.3, 1.2, 0)
    assert q.substitute_weight == SubstituteWeight.OWN
    with pytest.raises(ValueError):
        custom_policy(bonus=-0.01)
    assert [prefetch_value(m, 5) for m in (PREFETCH_OFF, PREFETCH_TOPK, PREFETCH_FIXED)] == \
        [0, PREFETCH_TOP_K, 5]
    with pytest.raises(ValueError):
        prefetch_value(PREFETCH_FIXED, 0)
    # the disk threshold belongs to the 0.15 rule (quality-first has none of its own)
    assert PRESETS["quality-first"].theta_disk == THETA_DISK_AS_THETA
    d = custom_policy(theta=0.2, theta_disk=0.3)
    assert (d.miss_rule, d.theta, d.theta_disk) == (MissRule.THRESHOLD, 0.2, 0.3)
    assert custom_policy(bonus=0.1, theta_disk=0.3).theta_disk == THETA_DISK_AS_THETA
    # the controls' reading of a policy maps back to it
    for policy in (PRESETS["quality-first"], PRESETS["cache-prior"], PRESETS["psr"], p, q, d):
        v = control_values(policy)
        assert custom_policy(v.theta, v.beta, v.bonus,
                             prefetch_value(v.prefetch_mode, v.prefetch_count or 1),
                             v.theta_disk) == policy


def test_prefetch_text_says_accuracy_and_rate_and_caps_late_hits() -> None:
    assert prefetch_text(PrefetchSummary(tokens=4, prefetches=10, hits=7)) == \
        "prefetch accuracy 70% · 2.5/token"
    assert prefetch_text(PrefetchSummary(tokens=2, prefetches=0, hits=0)) == \
        "prefetch accuracy – · 0.0/token"
    # hits of prefetches made before the window can outnumber the window's prefetches
    assert PrefetchSummary(tokens=2, prefetches=2, hits=3).accuracy == 1.0


def test_expert_memory_names_pinned_and_pageable_buffers() -> None:
    text, tip = expert_memory("CUDA_Host")
    assert text == "pinned (CUDA_Host)" and "full PCIe speed" in tip
    assert expert_memory("CPU_Mapped")[0] == "pageable (mmap)"
    assert expert_memory("CPU")[0] == "pageable (RAM)"
    assert "pinned" in expert_memory("CPU")[1]
    assert expert_memory("") == ("", "")


# ---------------------------------------------------------------------------- live, real engine


def test_psr_from_the_menu_applies_next_token_and_panel_shows_prefetch_accuracy(
        window: Any, qtbot: Any) -> None:
    engine = window.client.worker.engine
    panel = window.cache_panel
    send(qtbot, window, "warm up", max_tokens=6)
    panel.draw(force=True)
    assert "prefetch" not in panel.summary.text()  # quality-first does not prefetch
    assert panel.model.prefetch_summary() is None

    slow_down(window, 3000)
    window.chat_settings.max_tokens.setValue(48)
    acted: list[int] = []

    def maybe_switch(_snaps: list[Any]) -> None:
        if not acted and window.chat.tokens_received >= 4:
            acted.append(window.client.worker.step)
            _choose(window.controls.policy_combo, "psr")

    window.chat.tokensArrived.connect(maybe_switch)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=60_000):
        window.chat.send(LONG_PROMPT)
    window.chat.tokensArrived.disconnect(maybe_switch)
    assert acted, "the answer ended before the switch"

    # the engine, and the core's ACTIVE policy, are the psr preset
    assert engine.policy_name == "psr" and engine.policy == PRESETS["psr"]
    assert engine.cache.policy == PRESETS["psr"]
    tokens = list(window.recent_tokens)
    policies = [t.policy for t in tokens]
    first = policies.index("psr")
    assert "policy=psr" in tokens[first].changes
    assert tokens[first].step <= acted[0] + 2
    assert all(t.prefetches is None for t in tokens[:first])
    psr = tokens[first:]
    assert len(psr) >= 4
    n_layers = len(window.model.moe_layers)
    for t in psr:  # per-token deltas of the core's cumulative counters, one per layer
        assert t.prefetches.shape == t.prefetch_hits.shape == (n_layers,)
        assert (t.prefetches >= 0).all() and (t.prefetch_hits >= 0).all()
    # the per-token counts add up to the core's own cumulative counters
    stats = engine.layer_stats()
    assert sum(int(t.prefetches.sum()) for t in psr) == sum(s.prefetches for s in
                                                            stats.values()) > 0
    hits = sum(int(t.prefetch_hits.sum()) for t in psr)
    assert 0 < hits <= sum(s.prefetch_hits for s in stats.values())

    # the stats line shows accuracy and rate over the recent prefetching tokens
    panel.draw(force=True)
    recent = psr[-panel.model.layer_window:]
    expected = PrefetchSummary(tokens=len(recent),
                               prefetches=sum(int(t.prefetches.sum()) for t in recent),
                               hits=sum(int(t.prefetch_hits.sum()) for t in recent))
    assert panel.model.prefetch_summary() == expected
    assert prefetch_text(expected) in panel.summary.text()
    assert expected.accuracy is not None and expected.accuracy > 0
    assert "Prefetch accuracy" in panel.summary.toolTip()
    # per layer: the first MoE layer is never predicted, the next one is
    panel.tabs.setCurrentWidget(panel.layer_bars)
    panel.draw(force=True)
    layers = window.model.moe_layers
    tip = panel.layer_bars.toolTip()
    assert f"layer {layers[0]}: nothing prefetched" in tip
    assert f"layer {layers[1]}: " in tip and "% used" in tip

    # back to a policy without prefetch: the numbers disappear instead of reading 0%
    _switch(qtbot, window, lambda: _choose(window.controls.policy_combo, "quality-first"),
            "quality-first")
    slow_down(window, 0)
    send(qtbot, window, "and now?", max_tokens=6)
    panel.draw(force=True)
    assert "prefetch" not in panel.summary.text()
    assert "Prefetch accuracy" not in panel.summary.toolTip()
    assert panel.layer_bars.toolTip() == ""


def test_custom_bonus_and_prefetch_controls_make_the_documented_policy(
        window: Any, qtbot: Any) -> None:
    c = window.controls
    engine = window.client.worker.engine
    c.select_policy(CUSTOM)
    assert c.bonus.isEnabled() and c.prefetch_mode.isEnabled()
    assert not c.prefetch_count.isEnabled()  # only for a fixed number
    assert c.theta.isEnabled() and c.bonus_label.text() == "off"
    _applied(qtbot, window, lambda: engine.policy == PRESETS["quality-first"]
             and engine.policy_name == CUSTOM)

    c.bonus.setValue(round(DEFAULT_BONUS * 100))  # the presets' bonus, on the slider
    assert c.bonus_label.text() == f"{DEFAULT_BONUS:.2f}"
    assert not c.theta.isEnabled()  # the Cache-Prior rule does not use θ
    _applied(qtbot, window, lambda: engine.policy == PRESETS["cache-prior"])
    _choose(c.prefetch_mode, PREFETCH_TOPK)
    _applied(qtbot, window, lambda: engine.policy == PRESETS["psr"])
    assert engine.policy_name == CUSTOM
    # the window hears of it through a queued signal, possibly after the engine applied it
    qtbot.waitUntil(lambda: window.cache_panel.model.policy == CUSTOM, timeout=10_000)

    _choose(c.prefetch_mode, PREFETCH_FIXED)
    assert c.prefetch_count.isEnabled()
    c.prefetch_count.setValue(3)
    c.bonus.setValue(c.bonus.maximum())
    assert c.bonus_label.text() == f"{BONUS_MAX:.2f}"
    _applied(qtbot, window, lambda: (engine.policy.prefetch, engine.policy.bonus) ==
             (3, BONUS_MAX))
    assert engine.policy.miss_rule == MissRule.ROUTING_BONUS

    c.theta.setValue(30)  # ignored while the bonus rules, kept for when it is off
    c.bonus.setValue(0)
    assert c.theta.isEnabled() and c.bonus_label.text() == "off"
    _applied(qtbot, window, lambda: engine.policy == custom_policy(0.3, 0.5, 0.0, 3))
    assert engine.policy.miss_rule == MissRule.THRESHOLD
    # the core applies it at the next token: an answer runs under it
    send(qtbot, window, "hello", max_tokens=4)
    assert engine.cache.policy == custom_policy(0.3, 0.5, 0.0, 3)
    assert {t.policy for t in list(window.recent_tokens)[-3:]} == {CUSTOM}


def test_a_preset_shows_its_parameters_and_custom_keeps_its_own(window: Any,
                                                                 qtbot: Any) -> None:
    c = window.controls
    engine = window.client.worker.engine

    def set_custom() -> None:
        c.select_policy(CUSTOM)
        c.bonus.setValue(10)
        _choose(c.prefetch_mode, PREFETCH_FIXED)
        c.prefetch_count.setValue(5)

    _switch(qtbot, window, set_custom, CUSTOM)
    _applied(qtbot, window, lambda: engine.policy == custom_policy(bonus=0.1, prefetch=5))
    _switch(qtbot, window, lambda: c.select_policy("psr"), "psr")
    # the greyed controls read psr's parameters, not Custom's
    assert not c.bonus.isEnabled() and not c.prefetch_mode.isEnabled()
    assert c.bonus_label.text() == f"{DEFAULT_BONUS:.2f}"
    assert c.prefetch_mode.currentData() == PREFETCH_TOPK
    _switch(qtbot, window, lambda: c.select_policy("quality-first"), "quality-first")
    assert c.bonus_label.text() == "off" and c.prefetch_mode.currentData() == PREFETCH_OFF
    _switch(qtbot, window, lambda: c.select_policy(CUSTOM), CUSTOM)
    # back with its own settings, and they apply
    assert c.bonus_label.text() == "0.10" and c.prefetch_count.value() == 5
    assert engine.policy == custom_policy(bonus=0.1, prefetch=5)


def test_shortcut_goes_to_speed_first_and_back_to_the_policy_in_use(
        window: Any, qtbot: Any) -> None:
    c = window.controls
    engine = window.client.worker.engine
    _switch(qtbot, window, lambda: c.select_policy("psr"), "psr")
    for expected in ("speed-first", "psr", "speed-first", "psr"):
        _switch(qtbot, window, window.toggle_action.trigger, expected)
        assert engine.policy_name == expected
        assert c.policy_combo.currentData() == expected
    # Custom comes back with its own settings
    c.select_policy(CUSTOM)
    c.bonus.setValue(12)
    _applied(qtbot, window, lambda: engine.policy.bonus == 0.12)
    _switch(qtbot, window, window.toggle_action.trigger, "speed-first")
    _switch(qtbot, window, window.toggle_action.trigger, CUSTOM)
    assert engine.policy_name == CUSTOM and engine.policy.bonus == 0.12


def test_new_presets_are_in_the_cache_menu_and_the_open_dialog(window: Any) -> None:
    texts = {a.text().replace("&", "") for a in window.actions()}
    assert {"Cache-prior (routing bonus)", "PSR (prefetch + bonus)"} <= texts
    combo = window.controls.policy_combo
    for key in ("cache-prior", "psr"):
        index = combo.findData(key)
        assert index >= 0
        assert combo.itemData(index, Qt.ItemDataRole.ToolTipRole) == POLICY_TIPS[key]


def test_memory_view_says_where_the_engine_put_the_experts(window: Any) -> None:
    engine = window.client.worker.engine
    assert engine.model.expert_buffer == "CPU_Mapped" and not engine.model.pinned_experts
    assert window.model.expert_buffer == "CPU_Mapped"
    view = window.cache_panel.memory_view
    assert view.experts_label.text() == "Experts in host memory: pageable (mmap)"
    assert not view.experts_label.isHidden()
    assert "PCIe" in view.experts_label.toolTip()
    window.cache_panel.set_model(None)  # no model: nothing to say
    assert view.experts_label.isHidden()



def test_custom_sets_a_disk_threshold_and_presets_show_theirs(window: Any, qtbot: Any) -> None:
    """The RAM tier's knob in Custom: θ for misses only on disk; "disk = θ" under
    Quality-first (it has no threshold of its own), greyed with θ under a bonus."""
    c = window.controls
    engine = window.client.worker.engine
    assert c.theta_disk.value() == THETA_DISK_OFF and c.theta_disk.text() == "disk = θ"
    assert not c.theta_disk.isEnabled()  # Quality-first fixes it
    _switch(qtbot, window, lambda: c.select_policy(CUSTOM), CUSTOM)
    assert c.theta_disk.isEnabled()
    c.theta_disk.setValue(0.3)
    _applied(qtbot, window, lambda: engine.policy.theta_disk == pytest.approx(0.3))
    assert engine.policy == custom_policy(theta_disk=0.3)
    c.bonus.setValue(10)  # the Cache-Prior rule uses neither θ
    assert not c.theta_disk.isEnabled()
    _applied(qtbot, window, lambda: engine.policy.miss_rule == MissRule.ROUTING_BONUS)
    assert engine.policy.theta_disk == THETA_DISK_AS_THETA
    c.bonus.setValue(0)
    _applied(qtbot, window, lambda: engine.policy == custom_policy(theta_disk=0.3))
    _switch(qtbot, window, lambda: c.select_policy("quality-first"), "quality-first")
    assert c.theta_disk.text() == "disk = θ" and not c.theta_disk.isEnabled()
    _switch(qtbot, window, lambda: c.select_policy(CUSTOM), CUSTOM)
    assert c.theta_disk.value() == pytest.approx(0.3)  # Custom keeps its own
    # the arrow up from "disk = θ" goes above θ (it went to 0.00: read every disk miss)
    c.theta.setValue(20)
    c.theta_disk.setValue(THETA_DISK_OFF)
    assert c.theta_disk.text() == "disk = θ"
    c.theta_disk.stepUp()
    assert c.theta_disk.value() == pytest.approx(0.25)
    _applied(qtbot, window, lambda: engine.policy.theta_disk == pytest.approx(0.25))
    c.theta_disk.stepDown()
    assert c.theta_disk.value() == pytest.approx(0.20)  # and down on as before
