"""Issue 19, what users of LM Studio, GPT4All and Jan look for: Preferences, a light theme
that follows the system's, per-message Copy, Edit and Branch, and chat import. The real
window over the real engine on the shipped demo model; links and buttons are clicked."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import click_link, load, send
from PySide6.QtCore import QSettings, Qt
from PySide6.QtGui import QColor, QGuiApplication, QStyleHints
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from moescope.gui import theme
from moescope.gui.chat.message_actions import action_href
from moescope.gui.preferences import PreferencesDialog, read_preferences
from moescope.session import chat_import
from moescope.util import paths


@pytest.fixture(autouse=True)
def dark_again() -> Iterator[None]:
    """The theme is the application's: the next test starts from the default again."""
    yield
    app = QApplication.instance()
    if isinstance(app, QApplication):
        theme.apply_theme(app, "system", 0)
    paths.choose_folder("models", None)
    paths.choose_folder("data", None)


@pytest.fixture
def demo_window(make_window: Any, qtbot: Any, demo: Path) -> Any:
    w = make_window()
    load(qtbot, w, demo, budget="25%", policy="quality-first", n_ctx=512)
    return w


def _action(window: Any, text: str) -> Any:
    found = [a for a in window.actions() if a.text() == text]
    assert len(found) == 1, text
    return found[0]


def _user_block_colour(view: Any, text: str) -> QColor:
    doc = view.transcript.document()
    block = doc.find(text).block()
    return block.blockFormat().background().color()


# ---------------------------------------------------------------------- Preferences
def test_preferences_apply_live_and_at_the_next_load(demo_window: Any, qtbot: Any,
                                                     demo: Path, make_window: Any,
                                                     tmp_path: Path) -> None:
    w = demo_window
    send(qtbot, w, "To be", max_tokens=4)
    with qtbot.waitSignal(w.changesApplied, timeout=10_000):
        w.controls.select_policy("speed-first")  # a change marker on the plots
    send(qtbot, w, " or not", max_tokens=3)
    qtbot.waitUntil(lambda: bool(w.cache_panel.time_plots._marker_items), timeout=10_000)
    assert theme.SCHEME == "dark"
    _action(w, "&Preferences…").trigger()
    dialog = w.findChild(PreferencesDialog)
    assert dialog is not None and dialog.isVisible()
    assert _action(w, "&Preferences…").shortcut().toString() == "Ctrl+,"
    # a folder that is not one is refused in one line, and nothing is applied
    dialog.models_dir.setText(str(tmp_path / "missing"))
    dialog.theme.setCurrentIndex(dialog.theme.findData("light"))
    dialog.apply_button.click()
    assert dialog.error.isVisible() and "is not an existing folder" in dialog.error.text()
    assert "\n" not in dialog.error.text() and theme.SCHEME == "dark"
    models = tmp_path / "my models"
    data = tmp_path / "my data"
    models.mkdir()
    data.mkdir()
    dialog.models_dir.setText(str(models))
    dialog.data_dir.setText(str(data))
    wanted = 2 if w.client.worker.engine.model.n_threads == 1 else 1  # not the default
    dialog.threads.setValue(wanted)
    dialog.gpu_layers.setValue(0)
    dialog.font_pt.setValue(13)
    dialog.record.setChecked(False)
    dialog.buttons.button(QDialogButtonBox.StandardButton.Ok).click()
    assert not dialog.isVisible()
    app = QApplication.instance()
    # live: theme (palette, plots, chat), font, recording, folders
    assert theme.SCHEME == "light"
    assert app.palette().window().color() == QColor(theme.SCHEMES["light"]["PANEL"])
    plots = w.cache_panel.time_plots.graphics
    assert plots.backgroundBrush().color() == QColor(theme.SCHEMES["light"]["BACKGROUND"])
    lines = [line for _, ls in w.cache_panel.time_plots._marker_items for line in ls]
    assert lines and all(line.pen.color() == QColor(theme.SCHEMES["light"]["MARKER"])
                         for line in lines)  # not the dark scheme's pale yellow
    assert _user_block_colour(w.chat_view, "To be") == QColor(
        theme.SCHEMES["light"]["USER_BACKGROUND"])
    assert app.font().pointSizeF() == 13
    assert w.chat_view.transcript.font().pointSizeF() == 13
    assert not w.recording and not w.recording_now
    assert not _action(w, "Recor&d session traces").isChecked()
    assert paths.models_dir() == models
    assert paths.traces_dir() == data / "traces"
    # threads and GPU layers: from the next load, which the engine really gets
    assert w.client.worker.engine.model.n_threads != wanted
    load(qtbot, w, demo)
    assert w.client.worker.engine.model.n_threads == wanted
    assert w.client.worker.engine.model.n_gpu_layers == 0
    assert w.trace_path is None, "recording off: the new session is not recorded"
    # stored: a new window (next start) reads them back
    w.close()
    stored = read_preferences(make_window().settings)
    assert (stored.theme, stored.font_pt, stored.threads, stored.gpu_layers) == \
        ("light", 13, wanted, 0)
    assert (stored.models_dir, stored.data_dir, stored.record_traces) == \
        (str(models), str(data), False)


