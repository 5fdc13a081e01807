"""A model file whose name is not UTF-8 is served: its id is the name with that byte
written ``\\xff`` (JSON carries UTF-8 only; the id was a 500 on every route), and a client
that sends that id back is answered."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable

import pytest
from server_helpers import Server

from moescope.util.resources import demo_model_path

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.fixture
def odd(server_factory: Callable[..., Server],
        tmp_path_factory: pytest.TempPathFactory) -> Server:
    path = tmp_path_factory.getbasetemp() / os.fsdecode(b"demo-\xff.gguf")
    if not path.exists():
        shutil.copyfile(demo_model_path(), path)
    return server_factory("--ctx", "256", "--policy", "exact", model=path)


def test_a_model_named_in_bytes_that_are_not_utf8_is_served(odd: Server) -> None:
    c = odd.client()
    [model] = c.models.list().data
    assert model.id == "demo-\\xff"
    chat = c.chat.completions.create(model=model.id, max_tokens=3, temperature=0,
                                     messages=[{"role": "user", "content": "Hi"}])
    assert chat.model == "demo-\\xff" and chat.usage is not None
    assert chat.usage.completion_tokens >= 1
    raw = c.completions.create(model="demo-\\xff.gguf", prompt="ROMEO:", max_tokens=3,
                               temperature=0)
    assert raw.usage is not None and raw.usage.completion_tokens >= 1
    with odd.http() as h:
        r = h.get("/v1/moescope/cache")
        assert r.status_code == 200 and r.json()["model"] == "demo-\\xff"
    assert "demo-\\xff" in odd.log
