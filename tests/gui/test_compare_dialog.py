"""Compare policies on the last message, in the window over the real engine."""

from __future__ import annotations

from typing import Any

from gui_helpers import send
from PySide6.QtCore import QPoint, Qt

from moescope.engine.compare import SCORE_BLOCK, agreement, perplexity_text


def _run(window: Any, qtbot: Any, *checked: str, tokens: int = 16,
         score: bool = False) -> Any:
    dialog = window.open_compare_dialog()
    assert dialog is not None and dialog.isVisible() and dialog.isModal()
    for i in range(dialog.policies.count()):
        item = dialog.policies.item(i)
        key = item.data(Qt.ItemDataRole.UserRole)
        item.setCheckState(Qt.CheckState.Checked if key in checked else Qt.CheckState.Unchecked)
    dialog.max_tokens.setValue(tokens)
    dialog.score.setChecked(score)
    with qtbot.waitSignal(window.client.worker.compareFinished, timeout=60_000):
        qtbot.mouseClick(dialog.run_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: dialog.result is not None, timeout=10_000)
    return dialog


def test_policies_answer_the_last_message_side_by_side(window: Any, qtbot: Any) -> None:
    send(qtbot, window, "Tell me about the sea.", max_tokens=8)
    engine = window.client.worker.engine
    trace_before = window.trace_path
    dialog = _run(window, qtbot, "speed-first", "substitute-all")
    result = dialog.result
    assert [a.policy for a in result.answers] == ["exact", "speed-first", "substitute-all"]
    t = dialog.table
    assert t.rowCount() == 3
    assert [t.item(r, 0).text() for r in range(3)] == ["Exact", "Speed-first",
                                                       "Substitute every miss"]
    assert t.item(0, 2).text() == "reference"
    ref, sub = result.answers[0], result.answers[2]
    prefix, share = agreement(ref.token_ids, sub.token_ids)
    assert t.item(2, 4).text() == f"{share:.0%}"
    assert t.item(2, 3).text() == ("identical" if prefix == len(sub.token_ids)
                                   else f"{prefix} tokens")
    # the selected answer is shown, its differing part marked
    t.selectRow(2)
    assert dialog.answer.toPlainText() == sub.text
    # the user's policy is back, the cache is empty, and the chat goes on in a new trace
    assert engine.policy_name == "quality-first"
    dialog.reject()
    qtbot.waitUntil(lambda: not dialog.isVisible())
    if trace_before is not None:
        assert window.trace_path is not None and window.trace_path != trace_before
    summary = send(qtbot, window, "And the ships?", max_tokens=4)
    assert summary.n_tokens > 0 and summary.stop_reason != "error"


def test_audited_answers_show_their_expected_cost(window: Any, qtbot: Any) -> None:
    """With audits on, each answer's *Expected cost* is its KL estimate, and the cell and
    the header say it is the cost expected on the model's own text."""
    from moescope.gui.dialogs.compare import COLUMNS

    audit = window.controls.audit
    audit.setCurrentIndex(audit.findData(8))
    engine = window.client.worker.engine
    qtbot.waitUntil(lambda: engine.audit_every == 8, timeout=10_000)
    send(qtbot, window, "Tell me about the sea.", max_tokens=8)
    dialog = _run(window, qtbot, "speed-first", tokens=24)
    col = COLUMNS.index("Expected cost")
    assert "expected on the model's own text" in dialog.table.horizontalHeaderItem(col).toolTip()
    for r, a in enumerate(dialog.result.answers):
        assert a.audit is not None and a.audit.source == "model"
        assert a.audit.cost == a.audit.kl.cost
        cell = dialog.table.item(r, col)
        assert cell.text() == a.audit.cost_text()
        assert "expected on the model's own text" in cell.toolTip()
    dialog.reject()


