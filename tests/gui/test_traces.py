"""Session traces: recorded in the shared format (``RECORD_SUFFIX``), exported (the trace +
Perfetto + CSV), reopened with the same numbers in the plots; older sessions in every format
the reader opens are listed, pruned and opened alike."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gui_helpers import LONG_PROMPT, export_shown, export_trace, load, send, slow_down

from moescope.display.trace_io import read_session
from moescope.sim.replay import replay
from moescope.trace import RECORD_SUFFIX, TRACE_SUFFIXES, read_trace
from moescope.trace.names import live_trace_file, session_stem, trace_suffix


def _curves(panel: Any) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    panel.draw(force=True)
    return {key: tuple(np.asarray(a) for a in curve.getData())
            for key, curve in panel.time_plots.curves.items()}


def _chat_with_a_policy_switch(window: Any, qtbot: Any) -> None:
    send(qtbot, window, LONG_PROMPT, max_tokens=25)
    window.controls.select_policy("speed-first")
    qtbot.waitUntil(lambda: window.client.worker.engine.policy_name == "speed-first")
    send(qtbot, window, "and then?", max_tokens=15)


def test_session_is_recorded_in_the_shared_trace_format(window: Any, qtbot: Any) -> None:
    _chat_with_a_policy_switch(window, qtbot)
    assert window.trace_path is not None and window.trace_path.name.endswith(RECORD_SUFFIX)
    recorded = live_trace_file(window.trace_path)  # a journal, for a format finished at close
    assert recorded.is_file()
    trace = read_trace(recorded)
    live = list(window.recent_tokens)
    assert [t.text for t in trace.tokens] == [s.text for s in live]
    assert [t.policy for t in trace.tokens] == [s.policy for s in live]
    # the simulator replays the GUI's session and makes the engine's decisions
    result = replay(trace, keep_events=True)
    assert result.events is not None
    recorded = trace.events()
    np.testing.assert_array_equal(result.events["action"], recorded["action"])
    np.testing.assert_array_equal(result.events["used_ids"], recorded["used_ids"])


def test_exported_trace_reopens_with_the_same_plots(window: Any, qtbot: Any,
                                                    tmp_path: Path) -> None:
    _chat_with_a_policy_switch(window, qtbot)
    # the copy keeps the recorded format: a name saying another is renamed, not lied in
    out = tmp_path / "out"
    out.mkdir()
    exported = export_trace(qtbot, window, out / "session.jsonl")
    assert exported is not None
    copy, perfetto, tokens_csv = exported
    recorded = live_trace_file(window.trace_path)  # a journal, for a format finished at close
    assert copy == out / f"session{trace_suffix(recorded.name)}"
    assert copy.read_bytes()[:4] == recorded.read_bytes()[:4]
    assert perfetto.name == "session.perfetto.json"
    assert tokens_csv.name == "session.tokens.csv"
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [copy.name, perfetto.name, tokens_csv.name])
    assert (copy.suffix != window.trace_path.suffix) == (RECORD_SUFFIX == ".parquet")
    if copy.suffix != window.trace_path.suffix:  # the live journal, not the finished form
        said = window.statusBar().currentMessage()  # how to get what the session will be
        assert "`moescope trace compact` makes it Parquet)" in said, said
    with tokens_csv.open(newline="", encoding="utf-8") as f:
        assert len(list(csv.reader(f))) == len(window.recent_tokens) + 1  # and a header
    n_tokens = len(window.recent_tokens)

    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        window.open_trace(copy)  # read on a thread: the chat goes on meanwhile
    trace_window = opened.args[0]
    assert trace_window in window.trace_windows
    live, replayed = window.cache_panel, trace_window.panel
    live_curves, replay_curves = _curves(live), _curves(replayed)
    for key, (x, y) in live_curves.items():
        rx, ry = replay_curves[key]
        np.testing.assert_array_equal(rx, x)
        np.testing.assert_array_equal(ry, y, err_msg=key)
    for key, values in live.layer_bars.values.items():
        np.testing.assert_array_equal(replayed.layer_bars.values[key], values)
    np.testing.assert_array_equal(replayed.heatmap.image.image, live.heatmap.image.image)
    np.testing.assert_array_equal(replayed.model.uses, live.model.uses)
    np.testing.assert_array_equal(replayed.model.last_use, live.model.last_use)
    assert [(m.step, m.label) for m in replayed.model.markers] == \
        [(m.step, m.label) for m in live.model.markers]
    assert any(label == "policy=speed-first" for _, label in
               replayed.time_plots.marker_labels())
    assert replayed.model.ttft_s == live.model.ttft_s

    doc = json.loads(perfetto.read_text())
    names = {e.get("name") for e in doc["traceEvents"]}
    assert len(doc["traceEvents"]) > n_tokens and names


def test_rebuilt_residency_matches_the_live_cache_token_by_token(window: Any,
                                                                 qtbot: Any) -> None:
    from moescope.display.trace_io import reopen

    send(qtbot, window, LONG_PROMPT, max_tokens=30)
    window.controls.budget.setValue(10)  # grow: exact; shrinking would be approximate
    qtbot.waitUntil(lambda: window.client.worker.engine.slots_per_layer == 10)
    send(qtbot, window, "more", max_tokens=20)
    rebuilt = reopen(window.trace_path)
    assert rebuilt.approximate_from is None
    live_tokens = list(window.recent_tokens)
    assert len(live_tokens) == len(rebuilt.tokens)
    for i, live in enumerate(live_tokens):
        np.testing.assert_array_equal(rebuilt.resident(i), live.resident, err_msg=str(live.step))
    # the heatmap's: the last token keeps its whole mask, the others theirs as bits only
    np.testing.assert_array_equal(rebuilt.tokens[-1].resident, live_tokens[-1].resident)
    assert all(t.resident is None for t in rebuilt.tokens[:-1])


def test_opening_something_else_as_a_trace_is_explained(window: Any, dialogs: Any,
                                                        qtbot: Any, tmp_path: Path) -> None:
    bogus = tmp_path / "bogus.jsonl"
    bogus.write_text('{"hello": 1}\n')
    with qtbot.waitSignal(window.traceFailed, timeout=10_000):
        window.open_trace(bogus)
    assert dialogs.shown[-1][1] == "Cannot open the trace"
    assert "header" in dialogs.shown[-1][2]
    with qtbot.waitSignal(window.traceFailed, timeout=10_000):
        window.open_trace(tmp_path)
    assert "is a folder" in dialogs.shown[-1][2]
    assert not window.trace_windows


def test_two_sessions_started_in_one_second_never_share_a_file(tmp_path: Path) -> None:
    from moescope.display.trace_io import new_trace_path

    first = new_trace_path(tmp_path, "/m/model.gguf")
    assert first.name.endswith(f"-model{RECORD_SUFFIX}")
    first.write_text("{}\n")
    second = new_trace_path(tmp_path, "/m/model.gguf")
    second.write_text("{}\n")
    third = new_trace_path(tmp_path, "/m/model.gguf")
    assert len({first, second, third}) == 3 and not third.exists()
    # nor a name an older format's session, or a journal, has: they would prune as one
    stem = third.name[:-len(RECORD_SUFFIX)]
    (tmp_path / f"{stem}.jsonl.gz").write_text("")
    fourth = new_trace_path(tmp_path, "/m/model.gguf")
    (tmp_path / f"{fourth.name[:-len(RECORD_SUFFIX)]}.parquet.journal.arrows").write_text("")
    fifth = new_trace_path(tmp_path, "/m/model.gguf")
    assert fourth.name == f"{stem[:-2]}-4{RECORD_SUFFIX}"
    assert fifth.name == f"{stem[:-2]}-5{RECORD_SUFFIX}"


def test_turning_recording_off_mid_answer_closes_the_trace_at_once(window: Any,
                                                                    qtbot: Any) -> None:
    """Off applies at the next token (recording costs the decode thread time, and a user
    turning it off wants that now); the trace so far is closed properly, the answer goes
    on unrecorded, and on waits for the next model load."""
    send(qtbot, window, "Hello there.", max_tokens=6)
    path = window.trace_path
    assert path is not None and window.client.worker.recorder is not None
    slow_down(window, 2000)
    turned_off: list[int] = []

    def off_mid_answer(snaps: list[Any]) -> None:
        if not turned_off and window.chat.tokens_received >= 3:
            turned_off.append(window.chat.tokens_received)
            window.record_action.trigger()

    window.chat.tokensArrived.connect(off_mid_answer)
    summary = send(qtbot, window, LONG_PROMPT, max_tokens=30)
    window.chat.tokensArrived.disconnect(off_mid_answer)
    assert turned_off and summary.n_tokens == 30 and not window.recording
    assert window.client.worker.recorder is None
    trace = read_session(path)  # the journal, or the finished file once compacted
    assert trace.end is not None and trace.end["stop_reason"] == "recording turned off"
    assert not trace.truncated
    second = [t for t in trace.tokens if t.answer == 1]
    assert turned_off[0] <= len(second) < 30  # stopped within a token or two of asking
    assert "Recording stopped" in window.statusBar().currentMessage()
    # on again: nothing is recorded until the next load (a trace starts from an empty cache)
    window.record_action.trigger()
    assert window.recording and window.client.worker.recorder is None
    assert "next model load" in window.statusBar().currentMessage()


def test_turning_recording_off_before_the_first_token_says_no_trace_is_kept(
        window: Any, qtbot: Any) -> None:
    """A session with no token leaves no file (an empty trace would only count among the
    sessions kept), so the status line must not point at a trace that will not be there."""
    path = window.trace_path
    assert path is not None and live_trace_file(path).stat().st_size == 0
    window.record_action.trigger()
    assert not window.recording
    assert "recorded nothing" in window.statusBar().currentMessage()
    qtbot.waitUntil(lambda: not live_trace_file(path).exists(), timeout=30_000)
    assert window.client.worker.recorder is None and not path.exists()


def test_old_sessions_are_deleted_oldest_first_by_count_and_by_size(tmp_path: Path) -> None:
    import os

    from moescope.display.trace_io import TraceLimits, prune_traces

    sizes = [300, 200, 100, 100, 50]  # oldest first
    files = []
    for n, size in enumerate(sizes):
        p = tmp_path / f"s{n}.jsonl"
        p.write_bytes(b"x" * size)
        os.utime(p, (1000 + n, 1000 + n))
        files.append(p)
    (tmp_path / "notes.txt").write_bytes(b"x" * 10_000)  # not a trace: never touched
    # by size: the newest that fit in 260 bytes stay (50 + 100 + 100), the rest go
    gone = prune_traces(tmp_path, TraceLimits(keep=10, total_bytes=260))
    assert sorted(gone) == files[:2]
    assert [p.exists() for p in files] == [False, False, True, True, True]
    # room for a session about to start: 100 more bytes must fit
    assert prune_traces(tmp_path, TraceLimits(keep=10, total_bytes=260), room=100) == \
        [files[2]]
    # by count
    assert prune_traces(tmp_path, TraceLimits(keep=1, total_bytes=10_000)) == [files[3]]
    assert (tmp_path / "notes.txt").exists() and files[4].exists()


def test_prune_counts_every_format_and_a_sessions_journal_with_it(tmp_path: Path) -> None:
    """Sessions recorded before the format changed prune with the new ones, and a session
    being finished (its journal beside the finished file, a compaction's leftover temporary
    file) is one session: counted whole, deleted whole."""
    import os

    from moescope.display.trace_io import TraceLimits, prune_traces

    def put(name: str, size: int, when: int) -> Path:
        p = tmp_path / name
        p.write_bytes(b"x" * size)
        os.utime(p, (when, when))
        return p

    oldest = put("20200101-000000-a.jsonl", 100, 1000)
    gz = put("20200101-000001-b.jsonl.gz", 100, 1001)
    arrows = put("20200101-000002-qwen2.5-moe.arrows", 100, 1002)  # a dotted model name
    final = put("20200101-000003-c.parquet", 100, 1003)
    journal = put("20200101-000003-c.parquet.journal.arrows", 100, 1004)
    part = put(".20200101-000003-c.parquet.k2x_9q0z.part", 100, 1004)  # compaction cut off
    newest = put(f"20200101-000004-d{RECORD_SUFFIX}", 100, 1005)
    keep = [put("notes.txt", 10_000, 900), put("20200101-000000-a.perfetto.json", 50, 900)]
    os.symlink(oldest, tmp_path / "link.jsonl")  # a link is not a session file: never touched
    # five sessions (c's finished file, journal and leftover are one, 300 bytes): 550 bytes
    # keep the newest three
    assert sorted(prune_traces(tmp_path, TraceLimits(keep=10, total_bytes=550))) == \
        sorted([oldest, gz])
    assert prune_traces(tmp_path, TraceLimits(keep=2, total_bytes=10_000)) == [arrows]
    assert sorted(prune_traces(tmp_path, TraceLimits(keep=1, total_bytes=10_000))) == \
        sorted([final, journal, part])
    assert newest.exists() and all(p.exists() for p in keep)
    assert (tmp_path / "link.jsonl").is_symlink()
    assert prune_traces(tmp_path / "missing", TraceLimits(keep=0)) == []


def test_a_session_still_recording_to_a_journal_exports_the_journal(
        record: Any, tmp_path: Path) -> None:
    """A format finished at close (``NAME.parquet``) is a journal on disk until then: the
    export copies the journal, named as what it is (an Arrow stream), with its Perfetto and
    CSV files, and opening the session reads it; once the finished file exists, that is what
    is copied."""
    import shutil

    from moescope.display.trace_io import export_session, reopen

    stream = record("qwen3moe", name="journal.arrows", tokens=8)
    recorded = tmp_path / "rec" / "20260101-000000-m.parquet"
    recorded.parent.mkdir()
    shutil.copyfile(stream, recorded.parent / f"{recorded.name}.journal.arrows")
    out = tmp_path / "out"
    out.mkdir()
    copy, perfetto, tokens_csv = export_session(recorded, out / "mine.parquet")
    assert copy == out / "mine.arrows" and copy.read_bytes() == stream.read_bytes()
    assert (perfetto.name, tokens_csv.name) == ("mine.perfetto.json", "mine.tokens.csv")
    assert len(read_trace(copy).tokens) == len(read_trace(stream).tokens) > 0
    assert len(reopen(recorded).tokens) == len(read_trace(stream).tokens)  # opens too
    # a finished trace is copied as it is, in its own format, whatever the name asked
    jsonl = record("qwen3moe", name="finished.jsonl", tokens=8)
    done = tmp_path / "rec" / "20260101-000001-m.jsonl"
    shutil.copyfile(jsonl, done)
    copy, _, _ = export_session(done, out / "again.arrows")
    assert copy == out / "again.jsonl" and copy.read_bytes() == jsonl.read_bytes()
    with pytest.raises(OSError):
        export_session(tmp_path / "rec" / "gone.parquet", out / "x")
    assert not (out / "x").exists() and not (out / "x.parquet").exists()


def test_exporting_a_session_before_its_first_token_says_so_and_writes_nothing(
        window: Any, dialogs: Any, qtbot: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """A session's journal is empty until its first token (the stream's header goes out
    with it): the export says there is nothing yet instead of failing after the copy (a
    traceback, an empty file left at the user's path, no message)."""
    from PySide6.QtWidgets import QFileDialog

    assert window.trace_path is not None
    assert live_trace_file(window.trace_path).stat().st_size == 0
    out = tmp_path / "out"
    out.mkdir()
    assert export_trace(qtbot, window, out / "early.parquet") is None
    assert dialogs.shown[-1][1] == "Could not export the trace"
    assert "nothing recorded yet" in dialogs.shown[-1][2]
    asked: list[str] = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a: (asked.append(a[1]), ("", ""))[1]))
    window.export_trace_dialog()
    assert not asked and dialogs.shown[-1][1] == "No trace to export yet"
    assert sorted(out.iterdir()) == []


