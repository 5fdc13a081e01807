"""The traces folder as a list (File ▸ Recent sessions, the Recorded sessions dialog): each
session once, newest first, its header and token count read without reading the trace,
the live journal and a crash's journal told apart, and a bad or foreign file listed as
unreadable with a one-line reason, never raised."""

from __future__ import annotations

import dataclasses
import gzip
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from trace_helpers import psr_header

from moescope.cache.native import EVENT_DTYPE
from moescope.display import trace_list
from moescope.display.trace_list import (
    TraceState,
    detail_text,
    list_traces,
    menu_text,
    session_title,
    size_text,
    state_text,
)
from moescope.trace import TraceRecorder, read_trace
from moescope.trace import parquet_format as pf
from moescope.trace.peek import peek_trace
from moescope.trace.schema import TraceFormatError


def _token(i: int) -> SimpleNamespace:
    return SimpleNamespace(index=i, token_id=1, text=f"t{i}", seconds=0.01, policy="psr",
                           slots_per_layer=4, events=np.zeros(0, dtype=EVENT_DTYPE))


def _header(created: str, name: str = "Qwen3-30B-A3B") -> object:
    h = psr_header()
    return dataclasses.replace(h, created=created,
                               model=dataclasses.replace(h.model, name=name))


def _record(path: Path, tokens: int, created: str = "2026-11-30T10:00:00+00:00",
            name: str = "Qwen3-30B-A3B", close: bool = True) -> TraceRecorder:
    recorder = TraceRecorder(path, _header(created, name))  # type: ignore[arg-type]
    for i in range(tokens):
        recorder.record(_token(i))
    if close:
        recorder.close(stop_reason="done")
    else:
        recorder.flush()  # every token on disk: the listing below reads the file
    return recorder


@pytest.mark.parametrize("name", ["s.parquet", "s.arrows", "s.jsonl", "s.jsonl.gz"])
def test_peek_reads_the_header_and_counts_what_the_reader_reads(tmp_path: Path,
                                                                name: str) -> None:
    path = tmp_path / name
    _record(path, 7, name="Some-MoE")
    peek = peek_trace(path)
    assert peek.header.model.name == "Some-MoE"
    assert peek.header.created == "2026-11-30T10:00:00+00:00"
    # gzip JSON Lines: its end record's member, read alone (no token decompressed)
    assert peek.tokens == len(read_trace(path).tokens) == 7 and peek.ended
    assert not peek.partial and peek.scanned == 0


def test_a_json_lines_trace_without_its_end_counts_its_last_whole_token(
        tmp_path: Path) -> None:
    """A crash leaves no end record: the last complete line's index says how many tokens
    the reader will read, whether that line is short, long (a real model's router inputs:
    only its first bytes are read), or followed by a token cut off mid-line."""
    folder = tmp_path / "traces"
    folder.mkdir()
    path = folder / "s.jsonl"
    recorder = _record(tmp_path / "live.jsonl", 6, close=False)
    shutil.copy(tmp_path / "live.jsonl", path)  # the file as a crash leaves it
    recorder.close(stop_reason="done")
    peek = peek_trace(path)
    assert (peek.tokens, peek.ended) == (6, False)
    assert len(read_trace(path).tokens) == 6
    with open(path, "ab") as f:  # a line as long as a real model's (not a valid token)
        f.write(b'{"type":"token","index":6,"text":"' + b"x" * 300_000 + b'"}\n')
    assert (peek_trace(path).tokens, peek_trace(path).ended) == (7, False)
    with open(path, "ab") as f:
        f.write(b'{"type":"token","index":7,"text":"cut off by the cra')
    assert (peek_trace(path).tokens, peek_trace(path).ended) == (7, False)
    assert list_traces(folder)[0].state is TraceState.CRASHED

    crash = (tmp_path / "crash.jsonl")
    shutil.copy(folder / "s.jsonl", crash)
    body = crash.read_bytes()[:crash.read_bytes().find(b'{"type":"token","index":6')]
    last = body.splitlines(keepends=True)[-1]  # token 5, a whole line
    six = last.replace(b'"index":5,', b'"index":6,', 1).rstrip(b"\n")
    cases = {  # the tail as written -> (tokens, ended), as the reader reads the file
        b"": (6, False),
        b"\n\n": (6, False),  # blank lines, which the reader passes over
        six: (7, False),  # a token whole but for its newline
        six[:-3]: (6, False),  # cut off
        b'{"type":"end","tokens":6}': (6, True),  # the end record without its newline
        b'{"type":"end","tokens":6}\n\n': (6, True),
        six.replace(b'"index":6,', b'"index":06,') + b"\n": (None, None),  # not JSON
        six.replace(b'"index":6,', b'"index":9999999999,') + b"\n": (None, None),
        b'{"type":"end","tokens":-1}\n': (None, None),
    }
    for tail, want in cases.items():
        crash.write_bytes(body + tail)
        peek = peek_trace(crash)
        assert (peek.tokens, peek.ended) == want, tail
        if want[0] is not None:
            assert len(read_trace(crash).tokens) == want[0], tail

    only = tmp_path / "none.jsonl"
    _record(tmp_path / "live0.jsonl", 0, close=False).close()
    lines = (tmp_path / "live0.jsonl").read_bytes().splitlines(keepends=True)
    only.write_bytes(lines[0])  # the header alone
    assert (peek_trace(only).tokens, peek_trace(only).ended) == (0, False)
    odd = tmp_path / "odd.jsonl"
    _record(odd, 2)
    with open(odd, "ab") as f:
        f.write(b'{"type":"note","text":"a later version\'s record"}\n')
    assert (peek_trace(odd).tokens, peek_trace(odd).ended) == (None, None)