def test_scoring_the_chat_adds_each_policys_perplexity_change(window: Any,
                                                              qtbot: Any) -> None:
    """The whole chat (both turns and their answers), teacher-forced under each policy:
    Exact is the reference, substitute-all costs perplexity, shown with its interval."""
    send(qtbot, window, "Tell me about the sea.", max_tokens=12)
    send(qtbot, window, "And the ships?", max_tokens=12)
    first = window.open_compare_dialog()
    assert first.score.isEnabled() and not first.score.isChecked()  # opt-in: it takes time
    first.reject()
    dialog = _run(window, qtbot, "substitute-all", tokens=4, score=True)
    result = dialog.result
    assert result.scored_tokens > 30
    col = dialog.table.columnCount() - 1
    assert dialog.table.horizontalHeaderItem(col).text() == "Chat perplexity"
    assert dialog.table.item(0, col).text() == "reference"
    change = result.perplexity_change(result.answers[1])
    assert change is not None and change[0] > 0
    assert dialog.table.item(1, col).text() == perplexity_text(change)
    assert "scored over" in dialog.status.text()
    dialog.reject()
    # without the box ticked nothing is scored, and the column says so
    dialog = _run(window, qtbot, "substitute-all", tokens=4)
    assert dialog.result.scored_tokens == 0 and dialog.table.item(1, col).text() == "–"
    dialog.reject()


def test_a_chat_of_one_block_shows_no_interval(window: Any, qtbot: Any) -> None:
    """The interval resamples blocks of 32 tokens: a chat that short has none, and the
    table showed the point twice as one ("+x% [+x, +x]")."""
    send(qtbot, window, "Hi", max_tokens=1)
    dialog = _run(window, qtbot, "substitute-all", tokens=1, score=True)
    result = dialog.result
    assert 0 < result.scored_tokens <= SCORE_BLOCK
    change = result.perplexity_change(result.answers[1])
    assert change is not None
    col = dialog.table.columnCount() - 1
    assert dialog.table.item(1, col).text() == f"{change[0]:+.2f}% (no interval)"
    assert "too few for an interval" in dialog.status.text()
    dialog.reject()


def test_custom_settings_can_be_compared_too(window: Any, qtbot: Any,
                                            monkeypatch: Any) -> None:
    """The user's own Custom point (here Cache-Prior with bonus 0.12 and top-k prefetch) is
    one more row, run with exactly those settings."""
    import moescope.gui.worker as worker_module
    from moescope.display.policy_choices import CUSTOM, PREFETCH_TOPK, custom_policy

    send(qtbot, window, "Tell me about the sea.", max_tokens=8)
    c = window.controls
    c.select_policy(CUSTOM)
    c.bonus.setValue(12)
    c.prefetch_mode.setCurrentIndex(c.prefetch_mode.findData(PREFETCH_TOPK))
    c.select_policy("quality-first")  # Custom keeps its settings while another is chosen
    mine = custom_policy(bonus=0.12, prefetch=-1)
    assert c.custom_setting() == mine
    asked: list[Any] = []
    real = worker_module.compare_policies

    def spy(engine: Any, messages: Any, policies: Any, **kw: Any) -> Any:
        asked.extend(policies)
        return real(engine, messages, policies, **kw)

    monkeypatch.setattr(worker_module, "compare_policies", spy)
    dialog = _run(window, qtbot, CUSTOM, tokens=6)
    labels = [dialog.policies.item(i).text() for i in range(dialog.policies.count())]
    assert "Custom: bonus 0.12 · β 0.50 · prefetch top-k" in labels
    assert asked == ["exact", mine]
    assert [a.policy for a in dialog.result.answers] == ["exact", "custom"]
    assert window.client.worker.engine.policy_name == "quality-first"
    dialog.reject()


