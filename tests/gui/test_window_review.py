"""Issue 19: the window as a newcomer meets it. Every number says what it measures and over
which tokens, and follows its subject; the window stays readable at 1024x700; the smaller
defects of the review. Numbers are checked against the engine's and the trace's."""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gui_helpers import LONG_PROMPT, load, send, slow_down

from moescope.cache.residency import read_resident
from moescope.display.answer_line import answer_line
from moescope.display.trace_io import reopen
from moescope.gui.cache.layer_bars_view import BAR_MIN_PX
from moescope.gui.cache.time_plots_view import PLOT_MIN_PX
from moescope.session.snapshots import NOT_RESIDENT
from moescope.session.store import STOPPED
from moescope.util.errors import ModelFormatError


def _token(text: str) -> int:
    match = re.search(r"· token (\d+)", text)
    assert match, text
    return int(match.group(1))


def _labels(window: Any) -> tuple[str, str]:
    panel = window.cache_panel
    panel.draw(force=True)
    lines = panel.summary.text().split("\n")
    return lines[0], lines[1] if len(lines) > 1 else ""


def test_panel_and_answer_line_name_their_span_and_match_engine_and_trace(
        window: Any, qtbot: Any) -> None:
    summary = send(qtbot, window, "hi", max_tokens=12)
    now, recent = _labels(window)
    model = window.cache_panel.model
    n = model.recent_tokens()
    assert now.startswith("now: quality-first · 4/16 slots per layer")
    # the share as the budget controls word it (it read 12% beside their 12.5%)
    controls = window.controls.budget_label.text()
    assert "(25.0% resident)" in now and "25.0% resident" in controls
    assert recent.startswith(f"last {n} tokens (quality-first) · ")
    assert f"hit {model.recent_mean('hit_rate'):.0%}" in recent
    assert f"tok/s (last {model.rolling_rate_tokens()} tokens)" in recent
    answer = window.store.messages(window.chat.chat_id)[-1]
    line = answer_line(answer.stats, answer.status)
    assert line in window.chat_view.text()
    assert line.startswith(f"this answer: {summary.n_tokens} tokens under quality-first")
    engine_answer = window.client.worker.engine.last_answer
    assert f"hit {engine_answer.cache.hit_rate:.1%}" in line
    assert f"{engine_answer.tokens_per_second:.1f} tok/s" in line
    # the panel's hit rate is the mean of the trace's per-token hit rates over its span
    assert window.trace_path is not None  # flushed at the end of every answer
    trace = reopen(window.trace_path)
    hits = []
    for tok in trace.tokens[-n:]:
        ev = tok.events
        k = ev["k"].sum()
        if k:
            hits.append(ev["n_hit"].sum() / k)
    assert len(hits) >= 1
    assert f"hit {np.mean(hits[-model.recent_tokens():]):.0%}" in recent


def test_switching_policy_after_an_answer_keeps_its_numbers_labels(window: Any,
                                                                    qtbot: Any) -> None:
    send(qtbot, window, "hi", max_tokens=10)
    with qtbot.waitSignal(window.changesApplied, timeout=10_000):
        window.controls.select_policy("speed-first")
    now, recent = _labels(window)
    assert now.startswith("now: speed-first")
    assert "(quality-first)" in recent and "speed-first" not in recent
    answer = window.store.messages(window.chat.chat_id)[-1]
    assert "under quality-first" in answer_line(answer.stats, answer.status)


def test_panel_header_follows_the_policy_and_token_mid_answer(window: Any, qtbot: Any) -> None:
    slow_down(window, 3000)
    window.chat_settings.max_tokens.setValue(60)
    switched: list[int] = []

    def act(_snaps: list[Any]) -> None:
        if not switched and window.chat.tokens_received >= 4:
            switched.append(1)
            window.controls.select_policy("psr")

    window.chat.tokensArrived.connect(act)
    window.chat.send(LONG_PROMPT)
    qtbot.waitUntil(lambda: window.cache_panel.model.latest is not None
                    and window.cache_panel.model.latest.policy == "psr", timeout=60_000)
    before = window.cache_panel.model.latest.step
    qtbot.wait(300)  # a few frames of the display timer (labels at ~5 Hz)
    now = window.cache_panel.summary.text().split("\n")[0]
    assert now.startswith("now: psr")
    assert _token(now) >= before  # live, not where the policy changed
    title = window.cache_panel.heatmap.title.text()
    assert int(title.rpartition("token ")[2]) >= before
    window.chat.stop()
    qtbot.waitUntil(lambda: not window.chat.generating, timeout=30_000)
    qtbot.wait(300)
    latest = window.cache_panel.model.latest
    assert _token(window.cache_panel.summary.text().split("\n")[0]) == latest.step
    assert window.cache_panel.heatmap.title.text().endswith(f"token {latest.step}")
    window.chat.tokensArrived.disconnect(act)