def test_a_stream_cut_mid_token_counts_the_whole_tokens(tmp_path: Path) -> None:
    path = tmp_path / "s.arrows"
    recorder = _record(path, 6, close=False)  # no end record: as a killed writer left it
    whole = peek_trace(path)
    assert not whole.truncated and not whole.ended and whole.tokens
    os.truncate(path, path.stat().st_size - 10)
    peek = peek_trace(path)
    full = read_trace(path)
    assert peek.truncated and full.truncated and not peek.ended
    assert peek.tokens == len(full.tokens) == whole.tokens - 1 == 5
    recorder.close(stop_reason="done")


def _unclosed_gzip(tmp_path: Path, tokens: int) -> bytes:
    """A gzip trace's bytes as a crash leaves them: every token sync-flushed, no end."""
    recorder = _record(tmp_path / "live.jsonl.gz", tokens, close=False)
    data = (tmp_path / "live.jsonl.gz").read_bytes()
    recorder.close(stop_reason="done")
    return data


def _reader_count(path: Path) -> int | None:
    try:
        return len(read_trace(path).tokens)
    except TraceFormatError:
        return None


def test_a_gzip_trace_without_its_end_member_is_counted_as_the_reader_counts(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A crash leaves a gzip trace without its end record (and an older writer put it in
    the tokens' member): it is decompressed from its start, bounded, and counted as the
    reader counts it: cut off anywhere, whole but one member, with no token, empty."""
    folder = tmp_path / "traces"
    folder.mkdir()
    data = _unclosed_gzip(tmp_path, 6)
    path = folder / "s.jsonl.gz"
    path.write_bytes(data)
    peek = peek_trace(path)
    assert (peek.tokens, peek.ended, peek.partial) == (6, False, False) and peek.scanned
    assert _reader_count(path) == 6
    assert list_traces(folder)[0].state is TraceState.CRASHED
    header_end = len(gzip.compress(b"", mtime=0))  # no cut below this is a trace
    for cut in range(1, len(data)):
        path.write_bytes(data[:cut])
        want = _reader_count(path)
        try:
            peek = peek_trace(path)
        except TraceFormatError as err:
            assert want is None, (cut, err)
            assert "\n" not in str(err) and str(err).startswith("s.jsonl.gz: ")
            continue
        assert want is not None or cut < header_end, cut
        if want is not None:
            assert (peek.tokens, peek.ended, peek.partial) == (want, False, False), cut

    # an older writer's trace: one member, its end record inside
    closed = tmp_path / "closed.jsonl.gz"
    _record(closed, 9)
    old = folder / "old.jsonl.gz"
    old.write_bytes(gzip.compress(gzip.decompress(closed.read_bytes()), mtime=0))
    peek = peek_trace(old)
    assert (peek.tokens, peek.ended, peek.partial) == (9, True, False) == (
        _reader_count(old), True, False)
    # longer than the bound: a lower bound, shown as one
    peek = peek_trace(old, gzip_scan=1)
    assert peek.partial and peek.ended is None
    assert peek.tokens is None or peek.tokens <= 9
    big = folder / "big.jsonl.gz"
    with gzip.GzipFile(big, "wb", mtime=0) as f:
        f.write(gzip.decompress(closed.read_bytes()).rsplit(b"\n", 2)[0] + b"\n")
        f.write(b"".join(b'{"type":"token","index":%d,"text":"' % i + os.urandom(3000).hex()
                         .encode() + b'"}\n' for i in range(9, 400)))
    monkeypatch.setattr("moescope.trace.peek.MAX_GZIP_SCAN", 1 << 20)
    monkeypatch.setattr(trace_list, "MAX_GZIP_SCAN", 1 << 20)
    entry = next(e for e in list_traces(folder) if e.path == big)
    assert entry.tokens_partial and entry.tokens is not None and 9 < entry.tokens < 400
    assert trace_list.tokens_text(entry) == f"≥{entry.tokens:,}"
    assert f"≥{entry.tokens:,} tokens" in menu_text(entry)
    assert "at least" in detail_text(entry) and entry.state is TraceState.FINISHED
    # a listing whose budget is spent counts nothing more, and a later one counts it
    monkeypatch.setattr(trace_list, "GZIP_SCAN_PER_LISTING", 0)
    big.touch()
    entry = next(e for e in list_traces(folder) if e.path == big)
    assert entry.tokens is None and trace_list.tokens_text(entry) == "–"
    monkeypatch.setattr(trace_list, "GZIP_SCAN_PER_LISTING", 8 << 20)
    assert next(e for e in list_traces(folder) if e.path == big).tokens_partial


def test_an_empty_or_junk_gzip_trace_is_counted_or_refused_in_one_line(
        tmp_path: Path) -> None:
    closed = tmp_path / "none.jsonl.gz"
    _record(closed, 0)
    assert (peek_trace(closed).tokens, peek_trace(closed).ended) == (0, True)
    assert _reader_count(closed) == 0
    header_only = tmp_path / "header.jsonl.gz"
    header_only.write_bytes(_unclosed_gzip(tmp_path, 0))
    assert (peek_trace(header_only).tokens, peek_trace(header_only).ended) == (0, False)
    assert _reader_count(header_only) == 0
    cases = {
        "zero.jsonl.gz": b"",
        "nothing.jsonl.gz": gzip.compress(b"", mtime=0),
        "junk.jsonl.gz": b"\x1f\x8b" + os.urandom(2000),
        "magic.jsonl.gz": b"\x1f\x8b\x08\x00",
    }
    data = _unclosed_gzip(tmp_path, 5)
    mid = len(data) // 2
    cases["flipped.jsonl.gz"] = data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:]
    cases["garbage-after.jsonl.gz"] = data + b"\x1f\x8b\x08" + b"\x00" * 30
    for name, raw in cases.items():
        path = tmp_path / name
        path.write_bytes(raw)
        try:
            peek = peek_trace(path)
        except TraceFormatError as err:
            assert "\n" not in str(err) and str(err).startswith(f"{name}: "), name
            continue
        want = _reader_count(path)
        assert want is None or peek.tokens in (None, want), name
    entries = {e.path.name: e for e in list_traces(tmp_path)}
    for name in ("zero.jsonl.gz", "nothing.jsonl.gz", "junk.jsonl.gz", "magic.jsonl.gz"):
        assert entries[name].state in (TraceState.UNREADABLE, TraceState.EMPTY), name
        assert "\n" not in entries[name].reason


def test_the_folder_lists_each_session_once_newest_first(tmp_path: Path) -> None:
    _record(tmp_path / "20261128-100000-a.parquet", 3, "2026-11-28T10:00:00+00:00", "A")
    _record(tmp_path / "20261130-100000-b.arrows", 4, "2026-11-30T10:00:00+00:00", "B")
    _record(tmp_path / "20261129-100000-c.jsonl.gz", 5, "2026-11-29T10:00:00+00:00", "C")
    (tmp_path / "notes.txt").write_text("not a trace: not listed")
    (tmp_path / ".20261127-x.parquet.abcdefgh.part").write_bytes(b"PAR1")  # a leftover alone
    entries = list_traces(tmp_path)
    assert [e.model for e in entries] == ["B", "C", "A"]
    b, c, a = entries
    assert (a.tokens, a.format, a.state) == (3, "Parquet", TraceState.FINISHED)
    assert (b.tokens, b.format) == (4, "Arrow stream")
    assert (c.tokens, c.format, c.openable) == (5, "gzip JSON Lines", True)
    assert a.size == (tmp_path / "20261128-100000-a.parquet").stat().st_size
    assert a.policy == "psr" and a.when.year == 2026
    assert "4 tokens" in menu_text(b) and "(" not in menu_text(b)
    assert "5 tokens" in menu_text(c) and c.state is TraceState.FINISHED


def test_the_live_journal_is_recording_and_a_crash_journal_is_told_apart(
        tmp_path: Path) -> None:
    live = tmp_path / "20261201-100000-live.parquet"
    recorder = _record(live, 4, "2026-12-01T10:00:00+00:00", close=False)
    journal = pf.journal_path(live)
    crashed = tmp_path / "20261130-100000-gone.parquet.journal.arrows"
    shutil.copyfile(journal, crashed)  # the same bytes, but no writer holds them
    try:
        by_name = {e.path.name: e for e in list_traces(tmp_path, live=[live])}
        now, left = by_name[journal.name], by_name[crashed.name]
        written = recorder.writer.n_tokens
        assert written == 4
        assert now.state is TraceState.RECORDING and now.this_window
        assert now.tokens == written
        assert now.openable and state_text(now) == "recording now"
        assert "not as a finished trace" in detail_text(now)
        # the file's name ends before the sentence starts ("….arrows Still being …" read as one)
        assert detail_text(now).startswith(f"{now.path} — Still being recorded")
        assert left.state is TraceState.CRASHED and left.tokens == written and left.openable
        assert state_text(left) == "left by a crash" and "left by a crash" in left.reason
        assert not list_traces(tmp_path)[0].this_window  # another window's: not "now"
        assert state_text(list_traces(tmp_path)[0]) == "recording (another window)"
        for i in range(3):
            recorder.record(_token(4 + i))
        recorder.flush()
        assert list_traces(tmp_path, live=[live])[0].tokens == 7  # counted afresh
    finally:
        recorder.close(stop_reason="done")
    done = list_traces(tmp_path)[0]
    assert done.path == live and done.state is TraceState.FINISHED and done.tokens == 7


def test_a_session_with_no_token_yet_names_its_model_from_its_file_name(
        tmp_path: Path) -> None:
    """The recording-now row of a session with no token showed the file's name in the
    Model column (no header to read yet): the name says the model, after its time."""
    live = tmp_path / "20261201-100000-Qwen3-30B-A3B-Q4_K_M.parquet"
    pf.journal_path(live).write_bytes(b"")
    (entry,) = list_traces(tmp_path, live=[live])
    assert entry.state is TraceState.RECORDING and entry.tokens == 0
    assert entry.model == "Qwen3-30B-A3B-Q4_K_M"
    pf.journal_path(live).unlink()
    (tmp_path / "someone's.parquet.journal.arrows").write_bytes(b"")
    assert list_traces(tmp_path, live=[tmp_path / "someone's.parquet"])[0].model == ""


def test_a_journal_with_its_finished_file_lists_the_finished_one(tmp_path: Path) -> None:
    path = tmp_path / "20261201-s.parquet"
    _record(path, 3)
    shutil.copyfile(path, tmp_path / "other.parquet")
    _record(tmp_path / "j.arrows", 3)
    shutil.copyfile(tmp_path / "j.arrows", pf.journal_path(path))  # a crash after rename
    names = [e.path.name for e in list_traces(tmp_path)]
    assert names.count(path.name) == 1 and pf.journal_path(path).name not in names


def test_empty_and_bad_files_are_unreadable_with_one_line_reasons(tmp_path: Path) -> None:
    _record(tmp_path / "good.arrows", 2)
    (tmp_path / "empty.parquet.journal.arrows").write_bytes(b"")
    (tmp_path / "garbage.jsonl").write_bytes(b"\x00\x01 not json\n")
    (tmp_path / "huge-line.jsonl").write_bytes(b"x" * (2 << 20))
    (tmp_path / "foreign.parquet").write_bytes(b"")
    pq.write_table(pa.table({"a": [1, 2]}), tmp_path / "foreign.parquet")
    (tmp_path / "cut.parquet").write_bytes((tmp_path / "foreign.parquet").read_bytes()[:-3])
    (tmp_path / "folder.arrows").mkdir()
    (tmp_path / "link.arrows").symlink_to(tmp_path / "good.arrows")
    (tmp_path / "stream.arrows").write_bytes(b"\xff\xff\xff\xff" + b"\x7f" * 40)
    entries = {e.path.name: e for e in list_traces(tmp_path)}
    assert entries["good.arrows"].state is TraceState.FINISHED
    assert entries["empty.parquet.journal.arrows"].state is TraceState.EMPTY
    bad = {n: e for n, e in entries.items() if e.state is TraceState.UNREADABLE}
    assert set(bad) == {"garbage.jsonl", "huge-line.jsonl", "foreign.parquet", "cut.parquet",
                        "folder.arrows", "link.arrows", "stream.arrows"}
    for name, e in bad.items():
        assert e.reason and "\n" not in e.reason and len(e.reason) <= 300, name
        assert not e.openable and "Cannot be opened" in detail_text(e)
        assert not e.reason.startswith(name)  # the list shows the name beside it
    assert "MoEScope header" in bad["foreign.parquet"].reason
    assert "cut off" in bad["cut.parquet"].reason
    assert not entries["empty.parquet.journal.arrows"].openable


def test_a_file_changed_on_disk_is_peeked_again(tmp_path: Path) -> None:
    path = tmp_path / "s.arrows"
    _record(path, 2)
    assert list_traces(tmp_path)[0].tokens == 2
    _record(path.with_name("t.arrows"), 5)
    os.replace(path.with_name("t.arrows"), path)
    assert list_traces(tmp_path)[0].tokens == 5
    path.write_bytes(b"nonsense\n")
    assert list_traces(tmp_path)[0].state is TraceState.UNREADABLE


def test_a_missing_folder_lists_nothing(tmp_path: Path) -> None:
    assert list_traces(tmp_path / "nowhere") == []


def test_a_crowded_folder_lists_only_its_newest_sessions(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(trace_list, "MAX_LISTED", 3)
    for i in range(6):
        path = tmp_path / f"s{i}.jsonl"
        path.write_bytes(b"{}\n")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    assert [e.path.name for e in list_traces(tmp_path)] == ["s5.jsonl", "s4.jsonl",
                                                           "s3.jsonl"]


def test_a_cancelled_listing_stops_at_the_next_file(tmp_path: Path) -> None:
    """The window's scan runs on a thread; a newer scan stops the older one."""
    for i in range(6):
        path = tmp_path / f"s{i}.jsonl"
        path.write_bytes(b"{}\n")
        os.utime(path, (1_700_000_000 + i, 1_700_000_000 + i))
    asked: list[int] = []

    def after_two() -> bool:
        asked.append(1)
        return len(asked) > 2

    assert [e.path.name for e in list_traces(tmp_path, cancelled=after_two)] == [
        "s5.jsonl", "s4.jsonl"]
    assert list_traces(tmp_path, cancelled=lambda: True) == []
    assert len(list_traces(tmp_path, cancelled=lambda: False)) == 6


def test_peek_refuses_with_the_file_named(tmp_path: Path) -> None:
    path = tmp_path / "x.arrows"
    path.write_bytes(b"PAR1" + b"\0" * 4)
    with pytest.raises(TraceFormatError, match=r"x\.arrows"):
        peek_trace(path)
    with pytest.raises(TraceFormatError, match="cannot read"):
        peek_trace(tmp_path / "missing.arrows")


def test_sizes_read_as_a_file_manager_says(tmp_path: Path) -> None:
    assert [size_text(n) for n in (5, 12_051, 3_400_000, 2 << 30)] == [
        "5 bytes", "12.1 kB", "3.4 MB", "2.1 GB"]
    assert trace_list.menu_text(dataclasses.replace(
        list_traces_one(tmp_path), model="R&D")).count("&&") == 1


def list_traces_one(folder: Path) -> trace_list.SessionTrace:
    _record(folder / "s.arrows", 1)
    return list_traces(folder)[0]


def test_a_gzip_trace_cut_inside_its_end_member_reads_every_token(tmp_path: Path) -> None:
    """The end record is a gzip member of its own: a write cut inside it (a full disk)
    loses the end record only. Cut one byte in, Python's gzip calls the rest "not a
    gzipped file", and the reader (and the listing) refused the whole trace as corrupt."""
    closed = tmp_path / "closed.jsonl.gz"
    _record(closed, 7)
    data = closed.read_bytes()
    tokens_member = len(data) - len(gzip.compress(b"x", mtime=0))
    start = data.rfind(b"\x1f\x8b\x08", tokens_member - 64)
    assert start > 0 and gzip.decompress(data[start:]).startswith(b'{"type":"end"')
    path = tmp_path / "cut.jsonl.gz"
    for cut in range(start, len(data) + 1):
        path.write_bytes(data[:cut])
        peek = peek_trace(path)
        trace = read_trace(path)
        assert len(trace.tokens) == 7 and peek.tokens == 7, cut
        # the end record counts once decoded, its member's CRC cut off or not
        assert peek.ended is (trace.end is not None) and not peek.partial, cut
        assert trace.end is not None or cut < len(data) - 8, cut
    # a lone first byte is the cut-off end only there: one after a whole trace is garbage
    # for neither, and a flipped byte in the tokens is still corruption
    path.write_bytes(data[:start] + b"\x1f")
    assert list_traces(tmp_path)[0].state is TraceState.CRASHED
    mid = start // 2
    path.write_bytes(data[:mid] + bytes([data[mid] ^ 0xFF]) + data[mid + 1:])
    with pytest.raises(TraceFormatError, match="corrupt gzip stream"):
        read_trace(path)


def test_gzip_traces_that_fail_midway_are_charged_to_the_listing(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A gzip trace refused after decompressing much of its bound (corrupt past its start)
    cost the listing nothing, so a folder of them decompressed a file's bound each: the
    menu stalled in proportion to their number."""
    folder = tmp_path / "traces"
    folder.mkdir()
    closed = tmp_path / "closed.jsonl.gz"
    _record(closed, 9)
    head = gzip.decompress(closed.read_bytes()).rsplit(b"\n", 2)[0] + b"\n"
    body = b"".join(b'{"type":"token","index":%d,"text":"' % i + os.urandom(3000).hex()
                    .encode() + b'"}\n' for i in range(9, 300))
    data = bytearray(gzip.compress(head + body, mtime=0))
    data[len(data) * 3 // 4] ^= 0xFF  # corrupt past the start: found after ~3/4 of it
    for n in range(8):
        (folder / f"bad{n}.jsonl.gz").write_bytes(bytes(data))
    monkeypatch.setattr("moescope.trace.peek.MAX_GZIP_SCAN", 2 << 20)
    monkeypatch.setattr(trace_list, "MAX_GZIP_SCAN", 2 << 20)
    allowed: list[int] = []
    real = trace_list.peek_trace

    def watched(path: Path, gzip_scan: int) -> object:
        allowed.append(gzip_scan)
        return real(path, gzip_scan=gzip_scan)

    monkeypatch.setattr(trace_list, "peek_trace", watched)
    entries = list_traces(folder)
    assert len(entries) == 8
    assert sum(1 for e in entries if e.reason) >= 2  # refused, as the reader would
    assert sum(allowed) <= trace_list.GZIP_SCAN_PER_LISTING


def test_a_sessions_title_is_its_model_and_local_time(tmp_path: Path) -> None:
    import datetime as dt

    path = tmp_path / "20261202-101500-x.parquet.journal.arrows"
    when = dt.datetime(2026, 12, 2, 10, 15, tzinfo=dt.timezone.utc)
    local = when.astimezone().strftime("%Y-%m-%d %H:%M")
    assert session_title("OLMoE", when.isoformat(), path) == f"OLMoE · {local}"
    assert session_title("", when.isoformat(), path) == local
    assert session_title("OLMoE", "not a time", path) == "OLMoE"
    assert session_title("", "", path) == path.name