def test_trace_dialogs_offer_every_format_and_export_the_recorded_one(
        window: Any, qtbot: Any, tmp_path: Path, monkeypatch: Any) -> None:
    from PySide6.QtWidgets import QFileDialog

    from moescope.util import paths

    send(qtbot, window, "Hello there.", max_tokens=6)
    asked: list[tuple[str, str, str]] = []
    dest = tmp_path / "picked"

    def save(_parent: Any, title: str, default: str, filters: str) -> tuple[str, str]:
        asked.append((title, default, filters))
        return str(dest), filters

    def open_(_parent: Any, title: str, start: str, filters: str) -> tuple[str, str]:
        asked.append((title, start, filters))
        return "", ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(save))
    monkeypatch.setattr("moescope.gui.traces.session_traces.ask_trace_file",
                        lambda parent, start, filters: open_(parent, "Open trace", start,
                                                             filters)[0])
    with qtbot.waitSignal(window.traceExportFinished, timeout=30_000):
        window.export_trace_dialog()
    title, default, filters = asked[-1]
    recorded = live_trace_file(window.trace_path)
    assert Path(default).name == f"{session_stem(recorded.name)}{trace_suffix(recorded.name)}"
    assert f"(*{trace_suffix(recorded.name)})" in filters
    assert (tmp_path / f"picked{trace_suffix(recorded.name)}").is_file()
    assert (tmp_path / "picked.tokens.csv").is_file()
    window.open_trace_dialog()
    title, start, filters = asked[-1]
    assert [a[0] for a in asked] == ["Export trace", "Open trace"] and title == "Open trace"
    assert start == str(paths.traces_dir())
    for suffix in TRACE_SUFFIXES:
        assert f"*{suffix}" in filters.split(";;")[0]