def test_idle_budget_change_moves_heatmap_title_and_residents(window: Any,
                                                              qtbot: Any) -> None:
    send(qtbot, window, "hi", max_tokens=10)
    with qtbot.waitSignal(window.changesApplied, timeout=10_000):
        window.controls.budget.setValue(8)
    send(qtbot, window, "more", max_tokens=10)
    top_k = window.model.top_k
    with qtbot.waitSignal(window.changesApplied, timeout=10_000):
        window.controls.budget.setValue(top_k)
    window.cache_panel.draw(force=True)
    title = window.cache_panel.heatmap.title.text()
    assert f"· {top_k} slots/layer" in title
    cells = window.cache_panel.model.cells()
    resident_per_row = (cells != NOT_RESIDENT).sum(axis=1)
    assert resident_per_row.max() <= top_k
    engine = window.client.worker.engine
    truth = read_resident(engine.cache, engine.model.info.moe_layers,
                          engine.model.info.n_expert)
    assert np.array_equal(cells != NOT_RESIDENT, truth)


def test_context_meter_follows_the_chat_and_survives_a_restart(
        make_window: Any, qtbot: Any, tiny_moe: Path) -> None:
    w = make_window()
    load(qtbot, w, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    first = w.chat.new_chat()
    a = send(qtbot, w, "a question that is long enough to take some tokens", max_tokens=20)
    second = w.chat.new_chat()
    bar = w.chat_view.context_bar
    assert bar.value() == 0 and bar.maximum() == 512
    b = send(qtbot, w, "short", max_tokens=5)
    assert bar.value() == b.n_prompt_tokens + b.n_tokens
    w.chat.select_chat(first)
    assert bar.value() == a.n_prompt_tokens + a.n_tokens
    w.chat.select_chat(second)
    assert bar.value() == b.n_prompt_tokens + b.n_tokens
    w.close()
    again = make_window()  # a restart on the same data directory
    load(qtbot, again, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    again.chat.select_chat(first)
    assert again.chat_view.context_bar.value() == a.n_prompt_tokens + a.n_tokens
    assert again.chat_view.context_bar.maximum() == 512


def test_a_stopped_answer_says_so_once_and_leaves_no_empty_bubble(window: Any,
                                                                   qtbot: Any) -> None:
    slow_down(window, 20000)
    window.chat_settings.max_tokens.setValue(200)
    window.chat.tokensArrived.connect(lambda _s: window.chat.stop())  # at the first token
    with qtbot.waitSignal(window.chat.answerFinished, timeout=60_000):
        window.chat.send(LONG_PROMPT)
    answer = window.store.messages(window.chat.chat_id)[-1]
    assert answer.status == STOPPED
    line = answer_line(answer.stats, answer.status)
    # no speed of zero (a "10.0 tok/s" is a speed, not a zero one)
    assert line.count("stopped") == 1 and not re.search(r"(?<![\d.])0\.0 tok/s", line)
    if answer.stats["n_tokens"] < 2:
        assert "tok/s" not in line
    text = window.chat_view.text()
    assert line in text
    if not answer.content.strip():
        assert "(no text: stopped before the model wrote anything)" in text


def test_a_typed_budget_below_top_k_says_why_it_became_top_k(window: Any,
                                                            qtbot: Any) -> None:
    top_k = window.model.top_k
    window.controls.budget.setValue(8)
    qtbot.waitUntil(lambda: window.model.slots_per_layer == 8, timeout=10_000)
    window.controls.budget_entry.setText(str(top_k - 1))
    window.controls.apply_typed_budget()
    qtbot.waitUntil(lambda: window.model.slots_per_layer == top_k, timeout=10_000)
    label = window.controls.budget_label.text()
    assert f"{top_k} slots/layer" in label
    assert f"top-k = {top_k}" in label and f"using {top_k} slots" in label


def test_logs_stay_at_the_left_edge(make_window: Any) -> None:
    w = make_window()
    w.right_tabs.setCurrentWidget(w.logs)
    logging.getLogger("moescope.test").info("x" * 600)
    from PySide6.QtCore import QCoreApplication
    QCoreApplication.processEvents()
    assert "x" * 600 in w.logs.toPlainText()
    assert w.logs.horizontalScrollBar().maximum() > 0
    assert w.logs.horizontalScrollBar().value() == 0


def test_chat_search_matches_message_text(window: Any, qtbot: Any) -> None:
    window.chat.new_chat()
    send(qtbot, window, "hello there", max_tokens=3)
    window.store.rename_chat(window.chat.chat_id, "Greeting")
    window.chat.new_chat()
    send(qtbot, window, "about zebras", max_tokens=3)
    window.chat_list.search.setText("ZEBRA")
    assert len(window.chat_list.titles()) == 1
    window.chat_list.search.setText("greet")
    assert window.chat_list.titles() == ["Greeting"]


def test_memory_tab_without_gpu_draws_no_vram_chart(make_window: Any) -> None:
    w = make_window()
    memory = w.cache_panel.memory
    memory.sample()
    view = w.cache_panel.memory_view
    view.refresh()
    if memory.gpu is not None:
        pytest.skip("this machine has a GPU")
    assert view.no_gpu and "vram" not in view.plots
    assert "no GPU" in view.plots["ram"].titleLabel.text


def test_bad_file_messages_read_as_words_and_sizes(tmp_path: Path) -> None:
    from moescope.model.gguf_info import read_model_info

    bad = tmp_path / "hello.gguf"
    bad.write_bytes(b"hello world, this is not a model" * 4)
    with pytest.raises(ModelFormatError) as err:
        read_model_info(bad)
    assert "b'" not in str(err.value) and '"hell"' in str(err.value)


def test_truncated_file_message_states_its_size(tiny_moe: Path, tmp_path: Path) -> None:
    from moescope.model.gguf_info import read_model_info

    cut = tmp_path / "cut.gguf"
    data = tiny_moe.read_bytes()
    cut.write_bytes(data[:4096])
    with pytest.raises(ModelFormatError) as err:
        read_model_info(cut)
    assert "4,096 bytes" in str(err.value) and "truncated" in str(err.value)


def test_compare_dialog_explains_its_faster_tok_s(window: Any, qtbot: Any) -> None:
    send(qtbot, window, "hi", max_tokens=4)
    dialog = window.open_compare_dialog()
    assert dialog is not None
    from PySide6.QtWidgets import QLabel
    texts = " ".join(label.text() for label in dialog.findChildren(QLabel))
    assert "decode alone" in texts  # and why, on the tok/s header
    from moescope.gui.dialogs.compare import COLUMNS
    tip = dialog.table.horizontalHeaderItem(COLUMNS.index("tok/s")).toolTip()
    assert "decode alone" in tip and "chat's" in tip
    dialog.reject()


# ---------------------------------------------------------------------- small screens
def _at(window: Any, qtbot: Any, width: int, height: int) -> None:
    window.resize(width, height)
    qtbot.wait(100)
    window.cache_panel.draw(force=True)


def test_plots_keep_axes_and_height_at_1024x700(window: Any, qtbot: Any) -> None:
    send(qtbot, window, "hi", max_tokens=20)
    _at(window, qtbot, 1024, 700)
    assert window.width() <= 1024 and window.height() <= 700
    plots = window.cache_panel.time_plots
    for key, plot in plots.plots.items():
        assert plot.getAxis("left").isVisible(), key
        assert plot.geometry().height() >= PLOT_MIN_PX - 2, key
    bottom = list(plots.plots.values())[-1].getAxis("bottom")  # shared x, under the last
    assert bottom.isVisible() and bottom.label.toPlainText().strip() == "token"
    assert bottom.geometry().height() >= 30  # the label is not cut
    window.cache_panel.tabs.setCurrentWidget(window.cache_panel.layer_bars)
    qtbot.wait(50)
    for key, plot in window.cache_panel.layer_bars.plots.items():
        assert plot.geometry().height() >= BAR_MIN_PX - 20, key
        assert plot.geometry().width() >= 200, key
    # the chat list gives its width to the conversation and the cache
    sizes = window.splitter.sizes()
    assert sizes[0] <= 180 and sizes[1] >= 300


def test_heatmap_title_elides_with_the_whole_text_in_its_tooltip(window: Any,
                                                                 qtbot: Any) -> None:
    send(qtbot, window, "hi", max_tokens=4)
    _at(window, qtbot, 1024, 700)
    title = window.cache_panel.heatmap.title
    window.cache_panel.heatmap.resize(160, 300)
    assert title.elided().endswith("…") or title.fontMetrics().horizontalAdvance(
        title.text()) <= title.width()
    assert title.toolTip() == title.text()


def test_marker_labels_never_overlap_nor_leave_the_plot(window: Any, qtbot: Any) -> None:
    send(qtbot, window, "hi", max_tokens=40)
    _at(window, qtbot, 1024, 700)
    model = window.cache_panel.model
    last = model.latest.step
    for i, step in enumerate((1, 2, 3, 5, 8, 9, last - 2, last - 1, last)):
        model.add_marker(step, ("policy speed-first", "slots 8", "policy psr")[i % 3])
    window.cache_panel.draw(force=True)
    plots = window.cache_panel.time_plots
    layout = plots.label_layout
    assert layout, "some labels are shown"
    assert all(left >= 0 for _, left, _ in layout)
    # the labels as drawn: apart, and inside the plot
    shown = [lines[0].label.sceneBoundingRect() for _, lines in plots._marker_items
             if lines[0].label.isVisible()]
    assert len(shown) == len(layout)
    for a, b in itertools.combinations(shown, 2):
        assert not a.intersects(b), (a, b)
    view = plots.plots["mass"].vb.sceneBoundingRect()
    assert all(view.contains(r) for r in shown), (view, shown)


# ---------------------------------------------------------------------- the demo model
def test_the_demo_models_first_screen_says_what_it_is_and_offers_prompts(
        make_window: Any, qtbot: Any) -> None:
    from PySide6.QtCore import QUrl

    from moescope.gui.chat.welcome import DEMO_PROMPTS, prompt_href
    from moescope.util.resources import demo_model_path

    demo = demo_model_path()
    if demo is None:
        pytest.skip("this checkout has no demo model")
    w = make_window()
    assert "No model loaded" in w.chat_view.text() and "Open model" in w.chat_view.text()
    load(qtbot, w, demo, budget="25%", policy="quality-first", n_ctx=512)
    text = w.chat_view.text()
    assert "15M-parameter" in text and "Shakespeare and Python" in text
    assert "for trying the expert cache" in text
    assert all(p in text for p in DEMO_PROMPTS)
    assert "Open model" in text
    w.chat_settings.max_tokens.setValue(4)
    with qtbot.waitSignal(w.chat.answerFinished, timeout=30_000):
        assert w.chat_view.open_link(QUrl(prompt_href(0)))
    messages = w.store.messages(w.chat.chat_id)
    assert messages[0].content == DEMO_PROMPTS[0] and messages[1].role == "assistant"
    assert "15M-parameter" not in w.chat_view.text()  # the chat took the screen


def test_the_demo_is_the_demo_by_any_path(tmp_path: Any) -> None:
    """`moescope resources/models/demo.gguf` or a link to it: still the demo's welcome."""
    from moescope.gui.chat.welcome import is_demo
    from moescope.session.snapshots import ModelSummary
    from moescope.util.resources import demo_model_path

    demo = demo_model_path()
    if demo is None:
        pytest.skip("this checkout has no demo model")
    link = tmp_path / "demo-link.gguf"
    link.symlink_to(demo)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")

    def summary(path: Any) -> Any:
        base = {f.name: (f.default if f.default is not dataclasses.MISSING else 0)
                for f in dataclasses.fields(ModelSummary)}
        base.update(path=str(path), name="x")
        return ModelSummary(**base)

    assert is_demo(summary(demo)) and is_demo(summary(link))
    assert is_demo(summary(os.path.relpath(demo)))
    assert not is_demo(summary(other)) and not is_demo(summary(tmp_path / "gone.gguf"))


def test_the_window_with_a_model_fits_700_pixels_under_a_title_bar(window: Any,
                                                                   qtbot: Any) -> None:
    """Under X11 with real fonts a loaded model made the window 706 px tall at least: the
    heatmap's floor grew with the layers (154 px for the demo's 6, 360 for 48)."""
    from moescope.gui.cache.heatmap_view import HEATMAP_MIN_PX

    send(qtbot, window, "hi", max_tokens=4)
    heat = window.cache_panel.heatmap
    assert heat.graphics.minimumHeight() == HEATMAP_MIN_PX
    parts = {type(w).__name__: w.minimumSizeHint().height() for w in (
        window.splitter, window.cache_panel, window.controls, window.statusBar())}
    assert window.minimumSizeHint().height() <= 700 - 32, parts  # a title bar left


def test_the_audit_period_survives_a_restart(make_window: Any, qtbot: Any,
                                             tiny_moe: Path) -> None:
    """The control and the engine agree after a restart: audits on as the user left them."""
    w = make_window()
    load(qtbot, w, tiny_moe, budget="25%", policy="quality-first", n_ctx=256)
    w.controls.audit.setCurrentIndex(w.controls.audit.findData(16))
    qtbot.waitUntil(lambda: w.client.worker.engine.audit_every == 16, timeout=10_000)
    w.close()
    again = make_window()
    load(qtbot, again, tiny_moe, budget="25%", policy="quality-first", n_ctx=256)
    assert again.controls.audit.currentData() == 16
    qtbot.waitUntil(lambda: again.client.worker.engine.audit_every == 16, timeout=10_000)
    again.controls.audit.setCurrentIndex(again.controls.audit.findData(0))
    qtbot.waitUntil(lambda: again.client.worker.engine.audit_every == 0, timeout=10_000)
    again.close()
    third = make_window()
    load(qtbot, third, tiny_moe, budget="25%", policy="quality-first", n_ctx=256)
    assert third.controls.audit.currentData() == 0
    assert third.client.worker.engine.audit_every == 0
