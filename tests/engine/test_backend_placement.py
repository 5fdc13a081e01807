"""Where the engine puts the expert slots: device memory whenever the build has a GPU device
(the Vulkan build over lavapipe in `make test`, CUDA on a GPU machine), RAM on the CPU build;
and the experts stay in host memory in GGUF layout either way."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from moescope.engine.backend import NAMES, engine_build


def test_slots_live_in_the_build_backends_memory(engine: Callable[..., object],
                                                 tiny_moe: Path) -> None:
    import llama_cpp

    e = engine(tiny_moe, budget="25%", policy="exact")
    model = e.model  # type: ignore[attr-defined]
    build = engine_build()
    if llama_cpp.llama_supports_gpu_offload():
        assert build.backend in ("cuda", "vulkan")
        assert model.slot_buffer == f"{NAMES[build.backend]}0", "slots in device memory"
        assert model.n_gpu_layers == -1, "every layer on the GPU by default"
        assert model.expert_buffer == f"{NAMES[build.backend]}_Host", "experts pinned in RAM"
    else:
        assert model.slot_buffer == "CPU"
        assert model.n_gpu_layers == 0
        assert model.expert_buffer.startswith("CPU")


def test_explicit_cpu_placement_keeps_slots_in_ram(engine: Callable[..., object],
                                                   tiny_moe: Path) -> None:
    """n_gpu_layers=0 on any build: the layers and their slots stay on the CPU."""
    e = engine(tiny_moe, budget="25%", policy="exact", n_gpu_layers=0)
    assert e.model.slot_buffer == "CPU"  # type: ignore[attr-defined]