def test_a_session_trace_stops_at_its_size_limit_and_the_chat_goes_on(window: Any,
                                                                      qtbot: Any) -> None:
    """A long chat on a large model writes ~110 kB a token: recording stops at the
    session's limit with a reason a reader sees, the user is told, the answer goes on."""
    from moescope.display.trace_io import TraceLimits

    path = window.trace_path
    assert path is not None
    worker = window.client.worker
    writer = worker.recorder.writer  # counts what it wrote (a journal's bytes, if one)
    header = writer.bytes_written
    limit = header + 20_000  # a few tokens of the tiny model
    worker.trace_limits = TraceLimits(session_bytes=limit)
    summary = send(qtbot, window, LONG_PROMPT, max_tokens=40)
    assert summary.n_tokens == 40  # the answer was not cut
    assert worker.recorder is None  # File → Export trace still exports what was recorded
    trace = read_trace(live_trace_file(path))
    assert trace.end is not None and trace.end["stop_reason"] == "size limit"
    assert not trace.truncated and 0 < len(trace.tokens) < 40
    # stopped within a token or two of the limit (the writer thread is one token behind)
    per_token = (writer.bytes_written - header) / len(trace.tokens)
    assert limit <= writer.bytes_written < limit + 3 * per_token
    if path.name.endswith((".arrows", ".jsonl")):  # written as it goes: the count is the file's
        assert path.stat().st_size == writer.bytes_written
    assert any("size limit" in text for _, text in window.notices)
    assert "recording stopped" in window.statusBar().currentMessage()
    # the chat goes on, unrecorded
    assert send(qtbot, window, "and then?", max_tokens=5).n_tokens == 5


