"""A request to a path the server does not serve, or with the wrong method, gets an
OpenAI-style error that says what is served: 501 for an OpenAI endpoint it does not
implement (as llama.cpp's server answers /v1/embeddings), 404 ``unknown_url`` for any
other path (OpenAI's code), 405 naming the method to use. They were a bare "Not Found"
or "Method Not Allowed"."""

from __future__ import annotations

import openai
import pytest
from server_helpers import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

SERVED = ("this server serves POST /v1/chat/completions and POST /v1/completions (and GET "
          "/v1/models)")


def _error(r) -> dict:  # type: ignore[no-untyped-def, type-arg]
    body = r.json()
    assert set(body) == {"error"}, body
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert "\n" not in body["error"]["message"]
    return body["error"]  # type: ignore[no-any-return]


@pytest.mark.parametrize(("method", "path", "what"), [
    ("POST", "/v1/embeddings", "embeddings"),
    ("POST", "/v1/audio/transcriptions", "audio (speech, transcriptions)"),
    ("POST", "/v1/audio/speech", "audio (speech, transcriptions)"),
    ("POST", "/v1/images/generations", "images"),
    ("POST", "/v1/responses", "the Responses API"),
    ("GET", "/v1/responses/resp_1", "the Responses API"),
    ("POST", "/v1/moderations", "moderations"),
    ("GET", "/v1/files", "files"),
])
def test_an_openai_endpoint_not_served_is_501_saying_what_is(
        server: Server, method: str, path: str, what: str) -> None:
    with server.http() as h:
        r = h.request(method, path, json={"model": "x", "input": "hello"})
    assert r.status_code == 501
    assert r.headers["x-should-retry"] == "false"
    err = _error(r)
    assert err["message"] == f"{method} {path}: {SERVED}; it does not serve {what}"
    assert err["type"] == "not_supported_error" and err["code"] == "not_implemented"


def test_the_openai_client_gets_the_501_at_once_without_retrying(server: Server) -> None:
    """The openai client retries a 5xx twice (with back-off) unless told not to."""
    sent: list[str] = []
    http = openai.DefaultHttpxClient(event_hooks={"request": [lambda r: sent.append(
        str(r.url))]})
    client = server.client(max_retries=2, http_client=http)
    with pytest.raises(openai.APIStatusError) as err:
        client.embeddings.create(model="m", input="hello")
    assert err.value.status_code == 501 and len(sent) == 1
    assert "it does not serve embeddings" in err.value.message


@pytest.mark.parametrize(("path", "hint"), [
    ("/v1/engines", ""), ("/", ""), ("/v1/chat", ""),
    ("/v2/chat/completions", " (the base URL must end in /v1: http://HOST:PORT/v1)"),
    ("/chat/completions", " (the base URL must end in /v1: http://HOST:PORT/v1)"),
    ("/models", " (the base URL must end in /v1: http://HOST:PORT/v1)"),
])
def test_an_unknown_path_is_404_unknown_url_saying_what_is_served(
        server: Server, path: str, hint: str) -> None:
    with server.http() as h:
        r = h.post(path, json={})
    assert r.status_code == 404
    err = _error(r)
    assert err["message"] == f"unknown URL POST {path}: {SERVED}{hint}"
    assert err["code"] == "unknown_url" and err["type"] == "invalid_request_error"


@pytest.mark.parametrize(("method", "path", "use"), [
    ("GET", "/v1/chat/completions", "POST"),
    ("PUT", "/v1/completions", "POST"),
    ("POST", "/v1/models", "GET"),
    ("DELETE", "/v1/moescope/cache", "GET or POST"),
])
def test_a_wrong_method_is_405_naming_the_one_to_use(server: Server, method: str,
                                                     path: str, use: str) -> None:
    with server.http() as h:
        r = h.request(method, path)
    assert r.status_code == 405 and use.split(" or ")[0] in r.headers["allow"]
    err = _error(r)
    assert err["message"] == f"{method} {path} is not allowed: use {use}"
    assert err["code"] == "method_not_allowed"


def test_a_base_url_ending_in_a_slash_is_served_not_redirected(server: Server) -> None:
    """``POST /v1/chat/completions/`` was a 307 with no body (curl printed nothing, and
    many clients drop a POST's body on a redirect); ``GET /v1/models/`` was "the model ''
    does not exist here"."""
    with server.http() as h:
        for path in ("/v1/chat/completions/", "/v1/completions/"):
            body = {"messages": [{"role": "user", "content": "Hi"}]} if "chat" in path \
                else {"prompt": "Hi"}
            r = h.post(path, json={**body, "max_tokens": 2})
            assert r.status_code == 200, (path, r.text)
            assert r.json()["usage"]["completion_tokens"] == 2
        r = h.get("/v1/models/")
        assert r.status_code == 200 and r.json()["object"] == "list"


def test_a_base_url_ending_in_an_endpoint_says_where_it_should_end(server: Server) -> None:
    client = openai.OpenAI(base_url=server.base_url + "/chat/completions", api_key="none",
                           max_retries=0)
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}])
    assert err.value.message.endswith(
        "unknown URL POST /v1/chat/completions/chat/completions: "
        f"{SERVED} (the base URL must end in /v1: http://HOST:PORT/v1)")
