"""The GPU ggml sees, and its memory, where NVML sees none: on the CPU build there is none and
the slots are in RAM; on the Vulkan build over lavapipe (`make test`) the device the engine
puts the slots on is named and measured in the fit estimate and the memory view, so an AMD
or Intel user is no longer told "not measured". An integrated GPU's memory is the machine's
RAM: its slots count against RAM in the estimate and in the automatic RAM budget."""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from moescope.display.fit import estimate_fit
from moescope.display.memory_model import MemoryModel
from moescope.engine import engine as engine_module
from moescope.engine.backend import engine_build
from moescope.engine.devices import Device, ggml_devices, slot_device
from moescope.model.gguf_info import read_model_info


def test_the_device_the_engine_uses_is_the_one_named_and_measured(
        engine: Callable[..., Any], tiny_moe: Path, monkeypatch: Any) -> None:
    import moescope.display.fit as fit_module
    import moescope.display.memory_model as memory_module

    monkeypatch.setattr(fit_module, "gpu_status", lambda: None)  # no NVML: ggml's figures
    monkeypatch.setattr(memory_module, "gpu_status", lambda: None)
    devices = ggml_devices()
    assert any(d.kind == "cpu" and d.total > 0 for d in devices), devices
    e = engine(tiny_moe, budget="25%", policy="exact")
    slots = e.model.slot_buffer
    info = read_model_info(tiny_moe)
    fit = estimate_fit(info, "25%", n_ctx=512)
    memory = MemoryModel(capacity=4)
    memory.slots_on_device = not slots.upper().startswith("CPU")
    memory.sample()
    dev = slot_device()
    if dev is None:  # the CPU build, or a GPU build that sees no GPU
        assert slots == "CPU"
        assert not fit.slots_on_gpu and fit.vram_free is None and "slots in RAM" in fit.gpu
        assert fit.ram_needed == (info.non_expert_bytes + info.total_expert_bytes
                                  + fit.kv_bytes + fit.vram_needed + fit.working_bytes)
        assert engine_module._slots_in_ram(None)
        assert memory.gpu is None and math.isnan(memory.samples.last("vram_system"))
        return
    assert engine_build().backend in ("cuda", "vulkan") and dev.kind in ("gpu", "igpu")
    assert slots == dev.name, "the device named is the one holding the slots"
    assert dev.total > 0 and 0 <= dev.free <= dev.total
    if dev.host_memory:
        assert not fit.slots_on_gpu and "integrated GPU" in fit.gpu
        return
    assert fit.slots_on_gpu and fit.vram_free is not None
    assert (dev.description or dev.name) in fit.gpu and "free of" in fit.gpu
    assert "not measured" not in dict(fit.lines())["Expert slots"]
    assert not engine_module._slots_in_ram(None, slots)
    assert memory.gpu is not None and memory.gpu.total == dev.total
    assert memory.samples.last("vram_system") >= 0
    assert "VRAM: system" in memory.summary()


@pytest.mark.parametrize("kind", ["gpu", "igpu", None])
def test_the_estimate_prices_the_slots_where_the_device_keeps_them(
        tiny_moe: Path, monkeypatch: Any, kind: str | None) -> None:
    """A discrete GPU's slots take VRAM (and its free memory is checked); an integrated
    GPU's and a GPU build's without a GPU take RAM."""
    import moescope.display.fit as fit_module

    monkeypatch.setattr(fit_module, "gpu_status", lambda: None)
    info = read_model_info(tiny_moe)
    dev = None if kind is None else Device("Vulkan0", "Radeon", kind, 1 << 10, 1 << 30)
    fit = estimate_fit(info, "25%", n_ctx=512, backend="vulkan", device=dev)
    host = info.non_expert_bytes + info.total_expert_bytes + fit.kv_bytes + fit.working_bytes
    if kind == "gpu":
        assert fit.slots_on_gpu and fit.ram_needed == host and fit.vram_free == 1 << 10
        assert "Radeon (Vulkan): 1.00 KiB free of 1.00 GiB" in fit.gpu
        assert not fit.fits_vram and any("VRAM" in w for w in fit.warnings())
    else:
        assert not fit.slots_on_gpu and fit.ram_needed == host + fit.vram_needed
        assert fit.vram_free is None and fit.fits_vram
        assert ("integrated GPU" if kind else "no GPU seen by the Vulkan build") in fit.gpu
    monkeypatch.setattr("moescope.engine.devices.slot_device", lambda backend=None: dev)
    monkeypatch.setattr("moescope.engine.backend.engine_build",
                        lambda lib_dir=None: type(engine_build())("vulkan"))
    assert engine_module._slots_in_ram(None) is (kind != "gpu")


def test_the_backend_line_names_the_gpu_and_its_memory() -> None:
    from moescope.engine.backend import EngineBuild, backend_text

    vulkan = EngineBuild("vulkan", "glslc found")
    card = Device("Vulkan0", "Radeon RX 7900 XTX", "gpu", 20 << 30, 24 << 30)
    apu = Device("Vulkan0", "Radeon 780M", "igpu", 8 << 30, 16 << 30)
    cpu = Device("CPU", "Ryzen", "cpu", 30 << 30, 64 << 30)
    assert backend_text(vulkan, devices=[cpu, card]) == (
        "Vulkan build: glslc found; slots go to GPU memory (Vulkan0: Radeon RX 7900 XTX, "
        "20.0 GiB free of 24.0 GiB)")
    assert "integrated: its memory is the machine's RAM" in backend_text(vulkan,
                                                                         devices=[cpu, apu])
    assert backend_text(vulkan, devices=[cpu]).endswith("no GPU seen by this build, so "
                                                        "slots go to RAM")
    assert backend_text(vulkan, "Vulkan0", devices=[card]).endswith(
        "slots are in GPU memory (Vulkan0: Radeon RX 7900 XTX, 20.0 GiB free of 24.0 GiB)")
    assert backend_text(vulkan, "CPU", devices=[card]).endswith("no layers are on the GPU")


def test_info_names_where_the_slots_go_and_prints_nothing_else(tiny_moe: Path) -> None:
    """`moescope info` reads the header only; asking ggml for its devices starts a GPU
    backend, whose own listing of devices must not reach the terminal."""
    import os
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-m", "moescope", "info", str(tiny_moe)],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert run.returncode == 0 and run.stderr == "", run.stderr
    engine_line = [line for line in run.stdout.splitlines() if line.startswith("engine")]
    assert len(engine_line) == 1
    dev = slot_device()
    if engine_build().backend == "cpu":
        assert "slots are in RAM" in engine_line[0]
    elif dev is None:
        assert "no GPU seen by this build" in engine_line[0]
    else:
        assert f"slots go to GPU memory ({dev.name}" in engine_line[0]
