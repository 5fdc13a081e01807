"""Parquet traces finished in the background: closing a recording with a compactor returns
once the journal is closed (a whole trace on disk), the compaction follows on its own
thread; meanwhile readers get the journal and pruning spares the session; leftover journals
of a crash are finished, their ``.part`` files removed, live or failing ones left."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from trace_helpers import psr_header

from moescope.cache.native import EVENT_DTYPE
from moescope.display.trace_io import TraceLimits, prune_traces, read_session
from moescope.trace import TraceRecorder, read_trace
from moescope.trace import arrow_format as af
from moescope.trace import parquet_format as pf
from moescope.trace.compactor import Compactor
from moescope.trace.names import live_trace_file, session_stem
from moescope.trace.schema import TraceFormatError
from moescope_testing.traces import core_trace


def _token(i: int) -> SimpleNamespace:
    return SimpleNamespace(index=i, token_id=1, text=f"t{i}", seconds=0.01, policy="psr",
                           slots_per_layer=4, events=np.zeros(0, dtype=EVENT_DTYPE))


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every compaction waits for this event (set it to let them go)."""
    release = threading.Event()
    real = pf.compact

    def blocked(*args: Any, **kwargs: Any) -> Path:
        assert release.wait(30), "the test never released the compaction"
        return real(*args, **kwargs)

    monkeypatch.setattr(pf, "compact", blocked)
    yield release
    release.set()


def test_close_returns_with_the_journal_readable_and_compaction_follows(
        tmp_path: Path, held: threading.Event) -> None:
    compactor = Compactor()
    path = tmp_path / "s.parquet"
    recorder = TraceRecorder(path, psr_header(), compactor=compactor)
    for i in range(5):
        recorder.record(_token(i))
    recorder.close(stop_reason="done")  # returns although the compaction is held

    journal = pf.journal_path(path)
    assert not path.exists() and journal.exists()
    assert compactor.busy() == {journal}
    assert not compactor.wait(0.05)
    assert live_trace_file(path) == journal
    t = read_session(path)  # the journal, closed: a whole trace with its end record
    assert [r.text for r in t.tokens] == [f"t{i}" for i in range(5)]
    assert t.end is not None and t.end["stop_reason"] == "done"
    # a live session is never pruned, whatever the limits say
    assert prune_traces(tmp_path, TraceLimits(keep=0, total_bytes=0),
                        keep=compactor.busy()) == []
    assert journal.exists()

    held.set()
    assert compactor.wait(30)
    assert path.exists() and not journal.exists()
    assert compactor.finished == [path] and compactor.busy() == set()
    done = read_trace(path)
    assert [r.text for r in done.tokens] == [r.text for r in t.tokens]
    assert done.end == t.end


def test_a_session_with_no_token_leaves_no_trace(tmp_path: Path) -> None:
    """A window loaded and closed (or a comparison's new session, closed before its next
    answer) records nothing: its journal is removed, not compacted to an empty trace that
    would count among the 20 sessions kept and push a real one out."""
    compactor = Compactor()
    path = tmp_path / "s.parquet"
    TraceRecorder(path, psr_header(), compactor=compactor).close(stop_reason="")
    assert compactor.wait(30)
    assert sorted(tmp_path.iterdir()) == [] and compactor.finished == []
    one = tmp_path / "one.parquet"
    recorder = TraceRecorder(one, psr_header(), compactor=compactor)
    recorder.record(_token(0))
    recorder.close(stop_reason="")
    assert compactor.wait(30)
    assert sorted(tmp_path.iterdir()) == [one] and len(read_trace(one).tokens) == 1


def test_a_journal_locked_by_another_writer_is_not_pruned(tmp_path: Path) -> None:
    """Another window's session (its writer holds the journal's lock) is left to it; an
    unlocked old session goes."""
    old = core_trace(tmp_path / "old.arrows", n_tokens=2)
    live = pf.ParquetTraceWriter(tmp_path / "live.parquet", psr_header())
    try:
        gone = prune_traces(tmp_path, TraceLimits(keep=0, total_bytes=0))
        assert gone == [old]
        assert live.journal.exists()
    finally:
        live.close()
    assert (tmp_path / "live.parquet").exists()


