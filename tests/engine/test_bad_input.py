"""Acceptance: bad models and budgets give one clear message and lose nothing."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.engine import Engine
from moescope.util.errors import ModelFormatError


@pytest.mark.parametrize("kind", ["random", "empty", "truncated_data", "bad_magic"])
def test_corrupt_file_is_rejected_before_llama_cpp(broken_file: Callable[[str], Path],
                                                   kind: str) -> None:
    with pytest.raises(ModelFormatError):
        Engine().load(broken_file(kind))


def test_dense_model_loads_with_cache_off_and_says_so(
        dense_model: Path, engine: Callable[..., Engine]) -> None:
    e = engine(dense_model)
    assert e.model is not None and not e.model.cache_enabled
    assert "expert cache off" in e.model.notice
    assert list(e.generate("Hi", None))


def test_budget_below_top_k_is_clamped_with_a_message(
        synth_model: Callable[..., Path], engine: Callable[..., Engine]) -> None:
    e = engine(synth_model("qwen3moe"), budget="1KiB")
    assert e.model is not None and e.model.plan is not None
    assert e.slots_per_layer == e.model.plan.top_k
    assert "minimum" in e.model.notice


def test_budget_above_all_experts_is_clamped(
        synth_model: Callable[..., Path], engine: Callable[..., Engine]) -> None:
    e = engine(synth_model("qwen3moe"), budget="64GiB")
    assert e.slots_per_layer == e.model.info.n_expert  # type: ignore[union-attr]


def test_out_of_memory_on_resize_keeps_previous_budget(synth_model: Callable[..., Path]) -> None:
    """A resize whose slot buffers cannot be allocated fails cleanly; generation goes on."""
    path = synth_model("qwen3moe", n_expert=64, n_embd=256, n_ff_exp=512, expert_type="f32")
    script = textwrap.dedent(f"""
        import resource
        from moescope.engine import Engine, Sampling, CacheError
        e = Engine()
        e.load({str(path)!r}, budget="10%", n_ctx=128, n_threads=1)
        before = e.slots_per_layer
        with open("/proc/self/status") as f:
            vm = [int(l.split()[1]) for l in f if l.startswith("VmSize")][0] * 1024
        resource.setrlimit(resource.RLIMIT_AS, (vm + (64 << 20), resource.RLIM_INFINITY))
        try:
            e.set_budget("100%")
            print("NO ERROR")
        except CacheError as err:
            print("CACHE ERROR:", err)
        assert e.slots_per_layer == before, (e.slots_per_layer, before)
        resource.setrlimit(resource.RLIMIT_AS, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        toks = list(e.generate("Hi", Sampling(max_tokens=4, seed=1)))
        print("GENERATED", len(toks), "SLOTS", e.slots_per_layer)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert "CACHE ERROR: out of memory" in out.stdout
    assert "GENERATED 4" in out.stdout

