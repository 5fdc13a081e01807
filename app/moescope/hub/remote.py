"""Search, list and read headers on the Hub, through ``huggingface_hub``'s HTTP session.

The Hub's routes are called directly (``/api/models``, ``/api/models/REPO/tree/REV``,
``/REPO/resolve/REV/FILE``) with ``huggingface_hub.get_session()`` and
``build_hf_headers()``, not through ``HfApi``: its calls retry a refused connection five
times over about 20 seconds, and "no network" must be one quick, clear sentence. The
session and headers are the library's, so ``HF_ENDPOINT``, ``HTTPS_PROXY``, ``HF_TOKEN``
and ``HF_HUB_OFFLINE`` mean what they mean for the Hub's own tools.

Every number the Hub sends (sizes, counts, pages) is bounded before use, and a header read
never asks for more than :data:`MAX_HEADER_BYTES` of one file.
"""

from __future__ import annotations

import json
import os
import re
import socket
import ssl
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any
from urllib.parse import quote, urlsplit

import httpx2
from huggingface_hub import get_session
from huggingface_hub.errors import OfflineModeIsEnabled
from huggingface_hub.utils import build_hf_headers

from moescope import __version__
from moescope.cache.budget import format_bytes
from moescope.hub.endpoint import check_endpoint
from moescope.hub.errors import HubError, HubGated, HubNotFound, HubUnreachable
from moescope.model.gguf_info import HeaderIncomplete, ModelInfo, read_header_info

DEFAULT_ENDPOINT = "https://huggingface.co"
FIRST_HEADER_BYTES = 1 << 20
"""A first range request per file; a header with a large vocabulary grows it."""
MAX_HEADER_BYTES = 64 << 20
"""The most read of one file for its header (the largest vocabularies need ~10 MB)."""
MAX_FILE_BYTES = 1 << 50
MAX_JSON_BYTES = 16 << 20
"""The longest JSON answer read (a search, a page of a file list): a page of the Hub's
tree is 1000 entries of ~300 bytes, so 16 MiB is far above any real one, and an endpoint
that streams without end (a broken mirror) ends in one line, not a MemoryError."""
MAX_PAGES = 20
MAX_SEARCH = 100
MAX_QUERY = 1000
"""Most characters of the search words."""
SEARCH = "the search"
"""What a search request is called in its errors (a 404 there is an endpoint without one)."""
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]{0,95}/[\w.-]{1,96}$")
_SPLIT = re.compile(r"^(?P<prefix>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$", re.IGNORECASE)
_QUANT = re.compile(
    r"(?<![A-Za-z0-9])((?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]{1,4}){0,3}|T[QL][12]_0|BF16|F16|F32|"
    r"MXFP4(?:_MOE)?))(?![A-Za-z0-9])", re.IGNORECASE)
_MOE_ARCHES = frozenset({
    "qwen2moe", "qwen3moe", "qwen3next", "qwen3vlmoe", "deepseek", "deepseek2", "gpt-oss",
    "llama4", "granitemoe", "granitehybrid", "olmoe", "dots1", "glm4moe", "ernie4_5-moe",
    "hunyuan-moe", "arctic", "dbrx", "grok", "bailingmoe", "bailingmoe2", "phimoe", "jamba",
    "minimax-m2", "smallthinker", "lfm2moe", "afmoe", "mixtral", "kimi-k2",
})


@dataclass(frozen=True)
class RepoHit:
    """One search result: a repository with GGUF files."""

    repo_id: str
    downloads: int
    likes: int
    gated: bool
    architecture: str | None
    """As the Hub read it from the GGUF files (``None`` when it does not say)."""

    @property
    def moe(self) -> bool | None:
        """True for a known Mixture-of-Experts architecture, None when unknown (the header
        says for sure: read a file's fit)."""
        arch = (self.architecture or "").lower()
        return True if arch in _MOE_ARCHES or "moe" in arch else None


@dataclass(frozen=True)
class RemoteFile:
    path: str
    size: int
    sha256: str | None
    """The LFS object id (sha256 of the content), as the Hub lists it."""
    git_oid: str | None
    """The git blob id (sha1 of ``blob SIZE\\0`` + content), for files outside LFS."""


