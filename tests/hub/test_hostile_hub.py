"""A broken or hostile Hub endpoint (``HF_ENDPOINT``: a mirror, a proxy), found by the second
hostile-input campaign. Each answer below used to end ``moescope pull`` in a traceback, a
MemoryError or an endless loop; each is now one ``HubError`` line, and nothing is written
outside the models folder."""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest

from moescope.cli import main
from moescope.hub.download import download_model
from moescope.hub.errors import DownloadInterrupted, HubError
from moescope.hub.remote import MAX_JSON_BYTES, HubClient
from moescope.util import paths

REPO = "me/repo"


class HostileHub:
    """``tree``: the body of the file list (bytes, or a callable writing it); ``files``:
    path in the repository -> the bytes served for it (ranges honoured, 416 past the end,
    as the Hub does)."""

    def __init__(self, model: bytes) -> None:
        self.data = model
        self.sha = hashlib.sha256(model).hexdigest()
        self.tree: bytes | Callable[[Any], None] = b"[]"
        self.files: dict[str, bytes] = {}
        self.requests = 0
        self.content_range: Callable[[int, int, int], str | None] = \
            lambda start, stop, size: f"bytes {start}-{stop - 1}/{size}"
        """A 206's ``Content-Range`` for bytes ``[start, stop)`` of ``size`` (None: none)."""
        self.ranges: list[str | None] = []
        """The ``Range`` header of every file request, in order."""
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                hub.requests += 1
                path = unquote(urlsplit(self.path).path)
                if path.startswith(f"/api/models/{REPO}/tree/"):
                    if callable(hub.tree):
                        self.send_response(200)
                        self.send_header("Connection", "close")
                        self.end_headers()
                        hub.tree(self.wfile)
                        return
                    return self._send(200, hub.tree)
                prefix = f"/{REPO}/resolve/main/"
                data = hub.files.get(path[len(prefix):]) if path.startswith(prefix) else None
                if data is None:
                    return self._send(404, b"{}")
                rng = self.headers.get("Range")
                hub.ranges.append(rng)
                if rng:
                    start = int(rng.removeprefix("bytes=").split("-")[0])
                    end = rng.removeprefix("bytes=").split("-")[1]
                    stop = min(int(end) + 1, len(data)) if end else len(data)
                    if start >= len(data):
                        return self._send(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                    said = hub.content_range(start, stop, len(data))
                    return self._send(206, data[start:stop],
                                      {} if said is None else {"Content-Range": said})
                return self._send(200, data)

            def _send(self, code: int, body: bytes,
                      headers: dict[str, str] | None = None) -> None:
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                with contextlib.suppress(OSError):
                    self.wfile.write(body)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._httpd.daemon_threads = True
        # a client that drops a response it refuses resets the connection: not a failure
        self._httpd.handle_error = lambda request, address: None  # type: ignore[method-assign]
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host}:{port}"

    def listing(self, *entries: tuple[str, int, str]) -> None:
        self.tree = json.dumps([{"type": "file", "path": p, "size": size, "lfs": {"oid": sha}}
                                for p, size, sha in entries]).encode()


