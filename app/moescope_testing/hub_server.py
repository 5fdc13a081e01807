"""A small stand-in for the Hugging Face Hub on 127.0.0.1, for tests of moescope.hub.

It serves the routes MoEScope calls (``/api/models`` search, ``/api/models/REPO/tree/REV``
listing with ``Link`` pagination, ``/REPO/resolve/REV/PATH`` with range requests) in the
Hub's JSON shapes, for files on disk (synthetic GGUFs), and it counts what it sends so a
test can assert that a header read fetched a few MB and not the file. Faults on demand:
a gated repository (401 without a token, 403 with the wrong one), a connection dropped
after N bytes, corrupted bytes, a response held at a chosen byte until the test lets it go
(so two downloads overlap in a known order). Point ``HF_ENDPOINT`` (or
``HubClient(endpoint=...)``) at ``server.endpoint``.
"""

from __future__ import annotations

import hashlib
import json
import re
import socket
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

_RANGE = re.compile(r"^bytes=(\d+)-(\d*)$")


@dataclass
class HubFile:
    path: Path
    size: int
    sha256: str


@dataclass
class Pause:
    """Hold a response to a request for ``key`` with the ``Range`` header ``range`` (None:
    none, the whole file) before it sends byte ``at`` (of the file), until ``go`` is set;
    ``reached`` is set when it waits. With ``drop`` the connection is closed there instead
    of going on."""

    key: str
    range: str | None
    at: int
    drop: bool = False
    go: threading.Event = field(default_factory=threading.Event)
    reached: threading.Event = field(default_factory=threading.Event)


@dataclass
class HubRepo:
    repo_id: str
    files: dict[str, HubFile] = field(default_factory=dict)
    gated: bool = False
    token: str | None = None
    """The one token a gated repository lets in."""
    architecture: str | None = None
    downloads: int = 0


class HubServer:
    """``with HubServer() as hub: hub.add_file("me/repo", "m.gguf", path)``."""

    def __init__(self) -> None:
        self.repos: dict[str, HubRepo] = {}
        self.served: dict[str, int] = defaultdict(int)
        """Body bytes sent per ``REPO/PATH``."""
        self.ranges: list[tuple[str, str | None]] = []
        """``(REPO/PATH, Range header)`` of every file request, in order."""
        self.queries: list[dict[str, list[str]]] = []
        """Query parameters of every search."""
        self.drop_after: dict[str, int] = {}
        """``REPO/PATH`` -> bytes to send before closing the connection (once)."""
        self.corrupt: set[str] = set()
        """``REPO/PATH`` whose served bytes have one byte flipped."""
        self.pauses: list[Pause] = []
        """Responses to hold at a byte (each applies to every matching request)."""
        self.page_size = 1000
        self.lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def __enter__(self) -> HubServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(5)

    def add_file(self, repo_id: str, path_in_repo: str, path: str | Path, *,
                 sha256: str | None = None, **repo: Any) -> HubFile:
        """Serve ``path`` as ``repo_id``'s ``path_in_repo``; ``sha256`` as listed (default:
        the real one; give one for a huge sparse file that is never downloaded)."""
        p = Path(path)
        digest = sha256 or _sha256(p)
        r = self.repos.setdefault(repo_id, HubRepo(repo_id))
        for key, value in repo.items():
            setattr(r, key, value)
        f = HubFile(path=p, size=p.stat().st_size, sha256=digest)
        r.files[path_in_repo] = f
        return f

    def pause(self, key: str, *, range: str | None, at: int, drop: bool = False) -> Pause:
        """Hold responses for ``key`` asked with ``Range: range`` before byte ``at``."""
        p = Pause(key, range, at, drop)
        with self.lock:
            self.pauses.append(p)
        return p