@dataclass(frozen=True)
class RemoteModel:
    """One model of a repository: one GGUF file, or the parts of a split one, in order."""

    repo_id: str
    revision: str
    name: str
    """The file's path, or for a split model ``PREFIX-*-of-N.gguf``'s prefix + ``.gguf``."""
    quant: str | None
    files: tuple[RemoteFile, ...]
    expected_parts: int

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    @property
    def complete(self) -> bool:
        return len(self.files) == self.expected_parts

    @property
    def selector(self) -> str:
        """What ``moescope pull`` takes to name this model: ``REPO:FILE``."""
        return f"{self.repo_id}:{self.name}"

    def describe(self) -> str:
        parts = f", {len(self.files)} parts" if self.expected_parts > 1 else ""
        missing = "" if self.complete else (
            f", {self.expected_parts - len(self.files)} part(s) missing on the Hub")
        return f"{self.name} ({format_bytes(self.size)}{parts}{missing})"


def check_repo_id(repo_id: str) -> str:
    """``owner/name`` as the Hub spells repository ids, else a one-line error."""
    if not _REPO_ID.match(repo_id) or ".." in repo_id:
        raise HubError(f"{repo_id!r} is not a repository id (expected owner/name, like "
                       f"unsloth/Qwen3-30B-A3B-GGUF)")
    return repo_id


def quant_of(path: str) -> str | None:
    """The quantization named in a file's path (``Q4_K_M``, ``UD-IQ2_XXS``, ``BF16``…)."""
    found = _QUANT.findall(path)
    return found[-1].upper() if found else None


def group_models(repo_id: str, revision: str, files: list[RemoteFile]) -> list[RemoteModel]:
    """GGUF files as models: the parts of a split model (``-00001-of-00003``) grouped."""
    singles: list[RemoteModel] = []
    splits: dict[tuple[str, str, int], dict[int, RemoteFile]] = {}
    for f in files:
        p = PurePosixPath(f.path)
        if p.name.lower().startswith("mmproj"):  # vision projectors: not chat models
            continue
        m = _SPLIT.match(p.name)
        if m and 1 <= int(m["no"]) <= int(m["count"]) <= 999:
            key = (str(p.parent), m["prefix"], int(m["count"]))
            splits.setdefault(key, {})[int(m["no"])] = f
        else:
            singles.append(RemoteModel(repo_id, revision, f.path, quant_of(f.path), (f,), 1))
    for (parent, prefix, count), parts in splits.items():
        name = str(PurePosixPath(parent) / f"{prefix}.gguf") if parent != "." else \
            f"{prefix}.gguf"
        ordered = tuple(parts[i] for i in sorted(parts))
        singles.append(RemoteModel(repo_id, revision, name, quant_of(name), ordered, count))
    return sorted(singles, key=lambda m: m.name.lower())


def pick_model(models: list[RemoteModel], selector: str) -> RemoteModel:
    """The model ``selector`` names: a file path, a model name, or a quantization."""
    if not models:
        raise HubNotFound("the repository has no GGUF model files")
    s = selector.strip().lower()
    exact = [m for m in models if s == m.name.lower() or any(s == f.path.lower()
                                                            for f in m.files)]
    quant = [m for m in models if m.quant and s == m.quant.lower()]
    loose = [m for m in models if s in m.name.lower()]
    for found in (exact, quant, loose):
        if len(found) == 1:
            return found[0]
        if len(found) > 1:
            raise HubError(f"{selector!r} matches {len(found)} files "
                           f"({', '.join(m.name for m in found[:4])}…): name one")
    have = sorted({m.quant or m.name for m in models})
    raise HubNotFound(f"no GGUF file named or quantized {selector!r} in "
                      f"{models[0].repo_id} (it has {', '.join(have[:12])})")


