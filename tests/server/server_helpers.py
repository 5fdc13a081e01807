"""A real ``moescope serve`` child process and ways to talk to it (see conftest)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx2 as httpx

from moescope.util.resources import demo_model_path

START_TIMEOUT_S = 90.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def serve_command(*args: str) -> list[str]:
    return [sys.executable, "-c", "import sys; from moescope.cli import main; "
            "sys.exit(main())", "serve", *args]


@dataclass
class Server:
    """A running ``moescope serve`` child process."""

    process: subprocess.Popen[bytes]
    port: int
    log_path: Path
    api_key: str | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def client(self, **kwargs: object):  # type: ignore[no-untyped-def]
        import openai

        kwargs.setdefault("api_key", self.api_key or "none")
        kwargs.setdefault("max_retries", 0)
        kwargs.setdefault("timeout", 60.0)
        return openai.OpenAI(base_url=self.base_url, **kwargs)  # type: ignore[arg-type]

    def http(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        return httpx.Client(base_url=f"http://127.0.0.1:{self.port}", headers=headers,
                            timeout=60.0)

    def cache(self) -> dict:  # type: ignore[type-arg]
        with self.http() as h:
            r = h.get("/v1/moescope/cache")
            r.raise_for_status()
            return r.json()  # type: ignore[no-any-return]

    def wait_idle(self, timeout_s: float = 30.0) -> dict:  # type: ignore[type-arg]
        """The cache state once no request runs or waits."""
        deadline = time.monotonic() + timeout_s
        while True:
            state = self.cache()
            q = state["queue"]
            if q["running"] is None and q["waiting"] == 0:
                return state
            assert time.monotonic() < deadline, f"the server stayed busy: {state}"
            time.sleep(0.05)

    def alive(self) -> bool:
        return self.process.poll() is None


def start_server(tmp: Path, *args: str, api_key: str | None = None,
                 model: Path | None = None, copy_delay_us: int = 0) -> Server:
    """``copy_delay_us``: each expert copy sleeps up to that long (the engine's test
    hook), so an answer lasts long enough to act on while it generates."""
    port = free_port()
    log_path = tmp / f"serve-{port}.log"
    argv = [str(model or demo_model_path()), "--port", str(port), "--threads", "2", *args]
    if api_key:
        argv += ["--api-key", api_key]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("MOESCOPE_API_KEY", None)
    env["MOESCOPE_TEST_COPY_DELAY_US"] = str(copy_delay_us)
    with log_path.open("wb") as log:
        process = subprocess.Popen(serve_command(*argv), stdout=log,
                                   stderr=subprocess.STDOUT, env=env)
    server = Server(process, port, log_path, api_key)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        if process.poll() is not None:
            raise AssertionError(f"moescope serve exited {process.returncode}:\n{server.log}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1.0).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"moescope serve did not start:\n{server.log}")
        time.sleep(0.1)


def stop_server(server: Server) -> None:
    server.process.terminate()
    try:
        server.process.wait(timeout=15)
    except subprocess.TimeoutExpired:
        server.process.kill()
        server.process.wait()
