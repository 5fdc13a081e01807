"""Thinking models: thoughts stream under "Thinking…", fold when the answer begins, unfold
on click, and never reach the clipboard's answer, the next turn's prompt or a marker on
screen."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from gui_helpers import LONG_SEED, load, send
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QGuiApplication

from moescope.gui.chat.chat_view import ChatView
from moescope.gui.chat.reasoning_view import reasoning_href
from moescope.session.store import ChatStore
from moescope_testing.vocab import THINKING_CHAT_TEMPLATE

QWEN = ("<think>\nThe user says hi. Greet them back,\nbriefly.\n</think>\n\n"
        "Hello! **How** can I help?")
HARMONY = ("<|channel|>analysis<|message|>User asks 2+2. Answer 4."
           "<|start|>assistant<|channel|>final<|message|>The answer is **4**.")
MARKERS = ("<think>", "</think>", "<|channel|>", "<|message|>", "<|start|>", "analysis<")


def _stream(view: ChatView, raw: str, step: int = 3) -> list[str]:
    """Stream ``raw`` in pieces of ``step`` characters; the transcript after each flush."""
    view.begin_answer()
    seen = []
    for i in range(0, len(raw), step):
        view.append_text(raw[i:i + step])
        view._render_after = 0.0  # every piece is a frame here
        view.flush()
        seen.append(view.text())
    return seen


@pytest.mark.parametrize("raw", [QWEN, HARMONY], ids=["think-tags", "harmony"])
def test_thoughts_stream_then_fold_and_no_marker_is_ever_shown(qtbot: Any, raw: str) -> None:
    view = ChatView()
    qtbot.addWidget(view)
    seen = _stream(view, raw)
    for text in seen:
        assert not any(m in text for m in MARKERS), text
    thinking = [t for t in seen if "Thinking…" in t]
    assert thinking, "the thoughts were never shown while streaming"
    assert any(("Greet them" in t) or ("User asks" in t) for t in thinking)
    final = seen[-1]
    assert "Thinking…" not in final and "▸ Thought for" in final
    assert "Greet them" not in final and "User asks" not in final  # folded
    assert ("Hello! How can I help?" in final) or ("The answer is 4." in final)
    assert not view.thinking


def test_a_stored_answer_folds_its_thoughts_and_unfolds_on_click(qtbot: Any,
                                                                  tmp_path: Path) -> None:
    store = ChatStore(tmp_path / "chats.db")
    chat = store.create_chat("t", "", "m")
    store.add_message(chat.id, "user", "hi")
    answer = store.add_message(chat.id, "assistant", QWEN)
    store.finish_message(answer.id, "done", {"summary": "12 tok/s", "reasoning_tokens": 9,
                                             "reasoning_seconds": 1.25})
    view = ChatView()
    qtbot.addWidget(view)
    toggled: list[int] = []
    view.reasoningToggled.connect(toggled.append)
    view.render(store.messages(chat.id))
    text = view.text()
    assert "▸ Thought for 1.2 s · 9 tokens" in text or "▸ Thought for 1.3 s · 9 tokens" in text
    assert "Greet them" not in text and "Hello! How can I help?" in text
    assert view.open_link(QUrl(reasoning_href(answer.id)))
    assert toggled == [answer.id]
    view.render(store.messages(chat.id))
    text = view.text()
    assert "▾ Thought for" in text and "Greet them back," in text
    assert not any(m in text for m in MARKERS)
    # the answer copied is the answer; the thoughts have their own action
    view.copy_message(1)
    assert QGuiApplication.clipboard().text() == "Hello! **How** can I help?"
    # exported Markdown keeps the thoughts, folded
    md = store.export_markdown(chat.id)
    assert "<details><summary>Thinking</summary>" in md and "Greet them back," in md
    assert "<think>" not in md
    import json

    exported = json.loads(store.export_json(chat.id))["messages"]
    assert exported[1]["content"] == QWEN  # raw, as stored
    assert exported[1]["answer"] == "Hello! **How** can I help?"
    assert exported[1]["reasoning"].startswith("The user says hi.")
    assert "answer" not in exported[0]
    # clicking again folds
    view.open_link(QUrl(reasoning_href(answer.id)))
    view.render(store.messages(chat.id))
    assert "Greet them" not in view.text()


@pytest.fixture
def thinking_model(synth_model: Callable[..., Path]) -> Path:
    return synth_model("qwen3moe", expert_type="q8_0", chat_template=THINKING_CHAT_TEMPLATE)


def test_a_thinking_model_streams_thoughts_and_the_next_turn_drops_them(
        make_window: Callable[..., Any], qtbot: Any, thinking_model: Path) -> None:
    """Real engine, a template that opens <think> in the prompt (Qwen3 Thinking): the
    random tiny model never closes it, so the whole answer is thoughts."""
    window = make_window()
    summary = load(qtbot, window, thinking_model, budget="25%", n_ctx=512)
    assert summary.answer_prefixes == {"default": "<think>\n"}
    window.chat_settings.seed.setValue(LONG_SEED)
    shown_thinking: list[bool] = []
    window.chat.tokensArrived.connect(
        lambda _s: shown_thinking.append(window.chat_view.flush() or window.chat_view.thinking))
    result = send(qtbot, window, "Say hi", max_tokens=16)
    assert result.n_tokens > 0 and any(shown_thinking)
    message = window.store.messages(window.chat.chat_id)[-1]
    assert message.content.startswith("<think>\n")
    assert message.stats["reasoning_tokens"] == result.n_tokens
    assert message.stats["reasoning_seconds"] > 0
    text = window.chat_view.text()
    assert f"▸ Thought for {message.stats['reasoning_seconds']:.1f} s" in text
    assert "<think>" not in text
    # the next turn's prompt carries no thoughts (an answer of thoughts only is left out)
    history = window.chat.history()
    assert [m["role"] for m in history] == ["user"]
    assert all("<think>" not in m["content"] for m in history)


def test_the_thinking_setting_follows_the_model_and_reaches_the_prompt(
        make_window: Callable[..., Any], qtbot: Any, synth_model: Callable[..., Path],
        tiny_moe: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from moescope.engine import Engine
    from moescope.gui.chat.settings import NO_SWITCH_TIP
    from moescope_testing.vocab import HYBRID_THINKING_CHAT_TEMPLATE

    prompts: list[str] = []
    format_chat = Engine.format_chat

    def spy(self: Engine, messages: Any, thinking: str = "default") -> str:
        prompts.append(format_chat(self, messages, thinking))
        return prompts[-1]

    monkeypatch.setattr(Engine, "format_chat", spy)
    window = make_window()
    combo = window.chat_settings.thinking
    load(qtbot, window, tiny_moe, n_ctx=512)
    assert not combo.isEnabled() and combo.toolTip() == NO_SWITCH_TIP
    hybrid = synth_model("qwen3moe", expert_type="q8_0",
                         chat_template=HYBRID_THINKING_CHAT_TEMPLATE)
    load(qtbot, window, hybrid, n_ctx=512)
    assert combo.isEnabled()
    assert [combo.itemData(i) for i in range(combo.count())] == [
        "default", "off", "on", "low", "medium", "high"]
    combo.setCurrentIndex(combo.findData("off"))
    combo.activated.emit(combo.currentIndex())  # what a click does
    prompts.clear()
    send(qtbot, window, "Two and two?", max_tokens=2)
    assert prompts and prompts[-1].endswith("<think>\n\n</think>\n\n")
    # remembered across a model without the switch, and restored from the settings
    assert window.chat_settings.values()["thinking"] == "off"
    load(qtbot, window, tiny_moe, n_ctx=512)
    assert window.chat_settings.sampling().thinking == "default"
    load(qtbot, window, hybrid, n_ctx=512)
    assert combo.currentData() == "off"


def test_answer_now_closes_the_thoughts_and_the_model_answers(
        make_window: Callable[..., Any], qtbot: Any, thinking_model: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The tiny model never closes <think> by itself: "Answer now" after a few thinking
    tokens must end the thoughts, continue the same message, and count both parts."""
    from moescope.engine import Engine

    starts: list[str] = []
    streamed: list[str] = []
    first_part: list[int] = []  # tokens streamed before "Answer now" generated on
    generate = Engine.generate

    def spy(self: Engine, prompt: Any, sampling: Any = None, **kw: Any) -> Any:
        starts.append(kw.get("answer_start", ""))
        first_part.append(len(streamed))
        return generate(self, prompt, sampling, **kw)

    monkeypatch.setattr(Engine, "generate", spy)
    window = make_window()
    load(qtbot, window, thinking_model, budget="25%", n_ctx=512)
    window.chat_settings.seed.setValue(LONG_SEED)
    window.chat_settings.max_tokens.setValue(40)
    view = window.chat_view
    pressed: list[bool] = []

    def maybe_press(_snaps: list[Any]) -> None:
        view.flush()
        if not pressed and window.chat.reasoning_tokens >= 4:
            assert view.answer_now_button.isVisible()
            pressed.append(True)
            qtbot.mouseClick(view.answer_now_button, Qt.MouseButton.LeftButton)

    window.chat.tokensArrived.connect(maybe_press)
    window.chat.tokensArrived.connect(lambda snaps: streamed.extend(
        x.text for x in snaps if not x.end))
    window.client.worker.engine.set_copy_delay(2000)  # long enough to press mid-thought
    with qtbot.waitSignal(window.chat.answerFinished, timeout=60_000) as blocker:
        assert window.chat.send("Say hi")
    window.chat.tokensArrived.disconnect(maybe_press)
    assert pressed
    assert len(starts) == 2 and starts[0] == "" and starts[1].endswith("</think>\n\n")
    message = window.store.messages(window.chat.chat_id)[-1]
    assert message.content.count("</think>") == 1 and message.status == "done"
    # saved once each, in order: the thoughts (decode thread), the closing (window), the
    # answer (decode thread)
    prefix, n = window.chat.answer_prefix, first_part[1]
    assert (prefix + starts[1]).startswith(prefix + "".join(streamed[:n]))
    assert message.content == prefix + starts[1] + "".join(streamed[n:])
    from moescope.model.reasoning import split_reasoning

    split = split_reasoning(message.content)
    assert split.reasoning and split.answer.strip() and not split.thinking
    assert message.stats["reasoning_cut_short"] is True
    assert message.stats["reasoning_tokens"] >= 4
    assert blocker.args[0].n_tokens > 0  # the answer's own tokens
    text = view.text()
    assert "cut short" in text and "</think>" not in text and "Thinking…" not in text
    assert not view.answer_now_button.isVisible()
    # the time plots mark where the answer began, after the thoughts
    window.cache_panel.draw(force=True)
    marks = [step for step, label in window.cache_panel.time_plots.marker_labels()
             if label == "answer"]
    assert len(marks) == 1 and marks[0] > message.stats["reasoning_tokens"]
    # and so does the session trace, reopened: at the same token, labelled once
    from moescope.display.trace_io import reopen

    assert window.trace_path is not None
    reopened = reopen(window.trace_path)
    labels = [label for t in reopened.tokens for label in t.changes]
    assert labels.count("answer") == 1 and "answer now" not in labels
    assert [t.step for t in reopened.tokens if "answer" in t.changes] == marks
    # the next turn sends the answer, not the thoughts
    assert window.chat.history()[-1] == {"role": "assistant", "content": split.answer}