class HubClient:
    """The Hub at ``endpoint`` (default: ``HF_ENDPOINT``, read at each call, else
    huggingface.co), with ``token`` (default: ``HF_TOKEN`` or the saved login)."""

    def __init__(self, endpoint: str | None = None, token: str | None = None,
                 timeout: float = 20.0) -> None:
        self._endpoint = endpoint
        self.token = token or None
        self.timeout = httpx2.Timeout(timeout, connect=min(timeout, 10.0))

    @property
    def endpoint(self) -> str:
        """The Hub's address, checked (:func:`check_endpoint`)."""
        return check_endpoint(self._endpoint or os.environ.get("HF_ENDPOINT")
                              or DEFAULT_ENDPOINT).rstrip("/")

    @property
    def host(self) -> str:
        return urlsplit(self.endpoint).netloc or self.endpoint

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        headers = build_hf_headers(token=self.token, library_name="moescope",
                                   library_version=__version__, headers=extra)
        auth = next((v for k, v in headers.items() if k.lower() == "authorization"), "")
        token = auth.partition(" ")[2]
        if any(not 0x21 <= ord(c) <= 0x7E for c in token):  # the token itself never said
            raise HubError("the Hub token (--token, HF_TOKEN or the saved login) holds a "
                           "character no token has (a space, a control character or a "
                           "non-ASCII letter): check it")
        return headers

    def file_url(self, repo_id: str, path: str, revision: str = "main") -> str:
        return (f"{self.endpoint}/{check_repo_id(repo_id)}/resolve/{quote(revision, safe='')}"
                f"/{quote(path)}")

    # ------------------------------------------------------------------ requests
    @contextmanager
    def stream(self, url: str, *, what: str, headers: dict[str, str] | None = None,
               params: dict[str, Any] | None = None) -> Iterator[httpx2.Response]:
        """A streamed GET whose failures are :class:`HubError` sentences; 206/200/416 are
        the caller's to read."""
        try:
            with get_session().stream("GET", url, params=params, headers=self.headers(headers),
                                      timeout=self.timeout) as response:
                if response.status_code >= 400 and response.status_code != 416:
                    response.read()
                    raise self.status_error(response, what)
                yield response
        except OfflineModeIsEnabled:
            raise HubUnreachable(f"cannot reach {self.host}: offline mode is on "
                                 f"(HF_HUB_OFFLINE is set)") from None
        except httpx2.InvalidURL as err:  # a file path or revision making it too long
            raise HubError(f"{what}: the request's address is not a valid URL "
                           f"({_reason(err)})") from None
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.ProxyError,
                httpx2.UnsupportedProtocol) as err:
            raise HubUnreachable(
                f"cannot reach {self.host}: {network_failure(err)}; check the network "
                f"connection and the proxy settings (HTTPS_PROXY)", _reason(err)) from None

    def get_json(self, url: str, *, what: str, params: dict[str, Any] | None = None
                 ) -> tuple[Any, httpx2.Response]:
        with self.stream(url, what=what, params=params) as response:
            body = bytearray()
            try:
                for chunk in response.iter_bytes():
                    body += chunk
                    if len(body) > MAX_JSON_BYTES:
                        raise HubError(f"{self.host}: answered {what} with more than "
                                       f"{MAX_JSON_BYTES >> 20} MiB; not read")
            except httpx2.TransportError as err:
                raise HubUnreachable(f"{self.host}: connection lost while reading {what}",
                                     _reason(err)) from None
            try:
                return json.loads(bytes(body)), response
            except (ValueError, RecursionError):  # nested past the parser's depth too
                raise HubError(f"{self.host}: answered {what} with something that is not "
                               f"JSON ({len(body)} bytes)") from None

    def status_error(self, response: httpx2.Response, what: str) -> HubError:
        code = response.status_code
        if code in (401, 403) or response.headers.get("X-Error-Code") == "GatedRepo":
            how = ("the token was refused: check it, and that its account has accepted "
                   "the repository's terms" if self.token or _has_auth(response) else
                   "sign in with a token (HF_TOKEN, or --token) of an account that has "
                   "accepted its terms on the Hub")
            return HubGated(f"{what}: access denied ({code}): the repository is gated or "
                            f"private; {how}")
        if code == 404:
            how = (f"{self.host} offers no model search (is HF_ENDPOINT a mirror without "
                   f"one?)" if what == SEARCH else "check the repository id and file name")
            return HubNotFound(f"{what}: not found on {self.host} (404): {how}")
        if code == 429:
            return HubError(f"{self.host}: too many requests (429): wait a minute and "
                            f"try again")
        return HubError(f"{what}: {self.host} answered {code} {response.reason_phrase}")

    # ------------------------------------------------------------------ routes
    def search(self, query: str, limit: int = 30) -> list[RepoHit]:
        """GGUF repositories matching ``query``, most downloaded first."""
        limit = max(1, min(int(limit), MAX_SEARCH))
        if len(query) > MAX_QUERY:  # a URL that long is refused by the HTTP library
            raise HubError(f"the search words are {len(query):,} characters; at most "
                           f"{MAX_QUERY:,}")
        params = {"search": query.strip(), "filter": "gguf", "sort": "downloads",
                  "direction": "-1", "limit": str(limit),
                  "expand": ["downloads", "likes", "gated", "gguf"]}
        data, _ = self.get_json(f"{self.endpoint}/api/models", what=SEARCH,
                                params=params)
        if not isinstance(data, list):
            raise HubError(f"{self.host}: the search answer is not a list")
        hits = []
        for item in data[:limit]:
            if not isinstance(item, dict) or not isinstance(item.get("id"), str):
                continue
            gguf = item.get("gguf") if isinstance(item.get("gguf"), dict) else {}
            arch = gguf.get("architecture")
            hits.append(RepoHit(
                repo_id=item["id"], downloads=_bounded(item.get("downloads")),
                likes=_bounded(item.get("likes")), gated=bool(item.get("gated")),
                architecture=arch if isinstance(arch, str) else None))
        return hits

    def list_models(self, repo_id: str, revision: str = "main") -> list[RemoteModel]:
        """The repository's GGUF models with sizes and hashes (``list_repo_tree``'s route,
        recursive, every page)."""
        check_repo_id(repo_id)
        url: str | None = (f"{self.endpoint}/api/models/{repo_id}/tree/"
                           f"{quote(revision, safe='')}")
        params: dict[str, Any] | None = {"recursive": "true"}
        files: list[RemoteFile] = []
        for _ in range(MAX_PAGES):
            if url is None:
                break
            data, response = self.get_json(url, what=repo_id, params=params)
            if not isinstance(data, list):
                raise HubError(f"{self.host}: the file list of {repo_id} is not a list")
            files += [f for f in map(_remote_file, data) if f is not None]
            url = response.links.get("next", {}).get("url")
            params = None  # the next link carries them
        return group_models(repo_id, revision, files)

    def read_range(self, repo_id: str, revision: str, path: str, start: int, end: int
                   ) -> bytes:
        """Bytes ``[start, end)`` of a file, by an HTTP range request; never more than
        asked for, even from a server that ignores ranges."""
        want = end - start
        if want <= 0:
            return b""
        what = f"{repo_id}/{path}"
        with self.stream(self.file_url(repo_id, path, revision), what=what,
                         headers={"Range": f"bytes={start}-{end - 1}",
                                  "Accept-Encoding": "identity"}) as response:
            if response.status_code == 416:
                return b""
            if response.status_code == 206:
                bad = range_mismatch(response.headers.get("Content-Range"), start, path)
                if bad is not None:
                    raise HubError(f"{bad}; the header was not read")
            skip = 0 if response.status_code == 206 else start  # 200: the whole file
            out = bytearray()
            try:
                for chunk in response.iter_bytes():
                    if skip:
                        cut = min(skip, len(chunk))
                        chunk, skip = chunk[cut:], skip - cut
                    out += chunk[:want - len(out)]
                    if len(out) >= want:
                        break
            except httpx2.TransportError as err:
                raise HubUnreachable(f"{what}: connection lost while reading the header",
                                     _reason(err)) from None
            return bytes(out)

    def read_header(self, model: RemoteModel, *, first_bytes: int = FIRST_HEADER_BYTES,
                    max_bytes: int = MAX_HEADER_BYTES) -> tuple[ModelInfo, int]:
        """The model's :class:`ModelInfo` from the first bytes of each of its files, and
        how many bytes that took; the range grows only while the header is longer."""
        if not model.complete:
            raise HubNotFound(f"{model.describe()}: cannot read a split model with parts "
                              f"missing")
        prefixes = [self.read_range(model.repo_id, model.revision, f.path, 0,
                                    min(first_bytes, f.size)) for f in model.files]
        while True:
            try:
                info = read_header_info(
                    [(PurePosixPath(f.path).name, f.size, bytes(p))
                     for f, p in zip(model.files, prefixes, strict=True)], require_moe=False)
                return info, sum(map(len, prefixes))
            except HeaderIncomplete as need:
                f, have = model.files[need.part], len(prefixes[need.part])
                grow = min(f.size, max(need.needed, 2 * have))
                if grow > max_bytes:
                    raise HubError(f"{f.path}: its header is longer than "
                                   f"{format_bytes(max_bytes)}; not read") from None
                more = self.read_range(model.repo_id, model.revision, f.path, have, grow)
                if not more:
                    raise HubError(f"{f.path}: the server sent no bytes past {have}") from None
                prefixes[need.part] = prefixes[need.part] + more


