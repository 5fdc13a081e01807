"""The default RAM budget: every expert in RAM when the model fits the memory this process
may use, else a RAM tier of what fits, said in one line.

Without it a model larger than RAM opened from the terminal, restored at start or opened
from Get models kept every expert in RAM: page faults at a few tokens a minute on a CPU
build, no load at all with pinned memory on a GPU build, or the OOM killer in a container.
The end-to-end test runs the real CLI in a real memory cgroup (root only) whose limit
leaves less than the model needs with its slots and working buffers.

Auto is also a live RAM budget (``set_ram_budget("auto")``: ``/ram auto``, the window's
Auto): chosen again from the memory available then, counting what the loaded model holds
as its own, by the load's rule; it once existed only at load."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.engine import Engine, Sampling
from moescope.engine.backend import engine_build
from moescope.engine.engine import auto_ram_budget
from moescope.model.gguf_info import read_model_info
from moescope.model.ram_fit import AUTO_RAM_BUDGET, RESERVE, kv_cache_bytes, ram_start_experts
from moescope_testing.cgroups import memory_cgroup, memory_hierarchy

APP = Path(__file__).resolve().parents[2] / "app"
MIB = 1 << 20


def in_a_cgroup(test: Callable[..., None]) -> Callable[..., None]:
    """A test in a real memory cgroup around a CPU build (root only)."""
    test = pytest.mark.skipif(
        engine_build().backend != "cpu",
        reason="the slots' memory is a device's on a GPU build (lavapipe: RAM the "
               "estimate does not count as the process's)")(test)
    return pytest.mark.skipif(memory_hierarchy() is None,
                              reason="needs root and a writable memory cgroup hierarchy")(test)


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


@in_a_cgroup
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


def _held(e: Engine) -> tuple[int, int]:
    """(host bytes the loaded model holds as the engine counts them, its slots' share):
    weights, KV cache, slots in host memory and the experts in RAM now."""
    m = e.model
    assert m is not None and m.info is not None and m.plan is not None
    info = m.info
    slots = m.plan.bytes_used if m.n_gpu_layers == 0 or engine_build().backend == "cpu" else 0
    experts = info.total_expert_bytes if m.ram_plan is None else m.ram_plan.bytes_used
    return info.non_expert_bytes + kv_cache_bytes(info, m.n_ctx) + slots + experts, slots


def test_auto_chosen_live_follows_the_memory_available_then(
        engine: Callable[..., Engine], tiny_moe: Path) -> None:
    """A model loaded whole: auto with memory to spare keeps the tier off (what a load
    would choose) and says so; with nothing beyond what the model holds it turns a tier
    on of what the load's rule gives that memory (at least top-k) and the answer reads the
    rest from the file; memory back, the tier goes off again; an explicit budget then
    clears the note. A GPU build's load reads the experts into pinned memory, which a
    tier would not free: there auto says so in one line and changes nothing."""
    e = engine(tiny_moe, budget="25%", policy="exact")
    m = e.model
    assert m is not None and m.info is not None and not m.disk_experts
    info = m.info
    assert e.ram_slots_per_layer == 0 and m.ram_note == ""

    assert e.set_ram_budget(AUTO_RAM_BUDGET, available=1 << 40) is None
    assert e.ram_slots_per_layer == 0 and m.ram_plan is None
    assert f"all {info.n_expert} experts per layer stay in RAM" in m.ram_note
    assert m.ram_note.startswith(f"{tiny_moe.name} needs about ") and "\n" not in m.ram_note

    held, slots = _held(e)
    expected = ram_start_experts(info, m.n_ctx, available=held, slot_bytes=slots)
    assert info.top_k <= expected < info.n_expert
    plan = e.set_ram_budget(" Auto ", available=0)
    if m.pinned_experts:  # a GPU build's load: no tier can free them; said, nothing changed
        assert plan is None and e.ram_slots_per_layer == 0 and m.ram_plan is None
        assert f"{expected} of {info.n_expert} experts per layer fit" in m.ram_note
        assert "pinned memory" in m.ram_note and "reopen the model" in m.ram_note
        assert "\n" not in m.ram_note
        return
    assert plan is not None and plan.slots_per_layer == expected == e.ram_slots_per_layer
    assert m.ram_plan is plan
    assert f"{expected} of {info.n_expert} experts per layer stay in RAM" in m.ram_note
    assert "it holds now" in m.ram_note and "\n" not in m.ram_note
    list(e.generate("Hello there", Sampling(max_tokens=8, temperature=0.0)))
    assert e.last_answer.cache.bytes_disk > 0  # the tier is real: misses read the file

    assert e.set_ram_budget("auto", available=1 << 40) is None
    assert e.ram_slots_per_layer == 0
    e.set_ram_budget("50%")
    assert m.ram_note == "" and e.ram_slots_per_layer == info.n_expert // 2


def test_auto_live_keeps_every_expert_of_a_model_loaded_from_disk_in_its_tier(
        engine: Callable[..., Engine], tiny_moe: Path) -> None:
    """Experts left in the file at load (an explicit 30%): auto with room for the model
    fills the tier with every expert (all in RAM, as a load of it would keep them); with
    none, top-k per layer, never fewer."""
    e = engine(tiny_moe, budget="25%", policy="exact", ram_budget="30%")
    m = e.model
    assert m is not None and m.info is not None and m.disk_experts
    plan = e.set_ram_budget("auto", available=1 << 40)
    assert plan is not None and plan.fits_all and e.ram_slots_per_layer == m.info.n_expert
    assert f"all {m.info.n_expert} experts per layer stay in RAM" in m.ram_note
    low = e.set_ram_budget("auto", available=0)
    assert low is not None and low.slots_per_layer == m.info.top_k == e.ram_slots_per_layer


def test_an_auto_request_is_applied_between_tokens_with_its_note(
        engine: Callable[..., Engine], tiny_moe: Path) -> None:
    """The window's path: the request is queued and applied by the decode thread, and the
    change says it was auto's choice (the tiny model fits any machine: all in RAM)."""
    e = engine(tiny_moe, budget="25%", policy="exact", ram_budget="30%")
    assert e.model is not None and e.model.info is not None
    e.request_ram_budget("auto")
    changes = e.apply_requests()
    assert [c.text for c in changes] == [f"ram={e.model.info.n_expert} (auto)"]
    assert "is available" in e.model.ram_note and "experts per layer stay in RAM" in \
        e.model.ram_note


@in_a_cgroup
def test_ram_auto_in_a_chat_in_a_cgroup_too_small_for_the_model_keeps_a_ram_tier(
        synth_model: Callable[..., Path]) -> None:
    """The terminal chat in a real memory cgroup, loaded with an explicit small RAM budget:
    ``/ram auto`` reads the group's memory now and keeps a tier of what fits (not every
    expert: the model and its slots need more than the limit), naming the group; the next
    answer runs from it."""
    model = synth_model("qwen3moe", "copy-bound", n_layers=1, n_expert=64)  # ~110 MB
    info = read_model_info(model)
    limit = 380 * MIB
    assert info.non_expert_bytes + info.total_expert_bytes * 5 // 4 + RESERVE > limit
    with memory_cgroup(limit, prefix="moescope-auto-live") as group:
        procs = group / "cgroup.procs"

        def join() -> None:
            procs.write_text(str(os.getpid()))

        run = subprocess.run(
            [sys.executable, "-m", "moescope", "chat", str(model), "--ram-budget", "25%",
             "--n", "4", "--temperature", "0"],
            input="/ram auto\nHi\n/ram\n",
            env={**os.environ, "PYTHONPATH": str(APP), "OMP_WAIT_POLICY": "passive"},
            preexec_fn=join, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = run.stdout.splitlines()
    said = [line for line in lines if line.startswith("RAM budget auto · ")]
    assert len(said) == 1, run.stdout[-2000:]
    n = int(said[0].split(" · ")[1].split("/")[0])
    assert info.top_k <= n < info.n_expert
    notes = [line for line in lines if line.startswith("note: ") and "stay in RAM" in line]
    assert len(notes) == 1
    assert f"memory cgroup /{group.name}" in notes[0] and "it holds now" in notes[0]
    assert f"{n} of {info.n_expert} experts per layer stay in RAM" in notes[0]
    assert any(line.startswith("RAM budget ") and
               line.endswith(f" · {n}/{info.n_expert} experts per layer in RAM")
               for line in lines)  # /ram after the answer: the tier is still auto's
    assert "Traceback" not in run.stderr
