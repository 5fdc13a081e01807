"""Shared constants and helpers of the engine tests."""

from __future__ import annotations

ARCHES = ("qwen3moe", "olmoe", "gpt-oss", "deepseek2", "mixtral", "qwen3next", "glm4moe",
          "qwen35moe")
PROMPT = [1, 2, 3]


def forced_stream(n_vocab: int, n: int = 64, seed: int = 7) -> list[int]:
    """A fixed pseudo-random token stream to teacher-force (same tokens for every run)."""
    return [(seed + 7919 * i) % n_vocab for i in range(n)]


def gpu_offload() -> bool:
    """True on a GPU build with a device (CUDA, or Vulkan incl. lavapipe when
    GGML_VK_VISIBLE_DEVICES names it): the Engine then puts every layer on the device."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def reference_kwargs() -> dict[str, object]:
    """Load arguments of the cache-off run the cache must match bitwise: the experts
    computed by the same backend as the slots. On the CPU build that is experts in host
    memory in GGUF layout (``host_experts``: no CPU_REPACK, whose kernels differ); on a GPU
    build it is llama.cpp's ordinary full offload, experts in device memory like the slots
    (experts left in host memory would be computed by the CPU backend instead)."""
    return {"cache": False, "host_experts": not gpu_offload()}


def exact_prompt() -> list[int]:
    """The prompt of bitwise comparisons with the cache off. Prefill (more than one token)
    keeps llama.cpp's original path, computing experts where they live: on a GPU build that
    is the CPU backend with the cache on (experts in host memory) but the device with it
    off, which round differently. A one-token prompt is decoded like every later token, so
    on a GPU build every token goes through the slots (as in bench/gpu_check.py)."""
    return PROMPT if not gpu_offload() else PROMPT[:1]
