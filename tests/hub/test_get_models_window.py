"""The Get models window, driven offscreen over the stand-in Hub and the real engine:
search, fit per file at a budget, download with progress, one-line errors, open."""

from __future__ import annotations

import os

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hub_helpers import CHILD_TIMEOUT_S, GATED_REPO, REPO, Hub, held_pull

from moescope.util import paths
from moescope_testing.hub_server import file_key

pytest.importorskip("pytestqt")


@pytest.fixture
def main_window(qtbot: Any, hub: Hub, tmp_path: Path,
                monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    from moescope.gui.app import create_app
    from moescope.gui.main_window import MainWindow

    monkeypatch.setenv(paths.ENV_DATA_DIR, str(tmp_path / "data"))
    create_app([])
    w = MainWindow()
    qtbot.addWidget(w)
    w.show()
    yield w
    w.close()
    assert not w.client.thread.isRunning()


def _get_models(main: Any) -> Any:
    action = next(a for a in main.actions() if a.text() == "&Get models…")
    action.trigger()
    return main.get_models_window


def _search(qtbot: Any, window: Any, words: str) -> None:
    window.search.setText(words)
    qtbot.mouseClick(window.search_button, qtbot_left())
    qtbot.waitUntil(lambda: window.results.count() > 0 and not window.busy(), timeout=10_000)


def qtbot_left() -> Any:
    from PySide6.QtCore import Qt
    return Qt.MouseButton.LeftButton


def _choose(qtbot: Any, window: Any, repo: str) -> None:
    from PySide6.QtCore import Qt
    item = next(window.results.item(i) for i in range(window.results.count())
                if window.results.item(i).data(Qt.ItemDataRole.UserRole) == repo)
    window.results.setCurrentItem(item)
    qtbot.waitUntil(lambda: window.files.topLevelItemCount() > 0 and not window.busy(),
                    timeout=10_000)


def _fits(window: Any) -> list[str]:
    return [window.files.topLevelItem(i).text(3)
            for i in range(window.files.topLevelItemCount())]


def test_search_fit_download_and_open(qtbot: Any, hub: Hub, main_window: Any) -> None:
    assert "Get models" in main_window.model_label.text()  # the empty state points here
    window = _get_models(main_window)
    assert window.isVisible()
    _search(qtbot, window, "tiny")
    assert REPO in window.results.item(0).text() and "MoE" in window.results.item(0).text()
    _choose(qtbot, window, REPO)
    assert all("4/16 experts per layer" in f for f in _fits(window))  # 25% by default
    assert all(hub.server.served[file_key(REPO, f"Tiny-MoE-{q}.gguf")] <= 1 << 20
               for q in ("Q4_0", "Q8_0"))

    window.budget.setText("50%")
    qtbot.mouseClick(window.fit_button, qtbot_left())
    qtbot.waitUntil(lambda: all("8/16 experts per layer" in f for f in _fits(window)),
                    timeout=10_000)

    window.files.setCurrentItem(window.files.topLevelItem(1))  # Tiny-MoE-Q8_0.gguf
    assert window.selected_model().quant == "Q8_0"
    assert not window.open_button.isEnabled()
    seen: list[int] = []
    window.progress.valueChanged.connect(seen.append)
    qtbot.mouseClick(window.download_button, qtbot_left())
    qtbot.waitUntil(lambda: window.open_button.isEnabled(), timeout=20_000)
    assert seen and seen[-1] == 1000
    assert "sha256 checked" in window.status.text()
    path = paths.models_dir() / REPO / "Tiny-MoE-Q8_0.gguf"
    assert path.read_bytes() == hub.tiny.read_bytes()

    with qtbot.waitSignal(main_window.modelLoaded, timeout=30_000) as loaded:
        qtbot.mouseClick(window.open_button, qtbot_left())
    summary = loaded.args[0]
    assert summary.n_expert == 16 and summary.slots_per_layer == 8  # the 50% shown


def test_failures_are_one_line_in_the_window(qtbot: Any, hub: Hub, main_window: Any) -> None:
    window = _get_models(main_window)
    _search(qtbot, window, "gated")
    _choose(qtbot, window, GATED_REPO)
    assert all("✗" in f and "gated or private" in f for f in _fits(window))
    qtbot.mouseClick(window.download_button, qtbot_left())
    qtbot.waitUntil(lambda: window.download_job is None, timeout=10_000)
    assert "access denied (401)" in window.status.text()
    assert "\n" not in window.status.text()
    assert not window.open_button.isEnabled()
    assert not list(paths.models_dir().rglob("*.gguf"))

    window.budget.setText("lots")
    qtbot.mouseClick(window.fit_button, qtbot_left())
    assert "cannot read budget" in window.status.text()

    window.search.setText("no-such-model")
    qtbot.mouseClick(window.search_button, qtbot_left())
    qtbot.waitUntil(lambda: "No GGUF repositories match" in window.status.text(),
                    timeout=10_000)


def test_a_model_another_moescope_is_downloading_is_refused_then_reused(
        qtbot: Any, hub: Hub, main_window: Any) -> None:
    """A `moescope pull` in another process has the file half done. Download stayed
    enabled for it (and was then refused in one line): the window now says the model is
    being downloaded elsewhere and keeps Download off for that model only, and once the
    other download has finished it offers Open, having fetched nothing itself."""
    with held_pull(hub) as other:
        window = _get_models(main_window)
        _search(qtbot, window, "tiny")
        _choose(qtbot, window, REPO)
        window.files.setCurrentItem(window.files.topLevelItem(0))  # Tiny-MoE-Q4_0.gguf
        assert window.download_button.isEnabled() and not window.elsewhere.isVisible()
        window.files.setCurrentItem(window.files.topLevelItem(1))  # Tiny-MoE-Q8_0.gguf
        line = (f"Tiny-MoE-Q8_0.gguf is being downloaded by another MoEScope (process "
                f"{other.process.pid})")
        assert not window.download_button.isEnabled()
        assert window.elsewhere.isVisible() and window.elsewhere.text().startswith(line)
        assert window.download_button.toolTip() == window.elsewhere.text()
        assert not window.open_button.isEnabled()
        # the lock taken between two looks: Download run anyway is still refused in one line
        window.download_selected()
        qtbot.waitUntil(lambda: window.download_job is None, timeout=10_000)
        assert window.status.text() == (
            f"Tiny-MoE-Q8_0.gguf is already being downloaded by another MoEScope (process "
            f"{other.process.pid}): let that download finish (or cancel it there), then try "
            f"again")
        assert not window.download_button.isEnabled()  # still the other's
        assert other.partial.read_bytes() == hub.tiny.read_bytes()[:100_000]
        other.pause.go.set()
        assert other.process.wait(CHILD_TIMEOUT_S) == 0
    served = hub.server.served[file_key(REPO, "Tiny-MoE-Q8_0.gguf")]
    # the window notices by itself: no click, no new selection
    qtbot.waitUntil(lambda: window.open_button.isEnabled(), timeout=10_000)
    assert not window.elsewhere.isVisible() and not window.download_button.isEnabled()
    assert window.files.topLevelItem(1).text(3).startswith("downloaded")
    assert hub.server.served[file_key(REPO, "Tiny-MoE-Q8_0.gguf")] == served
    assert other.final.read_bytes() == hub.tiny.read_bytes()


def test_a_download_elsewhere_that_stops_gives_download_back(
        qtbot: Any, hub: Hub, main_window: Any) -> None:
    """The other MoEScope's download killed half way: its lock dies with it, and Download
    comes back here by itself (the partial file is resumed from where it stopped)."""
    with held_pull(hub) as other:
        window = _get_models(main_window)
        _search(qtbot, window, "tiny")
        _choose(qtbot, window, REPO)
        window.files.setCurrentItem(window.files.topLevelItem(1))  # Tiny-MoE-Q8_0.gguf
        assert not window.download_button.isEnabled() and window.elsewhere.isVisible()
        other.process.kill()
        other.process.wait(CHILD_TIMEOUT_S)
        qtbot.waitUntil(lambda: window.download_button.isEnabled(), timeout=10_000)
        assert not window.elsewhere.isVisible() and window.download_button.toolTip() == ""
    qtbot.mouseClick(window.download_button, qtbot_left())
    qtbot.waitUntil(lambda: window.open_button.isEnabled(), timeout=20_000)
    assert other.final.read_bytes() == hub.tiny.read_bytes()


def test_an_hf_endpoint_that_is_no_address_is_one_line_not_a_traceback(
        qtbot: Any, hub: Hub, main_window: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """huggingface_hub's own import raises on an HF_ENDPOINT its URL parser refuses."""
    monkeypatch.setenv("HF_ENDPOINT", "http://[::1")
    action = next(a for a in main_window.actions() if a.text() == "&Get models…")
    action.trigger()
    assert getattr(main_window, "get_models_window", None) is None
    title, message = main_window.notices[-1]
    assert title == "Cannot use the Hugging Face Hub"
    assert "HF_ENDPOINT" in message and "\n" not in message
