"""A message longer than the context is measured before it is sent (new-user review,
window rev 5): it was saved into the chat, named it, and was then refused by a modal
"Generation failed" box advising a larger context, on the demo model whose 512 tokens are
its largest. Real window, real engine, Qt offscreen."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import load, send

LONG = "To be or not to be, that is the question. " * 120


@pytest.fixture
def window(make_window: Any, qtbot: Any, demo: Path) -> Any:
    w = make_window()
    load(qtbot, w, demo, budget="25%", policy="quality-first", n_ctx=512)
    return w


def _saved(window: Any) -> list[Any]:
    chat = window.chat
    return window.store.messages(chat.chat_id) if chat.chat_id is not None else []


def test_a_message_longer_than_the_context_stays_in_the_box(
        window: Any, dialogs: Any, qtbot: Any) -> None:
    """Typed and sent with Enter: nothing is saved (no message, no title), no box opens,
    the text stays in the box, and a line under it says how long it is against the room,
    without advising a larger context the demo model does not have."""
    view = window.chat_view
    window.new_chat()
    before = window.store.chat(window.chat.chat_id).title
    view.input.setPlainText(LONG)
    view._submit()
    qtbot.wait(50)
    assert not window.chat.generating
    assert dialogs.shown == []
    assert _saved(window) == []
    assert window.store.chat(window.chat.chat_id).title == before
    assert view.input.toPlainText() == LONG
    note = view.input_note
    assert note.isVisibleTo(window) and note.text().startswith("⚠ Not sent: this message is ")
    assert "tokens long, and at most " in note.text()
    assert "in the context of 512 tokens" in note.text()
    assert "512 tokens is the largest context this model takes" in note.text()
    assert "larger context" not in note.text()
    # the numbers are the engine's: the message alone over the room
    fit = window.chat.check_length(LONG.strip())  # what the box sends
    assert fit is not None and fit.message_tokens > fit.room > 0
    assert f"{fit.message_tokens:,} tokens long" in note.text()
    # editing the message takes the line away; a short one is then sent
    view.input.setPlainText("Hello")
    assert not note.isVisibleTo(window)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=60_000):
        view._submit()
    assert [m.role for m in _saved(window)] == ["user", "assistant"]


def test_the_history_is_left_out_as_the_engine_fits_it(window: Any, qtbot: Any) -> None:
    """Earlier turns are left out by the engine's rolling window: a message that fits
    alone is sent after a history that, with it, would overflow the context."""
    part = "Tell me about the weather in the mountains today. " * 25  # ~ a third of 512
    for _ in range(3):
        send(qtbot, window, part, max_tokens=8, timeout=60_000)
    assert window.chat.check_length(part) is None
    assert not window.chat_view.input_note.isVisibleTo(window)
    assert len(_saved(window)) == 6


def test_a_larger_context_is_offered_where_the_model_has_one(
        make_window: Any, qtbot: Any, dialogs: Any,
        synth_model: Callable[..., Path]) -> None:
    """A model trained on 2048 tokens loaded with 256: the line offers a larger context,
    up to the model's 2,048."""
    w = make_window()
    load(qtbot, w, synth_model("qwen3moe", expert_type="q8_0", ctx=2048), n_ctx=256)
    w.new_chat()
    w.chat_view.input.setPlainText(LONG)
    assert not w.chat.send(LONG)
    text = w.chat_view.input_note.text()
    assert "in the context of 256 tokens" in text
    assert "reload the model with a larger context (up to 2,048: File ▸ Open model…)" in text
    assert _saved(w) == [] and dialogs.shown == []


def test_a_suggested_prompt_too_long_goes_to_the_box(window: Any, qtbot: Any) -> None:
    """Sent by a click (a suggested prompt, or anything that sends text directly), a
    message too long lands in the empty box with the line under it, so it can be cut."""
    window.new_chat()
    window.chat._prompt_chosen(LONG)
    assert window.chat_view.input.toPlainText() == LONG.strip()
    assert window.chat_view.input_note.isVisibleTo(window)
    assert _saved(window) == []


def test_an_edit_too_long_keeps_the_message_it_would_replace(window: Any, qtbot: Any) -> None:
    """Resending an edited message replaces it and what follows: one too long is refused
    before anything is deleted, and the edit goes on (Resend, the text in the box)."""
    send(qtbot, window, "Hello there", max_tokens=8, timeout=60_000)
    before = [(m.role, m.content) for m in _saved(window)]
    assert window.chat.edit_last()
    view = window.chat_view
    view.input.setPlainText(LONG)
    view._submit()
    assert [(m.role, m.content) for m in _saved(window)] == before
    assert view.editing_position is not None and view.input.toPlainText() == LONG
    assert view.input_note.isVisibleTo(window)
