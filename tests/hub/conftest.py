"""Fixtures: a stand-in Hub on 127.0.0.1 serving small synthetic GGUFs.

``HF_ENDPOINT`` points at it and ``HF_TOKEN`` is cleared, so the code under test finds it
the way it finds the real Hub; the models folder is a fresh temporary one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from hub_helpers import BIG_REPO, GATED_REPO, GATED_TOKEN, REPO, SPLIT_REPO, Hub

from moescope.util import paths
from moescope_testing import preset, write_synth_model
from moescope_testing.hub_server import HubServer


@pytest.fixture(scope="session")
def hub_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("hub-src")
    tiny = write_synth_model(d / "Tiny-MoE-Q8_0.gguf", preset("tiny", "qwen3moe",
                                                               expert_type="q8_0"))
    q4 = write_synth_model(d / "Tiny-MoE-Q4_0.gguf", preset("tiny", "qwen3moe",
                                                             expert_type="q4_0", seed=1))
    split = write_synth_model(d / "split" / "Split-MoE-Q8_0.gguf",
                              preset("tiny", "olmoe", expert_type="q8_0"), parts=3)
    # a "17 GiB" model as a sparse file: its header is real, its data a hole
    big = write_synth_model(d / "Big-MoE-Q4_0.gguf", preset("qwen3-30b-a3b-like", "qwen3moe"),
                            sparse=True)
    return {"tiny": tiny, "q4": q4, "split": split, "big": big}


@pytest.fixture
def hub(hub_files: dict[str, Path], monkeypatch: pytest.MonkeyPatch,
        tmp_path: Path) -> Iterator[Hub]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv(paths.ENV_MODELS_DIR, str(tmp_path / "models"))
    with HubServer() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        server.add_file(REPO, "Tiny-MoE-Q8_0.gguf", hub_files["tiny"],
                        architecture="qwen3moe", downloads=50)
        server.add_file(REPO, "Tiny-MoE-Q4_0.gguf", hub_files["q4"])
        for part in sorted(hub_files["split"].parent.glob("Split-MoE-Q8_0-*.gguf")):
            server.add_file(SPLIT_REPO, f"Q8_0/{part.name}", part, architecture="olmoe",
                            downloads=20)
        server.add_file(BIG_REPO, "Big-MoE-Q4_0.gguf", hub_files["big"], sha256="0" * 64,
                        architecture="qwen3moe", downloads=90)
        server.add_file(GATED_REPO, "Gated-Q8_0.gguf", hub_files["tiny"], gated=True,
                        token=GATED_TOKEN, architecture="qwen3moe")
        yield Hub(server=server, tiny=hub_files["tiny"], split_first=hub_files["split"],
                  big=hub_files["big"])