@pytest.fixture
def hostile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
            tiny_moe: Path) -> Iterator[HostileHub]:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.setenv("HF_HUB_DISABLE_IMPLICIT_TOKEN", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")
    monkeypatch.setenv(paths.ENV_MODELS_DIR, str(tmp_path / "models"))
    hub = HostileHub(tiny_moe.read_bytes())
    hub._thread.start()
    monkeypatch.setenv("HF_ENDPOINT", hub.endpoint)
    yield hub
    hub._httpd.shutdown()
    hub._httpd.server_close()


def _one_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("moescope: error: ") and err.count("\n") == 1, err
    return err


def test_a_file_list_that_never_ends_is_refused_past_a_bound(
        hostile: HostileHub, capsys: pytest.CaptureFixture[str]) -> None:
    """The whole answer was read into memory: 3 GB of whitespace was a MemoryError."""
    def endless(out: Any) -> None:
        chunk = b" " * (1 << 20)
        try:
            out.write(b"[")
            for _ in range((MAX_JSON_BYTES >> 20) * 4):
                out.write(chunk)
        except OSError:  # the client stopped reading, as it should
            pass

    hostile.tree = endless
    err = _one_line(capsys, ["pull", REPO, "--check"])
    assert f"more than {MAX_JSON_BYTES >> 20} MiB" in err


def test_json_nested_past_the_parsers_depth_is_one_line(
        hostile: HostileHub, capsys: pytest.CaptureFixture[str]) -> None:
    hostile.tree = b"[" * 200_000 + b"]" * 200_000
    assert "is not JSON" in _one_line(capsys, ["pull", REPO, "--check"])


def test_a_path_with_a_lone_surrogate_is_skipped(hostile: HostileHub,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """``"\\udc80-Q8_0.gguf"`` parses to a string no URL can hold: quote() raised
    UnicodeEncodeError; such an entry is not a file that can be asked for."""
    hostile.tree = (b'[{"type": "file", "path": "\\udc80-Q8_0.gguf", "size": 10}]')
    assert main(["pull", REPO]) == 0
    assert "no GGUF model files" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["a" * 300 + "-Q8_0.gguf", "b" * 240 + "-Q8_0.gguf",
                                  "evil\nmoescope: error: spoofed-Q8_0.gguf"])
def test_a_name_that_cannot_be_a_file_here_is_one_line(
        hostile: HostileHub, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        name: str) -> None:
    """A name over 255 bytes (or one whose ``.incomplete`` is): ENAMETOOLONG from a
    stat, a traceback; a newline in a name wrote a file whose name spoofs an error line."""
    hostile.listing((name, len(hostile.data), hostile.sha))
    hostile.files[name] = hostile.data
    err = _one_line(capsys, ["pull", f"{REPO}:Q8_0", "--dir", str(tmp_path / "m")])
    assert "not downloaded" in err
    assert not list((tmp_path / "m").rglob("*.gguf*"))


def test_a_server_file_shorter_than_listed_ends_not_loops(hostile: HostileHub,
                                                          tmp_path: Path) -> None:
    """The listing gives the file's size, the server has half: the resume got 416, the download
    started over, stopped at the same byte, and (progress made each time) looped for
    ever. Now only bytes past the furthest reached count as progress."""
    hostile.listing(("m-Q8_0.gguf", len(hostile.data), hostile.sha))
    hostile.files["m-Q8_0.gguf"] = hostile.data[: len(hostile.data) // 2]
    client = HubClient()
    model = client.list_models(REPO)[0]
    raised: list[BaseException] = []
    stop = threading.Event()

    def run() -> None:
        try:
            download_model(client, model, tmp_path / "m", cancel=stop, retries=1)
        except BaseException as err:  # the test looks at what it was
            raised.append(err)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(30)
    stop.set()  # the old loop stops here at last, cancelled
    t.join(10)
    assert raised and isinstance(raised[0], DownloadInterrupted), raised
    assert hostile.requests < 10
    assert "run the download again" in str(raised[0]) and "\n" not in str(raised[0])
    assert not (tmp_path / "m" / "me" / "repo" / "m-Q8_0.gguf").exists()


def test_the_bounds_let_a_real_listing_through(hostile: HostileHub, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    hostile.listing(("sub/m-Q8_0.gguf", len(hostile.data), hostile.sha))
    hostile.files["sub/m-Q8_0.gguf"] = hostile.data
    models = HubClient().list_models(REPO)
    assert [m.name for m in models] == ["sub/m-Q8_0.gguf"]
    path = download_model(HubClient(), models[0], tmp_path / "m")
    assert path.read_bytes() == hostile.data
    with pytest.raises(HubError):
        hostile.tree = b"[" * 200_000
        HubClient().list_models(REPO)



def _resume_from(hostile: HostileHub, tmp_path: Path, have: int) -> Path:
    """A listed model of which ``have`` bytes were downloaded before: its partial file."""
    hostile.listing(("m-Q8_0.gguf", len(hostile.data), hostile.sha))
    hostile.files["m-Q8_0.gguf"] = hostile.data
    part = tmp_path / "m" / "me" / "repo" / "m-Q8_0.gguf.incomplete"
    part.parent.mkdir(parents=True)
    part.write_bytes(hostile.data[:have])
    return part


@pytest.mark.parametrize(("said", "says"), [
    (lambda start, stop, size: None,
     "with a partial response (206) but no Content-Range header, so where its bytes "
     "belong is unknown"),
    (lambda start, stop, size: "bytes \u00b2-5/9",  # isdigit() but not int(): a traceback
     "but a Content-Range header that cannot be read ('bytes \u00b2-5/9')"),
    (lambda start, stop, size: f"bytes {start + 1}-{stop - 1}/{size}",
     "asked the server for bytes from 1,000, it sent bytes from 1,001"),
    (lambda start, stop, size: f"bytes {start}-{stop - 1}/{size + 10}",
     "the server's file is"),
])
def test_a_resume_answered_without_a_usable_content_range_keeps_the_partial_file(
        hostile: HostileHub, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        said: Callable[[int, int, int], str | None], says: str) -> None:
    """A resume answered 206 without Content-Range said "asked for bytes from 1000, got
    from None". Where those bytes belong is unknown: nothing of them is written, the
    bytes already downloaded stay, and the line says so and what to do."""
    part = _resume_from(hostile, tmp_path, 1000)
    honest = hostile.content_range  # for the header read, from byte 0
    hostile.content_range = lambda start, stop, size: (said if start else honest)(start, stop,
                                                                                  size)
    err = _one_line(capsys, ["pull", f"{REPO}:Q8_0", "--dir", str(tmp_path / "m")])
    assert says in err, err
    assert "None" not in err
    assert ("not downloaded: the 1000 B already downloaded are kept in "
            "m-Q8_0.gguf.incomplete: run the download again to resume, or delete that "
            "file to download from the start") in err, err
    assert "bytes=1000-" in hostile.ranges
    assert part.read_bytes() == hostile.data[:1000]
    assert not part.with_name("m-Q8_0.gguf").exists()


def test_a_download_from_the_start_without_content_range_is_hash_checked_and_kept(
        hostile: HostileHub, tmp_path: Path) -> None:
    """From byte 0 a 206 without the header is the file from its start (the header read
    asks for a range from 0): the download completes and its sha256 is checked."""
    hostile.listing(("m-Q8_0.gguf", len(hostile.data), hostile.sha))
    hostile.files["m-Q8_0.gguf"] = hostile.data
    hostile.content_range = lambda start, stop, size: None
    assert main(["pull", f"{REPO}:Q8_0", "--dir", str(tmp_path / "m")]) == 0
    assert (tmp_path / "m" / "me" / "repo" / "m-Q8_0.gguf").read_bytes() == hostile.data


def test_a_header_read_past_its_first_bytes_needs_the_range_it_asked_for(
        hostile: HostileHub) -> None:
    """A header longer than the first read grows by a range from where it stopped: a 206
    without Content-Range there was taken as the bytes asked for, wherever they came from."""
    hostile.listing(("m-Q8_0.gguf", len(hostile.data), hostile.sha))
    hostile.files["m-Q8_0.gguf"] = hostile.data
    client = HubClient()
    model = client.list_models(REPO)[0]
    info, _ = client.read_header(model, first_bytes=64)  # honest ranges: it grows and reads
    assert info.n_expert > 0
    hostile.content_range = lambda start, stop, size: None
    with pytest.raises(HubError, match=r"for bytes from 64 with a partial response \(206\) "
                                       r"but no Content-Range header.*the header was not read"):
        client.read_header(model, first_bytes=64)


@pytest.mark.parametrize(("env", "argv"), [
    ({}, ["--token", "hf_abc\nX-Injected: 1"]),  # h11's LocalProtocolError, a traceback
    ({}, ["--token", "hf_é"]),  # UnicodeEncodeError, a traceback
    ({"HF_TOKEN": "hf_abc\x01"}, []),
])
def test_a_token_no_header_can_carry_is_one_line_before_any_request(
        hostile: HostileHub, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, env: dict[str, str], argv: list[str]) -> None:
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("HF_HUB_DISABLE_IMPLICIT_TOKEN")
    err = _one_line(capsys, ["pull", REPO, "--check", *argv])
    assert "the Hub token (--token, HF_TOKEN or the saved login) holds a character no " \
           "token has" in err
    assert "hf_abc" not in err and "hf_é" not in err  # a secret is not printed
    assert hostile.requests == 0


def test_search_words_too_long_for_a_url_are_one_line(
        hostile: HostileHub, capsys: pytest.CaptureFixture[str]) -> None:
    """100,000 characters of search words: httpx's InvalidURL, a traceback."""
    err = _one_line(capsys, ["pull", "--search", "x" * 100_000])
    assert "the search words are 100,000 characters; at most 1,000" in err
    assert hostile.requests == 0


@pytest.mark.parametrize(("endpoint", "says"), [
    ("http://[::1", "is not a URL (Invalid IPv6 URL)"),  # a ValueError, in hf's import
    ("http://127.0.0.1:99999", "is not a URL (Port out of range 0-65535)"),
    ("http://a\nb", "not a usable address"),  # InvalidURL
    ("http://127.0.0.1:9/" + "x" * 70_000, "not a usable address"),  # "URL too long"
    ("ftp://mirror", "is not an http:// or https:// address with a host"),
])
def test_an_hf_endpoint_no_client_can_use_is_one_line(
        tmp_path: Path, endpoint: str, says: str) -> None:
    """In a fresh process: ``huggingface_hub`` parses ``HF_ENDPOINT`` as it is imported,
    and a bad one was a traceback from that import."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "HF_ENDPOINT": endpoint, "HF_HUB_OFFLINE": "1",
           paths.ENV_MODELS_DIR: str(tmp_path / "models")}
    r = subprocess.run([sys.executable, "-m", "moescope", "pull", REPO, "--check"],
                       env=env, capture_output=True, text=True, timeout=120, check=False)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr[-2000:]
    assert r.stderr.startswith("moescope: error: HF_ENDPOINT ") and says in r.stderr


def test_an_empty_dir_is_refused_not_the_current_folder(
        hostile: HostileHub, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``--dir ""`` is ``Path("")``, the current folder: the model was downloaded there."""
    hostile.listing(("m-Q8_0.gguf", len(hostile.data), hostile.sha))
    hostile.files["m-Q8_0.gguf"] = hostile.data
    monkeypatch.chdir(tmp_path)
    assert main(["pull", f"{REPO}:Q8_0", "--dir", ""]) == 2
    err = capsys.readouterr().err
    assert err == ("moescope pull: error: argument --dir: is empty; name a folder (. for "
                   "this one) (see: moescope pull --help)\n")
    assert hostile.requests == 0 and not any(tmp_path.iterdir())


@pytest.mark.parametrize(("argv", "option"), [
    (["--search", "\udcff\udcfe"], "--search"),  # bytes not UTF-8, as Python gets them
    ([f"{REPO}:\udcff"], "REPO[:FILE|QUANT]"),
    ([REPO, "--revision", "\udcff"], "--revision"),
    ([REPO, "--token", "\udcff"], "--token"),
])
def test_an_argument_not_utf8_is_one_line_before_any_request(
        hostile: HostileHub, capsys: pytest.CaptureFixture[str], argv: list[str],
        option: str) -> None:
    """``pull --search $'\\xff'``: a UnicodeEncodeError traceback as the URL was built."""
    err = _one_line(capsys, ["pull", *argv])
    assert err.startswith(f"moescope: error: {option} is not UTF-8 text (byte 0xff")
    assert hostile.requests == 0


def test_a_listing_with_names_that_hold_escapes_prints_one_line_each(
        hostile: HostileHub, capsys: pytest.CaptureFixture[str]) -> None:
    """The names a Hub (or a mirror) lists were printed as they came: a newline in one
    printed a line of the server's choosing, an ESC sequence recoloured the terminal."""
    evil = "evil\nmoescope: error: spoofed\x1b[2J-Q8_0.gguf"
    hostile.listing((evil, len(hostile.data), hostile.sha),
                    ("good-Q4_0.gguf", len(hostile.data), hostile.sha))
    hostile.files[evil] = hostile.files["good-Q4_0.gguf"] = hostile.data
    assert main(["pull", REPO, "--check"]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out
    assert not any(line.startswith("moescope: error") for line in out.splitlines())
    assert "evil\\nmoescope: error: spoofed\\x1b[2J-Q8_0.gguf" in out
