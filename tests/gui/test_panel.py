"""The cache panel's contents: heatmap states and tooltip, per-layer bars, fit estimate."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from gui_helpers import LONG_PROMPT, send

from moescope.display.answer_line import answer_line
from moescope.display.fit import estimate_fit
from moescope.gui.dialogs.open_model import OpenModelDialog
from moescope.model.gguf_info import read_model_info
from moescope.session import snapshots as S


def test_heatmap_shows_the_last_tokens_cache_states(window: Any, qtbot: Any) -> None:
    send(qtbot, window, LONG_PROMPT, max_tokens=20)
    panel = window.cache_panel
    panel.draw(force=True)
    image = panel.heatmap.image.image
    last = list(window.recent_tokens)[-1]
    assert image.shape == (2, 16)
    np.testing.assert_array_equal(image, S.cell_states(last.resident, last.events,
                                                       panel.model.rows_of))
    assert panel.heatmap.image.levels is not None
    assert tuple(panel.heatmap.image.levels) == (0, len(S.CELL_LABELS))
    # every routed expert of the last token shows what the cache did with it
    for row in last.events:
        r = int(panel.model.rows_of[row["layer"]])
        for j in range(int(row["k"])):
            expert, action = int(row["ids"][j]), int(row["action"][j])
            expected = {0: S.HIT_NOW, 1: S.FETCHED_NOW, 2: S.SUBSTITUTED_AWAY}[action]
            if action == 2:
                assert image[r, int(row["used_ids"][j])] in (S.USED_AS_SUBSTITUTE,
                                                             S.HIT_NOW, S.FETCHED_NOW)
                if image[r, expert] != S.SUBSTITUTED_AWAY:
                    continue  # the same expert was also computed for this token
            assert image[r, expert] == expected


def test_heatmap_tooltip_names_layer_expert_uses_and_last_use(window: Any,
                                                              qtbot: Any) -> None:
    send(qtbot, window, LONG_PROMPT, max_tokens=20)
    model = window.cache_panel.model
    row, expert = np.unravel_index(np.argmax(model.uses), model.uses.shape)
    text = model.tooltip(int(row), int(expert))
    assert f"layer {model.model.moe_layers[row]}, expert {expert}" in text
    assert f"uses: {model.uses[row, expert]}" in text
    assert f"last use: token {model.last_use[row, expert]}" in text
    # hovering maps the scene position of the cell to the same text
    heat = window.cache_panel.heatmap
    center = heat.plot.vb.mapViewToScene(pg_point(expert + 0.5, row + 0.5))
    assert heat.cell_at(center) == (row, expert)


def pg_point(x: float, y: float) -> Any:
    from PySide6.QtCore import QPointF

    return QPointF(x, y)


def test_per_layer_bars_average_the_recent_tokens(window: Any, qtbot: Any) -> None:
    send(qtbot, window, LONG_PROMPT, max_tokens=20)
    panel = window.cache_panel
    panel.tabs.setCurrentWidget(panel.layer_bars)
    panel.draw(force=True)
    tokens = list(window.recent_tokens)[-20:]
    rows_of = panel.model.rows_of
    nums = [S.layer_numbers(t.events, rows_of) for t in tokens]
    mass = np.mean([n.mass for n in nums], axis=0)
    np.testing.assert_allclose(panel.layer_bars.values["mass"], mass)
    hits = np.sum([n.hits for n in nums], axis=0)
    sel = np.sum([n.selections for n in nums], axis=0)
    np.testing.assert_allclose(panel.layer_bars.values["hit_rate"], hits / sel)


def test_time_plots_label_zero_half_and_top_only(window: Any, qtbot: Any) -> None:
    """Short plots with automatic ticks stacked four or five labels on one another."""
    send(qtbot, window, LONG_PROMPT, max_tokens=20)
    plots = window.cache_panel.time_plots
    window.cache_panel.draw(force=True)
    assert plots.y_tick_labels("hit_rate") == ["0", "0.5", "1"]
    top = plots.plots["tokens_per_s"].viewRange()[1][1]
    labels = plots.y_tick_labels("tokens_per_s")
    assert len(labels) == 3 and labels[0] == "0"
    assert float(labels[2]) <= top and float(labels[1]) == float(labels[2]) / 2


def test_stats_line_averages_the_last_tokens_instead_of_flickering(window: Any,
                                                                   qtbot: Any) -> None:
    send(qtbot, window, LONG_PROMPT, max_tokens=40)
    panel = window.cache_panel
    panel.draw(force=True)
    tokens = list(window.recent_tokens)[-panel.model.layer_window:]
    hit = np.mean([t.events["n_hit"].sum() / t.events["k"].sum() for t in tokens])
    mass = np.mean([t.events["substituted_mass"].astype(np.float64).sum() for t in tokens])
    assert f"hit {hit:.0%}" in panel.summary.text()
    assert f"mass/token {mass:.3f}" in panel.summary.text()
    assert "last 32 tokens" in panel.summary.toolTip()


def test_fit_estimate_before_loading(tiny_moe: Path, qtbot: Any) -> None:
    info = read_model_info(tiny_moe)
    fit = estimate_fit(info, "50%", n_ctx=512)
    assert fit.plan is not None and fit.plan.slots_per_layer == 8
    assert fit.non_expert_bytes == info.non_expert_bytes
    assert fit.expert_bytes == info.total_expert_bytes
    assert fit.ram_needed >= info.non_expert_bytes + info.total_expert_bytes
    rows = dict(fit.lines())
    assert rows["Slots per layer"].startswith("8 of 16 (50.0% resident")
    assert "GPU" in rows
    dialog = OpenModelDialog(info, budget="25%")
    qtbot.addWidget(dialog)
    assert dialog.budget.value() == 4
    dialog.budget.setValue(12)
    assert dialog.estimate is not None and dialog.estimate.plan.slots_per_layer == 12
    request = dialog.request()
    assert request.path == str(tiny_moe) and request.budget == f"{12 * fit.plan.slot_row_bytes}B"


def test_the_open_dialog_takes_a_typed_budget_and_enter_does_not_open(tiny_moe: Path,
                                                                      qtbot: Any) -> None:
    """As in the main window: a size, a share or slots per layer, then Enter, which moves
    the slider and re-prices the fit without pressing Open; a typo is marked, nothing
    changes."""
    from PySide6.QtCore import Qt

    dialog = OpenModelDialog(read_model_info(tiny_moe), budget="25%")
    qtbot.addWidget(dialog)
    dialog.show()
    for typed, slots in (("10", 10), ("75%", 12), ("2 slots", 4)):  # 2 < top-k = 4
        dialog.budget_entry.setText(typed)
        qtbot.keyClick(dialog.budget_entry, Qt.Key.Key_Return)
        assert dialog.budget.value() == slots, typed
        assert dialog.estimate is not None and dialog.estimate.plan.slots_per_layer == slots
        assert dialog.isVisible() and dialog.result() == 0  # Enter did not press Open
    assert "top-k" in dialog.budget_entry.toolTip()
    dialog.budget_entry.setText("12 parsecs")
    qtbot.keyClick(dialog.budget_entry, Qt.Key.Key_Return)
    assert dialog.budget.value() == 4 and dialog.budget_entry.property("invalid")
    assert "12 parsecs" in dialog.budget_entry.text() and dialog.isVisible()


def test_fit_estimate_without_nvidia_gpu_says_slots_are_in_ram(tiny_moe: Path,
                                                              monkeypatch: Any) -> None:
    import moescope.display.fit as fit_module

    monkeypatch.setattr(fit_module, "gpu_status", lambda: None)
    fit = estimate_fit(read_model_info(tiny_moe), "25%", backend="cpu")
    assert fit.gpu == "CPU build: expert slots in RAM"
    assert fit.vram_free is None and fit.fits_vram


def test_audit_control_shows_the_quality_cost_live(window: Any, qtbot: Any) -> None:
    """Choosing *Audit every 8 tokens* in the controls: the panel's stats line shows the
    running estimate with its interval and the latest KL, the KL plot has one point per
    audited token, and the answer's line carries the estimate."""
    audit = window.controls.audit
    audit.setCurrentIndex(audit.findData(8))
    summary = send(qtbot, window, LONG_PROMPT, max_tokens=40)
    panel = window.cache_panel
    panel.draw(force=True)
    model = panel.model
    assert window.client.worker.engine.audit_every == 8
    assert len(model.audits) >= 3
    text = panel.summary.text()
    assert "quality cost +" in text and "audits" in text and "KL " in text
    assert "expected on the model's own text" in text  # the answers: the KL estimate
    est = model.audit_estimate()
    assert est is not None and f"+{100 * est.cost:.2f}%" in text and est.source == "model"
    kl = model.time.view("audit_kl")
    assert int(np.isfinite(kl).sum()) == len(model.audits)
    x, _y = panel.time_plots.curves["audit_kl"].getData()
    assert x is not None and len(x) == len(model.audits)
    assert "quality cost +" in summary.summary
    assert "expected on the model's own text" in summary.summary
    # the line under the answer in the chat, rebuilt from the stored numbers, says it too
    answer = window.store.messages(window.chat.chat_id)[-1]
    line = answer_line(answer.stats, answer.status)
    assert line.startswith("this answer:") and f" · {summary.audit}" in line
    assert summary.audit.startswith("quality cost +") and "audits)" in summary.audit
    assert line in window.chat_view.text()


def test_the_audit_estimate_starts_again_after_a_policy_change_between_answers(
        window: Any, qtbot: Any) -> None:
    """A policy chosen between answers kept the last policy's audits: the stats line's
    quality cost under the new policy mixed in the old one's (22 Quality-first audits and
    one of the guard's read as the guard's cost, over its target)."""
    audit = window.controls.audit
    audit.setCurrentIndex(audit.findData(8))
    send(qtbot, window, LONG_PROMPT, max_tokens=40)
    model = window.cache_panel.model
    before = len(model.audits)
    assert before >= 3
    with qtbot.waitSignal(window.changesApplied, timeout=10_000,
                          check_params_cb=lambda summary, _c: summary.policy == "speed-first"):
        window.controls.select_policy("speed-first")
    assert model.audits == []
    window.cache_panel.draw(force=True)
    assert "quality cost" not in window.cache_panel.summary.text()
    send(qtbot, window, LONG_PROMPT, max_tokens=24)
    assert 1 <= len(model.audits) <= 3  # speed-first's own, every 8th of 24 tokens
    window.cache_panel.draw(force=True)
    assert f"· {len(model.audits)} audit" in window.cache_panel.summary.text()
