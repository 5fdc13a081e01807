"""A new user's session with the desktop window (session 15, helper "rev4"): what they met
on the demo model at 1366x768 and 1024x700, each as it was found. Real window, real
engine, Qt offscreen."""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

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
