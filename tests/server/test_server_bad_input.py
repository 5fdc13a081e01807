"""Bad requests get OpenAI-style errors with the right status, and the server lives on."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import openai
import pytest
from server_helpers import Server, serve_command

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HELLO = [{"role": "user", "content": "Hello"}]


def _error(r) -> dict:  # type: ignore[no-untyped-def, type-arg]
    body = r.json()
    assert set(body) == {"error"}, body
    err = body["error"]
    assert err["message"] and "Traceback" not in err["message"]
    return err  # type: ignore[no-any-return]


@pytest.mark.parametrize(("body", "param"), [
    ({"messages": []}, "messages"),
    ({"messages": "hi"}, "messages"),
    ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]},
     "messages[0].content"),
    ({"messages": HELLO, "temperature": -1}, "temperature"),
    ({"messages": HELLO, "temperature": "hot"}, "temperature"),
    ({"messages": HELLO, "top_p": 1.5}, "top_p"),
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 2.5}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": True}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": 1 << 31}, "max_tokens"),  # one above a C int
    ({"messages": HELLO, "n": 2}, "n"),
    ({"messages": HELLO, "n": True}, "n"),  # True == 1 in Python: not a count
    ({"messages": HELLO, "presence_penalty": False}, "presence_penalty"),
    ({"messages": HELLO, "presence_penalty": 2.5}, "presence_penalty"),  # OpenAI's -2..2
    ({"messages": HELLO, "presence_penalty": "high"}, "presence_penalty"),
    ({"messages": HELLO, "frequency_penalty": -2.01}, "frequency_penalty"),
    ({"messages": HELLO, "frequency_penalty": True}, "frequency_penalty"),
    ({"messages": HELLO, "stream_options": {"include_usage": True}}, "stream_options"),
    ({"messages": HELLO, "stream": False, "stream_options": {}}, "stream_options"),
    ({"messages": HELLO, "web_search_options": {}}, "web_search_options"),
    ({"messages": HELLO, "verbosity": "low"}, "verbosity"),
    ({"messages": [*HELLO, {"role": "assistant", "tool_calls": {"id": "a"}}]},
     "messages[1].tool_calls"),
    ({"messages": [*HELLO, {"role": "assistant", "tool_calls": [{"type": "function"}]}]},
     "messages[1].tool_calls[0]"),
    ({"messages": [*HELLO, {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "f", "arguments": {}}}]}]},
     "messages[1].tool_calls[0]"),  # arguments are JSON text, as OpenAI sends them
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]},
     "messages[0].tool_calls"),
    ({"messages": [*HELLO, {"role": "assistant", "function_call": {"name": "f"}}]},
     "messages[1].function_call"),
    ({"messages": [*HELLO, {"role": "tool", "content": "1", "tool_call_id": 5}]},
     "messages[1].tool_call_id"),
    ({"messages": HELLO, "stop": [str(i) for i in range(17)]}, "stop"),
    ({"messages": HELLO, "stop": ["x" * 257]}, "stop"),
    ({"messages": HELLO, "stop": [""]}, "stop"),
    ({"messages": HELLO, "stop": 7}, "stop"),
    ({"messages": HELLO, "seed": "x"}, "seed"),
    ({"messages": HELLO, "stream": "yes"}, "stream"),
    ({"messages": HELLO, "stream": True, "stream_options": {"include_usage": "false"}},
     "stream_options"),  # a non-empty string was read as true
    ({"messages": HELLO, "logprobs": "yes"}, "logprobs"),
    ({"messages": HELLO, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"messages": HELLO, "tools": [{"type": "function"}]}, "tools[0]"),
    ({"messages": HELLO, "reasoning_effort": "extreme"}, "reasoning_effort"),
    ({"messages": HELLO, "model": 5}, "model"),
    ([1, 2, 3], "body"),
])
def test_bad_parameters_are_400_naming_the_field(server: Server, body: object,
                                                 param: str) -> None:
    with server.http() as h:
        r = h.post("/v1/chat/completions", json=body)
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi \ud800"}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": [{"role": "system", "content": "\udfff"}, *HELLO]},
     "messages[0].content"),
    ("/v1/chat/completions",
     {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
     "messages[0].content"),
    ("/v1/chat/completions", {"messages": HELLO, "stop": ["\ud800"]}, "stop"),
    ("/v1/chat/completions", {"messages": HELLO, "stop": "end\ud800", "stream": True},
     "stop"),
    ("/v1/chat/completions", {"messages": HELLO, "model": "\ud800"}, "model"),
    ("/v1/completions", {"prompt": "ROMEO:\ud800"}, "prompt"),
    ("/v1/completions", {"prompt": ["\ud800"], "stream": True}, "prompt"),
    ("/v1/completions", {"prompt": "ROMEO:", "stop": "\udc00"}, "stop"),
    ("/v1/moescope/cache", {"policy": "exact\ud800"}, "policy"),
    ("/v1/moescope/cache", {"budget": "16\ud800"}, "budget"),
])
def test_a_lone_surrogate_is_400_naming_the_field(server: Server, path: str, body: object,
                                                  param: str) -> None:
    """JSON may escape half of a UTF-16 pair (``\\ud800``); no tokenizer takes it."""
    with server.http() as h:  # json.dumps escapes it, as a JavaScript client would
        r = h.post(path, content=json.dumps(body).encode(),
                   headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == param
    assert err["type"] == "invalid_request_error"
    assert "internal error" not in server.log and "Traceback" not in server.log


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/completions", {"max_tokens": 4}, "prompt"),
    ("/v1/completions", {"prompt": None, "stream": True}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content"),
    ("/v1/chat/completions",
     {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user",
                                                                "content": None}]},
     "messages[1].content"),
    ("/v1/chat/completions", {"messages": [{"role": "system"}, *HELLO]},
     "messages[0].content"),
])
def test_a_missing_prompt_or_message_content_is_400_naming_it(
        server: Server, path: str, body: object, param: str) -> None:
    """OpenAI requires ``prompt`` of a completion and ``content`` of every message but an
    assistant's (which may carry tool calls instead)."""
    with server.http() as h:
        r = h.post(path, json=body)
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == param and "required" in err["message"]


