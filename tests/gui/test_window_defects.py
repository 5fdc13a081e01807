"""Window defects a reviewer found: chat titles that read alike once cut, an audited-KL
plot empty without a word, two tokens/s figures without their spans, raw network errors in
*Get models*, and Preferences' GPU wording on a CPU build."""

from __future__ import annotations

import time
from typing import Any

from PySide6.QtCore import Qt

from moescope.session.store import Chat


def _panel(qtbot: Any, width: int) -> Any:
    from moescope.gui.chat.chat_list import ChatListPanel

    panel = ChatListPanel()
    qtbot.addWidget(panel)
    panel.resize(width, 400)
    panel.show()
    qtbot.waitExposed(panel)
    return panel


def test_chat_titles_that_start_alike_read_apart_when_cut(qtbot: Any) -> None:
    panel = _panel(qtbot, 170)
    now = time.time()
    titles = ["Explain quantum computing to a ten year old in simple terms",
              "Explain quantum entanglement to a ten year old in simple terms",
              "Explain quantum tunnelling to a ten year old in simple terms",
              "Short one"]
    panel.set_chats([Chat(id=i + 1, title=t, updated=now - i * 60)
                     for i, t in enumerate(titles)], current=1)
    lst = panel.list
    width = lst.style().subElementRect(
        lst.style().SubElement.SE_ItemViewItemText, _option(lst, 0), lst).width()
    plain = [lst.fontMetrics().elidedText(t, Qt.TextElideMode.ElideMiddle, width)
             for t in titles[:3]]
    assert len(set(plain)) == 1, plain  # cut in the middle alone, the three read the same
    shown = panel.shown_titles()
    assert len(set(shown)) == len(shown), shown
    for word, text in zip(("computing", "entanglement", "tunnelling"), shown, strict=False):
        # painted as worded: the style cut no title a second time ("…tunnellin…a ten…")
        assert text.startswith(f"…{word}") and text.count("…") <= 2, shown
        assert lst.fontMetrics().horizontalAdvance(text) <= width
    assert shown[3] == "Short one"
    assert panel.titles() == titles  # the items keep their whole titles (screen readers)


def _option(lst: Any, row: int) -> Any:
    from PySide6.QtWidgets import QStyleOptionViewItem

    option = QStyleOptionViewItem()
    option.initFrom(lst.viewport())
    option.rect = lst.visualRect(lst.model().index(row, 0))
    option.widget = lst
    return option


def test_chats_with_the_same_title_are_told_apart_by_their_time_and_tips_say_all(
        qtbot: Any) -> None:
    from moescope.gui.chat.chat_list import chat_time, short_time

    panel = _panel(qtbot, 260)
    day = 24 * 3600
    chats = [Chat(id=1, title="New chat", updated=time.time()),
             Chat(id=2, title="New chat", updated=time.time() - 3 * day),
             Chat(id=3, title="Other", updated=time.time())]
    panel.set_chats(chats, current=1)
    shown = panel.shown_titles()
    assert len(set(shown)) == 3 and shown[2] == "Other", shown
    assert shown == [f"New chat · {short_time(chats[0].updated)}",
                     f"New chat · {short_time(chats[1].updated)}", "Other"]
    for i, chat in enumerate(chats):
        tip = panel.list.item(i).toolTip()
        assert tip.startswith(chat.title + "\n") and chat_time(chat.updated) in tip


def test_the_audited_kl_plot_says_audits_are_off_until_audited_tokens_arrive(
        window: Any, qtbot: Any) -> None:
    from gui_helpers import send

    from moescope.gui.cache.time_plots_view import AUDITS_OFF, AUDITS_WAITING

    plots = window.cache_panel.time_plots
    assert window.controls.audit.currentData() == 0
    assert plots.audit_note_text() == AUDITS_OFF
    assert "Quality audit" in AUDITS_OFF  # the control's own name, as in its row
    assert window.controls.form.labelForField(window.controls.audit_row).text().replace(
        "&", "") == "Quality audit"
    send(qtbot, window, "hi", max_tokens=8)
    window.cache_panel.draw(force=True)
    assert plots.audit_note_text() == AUDITS_OFF  # tokens, but none audited
    window.controls.audit.setCurrentIndex(window.controls.audit.findData(8))
    assert plots.audit_note_text() == AUDITS_WAITING.format(every=8)
    send(qtbot, window, "Tell me more", max_tokens=24)
    window.cache_panel.draw(force=True)
    assert len(plots.curves["audit_kl"].xData) >= 1  # audited tokens are drawn
    assert plots.audit_note_text() == ""
    assert not plots.audit_note.isVisible()


