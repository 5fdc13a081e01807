"""Session traces: recorded in the shared format, exported (JSONL + Perfetto), reopened with
the same numbers in the plots."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
from gui_helpers import LONG_PROMPT, load, send, slow_down

from moescope.sim.replay import replay
from moescope.trace import read_trace


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
    assert window.trace_path is not None and window.trace_path.is_file()
    trace = read_trace(window.trace_path)
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
    exported = window.export_trace(tmp_path / "session.jsonl")
    assert exported is not None
    jsonl, perfetto, tokens_csv = exported
    assert tokens_csv.name == "session.tokens.csv"
    with tokens_csv.open(newline="", encoding="utf-8") as f:
        assert len(list(csv.reader(f))) == len(window.recent_tokens) + 1  # and a header
    n_tokens = len(window.recent_tokens)

    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        window.open_trace(jsonl)  # read on a thread: the chat goes on meanwhile
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
    for live, again in zip(window.recent_tokens, rebuilt.tokens, strict=True):
        np.testing.assert_array_equal(again.resident, live.resident, err_msg=str(live.step))


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
    first.write_text("{}\n")
    second = new_trace_path(tmp_path, "/m/model.gguf")
    second.write_text("{}\n")
    third = new_trace_path(tmp_path, "/m/model.gguf")
    assert len({first, second, third}) == 3 and not third.exists()


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
    trace = read_trace(path)
    assert trace.end is not None and trace.end["stop_reason"] == "recording turned off"
    assert not trace.truncated
    second = [t for t in trace.tokens if t.answer == 1]
    assert turned_off[0] <= len(second) < 30  # stopped within a token or two of asking
    assert "Recording stopped" in window.statusBar().currentMessage()
    # on again: nothing is recorded until the next load (a trace starts from an empty cache)
    window.record_action.trigger()
    assert window.recording and window.client.worker.recorder is None
    assert "next model load" in window.statusBar().currentMessage()


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


def test_a_session_trace_stops_at_its_size_limit_and_the_chat_goes_on(window: Any,
                                                                      qtbot: Any) -> None:
    """A long chat on a large model writes ~170 kB a token: recording stops at the
    session's limit with a reason a reader sees, the user is told, the answer goes on."""
    from moescope.display.trace_io import TraceLimits

    path = window.trace_path
    assert path is not None
    worker = window.client.worker
    header = path.stat().st_size
    limit = header + 20_000  # a few tokens of the tiny model
    worker.trace_limits = TraceLimits(session_bytes=limit)
    summary = send(qtbot, window, LONG_PROMPT, max_tokens=40)
    assert summary.n_tokens == 40  # the answer was not cut
    assert worker.recorder is None  # File → Export trace still exports what was recorded
    trace = read_trace(path)
    assert trace.end is not None and trace.end["stop_reason"] == "size limit"
    assert not trace.truncated and 0 < len(trace.tokens) < 40
    # stopped within a token or two of the limit (the writer thread is one token behind)
    per_token = (path.stat().st_size - header) / len(trace.tokens)
    assert limit <= path.stat().st_size < limit + 3 * per_token
    assert any("size limit" in text for _, text in window.notices)
    assert "recording stopped" in window.statusBar().currentMessage()
    # the chat goes on, unrecorded
    assert send(qtbot, window, "and then?", max_tokens=5).n_tokens == 5


def test_a_new_session_deletes_the_oldest_traces_to_make_room(window: Any, qtbot: Any,
                                                              tiny_moe: Path) -> None:
    import os

    from moescope.display.trace_io import TraceLimits

    first = window.trace_path
    assert first is not None
    old = first.parent / "20200101-000000-old.jsonl"
    old.write_bytes(b"x" * 4000)
    os.utime(old, (1000, 1000))
    window.client.worker.trace_limits = TraceLimits(session_bytes=first.stat().st_size + 10,
                                                    total_bytes=first.stat().st_size * 2 + 2000)
    load(qtbot, window, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    assert window.trace_path is not None and window.trace_path != first
    assert not old.exists() and first.exists()  # the oldest went, the newer one fits