def test_an_assistant_message_may_leave_out_its_content(server: Server) -> None:
    with server.http() as h:
        r = h.post("/v1/chat/completions", json={
            "messages": [*HELLO, {"role": "assistant"}, {"role": "user", "content": "Hi"}],
            "max_tokens": 2})
    assert r.status_code == 200, r.text


def test_malformed_json_unknown_model_and_routes(server: Server) -> None:
    with server.http() as h:
        r = h.post("/v1/chat/completions", content=b"{not json",
                   headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and _error(r)["code"] == "invalid_json"
        r = h.post("/v1/completions", content=b"\xff\xfe\x00")
        assert r.status_code == 400 and _error(r)["code"] == "invalid_json"
        r = h.post("/v1/chat/completions", json={"model": "gpt-4o", "messages": HELLO})
        assert r.status_code == 404 and _error(r)["code"] == "model_not_found"
        r = h.get("/v1/engines")
        assert r.status_code == 404 and _error(r)
        r = h.get("/v1/chat/completions")
        assert r.status_code == 405 and _error(r)
        r = h.post("/v1/completions", json={"prompt": [1, 2, 3]})
        assert r.status_code == 400 and _error(r)["param"] == "prompt"
    with pytest.raises(openai.NotFoundError):
        server.client().chat.completions.create(model="llama-3", messages=HELLO)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions",
                                  "/v1/moescope/cache"])
