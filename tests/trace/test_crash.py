"""A session killed mid-generation leaves a trace that reads back up to its last complete
token: the recorder has at most one token in flight (its writer thread writes and flushes
each before the next is handed over), and the reader drops a half-written last line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

from moescope.trace import read_trace

CHILD = textwrap.dedent("""
    import sys, time
    from moescope.trace import TraceRecorder
    from moescope.engine import Engine, Sampling

    model, out, complete = sys.argv[1], sys.argv[2], int(sys.argv[3])
    engine = Engine()
    engine.load(model, budget="25%", policy="speed-first", n_ctx=256, n_threads=1)
    recorder = TraceRecorder.for_engine(out, engine)
    sampling = Sampling(temperature=0.9, top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                        max_tokens=200, seed=3)
    for stats in engine.generate("The quick brown fox jumps over the lazy dog, again.",
                                 sampling):
        if stats.index == complete:
            # token complete - 1 may still be in the writer thread's hands: let it land
            # first (else a loaded machine stalls that token's write instead)
            recorder.flush()
            # a slow disk: the next record reaches the file only in part, then we stall
            raw = recorder.writer._raw
            write = raw.write

            def half(data, write=write, raw=raw):
                write(data[: len(data) // 2])
                raw.flush()
                print("stalled", flush=True)
                time.sleep(60)

            raw.write = half
        recorder.record(stats, engine)
        if stats.index == complete:
            recorder.flush()  # the writer thread has stalled in its write: wait to be killed
        print("token", stats.index, flush=True)
""")


@pytest.mark.usefixtures("engine_required")
@pytest.mark.parametrize("name", ["killed.jsonl", "killed.jsonl.gz"])
def test_a_trace_killed_mid_generation_reads_back_to_the_last_complete_token(
        synth_model: Callable[..., Path], tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    complete = 6
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(synth_model("qwen3moe")), str(out), str(complete)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"PYTHONUNBUFFERED": "1"})
    reported: list[str] = []
    try:
        assert child.stdout is not None
        for line in child.stdout:
            reported.append(line.strip())
            if line.startswith("stalled"):
                break
        else:
            err = child.stderr.read() if child.stderr else ""
            pytest.fail(f"the child ended before stalling: {reported} {err}")
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    assert reported[-2] == f"token {complete - 1}"

    trace = read_trace(out)
    assert [t.index for t in trace.tokens] == list(range(complete))
    assert trace.truncated and trace.end is None
    assert all(len(t.events) for t in trace.tokens if t.phase == "decode")