_CONTENT_RANGE = re.compile(r"bytes (\d{1,20})-(\d{1,20})/(\d{1,20}|\*)", re.ASCII)


def content_range(value: str | None) -> tuple[int, int, int | None] | None:
    """``bytes 100-199/1000`` -> ``(100, 199, 1000)`` (the size None for ``*``); None for
    a missing or unreadable header, or one whose last byte is before its first."""
    m = _CONTENT_RANGE.fullmatch((value or "").strip())
    if m is None:
        return None
    first, last = int(m[1]), int(m[2])
    total = None if m[3] == "*" else int(m[3])
    if last < first or (total is not None and last >= total):
        return None
    return first, last, total


def range_mismatch(value: str | None, start: int, what: str, size: int | None = None
                   ) -> str | None:
    """Why a partial response (206) to a request for bytes from ``start`` of ``what`` (a
    file of ``size`` bytes, if known) cannot be used, or None: without a Content-Range
    header (or with one that does not parse) where its bytes belong is unknown; one that
    starts elsewhere, or names a file of another size, is not the bytes asked for. Only
    from byte 0 is a response without the header taken as the file from its start (what
    else could it be; a download's sha256 and a header's parser check the bytes)."""
    if not value and start == 0:
        return None
    got = content_range(value)
    if got is None:
        how = ("no Content-Range header" if not value else
               f"a Content-Range header that cannot be read ({value[:60]!r})")
        return (f"{what}: the server answered the request for bytes from {start:,} with a "
                f"partial response (206) but {how}, so where its bytes belong is unknown")
    if got[0] != start:
        return (f"{what}: asked the server for bytes from {start:,}, it sent bytes from "
                f"{got[0]:,} (Content-Range {value})")
    if size is not None and got[2] is not None and got[2] != size:
        return (f"{what}: the server's file is {got[2]:,} bytes (Content-Range {value}), "
                f"the listing says {size:,}")
    return None