def test_a_body_nested_past_the_json_parsers_recursion_is_400(server: Server,
                                                              path: str) -> None:
    """Python's JSON parser recurses: ~1000 nested arrays raised RecursionError, a 500
    (and uvicorn dropped the connection, so the client's next request on it failed)."""
    nested = "[" * 5000 + "]" * 5000
    with server.http() as h:
        for body in (f'{{"messages": {nested}}}', f'{{"prompt": "x", "stop": {nested}}}'):
            r = h.post(path, content=body.encode(),
                       headers={"Content-Type": "application/json"})
            assert r.status_code == 400, r.text
            err = _error(r)
            assert err["code"] == "invalid_json" and "deeply" in err["message"]
        r = h.get("/v1/models")  # the same connection still serves
        assert r.status_code == 200
    assert "internal error" not in server.log and "Traceback" not in server.log


def test_a_number_of_thousands_of_digits_is_400(server: Server) -> None:
    """Python refuses to convert an integer of over 4300 digits from text (a ValueError
    that is no JSONDecodeError): it was a 500 and a dropped connection."""
    with server.http() as h:
        for path, body in (("/v1/completions", b'{"prompt": "x", "max_tokens": %s}'),
                           ("/v1/chat/completions", b'{"messages": [], "seed": -%s}')):
            r = h.post(path, content=body % (b"9" * 5000),
                       headers={"Content-Type": "application/json"})
            assert r.status_code == 400, r.text
            err = _error(r)
            assert err["code"] == "invalid_json" and "digits" in err["message"], err
        assert h.get("/v1/models").status_code == 200  # the same connection
    assert "internal error" not in server.log and "Traceback" not in server.log


def test_echo_zero_is_not_echo_false(server: Server) -> None:
    with server.http() as h:
        r = h.post("/v1/completions", json={"prompt": "x", "echo": 0, "max_tokens": 2})
    assert r.status_code == 400 and _error(r)["param"] == "echo", r.text


@pytest.mark.parametrize("stream", [False, True])
def test_a_prompt_longer_than_the_context_is_413(server: Server, stream: bool) -> None:
    long = "the quick brown fox jumps over the lazy dog " * 200  # > 512 tokens
    with pytest.raises(openai.APIStatusError) as caught:
        server.client().chat.completions.create(
            model="moescope-demo-qwen3moe", messages=[{"role": "user", "content": long}],
            stream=stream)
    assert caught.value.status_code == 413
    assert caught.value.code == "context_length_exceeded"
    assert caught.value.param == "messages"
    assert "512" in caught.value.message
    with pytest.raises(openai.APIStatusError) as caught:
        server.client().completions.create(model="moescope-demo-qwen3moe", prompt=long,
                                           stream=stream)
    assert caught.value.status_code == 413 and caught.value.param == "prompt"
    with server.http() as h:
        r = h.post("/v1/completions", json={"prompt": long, "stream": stream})
        assert r.status_code == 413 and _error(r)["code"] == "context_length_exceeded"
        r = h.post("/v1/chat/completions",  # prepared on a thread, not on the event loop
                   json={"messages": [{"role": "user", "content": long * 30}],
                         "stream": stream})
        assert r.status_code == 413 and _error(r)["code"] == "context_length_exceeded"
        assert r.headers["content-type"].startswith("application/json")
        assert _error(r)["type"] == "invalid_request_error"
    assert server.alive()


def test_an_oversized_body_is_413(server: Server) -> None:
    huge = "x" * (1 << 20) + "y" * 1024  # the server was started with --max-body 1 (MiB)
    with server.http() as h:
        r = h.post("/v1/chat/completions",
                   json={"messages": [{"role": "user", "content": huge}]})
        assert r.status_code == 413 and _error(r)["code"] == "request_too_large"

        def chunks():  # no Content-Length: counted as it arrives
            for _ in range(40):
                yield b"a" * 65536

        r = h.post("/v1/completions", content=chunks())
        assert r.status_code == 413 and _error(r)["code"] == "request_too_large"
        r = h.post("/v1/moescope/cache", content=b"{" * ((1 << 20) + 1))
        assert r.status_code == 413 and _error(r)["code"] == "request_too_large"
    with pytest.raises(openai.APIStatusError) as caught:
        server.client().chat.completions.create(
            model="moescope-demo-qwen3moe", messages=[{"role": "user", "content": huge}],
            stream=True)
    assert caught.value.status_code == 413 and caught.value.code == "request_too_large"