def test_the_answer_prefix_follows_the_thinking_setting(
        make_window: Callable[..., Any], qtbot: Any,
        synth_model: Callable[..., Path]) -> None:
    """A template like Qwen3.5's opens <think> in the prompt unless thinking is off: with
    "off" the answer is an answer, not thoughts (a prefix read once at load would have
    turned every "off" answer into thoughts)."""
    from moescope_testing.vocab import CHAT_TEMPLATE

    template = CHAT_TEMPLATE.replace(
        "'<|im_start|>assistant\\n' }}",
        "'<|im_start|>assistant\\n' }}{% if enable_thinking is defined and enable_thinking "
        "is false %}{{ '<think>\\n\\n</think>\\n\\n' }}{% else %}{{ '<think>\\n' }}{% endif %}")
    assert template != CHAT_TEMPLATE
    model = synth_model("qwen3moe", expert_type="q8_0", chat_template=template)
    window = make_window()
    summary = load(qtbot, window, model, n_ctx=512)
    assert summary.answer_prefixes == {"default": "<think>\n", "off": "", "on": "<think>\n"}
    window.chat_settings.seed.setValue(LONG_SEED)
    combo = window.chat_settings.thinking
    for choice, thinks in (("off", False), ("default", True)):
        combo.setCurrentIndex(combo.findData(choice))
        send(qtbot, window, "Say hi", max_tokens=6)
        message = window.store.messages(window.chat.chat_id)[-1]
        assert message.content.startswith("<think>") == thinks, choice
        assert ("reasoning_tokens" in message.stats) == thinks, choice