def test_the_two_tokens_per_second_figures_name_their_spans_and_explain_on_hover(
        window: Any, qtbot: Any) -> None:
    """The answer line's tok/s (the whole answer) and the cache panel's (its last decode
    steps) differed with nothing to say which was which."""
    from gui_helpers import send
    from PySide6.QtCore import QEvent, QPoint
    from PySide6.QtGui import QHelpEvent, QTextCursor
    from PySide6.QtWidgets import QApplication, QToolTip

    from moescope.display.answer_line import DECODE_RATE_TIP

    summary = send(qtbot, window, "hi", max_tokens=12)
    panel = window.cache_panel
    panel.draw(force=True)
    r = panel.model.rolling_rate_tokens()
    recent = panel.summary.text().split("\n")[1]
    assert r > 1 and f"tok/s (last {r} tokens)" in recent
    assert f"tokens/s is over the last {r} decode steps" in panel.summary.toolTip()
    assert "answer average" in panel.summary.toolTip()
    text = window.chat_view.text()
    rate = f"{summary.tokens_per_second:.1f} tok/s (answer average)"
    assert rate in text
    # hovering the answer line shows what its numbers are over
    view = window.chat_view.transcript
    doc = view.document()
    found = doc.find("answer average")
    assert not found.isNull() and found.charFormat().toolTip() == DECODE_RATE_TIP
    cursor = QTextCursor(doc)
    cursor.setPosition(found.selectionStart())
    view.ensureCursorVisible()
    view.setTextCursor(cursor)
    at = view.cursorRect(cursor).center() + QPoint(2, 0)
    event = QHelpEvent(QEvent.Type.ToolTip, at, view.viewport().mapToGlobal(at))
    QApplication.sendEvent(view.viewport(), event)
    assert QToolTip.isVisible() and QToolTip.text() == DECODE_RATE_TIP
    QToolTip.hideText()


def _unreachable_search(qtbot: Any, endpoint: str, monkeypatch: Any) -> Any:
    from moescope.gui.hub.window import GetModelsWindow
    from moescope.hub.remote import HubClient

    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY",
                 "all_proxy", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    window = GetModelsWindow(client=HubClient(endpoint=endpoint, timeout=5.0))
    qtbot.addWidget(window)
    window.show()
    window.search.setText("qwen moe")
    window.run_search()
    qtbot.waitUntil(lambda: not window.busy(), timeout=15_000)
    return window


def test_get_models_says_no_network_in_one_plain_line_with_the_cause_in_its_tip(
        qtbot: Any, monkeypatch: Any) -> None:
    """The status read "cannot reach huggingface.co ([Errno -2] Name or service not
    known): …": the host and what it means, the system's words in the tooltip only."""
    window = _unreachable_search(qtbot, "https://no-such-host.invalid", monkeypatch)
    text = window.status.text()
    assert text.startswith("cannot reach no-such-host.invalid: no network or DNS failure"), text
    assert "Errno" not in text and "\n" not in text
    tip = window.status.toolTip()
    assert tip.startswith(text) and "Cause: " in tip and "Errno" in tip


def test_a_refused_connection_is_said_as_such(qtbot: Any, monkeypatch: Any) -> None:
    import socket

    with socket.socket() as s:  # a port nothing listens on once it is closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    window = _unreachable_search(qtbot, f"http://127.0.0.1:{port}", monkeypatch)
    text = window.status.text()
    assert text.startswith(f"cannot reach 127.0.0.1:{port}: the connection was refused"), text
    assert "Errno" not in text and "Errno" in window.status.toolTip()


def test_preferences_word_automatic_gpu_layers_for_the_build_that_runs(
        make_window: Any, qtbot: Any) -> None:
    """It said "Automatic (all on a GPU build)" on a CPU build."""
    from moescope.engine.backend import NAMES, engine_build

    window = make_window()
    dialog = window.show_preferences()
    qtbot.addWidget(dialog)
    text, tip = dialog.gpu_layers.specialValueText(), dialog.gpu_layers.toolTip()
    assert dialog.gpu_layers.value() == -1 and dialog.gpu_layers.text() == text
    backend = engine_build().backend
    if backend == "cpu":
        assert text == "Automatic (none: CPU build)" and "GPU build" not in text
        assert "CPU build" in tip
    elif backend:
        assert text == f"Automatic (all layers: {NAMES[backend]} build)"
    dialog.close()


def test_each_build_gets_its_own_automatic_words(qtbot: Any, tmp_path: Any) -> None:
    import json

    from moescope.engine.backend import engine_build
    from moescope.gui.preferences.dialog import PreferencesDialog
    from moescope.gui.preferences.values import Preferences

    seen = {}
    for backend in ("cpu", "cuda", "vulkan"):
        lib = tmp_path / backend
        lib.mkdir()
        (lib / "moescope_build.json").write_text(json.dumps({"backend": backend}))
        dialog = PreferencesDialog(Preferences(), lambda _p: None, build=engine_build(lib))
        qtbot.addWidget(dialog)
        seen[backend] = dialog.gpu_layers.specialValueText()
    assert seen == {"cpu": "Automatic (none: CPU build)",
                    "cuda": "Automatic (all layers: CUDA build)",
                    "vulkan": "Automatic (all layers: Vulkan build)"}