def test_max_tokens_is_clamped_to_the_server_limit(server_factory: Callable[..., Server]) -> None:
    server = server_factory("--max-tokens", "7")
    r = server.client().completions.create(model="moescope-demo-qwen3moe", prompt="ROMEO:",
                                           max_tokens=100_000, temperature=0)
    assert r.usage is not None and r.usage.completion_tokens <= 7


def _closed_by_server(sock: socket.socket, wait_s: float = 30.0) -> bool:
    """Whether the server closes ``sock`` (its end of file) before ``wait_s``: a bound so
    a regression fails instead of hanging, not a measure of speed."""
    sock.settimeout(wait_s)
    try:
        while True:
            data = sock.recv(4096)
            if not data:
                return True
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_a_client_that_never_finishes_its_request_is_dropped(
        server_factory: Callable[..., Server]) -> None:
    """uvicorn has no deadline on reading a request: a client sending its headers a byte
    at a time, or never ending them, or not its announced body, held its connection (64
    such, and nobody else got in). ``--read-timeout`` ends them; whole requests, however
    long their answer takes, are untouched."""
    server = server_factory("--policy", "exact", "--read-timeout", "1", copy_delay_us=20_000)
    head = b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # no blank line: unfinished
    body = (b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
            b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"prompt\"")
    for sent in (b"", head, body):
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(sent)
            assert _closed_by_server(sock), sent
    # a kept-alive connection's next request is held to the same deadline
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        sock.settimeout(30)
        assert sock.recv(4096).startswith(b"HTTP/1.1 200")
        sock.sendall(head)
        assert _closed_by_server(sock)
    # an answer that takes longer than the deadline (each expert copy sleeps) comes whole
    started = time.monotonic()
    r = server.client().completions.create(model="moescope-demo-qwen3moe", prompt="ROMEO:",
                                           max_tokens=40, temperature=0)
    assert time.monotonic() - started > 1.0  # the premise: past the deadline
    assert r.usage is not None and r.usage.completion_tokens == 40
    assert server.alive() and "Traceback" not in server.log


def test_a_read_timeout_out_of_range_is_one_line(tmp_path: Path) -> None:
    for value in ("0", "100000"):
        done = subprocess.run(serve_command(str(tmp_path / "none.gguf"), "--read-timeout",
                                            value), capture_output=True, text=True,
                              timeout=120)
        assert done.returncode != 0 and "--read-timeout" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_the_server_survives_all_of_it(server: Server) -> None:
    r = server.client().chat.completions.create(model="moescope-demo-qwen3moe",
                                                messages=HELLO, max_tokens=3)
    assert r.choices[0].message.content is not None
    assert server.alive()
    assert "Traceback" not in server.log


def test_the_api_key_is_required_when_set(server_factory: Callable[..., Server]) -> None:
    server = server_factory(api_key="s3cret-key")
    with pytest.raises(openai.AuthenticationError):
        server.client(api_key="wrong").models.list()
    with server.http() as h:
        for headers in ({"Authorization": ""}, {"Authorization": "Basic s3cret-key"},
                        {"Authorization": "Bearer s3cret-key2"}):
            r = h.get("/v1/models", headers=headers)
            assert r.status_code == 401 and _error(r)["code"] == "invalid_api_key"
            r = h.post("/v1/moescope/cache", json={"policy": "exact"}, headers=headers)
            assert r.status_code == 401
        assert h.get("/health", headers={"Authorization": ""}).status_code == 200
    r = server.client().chat.completions.create(model="moescope-demo-qwen3moe",
                                                messages=HELLO, max_tokens=2)
    assert r.usage is not None and r.usage.completion_tokens >= 1