def _remote_file(entry: Any) -> RemoteFile | None:
    """A tree entry that is a GGUF file, its numbers bounded; anything else is skipped."""
    if not isinstance(entry, dict) or entry.get("type") != "file":
        return None
    path = entry.get("path")
    if not isinstance(path, str) or not path.lower().endswith(".gguf") or len(path) > 1000 \
            or not _utf8(path):  # a lone surrogate (a \\udc80 escape) has no URL
        return None
    size = entry.get("size")
    if isinstance(size, bool) or not isinstance(size, int) or not 0 < size <= MAX_FILE_BYTES:
        return None
    lfs = entry.get("lfs") if isinstance(entry.get("lfs"), dict) else {}
    sha = lfs.get("oid") or lfs.get("sha256")
    oid = entry.get("oid")
    return RemoteFile(
        path=path, size=size,
        sha256=sha.lower() if isinstance(sha, str) and re.fullmatch(r"[0-9a-fA-F]{64}", sha)
        else None,
        git_oid=oid.lower() if not lfs and isinstance(oid, str)
        and re.fullmatch(r"[0-9a-fA-F]{40}", oid) else None)


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _bounded(value: Any) -> int:
    return min(max(value, 0), 10**12) if isinstance(value, int) and not isinstance(
        value, bool) else 0


def _has_auth(response: httpx2.Response) -> bool:
    return response.request is not None and "authorization" in response.request.headers


DNS_WORDS = ("name or service not known", "temporary failure in name resolution",
             "nodename nor servname", "no address associated with hostname", "getaddrinfo")


def network_failure(err: BaseException) -> str:
    """What a failed connection means, in plain words ("no network or DNS failure"); the
    system's own text ("[Errno -2] Name or service not known") is :func:`_reason`'s, for
    the error's ``detail``."""
    chain: list[BaseException] = []
    cause: BaseException | None = err
    while cause is not None and len(chain) < 8:
        chain.append(cause)
        cause = cause.__cause__ or cause.__context__
    text = " ".join(str(e) for e in chain).lower()
    if any(isinstance(e, socket.gaierror) for e in chain) or any(w in text for w in DNS_WORDS):
        return "no network or DNS failure (its name does not resolve)"
    if any(isinstance(e, ssl.SSLError) for e in chain):
        return "the secure connection (TLS) failed"
    if isinstance(err, httpx2.ProxyError):
        return "the proxy refused the connection"
    if isinstance(err, httpx2.UnsupportedProtocol):
        return "its address is not an http(s) one"
    if any(isinstance(e, ConnectionRefusedError) for e in chain) or "refused" in text:
        return "the connection was refused"
    if any(isinstance(e, TimeoutError) for e in chain) or isinstance(
            err, httpx2.TimeoutException) or "timed out" in text:
        return "no answer in time"
    if "unreachable" in text:
        return "no network (unreachable)"
    if any(isinstance(e, ConnectionResetError) for e in chain) or "reset" in text:
        return "the connection was reset"
    return "no connection"


def _reason(err: BaseException) -> str:
    text = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return text[:160]
