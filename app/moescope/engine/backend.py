"""Which backend the installed engine was built for, and one line saying what that means.

engine_patch/build_engine.py picks the backend (CUDA, Vulkan or CPU) from what the machine
has and writes its choice and the reason into ``moescope_build.json`` beside libllama.so;
the window shows the line from :func:`backend_text` in its About dialog and memory view, so
a user whose GPU went unused learns why instead of just seeing no speedup.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from moescope.util.resources import engine_lib_dir

if TYPE_CHECKING:
    from moescope.engine.devices import Device

BUILD_INFO = "moescope_build.json"
NAMES = {"cpu": "CPU", "cuda": "CUDA", "vulkan": "Vulkan"}


@dataclass(frozen=True)
class EngineBuild:
    """The installed engine's backend ("cpu", "cuda", "vulkan"; "" when unknown) and the
    build's reason for it ("" when the build left none, e.g. an older build)."""

    backend: str
    reason: str = ""


def engine_build(lib_dir: Path | None = None) -> EngineBuild:
    """Read the build's record; without one, tell the backend from the libraries present."""
    lib_dir = lib_dir if lib_dir is not None else engine_lib_dir()
    if lib_dir is None:
        return EngineBuild("", "the engine is not installed (make engine)")
    try:
        raw = (lib_dir / BUILD_INFO).read_text(encoding="utf-8")[:4096]
        data = json.loads(raw)
        backend = str(data.get("backend", ""))
        if backend in NAMES:
            return EngineBuild(backend, " ".join(str(data.get("reason", "")).split())[:300])
    except (OSError, ValueError, AttributeError):
        pass
    for backend in ("cuda", "vulkan"):
        if (lib_dir / f"libggml-{backend}.so").exists():
            return EngineBuild(backend)
    return EngineBuild("cpu" if (lib_dir / "libllama.so").exists() else "")


def backend_text(build: EngineBuild, slot_buffer: str = "",
                 devices: list[Device] | None = None) -> str:
    """One line for the window: the backend, why, and where the expert slots live.

    ``slot_buffer`` is llama.cpp's name for the loaded model's slot buffer ("CUDA0",
    "Vulkan0", "CPU"; "" when no model with the cache is loaded). ``devices``: ggml's
    devices (default: asked of the engine's library on a GPU build,
    :func:`moescope.engine.devices.ggml_devices`), to name the GPU and its memory."""
    if not build.backend:
        return f"Engine backend unknown{': ' + build.reason if build.reason else ''}"
    name = NAMES[build.backend]
    why = f": {build.reason}" if build.reason else ""
    if build.backend == "cpu":
        return f"CPU build{why or ': no GPU backend'}; slots are in RAM and speedups need a GPU"
    if devices is None:
        from moescope.engine.devices import ggml_devices

        devices = ggml_devices()
    gpus = [d for d in devices if d.kind == "gpu"] or [d for d in devices if d.kind == "igpu"]
    named = {d.name: d for d in devices}
    if slot_buffer and not slot_buffer.upper().startswith("CPU"):
        dev = named.get(slot_buffer)
        where = f"slots are in GPU memory ({slot_buffer}{_memory(dev)})"
    elif slot_buffer:
        where = "slots are in RAM: no layers are on the GPU"
    elif not gpus:
        where = "no GPU seen by this build, so slots go to RAM"
    else:
        where = f"slots go to GPU memory ({gpus[0].name}{_memory(gpus[0])})"
    return f"{name} build{why}; {where}"


def _memory(dev: Device | None) -> str:
    """": the card, 7.5 GiB free of 8.0 GiB" for :func:`backend_text` ("" unknown)."""
    if dev is None:
        return ""
    from moescope.cache.budget import format_bytes

    text = f": {dev.description}" if dev.description else ""
    if dev.kind == "igpu":
        return text + ", integrated: its memory is the machine's RAM"
    if dev.total > 0:
        text += f", {format_bytes(dev.free)} free of {format_bytes(dev.total)}"
    return text
