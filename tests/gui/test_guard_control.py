"""The quality guard in the window's policy menu: choosing it and setting its target
reach the engine, which then audits and steers between tokens."""

from __future__ import annotations

from typing import Any

from gui_helpers import send

from moescope.cache.guard import GUARD


def test_choosing_the_guard_and_its_target(window: Any, qtbot: Any) -> None:
    c = window.controls
    engine = window.client.worker.engine
    assert not c.guard_target.isEnabled()
    c.select_policy(GUARD)
    assert c.guard_target.isEnabled()
    # the guard and its audit period arrive as queued requests: wait for both
    qtbot.waitUntil(lambda: engine.guard is not None and engine.policy_name == GUARD
                    and engine.audit_every == 8, timeout=10_000)
    assert engine.guard.spec.target == 0.01
    assert c.audit.currentData() == 8  # the Audit control says so
    c.guard_target.setValue(0.5)
    qtbot.waitUntil(lambda: engine.guard is not None and engine.guard.spec.target == 0.005,
                    timeout=10_000)
    send(qtbot, window, "Hello")
    assert c.policy_combo.currentData() == GUARD  # the guard's own changes keep the entry
    assert any(t.audit is not None for t in window.recent_tokens)
    c.select_policy("quality-first")
    qtbot.waitUntil(lambda: engine.guard is None, timeout=10_000)
    assert not c.guard_target.isEnabled()


def test_compare_shows_the_audited_cost_and_keeps_the_guard(window: Any, qtbot: Any) -> None:
    """Compare under the guard: its row has an audited cost (audits on), the others none;
    afterwards the guard's controller and the audit period are the user's again."""
    from moescope.engine.compare import compare_policies

    engine = window.client.worker.engine
    window.controls.select_policy(GUARD)
    qtbot.waitUntil(lambda: engine.guard is not None, timeout=10_000)
    send(qtbot, window, "Hello")
    guard = engine.guard
    engine.set_audit(0)  # the user turned audits off: only the guard's answer has them
    result = compare_policies(engine, [{"role": "user", "content": "Hello"}],
                              ["exact", "quality-first", GUARD], max_tokens=40)
    assert [a.audit is not None for a in result.answers] == [False, False, True]
    assert engine.guard is guard and engine.audit_every == 0
