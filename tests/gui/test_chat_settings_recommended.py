"""A model's recommended sampling (its GGUF's ``general.sampling.*``, from the authors'
generation_config.json): the window takes it while its settings are MoEScope's defaults or
the previous model's, shows it, and leaves the user's own settings alone."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from gguf import GGUFValueType
from gui_helpers import load
from PySide6.QtCore import Qt

from moescope.model.gguf_info import read_model_info
from moescope.model.sampling_defaults import describe, model_sampling
from moescope_testing.hostile import rewrite_gguf

F32, I32 = GGUFValueType.FLOAT32, GGUFValueType.INT32


def recommending(base: Path, dest: Path, **values: tuple[GGUFValueType, object]) -> Path:
    return rewrite_gguf(base, dest, set_keys={f"general.sampling.{k}": v
                                              for k, v in values.items()})


def test_values_are_read_bounded_and_described(tiny_moe: Path, tmp_path: Path) -> None:
    qwen = recommending(tiny_moe, tmp_path / "q.gguf", temp=(F32, 0.6), top_p=(F32, 0.95),
                        top_k=(I32, 20), penalty_repeat=(F32, 1.0))
    values = model_sampling(read_model_info(qwen).metadata)
    assert values == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "repeat_penalty": 1.0}
    assert describe(values) == "temperature 0.6, top-p 0.95, top-k 20, repeat penalty 1"
    bad = recommending(tiny_moe, tmp_path / "b.gguf", temp=(F32, float("nan")),
                       top_p=(F32, 1.5), top_k=(I32, -3), min_p=(F32, 0.1))
    assert model_sampling(read_model_info(bad).metadata) == {"min_p": 0.1}
    assert model_sampling(read_model_info(tiny_moe).metadata) == {}


def test_the_window_takes_a_models_recommendation_and_keeps_the_users(
        make_window: Any, qtbot: Any, tiny_moe: Path, tmp_path: Path) -> None:
    qwen = recommending(tiny_moe, tmp_path / "qwen.gguf", temp=(F32, 0.6),
                        top_p=(F32, 0.95), top_k=(I32, 20), penalty_repeat=(F32, 1.0))
    oss = recommending(tiny_moe, tmp_path / "oss.gguf", temp=(F32, 1.0), top_p=(F32, 1.0))
    w = make_window()
    panel = w.chat_settings
    assert not panel.model_row.isVisibleTo(panel)
    load(qtbot, w, qwen)
    assert (panel.temperature.value(), panel.top_p.value(), panel.top_k.value()) == \
        (0.6, 0.95, 20), "MoEScope's defaults give way to the model's"
    assert panel.model_row.isVisibleTo(panel) and not panel.use_model.isVisibleTo(panel)
    assert "temperature 0.6, top-p 0.95, top-k 20" in panel.model_note.text()
    s = panel.sampling()
    assert s.repeat_penalty == 1.0 and s.min_p == 0.05  # not shown: the model's, if given
    load(qtbot, w, oss)  # the previous model's values: the new one's replace them, and
    # what it leaves unsaid is MoEScope's default again (top-k)
    assert (panel.temperature.value(), panel.top_p.value(), panel.top_k.value()) == \
        (1.0, 1.0, 40)
    assert panel.sampling().repeat_penalty == 1.1  # this one says nothing of it
    panel.temperature.setValue(0.3)  # the user's own choice
    assert not panel.from_model and panel.use_model.isVisibleTo(panel)
    load(qtbot, w, qwen)
    assert panel.temperature.value() == 0.3, "a user's setting is not replaced"
    assert panel.use_model.isVisibleTo(panel)
    qtbot.mouseClick(panel.use_model, Qt.MouseButton.LeftButton)
    assert (panel.temperature.value(), panel.top_k.value()) == (0.6, 20)
    assert not panel.use_model.isVisibleTo(panel) and panel.from_model
    assert panel.values()["from_model"] is True
    load(qtbot, w, tiny_moe)  # no recommendation: nothing shown, MoEScope's defaults
    assert not panel.model_row.isVisibleTo(panel)
    assert (panel.temperature.value(), panel.top_k.value()) == (0.7, 40)
    panel.temperature.setValue(0.2)
    load(qtbot, w, oss)  # the user's, kept: no model's recommendation replaces it
    assert panel.temperature.value() == 0.2 and panel.use_model.isVisibleTo(panel)