def test_a_new_session_deletes_the_oldest_traces_to_make_room(window: Any, qtbot: Any,
                                                              tiny_moe: Path) -> None:
    import os

    from moescope.display.trace_io import TraceLimits

    send(qtbot, window, "Hello there.", max_tokens=4)  # a session with no token is not kept
    first = window.trace_path
    assert first is not None
    old = first.parent / "20200101-000000-old.jsonl"  # an older format's session prunes too
    old.write_bytes(b"x" * 40_000)
    os.utime(old, (1000, 1000))
    # the first session grows by its end record when the load closes it: room for that
    size = live_trace_file(first).stat().st_size
    window.client.worker.trace_limits = TraceLimits(session_bytes=size + 10,
                                                    total_bytes=size * 2 + 20_000)
    load(qtbot, window, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    assert window.trace_path is not None and window.trace_path != first
    # the oldest went, the newer one fits (its journal, until compacted in the background)
    assert not old.exists() and live_trace_file(first).exists()
    assert window.client.worker.compactor.wait(30) and first.exists()


def test_a_trace_window_exports_the_trace_it_shows(trace_window: Any, trace_path: Path,
                                                   qtbot: Any, tmp_path: Path,
                                                   monkeypatch: Any) -> None:
    """An older trace, opened in its window, is exported from there as File ▸ Export trace
    exports the session: the trace in its own format, Perfetto JSON and a per-token CSV, from
    a save dialog (Ctrl+Shift+E or the Export button) that starts at home, then in the last
    export's folder."""
    from PySide6.QtCore import QSettings, Qt
    from PySide6.QtWidgets import QFileDialog

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    trace_window.settings = QSettings(str(tmp_path / "settings.ini"), QSettings.Format.IniFormat)
    out = tmp_path / "out"
    out.mkdir()
    asked: list[tuple[str, str, str]] = []
    picks = [out / "old.parquet", out / "again"]  # a wrong trace suffix is replaced

    def save(_parent: Any, title: str, default: str, filters: str) -> tuple[str, str]:
        asked.append((title, default, filters))
        return str(picks[len(asked) - 1]), filters

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(save))
    before = trace_path.read_bytes()
    trace_window.activateWindow()
    qtbot.waitUntil(trace_window.isActiveWindow, timeout=5_000)
    with qtbot.waitSignal(trace_window.exportFinished, timeout=30_000):
        qtbot.keyClick(trace_window, Qt.Key.Key_E,
                       Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier)
    assert asked == [("Export trace", str(home / trace_path.name),
                      "MoEScope trace, JSON Lines (*.jsonl)")]
    copy = out / "old.jsonl"
    assert sorted(p.name for p in out.iterdir()) == [
        "old.jsonl", "old.perfetto.json", "old.tokens.csv"]
    assert copy.read_bytes() == before == trace_path.read_bytes()
    n_tokens = len(trace_window.tokens)
    assert len(read_trace(copy).tokens) == n_tokens > 0
    with (out / "old.tokens.csv").open(newline="", encoding="utf-8") as f:
        assert len(list(csv.reader(f))) == n_tokens + 1  # and a header
    doc = json.loads((out / "old.perfetto.json").read_text())
    assert len(doc["traceEvents"]) > n_tokens
    said = trace_window.statusBar().currentMessage()
    assert said == f"Saved {copy} with its .perfetto.json and .tokens.csv", said

    assert trace_window.export_button.accessibleName() == "Export this trace"
    assert trace_window.export_button.isEnabled()  # again, once the export is done
    with qtbot.waitSignal(trace_window.exportFinished, timeout=30_000):
        trace_window.export_button.click()  # it asks the same; the folder is remembered
    assert asked[-1][1] == str(out / trace_path.name)
    assert (out / "again.jsonl").read_bytes() == before
    assert (out / "again.tokens.csv").is_file() and (out / "again.perfetto.json").is_file()


