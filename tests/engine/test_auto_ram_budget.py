"""The default RAM budget: every expert in RAM when the model fits the memory this process
may use, else a RAM tier of what fits, said in one line.

Without it a model larger than RAM opened from the terminal, restored at start or opened
from Get models kept every expert in RAM: page faults at a few tokens a minute on a CPU
build, no load at all with pinned memory on a GPU build, or the OOM killer in a container.
The end-to-end test runs the real CLI in a real memory cgroup (root only) whose limit
leaves less than the model needs with its slots and working buffers."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.engine import Engine
from moescope.engine.backend import engine_build
from moescope.engine.engine import auto_ram_budget
from moescope.model.gguf_info import read_model_info
from moescope.model.ram_fit import AUTO_RAM_BUDGET, RESERVE, kv_cache_bytes
from moescope_testing.cgroups import memory_cgroup, memory_hierarchy

APP = Path(__file__).resolve().parents[2] / "app"
MIB = 1 << 20


def test_auto_keeps_every_expert_of_a_model_that_fits(tiny_moe: Path) -> None:
    e = Engine()
    try:
        loaded = e.load(tiny_moe, budget="25%", ram_budget=AUTO_RAM_BUDGET, n_ctx=256)
        assert e.ram_slots_per_layer == 0  # no RAM tier: all in RAM, as before
        assert loaded.notice == "" and loaded.ram_note == ""
    finally:
        e.close()


def test_auto_picks_what_fits_and_says_why(tiny_moe: Path) -> None:
    info = read_model_info(tiny_moe)
    rest = info.non_expert_bytes + kv_cache_bytes(info, 256)
    assert auto_ram_budget(info, 256, available=1 << 40) == (None, "")
    exact_fit = rest + info.total_expert_bytes + RESERVE
    assert auto_ram_budget(info, 256, available=exact_fit)[0] is None
    budget, note = auto_ram_budget(info, 256, available=exact_fit - 1)
    assert budget is not None and info.top_k <= int(budget) < info.n_expert
    assert note.startswith(f"{tiny_moe.name} needs about ")
    assert f"of {info.n_expert} experts per layer stay in RAM" in note
    assert "--ram-budget" in note and "\n" not in note
    # slots in host memory (a CPU build's) leave less for the RAM tier
    with_slots, _ = auto_ram_budget(info, 256, available=exact_fit - 1,
                                    slot_bytes=info.total_expert_bytes // 2)
    assert with_slots is not None and int(with_slots) <= int(budget)
    # nothing available still keeps one token's experts (the tier's minimum)
    assert auto_ram_budget(info, 256, available=0)[0] == str(info.top_k)


@pytest.mark.skipif(memory_hierarchy() is None,
                    reason="needs root and a writable memory cgroup hierarchy")
@pytest.mark.skipif(engine_build().backend != "cpu",
                    reason="the slots' memory is a device's on a GPU build (lavapipe: RAM "
                           "the estimate does not count as the process's)")
def test_the_cli_in_a_cgroup_too_small_for_the_model_runs_from_a_ram_tier(
        synth_model: Callable[..., Path]) -> None:
    model = synth_model("qwen3moe", "copy-bound", n_layers=1, n_expert=64)  # ~110 MB
    info = read_model_info(model)
    limit = 380 * MIB
    # the model, its slots (25%, in RAM on this build) and the reserve need more than the
    # limit leaves once Python and the engine are in; the RAM tier needs far less
    need = info.non_expert_bytes + info.total_expert_bytes * 5 // 4 + RESERVE
    assert need > limit
    assert info.non_expert_bytes + info.total_expert_bytes * 3 // 4 < limit // 2
    with memory_cgroup(limit, prefix="moescope-auto") as group:
        procs = group / "cgroup.procs"

        def join() -> None:  # in the child, before exec: the whole CLI runs in the group
            procs.write_text(str(os.getpid()))

        run = subprocess.run(
            [sys.executable, "-m", "moescope", "generate", str(model), "--prompt", "Hi",
             "--n", "6", "--temperature", "0"],
            env={**os.environ, "PYTHONPATH": str(APP), "OMP_WAIT_POLICY": "passive"},
            preexec_fn=join, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]  # not OOM-killed (-9)
    notes = [line for line in run.stderr.splitlines() if "stay in RAM" in line]
    assert len(notes) == 1, run.stderr[-2000:]
    assert f"memory cgroup /{group.name}" in notes[0]
    n = int(notes[0].split(" experts per layer stay in RAM")[0].split()[-3])
    assert info.top_k <= n < info.n_expert
    assert "Traceback" not in run.stderr
