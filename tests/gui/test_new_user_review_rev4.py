"""A new user's session with the desktop window (session 15, helper "rev4"): what they met
on the demo model at 1366x768 and 1024x700, each as it was found. Real window, real
engine, Qt offscreen."""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import load, send
from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from moescope.util import paths


def test_a_message_typed_but_not_sent_is_back_after_a_restart(
        make_window: Callable[..., Any]) -> None:
    """Ctrl+Q with a half-written message in the box threw it away without a word."""
    first = make_window()
    first.chat_view.input.setPlainText("a question I had not sent yet\nwith a second line")
    first.close()
    again = make_window()  # a restart on the same data folder
    assert again.chat_view.input.toPlainText() == (
        "a question I had not sent yet\nwith a second line")
    assert again.chat_view.input.textCursor().atEnd()  # typing goes on where it stopped
    again.chat_view.input.clear()  # sent or deleted: nothing comes back the next time
    again.close()
    assert make_window().chat_view.input.toPlainText() == ""


@pytest.mark.parametrize("long", [False, True], ids=["short", "long"])
def test_preferences_show_the_default_folders_whole(
        make_window: Callable[..., Any], qtbot: Any, monkeypatch: Any,
        tmp_path: Path, long: bool) -> None:
    """The folder boxes showed "default: /home/…/Mo" of the folder that an empty box
    means: where downloads land and traces are kept, the one thing a newcomer opens
    Preferences to find. A path too long for half the screen is named in the tooltip."""
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        # ~/.local/share/MoEScope's length, or pytest's far longer folder
        data = (tmp_path if long else Path(short)) / "profile"
        monkeypatch.setenv(paths.ENV_DATA_DIR, str(data))
        window = make_window()
        dialog = window.show_preferences()
        qtbot.waitExposed(dialog)
        for edit, folder in ((dialog.models_dir, data / "models"), (dialog.data_dir, data)):
            text = edit.placeholderText()
            assert text == f"default: {folder}"
            metrics = edit.fontMetrics()
            fits = metrics.horizontalAdvance(text) <= edit.width() - 2 * metrics.height()
            assert fits or (long and str(folder) in edit.toolTip()), (text, edit.width())
        dialog.reject()
        window.close()


