"""Names shared by the hub tests (the stand-in Hub's repositories and its fixture type)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from moescope_testing.hub_server import HubServer

REPO = "test-org/Tiny-MoE-GGUF"
SPLIT_REPO = "test-org/Split-MoE-GGUF"
BIG_REPO = "test-org/Big-MoE-GGUF"
GATED_REPO = "test-org/Gated-MoE-GGUF"
GATED_TOKEN = "hf_test_token_allowed"


@dataclass
class Hub:
    server: HubServer
    tiny: Path
    """The local copy of the Q8_0 file, to compare downloads and headers with."""
    split_first: Path
    big: Path
