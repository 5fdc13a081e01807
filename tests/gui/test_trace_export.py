"""Trace exports run on their own thread (``gui.traces.trace_export``): the window keeps
handling events while a long trace is copied, read back and turned into a timeline; the
Export controls are disabled meanwhile, with progress and Cancel in the status bar; the
three files appear together, the same bytes as a direct :func:`export_session`, or
nothing at all (cancelled, failed, the window closed mid-export).

The long trace is synthetic (``moescope_testing.traces.synthetic_trace``, Qwen3-Next's
geometry, routing decided by the real core); nothing here asserts a duration. Tests that
must act mid-export hold the export at its timeline stage (after the copy and the read,
both staged on disk) until it is cancelled, so that they never race its end.
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import export_shown, export_trace, send

from moescope.display.trace_io import EXPORT_STAGES, export_session
from moescope.gui.traces import trace_export
from moescope.gui.traces.trace_export import CANCELLED_MESSAGE, PROGRESS_STEPS, saved_message
from moescope.trace import read_trace
from moescope_testing.traces import synthetic_trace

TIMELINE = EXPORT_STAGES[2][0]


@pytest.fixture(scope="module")
def long_trace(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~70 MB: 600 tokens at Qwen3-Next's geometry (48 layers x 512 experts, top-10)."""
    return synthetic_trace(tmp_path_factory.mktemp("export-long") / "long.arrows",
                           n_tokens=600)