def closed_port_endpoint() -> str:
    """An endpoint where nothing listens: what "no network" looks like to a client."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _handler(hub: HubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            path = unquote(url.path)
            query = parse_qs(url.query)
            if path == "/api/models":
                return self._search(query)
            m = re.match(r"^/api/models/([^/]+/[^/]+)/tree/([^/]+)/?$", path)
            if m:
                return self._tree(m[1], query)
            m = re.match(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$", path)
            if m:
                return self._file(m[1], m[3])
            self._json(404, {"error": "no such route"})

        def _json(self, code: int, body: Any, headers: dict[str, str] | None = None) -> None:
            raw = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            self.end_headers()
            self.wfile.write(raw)

        def _search(self, query: dict[str, list[str]]) -> None:
            with hub.lock:
                hub.queries.append(query)
            text = (query.get("search") or [""])[0].lower()
            limit = int((query.get("limit") or ["1000"])[0])
            hits = [r for r in hub.repos.values() if text in r.repo_id.lower()]
            hits.sort(key=lambda r: -r.downloads)
            self._json(200, [{"id": r.repo_id, "downloads": r.downloads, "likes": 1,
                              "gated": "manual" if r.gated else False,
                              "gguf": ({"architecture": r.architecture}
                                       if r.architecture else {})}
                             for r in hits[:limit]])

        def _tree(self, repo_id: str, query: dict[str, list[str]]) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._json(404, {"error": "Repository not found"},
                                  {"X-Error-Code": "RepoNotFound"})
            entries = [{"type": "file", "oid": hashlib.sha1(name.encode()).hexdigest(),
                        "size": f.size, "path": name,
                        "lfs": {"oid": f.sha256, "size": f.size, "pointerSize": 134}}
                       for name, f in sorted(repo.files.items())]
            entries.insert(0, {"type": "file", "oid": "0" * 40, "size": 12,
                               "path": "README.md"})
            start = int((query.get("cursor") or ["0"])[0])
            page = entries[start:start + hub.page_size]
            headers = {}
            if start + hub.page_size < len(entries):
                nxt = (f"{hub.endpoint}/api/models/{repo_id}/tree/main?recursive=true"
                       f"&cursor={start + hub.page_size}")
                headers["Link"] = f'<{nxt}>; rel="next"'
            self._json(200, page, headers)

        def _file(self, repo_id: str, name: str) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._json(404, {"error": "Repository not found"},
                                  {"X-Error-Code": "RepoNotFound"})
            if repo.gated:
                auth = self.headers.get("Authorization")
                if auth != f"Bearer {repo.token}":
                    return self._json(401 if auth is None else 403,
                                      {"error": "Access to this model is restricted"},
                                      {"X-Error-Code": "GatedRepo"})
            f = repo.files.get(name)
            if f is None:
                return self._json(404, {"error": "Entry not found"},
                                  {"X-Error-Code": "EntryNotFound"})
            key = f"{repo_id}/{name}"
            rng = self.headers.get("Range")
            with hub.lock:
                hub.ranges.append((key, rng))
                drop = hub.drop_after.pop(key, None)
            start, end = 0, f.size
            m = _RANGE.match(rng or "")
            if m:
                start = int(m[1])
                end = min(int(m[2]) + 1, f.size) if m[2] else f.size
                if start >= f.size:
                    self.send_response(416)
                    self.send_header("Content-Range", f"bytes */{f.size}")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end - 1}/{f.size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - start))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("ETag", f'"{f.sha256}"')
            self.end_headers()
            budget = end - start if drop is None else min(drop, end - start)
            flip = (f.size // 2) if key in hub.corrupt else -1
            with hub.lock:
                holds = sorted((p for p in hub.pauses if p.key == key and p.range == rng),
                               key=lambda p: p.at)
            with f.path.open("rb") as src:
                src.seek(start)
                pos = start
                while pos < start + budget:
                    while holds and holds[0].at <= pos:
                        self.wfile.flush()
                        hold = holds.pop(0)
                        hold.reached.set()
                        hold.go.wait(60)
                        if hold.drop:
                            budget = pos - start
                            drop = budget
                    if pos >= start + budget:
                        break
                    stop = min(start + budget, holds[0].at) if holds else start + budget
                    block = bytearray(src.read(min(1 << 16, stop - pos)))
                    if not block:
                        break
                    if pos <= flip < pos + len(block):
                        block[flip - pos] ^= 0xFF
                    try:
                        self.wfile.write(block)
                    except OSError:
                        return
                    with hub.lock:
                        hub.served[key] += len(block)
                    pos += len(block)
            if drop is not None:
                self.wfile.flush()
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)

    return Handler


def file_key(repo_id: str, path_in_repo: str) -> str:
    """The key of :attr:`HubServer.served`, :attr:`~HubServer.drop_after` and
    :attr:`~HubServer.corrupt` for a file."""
    return f"{repo_id}/{path_in_repo}"


__all__ = ["HubFile", "HubRepo", "HubServer", "Pause", "closed_port_endpoint", "file_key"]
