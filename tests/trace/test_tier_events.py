"""Traces record the RAM tier's reads from the model file (issue 16): per event row, the
fills read from disk and their bytes; the RAM budget's live changes as notes; a replay of
the recorded routing under the same logical tier counts the same reads."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.sim.replay import replay
from moescope.trace import TraceRecorder, read_trace


@pytest.mark.usefixtures("engine_required")
def test_a_trace_records_reads_from_disk_and_the_replay_counts_the_same(
        synth_model: Callable[..., Path], tmp_path: Path) -> None:
    from moescope.engine import Engine, Sampling

    engine = Engine()
    try:
        engine.load(synth_model("qwen3moe", expert_type="q8_0"), budget="25%", policy="exact",
                    n_ctx=256, n_threads=1, ram_budget="40%")
        ram_slots = engine.ram_slots_per_layer
        assert ram_slots > 0
        recorder = TraceRecorder.for_engine(tmp_path / "s.jsonl", engine)
        sampling = Sampling(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                            max_tokens=24, seed=3)
        engine_disk = 0
        for stats in engine.generate("The quick brown fox jumps over the lazy dog.", sampling):
            engine_disk += int(np.asarray(stats.events)["n_disk"].sum())
            recorder.record(stats, engine)
            if stats.index + 1 == 12:
                engine.request_ram_budget("60%")
        recorder.close()
    finally:
        engine.close()
    trace = read_trace(tmp_path / "s.jsonl")
    events = trace.events()
    assert engine_disk > 0 and int(events["n_disk"].sum()) == engine_disk
    assert int(events["bytes_disk"].sum()) > 0
    assert (events["n_disk"] <= events["n_fetch"] + events["n_admit"]).all()
    notes = [c.text for t in trace.tokens for c in t.changes if c.kind == "note"]
    assert any(n.startswith("ram=") for n in notes)
    # the first half, before the change, replays under the same tier with the same reads
    first = [t for t in trace.tokens[:12]]
    replayed = replay(trace, "exact", None, ram_slots=ram_slots)
    recorded_first = sum(int(t.events["n_disk"].sum()) for t in first)
    assert int(replayed.per_token["n_disk"][:12].sum()) == recorded_first