def test_the_custom_row_names_its_disk_threshold() -> None:
    """Custom with a disk threshold of its own was labelled like Quality-first's θ rule,
    so two differently set Custom runs read the same."""
    from moescope.display.policy_choices import custom_policy
    from moescope.gui.dialogs.compare import custom_text

    assert custom_text(custom_policy()) == "θ 0.15 · β 0.50"
    assert custom_text(custom_policy(theta_disk=0.3)) == "θ 0.15 · disk 0.30 · β 0.50"
    assert custom_text(custom_policy(theta_disk=0.0)) == "θ 0.15 · disk 0.00 · β 0.50"
    assert custom_text(custom_policy(bonus=0.12, theta_disk=0.3)).startswith("bonus 0.12 · β")


def test_nothing_to_compare_before_a_message(window: Any, dialogs: Any) -> None:
    window.chat.new_chat()
    assert window.open_compare_dialog() is None
    assert any("Send a message first" in text for text in dialogs.texts())


def test_stop_keeps_the_answers_so_far(window: Any, qtbot: Any) -> None:
    send(qtbot, window, "Tell me about the sea.", max_tokens=4)
    window.client.worker.engine.set_copy_delay(3000)
    dialog = window.open_compare_dialog()
    dialog.max_tokens.setValue(40)
    progress: list[str] = []
    window.client.worker.compareProgress.connect(
        lambda d, t, p: (progress.append(p), p == "quality-first" and dialog.stop()))
    with qtbot.waitSignal(window.client.worker.compareFinished, timeout=60_000):
        dialog.run()
    qtbot.waitUntil(lambda: dialog.result is not None, timeout=10_000)
    assert dialog.result.stopped and [a.policy for a in dialog.result.answers] == ["exact"]
    assert "stopped" in dialog.status.text()
    assert dialog.run_button.isEnabled() and not dialog.stop_button.isEnabled()
    dialog.reject()


def test_closing_the_window_mid_comparison_stops_it_and_joins_the_engine(
        window: Any, qtbot: Any) -> None:
    send(qtbot, window, "Tell me about the sea.", max_tokens=4)
    window.client.worker.engine.set_copy_delay(5000)
    dialog = window.open_compare_dialog()
    dialog.max_tokens.setValue(200)
    started: list[str] = []
    window.client.worker.compareProgress.connect(lambda d, t, p: started.append(p))
    dialog.run()
    qtbot.waitUntil(lambda: bool(started), timeout=30_000)
    window.close()
    assert not window.client.thread.isRunning()


def test_a_thinking_answer_is_shown_without_markers() -> None:
    from moescope.gui.dialogs.compare import shown_text

    assert shown_text("<think>\nHmm.\n</think>\n\nHi!") == "Thinking: Hmm.\n\nHi!"
    assert shown_text("<think>\nstill going") == "Thinking: still going"
    assert shown_text("Plain <b>text</b>") == "Plain <b>text</b>"


def test_the_table_keeps_the_height_the_user_drags_it_to(window: Any, qtbot: Any) -> None:
    """After a run the table is given the height of its rows (again when its rows go out
    of view), but not once the user has moved the border between it and the answer: the
    rows then scroll, as the user set them."""
    send(qtbot, window, "Tell me about the sea.", max_tokens=8)
    dialog = _run(window, qtbot, "speed-first", "substitute-all", "psr", tokens=8)
    table, results = dialog.table, dialog.results
    qtbot.waitUntil(lambda: table.verticalScrollBar().maximum() == 0, timeout=5_000)
    handle = results.handle(1)
    centre = handle.rect().center()
    qtbot.mousePress(handle, Qt.MouseButton.LeftButton, pos=centre)
    for step in range(1, 11):  # up to the table's least height: two rows
        qtbot.mouseMove(handle, pos=centre - QPoint(0, 40 * step))
    qtbot.mouseRelease(handle, Qt.MouseButton.LeftButton, pos=centre - QPoint(0, 400))
    qtbot.waitUntil(lambda: results.sizes()[0] <= table.minimumHeight() + 4, timeout=5_000)
    dragged = results.sizes()[0]
    qtbot.wait(100)
    assert results.sizes()[0] <= dragged  # not fitted back to its rows
    assert table.verticalScrollBar().maximum() > 0  # some rows out of view, as set
    dialog.reject()
