"""The window records Parquet and never waits for its compaction: a new session (or
quit) closes the old trace's journal and goes on while the compactor finishes it; the
journal is the trace meanwhile (opened, exported, never pruned); quitting waits a bounded
time; a crash's leftover journals are finished when the window starts."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import load, send

from moescope.display.trace_io import TraceLimits
from moescope.trace import RECORD_SUFFIX, read_trace
from moescope.trace import parquet_format as pf
from moescope.trace.compactor import Compactor
from moescope.trace.names import live_trace_file
from moescope.util import paths
from moescope_testing.traces import core_trace


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> Iterator[threading.Event]:
    """Every compaction waits for this event (set it to let them go)."""
    release = threading.Event()
    real = pf.compact

    def blocked(*args: Any, **kwargs: Any) -> Path:
        release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(pf, "compact", blocked)
    yield release
    release.set()


def test_a_new_session_never_waits_for_the_old_ones_compaction(
        window: Any, qtbot: Any, tiny_moe: Path, held: threading.Event,
        tmp_path: Path) -> None:
    assert RECORD_SUFFIX == ".parquet"
    send(qtbot, window, "Hello there.", max_tokens=8)
    first = window.trace_path
    assert first is not None and first.suffix == ".parquet"
    journal = pf.journal_path(first)
    worker = window.client.worker
    # the limits delete every older session: the one being compacted is spared
    old = first.parent / "20200101-000000-old.arrows"
    old.write_bytes(b"x" * 100)
    worker.trace_limits = TraceLimits(keep=0, total_bytes=10 << 20)
    load(qtbot, window, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    assert window.trace_path != first  # the new session started, the compaction held
    assert not old.exists()  # pruned
    assert journal.exists() and not first.exists()
    assert worker.compactor.busy() == {journal}
    trace = read_trace(live_trace_file(first))  # the journal: closed, whole
    assert trace.end is not None and len(trace.tokens) >= 8

    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        window.open_trace(first)  # the finished file's name: its journal is read
    assert len(opened.args[0].reopened.tokens) == len(trace.tokens)

    held.set()
    qtbot.waitUntil(lambda: first.exists() and not journal.exists(), timeout=30_000)
    assert worker.compactor.wait(10) and worker.compactor.finished == [first]
    done = read_trace(first)
    assert [t.text for t in done.tokens] == [t.text for t in trace.tokens]


def test_quit_waits_for_a_compaction_only_briefly(
        window: Any, qtbot: Any, held: threading.Event,
        monkeypatch: pytest.MonkeyPatch) -> None:
    import moescope.gui.worker as worker_module

    monkeypatch.setattr(worker_module, "QUIT_COMPACT_WAIT_S", 0.1)
    send(qtbot, window, "Hello there.", max_tokens=5)
    path = window.trace_path
    assert path is not None
    compactor = window.client.worker.compactor
    window.close()  # the compaction is held: the window closes all the same
    assert not window.client.thread.isRunning()
    journal = pf.journal_path(path)
    assert compactor.busy() == {journal} and journal.exists() and not path.exists()
    held.set()  # the compaction goes on, sees the stop asked at quit and gives up
    assert compactor.wait(30) and compactor.finished == []
    assert sorted(p.name for p in path.parent.iterdir()) == [journal.name]  # no .part
    assert len(read_trace(journal).tokens) >= 5  # the trace, finished at the next start
    later = Compactor()
    later.finish_leftovers(path.parent)
    assert later.wait(30) and later.finished == [path] and not journal.exists()


def test_leftover_journals_are_finished_when_the_window_starts(
        make_window: Any, qtbot: Any, data_dir: Path) -> None:
    traces = paths.traces_dir()
    traces.mkdir(parents=True, exist_ok=True)
    target = traces / "20200101-000000-crashed.parquet"
    journal = core_trace(pf.journal_path(target), n_tokens=6)
    want = [t.text for t in read_trace(journal).tokens]
    stale = traces / f".{target.name}.k3j4h5g6.part"
    stale.write_bytes(b"PAR1")
    window = make_window()
    qtbot.waitUntil(lambda: target.exists() and not journal.exists(), timeout=30_000)
    assert not stale.exists()
    compactor = window.client.worker.compactor
    assert compactor.wait(10) and compactor.finished == [target]
    assert [t.text for t in read_trace(target).tokens] == want
