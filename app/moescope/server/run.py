"""Running the app on uvicorn: in the foreground (``moescope serve``) or on a thread
(the window's *Serve API*), bound to loopback unless an API key guards it."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from typing import Any

from moescope.server.app import create_app
from moescope.server.service import Service
from moescope.util.errors import MoEScopeError

MAX_CONNECTIONS = 64
"""Open connections at once; uvicorn answers 503 past it (the queue bounds the work)."""
READ_TIMEOUT_S = 30
"""Seconds a client has to send a whole request (its head and body) from its first byte,
or from connecting: uvicorn has no such limit, so a client that sends its headers a byte
at a time, or never ends them, held its connection for good (``--read-timeout``)."""
READ_TIMEOUT_RANGE = (1, 3600)


def uvicorn_config(app: Any, host: str, port: int, *, read_timeout_s: float = READ_TIMEOUT_S,
                   **kwargs: Any) -> Any:
    """The ``uvicorn.Config`` both front ends serve with (``moescope serve`` and the
    window's *Serve API*): quiet, connections bounded, idle keep-alives closed after 5 s,
    and a request not read whole within ``read_timeout_s`` dropped."""
    import uvicorn

    return uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                          limit_concurrency=MAX_CONNECTIONS, timeout_keep_alive=5,
                          timeout_graceful_shutdown=2, http=timed_protocol(read_timeout_s),
                          **kwargs)


def timed_protocol(read_timeout_s: float) -> type:
    """uvicorn's h11 protocol with a deadline on reading each request: armed at the
    connection and at a request's first byte, cleared once the request is read whole (an
    answer then takes as long as it takes), the connection closed when it passes."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class TimedH11Protocol(H11Protocol):  # type: ignore[misc]
        _deadline: Any = None

        def connection_made(self, transport: Any) -> None:
            super().connection_made(transport)
            self._watch()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self._watch()

        def connection_lost(self, exc: Exception | None) -> None:
            self._clear()
            super().connection_lost(exc)

        def _watch(self) -> None:
            reading = self.conn.their_state in (h11.IDLE, h11.SEND_BODY)
            if reading and not self.transport.is_closing():
                if self._deadline is None:
                    self._deadline = self.loop.call_later(read_timeout_s, self._passed)
            else:
                self._clear()

        def _clear(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _passed(self) -> None:
            self._deadline = None
            if self.conn.their_state in (h11.IDLE, h11.SEND_BODY) \
                    and not self.transport.is_closing():
                self.transport.close()

    return TimedH11Protocol


def is_loopback(host: str) -> bool:
    """127.0.0.0/8, ::1 or ``localhost``: reachable from this machine only."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ExposureRefused(MoEScopeError):
    """Serving on :attr:`host` would let other machines reach the model without an API
    key. Each front end words the refusal in its own terms from :attr:`host`: the CLI
    with its ``--host``/``--api-key`` flags, the window with its panel's fields."""

    def __init__(self, host: str) -> None:
        super().__init__(f"{host} lets other machines reach the model, and no API key "
                         "guards it")
        self.host = host


def host_resolves(host: str) -> bool:
    """``host`` is an IP address or a name that resolves (one a server could bind); a typo
    such as ``127.0.0.l`` is not, and was refused as reaching other machines."""
    try:
        return bool(host) and bool(socket.getaddrinfo(host, None, type=socket.SOCK_STREAM))
    except (OSError, UnicodeError):
        return False


MAX_API_KEY = 1024
"""Longest API key: a bearer token is tens of characters."""


def check_api_key(source: str, key: str) -> None:
    """An API key a client can send: 1 to :data:`MAX_API_KEY` visible ASCII characters
    (an HTTP header carries no newline, and a client encodes no other byte alike), so a
    key that no request could match is not accepted into a server that answers nobody;
    ``--api-key ""`` (an unset ``$KEY``) served without a key, silently."""
    if not key:
        raise MoEScopeError(f"{source} is empty; give a key, or leave it out to serve "
                            "this machine without one")
    if len(key) > MAX_API_KEY:
        raise MoEScopeError(f"{source} is {len(key):,} characters; at most {MAX_API_KEY}")
    if not all("!" <= c <= "~" for c in key):
        raise MoEScopeError(f"{source} may hold only visible ASCII characters (no spaces, "
                            "newlines or other bytes): a client could not send it")


def check_exposure(host: str, api_key: str | None, insecure: bool) -> str | None:
    """Refuse to serve beyond this machine without a key (:class:`ExposureRefused`);
    returns a warning to print when ``insecure`` lets it happen anyway (None
    otherwise)."""
    if is_loopback(host) or api_key:
        return None
    if not insecure:
        raise ExposureRefused(host)
    return (f"WARNING: serving on {host} WITHOUT AN API KEY: anyone who can reach this "
            f"port can use the model and steer its cache")


MAX_CORS_ORIGINS = 32


def check_cors_origin(origin: str) -> str:
    """A ``--cors-origin`` as browsers send it in ``Origin``: ``scheme://host[:port]``,
    without a path (a trailing ``/`` is dropped) and never ``*`` (any site in the user's
    browser could then use the model)."""
    from urllib.parse import urlsplit

    text = origin.strip().rstrip("/")
    if text == "*" or "*" in text:
        raise MoEScopeError("--cors-origin * would let any site open in a browser use this "
                            "server: name each origin (e.g. https://chat.example.org)")
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname \
            or parts.path or parts.query or parts.fragment or parts.username \
            or parts.password or not text.isprintable():
        shown = origin if len(origin) <= 60 else origin[:57] + "..."
        raise MoEScopeError(f"--cors-origin {shown!r} is not an origin: give "
                            "scheme://host[:port], e.g. http://localhost:3000")
    host = parts.hostname
    host = f"[{host}]" if ":" in host else host
    default = {"http": 80, "https": 443}[parts.scheme]  # browsers leave it out
    return f"{parts.scheme}://{host}" + (f":{port}" if port not in (None, default) else "")


def check_port(port: int) -> None:
    if not 1 <= port <= 65535:
        raise MoEScopeError(f"--port {port} must be from 1 to 65535")


class ServerThread:
    """uvicorn serving ``service`` on a background thread; :meth:`stop` ends it."""

    def __init__(self, service: Service, host: str = "127.0.0.1", port: int = 8080,
                 api_key: str | None = None, cors_origins: tuple[str, ...] = ()) -> None:
        import uvicorn

        check_port(port)
        self.service = service
        self.host, self.port = host, port
        config = uvicorn_config(create_app(service, api_key=api_key,
                                           cors_origins=cors_origins), host, port,
                                lifespan="on")
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, name="moescope-api",
                                        daemon=True)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/v1"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start serving; raises when the port cannot be bound within ``timeout_s``."""
        self._thread.start()
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if not self._thread.is_alive():
                raise MoEScopeError(f"cannot serve on {self.host}:{self.port} (is the port "
                                    "in use?)")
            if time.monotonic() > deadline:
                self.stop()
                raise MoEScopeError(f"the server did not start within {timeout_s:g} s")
            time.sleep(0.02)

    def stop(self) -> None:
        """Stop serving: running answers stop after their current token."""
        self.server.should_exit = True
        for turn in self.service.queue.waiting():
            self.service.queue.cancel(turn)
        if self._thread.is_alive():
            self._thread.join(timeout=10)

    @property
    def running(self) -> bool:
        return self._thread.is_alive()


def port_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound now (checked before loading a model)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True