def test_a_trace_window_export_never_replaces_its_trace_and_says_why(
        trace_window: Any, trace_path: Path, qtbot: Any, tmp_path: Path,
        monkeypatch: Any) -> None:
    """Exporting onto the shown trace (or a symlink to it), into a folder that is not there,
    or cancelling the dialog writes nothing and replaces nothing; a failure is one line in
    the window's status bar, not a traceback."""
    from PySide6.QtWidgets import QFileDialog

    before = trace_path.read_bytes()
    siblings = sorted(trace_path.parent.iterdir())
    link = tmp_path / "link.jsonl"
    link.symlink_to(trace_path)
    for dest in (trace_path, link, tmp_path / "missing" / "x.jsonl"):
        assert export_shown(qtbot, trace_window, dest) is None, dest
        said = trace_window.statusBar().currentMessage()
        assert said.startswith("Could not export the trace: ") and "\n" not in said, said
        assert "Nothing was written there." in said
    assert trace_path.read_bytes() == before
    assert sorted(trace_path.parent.iterdir()) == siblings  # no Perfetto or CSV beside it
    assert sorted(tmp_path.iterdir()) == [link]

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(lambda *a: ("", "")))
    trace_window.statusBar().clearMessage()
    trace_window.export_dialog()
    assert trace_window.statusBar().currentMessage() == ""
    assert sorted(tmp_path.iterdir()) == [link]


