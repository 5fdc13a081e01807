"""Shared constants and helpers of the engine tests."""

from __future__ import annotations

ARCHES = ("qwen3moe", "olmoe", "gpt-oss", "deepseek2", "mixtral", "qwen3next")
PROMPT = [1, 2, 3]


def forced_stream(n_vocab: int, n: int = 64, seed: int = 7) -> list[int]:
    """A fixed pseudo-random token stream to teacher-force (same tokens for every run)."""
    return [(seed + 7919 * i) % n_vocab for i in range(n)]
