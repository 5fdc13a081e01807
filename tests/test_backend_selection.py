"""Which engine backend `make` builds (engine_patch/build_engine.py's choose_backend) over faked
probes: nvcc with and without an NVIDIA driver, a software-only Vulkan device, a hardware one
with and without the build tools, nothing; and the line the window shows for each build."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import pytest

from moescope.engine.backend import EngineBuild, backend_text, engine_build

ROOT = Path(__file__).resolve().parent.parent
VULKAN_HEADERS = {"/usr/include/vulkan/vulkan.hpp", "/usr/include/spirv/unified1/spirv.hpp",
                  "/usr/lib/x86_64-linux-gnu/libvulkan.so.1"}
LAVAPIPE = ("deviceType = PHYSICAL_DEVICE_TYPE_CPU\n"
            "deviceName = llvmpipe (LLVM 15.0.6, 256 bits)\n")
RADEON = ("deviceType = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU\n"
          "deviceName = AMD Radeon RX 7900 XTX (RADV NAVI31)\n")


def _engine() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "build_engine_backend_test", ROOT / "engine_patch" / "build_engine.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


BE = _engine()


class Machine:
    """Fake probes: which tools are on PATH, what files exist, what commands print."""

    def __init__(self, tools: set[str], files: set[str] = frozenset(),  # type: ignore[assignment]
                 smi: str | None = None, vulkan: str | None = None) -> None:
        self.tools, self.files, self.smi, self.vulkan = tools, set(files), smi, vulkan
        self.commands: list[list[str]] = []

    def which(self, tool: str) -> str | None:
        return f"/usr/bin/{tool}" if tool in self.tools else None

    def exists(self, path: str) -> bool:
        return path in self.files

    def run(self, cmd: list[str]) -> str | None:
        self.commands.append(cmd)
        if cmd[0] == "nvidia-smi":
            return self.smi
        if cmd[0] == "vulkaninfo" or "--probe-vulkan" in cmd:
            return self.vulkan
        return None

    def choose(self, requested: str = "auto", **environ: str) -> object:
        return BE.choose_backend(requested, run=self.run, which=self.which, exists=self.exists,
                                 environ=environ)


def test_nvcc_and_a_driver_build_cuda_for_the_gpus_architectures(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BE, "cuda_toolkit_workarounds", lambda: [])  # this machine's toolkit
    m = Machine({"nvcc", "nvidia-smi"}, smi="NVIDIA H200, 9.0\nNVIDIA GeForce RTX 3090, 8.6\n")
    choice = m.choose()
    assert choice.backend == "cuda"
    assert choice.archs == "86;90"
    assert "NVIDIA H200" in choice.reason and "nvcc found" in choice.reason
    assert "-DCMAKE_CUDA_ARCHITECTURES=86;90" in BE.cuda_args(choice.archs)


def test_cmake_cuda_architectures_overrides_the_probe() -> None:
    m = Machine({"nvcc", "nvidia-smi"}, smi="NVIDIA H200, 9.0\n")
    assert m.choose(CMAKE_CUDA_ARCHITECTURES="89").archs is None  # cuda_args reads the env


def test_nvcc_without_a_driver_falls_back_and_says_why() -> None:
    for smi_tool in (set(), {"nvidia-smi"}):  # no nvidia-smi; or one that fails (no driver)
        choice = Machine({"nvcc", *smi_tool}, smi=None).choose()
        assert choice.backend == "cpu"
        assert choice.reason.startswith("no GPU found")
        assert "nvcc found but no NVIDIA driver or GPU" in choice.reason


def test_a_driver_without_nvcc_uses_vulkan_on_the_same_gpu() -> None:
    m = Machine({"nvidia-smi", "vulkaninfo", "glslc"}, VULKAN_HEADERS,
                smi="NVIDIA GeForce RTX 4090, 8.9\n",
                vulkan="deviceType = PHYSICAL_DEVICE_TYPE_DISCRETE_GPU\n"
                       "deviceName = NVIDIA GeForce RTX 4090\n")
    choice = m.choose()
    assert choice.backend == "vulkan"
    assert "RTX 4090" in choice.reason


def test_a_software_vulkan_device_is_not_worth_a_gpu_build() -> None:
    m = Machine({"vulkaninfo", "glslc"}, VULKAN_HEADERS, vulkan=LAVAPIPE)
    choice = m.choose()
    assert choice.backend == "cpu"
    assert choice.reason == "no GPU found; only a software Vulkan device (llvmpipe)"


def test_a_hardware_vulkan_device_with_the_tools_builds_vulkan() -> None:
    m = Machine({"vulkaninfo", "glslc"}, VULKAN_HEADERS, vulkan=LAVAPIPE + RADEON)
    choice = m.choose()
    assert choice.backend == "vulkan"
    assert choice.reason == "Vulkan GPU AMD Radeon RX 7900 XTX (RADV NAVI31) and glslc found"


def test_a_hardware_vulkan_device_without_glslc_names_the_packages() -> None:
    m = Machine({"vulkaninfo"}, {"/usr/include/vulkan/vulkan.hpp"}, vulkan=RADEON)
    choice = m.choose()
    assert choice.backend == "cpu"
    assert "needs glslc, spirv-headers" in choice.reason
    assert BE.VULKAN_PACKAGES in choice.reason


def test_without_vulkaninfo_a_child_process_probes_libvulkan() -> None:
    m = Machine({"glslc"}, VULKAN_HEADERS, vulkan=RADEON)
    assert m.choose().backend == "vulkan"
    assert any("--probe-vulkan" in cmd for cmd in m.commands)


def test_nothing_at_all_builds_the_cpu_engine() -> None:
    m = Machine(set())
    choice = m.choose()
    assert (choice.backend, choice.reason) == ("cpu", "no GPU found")
    assert m.commands == [], "no probe runs when its tool is absent"


def test_an_explicit_backend_wins_and_bad_values_say_what_is_allowed() -> None:
    m = Machine({"nvcc", "nvidia-smi"}, smi="NVIDIA H200, 9.0\n")
    assert m.choose("cpu").backend == "cpu"
    assert m.choose("vulkan").reason == "MOESCOPE_BACKEND=vulkan"
    assert BE.requested_backend({}) == "auto"
    assert BE.requested_backend({"MOESCOPE_CUDA": "1"}) == "cuda"
    assert BE.requested_backend({"MOESCOPE_BACKEND": " Vulkan "}) == "vulkan"
    with pytest.raises(BE.BuildError, match="not one of auto, cpu, cuda, vulkan"):
        BE.requested_backend({"MOESCOPE_BACKEND": "metal"})


def test_garbage_from_nvidia_smi_is_not_an_architecture() -> None:
    m = Machine({"nvcc", "nvidia-smi"}, smi="No devices were found\n, 9.x\nGPU, 123456789.0\n")
    assert m.choose().backend == "cpu"


def test_each_backend_has_its_own_cache_key_and_patches(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(BE, "cuda_toolkit_workarounds", lambda: [])
    sha = BE.read_lock()["sha256"]
    keys = {b: BE.cache_key(sha, b) for b in BE.BACKENDS}
    assert len(set(keys.values())) == 3
    vulkan_only = [p.name for p in BE.patches("vulkan") if p not in BE.patches("cpu")]
    assert vulkan_only == ["0003-build-vulkan-headers-without-layer-settings.patch"]
    assert BE.patches("cuda") == BE.patches("cpu"), "the guard leaves the other keys alone"


def test_the_window_line_for_each_build(tmp_path: Path) -> None:
    assert backend_text(EngineBuild("cpu", "no GPU found")) == (
        "CPU build: no GPU found; slots are in RAM and speedups need a GPU")
    vk = EngineBuild("vulkan", "Vulkan GPU AMD Radeon RX 7900 XTX and glslc found")
    assert backend_text(vk, "Vulkan0").endswith("; slots are in GPU memory (Vulkan0)")
    assert backend_text(vk, "CPU").endswith("slots are in RAM: no layers are on the GPU")
    assert backend_text(EngineBuild("")).startswith("Engine backend unknown")

    def build(files: dict[str, str | bytes]) -> EngineBuild:
        lib = tmp_path / str(len(list(tmp_path.iterdir())))
        lib.mkdir()
        for name, data in files.items():
            (lib / name).write_bytes(data if isinstance(data, bytes) else data.encode())
        return engine_build(lib)

    record = json.dumps({"backend": "cuda", "reason": "NVIDIA H200 (compute capability 9.0)"})
    assert build({"moescope_build.json": record}) == EngineBuild(
        "cuda", "NVIDIA H200 (compute capability 9.0)")
    # no record (an older build), or a damaged one: told from the libraries present
    assert build({"libllama.so": b"", "libggml-vulkan.so": b""}) == EngineBuild("vulkan")
    assert build({"libllama.so": b"", "moescope_build.json": b"\xff{"}) == EngineBuild("cpu")
    assert build({"moescope_build.json": '{"backend": "metal"}'}) == EngineBuild("")


@pytest.mark.parametrize("bad", [lambda: "x" * 100_000, lambda: "[1, 2]"])
def test_an_odd_record_is_bounded_and_ignored(tmp_path: Path, bad: Callable[[], str]) -> None:
    (tmp_path / "moescope_build.json").write_text(bad())
    (tmp_path / "libllama.so").write_bytes(b"")
    assert engine_build(tmp_path) == EngineBuild("cpu")