def test_the_session_export_remembers_its_folder_for_trace_windows(
        window: Any, qtbot: Any, tmp_path: Path, monkeypatch: Any) -> None:
    """File ▸ Export trace and a trace window's Export share the last export's folder."""
    from PySide6.QtWidgets import QFileDialog

    send(qtbot, window, "Hello there.", max_tokens=6)
    out = tmp_path / "exports"
    out.mkdir()
    assert export_trace(qtbot, window, out / "first") is not None
    asked: list[str] = []
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a: (asked.append(a[2]), ("", ""))[1]))
    window.export_trace_dialog()
    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        window.open_trace(window.trace_path)
    opened.args[0].export_dialog()
    assert [Path(a).parent for a in asked] == [out, out]


def test_a_session_trace_gone_since_recording_is_blamed_not_the_output(
        window: Any, qtbot: Any, tmp_path: Path, dialogs: Any) -> None:
    """File ▸ Export trace after the session's own file was deleted: the message names the
    session's trace, not the output (which was fine), and nothing is written."""
    send(qtbot, window, "Hello there.", max_tokens=4)
    assert window.trace_path is not None
    recorded = live_trace_file(window.trace_path)
    recorded.unlink()
    out = tmp_path / "out"
    out.mkdir()
    assert export_trace(qtbot, window, out / "copy") is None
    _kind, title, text = dialogs.shown[-1]
    assert title == "Could not export the trace"
    # named as the session's trace is now: its journal is gone, so its finished name
    assert text in (f"The session's trace {name} can no longer be read (No such file or "
                    "directory). Nothing was written." for name in (recorded, window.trace_path)
                    ), text
    assert list(out.iterdir()) == []
