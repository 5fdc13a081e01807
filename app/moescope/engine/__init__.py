"""The patched llama.cpp engine: load a MoE model with the expert cache and generate."""

from moescope.engine.engine import (
    CacheError,
    ChatTemplateError,
    Engine,
    LoadedModel,
    Message,
    ModelLoadError,
    Sampling,
)
from moescope.engine.load_hooks import LoadCancelled
from moescope.engine.stats import AnswerStats, CacheTotals, TokenStats

__all__ = [
    "AnswerStats",
    "CacheError",
    "CacheTotals",
    "ChatTemplateError",
    "Engine",
    "LoadCancelled",
    "LoadedModel",
    "Message",
    "ModelLoadError",
    "Sampling",
    "TokenStats",
]