def test_serving_beyond_loopback_needs_a_key_and_says_so() -> None:
    import subprocess

    out = subprocess.run(serve_command("--host", "0.0.0.0", "--port", "8099"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    assert "--api-key" in out.stderr and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1] == (
        "moescope: error: --host 0.0.0.0 makes the model reachable from other machines: "
        "give an --api-key (or set MOESCOPE_API_KEY), or --insecure-no-api-key to serve it "
        "to anyone who can reach this port")
    out = subprocess.run(serve_command("--port", "70000"), capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--port" in out.stderr
    # a typo is no address of this machine: named as such, not as reaching others
    out = subprocess.run(serve_command("--host", "127.0.0.l", "--port", "8099"),
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines()[-1].startswith(
        "moescope: error: --host 127.0.0.l is not an address of this machine")


def test_a_refused_exposure_carries_the_host_for_each_front_end_to_word() -> None:
    """check_exposure's refusal named the CLI's flags, so the window checked exposure
    again itself to speak of its own fields; the refusal now carries the host and each
    front end words it (the CLI above, the window in tests/gui/test_serve.py)."""
    from moescope.server.run import ExposureRefused, check_exposure

    for host in ("0.0.0.0", "192.168.1.5", "::", "example.org"):
        with pytest.raises(ExposureRefused) as refused:
            check_exposure(host, None, insecure=False)
        assert refused.value.host == host
        assert "--" not in str(refused.value) and host in str(refused.value)
        assert check_exposure(host, "a-key", insecure=False) is None
        assert "WITHOUT AN API KEY" in (check_exposure(host, None, insecure=True) or "")
    for host in ("127.0.0.1", "::1", "localhost"):
        assert check_exposure(host, None, insecure=False) is None


def test_a_port_in_use_is_one_line(server: Server) -> None:
    import subprocess

    out = subprocess.run(serve_command("--port", str(server.port)), capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2
    assert "in use" in out.stderr and "Traceback" not in out.stderr


def test_stream_options_without_stream_is_refused_in_openais_words(server: Server) -> None:
    """OpenAI refuses it; the openai client sends it only when the caller asks."""
    with server.http() as h:
        r = h.post("/v1/completions", json={"prompt": "ROMEO:", "max_tokens": 2,
                                            "stream_options": {"include_usage": True}})
    assert r.status_code == 400, r.text
    err = _error(r)
    assert err["param"] == "stream_options"
    assert err["message"] == "stream_options is only allowed when stream is true"


def test_web_search_is_refused_naming_the_field(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        server.client().chat.completions.create(
            model="moescope-demo-qwen3moe", messages=HELLO,  # type: ignore[arg-type]
            web_search_options={"search_context_size": "low"})
    assert caught.value.body["param"] == "web_search_options"  # type: ignore[index]
    assert "web search" in caught.value.body["message"]  # type: ignore[index]


def test_fields_the_server_does_not_know_are_ignored(server: Server) -> None:
    """As llama-server: clients add vendor fields (``cache_prompt``, ``user``,
    ``metadata``, ``store``...) freely; what a known field asks for and the server cannot
    give is a 400 (the lists above)."""
    base = {"messages": HELLO, "max_tokens": 6, "temperature": 0}
    with server.http() as h:
        plain = h.post("/v1/chat/completions", json=base)
        extra = h.post("/v1/chat/completions", json={
            **base, "cache_prompt": True, "user": "u1", "metadata": {"a": "b"},
            "store": False, "verbosity": "medium", "some_vendor_field": [1, 2]})
    assert plain.status_code == extra.status_code == 200, extra.text
    assert extra.json()["choices"][0]["message"] == plain.json()["choices"][0]["message"]
