"""Bad inputs end in one clear dialog, and the window stays usable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from gui_helpers import load, send

from moescope.gui.worker import LoadRequest


@pytest.mark.parametrize("kind", ["random", "truncated_data", "bad_magic"])
def test_corrupt_gguf_shows_a_message_and_the_app_stays_usable(
        make_window: Any, qtbot: Any, dialogs: Any, broken_file: Any, tiny_moe: Path,
        kind: str) -> None:
    w = make_window()
    path = broken_file(kind)
    with qtbot.waitSignal(w.modelFailed, timeout=30_000) as blocker:
        w.load_model(path)
    message = blocker.args[0]
    assert path.name in message or "GGUF" in message
    (shown,) = dialogs.shown
    assert shown[0] == "critical" and shown[1] == "Could not load the model"
    assert "Traceback" not in shown[2] and "\n" not in shown[2]
    assert w.model is None and not w.loading
    # still usable: a good model loads and answers
    load(qtbot, w, tiny_moe)
    assert send(qtbot, w, "hi", max_tokens=3).n_tokens == 3


def test_corrupt_gguf_from_the_open_dialog_path(make_window: Any, dialogs: Any,
                                                broken_file: Any) -> None:
    w = make_window()
    w.prepare_open(broken_file("truncated_header"))
    (shown,) = dialogs.shown
    assert shown[1] == "Cannot open this model" and "truncated" in shown[2]


def test_dense_model_loads_with_the_cache_off_and_says_so(
        make_window: Any, qtbot: Any, dialogs: Any, dense_model: Path) -> None:
    w = make_window()
    summary = load(qtbot, w, dense_model)
    assert not summary.cache_enabled
    (shown,) = dialogs.shown
    assert shown[0] == "warning" and "expert cache off" in shown[2]
    assert not w.controls.budget.isEnabled()
    assert "expert cache off" in w.controls.budget_label.text()
    # a fixed seed: a random one's first token was now and then the template's turn
    # opener, which ends an answer (0 tokens, make test 2026-12-04)
    w.chat_settings.seed.setValue(7)
    assert send(qtbot, w, "hi", max_tokens=3).n_tokens > 0


def test_too_small_budget_is_explained(make_window: Any, qtbot: Any, dialogs: Any,
                                       tiny_moe: Path) -> None:
    w = make_window()
    summary = load(qtbot, w, tiny_moe, budget="1KiB", policy="quality-first")
    assert summary.slots_per_layer == summary.top_k
    (shown,) = dialogs.shown
    assert shown[0] == "warning"
    assert "holds only 0 expert(s) per layer" in shown[2]
    assert "minimum of top-k = 4 slots" in shown[2]


def test_unreadable_budget_is_an_error_not_a_crash(make_window: Any, qtbot: Any,
                                                   dialogs: Any, tiny_moe: Path) -> None:
    w = make_window()
    with qtbot.waitSignal(w.modelFailed, timeout=30_000):
        w.load_model(LoadRequest(str(tiny_moe), budget="lots"))
    assert "cannot read budget" in dialogs.shown[0][2]


def test_missing_file_is_explained(make_window: Any, dialogs: Any, tmp_path: Path) -> None:
    w = make_window()
    w.prepare_open(tmp_path / "nope.gguf")
    assert dialogs.shown and dialogs.shown[0][0] == "critical"
