"""The cost model's disk reads (issue 16) and a replay under a logical RAM tier."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from moescope.sim.cost import CostModel
from moescope.sim.replay import TOKEN_COST_DTYPE, replay
from moescope.trace import TraceModel, read_trace

MODEL = TraceModel(file_name="m.gguf", metadata_sha256="0" * 64, architecture="qwen3moe",
                   n_layers=2, moe_layers=(0, 1), n_expert=16, top_k=4,
                   bytes_per_expert=(1_000_000, 1_000_000), non_expert_bytes=2_000_000)


def test_reads_from_disk_add_their_latency_and_bytes_to_the_token() -> None:
    cm = CostModel("t", bandwidth=1e9, latency=0.0, compute_s=2e-3, disk_bandwidth=2e9,
                   disk_latency=1e-4)
    tok = np.zeros(2, dtype=TOKEN_COST_DTYPE)
    tok["n_sync"], tok["bytes_sync"] = 2, 2_000_000
    tok[1]["n_disk"], tok[1]["bytes_disk"] = 2, 2_000_000
    seconds = cm.token_seconds(tok, MODEL)
    assert seconds[0] == pytest.approx(2e-3 + 2e-3)
    assert seconds[1] - seconds[0] == pytest.approx(2 * 1e-4 + 1e-3)
    slower = cm.with_overrides(disk_bandwidth=1e9, disk_latency=2e-4)
    assert slower.token_seconds(tok, MODEL)[1] - seconds[1] == pytest.approx(2e-4 + 1e-3)
    assert "disk 2.00 GB/s + 100 µs per read" in cm.describe()


def test_a_replay_under_a_ram_tier_counts_reads_from_disk(
        record: Callable[..., Path]) -> None:
    trace = read_trace(record("qwen3moe", policy="exact", budget="25%", tokens=24))
    m = trace.header.model
    whole = replay(trace, "exact", None)
    tiered = replay(trace, "exact", None, ram_slots=m.top_k + 2)
    # exact fetches every miss either way: same decisions, but now some come from disk
    assert np.array_equal(whole.per_token["fetches"], tiered.per_token["fetches"])
    assert whole.per_token["n_disk"].sum() == 0 and tiered.per_token["n_disk"].sum() > 0
    assert tiered.per_token["bytes_disk"].sum() > 0
    cm = CostModel("t", bandwidth=25e9, latency=7e-6, compute_s=1e-3)
    assert cm.token_seconds(tiered.decode, m).mean() > cm.token_seconds(whole.decode, m).mean()
    # quality-first's disk threshold waits for fewer misses when they are on disk
    qf_whole = replay(trace, "quality-first", None)
    qf_tiered = replay(trace, "quality-first", None, ram_slots=m.top_k)
    assert qf_tiered.per_token["fetches"].sum() <= qf_whole.per_token["fetches"].sum()


def test_replay_command_with_a_ram_budget_prices_reads_from_disk(
        record: Callable[..., Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    import csv
    import io

    from moescope.cli import main

    trace = record("qwen3moe", policy="exact", budget="25%", tokens=24)
    out = tmp_path / "r.csv"
    assert main(["replay", str(trace), "--policy", "exact,quality-first", "--budget", "25%",
                 "--ram-budget", "40%", "--csv", str(out)]) == 0
    table = capsys.readouterr().out
    assert "disk/tok" in table and "per read" in table
    rows = {r["policy"]: r for r in csv.DictReader(io.StringIO(out.read_text()))}
    assert float(rows["exact"]["disk_bytes_per_token"]) > 0
    assert main(["replay", str(trace), "--policy", "exact", "--csv", str(out)]) == 0
    assert "disk/tok" not in capsys.readouterr().out
    assert main(["replay", str(trace), "--ram-budget", "lots"]) == 2
    assert "lots" in capsys.readouterr().err
