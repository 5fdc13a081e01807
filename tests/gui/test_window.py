"""Window-level behaviour: close mid-answer, About, logs, accessibility, keyboard."""

from __future__ import annotations

from typing import Any

from gui_helpers import LONG_PROMPT, drag_accepted, drop, slow_down

from moescope.engine.backend import NAMES, backend_text, engine_build
from moescope.gui.dialogs.about import LLAMA_CPP_COMMIT, versions
from moescope.session.store import STOPPED, ChatStore


def test_closing_mid_answer_stops_cleanly_and_keeps_the_text(window: Any, qtbot: Any,
                                                             data_dir: Any) -> None:
    slow_down(window, 5000)
    window.chat_settings.max_tokens.setValue(300)
    window.chat.send(LONG_PROMPT)
    qtbot.waitUntil(lambda: window.chat.tokens_received >= 3, timeout=30_000)
    chat_id = window.chat.chat_id
    window.close()
    assert not window.client.thread.isRunning()
    store = ChatStore(data_dir / "chats.sqlite3")
    answer = store.messages(chat_id)[-1]
    assert answer.role == "assistant" and answer.status == STOPPED and answer.content
    store.close()


def test_about_lists_engine_commit_and_gpu() -> None:
    rows = dict(versions())
    import llama_cpp

    assert rows["Engine (llama-cpp-python + patch key)"] == llama_cpp.__version__
    assert "moescope" in llama_cpp.__version__
    assert rows["llama.cpp commit"] == LLAMA_CPP_COMMIT == "0c1e570"
    assert rows["GPU"]
    assert rows["Engine backend"] == backend_text(engine_build())
    assert rows["Engine backend"].startswith(("CPU build", "CUDA build", "Vulkan build"))


def test_about_fits_a_1024_pixel_screen(qtbot: Any) -> None:
    """The backend's reason is one long line: unwrapped, the box was 1,210 px wide."""
    from moescope.gui.dialogs.about import ABOUT_MAX_WIDTH, AboutDialog

    dialog = AboutDialog()
    qtbot.addWidget(dialog)
    assert dialog.sizeHint().width() <= ABOUT_MAX_WIDTH + 60 < 1024
    assert "llvmpipe" in dialog.table.text() or "build" in dialog.table.text()


def test_memory_view_says_where_the_slots_are_and_why(window: Any) -> None:
    """The backend the build chose, its reason, and the loaded model's slot buffer."""
    import llama_cpp

    text = window.cache_panel.memory_view.backend_label.text()
    build = engine_build()
    assert build.reason and build.reason in text, "the build recorded why it chose this"
    if llama_cpp.llama_supports_gpu_offload():
        assert f"slots are in GPU memory ({NAMES[build.backend]}0" in text  # and its memory
    else:
        assert text.startswith("CPU build") and "slots are in RAM" in text


def test_logs_panel_shows_engine_and_app_events(window: Any, qtbot: Any) -> None:
    qtbot.waitUntil(lambda: "loaded" in window.logs.toPlainText(), timeout=5_000)
    assert "moescope.gui.worker" in window.logs.toPlainText()


def test_controls_have_accessible_names_and_take_keyboard_focus(window: Any) -> None:
    for widget in (window.controls.policy_combo, window.controls.budget,
                   window.controls.theta, window.controls.beta, window.chat_view.input,
                   window.chat_view.send_button, window.chat_view.stop_button,
                   window.chat_list.list, window.chat_list.search,
                   window.chat_settings.temperature, window.cache_panel.heatmap):
        assert widget.accessibleName(), widget
    for widget in (window.controls.policy_combo, window.controls.budget,
                   window.chat_view.input, window.chat_view.send_button):
        assert widget.focusPolicy() & widget.focusPolicy().TabFocus
    shortcuts = {a.shortcut().toString() for a in window.actions()}
    assert {"Ctrl+T", "Ctrl+O", "Ctrl+N", "Esc", "Ctrl+R", "Ctrl+E"} <= shortcuts


def test_open_model_shows_the_fit_estimate_then_loads(make_window: Any, qtbot: Any,
                                                      monkeypatch: Any, tiny_moe: Any) -> None:
    from moescope.gui.dialogs.open_model import OpenModelDialog

    seen: list[set[str]] = []

    def accept(dialog: OpenModelDialog) -> int:
        form = dialog.estimate_form
        seen.append({form.itemAt(i, form.ItemRole.LabelRole).widget().text()
                     for i in range(form.rowCount())})
        dialog.budget.setValue(8)  # the user picks 8 slots per layer
        return OpenModelDialog.DialogCode.Accepted

    monkeypatch.setattr(OpenModelDialog, "exec", accept)
    w = make_window()
    with qtbot.waitSignal(w.modelLoaded, timeout=30_000) as blocker:
        w.prepare_open(tiny_moe)
    (labels,) = seen
    assert {"Non-expert weights", "Expert weights (host RAM)", "Slots per layer",
            "RAM needed", "GPU"} <= labels
    assert blocker.args[0].slots_per_layer == 8
    qtbot.waitUntil(lambda: not w.findChildren(OpenModelDialog))  # freed after use
    assert w.recent_models() == [str(tiny_moe)]


