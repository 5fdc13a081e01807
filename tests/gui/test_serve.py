"""*Serve API* in the window: the server generates on the window's engine, the cache
panel follows its tokens, the log lists its requests, and the chat waits its turn."""

from __future__ import annotations

import socket
import threading
from typing import Any

import httpx2 as httpx
import pytest
from gui_helpers import load, send, slow_down

pytestmark = pytest.mark.engine


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ask(url: str, out: list[Any], max_tokens: int = 24) -> threading.Thread:
    """A client request on its own thread (the GUI thread must keep running)."""

    def run() -> None:
        import openai

        c = openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=60)
        out.append(c.chat.completions.create(
            model=c.models.list().data[0].id,
            messages=[{"role": "user", "content": "Hi there"}], max_tokens=max_tokens,
            seed=1))

    t = threading.Thread(target=run)
    t.start()
    return t


def test_serving_from_the_window_moves_the_cache_panel(window: Any, qtbot: Any) -> None:
    window.serve.show_panel()
    panel = window.serve.panel
    panel.port.setValue(_free_port())
    panel.button.click()
    assert window.serve.serving, panel.error.text()
    url = window.serve.url
    step_before = window.client.worker.step
    tokens_before = len(window.recent_tokens)
    out: list[Any] = []
    with qtbot.waitSignal(window.serve.requestFinished, timeout=60_000) as done:
        t = _ask(url, out)
    t.join(30)
    record = done.args[0]
    assert out and out[0].usage.completion_tokens == record.completion_tokens
    qtbot.waitUntil(lambda: len(window.recent_tokens) - tokens_before
                    >= record.completion_tokens, timeout=10_000)
    assert window.client.worker.step == step_before + record.completion_tokens
    assert window.cache_panel.model.latest is not None
    assert window.cache_panel.model.latest.step == window.client.worker.step
    assert any(m.label == "API" for m in window.cache_panel.model.markers)
    qtbot.waitUntil(lambda: "tok/s" in panel.log.toPlainText(), timeout=5_000)
    assert "hit " in panel.log.toPlainText() and "quality-first" in panel.log.toPlainText()
    panel.button.click()
    assert not window.serve.serving
    with pytest.raises(httpx.HTTPError):
        httpx.get(url + "/models", timeout=2)


def test_the_chat_waits_for_an_api_answer_then_answers(window: Any, qtbot: Any) -> None:
    url = window.serve.start(port=_free_port())
    slow_down(window, 2000)
    out: list[Any] = []
    with qtbot.waitSignal(window.serve.bridge.started, timeout=30_000):
        t = _ask(url, out, max_tokens=80)
    summary = send(qtbot, window, "Hello", max_tokens=8, timeout=60_000)
    t.join(60)
    assert out and out[0].usage.completion_tokens >= 1
    assert summary.n_tokens >= 1 and summary.stop_reason != "error"
    assert window.serve.records and window.serve.records[-1].completion_tokens >= 1
    window.serve.stop()


def test_other_machines_need_a_key(window: Any) -> None:
    from moescope.util.errors import MoEScopeError

    with pytest.raises(MoEScopeError, match="type an API key"):
        window.serve.start(host="0.0.0.0", port=_free_port())
    assert not window.serve.serving


@pytest.mark.parametrize("key", ["two words", "caf\u00e9", "line\nbreak", "k" * 1025])
def test_a_key_no_client_could_send_is_refused_as_serve_refuses_it(window: Any,
                                                                   key: str) -> None:
    """The panel took any text as the key: a space, an accent or a newline made a server
    that no request could ever authenticate to (``serve --api-key`` refuses those)."""
    from moescope.util.errors import MoEScopeError

    with pytest.raises(MoEScopeError, match=r"The API key (may hold only|is 1,025)"):
        window.serve.start(host="0.0.0.0", port=_free_port(), api_key=key)
    assert not window.serve.serving


def test_a_policy_and_budget_set_through_the_api_show_in_the_window_at_once(
        window: Any, qtbot: Any) -> None:
    """``POST /v1/moescope/cache`` while nothing generates applies the change at once (the
    answer says ``applied``): the window's controls, status line and title follow then,
    not only when the next token arrives (they showed the old policy and budget until a
    later request generated)."""
    url = window.serve.start(port=_free_port())
    try:
        m = window.model
        slots = min(m.n_expert, m.slots_per_layer * 2)
        assert slots != m.slots_per_layer and m.policy != "speed-first"
        r = httpx.post(url + "/moescope/cache",
                       json={"policy": "speed-first", "budget": str(slots)}, timeout=30)
        assert r.status_code == 200 and r.json()["applied"] is True, r.text
        qtbot.waitUntil(lambda: window.model.policy == "speed-first", timeout=10_000)
        assert window.model.slots_per_layer == slots
        assert window.controls.policy_combo.currentData() == "speed-first"
        assert window.controls.budget.value() == slots
        assert f"{slots}/{m.n_expert} expert slots" in window.model_label.text()
    finally:
        window.serve.stop()


def test_the_panel_offers_the_address_and_port_it_last_served_on(
        make_window: Any, qtbot: Any, tiny_moe: Any) -> None:
    """The Serve panel forgot its address and port with every start of the app; it now
    offers the last ones that served (the key is never kept), and ignores kept values
    that are no address or port."""
    first = make_window()
    load(qtbot, first, tiny_moe, budget="25%", policy="quality-first", n_ctx=512)
    port = _free_port()
    first.serve.show_panel()
    panel = first.serve.panel
    panel.port.setValue(port)
    panel.key.setText("sesame")
    panel.button.click()
    assert first.serve.serving, panel.error.text()
    panel.button.click()
    first.close()
    second = make_window()
    second.serve.show_panel()
    again = second.serve.panel
    assert again.port.value() == port and again.host.text() == "127.0.0.1"
    assert again.key.text() == ""  # a secret is not written to the settings file
    second.close()
    settings = second.settings
    settings.setValue("serve/port", "99999")
    settings.setValue("serve/host", "a b")
    settings.sync()
    third = make_window()
    third.serve.show_panel()
    assert third.serve.panel.port.value() == 8080
    assert third.serve.panel.host.text() == "127.0.0.1"


def test_the_status_bar_says_while_serving_after_the_panel_closes(window: Any) -> None:
    """Serving goes on when the *Serve API* window is closed: the main window's status bar
    shows the address, opens that window on a click, and hides when serving stops."""
    assert window.serving_button.isHidden()
    window.serve.show_panel()
    panel = window.serve.panel
    panel.port.setValue(_free_port())
    panel.button.click()
    assert window.serve.serving, panel.error.text()
    panel.close()
    assert not window.serving_button.isHidden()
    assert window.serve.url in window.serving_button.text()
    window.serving_button.click()
    assert panel.isVisible()
    panel.button.click()  # stop
    assert not window.serve.serving and window.serving_button.isHidden()
