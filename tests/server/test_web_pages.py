"""Without an API key, requests a web page makes are refused: a page open in the user's
browser could otherwise post to the server (a form's text/plain body needs no CORS
preflight) and steer the cache, or read answers through a DNS name it points at
127.0.0.1. Clients that are not browsers send no ``Origin`` and use an address."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from server_helpers import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

STEER = '{"policy": "speed-first"}'


@pytest.mark.parametrize("origin", ["http://evil.example", "null",
                                    "http://127.0.0.1.evil.example:8080", "http://[bad"])
def test_a_post_from_another_site_is_403_and_changes_nothing(server: Server,
                                                             origin: str) -> None:
    before = server.cache()["policy"]
    with server.http() as h:
        r = h.post("/v1/moescope/cache", content=STEER,
                   headers={"Origin": origin, "Content-Type": "text/plain"})
        assert r.status_code == 403, r.text
        err = r.json()["error"]
        assert err["code"] == "cross_origin_refused" and err["type"] == "permission_error"
        assert "start it with --api-key KEY" in err["message"]
        r = h.post("/v1/chat/completions", headers={"Origin": origin},
                   json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
        assert r.status_code == 403
    assert server.cache()["policy"] == before


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8080", "[bad"])
def test_a_host_that_is_a_name_is_403(server: Server, host: str) -> None:
    """DNS rebinding: a site's own name, pointed at 127.0.0.1, makes the page
    same-origin with the server (no Origin header on a GET)."""
    with server.http() as h:
        r = h.get("/v1/models", headers={"Host": host})
    assert r.status_code == 403 and r.json()["error"]["code"] == "host_refused"


@pytest.mark.parametrize(("headers"), [
    {}, {"Origin": "http://localhost:3000"}, {"Origin": "http://127.0.0.1:5173"},
    {"Host": "localhost"}, {"Host": "127.0.0.1:9"}, {"Host": "192.168.1.20:8080"},
    {"Host": "[::1]:8080"}, {"Origin": "http://[::1]:8000", "Host": "app.localhost"},
])
def test_this_machines_pages_and_addresses_are_served(server: Server,
                                                      headers: dict[str, str]) -> None:
    with server.http() as h:
        r = h.get("/v1/models", headers=headers)
    assert r.status_code == 200, r.text


def test_with_an_api_key_the_key_decides(server_factory: Callable[..., Server]) -> None:
    """A site cannot know the key: with one, a page's request is answered as any other."""
    server = server_factory("--policy", "exact", api_key="s3cret")
    with server.http() as h:
        r = h.get("/v1/models", headers={"Origin": "http://evil.example",
                                         "Host": "example.org"})
        assert r.status_code == 200
    with server.http() as h:
        del h.headers["Authorization"]
        r = h.get("/v1/models", headers={"Origin": "http://evil.example"})
        assert r.status_code == 401