def test_the_chats_small_print_and_title_follow_the_font_size(
        make_window: Callable[..., Any], qtbot: Any, tiny_moe: Path) -> None:
    """Preferences ▸ Font size 14 pt: the chat's text grew, but not each answer's stats
    line and the messages' Copy · Edit · Branch links (8.5 pt), nor the chat's title
    (11 pt, now smaller than the text under it): the answer's numbers stayed at their
    smallest."""
    window = make_window()
    load(qtbot, window, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    send(qtbot, window, "hi", max_tokens=4)

    def sizes() -> dict[str, float]:
        QApplication.processEvents()
        title = window.chat_view.title
        title.ensurePolished()
        document = window.chat_view.transcript.document()
        stats = document.lastBlock()  # the answer's stats line
        assert stats.text().startswith("this answer:"), stats.text()
        header = document.firstBlock()  # "You    Copy · Edit · Branch"
        links = [f.charFormat().fontPointSize() for f in _fragments(header)
                 if f.charFormat().isAnchor()]
        assert len(links) == 3, header.text()
        return {"title": title.font().pointSizeF(), "links": max(links),
                "answer line": stats.begin().fragment().charFormat().fontPointSize()}

    body = QApplication.font().pointSizeF()
    before = sizes()
    assert before["answer line"] < body < before["title"]
    try:
        window.apply_preferences(dataclasses.replace(window.preferences, font_pt=14))
        assert QApplication.font().pointSizeF() == 14
        after = sizes()
        for name in ("answer line", "links"):
            assert 12 <= after[name] < 14, (name, after)
        assert after["title"] > 14, after
    finally:
        window.apply_preferences(dataclasses.replace(window.preferences, font_pt=0))
    assert sizes() == before


def _fragments(block: Any) -> list[Any]:
    found = []
    it = block.begin()
    while not it.atEnd():
        found.append(it.fragment())
        it += 1
    return found


@pytest.mark.parametrize("pt", [0, 12])
def test_open_model_shows_every_fit_line_whole_at_a_larger_font(
        make_window: Callable[..., Any], qtbot: Any, demo: Path, pt: float) -> None:
    """File ▸ Open model… at 12 pt on a 1024x700 screen: the fit's wrapped lines
    ("Expert slots", "Experts in RAM", "Experts on disk", "GPU") showed their first line
    and the top half of the second. The dialog took the height its lines need at its
    narrowest width, then was cut to fit the screen, and wider it needed less."""
    from moescope.gui.dialogs.open_model import OpenModelDialog

    window = make_window()
    window.apply_preferences(dataclasses.replace(window.preferences, font_pt=pt))
    cut: list[str] = []
    seen: list[int] = []

    def in_the_dialog() -> None:
        dialog = QApplication.activeModalWidget()
        assert isinstance(dialog, OpenModelDialog)
        QApplication.processEvents()
        form = dialog.estimate_form
        for i in range(form.rowCount()):
            value = form.itemAt(i, form.ItemRole.FieldRole).widget()
            seen.append(i)
            if value.height() < value.heightForWidth(value.width()):
                cut.append(value.text())
        screen = dialog.screen().availableGeometry()
        assert dialog.frameGeometry().height() <= screen.height()
        dialog.reject()

    try:
        QTimer.singleShot(0, in_the_dialog)
        window.prepare_open(demo)
    finally:
        window.apply_preferences(dataclasses.replace(window.preferences, font_pt=0))
    assert seen and cut == []


def test_leaving_a_chat_mid_edit_gives_the_draft_back(make_window: Callable[..., Any],
                                                      qtbot: Any, tiny_moe: Path) -> None:
    """A draft in the box, Edit last, then a click on another chat: the box kept the old
    message's text under a plain Send (the next Enter sent it into the other chat as a
    new message) and the draft was gone. Leaving the chat cancels the edit, as Esc does."""
    window = make_window()
    load(qtbot, window, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    first = window.chat.new_chat()
    send(qtbot, window, "To be", max_tokens=4)
    second = window.chat.new_chat()
    window.chat.select_chat(first)
    view = window.chat_view
    view.input.setPlainText("a draft")
    assert window.chat.edit_last()
    assert view.input.toPlainText() == "To be"
    window.chat.select_chat(second)
    assert view.editing_position is None and view.send_button.text() == "&Send"
    assert view.input.toPlainText() == "a draft"
    window.chat.select_chat(first)  # and the message itself is as it was
    assert window.store.messages(first)[0].content == "To be"


def test_folded_cache_controls_stay_folded_after_a_restart(
        make_window: Callable[..., Any], qtbot: Any) -> None:
    """On a small screen the README has the cache controls folded away (drag their
    splitter): the window remembered the chat list's splitter but not that one, so the
    controls were back at every start."""
    first = make_window()
    first.resize(1000, 650)
    qtbot.waitUntil(lambda: first.right_split.sizes()[0] > 0, timeout=5_000)
    total = sum(first.right_split.sizes())
    first.right_split.setSizes([0, total])
    assert first.right_split.sizes()[0] == 0
    first.close()
    again = make_window()
    qtbot.waitUntil(lambda: sum(again.right_split.sizes()) > 0, timeout=5_000)
    assert again.right_split.sizes()[0] == 0


def test_about_shows_its_whole_table_at_a_larger_font(make_window: Callable[..., Any],
                                                      qtbot: Any) -> None:
    """Help ▸ About at 12 pt on a 1024x700 screen (14 pt on the offscreen 800x800 one):
    the versions table's wrapped rows (the engine's backend line) made it taller than the
    dialog Qt opened, two thirds of the screen, and its last row ("Python 3.11") was cut
    in half."""
    from moescope.gui.dialogs.about import AboutDialog

    window = make_window()
    window.apply_preferences(dataclasses.replace(window.preferences, font_pt=14))
    try:
        dialog = AboutDialog(window)
        dialog.show()
        qtbot.waitExposed(dialog)
        QApplication.processEvents()
        table = dialog.table
        assert table.height() >= table.heightForWidth(table.width())
        screen = dialog.screen().availableGeometry()
        assert dialog.frameGeometry().height() <= screen.height()
        dialog.close()
    finally:
        window.apply_preferences(dataclasses.replace(window.preferences, font_pt=0))


def test_the_window_opens_with_the_keyboard_in_the_message_box(
        make_window: Callable[..., Any], qtbot: Any) -> None:
    """The window opened with the keyboard in *Search chats*, the first box in the focus
    chain: a newcomer's first words went into the search, and the chat list emptied as
    they typed. It opens in the message box, where the placeholder says Enter sends."""
    window = make_window()
    window.activateWindow()
    qtbot.waitUntil(lambda: QApplication.activeWindow() is window, timeout=5_000)
    assert window.focusWidget() is window.chat_view.input, window.focusWidget()
    assert window.chat_view.input.hasFocus(), QApplication.focusWidget()


@pytest.mark.parametrize(("title", "name"), [
    ("Speak like a character from Shakespeare.", "Speak like a character from Shakespeare"),
    ("A title running longer than forty chars. And on", "A title running longer than forty chars"),
    ("Forty characters up to here, then a dot. More", "Forty characters up to here, then a dot"),
    ("Recite some Shakespeare.", "Recite some Shakespeare"),
    ("What is 1/2?", "What is 1_2?"),
    ("...", "chat"),
])
def test_an_exported_chat_is_offered_a_clean_file_name(
        make_window: Callable[..., Any], monkeypatch: Any, title: str, name: str) -> None:
    """File ▸ Export chat as JSON… on the chat "Recite some Shakespeare." offered
    "Recite some Shakespeare..json": the title's last full stop before the suffix's own
    (and a title cut at 40 characters kept the blank or dot it was cut at)."""
    from PySide6.QtWidgets import QFileDialog

    window = make_window()
    chat_id = window.chat.new_chat()
    window.store.rename_chat(chat_id, title)
    offered: list[str] = []

    def dialog(_parent: Any, _title: str, start: str, *_a: Any) -> tuple[str, str]:
        offered.append(Path(start).name)
        return "", ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(dialog))
    window.export_chat_dialog("json")
    window.export_chat_dialog("md")
    assert offered == [f"{name}.json", f"{name}.md"]


def test_chat_export_starts_at_home_then_where_the_last_one_went(
        make_window: Callable[..., Any], monkeypatch: Any, tmp_path: Path) -> None:
    """File ▸ Export chat… offered its file in the folder MoEScope was started from
    (after `make run`, the source checkout) and Import chat… opened there too; trace
    exports start in the home folder, then where the last one went. Chats now do the
    same (a folder of their own, remembered across restarts)."""
    from PySide6.QtWidgets import QFileDialog

    window = make_window()
    window.chat.new_chat()
    window.store.rename_chat(window.chat.chat_id, "notes")
    starts: list[Path] = []
    target = tmp_path / "exports"
    target.mkdir()

    def save(_parent: Any, _title: str, start: str, *_a: Any) -> tuple[str, str]:
        starts.append(Path(start))
        return str(target / "mine.json"), ""

    def open_(_parent: Any, _title: str, start: str, *_a: Any) -> tuple[str, str]:
        starts.append(Path(start))
        return "", ""

    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(save))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(open_))
    window.export_chat_dialog("json")
    assert starts[-1] == Path.home() / "notes.json"
    assert (target / "mine.json").is_file()
    window.export_chat_dialog("md")
    assert starts[-1] == target / "notes.md"
    window.import_chat_dialog()
    assert starts[-1] == target
    window.close()
    again = make_window()
    again.import_chat_dialog()
    assert starts[-1] == target


def test_a_suggested_prompt_leaves_the_message_being_typed(
        make_window: Callable[..., Any], qtbot: Any, demo: Path) -> None:
    """Half a question typed in the demo's empty chat, then a click on one of its
    suggested prompts: the prompt was sent, and the box was emptied of the question,
    which was never sent. The box is the user's: only what was sent from it leaves it."""
    from PySide6.QtCore import QUrl

    from moescope.gui.chat.welcome import DEMO_PROMPTS, prompt_href

    window = make_window()
    load(qtbot, window, demo, budget="25%", policy="quality-first", n_ctx=512)
    window.chat_settings.max_tokens.setValue(4)
    view = window.chat_view
    view.input.setPlainText("my own question, half")
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000):
        assert view.open_link(QUrl(prompt_href(0)))
    assert window.store.messages(window.chat.chat_id)[0].content == DEMO_PROMPTS[0]
    assert view.input.toPlainText() == "my own question, half"
    send(qtbot, window, view.input.toPlainText(), max_tokens=4)  # the box, sent: emptied
    assert view.input.toPlainText() == ""
