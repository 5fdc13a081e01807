"""The RAM tier (experts read from disk) on whichever build runs the tests: a CPU build's
slots in RAM, a GPU build's in device memory (the Vulkan build over lavapipe in `make test`),
filled from pinned RAM slots. GPU builds refused a RAM budget until the read-error path was
fixed (docs/engine.md, "The disk tier on GPU builds"); now the open dialog offers one and
the engine runs it everywhere. Exactness per architecture: test_disk_tier.py."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import gpu_offload

from moescope.engine import Engine, Sampling
from moescope.engine.backend import NAMES, engine_build
from moescope.model.gguf_info import read_model_info


def test_the_open_dialogs_ram_budget_loads_on_this_build(
        engine: Callable[..., Engine], synth_model: Callable[..., Path], qtbot: Any) -> None:
    """The dialog's RAM slider is live on every build and what it asks for loads: experts
    left in the file, a RAM tier of the slider's size, slots where the build puts them."""
    from moescope.gui.dialogs.open_model import OpenModelDialog

    path = synth_model("qwen3moe", expert_type="q8_0")
    info = read_model_info(path)
    dialog = OpenModelDialog(info, budget="25%")
    qtbot.addWidget(dialog)
    assert dialog.ram_budget.isEnabled()
    dialog.ram_budget.setValue(info.top_k + 2)
    request = dialog.request()
    assert request.ram_budget is not None
    e = engine(path, budget=request.budget, policy="exact", ram_budget=request.ram_budget)
    assert e.model is not None and e.model.disk_experts and e.model.ram_plan is not None
    assert e.ram_slots_per_layer == info.top_k + 2
    assert e.model.expert_buffer.startswith("CPU"), "experts stay in the mapped file"
    if gpu_offload():
        assert e.model.slot_buffer == f"{NAMES[engine_build().backend]}0"
    else:
        assert e.model.slot_buffer == "CPU"
    list(e.generate("Hello", Sampling(max_tokens=6, temperature=0.0)))
    assert e.last_answer.cache.bytes_disk > 0


@pytest.mark.parametrize("arch", ["qwen3moe", "gpt-oss"])
def test_a_failed_read_during_decode_is_reported_not_fatal(
        engine: Callable[..., Engine], synth_model: Callable[..., Path], arch: str) -> None:
    """A read that fails leaves zeros, never stale or uninitialised bytes, in the RAM slot,
    and later layers of the failing step route nothing through the core: on the Vulkan
    build the garbage once made the device's top-k hand the core repeated expert ids, and
    the process aborted. Every step of the answer fails after the first failed read."""
    from moescope.engine.engine import DiskReadError

    e = engine(synth_model(arch, expert_type="q8_0"), budget="25%", policy="exact",
               ram_budget="30%")
    for after in (0, 5, 30):
        e.set_fail_reads(after)
        with pytest.raises(DiskReadError, match="Input/output error"):
            list(e.generate("Hello there", Sampling(max_tokens=40, temperature=0.0)))
    e.set_fail_reads(-1)
    assert len(list(e.generate("Hello", Sampling(max_tokens=4, temperature=0.0)))) == 4