def test_dropping_a_gguf_on_the_window_opens_it(make_window: Any, monkeypatch: Any,
                                                tiny_moe: Any) -> None:
    w = make_window()
    opened: list[str] = []
    monkeypatch.setattr(w, "prepare_open", lambda path: opened.append(str(path)))
    drop(w, tiny_moe)
    assert opened == [str(tiny_moe)]


def test_dropping_a_trace_of_any_format_opens_it_and_other_files_are_refused(
        make_window: Any, monkeypatch: Any, tmp_path: Any) -> None:
    from moescope.trace import TRACE_SUFFIXES

    w = make_window()
    traces: list[str] = []
    models: list[str] = []
    monkeypatch.setattr(w, "open_trace", lambda path: traces.append(str(path)))
    monkeypatch.setattr(w, "prepare_open", lambda path: models.append(str(path)))

    names = [f"20200101-000000-m{s}" for s in TRACE_SUFFIXES] + ["s.parquet.journal.arrows"]
    for name in names:
        assert drag_accepted(w, tmp_path / name), name
        drop(w, tmp_path / name)
    assert traces == [str(tmp_path / n) for n in names] and not models
    assert not drag_accepted(w, tmp_path / "notes.txt")
    assert not drag_accepted(w, tmp_path / "t.json")


def test_open_model_names_a_split_models_files_and_a_thinking_switch(
        make_window: Any, qtbot: Any, tmp_path: Any) -> None:
    from moescope.gui.dialogs.open_model import OpenModelDialog
    from moescope.model.gguf_info import read_model_info
    from moescope_testing import preset, write_synth_model
    from moescope_testing.vocab import HYBRID_THINKING_CHAT_TEMPLATE

    first = write_synth_model(tmp_path / "m.gguf", preset(
        "tiny", "qwen3moe", chat_template=HYBRID_THINKING_CHAT_TEMPLATE), parts=2)
    make_window()  # the QApplication and its style
    dialog = OpenModelDialog(read_model_info(first.with_name("m-00002-of-00002.gguf")))
    qtbot.addWidget(dialog)
    rows = {dialog.estimate_form.itemAt(i, dialog.estimate_form.ItemRole.LabelRole)
            .widget().text(): dialog.estimate_form.itemAt(
                i, dialog.estimate_form.ItemRole.FieldRole).widget().text()
            for i in range(dialog.estimate_form.rowCount())}
    assert rows["Files"].startswith("2 parts (m-00001-of-00002.gguf")
    assert rows["Thinking"] == "switch in Chat settings: off/on/low/medium/high"
    assert dialog.request().path == str(first)


def test_budget_and_policy_are_remembered_per_model(
        window: Any, qtbot: Any, synth_model: Any) -> None:
    from gui_helpers import load

    from moescope.gui.model_loading import model_key

    tiny = window.model.path
    engine = window.client.worker.engine
    window.controls.budget.setValue(8)
    qtbot.waitUntil(lambda: engine.slots_per_layer == 8, timeout=10_000)
    other = synth_model("olmoe", expert_type="q8_0")
    load(qtbot, window, other)
    window.controls.budget.setValue(12)
    window.controls.select_policy("speed-first")
    qtbot.waitUntil(lambda: engine.slots_per_layer == 12
                    and engine.policy_name == "speed-first", timeout=10_000)
    for path, slots, policy in ((tiny, 8, "quality-first"), (other, 12, "speed-first"),
                                (tiny, 8, "quality-first")):
        summary = load(qtbot, window, path)
        assert (summary.slots_per_layer, summary.policy) == (slots, policy), path
    # any part of a split model names the same settings
    assert model_key("/m/x-00002-of-00003.gguf") == model_key("/m/x-00001-of-00003.gguf")
    assert model_key("/m/x.gguf") != model_key("/m/y.gguf")


def test_the_shortcuts_dialog_lists_what_the_keys_do(window: Any, qtbot: Any) -> None:
    from PySide6.QtCore import Qt

    from moescope.gui.dialogs.shortcuts import ShortcutsDialog

    qtbot.keyClick(window, Qt.Key.Key_Slash, Qt.KeyboardModifier.ControlModifier)
    (dialog,) = [d for d in window.findChildren(ShortcutsDialog) if d.isVisible()]
    rows = {dialog.table.item(r, 0).text(): dialog.table.item(r, 1).text()
            for r in range(dialog.table.rowCount())}
    assert rows["Toggle Speed-first / previous policy"] == "Ctrl+T"
    assert rows["Compare policies on the last message"] == "Ctrl+Shift+P"
    assert rows["Copy last answer as Markdown"] == "Ctrl+Shift+C"
    assert rows["Keyboard shortcuts"] == "Ctrl+/"
    assert rows["Send the message"] == "Enter"
    assert "&" not in "".join(rows)
    dialog.close()
