"""The GPU check's model, prompts and configurations (bench/gpu_check.py).

Apart from the driver and the children because both read them: the driver to run each
configuration in its own process, the children to load it.
"""

from __future__ import annotations

from typing import Any

PRESET = "qwen3-30b-a3b-like"
FULL_LAYERS = 48
# 16 of the 48 layers: the model (5.5 GiB) is written during the CUDA build, and five
# configurations fit in the ~2 minutes the build leaves of an 8-minute run. Ratios hardly
# depend on depth (every layer costs the same); --layers 48 when the build is cached.
DEFAULT_LAYERS = 16
DEFAULT_DEADLINE_S = 480
# The dry run's model: the preset's layout, shrunk (64 experts so that 25% = 16 slots >=
# top-8, q4_0 experts as on the GPU).
DRY_OVERRIDES: dict[str, Any] = dict(n_layers=2, n_embd=256, n_head=4, n_head_kv=2,
                                     head_dim=64, n_expert=64, top_k=8, n_ff_exp=128,
                                     n_ff=512, vocab_size=512, ctx=1024)
PROMPTS = (
    "The history of the expert cache begins with a question about memory.",
    "Once upon a time, in a small town by the sea, there lived a",
    "Explain why copying weights over PCIe is slower than reading them from VRAM.",
)
FORCED_PROMPT = [1]  # one token: governed by the cache at any budget (no prefill path)
CONFIGS: dict[str, dict[str, Any]] = {
    "reference": {"label": "cache off, all experts in VRAM", "cache": False},
    "stock": {"label": "stock llama.cpp, -ot exps=CPU", "cache": False, "stock": True},
    "exact": {"label": "MoEScope exact @25%", "cache": True, "policy": "exact"},
    "quality-first": {"label": "MoEScope quality-first @25%", "cache": True,
                      "policy": "quality-first"},
    "speed-first": {"label": "MoEScope speed-first @25%", "cache": True,
                    "policy": "speed-first"},
    # paper 2: routing bonus + prefetch of the next layer's predicted experts (copies
    # overlap compute); last, so a short deadline drops it before the paper-1 targets
    "psr": {"label": "MoEScope psr @25%", "cache": True, "policy": "psr"},
    # the Vulkan build on the same GPU (AMD/Intel users' engine): built only where glslc and
    # the Vulkan headers are installed and the GPU has a Vulkan driver, else a skipped row
    "vulkan": {"label": "MoEScope exact @25%, Vulkan", "cache": True, "policy": "exact",
               "backend": "vulkan"},
}
TARGET_QUALITY_VS_EXACT = 2.5
TAG = "gpu-check"
