"""Steering while chatting: policy switches and budget changes apply live, between tokens."""

from __future__ import annotations

from typing import Any

from gui_helpers import LONG_PROMPT, send, slow_down
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QToolTip

from moescope.cache.budget import format_bytes
from moescope.engine.changes import RequestNumbers


def _switch_mid_answer(window: Any, qtbot: Any, act: Any, after: int = 4) -> tuple[Any, int]:
    """Start a long answer, call ``act`` once ``after`` tokens have arrived, wait for the
    end. Returns the answer's summary and the worker's step when the engine queued the
    request ``act`` made (read then, not when ``act`` began: on a loaded machine the GUI
    thread can be late by a token, and the promise is about the queue, not the GUI)."""
    slow_down(window, 3000)
    window.chat_settings.max_tokens.setValue(60)
    acted: list[int] = []
    engine = window.client.worker.engine
    for name in ("request_policy", "request_budget"):
        original = getattr(engine, name)

        def queued(arg: Any, original: Any = original) -> int:
            acted.append(window.client.worker.step)
            return original(arg)

        setattr(engine, name, queued)

    def maybe_act(_snaps: list[Any]) -> None:
        if not acted and window.chat.tokens_received >= after:
            act()

    window.chat.tokensArrived.connect(maybe_act)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=60_000) as blocker:
        window.chat.send(LONG_PROMPT)
    window.chat.tokensArrived.disconnect(maybe_act)
    assert acted, "the answer ended before the change could be made"
    return blocker.args[0], acted[0]


def test_policy_switch_mid_answer_applies_from_the_next_token(window: Any, qtbot: Any) -> None:
    summary, step_at_request = _switch_mid_answer(
        window, qtbot, lambda: window.controls.select_policy("speed-first"))
    engine = window.client.worker.engine
    assert engine.policy_name == "speed-first"
    tokens = list(window.recent_tokens)
    policies = [t.policy for t in tokens]
    first_new = policies.index("speed-first")
    assert set(policies[:first_new]) == {"quality-first"}
    assert set(policies[first_new:]) == {"speed-first"}
    # the token being decoded when the request landed may finish under the old policy;
    # the one after it is decoded under the new one
    assert tokens[first_new].step <= step_at_request + 2
    assert "policy=speed-first" in tokens[first_new].changes
    # the per-message stats say both policies ran
    assert summary.policies == ("quality-first", "speed-first")
    assert "quality-first/speed-first" in window.store.messages(window.chat.chat_id)[-1] \
        .stats["summary"]
    # the switch is marked on the time plots
    window.cache_panel.draw(force=True)
    assert (tokens[first_new].step, "policy=speed-first") in \
        window.cache_panel.time_plots.marker_labels()
    assert window.controls.policy_combo.currentData() == "speed-first"


def test_custom_policy_sliders_set_theta_and_beta(window: Any, qtbot: Any) -> None:
    c = window.controls
    c.select_policy("custom")
    assert c.theta.isEnabled() and c.beta.isEnabled()
    c.theta.setValue(40)
    c.beta.setValue(120)
    engine = window.client.worker.engine

    def applied() -> None:
        p = engine.policy
        assert abs(p.theta - 0.40) < 1e-6 and abs(p.beta - 1.2) < 1e-6
        assert window.cache_panel.model.policy == "custom"  # the window heard of it too

    qtbot.waitUntil(applied, timeout=10_000)
    assert engine.policy_name == "custom"


def test_shortcut_toggles_quality_and_speed_first(window: Any, qtbot: Any) -> None:
    engine = window.client.worker.engine
    with qtbot.waitSignal(window.changesApplied, timeout=10_000):
        qtbot.keyClick(window, Qt.Key.Key_T, Qt.KeyboardModifier.ControlModifier)
    assert engine.policy_name == "speed-first"
    with qtbot.waitSignal(window.changesApplied, timeout=10_000):
        window.toggle_action.trigger()
    assert engine.policy_name == "quality-first"
    assert window.controls.policy_combo.currentData() == "quality-first"


def test_the_cache_menu_ticks_the_policy_in_use(window: Any, qtbot: Any) -> None:
    actions = window.policy_actions
    assert [k for k, a in actions.items() if a.isChecked()] == ["quality-first"]
    for _ in range(2):  # a second click on the ticked entry keeps it ticked
        with qtbot.waitSignal(window.changesApplied, timeout=10_000):
            actions["speed-first"].trigger()
        assert [k for k, a in actions.items() if a.isChecked()] == ["speed-first"]
    assert window.client.worker.engine.policy_name == "speed-first"
    window.controls.select_policy("custom")  # Custom has no entry: none ticked
    assert not any(a.isChecked() for a in actions.values())
    window.toggle_action.trigger()  # the shortcut's switch is ticked too
    assert actions["speed-first"].isChecked()