def test_a_reader_never_sees_the_rename_as_an_error(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The reader opens a file more than once: a journal compacted and removed between
    the two (its first bytes read, then gone) is read again from the finished file."""
    path = tmp_path / "s.parquet"
    journal = core_trace(pf.journal_path(path), n_tokens=4)
    want = [r.text for r in read_trace(journal).tokens]
    real = af.read_batches
    finished: list[Path] = []

    def compacted_meanwhile(p: Any, *args: Any, **kwargs: Any) -> Any:
        if Path(p) == journal and journal.exists() and not finished:
            finished.append(path)
            pf.compact(journal, path, remove=True)
        return real(p, *args, **kwargs)

    monkeypatch.setattr(af, "read_batches", compacted_meanwhile)
    t = read_session(path)
    assert finished == [path] and not journal.exists()
    assert [r.text for r in t.tokens] == want and t.path == path
    # a journal's own name, once it is gone, finds the finished file too
    assert live_trace_file(journal) == path
    assert [r.text for r in read_session(journal).tokens] == want


def test_leftover_journals_are_finished_and_live_or_bad_ones_left(
        tmp_path: Path, caplog: pytest.LogCaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    left = core_trace(pf.journal_path(tmp_path / "crashed.parquet"), n_tokens=5)
    want = [r.text for r in read_trace(left).tokens]
    stale = tmp_path / ".crashed.parquet.abcd1234.part"
    stale.write_bytes(b"PAR1 cut off")
    other = tmp_path / ".other.parquet.abcd1234.part"  # not a leftover journal's
    other.write_bytes(b"x")
    garbage = pf.journal_path(tmp_path / "garbage.parquet")
    garbage.write_bytes(b"not a trace at all")
    unrelated = tmp_path / "kept.arrows.journal.arrows"  # not a Parquet journal
    unrelated.write_bytes(b"?")
    live = pf.ParquetTraceWriter(tmp_path / "live.parquet", psr_header())
    live.write_token(_record(0))

    compactor = Compactor()
    with caplog.at_level(logging.INFO, logger="moescope.trace.compactor"):
        compactor.finish_leftovers(tmp_path)
        assert compactor.wait(60)
    assert (tmp_path / "crashed.parquet").exists() and not left.exists()
    assert [r.text for r in read_trace(tmp_path / "crashed.parquet").tokens] == want
    assert not stale.exists() and other.exists() and unrelated.exists()
    assert garbage.read_bytes() == b"not a trace at all"  # left as it is
    assert live.journal.exists() and not (tmp_path / "live.parquet").exists()
    assert compactor.finished == [tmp_path / "crashed.parquet"]
    assert compactor.failed == [garbage]
    text = caplog.text
    assert "finished leftover trace journal crashed.parquet.journal.arrows" in text
    assert f"removed {stale.name}" in text
    assert "garbage.parquet.journal.arrows left as it is" in text
    assert "live.parquet.journal.arrows is in use" in text
    live.close()
    assert (tmp_path / "live.parquet").exists()

    # a compaction that fails (a full disk) leaves the journal, which opens as a trace
    full = core_trace(pf.journal_path(tmp_path / "full.parquet"), n_tokens=3)

    def no_space(*_args: Any, **_kwargs: Any) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pf, "fill_atomic", no_space)
    compactor.finish_leftovers(tmp_path)
    assert compactor.wait(60)
    assert full.exists() and not (tmp_path / "full.parquet").exists()
    assert len(read_session(tmp_path / "full.parquet").tokens) == 3
    assert compactor.failed[1:] == [full, garbage]  # the garbage was tried again


def test_an_empty_leftover_journal_is_removed_and_a_live_empty_one_left(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A window killed before its session's first token leaves a 0-byte journal (the
    stream's header goes out with the first token): nothing to compact or open, so the
    next start removes it instead of refusing it at every start; a live session's empty
    journal (locked) stays."""
    empty = pf.journal_path(tmp_path / "killed.parquet")
    empty.write_bytes(b"")
    with pytest.raises(TraceFormatError, match="empty file: this session has recorded no "):
        read_trace(empty)
    live = pf.ParquetTraceWriter(tmp_path / "live.parquet", psr_header())
    assert live.journal.stat().st_size == 0
    compactor = Compactor()
    with caplog.at_level(logging.INFO, logger="moescope.trace.compactor"):
        compactor.finish_leftovers(tmp_path)
        assert compactor.wait(60)
    assert not empty.exists() and not (tmp_path / "killed.parquet").exists()
    assert compactor.failed == [] and compactor.finished == []
    assert "removed killed.parquet.journal.arrows, an empty journal" in caplog.text
    assert live.journal.exists()
    live.write_token(_record(0))
    live.close()
    assert len(read_trace(tmp_path / "live.parquet").tokens) == 1


def _record(i: int) -> Any:
    from moescope.trace import TokenRecord

    return TokenRecord(index=i, answer=0, position=i, phase="decode", token_id=1, text="x",
                       seconds=0.01, policy="psr", slots_per_layer=4,
                       events=np.zeros(0, dtype=EVENT_DTYPE), changes=[])


def test_the_background_compaction_of_a_failed_journal_is_logged_not_raised(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    def no_space(*_args: Any, **_kwargs: Any) -> Path:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(pf, "fill_atomic", no_space)
    compactor = Compactor()
    path = tmp_path / "s.parquet"
    recorder = TraceRecorder(path, psr_header(), compactor=compactor)
    recorder.record(_token(0))
    with caplog.at_level(logging.WARNING, logger="moescope.trace.compactor"):
        recorder.close()
        assert compactor.wait(30)
    assert "trace left as its journal" in caplog.text
    assert compactor.failed == [pf.journal_path(path)]
    assert len(read_session(path).tokens) == 1
    # the journal's lock ended with the job: a later start finishes it
    monkeypatch.undo()
    compactor.finish_leftovers(tmp_path)
    assert compactor.wait(30)
    assert path.exists() and not pf.journal_path(path).exists()


def test_a_stopped_compaction_leaves_the_journal_whole_and_no_part(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Quitting stops a compaction between row groups: nothing is written, the journal
    is as it was, its lock is released (the next start finishes it)."""
    monkeypatch.setattr(pf, "ROW_GROUP_BYTES", 1)  # a row group per token
    path = tmp_path / "s.parquet"
    journal = core_trace(pf.journal_path(path), n_tokens=6)
    before = journal.read_bytes()
    asked: list[int] = []

    def stop() -> bool:
        asked.append(1)
        return len(asked) >= 4  # after the read and two row groups

    with pytest.raises(pf.CompactionStopped):
        pf.compact(journal, path, remove=True, stop=stop)
    assert journal.read_bytes() == before and sorted(tmp_path.iterdir()) == [journal]

    compactor = Compactor()
    compactor.stop()
    compactor.finish_leftovers(tmp_path)
    assert compactor.wait(30) and compactor.finished == [] and journal.exists()
    recorder = TraceRecorder(tmp_path / "r.parquet", psr_header(), compactor=compactor)
    recorder.record(_token(0))
    recorder.close()  # given up at once: the journal stays, its lock released
    assert compactor.wait(30) and compactor.finished == []
    again = Compactor()
    again.finish_leftovers(tmp_path)
    assert again.wait(30)
    assert sorted(again.finished) == [tmp_path / "r.parquet", path]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.parquet", "s.parquet"]


def test_a_new_journal_another_window_took_is_not_recorded_to(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Between creating its journal and locking it, another window's start may take it
    as a leftover: the writer then refuses to record (one line), never writing a journal
    being compacted away."""
    monkeypatch.setattr(pf, "lock_journal", lambda _path: None)
    with pytest.raises(OSError, match="another MoEScope window took this new journal"):
        pf.ParquetTraceWriter(tmp_path / "s.parquet", psr_header())


def test_a_name_another_window_took_meanwhile_is_recorded_under_the_next_one(
        tmp_path: Path) -> None:
    """Two windows on one traces folder starting sessions of one model in the same second
    pick the same name; the one whose journal comes second records under the next name
    (it was refused as "a session cut off?", its session not recorded)."""
    from moescope.display.trace_io import open_new_session

    theirs: list[pf.ParquetTraceWriter] = []
    tried: list[Path] = []

    def open_at(path: Path) -> pf.ParquetTraceWriter:
        tried.append(path)
        if not theirs:  # the other window creates its journal at the same name first
            theirs.append(pf.ParquetTraceWriter(path, psr_header()))
        return pf.ParquetTraceWriter(path, psr_header())

    mine = open_new_session(tmp_path, "/m/model.gguf", open_at)
    try:
        assert len(tried) == 2 and mine.path == tried[1] != tried[0] == theirs[0].path
        assert session_stem(mine.path.name) != session_stem(theirs[0].path.name)
        mine.write_token(_record(0))
        theirs[0].write_token(_record(0))
    finally:
        mine.close()
        theirs[0].close()
    assert len(read_trace(mine.path).tokens) == len(read_trace(theirs[0].path).tokens) == 1
