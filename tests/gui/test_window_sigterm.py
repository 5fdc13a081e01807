"""``kill`` (SIGTERM) and a closed terminal (SIGHUP) close the window as File → Quit does:
the process exits 0 and the session's trace is finished (its journal compacted into the
trace file), not left for the next start to finish (new-user review, 2026-12-04)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from moescope.trace import read_trace
from moescope.util.resources import demo_model_path

HERE = Path(__file__).parent
CHILD_TIMEOUT_S = 120


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_quits_cleanly_and_finishes_the_trace(tmp_path: Path,
                                                       sig: signal.Signals) -> None:
    model = demo_model_path()
    assert model is not None
    env = dict(os.environ, MOESCOPE_DATA_DIR=str(tmp_path / "data"),
               QT_QPA_PLATFORM="offscreen", OPENBLAS_NUM_THREADS="1",
               PYTHONFAULTHANDLER="1")  # a crash prints every thread's stack
    child = subprocess.Popen([sys.executable, str(HERE / "window_child.py"), "--stay",
                              str(model)],
                             env=env, stdout=subprocess.PIPE,
                             stderr=(tmp_path / "stderr").open("wb"))  # never a full pipe
    try:
        assert child.stdout is not None
        line = child.stdout.readline().decode()
        assert line, (tmp_path / "stderr").read_text(errors="replace")[-2000:]
        seen = json.loads(line)  # the answer is in and saved
        assert seen["tokens"] > 0 and seen["trace"]
        trace = Path(os.fsdecode(bytes.fromhex(seen["trace"])))
        child.send_signal(sig)
        code = child.wait(timeout=CHILD_TIMEOUT_S)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert code == 0, (tmp_path / "stderr").read_text(errors="replace")[-4000:]
    assert trace.is_file() and trace.suffix == ".parquet"
    assert not any(p.name.endswith(".journal.arrows") for p in trace.parent.iterdir())
    assert len(read_trace(trace).tokens) > 0
