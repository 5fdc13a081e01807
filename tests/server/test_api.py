"""The OpenAI API of ``moescope serve``, driven with the official ``openai`` client."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable

import openai
import pytest
from server_helpers import Server, serve_command

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HELLO = [{"role": "user", "content": "Hello, how are you today?"}]


def test_models_lists_the_served_model(server: Server) -> None:
    c = server.client()
    models = c.models.list().data
    assert [m.id for m in models] == ["moescope-demo-qwen3moe"]
    assert c.models.retrieve("moescope-demo-qwen3moe").id == "moescope-demo-qwen3moe"
    with pytest.raises(openai.NotFoundError):
        c.models.retrieve("gpt-5")


def test_chat_whole_answer_with_usage_and_cache_numbers(server: Server) -> None:
    r = server.client().chat.completions.create(
        model="moescope-demo-qwen3moe", messages=HELLO, max_tokens=12, seed=3)
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content
    assert choice.finish_reason == "length"
    assert r.usage is not None
    assert r.usage.completion_tokens == 12
    assert r.usage.prompt_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + 12
    numbers = r.model_extra["moescope"]
    assert numbers["policy"] == "exact"
    assert 0.0 <= numbers["hit_rate"] <= 1.0
    assert numbers["substituted_fraction"] == 0.0  # exact never substitutes
    assert numbers["fetched_mb"] > 0
    assert numbers["tok_s"] > 0
    assert numbers["prompt_tokens"] == r.usage.prompt_tokens


def test_streamed_answer_equals_the_whole_one(server: Server) -> None:
    c = server.client()
    whole = c.chat.completions.create(model="moescope-demo-qwen3moe", messages=HELLO,
                                      max_tokens=24, seed=11, temperature=1.0)
    chunks = list(c.chat.completions.create(
        model="moescope-demo-qwen3moe", messages=HELLO, max_tokens=24, seed=11,
        temperature=1.0, stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    assert text == whole.choices[0].message.content
    assert chunks[0].choices[0].delta.role == "assistant"
    finish = [ch.choices[0].finish_reason for ch in chunks if ch.choices]
    assert finish[-1] == "length" and set(finish[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 24
    assert "moescope" in chunks[-2].model_extra


def test_text_completions_whole_and_streamed(server: Server) -> None:
    c = server.client()
    r = c.completions.create(model="moescope-demo-qwen3moe", prompt="ROMEO:", max_tokens=10,
                             seed=5)
    assert r.object == "text_completion"
    assert r.usage is not None and r.usage.completion_tokens == 10
    assert r.choices[0].text
    streamed = "".join(ch.choices[0].text for ch in c.completions.create(
        model="moescope-demo-qwen3moe", prompt="ROMEO:", max_tokens=10, seed=5, stream=True)
        if ch.choices)
    assert streamed == r.choices[0].text
    default = c.completions.create(model="moescope-demo-qwen3moe", prompt="ROMEO:")
    assert default.usage is not None and default.usage.completion_tokens <= 16


def test_seeded_sampling_is_deterministic(server: Server) -> None:
    c = server.client()

    def answer(seed: int) -> str:
        r = c.chat.completions.create(model="moescope-demo-qwen3moe", messages=HELLO,
                                      max_tokens=32, seed=seed, temperature=1.2)
        return r.choices[0].message.content or ""

    first = answer(1234)
    assert answer(1234) == first
    assert answer(99) != first or answer(7) != first
    # 2**32 - 1 wrapped to llama.cpp's "random each run" seed: it reproduces too
    assert answer(2**32 - 1) == answer(2**32 - 1)


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_sequence_ends_the_answer_before_it(server: Server, stream: bool) -> None:
    c = server.client()
    base = dict(model="moescope-demo-qwen3moe", messages=HELLO, max_tokens=48, seed=21,
                temperature=1.0)
    full = c.chat.completions.create(**base).choices[0].message.content or ""
    assert len(full) > 20
    stop = full[12:15]
    expected = full[:full.index(stop)]
    if stream:
        stops = [stop, "\x00never", "<|im_end|>", "```\n\n", "\n\n\n\n", "<fim_prefix>",
                 "<fim_suffix>", "<fim_middle>"]  # Continue sends lists like this
        chunks = list(c.chat.completions.create(**base, stop=stops, stream=True))
        text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
        finish = next(ch.choices[0].finish_reason for ch in reversed(chunks)
                      if ch.choices and ch.choices[0].finish_reason)
    else:
        r = c.chat.completions.create(**base, stop=stop)
        text, finish = r.choices[0].message.content, r.choices[0].finish_reason
        assert r.usage is not None and r.usage.completion_tokens < 48
    assert text == expected
    assert finish == "stop"


def test_the_next_turn_reuses_the_conversation_prefix(server: Server) -> None:
    c = server.client()
    long_question = [{"role": "system", "content": "You are a helpful assistant. " * 8},
                     {"role": "user", "content": "Tell me a story about a small robot."}]
    first = c.chat.completions.create(model="moescope-demo-qwen3moe", messages=long_question,
                                      max_tokens=40, seed=1)
    answer = first.choices[0].message.content or ""
    follow = [*long_question, {"role": "assistant", "content": answer},
              {"role": "user", "content": "And then?"}]
    second = c.chat.completions.create(model="moescope-demo-qwen3moe", messages=follow,
                                       max_tokens=8, seed=1)
    assert first.usage is not None and second.usage is not None
    n1, n2 = first.usage.prompt_tokens, second.usage.prompt_tokens
    cached = second.usage.prompt_tokens_details.cached_tokens
    prefill1 = first.model_extra["moescope"]["prefill_tokens"]
    prefill2 = second.model_extra["moescope"]["prefill_tokens"]
    assert cached >= n1  # the whole first prompt, and some of the answer
    assert prefill2 == n2 - cached
    assert prefill2 * 4 < prefill1, (prefill1, prefill2)


def test_policy_and_budget_change_live_through_the_api(server: Server) -> None:
    c = server.client()
    with server.http() as h:
        r = h.post("/v1/moescope/cache", json={"policy": "speed-first", "budget": "8"})
        assert r.status_code == 200, r.text
        state = r.json()
        assert state["applied"] is True
        assert state["policy"] == "speed-first" and state["slots_per_layer"] == 8
        assert server.cache()["policy"] == "speed-first"
        assert "guard" in state["presets"]  # every name "policy" takes, the guard too
        answer = c.chat.completions.create(model="moescope-demo-qwen3moe", messages=HELLO,
                                           max_tokens=16, seed=2)
        numbers = answer.model_extra["moescope"]
        assert numbers["policy"] == "speed-first" and numbers["slots_per_layer"] == 8
        assert numbers["substituted_fraction"] > 0  # speed-first substitutes on 8 slots
        assert server.cache()["last_request"]["policy"] == "speed-first"

        r = h.post("/v1/moescope/cache", json={"policy": "exact", "budget": "16"})
        state = server.wait_idle()
        assert state["policy"] == "exact" and state["slots_per_layer"] == 16

        for bad in ({"policy": "fastest"}, {"budget": "200%"}, {"policy": 3}, {},
                    {"policy": "threshold:theta=x"}):
            r = h.post("/v1/moescope/cache", json=bad)
            assert r.status_code == 400, (bad, r.text)
            assert r.json()["error"]["message"]
        assert server.cache()["policy"] == "exact"


def test_steering_refuses_a_field_it_does_not_read(server: Server) -> None:
    """``{"policy": "speed-first", "budgett": "50%"}`` changed the policy and dropped the
    misspelt budget in silence (200); ``{"policcy": ...}`` said "give a policy"."""
    before = server.wait_idle()
    with server.http() as h:
        for body, field in (({"policy": "speed-first", "budgett": "50%"}, "budgett"),
                            ({"policcy": "speed-first"}, "policcy"),
                            ({"budget": "50%", "audit": 4, "\ud800": 1}, "\\ud800")):
            r = h.post("/v1/moescope/cache", content=json.dumps(body).encode(),
                       headers={"Content-Type": "application/json"})  # escapes \ud800
            assert r.status_code == 400, (body, r.text)
            error = r.json()["error"]
            assert error["param"] == field
            assert error["message"] == (f"unknown field '{field}': this endpoint takes "
                                        "policy, budget, audit")
    after = server.cache()
    for key in ("policy", "budget", "slots_per_layer", "audit_every"):
        assert after[key] == before[key], key  # nothing of a refused body was applied


def test_a_change_during_an_answer_applies_from_its_next_token(
        server_factory: Callable[..., Server]) -> None:
    """Each expert copy sleeps up to 3 ms, so the answer is still running when the change
    arrives, however loaded the machine (on the shared fast server it once finished all
    400 tokens before a busy host delivered the change)."""
    server = server_factory("--policy", "speed-first", "--budget", "8", copy_delay_us=3000)
    c = server.client(timeout=120.0)
    with server.http() as h:
        stream = c.chat.completions.create(model="moescope-demo-qwen3moe", messages=HELLO,
                                           max_tokens=400, seed=2, stream=True)
        chunks = iter(stream)
        next(chunks)
        r = h.post("/v1/moescope/cache", json={"policy": "exact", "budget": "16"})
        assert r.status_code == 200 and r.json()["applied"] is False
        last = [ch for ch in chunks if "moescope" in (ch.model_extra or {})][-1]
        assert last.model_extra["moescope"]["policies"] == ["speed-first", "exact"]
        state = server.wait_idle()
        assert state["policy"] == "exact" and state["slots_per_layer"] == 16


def test_steering_takes_what_serve_policy_takes(server_factory: Callable[..., Server]) -> None:
    """``/v1/moescope/cache`` reads a policy in the grammar of ``serve --policy``: a server
    started under the quality guard can go back to it after another policy."""
    server = server_factory("--policy", "guard:target=1%")
    started = server.wait_idle()["policy"]
    with server.http() as h:
        for spec in ("exact", "guard:target=1%", "threshold:theta=0.3", "guard",
                     "guard:target=2%:every=4:base=cache-prior"):
            r = h.post("/v1/moescope/cache", json={"policy": spec})
            assert r.status_code == 200, (spec, r.text)
            assert r.json()["applied"] is True
        assert h.post("/v1/moescope/cache",
                      json={"policy": "guard:target=1%"}).json()["policy"] == started

        cli = subprocess.run(serve_command("--policy", "fastest", "--port", "1"),
                             capture_output=True, text=True, timeout=60)
        assert cli.returncode == 2 and "(known: " in cli.stderr, cli.stderr
        known = cli.stderr.split("(known: ", 1)[1].split(")", 1)[0]
        for spec in ("fastest", "recorded"):
            r = h.post("/v1/moescope/cache", json={"policy": spec})
            assert r.status_code == 400, (spec, r.text)
            error = r.json()["error"]
            assert error["param"] == "policy"
            assert error["message"] == f"unknown policy {spec!r} (known: {known})"
        assert server.cache()["policy"] == started


def test_a_budget_may_be_a_number_of_slots(server_factory: Callable[..., Server]) -> None:
    """``{"budget": 16}`` is what ``--budget 16`` is: 16 slots per layer."""
    server = server_factory("--policy", "guard:target=1%")
    server.wait_idle()
    with server.http() as h:
        r = h.post("/v1/moescope/cache", json={"budget": 16})
        assert r.status_code == 200, r.text
        assert r.json()["slots_per_layer"] == 16 and r.json()["budget"] == "16"
        r = h.post("/v1/moescope/cache", json={"budget": 8})
        assert r.status_code == 200 and r.json()["slots_per_layer"] == 8
        for bad in (0, -3, 2.5, True, [8]):
            r = h.post("/v1/moescope/cache", json={"budget": bad})
            assert r.status_code == 400, (bad, r.text)
            assert r.json()["error"]["param"] == "budget"
        assert server.cache()["slots_per_layer"] == 8


def test_a_full_queue_answers_503_and_nobody_hangs(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory("--queue", "1", "--policy", "exact", copy_delay_us=3000)
    results: list[str] = []
    lock = threading.Lock()

    def ask(i: int) -> None:
        c = server.client(timeout=120.0)
        try:
            r = c.chat.completions.create(
                model="moescope-demo-qwen3moe", messages=HELLO, max_tokens=30, seed=i)
            outcome = f"done:{r.usage.completion_tokens if r.usage else -1}"
        except openai.APIStatusError as err:
            outcome = f"status:{err.status_code}:{err.response.headers.get('retry-after')}"
        except Exception as err:  # a hang or a dropped connection is the failure here
            outcome = f"error:{err!r}"
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=180)
    assert not any(t.is_alive() for t in threads), f"a client hung: {results}"
    assert len(results) == 6
    done = [r for r in results if r.startswith("done:")]
    busy = [r for r in results if r.startswith("status:503:")]
    assert len(done) + len(busy) == 6, results
    assert done and busy, results
    assert all(1 <= int(r.split(":")[1]) <= 30 for r in done), results
    assert all(int(r.split(":")[2]) >= 1 for r in busy), results  # Retry-After
    server.wait_idle()
    assert server.cache()["totals"]["requests"] >= len(done)


def test_a_full_queue_says_how_many_wait_in_words(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory("--queue", "1", "--policy", "exact", copy_delay_us=3000)
    server.wait_idle()
    body = {"messages": HELLO, "max_tokens": 400, "stream": True, "seed": 4}
    with server.http() as h, server.http() as h2, h.stream(
            "POST", "/v1/chat/completions", json=body) as running:
        lines = running.iter_lines()  # kept: a dropped iterator closes the connection
        assert next(lines).startswith("data: ")
        with h2.stream("POST", "/v1/chat/completions", json=body) as waiting:
            deadline = time.monotonic() + 10
            while server.cache()["queue"]["waiting"] < 1:
                assert time.monotonic() < deadline, "the second request never queued"
                time.sleep(0.05)
            with server.http() as h3:
                refused = h3.post("/v1/chat/completions", json={**body, "stream": False})
            assert waiting.status_code == 200
    assert refused.status_code == 503, refused.text
    assert refused.json()["error"]["message"] == (
        "the engine is busy and 1 request already waits; try again shortly")
    server.wait_idle()


def test_every_streamed_chunk_is_compact_json(server: Server) -> None:
    """Content chunks and the closing ones are written the same way (no spaces)."""
    for path, body in (("/v1/chat/completions", {"messages": HELLO}),
                       ("/v1/completions", {"prompt": "ROMEO:"})):
        with server.http() as h:
            r = h.post(path, json={**body, "max_tokens": 6, "seed": 3, "stream": True,
                                   "stream_options": {"include_usage": True}})
        assert r.status_code == 200, r.text
        data = [line.removeprefix("data: ") for line in r.text.split("\n\n") if line]
        assert data[-1] == "[DONE]" and len(data) >= 4
        for chunk in data[:-1]:
            assert chunk == json.dumps(json.loads(chunk), separators=(",", ":")), chunk


def test_a_client_that_leaves_mid_stream_stops_the_generation(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory("--queue", "1", "--policy", "exact", copy_delay_us=3000)
    server.wait_idle()
    with server.http() as h, h.stream(
            "POST", "/v1/chat/completions",
            json={"messages": HELLO, "max_tokens": 400, "stream": True, "seed": 4}) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        seen = 0
        for line in lines:
            if line.startswith("data: "):
                seen += 1
                if seen == 3:
                    break
    # the connection is closed here, mid-answer
    state = server.wait_idle()
    last = state["last_request"]
    assert last["cancelled"] is True
    assert last["completion_tokens"] < 400
    assert last["tokens_after_cancel"] <= 1
    assert server.alive()


def test_a_queued_client_that_leaves_gives_up_its_place(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory("--queue", "1", "--policy", "exact", copy_delay_us=3000)
    server.wait_idle()
    c = server.client(timeout=120.0)
    long_one = c.chat.completions.create(model="moescope-demo-qwen3moe", messages=HELLO,
                                         max_tokens=60, stream=True, seed=1, temperature=0)
    chunks = iter(long_one)
    next(chunks)
    quick = server.client(timeout=0.3)
    with pytest.raises(openai.APITimeoutError):  # waits in the queue, then leaves
        quick.chat.completions.create(model="moescope-demo-qwen3moe", messages=HELLO,
                                      max_tokens=5)
    deadline = time.monotonic() + 10
    while server.cache()["queue"]["waiting"]:
        assert time.monotonic() < deadline, "the departed client kept its place"
        time.sleep(0.05)
    assert sum(1 for _ in chunks) > 0
    server.wait_idle()
    assert server.cache()["last_request"]["completion_tokens"] > 5  # the long one ran last


def test_a_client_that_leaves_before_a_whole_answer_stops_the_generation(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory("--queue", "1", "--policy", "exact", copy_delay_us=3000)
    server.wait_idle()
    impatient = server.client(timeout=1.0)
    with pytest.raises(openai.APITimeoutError):  # hangs up while the answer generates
        impatient.chat.completions.create(model="moescope-demo-qwen3moe", messages=HELLO,
                                          max_tokens=400, seed=1)  # 166 tokens, ~4 s
    state = server.wait_idle()
    last = state["last_request"]
    assert last["cancelled"] is True
    assert 1 <= last["completion_tokens"] < 166
    assert last["tokens_after_cancel"] <= 1
    assert server.alive()


def test_audits_through_the_api_put_the_quality_cost_in_each_response(
        server: Server) -> None:
    """`audit` in POST /v1/moescope/cache (or `serve --audit N`): every response's
    `moescope` field then carries the answer's audited quality cost, as the window shows."""
    c = server.client()
    with server.http() as h:
        r = h.post("/v1/moescope/cache", json={"policy": "speed-first", "audit": 4})
        assert r.status_code == 200, r.text
        assert r.json()["audit_every"] == 4
        answer = c.chat.completions.create(model="moescope-demo-qwen3moe", messages=HELLO,
                                           max_tokens=16, seed=2)
        cost = answer.model_extra["moescope"]["quality_cost"]
        assert cost["audits"] >= 3 and cost["source"] == "model"
        assert cost["low"] <= cost["estimate"] <= cost["high"]
        assert cost["meaning"] == "expected on the model's own text"
        for bad in ({"audit": -1}, {"audit": "8"}, {"audit": True}, {"audit": 10**9}):
            r = h.post("/v1/moescope/cache", json=bad)
            assert r.status_code == 400, (bad, r.text)
            assert "audit" in r.json()["error"]["message"]
        r = h.post("/v1/moescope/cache", json={"policy": "exact", "audit": 0})
        assert r.status_code == 200 and r.json()["audit_every"] == 0
        answer = c.chat.completions.create(model="moescope-demo-qwen3moe", messages=HELLO,
                                           max_tokens=4, seed=2)
        assert "quality_cost" not in answer.model_extra["moescope"]


def test_serve_takes_a_ram_budget_and_an_audit_period(
        server_factory: Callable[..., Server]) -> None:
    """A model larger than RAM is served like any other (`--ram-budget`), audited from the
    start with `--audit`."""
    server = server_factory("--ram-budget", "30%", "--audit", "4", "--policy", "quality-first")
    answer = server.client().chat.completions.create(
        model="moescope-demo-qwen3moe", messages=HELLO, max_tokens=12, seed=1)
    numbers = answer.model_extra["moescope"]
    assert numbers["quality_cost"]["audits"] >= 2
    assert server.cache()["audit_every"] == 4
