"""``--cors-origin URL``: web pages of the origins a user names may call the server from a
browser (preflights answered, answers readable), with or without an API key; any other
page is refused as before, and no origin is allowed unless named (never ``*``)."""

from __future__ import annotations

import subprocess
from collections.abc import Callable

import pytest
from server_helpers import Server, free_port, serve_command

pytestmark = [pytest.mark.engine, pytest.mark.slow]

PAGE = "http://chat.example.org:3000"
OTHER = "http://evil.example"
HELLO = {"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 2, "seed": 1}


def _preflight(server: Server, origin: str) -> object:
    with server.http() as h:
        h.headers.pop("Authorization", None)  # a browser's preflight carries no key
        return h.options("/v1/chat/completions", headers={
            "Origin": origin, "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "authorization, content-type, x-stainless-os"})


@pytest.fixture
def page_server(server_factory: Callable[..., Server]) -> Server:
    # given with a trailing slash: a browser's Origin has none
    return server_factory("--policy", "exact", "--cors-origin", PAGE + "/",
                          "--cors-origin", "http://localhost:5173")


def test_a_named_origins_preflight_and_request_are_answered(page_server: Server) -> None:
    r = _preflight(page_server, PAGE)
    assert r.status_code == 200, r.text  # type: ignore[attr-defined]
    headers = r.headers  # type: ignore[attr-defined]
    assert headers["access-control-allow-origin"] == PAGE
    assert "POST" in headers["access-control-allow-methods"]
    assert "authorization" in headers["access-control-allow-headers"].lower()
    with page_server.http() as h:
        r = h.post("/v1/chat/completions", json=HELLO, headers={"Origin": PAGE})
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == PAGE
        assert r.json()["choices"][0]["message"]["role"] == "assistant"
        # streamed answers too
        r = h.post("/v1/chat/completions", json={**HELLO, "stream": True},
                   headers={"Origin": PAGE})
        assert r.status_code == 200 and r.text.endswith("data: [DONE]\n\n")
        assert r.headers["access-control-allow-origin"] == PAGE


def test_another_origin_is_still_refused(page_server: Server) -> None:
    r = _preflight(page_server, OTHER)
    assert r.status_code == 400  # type: ignore[attr-defined]
    assert "access-control-allow-origin" not in r.headers  # type: ignore[attr-defined]
    with page_server.http() as h:
        r = h.post("/v1/moescope/cache", content='{"policy": "speed-first"}',
                   headers={"Origin": OTHER, "Content-Type": "text/plain"})
    assert r.status_code == 403 and r.json()["error"]["code"] == "cross_origin_refused"
    assert "access-control-allow-origin" not in r.headers
    assert page_server.cache()["policy"] == "exact"


def test_without_the_flag_no_origin_is_allowed(server: Server) -> None:
    r = _preflight(server, PAGE)
    assert "access-control-allow-origin" not in r.headers  # type: ignore[attr-defined]
    assert r.status_code == 405  # type: ignore[attr-defined]
    with server.http() as h:
        r = h.post("/v1/chat/completions", json=HELLO, headers={"Origin": PAGE})
    assert r.status_code == 403 and "--cors-origin" in r.json()["error"]["message"]
    assert "access-control-allow-origin" not in r.headers


def test_with_an_api_key_a_named_page_still_needs_the_key(
        server_factory: Callable[..., Server]) -> None:
    server = server_factory("--policy", "exact", "--cors-origin", PAGE, api_key="s3cret")
    r = _preflight(server, PAGE)  # no key in a preflight: answered all the same
    assert r.status_code == 200  # type: ignore[attr-defined]
    assert r.headers["access-control-allow-origin"] == PAGE  # type: ignore[attr-defined]
    with server.http() as h:
        r = h.post("/v1/chat/completions", json=HELLO, headers={"Origin": PAGE})
        assert r.status_code == 200, r.text
        assert r.headers["access-control-allow-origin"] == PAGE
        del h.headers["Authorization"]
        r = h.post("/v1/chat/completions", json=HELLO, headers={"Origin": PAGE})
        # the page can read why (the header is there), and gets nothing else
        assert r.status_code == 401
        assert r.headers["access-control-allow-origin"] == PAGE


@pytest.mark.parametrize(("origin", "says"), [
    ("*", "name each origin"), ("https://*.example.org", "name each origin"),
    ("chat.example.org", "is not an origin"), ("http://x.org/app", "is not an origin"),
    ("file:///tmp/page.html", "is not an origin"),
])
def test_a_wildcard_or_a_url_that_is_no_origin_is_refused_before_loading(
        origin: str, says: str) -> None:
    r = subprocess.run(serve_command("--port", str(free_port()), "--cors-origin", origin),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and says in lines[0], r.stderr
