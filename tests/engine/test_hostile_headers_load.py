"""Issue 14, through the engine: header values llama.cpp cannot take are refused by us in
one line before it sees them (it used to abort, and the message asked the user to report a
MoEScope bug, twice for a NaN epsilon); values it can take load and generate."""

from __future__ import annotations

import resource
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from engine_helpers import gpu_offload
from gguf import GGUFValueType as T

from moescope.engine import Engine, Sampling
from moescope_testing.hostile import rewrite_gguf


def _no_core_dump() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


def _run(args: list[str], script: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", script] if script else [sys.executable, "-m", "moescope"]
    return subprocess.run(command + args, capture_output=True, text=True, timeout=180,
                          preexec_fn=_no_core_dump)


@pytest.mark.parametrize(("key", "value", "match"), [
    ("qwen3moe.attention.layer_norm_rms_epsilon", (T.FLOAT32, float("nan")), "is nan"),
    ("qwen3moe.attention.layer_norm_rms_epsilon", (T.FLOAT32, -1e-6), "is -1e-06"),
    ("qwen3moe.block_count", (T.UINT32, 1000), "is 1000, expected 1..512"),
    ("qwen3moe.expert_used_count", (T.UINT32, 17), "is 17, expected 1..16"),
    ("general.alignment", (T.UINT32, 1), "general.alignment is 1"),
])
def test_generate_refuses_what_llama_cpp_would_abort_on_in_one_line(
        synth_model: Callable[..., Path], tmp_path: Path, key: str, value: Any,
        match: str) -> None:
    path = rewrite_gguf(synth_model("qwen3moe"), tmp_path / "bad.gguf",
                        set_keys={key: value})
    out = _run(["generate", str(path), "--prompt", "Hi", "--n", "2"])
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("moescope: error: bad.gguf: ")
    assert key in lines[0] and match in lines[0] and "bug" not in lines[0]


def test_an_abort_in_the_first_decode_blames_the_file_once(
        synth_model: Callable[..., Path], tmp_path: Path) -> None:
    """Were a bad value to get past the checks, ggml's failed check during the warm-up
    decode (not while reading tensors) must still name the file, not ask for a bug report.
    The checks are switched off here to reach it. Which check fails depends on the
    backend: the CPU's rms_norm asserts eps >= 0; on a GPU build the norm runs on the
    device and the NaN reaches the route op's own check instead."""
    path = rewrite_gguf(synth_model("qwen3moe"), tmp_path / "nan-eps.gguf", set_keys={
        "qwen3moe.attention.layer_norm_rms_epsilon": (T.FLOAT32, float("nan"))})
    script = textwrap.dedent(f"""
        import moescope.model.gguf_info as g
        g.check_header_numbers = lambda *a: None  # the name gguf_info calls
        from moescope.engine import Engine
        Engine().load({str(path)!r}, n_ctx=64, n_threads=1)
        print("LOADED")
    """)
    out = _run([], script)
    assert out.returncode != 0 and "LOADED" not in out.stdout
    assert out.stderr.count("moescope: fatal:") == 1
    assert "while loading nan-eps.gguf" in out.stderr
    assert gpu_offload() or "eps >= 0.0f" in out.stderr
    assert "MoEScope bug" not in out.stderr


@pytest.mark.parametrize("arch", ["qwen3moe", "deepseek2"])
@pytest.mark.parametrize("spare", [0, 1])
def test_routing_all_or_all_but_one_expert_loads_and_generates(
        synth_model: Callable[..., Path], engine: Callable[..., Engine], arch: str,
        spare: int) -> None:
    """llama.cpp accepts n_expert_used == n_expert; so do we, with a cache of 4 slots
    smaller than top-k, under each policy."""
    e = engine(synth_model(arch, top_k=16 - spare), budget="4", policy="exact")
    assert e.model is not None and e.model.info is not None
    assert e.model.info.top_k == 16 - spare
    for policy in ("exact", "quality-first", "speed-first"):
        e.set_policy(policy)
        tokens = list(e.generate("The quick brown fox jumps over the lazy dog.",
                                 Sampling(max_tokens=4, temperature=0)))
        assert len(tokens) == 4