def test_preferences_say_which_folders_apply(make_window: Any, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty folder field read "default" whatever was used; with MOESCOPE_MODELS_DIR
    set, a models folder chosen there did nothing (the environment wins) unsaid."""
    from moescope.util import paths

    w = make_window()
    dialog = w.show_preferences()
    assert dialog.models_dir.isEnabled()
    assert dialog.models_dir.placeholderText() == f"default: {paths.data_dir() / 'models'}"
    assert dialog.data_dir.placeholderText() == f"default: {paths.data_dir()}"
    dialog.close()
    forced = tmp_path / "my models"
    monkeypatch.setenv(paths.ENV_MODELS_DIR, str(forced))
    dialog = w.show_preferences()
    assert not dialog.models_dir.isEnabled()
    assert str(forced) in dialog.models_dir.placeholderText()
    assert paths.ENV_MODELS_DIR in dialog.models_dir.toolTip()
    dialog.close()


def test_preferences_read_back_bounded(make_window: Any) -> None:
    w = make_window()
    s = w.settings
    for key, value in (("threads", "100000"), ("gpu_layers", "-7"), ("theme", "neon"),
                       ("font_pt", "2"), ("models_dir", "x" * 10_000)):
        s.setValue(f"preferences/{key}", value)
    prefs = read_preferences(s)
    assert (prefs.threads, prefs.gpu_layers, prefs.theme, prefs.font_pt) == \
        (0, -1, "system", 7)
    assert len(prefs.models_dir) == 4096


# ---------------------------------------------------------------------- light theme
def test_light_theme_follows_the_systems_colour_scheme(
        make_window: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    w = make_window()
    app = QApplication.instance()
    assert read_preferences(w.settings).theme == "system" and theme.SCHEME == "dark"
    # the desktop switches to light (offscreen Qt has no desktop to ask: it says so here)
    monkeypatch.setattr(QStyleHints, "colorScheme", lambda _self: Qt.ColorScheme.Light)
    app.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Light)
    assert theme.SCHEME == "light"
    light = theme.SCHEMES["light"]
    assert app.palette().base().color() == QColor(light["BACKGROUND"])
    assert app.palette().text().color() == QColor(light["TEXT"])
    heat = w.cache_panel.heatmap.graphics
    assert heat.backgroundBrush().color() == QColor(light["BACKGROUND"])
    axis = w.cache_panel.time_plots.plots["mass"].getAxis("left")
    assert axis.textPen().color() == QColor(light["TEXT"])
    sheet = app.styleSheet()
    assert light["TEXT"] in sheet and not re.search(r"@[A-Z_]+@;", sheet), "all filled in"
    # text reads on its ground in both schemes (WCAG AA)
    for scheme in theme.SCHEMES.values():
        for fg, bg in (("TEXT", "BACKGROUND"), ("TEXT", "PANEL"), ("MUTED", "PANEL"),
                       ("TEXT", "USER_BACKGROUND"), ("ACCENT", "BACKGROUND")):
            assert _contrast(scheme[fg], scheme[bg]) >= 4.5, (fg, bg, scheme[fg])
    # back to dark when the desktop is
    monkeypatch.setattr(QStyleHints, "colorScheme", lambda _self: Qt.ColorScheme.Dark)
    app.styleHints().colorSchemeChanged.emit(Qt.ColorScheme.Dark)
    assert theme.SCHEME == "dark"
    assert heat.backgroundBrush().color() == QColor(theme.SCHEMES["dark"]["BACKGROUND"])


def test_a_window_started_in_the_light_theme_draws_its_plots_light(
        qtbot: Any, data_dir: Path) -> None:
    """Light chosen in Preferences: the window applied it while not yet shown, and the
    recolouring skipped windows not shown, so the heatmap and plots stayed dark (made in
    the dark default) on a light window until the theme was switched again."""
    from moescope.gui.app import create_app
    from moescope.gui.main_window import MainWindow

    app = create_app([])
    assert theme.SCHEME == "dark"
    settings = QSettings(str(paths.settings_path()), QSettings.Format.IniFormat)
    settings.setValue("preferences/theme", "light")
    settings.sync()
    w = MainWindow()
    qtbot.addWidget(w)
    try:
        w.show()
        light = theme.SCHEMES["light"]
        assert theme.SCHEME == "light"
        assert app.palette().base().color() == QColor(light["BACKGROUND"])
        for view in (w.cache_panel.heatmap.graphics, w.cache_panel.time_plots.graphics):
            assert view.backgroundBrush().color() == QColor(light["BACKGROUND"])
        axis = w.cache_panel.time_plots.plots["mass"].getAxis("left")
        assert axis.textPen().color() == QColor(light["TEXT"])
    finally:
        w.close()


def _contrast(a: str, b: str) -> float:
    def lum(c: str) -> float:
        rgb = [QColor(c).redF(), QColor(c).greenF(), QColor(c).blueF()]
        lin = [x / 12.92 if x <= 0.03928 else ((x + 0.055) / 1.055) ** 2.4 for x in rgb]
        return 0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2]
    hi, lo = sorted((lum(a), lum(b)), reverse=True)
    return (hi + 0.05) / (lo + 0.05)


# ---------------------------------------------------------------------- copy, edit, branch
def test_copy_links_copy_each_messages_source(demo_window: Any, qtbot: Any) -> None:
    w = demo_window
    send(qtbot, w, "Write *to be* in Python", max_tokens=12)
    send(qtbot, w, "And again", max_tokens=6)
    messages = w.store.messages(w.chat.chat_id)
    assert [m.role for m in messages] == ["user", "assistant", "user", "assistant"]
    clipboard = QGuiApplication.clipboard()
    for index, m in enumerate(messages):
        clipboard.clear()
        click_link(qtbot, w.chat_view, action_href("copy", index))
        assert clipboard.text() == m.content, index  # the source, not the rendering
    text = w.chat_view.text()
    assert text.count("Copy") >= 4 and text.count("Branch") == 4 and text.count("Edit") == 2


def test_edit_any_user_message_reruns_from_there(demo_window: Any, qtbot: Any) -> None:
    w = demo_window
    send(qtbot, w, "First question", max_tokens=6)
    send(qtbot, w, "Second question", max_tokens=6)
    chat = w.chat.chat_id
    click_link(qtbot, w.chat_view, action_href("edit", 0))
    assert w.chat_view.input.toPlainText() == "First question"
    assert w.chat_view.send_button.text() == "Re&send"
    w.chat_view.input.setPlainText("First question, edited")
    w.chat_settings.max_tokens.setValue(6)
    with qtbot.waitSignal(w.chat.answerFinished, timeout=30_000) as blocker:
        w.chat_view.send_button.click()
    messages = w.store.messages(chat)
    assert [(m.role, m.content) for m in messages[:1]] == [("user",
                                                            "First question, edited")]
    assert len(messages) == 2 and messages[1].role == "assistant"
    assert "Second question" not in w.chat_view.text()
    # the engine answered the edited conversation alone
    assert w.chat._request is not None
    assert [m["content"] for m in w.chat._request.messages] == ["First question, edited"]
    assert messages[1].stats["n_tokens"] == blocker.args[0].n_tokens
    assert w.chat_view.send_button.text() == "&Send"


def test_branch_from_any_message_makes_a_new_chat(demo_window: Any, qtbot: Any) -> None:
    w = demo_window
    send(qtbot, w, "Once upon", max_tokens=6)
    send(qtbot, w, "Then", max_tokens=6)
    original = w.chat.chat_id
    before = w.store.messages(original)
    click_link(qtbot, w.chat_view, action_href("branch", 1))  # the first answer
    branch = w.chat.chat_id
    assert branch != original
    title = w.store.chat(branch).title
    assert title == f"{w.store.chat(original).title} (branch)"
    kept = w.store.messages(branch)
    assert [(m.role, m.content, m.stats) for m in kept] == \
        [(m.role, m.content, m.stats) for m in before[:2]]
    assert w.chat_list.list.currentItem().text().startswith(title[:20])
    # a narrow list cuts titles in the middle: "(branch)" still shows
    lst = w.chat_list.list
    long_title = f"Speak like a character from a novel about {'x' * 40} (branch)"
    shown = lst.fontMetrics().elidedText(long_title, lst.textElideMode(), 200)
    assert shown.endswith("(branch)") and len(shown) < len(long_title)
    send(qtbot, w, "Another way", max_tokens=6)
    assert len(w.store.messages(branch)) == 4
    assert w.chat._request is not None
    assert [m["content"] for m in w.chat._request.messages][:1] == ["Once upon"]
    assert [m.content for m in w.store.messages(original)] == [m.content for m in before]


# ---------------------------------------------------------------------- import
def test_an_exported_chat_imports_as_a_new_chat(demo_window: Any, qtbot: Any,
                                                 tmp_path: Path) -> None:
    w = demo_window
    send(qtbot, w, "To be", max_tokens=6)
    original = w.chat.chat_id
    exported = w.export_chat(tmp_path / "chat.json", "json")
    assert exported is not None
    assert _action(w, "&Import chat…") is not None
    new = w.import_chat(exported)
    assert new is not None and new != original and w.chat.chat_id == new
    a, b = w.store.messages(original), w.store.messages(new)
    assert [(m.role, m.content, m.status, m.stats) for m in a] == \
        [(m.role, m.content, m.status, m.stats) for m in b]
    # listed beside the original, the copy is told apart (the same title read as one)
    title = w.store.chat(original).title
    assert w.store.chat(new).title == f"{title} (imported)"
    again = w.import_chat(exported)
    assert again is not None and w.store.chat(again).title == f"{title} (imported 2)"
    w.chat.select_chat(new)
    from moescope.display.answer_line import answer_line

    assert answer_line(b[1].stats, b[1].status) in w.chat_view.text()
    send(qtbot, w, "Go on", max_tokens=4)  # the imported chat goes on like any other
    assert len(w.store.messages(new)) == 4


BAD_FILES: dict[str, tuple[bytes, str]] = {
    "text.json": (b"hello", "not valid JSON"),
    "list.json": (b"[]", "top level is not a JSON object"),
    "nomsgs.json": (b'{"title": "x"}', "no \"messages\" list"),
    "role.json": (b'{"messages": [{"role": "tool", "content": "x"}]}', "role \"tool\""),
    "content.json": (b'{"messages": [{"role": "user", "content": 5}]}', "is not a string"),
    "deep.json": (b'{"messages": ' + b"[" * 200_000 + b"]" * 200_000 + b"}", "not a chat"),
    "surrogate.json": (b'{"messages": [{"role": "user", "content": "\\ud800"}]}',
                       "lone surrogate"),
    "nan.json": (b'{"messages": [], "title": NaN}', "NaN is not standard JSON"),
    "latin1.json": (b'{"title": "caf\xe9", "messages": []}', "not UTF-8"),
    "status.json": (b'{"messages": [{"role": "user", "content": "x", "status": "ok"}]}',
                    "status \"ok\""),
}


def test_bad_chat_files_are_refused_in_one_line_and_store_nothing(
        make_window: Any, dialogs: Any, tmp_path: Path) -> None:
    w = make_window()
    chats = len(w.store.chats())
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(chat_import.MAX_IMPORT_BYTES + 1)
    cases = {big: "larger than 32 MiB", tmp_path: "not a regular file"}
    many = tmp_path / "many.json"
    many.write_text(json.dumps({"messages": [{"role": "user", "content": "x"}]
                                * (chat_import.MAX_MESSAGES + 1)}))
    cases[many] = "more than the 20000"
    for name, (data, why) in BAD_FILES.items():
        (tmp_path / name).write_bytes(data)
        cases[tmp_path / name] = why
    for path, why in cases.items():
        dialogs.shown.clear()
        assert w.import_chat(path) is None, path
        assert len(dialogs.shown) == 1, path
        kind, title, text = dialogs.shown[0]
        assert kind == "critical" and title == "Cannot import this chat"
        assert why in text, (path.name, text)
        assert "\n" not in text and "Traceback" not in text and len(text) < 300, text
    assert len(w.store.chats()) == chats


def test_odd_stats_are_dropped_and_the_answer_still_shows(make_window: Any,
                                                          tmp_path: Path) -> None:
    w = make_window()
    doc = {"title": "  odd\nstats ", "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "**hello**", "status": "generating",
         "stats": {"n_tokens": 3, "policies": 7, "hit_rate": 1e300, "nested": {"a": 1},
                   "tokens_per_second": 12.5, "summary": "x" * 5000}}]}
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(doc))
    new = w.import_chat(path)
    assert new is not None
    answer = w.store.messages(new)[1]
    assert answer.status == "interrupted"  # exported while it was written
    assert answer.stats == {"n_tokens": 3, "tokens_per_second": 12.5}
    assert w.store.chat(new).title == "odd stats"
    text = w.chat_view.text()
    assert "hello" in text and "this answer: 3 tokens under –" in text


def test_layer_labels_thin_out_in_a_short_heatmap(demo_window: Any, qtbot: Any) -> None:
    """On a 1024x700 screen the heatmap's rows were ~40 px: six layer labels were drawn
    over each other. A short view labels fewer layers, a tall one every layer."""
    heatmap = demo_window.cache_panel.heatmap
    n_layers = len(demo_window.model.moe_layers)
    assert n_layers == 6
    heatmap.graphics.setFixedHeight(400)
    qtbot.waitUntil(lambda: heatmap.plot.vb.height() > 200, timeout=5_000)
    assert len(heatmap.layer_ticks()) == n_layers
    heatmap.graphics.setFixedHeight(80)
    qtbot.waitUntil(lambda: heatmap.plot.vb.height() < 60, timeout=5_000)
    labels = heatmap.layer_ticks()
    room = heatmap.plot.vb.height() / (heatmap.fontMetrics().height() + 2)
    assert 1 <= len(labels) <= max(1, int(room)) < n_layers
    assert labels[0] == str(demo_window.model.moe_layers[0])


def test_a_chosen_folder_gone_since_is_a_notice_and_the_default_for_the_session(
        make_window: Any, data_dir: Path, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Folders chosen in Preferences on a disk not plugged in today (here: under a file,
    so they cannot be made): the traces folder, made at start, ended every start in a
    traceback (and the engine thread's abort), with Preferences out of reach."""
    monkeypatch.delenv(paths.ENV_MODELS_DIR, raising=False)
    (tmp_path / "unplugged").write_text("")
    gone = tmp_path / "unplugged" / "disk"
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "settings.ini").write_text(
        f"[preferences]\nmodels_dir={gone / 'models'}\ndata_dir={gone / 'data'}\n")
    w = make_window()
    said = [message for title, message in w.notices if title == "Folder not available"]
    assert len(said) == 2, w.notices
    assert all(str(gone) in m and "this session uses the default" in m for m in said)
    assert paths.traces_dir() == data_dir / "traces"
    assert paths.models_dir() == data_dir / "models"
    stored = read_preferences(w.settings)  # kept for the day the disk is back
    assert (stored.models_dir, stored.data_dir) == (str(gone / "models"), str(gone / "data"))