@pytest.fixture
def held(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Every export started from the GUI waits, once it reaches its timeline stage, until
    it is cancelled (at most 60 s); the returned event is set when one got there."""
    real = trace_export.export_session
    reached = threading.Event()

    def export_session_held(trace: Path, dest: Path, progress: Any) -> Any:
        def hold(stage: str, done: int, total: int) -> bool:
            go_on = bool(progress(stage, done, total))
            if stage == TIMELINE:
                reached.set()
                end = time.monotonic() + 60
                while go_on and time.monotonic() < end:
                    time.sleep(0.005)
                    go_on = bool(progress(stage, done, total))
            return go_on
        return real(trace, dest, progress=hold)

    monkeypatch.setattr(trace_export, "export_session", export_session_held)
    return reached


@pytest.fixture
def unwritable(tmp_path: Path) -> Iterator[Path]:
    """A folder in which no file can be created: one without write permission, or, for
    root (whom folder modes do not stop), /sys, where the kernel refuses."""
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    for candidate in (folder, Path("/sys")):
        try:
            fd, name = tempfile.mkstemp(dir=candidate)
        except OSError:
            yield candidate
            break
        os.close(fd)
        os.unlink(name)
    else:
        pytest.skip("no folder here refuses new files")
    folder.chmod(0o755)


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_long_export_runs_while_the_window_handles_events(
        open_trace_window: Callable[[Path], Any], long_trace: Path, qtbot: Any,
        tmp_path: Path) -> None:
    """The export returns at once and runs beside the event loop: a timer fires many times
    while it runs and sees the progress bar at several points between start and end (an
    export on the GUI thread would let no timer fire before it was done); Export is
    disabled meanwhile (a second one is refused); the files are those of a direct export."""
    from PySide6.QtCore import QTimer

    window = open_trace_window(long_trace)
    out, direct = tmp_path / "out", tmp_path / "direct"
    out.mkdir()
    direct.mkdir()
    seen: list[tuple[bool, int]] = []
    timer = QTimer()
    timer.setInterval(2)
    timer.timeout.connect(lambda: seen.append((window.exports.running,
                                               window.exports.bar.value())))
    timer.start()
    try:
        with qtbot.waitSignal(window.exportFinished, timeout=120_000) as finished:
            job = window.export(out / "long")
            assert job is not None and window.exports.running
            assert not window.export_button.isEnabled()
            assert not window.export_action.isEnabled()
            assert window.exports.bar.isVisible() and window.exports.cancel_button.isVisible()
            assert window.export(out / "second") is None  # one at a time
    finally:
        timer.stop()
    files = finished.args[0]
    assert files is not None
    during = {value for running, value in seen if running and 0 < value < PROGRESS_STEPS}
    assert len(during) >= 3, seen  # the loop ran at several points of the export
    assert window.export_button.isEnabled() and window.export_action.isEnabled()
    assert not window.exports.bar.isVisible() and not job.isRunning()
    assert window.statusBar().currentMessage() == saved_message(long_trace, files)

    reference = export_session(long_trace, direct / "long")
    assert [p.name for p in files] == [p.name for p in reference]
    for mine, theirs in zip(files, reference, strict=True):
        assert mine.read_bytes() == theirs.read_bytes(), mine.name
    assert files[0].read_bytes() == long_trace.read_bytes()
    assert _names(out) == _names(direct)  # no temporary left
    assert len(read_trace(files[0]).tokens) == 600


def test_cancel_stops_the_export_and_writes_nothing(
        open_trace_window: Callable[[Path], Any], long_trace: Path, held: threading.Event,
        qtbot: Any, tmp_path: Path) -> None:
    """Cancel in the status bar, mid-export (the copy already staged on disk): nothing is
    left, not even the temporaries; a file already at the path is unchanged."""
    window = open_trace_window(long_trace)
    out = tmp_path / "out"
    out.mkdir()
    (out / "long.arrows").write_text("an earlier export")
    with qtbot.waitSignal(window.exportFinished, timeout=120_000) as finished:
        assert window.export(out / "long") is not None
        qtbot.waitUntil(held.is_set, timeout=60_000)
        staged = [n for n in _names(out) if n.endswith(".part")]
        assert len(staged) >= 2, staged  # the copy whole, the timeline being written
        window.exports.cancel_button.click()
    assert finished.args[0] is None
    assert window.statusBar().currentMessage() == CANCELLED_MESSAGE
    assert _names(out) == ["long.arrows"]
    assert (out / "long.arrows").read_text() == "an earlier export"
    assert window.export_button.isEnabled()


def test_closing_a_trace_window_mid_export_leaves_no_file(
        open_trace_window: Callable[[Path], Any], long_trace: Path, held: threading.Event,
        qtbot: Any, tmp_path: Path) -> None:
    window = open_trace_window(long_trace)
    out = tmp_path / "out"
    out.mkdir()
    job = window.export(out / "long")
    assert job is not None
    qtbot.waitUntil(held.is_set, timeout=60_000)
    assert any(n.endswith(".part") for n in _names(out))
    window.close()  # cancels and joins the export
    assert not job.isRunning() and not window.exports.running
    assert _names(out) == []
    qtbot.wait(50)  # the export's last queued signals are delivered (and ignored)
    assert window.export(out / "again") is None  # a closed window starts no export
    assert _names(out) == []


def test_closing_the_main_window_mid_export_leaves_no_file(
        window: Any, held: threading.Event, qtbot: Any, tmp_path: Path) -> None:
    """File ▸ Export trace of the session being recorded, then quit while it runs."""
    send(qtbot, window, "Hello there.", max_tokens=6)
    out = tmp_path / "out"
    out.mkdir()
    job = window.export_trace(out / "session")
    assert job is not None and not window.export_trace_action.isEnabled()
    qtbot.waitUntil(held.is_set, timeout=60_000)
    window.close()
    assert not job.isRunning()
    assert _names(out) == []


def test_an_unwritable_folder_is_one_line_in_the_trace_window(
        open_trace_window: Callable[[Path], Any], trace_path: Path, unwritable: Path,
        qtbot: Any) -> None:
    """The trace window says it in its status bar: one line, naming the path, and nothing
    is created there."""
    before = _names(unwritable)
    window = open_trace_window(trace_path)
    dest = unwritable / "x"
    assert export_shown(qtbot, window, dest) is None
    said = window.statusBar().currentMessage()
    assert said.startswith(f"Could not export the trace: {dest}: "), said
    assert "\n" not in said and "Nothing was written there." in said
    assert window.export_button.isEnabled()
    assert _names(unwritable) == before


def test_an_unwritable_folder_is_one_line_in_the_main_window(
        window: Any, dialogs: Any, unwritable: Path, qtbot: Any) -> None:
    """File ▸ Export trace says it in a message box, as before it ran on a thread."""
    before = _names(unwritable)
    send(qtbot, window, "Hello there.", max_tokens=6)
    dest = unwritable / "x"
    assert export_trace(qtbot, window, dest) is None
    kind, title, text = dialogs.shown[-1]
    assert (kind, title) == ("critical", "Could not export the trace")
    assert text.startswith(f"{dest}: ") and "\n" not in text, text
    assert "free some space" not in text  # a folder refusing files is not a full disk
    assert text.endswith("pick another folder."), text
    # the box said it; the status bar no longer says "Exporting the trace to …"
    assert "Exporting" not in window.statusBar().currentMessage()
    assert window.export_trace_action.isEnabled()
    assert _names(unwritable) == before


def test_an_export_stopped_at_any_stage_writes_nothing(long_trace: Path,
                                                       tmp_path: Path) -> None:
    """``export_session``'s progress says stop in each stage in turn: nothing appears and
    the file already at the path is kept; let through, every stage reports its end."""
    from moescope.display.trace_io import ExportCancelled

    out = tmp_path / "out"
    out.mkdir()
    (out / "long.tokens.csv").write_text("an earlier export")
    for stage, _ in EXPORT_STAGES:
        with pytest.raises(ExportCancelled):
            export_session(long_trace, out / "long", lambda s, _d, _n, stop=stage: s != stop)
        assert _names(out) == ["long.tokens.csv"], stage
        assert (out / "long.tokens.csv").read_text() == "an earlier export"
    last: dict[str, tuple[int, int]] = {}

    def report(stage: str, done: int, total: int) -> bool:
        last[stage] = (done, total)
        return True

    export_session(long_trace, out / "long", report)
    assert list(last) == [name for name, _ in EXPORT_STAGES]
    size = long_trace.stat().st_size
    assert last[EXPORT_STAGES[0][0]] == (size, size)
    assert last[EXPORT_STAGES[2][0]] == last[EXPORT_STAGES[3][0]] == (600, 600)
    assert _names(out) == ["long.arrows", "long.perfetto.json", "long.tokens.csv"]


def test_the_timeline_streamed_a_token_at_a_time_is_the_whole_document(
        long_trace: Path) -> None:
    import io
    import json

    from moescope.trace import to_perfetto
    from moescope.trace.perfetto import dump_perfetto

    trace = read_trace(long_trace)
    out = io.BytesIO()
    dump_perfetto(trace, out)
    assert out.getvalue() == json.dumps(to_perfetto(trace), ensure_ascii=False).encode()


@pytest.mark.parametrize("replace", [False, True])
def test_files_the_export_adds_a_suffix_to_are_confirmed_before_they_are_replaced(
        open_trace_window: Callable[[Path], Any], qtbot: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, replace: bool) -> None:
    """The save dialog confirms only the name typed ("x"); the export writes x.arrows and
    its two side files, so where those exist the window asks first: No leaves every file as
    it was and exports nothing; Yes replaces them."""
    from PySide6.QtWidgets import QFileDialog, QMessageBox

    trace = synthetic_trace(tmp_path / "shown.arrows", n_tokens=8)
    out = tmp_path / "out"
    out.mkdir()
    (out / "x.arrows").write_bytes(b"keep")
    (out / "x.tokens.csv").write_bytes(b"keep too")
    window = open_trace_window(trace)
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a: (str(out / "x"), "")))
    asked: list[str] = []

    def question(_parent: Any, title: str, text: str, *_a: Any) -> Any:
        asked.append(text)
        return QMessageBox.StandardButton.Yes if replace else QMessageBox.StandardButton.No

    monkeypatch.setattr(QMessageBox, "question", staticmethod(question))
    if replace:
        with qtbot.waitSignal(window.exportFinished, timeout=30_000) as finished:
            window.export_dialog()
        assert finished.args[0] is not None
        assert (out / "x.arrows").read_bytes() == trace.read_bytes()
        assert _names(out) == ["x.arrows", "x.perfetto.json", "x.tokens.csv"]
    else:
        window.export_dialog()
        assert not window.exports.running
        assert (out / "x.arrows").read_bytes() == b"keep"
        assert (out / "x.tokens.csv").read_bytes() == b"keep too"
        assert _names(out) == ["x.arrows", "x.tokens.csv"]
    assert len(asked) == 1 and "x.arrows, x.tokens.csv already exist" in asked[0]


def test_no_question_when_the_exports_files_are_new(
        open_trace_window: Callable[[Path], Any], qtbot: Any, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from PySide6.QtWidgets import QFileDialog, QMessageBox

    trace = synthetic_trace(tmp_path / "shown.arrows", n_tokens=8)
    window = open_trace_window(trace)
    monkeypatch.setattr(QFileDialog, "getSaveFileName",
                        staticmethod(lambda *a: (str(tmp_path / "new"), "")))
    monkeypatch.setattr(QMessageBox, "question",
                        staticmethod(lambda *a: pytest.fail("asked about new files")))
    with qtbot.waitSignal(window.exportFinished, timeout=30_000) as finished:
        window.export_dialog()
    assert finished.args[0] is not None and (tmp_path / "new.arrows").is_file()