def test_budget_change_between_answers_keeps_the_conversation(window: Any, qtbot: Any) -> None:
    send(qtbot, window, "first question", max_tokens=8)
    with qtbot.waitSignal(window.changesApplied, timeout=10_000) as blocker:
        window.controls.budget.setValue(8)
    summary = blocker.args[0]
    assert summary.slots_per_layer == 8
    assert window.client.worker.engine.slots_per_layer == 8
    assert "8 slots/layer · 50.0% resident" in window.controls.budget_label.text()
    size = format_bytes(8 * window.controls.model.slot_row_bytes)  # its own unit, not 0.0x GiB
    assert window.controls.budget_label.text().startswith(f"{size} · ")
    assert "8/16 expert slots per layer" in window.model_label.text()
    send(qtbot, window, "second question", max_tokens=8)
    messages = window.store.messages(window.chat.chat_id)
    assert [m.content for m in messages if m.role == "user"] == [
        "first question", "second question"]
    assert list(window.recent_tokens)[-1].slots_per_layer == 8


def test_budget_change_mid_answer_resizes_before_the_next_token(window: Any,
                                                                qtbot: Any) -> None:
    _summary, step_at_request = _switch_mid_answer(
        window, qtbot, lambda: window.controls.budget.setValue(12))
    tokens = list(window.recent_tokens)
    slots = [t.slots_per_layer for t in tokens]
    first_new = slots.index(12)
    assert set(slots[:first_new]) == {4} and set(slots[first_new:]) == {12}
    assert tokens[first_new].step <= step_at_request + 2
    assert window.client.worker.engine.slots_per_layer == 12
    assert window.controls.budget.value() == 12
    resident = tokens[-1].resident
    assert resident is not None and int(resident.sum(axis=1).max()) <= 12


def test_a_stale_applied_report_does_not_flip_the_policy_back(window: Any, qtbot: Any) -> None:
    """Reports of applied changes are queued: one for an older request can reach the window
    after the user has chosen again. It must not move the combo back, even for a moment."""
    import time

    engine = window.client.worker.engine
    combo = window.controls.policy_combo
    shown: list[str] = []
    combo.currentIndexChanged.connect(lambda _i: shown.append(combo.currentData()))
    window.controls.select_policy("speed-first")
    first = window.requested.policy
    deadline = time.monotonic() + 10
    while engine.applied_requests.policy < first:  # no event processing: the report stays queued
        assert time.monotonic() < deadline, "the worker did not apply the first request"
        time.sleep(0.001)
    window.controls.select_policy("exact")
    assert window.requested.policy > first
    qtbot.waitUntil(lambda: window.model.policy == "exact"
                    and engine.applied_requests.policy == window.requested.policy, timeout=10_000)
    qtbot.wait(50)  # let any remaining queued report arrive
    assert shown == ["speed-first", "exact"]
    assert combo.currentData() == "exact" and engine.policy_name == "exact"


def test_request_numbers_count_what_the_engine_applied(window: Any, qtbot: Any) -> None:
    engine = window.client.worker.engine
    p1 = engine.request_policy("speed-first")
    b1 = engine.request_budget("50%")
    p2 = engine.request_policy("exact")
    assert p1 < b1 < p2
    assert engine.applied_requests.policy < p2  # queued, not applied yet
    window.client._apply.emit()
    qtbot.waitUntil(lambda: engine.applied_requests == RequestNumbers(p2, b1), timeout=10_000)
    assert engine.policy_name == "exact"


def test_a_typed_budget_moves_the_slider_and_applies(window: Any, qtbot: Any) -> None:
    """Sizes, shares and slot counts all work; a typo is explained and changes nothing."""
    c, engine = window.controls, window.client.worker.engine
    m = window.model
    for typed, slots in (("50%", 8), ("6", 6), ("6 slots", 6),
                         (f"{7 * m.slot_row_bytes / 2**10:.3f}KiB", 7), ("2", 4)):
        qtbot.keyClicks(c.budget_entry, typed)
        qtbot.keyClick(c.budget_entry, Qt.Key.Key_Return)
        assert c.budget.value() == slots, typed
        qtbot.waitUntil(lambda s=slots: engine.slots_per_layer == s, timeout=10_000)
        assert c.budget_entry.text() == "" and not c.budget_entry.property("invalid")
    assert "top-k = 4" in c.budget_entry.toolTip()  # "2" was raised to the minimum
    qtbot.keyClicks(c.budget_entry, "lots")
    qtbot.keyClick(c.budget_entry, Qt.Key.Key_Return)
    assert c.budget_entry.property("invalid") and "cannot read budget" in c.budget_entry.toolTip()
    # said at once (a red border alone did not say why), and to a screen reader
    assert "cannot read budget" in QToolTip.text()
    assert "cannot read budget" in c.budget_entry.accessibleDescription()
    assert c.budget.value() == 4 and engine.slots_per_layer == 4
    assert c.budget_entry.text() == "lots"  # kept, to be corrected
