"""A new user's session with the desktop window (session 15, helper "rev4"): what they met
on the demo model at 1366x768 and 1024x700, each as it was found. Real window, real
engine, Qt offscreen."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


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
