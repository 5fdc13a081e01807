"""Chatting: load, send, tokens stream, Stop within one token, Regenerate, edit-and-resend."""

from __future__ import annotations

from typing import Any

from gui_helpers import LONG_PROMPT, send, slow_down
from PySide6.QtCore import Qt

from moescope.display.answer_line import answer_line
from moescope.session.store import DONE, STOPPED


def test_load_shows_model_and_cache(window: Any) -> None:
    m = window.model
    assert m.cache_enabled and m.n_expert == 16 and m.slots_per_layer == 4
    assert "4/16 expert slots per layer" in window.model_label.text()
    assert window.controls.budget.value() == 4
    assert window.chat_view.send_button.isEnabled()


def test_send_streams_tokens_into_transcript_and_store(window: Any, qtbot: Any) -> None:
    slow_down(window, 3000)
    batches: list[int] = []
    partial: list[str] = []

    def on_tokens(snaps: list[Any]) -> None:
        batches.append(len(snaps))
        window.chat_view.flush()
        partial.append(window.chat_view.text())

    window.chat.tokensArrived.connect(on_tokens)
    summary = send(qtbot, window, LONG_PROMPT, max_tokens=30)
    assert summary.n_tokens == 30 and summary.stop_reason == "length"
    assert len(batches) > 3, "tokens arrive as a stream, not as one block"
    assert sum(batches) == 30
    lengths = [len(t) for t in partial]
    assert lengths == sorted(lengths) and lengths[0] < lengths[-1]
    messages = window.store.messages(window.chat.chat_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[1].status == DONE and messages[1].content
    assert messages[1].content in window.chat_view.text()


def test_enter_sends_and_shift_enter_inserts_newline(window: Any, qtbot: Any) -> None:
    box = window.chat_view.input
    box.setFocus()
    qtbot.keyClicks(box, "first line")
    qtbot.keyClick(box, Qt.Key.Key_Return, Qt.KeyboardModifier.ShiftModifier)
    qtbot.keyClicks(box, "second line")
    assert box.toPlainText() == "first line\nsecond line"
    window.chat_settings.max_tokens.setValue(5)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000):
        qtbot.keyClick(box, Qt.Key.Key_Return)
    messages = window.store.messages(window.chat.chat_id)
    assert messages[0].content == "first line\nsecond line"
    assert box.toPlainText() == ""


def test_stop_takes_effect_within_one_token(window: Any, qtbot: Any) -> None:
    slow_down(window, 4000)
    window.chat_settings.max_tokens.setValue(200)
    worker = window.client.worker

    def stop_after_three(_snaps: list[Any]) -> None:
        if window.chat.tokens_received >= 3 and worker.tokens_at_stop is None:
            qtbot.mouseClick(window.chat_view.stop_button, Qt.MouseButton.LeftButton)

    window.chat.tokensArrived.connect(stop_after_three)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000) as blocker:
        window.chat.send(LONG_PROMPT)
    summary = blocker.args[0]
    assert summary.stop_reason == "stopped"
    assert worker.tokens_at_stop is not None
    assert summary.n_tokens - worker.tokens_at_stop <= 1
    answer = window.store.messages(window.chat.chat_id)[-1]
    assert answer.status == STOPPED and "stopped" in window.chat_view.text()


def test_switching_chats_mid_answer_says_why_it_waits(window: Any, qtbot: Any) -> None:
    """New and another chat's row did nothing while an answer was written, without a
    word: the status bar now says why, and the answer stays in its chat."""
    send(qtbot, window, "an earlier chat", max_tokens=2)
    first = window.chat.chat_id
    window.chat.new_chat()
    writing = window.chat.chat_id
    assert writing != first
    slow_down(window, 4000)
    window.chat_settings.max_tokens.setValue(200)
    said: list[str] = []

    def click_away(_snaps: list[Any]) -> None:
        if window.chat.tokens_received >= 2 and not said:
            qtbot.mouseClick(window.chat_list.new_button, Qt.MouseButton.LeftButton)
            said.append(window.statusBar().currentMessage())
            window.chat.select_chat(first)
            said.append(window.statusBar().currentMessage())
            qtbot.mouseClick(window.chat_view.stop_button, Qt.MouseButton.LeftButton)

    window.chat.tokensArrived.connect(click_away)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000):
        window.chat.send(LONG_PROMPT)
    window.chat.tokensArrived.disconnect(click_away)
    assert len(said) == 2 and all("stop it (Esc)" in m for m in said)
    assert "stop it (Esc)" in window.statusBar().toolTip()  # whole on hover, if clipped
    assert window.chat.chat_id == writing
    assert window.store.messages(writing)[-1].role == "assistant"
    window.chat.select_chat(first)  # once it has ended, the switch happens
    assert window.chat.chat_id == first


