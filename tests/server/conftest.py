"""Real server processes on 127.0.0.1 (free ports), driven over HTTP.

Each server is ``moescope serve`` in a child process, as a user starts it; tests talk to
it with the official ``openai`` client or raw HTTP (httpx) where the client hides what
is tested (status codes, headers, a dropped connection).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from server_helpers import Server, start_server, stop_server

pytestmark = pytest.mark.engine


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    from moescope.engine.bindings import is_patched

    if not is_patched():
        skip = pytest.mark.skip(reason="the patched engine is not installed (make engine)")
        for item in items:
            if "tests/server" in str(item.fspath):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def server_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., Server]]:
    """``server_factory(*args, api_key=..., model=...)``: started once per distinct
    arguments in the session, stopped at its end."""
    started: dict[tuple[object, ...], Server] = {}
    tmp = tmp_path_factory.mktemp("serve")

    def get(*args: str, api_key: str | None = None, model: Path | None = None,
            copy_delay_us: int = 0) -> Server:
        key = (args, api_key, model, copy_delay_us)
        if key not in started or not started[key].alive():
            started[key] = start_server(tmp, *args, api_key=api_key, model=model,
                                        copy_delay_us=copy_delay_us)
        return started[key]

    yield get
    for server in started.values():
        stop_server(server)


@pytest.fixture
def server(server_factory: Callable[..., Server]) -> Server:
    """The demo model under the exact policy (answers depend on the seed only)."""
    s = server_factory("--policy", "exact", "--max-body", "1")
    s.wait_idle()
    return s
