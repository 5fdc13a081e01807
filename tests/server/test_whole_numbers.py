"""A whole number written with a decimal point (``100.0``, what a client that computes
it sends) is that number, as llama-server reads it: it was a 400 saying
"max_tokens must be a whole number ..., got 100.0"."""

from __future__ import annotations

import pytest
from server_helpers import Server

pytestmark = [pytest.mark.engine, pytest.mark.slow]

HELLO = [{"role": "user", "content": "Hello"}]


def test_whole_numbers_with_a_decimal_point_are_read(server: Server) -> None:
    with server.http() as h:
        r = h.post("/v1/chat/completions", json={
            "messages": HELLO, "max_tokens": 3.0, "seed": 7.0, "top_k": 5.0,
            "logprobs": True, "top_logprobs": 2.0})
        assert r.status_code == 200, r.text
        whole = r.json()
        assert whole["usage"]["completion_tokens"] == 3
        assert len(whole["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 2
        again = h.post("/v1/chat/completions", json={
            "messages": HELLO, "max_tokens": 3, "seed": 7, "top_k": 5}).json()
        assert again["choices"][0]["message"] == whole["choices"][0]["message"]
        r = h.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2.0,
                                            "logprobs": 1.0})
        assert r.status_code == 200, r.text
        assert len(r.json()["choices"][0]["logprobs"]["tokens"]) == 2


@pytest.mark.parametrize("value", [2.5, 1e300, "3", True])
def test_a_fraction_or_a_number_out_of_range_is_still_400(server: Server,
                                                          value: object) -> None:
    with server.http() as h:
        r = h.post("/v1/chat/completions", json={"messages": HELLO, "max_tokens": value})
    assert r.status_code == 400 and r.json()["error"]["param"] == "max_tokens"
