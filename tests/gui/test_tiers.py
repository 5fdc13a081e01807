"""The window with a RAM budget below the experts (issue 16): the RAM budget control beside
the VRAM budget, live like it; the memory view's three tiers; the heatmap's in RAM / on disk
only; disk MB per token in the stats line. Real window, real engine, tiny q8_0 model."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
from gui_helpers import LONG_PROMPT, LONG_SEED, load, send, slow_down
from PySide6.QtCore import Qt

from moescope.session.snapshots import IN_RAM, ON_DISK


def _tiered_window(make_window: Any, qtbot: Any, tiny_moe: Path) -> Any:
    w = make_window()
    summary = load(qtbot, w, tiny_moe, budget="25%", policy="exact", n_ctx=512,
                   ram_budget="40%")
    assert 0 < summary.ram_slots_per_layer < summary.n_expert
    # a seed that answers at length: a random one may end the answer before a change
    # asked for mid-answer applies (make test, 2026-12-04)
    w.chat_settings.seed.setValue(LONG_SEED)
    return w


def test_the_window_shows_three_tiers_with_bytes_hit_rates_and_disk_reads(
        make_window: Any, qtbot: Any, tiny_moe: Path) -> None:
    w = _tiered_window(make_window, qtbot, tiny_moe)
    m = w.model
    c = w.controls
    assert c.ram_budget.isEnabled() and c.ram_budget.value() == m.ram_slots_per_layer
    assert "read from disk" in c.ram_budget.accessibleDescription()
    assert "read from disk" in c.ram_budget.toolTip()
    send(qtbot, w, "hello there", max_tokens=12)
    panel = w.cache_panel
    panel.tabs.setCurrentWidget(panel.memory_view)
    panel.draw(force=True)
    tiers = panel.memory_view.tiers_label.text()
    assert f"VRAM slots: {m.slots_per_layer}/{m.n_expert} per layer" in tiers
    assert f"RAM tier: {m.ram_slots_per_layer}/{m.n_expert} per layer" in tiers
    disk_mb = float(re.search(r"Disk only: .* · ([0-9.]+) MB/token read", tiers).group(1))
    assert disk_mb > 0.0  # exact under a small RAM tier reads from the file
    served = re.search(r"served (\d+)% of slot fills", tiers)
    assert served is not None and 0 <= int(served.group(1)) < 100
    assert re.search(r"hit \d+% of routed experts", tiers)
    summary = panel.summary.text()
    assert f"RAM tier {m.ram_slots_per_layer}/{m.n_expert}" in summary
    assert float(re.search(r"disk ([0-9.]+) MB/token", summary).group(1)) > 0.0
    cells = panel.model.cells()
    latest = panel.model.latest
    assert latest is not None and latest.ram_resident is not None
    # cells outside VRAM that this token did not touch are in RAM or on disk only, as the
    # RAM tier's masks say; both appear with a tier of 40% and slots of 25%
    outside = ~latest.resident
    assert np.array_equal(cells == IN_RAM, (cells == IN_RAM) & outside & latest.ram_resident)
    assert np.array_equal(cells == ON_DISK, (cells == ON_DISK) & outside & ~latest.ram_resident)
    assert (cells == IN_RAM).any() and (cells == ON_DISK).any()
    assert all(s.isVisibleTo(panel.heatmap.legend) for s in panel.heatmap.tier_swatches)
    assert "in RAM/layer" in panel.heatmap.title.text()


def test_the_ram_budget_control_applies_live_when_idle_and_mid_answer(
        make_window: Any, qtbot: Any, tiny_moe: Path) -> None:
    w = _tiered_window(make_window, qtbot, tiny_moe)
    engine = w.client.worker.engine
    c = w.controls
    n_expert, top_k = w.model.n_expert, w.model.top_k
    # idle: applied at once, the label and the window's model follow
    target = top_k + 2
    c.ram_budget.setValue(target)
    qtbot.waitUntil(lambda: w.model.ram_slots_per_layer == target, timeout=10_000)
    assert engine.ram_slots_per_layer == target
    assert "(applied" not in c.ram_budget.accessibleDescription()
    # typed: every expert in RAM (the model was loaded from disk, so the tier stays on)
    c.ram_budget_entry.setText("100%")
    assert c.apply_typed_ram_budget()
    qtbot.waitUntil(lambda: w.model.ram_slots_per_layer == n_expert, timeout=10_000)
    assert c.ram_budget.value() == n_expert
    assert "every expert in RAM" in c.ram_budget.accessibleDescription()
    # a typo changes nothing and says why
    c.ram_budget_entry.setText("lots")
    assert not c.apply_typed_ram_budget()
    assert c.ram_budget_entry.property("invalid") is True
    # mid-answer: the tokens after the change report the new RAM tier
    slow_down(w, 3000)
    w.chat_settings.max_tokens.setValue(40)
    changed: list[int] = []

    def maybe_change(_snaps: list[Any]) -> None:
        if not changed and w.chat.tokens_received >= 4:
            changed.append(w.chat.tokens_received)
            c.ram_budget.setValue(top_k + 1)

    w.chat.tokensArrived.connect(maybe_change)
    with qtbot.waitSignal(w.chat.answerFinished, timeout=60_000):
        w.chat.send(LONG_PROMPT)
    w.chat.tokensArrived.disconnect(maybe_change)
    assert changed, "the answer ended before the change"
    seen = [t.ram_slots_per_layer for t in w.recent_tokens]
    assert seen[0] == n_expert and seen[-1] == top_k + 1
    assert engine.ram_slots_per_layer == top_k + 1
    assert c.ram_budget.value() == top_k + 1


def test_the_fit_estimate_says_where_each_part_lands_per_backend(
        tiny_moe: Path, monkeypatch: Any) -> None:
    import moescope.display.fit as fit_module
    from moescope.display.fit import estimate_fit
    from moescope.engine.devices import Device
    from moescope.model.gguf_info import read_model_info
    from moescope.model.ram_fit import ram_start_experts

    monkeypatch.setattr(fit_module, "gpu_status", lambda: None)
    info = read_model_info(tiny_moe)
    whole = estimate_fit(info, "25%", n_ctx=512, backend="cpu")
    tiered = estimate_fit(info, "25%", n_ctx=512, ram_budget="40%", backend="cpu")
    assert whole.disk_expert_bytes == 0 and tiered.disk_expert_bytes > 0
    assert tiered.ram_expert_bytes + tiered.disk_expert_bytes == info.total_expert_bytes
    assert whole.ram_needed - tiered.ram_needed == tiered.disk_expert_bytes
    rows = dict(tiered.lines())
    assert "in RAM (CPU build)" in rows["Expert slots"] and "hit" in rows["Expert slots"]
    assert "RAM tier" in rows["Experts in RAM"] and "copy" in rows["Experts in RAM"]
    assert "stay in the model file" in rows["Experts on disk"]
    assert "read" in rows["Experts on disk"]
    assert dict(whole.lines())["Experts on disk"].startswith("none")
    # a Vulkan build's GPU without NVML, free memory not reported: slots in GPU memory
    card = Device("Vulkan0", "Radeon", "gpu", 0, 0)
    vulkan = estimate_fit(info, "25%", n_ctx=512, backend="vulkan", device=card)
    assert "slots in RAM" not in vulkan.gpu and "Vulkan" in vulkan.gpu
    assert "GPU memory (Vulkan" in dict(vulkan.lines())["Expert slots"]
    assert vulkan.ram_needed == whole.ram_needed - whole.vram_needed
    # one row says where the slots are and their bytes (no second "Expert slots (…)" row)
    assert [label for label, _ in vulkan.lines()].count("Expert slots") == 1
    assert not any(label.startswith("Expert slots (") for label, _ in vulkan.lines())
    # the dialog's starting RAM budget: all experts when they fit, else what fits
    assert ram_start_experts(info, 512, available=1 << 40) == info.n_expert
    rest = info.non_expert_bytes + fit_module.kv_cache_bytes(info, 512)
    tight = ram_start_experts(info, 512, available=rest + info.total_expert_bytes // 2)
    assert info.top_k <= tight < info.n_expert


def test_the_open_dialog_loads_with_a_ram_budget_below_the_experts(
        make_window: Any, qtbot: Any, monkeypatch: Any, tiny_moe: Path) -> None:
    from moescope.gui.dialogs.open_model import OpenModelDialog

    seen: list[dict[str, str]] = []

    def accept(dialog: OpenModelDialog) -> int:
        assert dialog.ram_budget.value() == dialog.info.n_expert  # fits: all in RAM
        assert dialog.request().ram_budget == "auto"  # Auto, as the window then shows
        dialog.ram_budget_entry.setText("50%")  # typed, as in the window's RAM row
        assert dialog.apply_typed_ram_budget()
        assert dialog.ram_budget.value() == dialog.info.n_expert // 2
        dialog.ram_budget_entry.setText("lots")  # refused in place, nothing moves
        assert not dialog.apply_typed_ram_budget()
        assert dialog.ram_budget.value() == dialog.info.n_expert // 2
        dialog.ram_budget.setValue(6)
        form = dialog.estimate_form
        seen.append({form.itemAt(i, form.ItemRole.LabelRole).widget().text():
                     form.itemAt(i, form.ItemRole.FieldRole).widget().text()
                     for i in range(form.rowCount())})
        return OpenModelDialog.DialogCode.Accepted

    monkeypatch.setattr(OpenModelDialog, "exec", accept)
    w = make_window()
    with qtbot.waitSignal(w.modelLoaded, timeout=30_000) as blocker:
        w.prepare_open(tiny_moe)
    (rows,) = seen
    assert "6 of 16 per layer" in rows["Experts in RAM"]
    assert "stay in the model file" in rows["Experts on disk"]
    assert blocker.args[0].ram_slots_per_layer == 6
    assert w.controls.ram_budget.value() == 6


def test_a_model_opened_by_path_gets_the_automatic_ram_budget_told_not_asked(
        make_window: Any, qtbot: Any, tiny_moe: Path, dialogs: Any) -> None:
    """The last model at start and Get models' Open load by path, without the open dialog:
    they take ``auto`` (every expert in RAM when the model fits, else a tier); a tier the
    load chose is said in the status bar and the log, not in a box at every start."""
    from dataclasses import replace

    from moescope.gui.worker import LoadRequest
    from moescope.model.ram_fit import AUTO_RAM_BUDGET

    assert LoadRequest(path=str(tiny_moe)).ram_budget == AUTO_RAM_BUDGET
    w = make_window()
    summary = load(qtbot, w, tiny_moe)  # by path, as at start
    assert summary.ram_slots_per_layer == 0 and summary.ram_note == ""
    assert not [d for d in dialogs.shown if d[0] == "warning"]
    note = (f"{tiny_moe.name} needs about 1.2 GiB of memory (with its KV cache and working "
            f"buffers) and 800 MiB is available: 6 of 16 experts per layer stay in RAM")
    w._on_loaded(replace(summary, ram_note=note))
    assert w.statusBar().currentMessage() == note
    assert not [d for d in dialogs.shown if d[0] == "warning"]


def test_the_ram_budgets_auto_applies_live_and_says_why_in_the_status_bar(
        make_window: Any, qtbot: Any, tiny_moe: Path) -> None:
    """The RAM row's Auto, live: ticked, the engine chooses from the memory available now
    as a load does (the tiny model fits: every expert in RAM, in the tier its load left
    on), the slider follows and the status bar says why, as the load-time note does. The
    window keeps Auto chosen across the engine's reports until a budget is set by hand
    (slider or typed); typing "auto" chooses it again. A model opened by path (the
    default request: auto) shows Auto chosen; one opened with an explicit budget does
    not."""
    w = _tiered_window(make_window, qtbot, tiny_moe)  # explicit 40%: Auto not chosen
    engine = w.client.worker.engine
    c = w.controls
    n_expert = w.model.n_expert
    assert c.ram_auto.isEnabled() and not c.ram_auto.isChecked()
    w.statusBar().clearMessage()
    with qtbot.waitSignal(w.changesApplied, timeout=10_000) as blocker:
        qtbot.mouseClick(c.ram_auto, Qt.MouseButton.LeftButton,
                         pos=c.ram_auto.rect().center())
    _summary, changes = blocker.args
    assert [ch.text for ch in changes] == [f"ram={n_expert} (auto)"]
    assert c.ram_auto.isChecked()
    assert engine.ram_slots_per_layer == n_expert == w.model.ram_slots_per_layer
    assert c.ram_budget.value() == n_expert
    note = w.model.ram_note
    assert note.startswith(f"{tiny_moe.name} needs about ") and "is available" in note
    assert note.endswith(f"all {n_expert} experts per layer stay in RAM")
    assert w.statusBar().currentMessage() == note
    assert c.ram_budget.accessibleDescription().startswith("Auto: every expert in RAM")
    # a budget set by hand: Auto is no longer the choice, and the note is gone
    target = w.model.top_k + 1
    c.ram_budget.setValue(target)
    qtbot.waitUntil(lambda: w.model.ram_slots_per_layer == target, timeout=10_000)
    assert not c.ram_auto.isChecked() and w.model.ram_note == ""
    # typed "auto" chooses it again
    w.statusBar().clearMessage()
    c.ram_budget_entry.setText("auto")
    assert c.apply_typed_ram_budget()
    qtbot.waitUntil(lambda: w.model.ram_slots_per_layer == n_expert, timeout=10_000)
    assert c.ram_auto.isChecked() and c.ram_budget.value() == n_expert
    assert c.ram_budget_entry.text() == "" and c.ram_budget_entry.property("invalid") is not True
    qtbot.waitUntil(lambda: w.statusBar().currentMessage() == w.model.ram_note, timeout=5000)
    # opened by path, as at start: the load's auto is the RAM row's choice
    summary = load(qtbot, w, tiny_moe)
    assert summary.ram_slots_per_layer == 0
    assert c.ram_auto.isChecked() and c.ram_budget.value() == n_expert
    load(qtbot, w, tiny_moe, budget="25%", ram_budget="40%")
    assert not c.ram_auto.isChecked()
