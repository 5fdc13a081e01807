"""``Engine.cancel_load``: llama.cpp's own loading progress is reported, and a cancel ends
the load at its next step with nothing loaded, the engine ready for the next load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.engine import Engine, LoadCancelled


@pytest.mark.usefixtures("engine_required")
def test_a_load_reports_llamas_progress_and_can_be_cancelled(
        synth_model: Callable[..., Path]) -> None:
    model = synth_model("qwen3moe")
    engine = Engine()
    engine.cancel_load()  # meant for no load: the next one is not cancelled by it
    stages: list[tuple[str, float]] = []
    engine.load(model, n_ctx=256, progress=lambda s, f: stages.append((s, f)))
    weights = [f for s, f in stages if s == "loading weights"]
    assert len(weights) > 3 and weights == sorted(weights)  # llama.cpp's own steps
    assert weights[0] == pytest.approx(0.1) and weights[-1] == pytest.approx(0.8)
    assert [s for s, _ in stages][-3:] == ["allocating expert slots", "warming up", "ready"]

    def cancel_midway(stage: str, fraction: float) -> None:
        if stage == "loading weights" and fraction > 0.3:
            engine.cancel_load()

    with pytest.raises(LoadCancelled, match="cancelled"):
        engine.load(model, n_ctx=256, progress=cancel_midway)
    assert not engine.loaded and engine.cache is None
    engine.load(model, n_ctx=256)
    assert engine.loaded
    engine.close()


@pytest.mark.usefixtures("engine_required")
def test_ctrl_c_during_a_load_interrupts_it(synth_model: Callable[..., Path]) -> None:
    """The load is one C call: Ctrl+C's KeyboardInterrupt surfaces in the progress
    callback, where ctypes would swallow it; it ends the load and is raised after it."""
    engine = Engine()

    def interrupt(stage: str, fraction: float) -> None:
        if stage == "loading weights" and fraction > 0.2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        engine.load(synth_model("qwen3moe"), n_ctx=256, progress=interrupt)
    assert not engine.loaded
    engine.load(synth_model("qwen3moe"), n_ctx=256)
    assert engine.loaded
    engine.close()


@pytest.mark.usefixtures("engine_required")
def test_a_load_cancelled_while_it_uploads_leaves_no_copy_running(
        synth_model: Callable[..., Path]) -> None:
    """Regression: on a GPU build the experts go to pinned memory and the weights are read
    without mmap, so llama.cpp uploads the device's tensors asynchronously, the largest
    first, through staging buffers. A cancel right after the first of them used to return
    with its copies still queued, and the model's device buffers were freed under them:
    Vulkan's queue thread (lavapipe's) then crashed the process with a segmentation fault,
    most often within a few such cancels. A cancel now waits for the copies first. (On the
    CPU build the weights are mapped and nothing is uploaded: the same cancels, no race.)"""
    model = synth_model("qwen3moe")
    engine = Engine()
    for _ in range(10):
        def cancel_after_the_first_step(stage: str, fraction: float) -> None:
            if stage == "loading weights" and fraction > 0.1 + 1e-6:  # 0.1: llama.cpp's start
                engine.cancel_load()

        with pytest.raises(LoadCancelled):
            engine.load(model, n_ctx=256, progress=cancel_after_the_first_step)
        assert not engine.loaded
    engine.load(model, n_ctx=256)
    assert engine.loaded and engine.cache is not None
    engine.close()
