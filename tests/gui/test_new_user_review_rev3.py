"""A new user's session with the desktop window (session 15, helper "rev3"): what they met
on the demo model at 1366x768 and 1024x700, each as it was found. Real window, real
engine, demo model, Qt offscreen."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import drag_accepted, drop, load
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog

from moescope.util import paths


@pytest.fixture
def window(make_window: Any, qtbot: Any, demo: Path) -> Iterator[Any]:
    """The window with the demo model, as `make run` opens it."""
    w = make_window()
    load(qtbot, w, demo, budget="25%", policy="quality-first", n_ctx=512)
    yield w


def _open_dialog_start(window: Any, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Where File ▸ Open model… starts (the dialog is cancelled)."""
    seen: list[str] = []

    def dialog(_parent: Any, _title: str, start: str, *_a: Any) -> tuple[str, str]:
        seen.append(start)
        return "", ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(dialog))
    window.open_model_dialog()
    assert len(seen) == 1
    return Path(seen[0])


def test_open_model_starts_in_the_models_folder_not_the_demos(
        window: Any, qtbot: Any, monkeypatch: pytest.MonkeyPatch, tiny_moe: Path) -> None:
    """With the demo model open (every first start), File ▸ Open model… started in the
    folder the demo ships in (the checkout's or the bundle's resources/models), not in the
    models folder where Get models puts downloads, as the README and the welcome text say;
    after the user's own model it still starts at that model."""
    start = _open_dialog_start(window, monkeypatch)
    assert start == paths.models_dir()
    load(qtbot, window, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    assert _open_dialog_start(window, monkeypatch) == tiny_moe


def test_a_truncated_model_names_the_size_it_should_have(
        window: Any, dialogs: Any, demo: Path, tmp_path: Path) -> None:
    """A download cut at a third of the demo said "it is 6,000,000 bytes (5.7 MiB) but
    should be at least 6,192,576 bytes (5.9 MiB)": the end of the first tensor past the
    cut, not the file's size (17.6 MB), so it read as nearly complete. The header lists
    every tensor, so the message gives the whole size; nothing is loaded."""
    size = demo.stat().st_size
    cut = tmp_path / "cut model.gguf"
    cut.write_bytes(demo.read_bytes()[:size // 3])
    before = window.model
    window.prepare_open(cut)
    [text] = dialogs.texts("critical")
    assert f"it is {size // 3:,} bytes" in text
    assert f"should be {size:,} bytes" in text and "at least" not in text
    assert window.model == before


def test_check_fit_with_no_files_listed_says_so(window: Any, qtbot: Any) -> None:
    """With no repository's files listed (nothing searched yet, or the search failed for
    want of a network), Check fit said "Fit at a VRAM budget of 25%, from each file's
    header alone. Choose a file and Download." over an empty list, replacing the line
    that said why the search failed."""
    action = next(a for a in window.actions() if a.text() == "&Get models…")
    action.trigger()
    hub = window.get_models_window
    qtbot.mouseClick(hub.fit_button, Qt.MouseButton.LeftButton)
    assert hub.files.topLevelItemCount() == 0
    assert "Fit at" not in hub.status.text()
    assert hub.status.text().startswith("No files to check yet: search the Hub")
    hub.close()


def test_files_named_in_capitals_can_be_dropped(window: Any, qtbot: Any, trace_path: Path,
                                                tmp_path: Path) -> None:
    """A model or trace whose name ends in capitals (``MODEL.GGUF``, ``S.JSONL``, as
    Windows tools and some downloads write them) was refused when dragged over the window,
    where ``moescope MODEL.GGUF`` opens it and the README says a trace's suffix counts in
    any letter case. A dropped one opens as its lower-case twin does."""
    for name in ("MODEL.GGUF", "Model.Gguf", "S.JSONL", "S.JSONL.GZ", "S.PARQUET",
                 "S.Arrows"):
        assert drag_accepted(window, tmp_path / name), name
    assert not drag_accepted(window, tmp_path / "NOTES.TXT")
    shown = tmp_path / "SESSION.JSONL"
    shown.write_bytes(trace_path.read_bytes())
    with qtbot.waitSignal(window.traceOpened, timeout=30_000) as opened:
        drop(window, shown)
    trace_window = opened.args[0]
    assert trace_window in window.trace_windows
    trace_window.close()


def test_a_last_model_that_is_gone_is_named_when_the_demo_opens_instead(
        make_window: Any, qtbot: Any, demo: Path, tmp_path: Path) -> None:
    """The window reopens the last model at start; when that file had gone (moved,
    deleted, a drive not mounted) it opened the demo model without a word, so a user
    met a toy model in place of theirs and no reason why. It still opens the demo, and
    the status bar and the log say which file was missing."""
    w = make_window()
    gone = tmp_path / "big model.gguf"
    w.settings.setValue("last_model", str(gone))
    with qtbot.waitSignal(w.modelLoaded, timeout=30_000) as loaded:
        assert w.autoload()
    assert Path(loaded.args[0].path).samefile(demo)
    text = w.statusBar().currentMessage()
    assert str(gone) in text and "is no longer there" in text and "demo" in text


@pytest.mark.parametrize("host", ["not an address", "127.0.0.l", "300.1.2.3"])
def test_serve_names_an_address_that_is_none(window: Any, qtbot: Any, host: str) -> None:
    """A mistyped address in Serve API ("127.0.0.l") was answered "127.0.0.l lets other
    machines reach the model: type an API key …", as if it were a real network address
    and serving it only needed a key. It is named as no address of this machine."""
    window.serve.show_panel()
    panel = window.serve.panel
    panel.host.setText(host)
    panel.key.setText("")
    qtbot.mouseClick(panel.button, Qt.MouseButton.LeftButton)
    assert not window.serve.serving
    text = panel.error.text()
    assert text.startswith(f"{host} is not an address of this machine")
    assert "lets other machines reach" not in text
    panel.close()


def test_a_dense_model_is_not_welcomed_with_an_expert_cache(
        make_window: Any, qtbot: Any, dense_model: Path) -> None:
    """A model without routed experts loads with the cache off (a dialog says so), but the
    empty chat then said "The panel on the right shows, per token, which experts were in
    the cache …" over an empty panel, and the status line read "m.gguf ·  · expert cache
    off" (an empty architecture between two dots)."""
    w = make_window()
    load(qtbot, w, dense_model, n_ctx=512)
    assert not w.model.cache_enabled
    text = w.chat_view.text()
    assert "which experts were in the cache" not in text
    assert "expert cache is off" in text and "Mixture-of-Experts" in text
    label = w.model_label.text()
    assert "·  ·" not in label and "expert cache off" in label


def test_a_model_opened_as_a_trace_is_named_a_model(window: Any, dialogs: Any, qtbot: Any,
                                                    demo: Path) -> None:
    """File ▸ Open trace… on a .gguf (the file next to the traces a user means to pick, or
    dropped in the wrong dialog) said "line 1: not valid JSON ('utf-8' codec can't decode
    byte 0x91 in position 157 …)". It is named as the model it is."""
    with qtbot.waitSignal(window.traceFailed, timeout=10_000):
        window.open_trace(demo)
    _kind, title, text = dialogs.shown[-1]
    assert title == "Cannot open the trace"
    assert f"{demo.name}: a GGUF model file, not a MoEScope trace" in text
    assert "JSON" not in text and "utf-8" not in text


def test_a_message_longer_than_the_context_says_what_to_do(
        window: Any, dialogs: Any, qtbot: Any) -> None:
    """A pasted text longer than the context (the demo's 512 tokens) failed with
    "the conversation (4210 tokens) does not fit the context of 512 tokens": the earlier
    turns are left out by themselves, so it is the message alone that does not fit, and
    nothing said what to do about it. It is now measured before it is sent, and a line
    under the box says so (``test_message_length``): no box opens."""
    assert not window.chat.send("To be or not to be, that is the question. " * 120)
    assert dialogs.shown == []
    text = window.chat_view.input_note.text()
    assert "Not sent: this message is " in text and "context of 512 tokens" in text
    assert "Shorten it by about " in text