def test_a_message_moves_its_chat_to_the_top_of_the_list(window: Any, qtbot: Any) -> None:
    """The list showed the chat just written in below older ones until something else
    refreshed it."""
    send(qtbot, window, "older chat", max_tokens=2)
    older = window.chat.chat_id
    window.chat.new_chat()
    send(qtbot, window, "newer chat", max_tokens=2)
    assert window.chat_list.list.item(0).data(Qt.ItemDataRole.UserRole) != older
    window.chat.select_chat(older)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000):
        window.chat.send("back to the older one")
        assert window.chat_list.list.item(0).data(Qt.ItemDataRole.UserRole) == older
    assert window.chat_list.current_id() == older


def test_regenerate_replaces_the_last_answer(window: Any, qtbot: Any) -> None:
    window.chat_settings.seed.setValue(-1)  # random: a new answer each time
    send(qtbot, window, "hello there", max_tokens=12)
    first = window.store.messages(window.chat.chat_id)
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000):
        qtbot.mouseClick(window.chat_view.regenerate_button, Qt.MouseButton.LeftButton)
    second = window.store.messages(window.chat.chat_id)
    assert [m.role for m in second] == ["user", "assistant"]
    assert second[0].id == first[0].id, "the question is kept"
    assert second[1].content != first[1].content, "the answer is a new one"


def test_edit_and_resend_replaces_last_user_message(window: Any, qtbot: Any) -> None:
    send(qtbot, window, "first question", max_tokens=5)
    send(qtbot, window, "second question", max_tokens=5)
    qtbot.mouseClick(window.chat_view.edit_button, Qt.MouseButton.LeftButton)
    assert window.chat_view.input.toPlainText() == "second question"
    assert window.chat_view.send_button.text() == "Re&send"
    window.chat_view.input.setPlainText("second question, edited")
    with qtbot.waitSignal(window.chat.answerFinished, timeout=30_000):
        qtbot.mouseClick(window.chat_view.send_button, Qt.MouseButton.LeftButton)
    messages = window.store.messages(window.chat.chat_id)
    assert [(m.role, m.content) for m in messages[:3]] == [
        ("user", "first question"), ("assistant", messages[1].content),
        ("user", "second question, edited")]
    assert len(messages) == 4 and messages[3].role == "assistant"


def test_stats_line_and_context_indicator(window: Any, qtbot: Any) -> None:
    summary = send(qtbot, window, "hi", max_tokens=10)
    answer = window.store.messages(window.chat.chat_id)[-1]
    assert answer.stats["summary"] == summary.summary
    for part in ("tok/s", "TTFT", "hit", "substituted", "mass/tok", "quality-first"):
        assert part in summary.summary
    line = answer_line(answer.stats, answer.status)
    assert line in window.chat_view.text()
    assert line.startswith(f"this answer: {summary.n_tokens} tokens under quality-first")
    assert f"{summary.tokens_per_second:.1f} tok/s" in line
    assert f"hit {summary.hit_rate:.1%}" in line
    bar = window.chat_view.context_bar
    assert bar.maximum() == 512
    assert bar.value() == summary.n_prompt_tokens + summary.n_tokens


def test_system_prompt_is_saved_and_sent(window: Any, qtbot: Any) -> None:
    window.chat.new_chat()
    window.chat_settings.system_prompt.setPlainText("You are terse.")
    assert window.chat.history()[0] == {"role": "system", "content": "You are terse."}
    send(qtbot, window, "hi", max_tokens=3)
    assert window.store.chat(window.chat.chat_id).system_prompt == "You are terse."


def test_send_without_a_model_explains_instead_of_failing(make_window: Any,
                                                          dialogs: Any) -> None:
    w = make_window()
    assert not w.chat.send("hello")
    assert any("Open a model first" in t for t in dialogs.texts("critical"))


def test_a_chat_longer_than_the_context_goes_on_without_its_earliest_turns(
        window: Any, qtbot: Any) -> None:
    long = "tell me more about the experts " * 12
    for i in range(6):
        summary = send(qtbot, window, f"Question {i}: {long}", max_tokens=6)
        assert summary.stop_reason != "error"
    assert "earliest messages left out to fit the context" in summary.summary
    assert summary.n_prompt_tokens <= 512
    stored = window.store.messages(window.chat.chat_id)
    assert len(stored) == 12  # nothing is deleted from the chat itself
    assert "earliest messages left out" in stored[-1].stats["summary"]
