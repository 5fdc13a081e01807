"""The HTTP side: Starlette routes speaking OpenAI's API over a :class:`Service`.

Every request is checked (auth, body size, JSON, fields) before it waits for the engine,
so a bad one costs nothing and gets an OpenAI-style error with the right status. A
streaming answer is Server-Sent Events, ``data: {chunk}`` per delta and ``data: [DONE]``;
if the client goes away mid-answer, the generation stops after the token being decoded.
Generation itself runs on worker threads (one at a time, by the service's queue); the
event loop only moves bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import itertools
import json
import secrets
import sys
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import anyio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from moescope import __version__
from moescope.server.errors import ApiError
from moescope.server.params import chat_params, completion_params
from moescope.server.service import (
    Delta,
    Done,
    Event,
    Failed,
    Job,
    RequestRecord,
    SentToken,
    Service,
)


def _compact(obj: Any) -> str:
    """JSON as every streamed chunk is written, the hand-built content chunks and the
    closing ones alike: no spaces, non-ASCII escaped."""
    return json.dumps(obj, separators=(",", ":"))


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


def create_app(service: Service, *, api_key: str | None = None,
               cors_origins: Sequence[str] = ()) -> Starlette:
    """The ASGI app serving ``service``; with ``api_key``, every ``/v1`` route needs
    ``Authorization: Bearer <api_key>``. ``cors_origins`` (``--cors-origin``, checked by
    ``run.check_cors_origin``): web pages of these origins may call the API from a browser
    (CORS preflights answered, their requests not refused as a web page's); none by
    default, and never ``*``."""
    allowed = frozenset(cors_origins)
    executor = ThreadPoolExecutor(max_workers=service.queue.capacity + 2,
                                  thread_name_prefix="moescope-serve")
    api = _Api(service, executor)

    def guarded(handler: Callable[[Request], Any]) -> Callable[[Request], Any]:
        async def endpoint(request: Request) -> Response:
            try:
                if api_key is not None:
                    _check_key(request, api_key)
                else:
                    _check_not_a_web_page(request, allowed)
                return await handler(request)
            except ApiError as err:
                return error_response(err)
            except ClientDisconnect:
                return Response(status_code=499)
        return endpoint

    routes = [
        Route("/health", api.health, methods=["GET"]),
        Route("/v1/models", guarded(api.models), methods=["GET"]),
        Route("/v1/models/{model:path}", guarded(api.model), methods=["GET"]),
        Route("/v1/chat/completions", guarded(api.chat), methods=["POST"]),
        Route("/v1/completions", guarded(api.completions), methods=["POST"]),
        # a base URL ending in "/" (".../v1/") was a bodiless 307 to these
        Route("/v1/chat/completions/", guarded(api.chat), methods=["POST"]),
        Route("/v1/completions/", guarded(api.completions), methods=["POST"]),
        Route("/v1/moescope/cache", guarded(api.cache), methods=["GET", "POST"]),
    ]

    async def http_error(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, HTTPException)
        return error_response(route_error(request.method, request.url.path,
                                          exc.status_code, exc.headers or {},
                                          str(exc.detail)))

    async def internal_error(_request: Request, exc: Exception) -> Response:
        service.log(f"internal error: {type(exc).__name__}: {exc}")
        return error_response(ApiError(500, f"internal error: {type(exc).__name__}",
                                       type="server_error"))

    @contextlib.asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        # anyio loads its asyncio backend on first use, which was the first streamed
        # answer's: ~0.1 s added to that client's time to first token
        await anyio.sleep(0)
        yield
        executor.shutdown(wait=False, cancel_futures=True)

    middleware = []
    if allowed:
        from starlette.middleware import Middleware
        from starlette.middleware.cors import CORSMiddleware

        # the key travels in the Authorization header, not as a cookie: no credentials
        middleware.append(Middleware(CORSMiddleware, allow_origins=sorted(allowed),
                                     allow_methods=["GET", "POST"], allow_headers=["*"],
                                     max_age=600))
    app = Starlette(routes=routes, exception_handlers={HTTPException: http_error,
                                                       Exception: internal_error},
                    lifespan=lifespan, middleware=middleware)
    app.router.redirect_slashes = False  # a POST redirected loses its body in many clients
    app.state.service = service
    return app


SERVED = ("this server serves POST /v1/chat/completions and POST /v1/completions (and GET "
          "/v1/models)")
"""What a request to a path the server does not serve is told."""

NOT_SERVED = {
    "embeddings": "embeddings", "audio": "audio (speech, transcriptions)",
    "images": "images", "responses": "the Responses API", "moderations": "moderations",
    "files": "files", "uploads": "files", "fine_tuning": "fine-tuning",
    "fine-tunes": "fine-tuning", "batches": "batches", "assistants": "assistants",
    "threads": "assistants", "vector_stores": "vector stores", "realtime": "realtime",
    "evals": "evals", "containers": "containers",
    "conversations": "conversations", "videos": "videos",
}
"""OpenAI endpoints (the first part of the path after ``/v1/``) that this server does not
implement, and what to call them: a client that asks for one gets 501 Not Implemented
saying what is served (llama.cpp's server answers ``/v1/embeddings`` so when it serves
completions: 501, ``not_supported_error``), not a bare Not Found it may read as a wrong
base URL."""


def route_error(method: str, path: str, status: int, headers: dict[str, str],
                detail: str) -> ApiError:
    """The OpenAI-style error for a request the routes do not take: an OpenAI endpoint this
    server does not implement (501, with ``x-should-retry: false``: the openai clients
    retry a 5xx twice otherwise), a path it does not know (404 ``unknown_url``, as
    OpenAI's; a path ending in a served endpoint under another prefix, as a base URL
    without ``/v1`` or with the endpoint in it makes, says where the base URL ends), or a
    served path with the wrong method (405 naming the method to use, with ``Allow``)."""
    shown = path if len(path) <= 80 else path[:77] + "..."
    shown = "".join(c if c.isprintable() else "?" for c in shown)
    if status == 405:
        allow = headers.get("Allow", "")
        methods = [m for m in allow.split(", ") if m and m != "HEAD"]
        use = " or ".join(sorted(methods)) or "another method"
        return ApiError(405, f"{method} {shown} is not allowed: use {use}",
                        code="method_not_allowed", headers={"Allow": allow} if allow else None)
    if status != 404:
        return ApiError(status, detail)
    parts = path.strip("/").split("/")
    if len(parts) >= 2 and parts[0] == "v1" and parts[1] in NOT_SERVED:
        return ApiError(501, f"{method} {shown}: {SERVED}; it does not serve "
                             f"{NOT_SERVED[parts[1]]}",
                        type="not_supported_error", code="not_implemented",
                        headers={"x-should-retry": "false"})
    hint = ""
    if path.rstrip("/").endswith(("/chat/completions", "/completions", "/models")):
        hint = " (the base URL must end in /v1: http://HOST:PORT/v1)"
    return ApiError(404, f"unknown URL {method} {shown}: {SERVED}{hint}", code="unknown_url")


PREPARE_ON_LOOP_BYTES = 64 << 10
"""Request bodies up to this size are prepared on the event loop (about 25 ms of
tokenizing at most)."""


def _check_key(request: Request, api_key: str) -> None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(token.strip().encode(),
                                                              api_key.encode()):
        raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>'",
                       code="invalid_api_key")


def _check_not_a_web_page(request: Request, allowed: frozenset[str] = frozenset()) -> None:
    """Without an API key, a request a web page made is refused (403): a page open in the
    user's browser could post to ``http://127.0.0.1:8080`` (a form's text/plain body is
    read as JSON here, with no CORS preflight) and change the policy and budget through
    ``/v1/moescope/cache``, or, through a DNS name of its own that it points at 127.0.0.1
    (DNS rebinding), read the answers. So an ``Origin`` header (browsers send one with
    every cross-site POST; other clients do not) must be this machine's, and the ``Host``
    an IP address or ``localhost``, never a name a site controls. An origin the server
    was started to allow (``--cors-origin``) is served: its operator vouched for it."""
    origin = request.headers.get("origin")
    if origin is not None and origin not in allowed \
            and not _local_name(_hostname(origin), ip=False):
        raise ApiError(403, f"a request from a web page ({_printable(origin)}) is refused: "
                            "without an API key any site open in a browser could use this "
                            "server; start it with --api-key KEY (or let this page's "
                            "origin in with --cors-origin)", type="permission_error",
                       code="cross_origin_refused")
    host = request.headers.get("host")
    if host and not _local_name(_hostname(f"//{host}"), ip=True):
        raise ApiError(403, f"the Host {_printable(host or '')} is a name, not an address: "
                            "without an API key this server answers only localhost or an "
                            "IP address (a web page could point a name of its own here); "
                            "use one, or start it with --api-key KEY",
                       type="permission_error", code="host_refused")


def _hostname(url: str) -> str | None:
    try:
        return urlsplit(url).hostname
    except ValueError:  # "[" without its "]"
        return None


def _local_name(name: str | None, *, ip: bool) -> bool:
    """``localhost`` (or a name under it), a loopback address, or, with ``ip``, any IP
    address."""
    if not name:
        return False
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name)
    except ValueError:
        return False
    return ip or address.is_loopback


def _printable(text: str) -> str:
    text = "".join(c if c.isprintable() else "?" for c in text)
    return text if len(text) <= 80 else text[:77] + "..."


def _client(request: Request) -> str:
    return f"{request.client.host}:{request.client.port}" if request.client else "client"


class _Api:
    def __init__(self, service: Service, executor: ThreadPoolExecutor) -> None:
        self.service = service
        self.executor = executor

    async def body(self, request: Request) -> Any:
        return (await self.read(request))[0]

    async def read(self, request: Request) -> tuple[Any, int]:
        """The JSON body and its size, refused past the size limit (413) before it is all
        read."""
        limit = self.service.limits.max_body_bytes
        declared = request.headers.get("content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > limit):
            raise ApiError(413, f"the request body is larger than {limit} bytes",
                           code="request_too_large")
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise ApiError(413, f"the request body is larger than {limit} bytes",
                               code="request_too_large")
            chunks.append(chunk)
        try:
            return json.loads(b"".join(chunks)), size
        except (UnicodeDecodeError, json.JSONDecodeError) as err:
            raise ApiError(400, f"the request body is not valid JSON ({err})",
                           code="invalid_json") from None
        except RecursionError:  # Python's parser recurses: ~1000 nested arrays or objects
            raise ApiError(400, "the request body nests its arrays and objects too deeply",
                           code="invalid_json") from None
        except ValueError:  # an integer past Python's limit on digits converted from text
            raise ApiError(400, f"the request body has a number of more than "
                                f"{sys.get_int_max_str_digits()} digits",
                           code="invalid_json") from None

    # ------------------------------------------------------------------ read-only
    async def health(self, _request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": self.service.model_id})

    def _model_card(self) -> dict[str, Any]:
        return {"id": self.service.model_id, "object": "model",
                "created": self.service.created, "owned_by": f"moescope {__version__}"}

    async def models(self, _request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [self._model_card()]})

    async def model(self, request: Request) -> Response:
        if not request.path_params["model"]:  # "/v1/models/"
            return await self.models(request)
        self.service.check_model(request.path_params["model"])
        return JSONResponse(self._model_card())

    async def cache(self, request: Request) -> Response:
        if request.method == "GET":
            return JSONResponse(self.service.cache_state())
        body = await self.body(request)
        state = await anyio.to_thread.run_sync(self.service.steer, body)
        return JSONResponse(state)

    # ------------------------------------------------------------------ generation
    async def chat(self, request: Request) -> Response:
        body, size = await self.read(request)
        p = chat_params(body, self.service.limits, self.service.sampling_defaults)
        job = await self.prepare(size, self.service.prepare_chat, p, _client(request))
        return await self.generate(request, job, p.stream, p.include_usage)

    async def completions(self, request: Request) -> Response:
        body, size = await self.read(request)
        p = completion_params(body, self.service.limits,
                              self.service.sampling_defaults)
        job = await self.prepare(size, self.service.prepare_completion, p, _client(request))
        return await self.generate(request, job, p.stream, p.include_usage)

    async def prepare(self, size: int, prepare: Callable[[Any, str], Job], p: Any,
                      client: str) -> Job:
        """The template and the tokens: on the loop for a usual request (well under a
        millisecond; a thread hop costs more on a busy machine), on a thread for a long
        one (a 4 MiB prompt takes ~1.5 s to tokenize), so that other clients' streams
        keep flowing meanwhile. A ``response_format`` schema (or a forced tool call's) always
        goes to a thread: its
        conversion to a grammar is llama-cpp-python's code, whose time we do not bound (a
        stray ``]`` in a pattern once looped in it forever, stalling every client)."""
        if size <= PREPARE_ON_LOOP_BYTES and getattr(p, "output", None) is None \
                and getattr(p, "tool_choice", "none") in ("none", "auto"):
            return prepare(p, client)
        return await anyio.to_thread.run_sync(prepare, p, client)

    async def generate(self, request: Request, job: Job, stream: bool,
                       include_usage: bool) -> Response:
        turn = self.service.join(job.client)  # 503 when the queue is full
        events = _Channel(asyncio.get_running_loop())

        def emit(event: Event) -> None:
            if stream or not isinstance(event, Delta):  # a whole answer needs only its end
                events.put(event)

        def run() -> None:
            self.service.run(job, turn, emit)
            if job.cancelled.is_set():
                emit(Failed(ApiError(499, "cancelled")))  # wakes a waiting reader

        def cancel() -> None:  # the client left: give up the place or stop the answer
            job.cancel()
            self.service.queue.cancel(turn)

        shape = _Shape(job.kind, self.service.model_id, prompt_chars=len(job.prompt))
        future = events.loop.run_in_executor(self.executor, run)
        if stream:
            return _EventStream(_sse(events, shape, include_usage), on_close=cancel)
        return await self._whole(request, cancel, events, shape, future)

    async def _whole(self, request: Request, cancel: Callable[[], None],
                     events: _Channel, shape: _Shape,
                     future: asyncio.Future[None]) -> Response:
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            while True:
                getter = asyncio.ensure_future(events.take())
                done, _ = await asyncio.wait({getter, gone},
                                             return_when=asyncio.FIRST_COMPLETED)
                if getter not in done:
                    getter.cancel()
                    cancel()
                    await future
                    return Response(status_code=499)
                for event in getter.result()[0]:
                    if isinstance(event, Failed):
                        return error_response(event.error)
                    if isinstance(event, Done):
                        return JSONResponse(shape.whole(event.record))
        finally:
            gone.cancel()
            cancel()  # no effect once done; stops the generation if we are cancelled


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone away (the body has been read already)."""
    while True:
        message = await request.receive()
        if message["type"] == "http.disconnect":
            return


_ID_PREFIX = secrets.token_hex(8)
_ids = itertools.count()
"""Response ids: unique (a random prefix per process, then a count) without a random
draw per request, whose system call let the decode thread take the interpreter from
the event loop for up to a switch interval (seen in profiles, ~2 ms a request)."""


class _Shape:
    """OpenAI's response objects for one request (chat or text completion)."""

    def __init__(self, kind: str, model: str, prompt_chars: int = 0) -> None:
        self.kind = kind
        self.model = model
        self.prompt_chars = prompt_chars
        """A text completion's ``text_offset`` counts from the prompt's start, as OpenAI's."""
        self.id = f"{'chatcmpl' if kind == 'chat' else 'cmpl'}-{_ID_PREFIX}{next(_ids):08x}"
        self.calls = 0
        """Tool calls streamed so far (the next one's ``index``)."""
        self.created = int(time.time())
        self.object = "chat.completion" if kind == "chat" else "text_completion"
        self._head = (f'{{"id":"{self.id}","object":"'
                      f'{"chat.completion.chunk" if kind == "chat" else "text_completion"}",'
                      f'"created":{self.created},"model":{_compact(model)},"choices":[')

    def _base(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    @staticmethod
    def usage(r: RequestRecord) -> dict[str, Any]:
        return {"prompt_tokens": r.prompt_tokens, "completion_tokens": r.completion_tokens,
                "total_tokens": r.prompt_tokens + r.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": r.cached_tokens}}

    def whole(self, r: RequestRecord) -> dict[str, Any]:
        if self.kind == "chat":
            message: dict[str, Any] = {"role": "assistant", "content": r.content}
            if r.reasoning:
                message["reasoning_content"] = r.reasoning
            if r.tool_calls:  # OpenAI's: content null unless the model wrote words too
                message["content"] = r.content or None
                message["tool_calls"] = [c.openai() for c in r.tool_calls]
            choice: dict[str, Any] = {"index": 0, "message": message,
                                      "finish_reason": r.finish_reason,
                                      "logprobs": self.logprobs(r.logprobs)}
        else:
            choice = {"index": 0, "text": r.content, "finish_reason": r.finish_reason,
                      "logprobs": self.logprobs(r.logprobs)}
        return {**self._base(self.object), "choices": [choice], "usage": self.usage(r),
                "moescope": r.numbers()}

    def delta(self, d: Delta, first: bool) -> bytes:
        """One streamed chunk, built as text: this runs once per token."""
        if self.kind == "chat":
            parts = ['"role":"assistant"'] if first else []
            if d.reasoning:
                parts.append(f'"reasoning_content":{_compact(d.reasoning)}')
            if d.content or not (d.reasoning or d.tool_calls):
                parts.append(f'"content":{_compact(d.content)}')
            if d.tool_calls:  # each call whole in one chunk, numbered across the answer
                calls = [c.openai(self.calls + i) for i, c in enumerate(d.tool_calls)]
                self.calls += len(calls)
                parts.append(f'"tool_calls":{_compact(calls)}')
            choice = f'{{"index":0,"delta":{{{",".join(parts)}}}'
        else:
            choice = f'{{"index":0,"text":{_compact(d.content)}'
        if d.logprobs is not None:
            choice += f',"logprobs":{_compact(self.logprobs(d.logprobs))}'
        choice += ',"finish_reason":null}'
        return b"data: " + (self._head + choice + "]}").encode() + b"\n\n"

    def logprobs(self, tokens: list[SentToken] | None) -> dict[str, Any] | None:
        """A choice's ``logprobs``: chat's ``content`` list, or a text completion's
        columns (``tokens``, ``token_logprobs``, ``top_logprobs``, ``text_offset``)."""
        if tokens is None:
            return None
        if self.kind == "chat":
            return {"content": [{
                "token": _token_text(t.logprob.piece), "logprob": t.logprob.logprob,
                "bytes": list(t.logprob.piece),
                "top_logprobs": [{"token": _token_text(a.piece), "logprob": a.logprob,
                                  "bytes": list(a.piece)} for a in t.logprob.top]}
                for t in tokens], "refusal": None}
        tops = []
        for t in tokens:  # the alternatives and, always, the sampled token (OpenAI's)
            top = {_token_text(a.piece): a.logprob for a in t.logprob.top}
            top.setdefault(_token_text(t.logprob.piece), t.logprob.logprob)
            tops.append(top)
        return {"tokens": [_token_text(t.logprob.piece) for t in tokens],
                "token_logprobs": [t.logprob.logprob for t in tokens],
                "top_logprobs": tops,
                "text_offset": [self.prompt_chars + t.offset for t in tokens]}

    def last(self, r: RequestRecord, include_usage: bool) -> bytes:
        """The closing chunk (finish_reason and our numbers), the usage chunk if asked
        for, then ``[DONE]``."""
        if self.kind == "chat":
            choice: dict[str, Any] = {"index": 0, "delta": {}, "finish_reason": r.finish_reason}
            obj = "chat.completion.chunk"
        else:
            choice = {"index": 0, "text": "", "finish_reason": r.finish_reason}
            obj = "text_completion"
        out = [{**self._base(obj), "choices": [choice], "moescope": r.numbers()}]
        if include_usage:
            out.append({**self._base(obj), "choices": [], "usage": self.usage(r)})
        return b"".join(b"data: " + _compact(c).encode() + b"\n\n" for c in out) \
            + b"data: [DONE]\n\n"


def _token_text(piece: bytes) -> str:
    """A token's text as OpenAI writes it: its bytes as UTF-8, or, when they are not
    whole characters (a character cut between tokens), ``bytes:\\xe2\\x80``."""
    try:
        return piece.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in piece)


class _Channel:
    """Events from the generating thread to the event loop. The loop is woken only when
    its reader waits for an event (or the answer ends), not once per token: tokens that
    arrive while it writes or paces itself wait in the deque, at no cost to the decode
    thread, and go out together in the next write. The reader waits on one bare future
    at a time (for events, or for the pacing pause's timer or the end, whichever comes
    first): no task or timeout machinery per write."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.items: deque[Event] = deque()
        self.lock = threading.Lock()
        self.scheduled = False
        self.waiting = False
        """The reader is blocked in :meth:`take`: the next event must wake the loop."""
        self.ended = False
        self.end_seen = False
        """The loop has been woken for the last event (Done or Failed): no more pauses."""
        self._waiter: asyncio.Future[None] | None = None

    def put(self, event: Event) -> None:
        """Any thread."""
        with self.lock:
            self.items.append(event)
            last = not isinstance(event, Delta)
            self.ended = self.ended or last
            if self.scheduled or not (self.waiting or last):
                return
            self.scheduled = True
        self.loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        with self.lock:
            self.scheduled = False
            self.end_seen = self.ended
        _resolve(self._waiter)

    async def _wait(self, timeout: float | None = None) -> None:
        waiter = self._waiter = self.loop.create_future()
        timer = self.loop.call_later(timeout, _resolve, waiter) if timeout else None
        try:
            await waiter
        finally:
            self._waiter = None
            if timer is not None:
                timer.cancel()

    async def pause(self, seconds: float) -> None:
        """Sleep ``seconds``, or less when the answer ends meanwhile: its last tokens
        and the closing chunk go out at once instead of up to an interval late."""
        if self.end_seen or seconds <= 0:
            return
        await self._wait(seconds)

    def take_nowait(self) -> list[Event]:
        """Every event so far, maybe none."""
        with self.lock:
            batch = list(self.items)
            self.items.clear()
            return batch

    async def take(self) -> tuple[list[Event], bool]:
        """Every event so far (at least one), oldest first, and whether none was there
        when called (the reader had to wait for the decode thread)."""
        waited = False
        while True:
            with self.lock:
                if self.items:
                    batch = list(self.items)
                    self.items.clear()
                    self.waiting = False
                    return batch, waited
                self.waiting = True
            waited = True
            await self._wait()


def _resolve(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


STREAM_INTERVAL_S = 0.01
"""After the first token, at most one write per this interval: the tokens decoded
meanwhile go out as one chunk. A reader cannot tell 10 ms apart; the decode thread, which
shares the interpreter with the event loop, gets the time back (at hundreds of tokens a
second, a write per token costs a quarter of the decode speed)."""


def _merged(batch: list[Event]) -> list[Event]:
    """Consecutive deltas as one (their texts and tokens joined)."""
    out: list[Event] = []
    for event in batch:
        last = out[-1] if out else None
        if isinstance(event, Delta) and isinstance(last, Delta):
            lps = None if last.logprobs is None and event.logprobs is None \
                else (last.logprobs or []) + (event.logprobs or [])
            tools = None if last.tool_calls is None and event.tool_calls is None \
                else (last.tool_calls or []) + (event.tool_calls or [])
            out[-1] = Delta(last.reasoning + event.reasoning, last.content + event.content,
                            lps, tools)
        else:
            out.append(event)
    return out


async def _sse(events: _Channel, shape: _Shape,
               include_usage: bool) -> AsyncIterator[bytes]:
    """The answer as SSE chunks, at most one write per ``STREAM_INTERVAL_S`` after the
    first token. While tokens come faster than that, it sleeps out the rest of the
    interval after each write and then takes what came meanwhile (one timer wake per
    write); when they come slower, it waits for the next one directly, so the loop wakes
    once per token and never for a timer with nothing to send."""
    first = True
    paced = False
    clock = events.loop.time
    written = clock()
    while True:
        if paced:
            await events.pause(STREAM_INTERVAL_S - (clock() - written))
        taken, waited = await events.take()
        rest = STREAM_INTERVAL_S - (clock() - written)
        if not first and waited and rest > 0:  # sooner than an interval after the last
            await events.pause(rest)
            taken += events.take_nowait()
            paced = True
        else:
            paced = not first and not waited
        batch = _merged(taken)
        out = []
        for event in batch:
            if isinstance(event, Delta):
                out.append(shape.delta(event, first))
                first = False
            elif isinstance(event, Done):
                out.append(shape.last(event.record, include_usage))
                yield b"".join(out)
                return
            else:
                out.append(b"data: " + _compact(event.error.body()).encode() + b"\n\n")
                yield b"".join(out)
                return
        yield b"".join(out)
        written = clock()


class _EventStream(Response):
    """An SSE response that watches for the client leaving while it streams, whatever
    the server's ASGI version, and calls ``on_close`` when it does (or when done)."""

    media_type = "text/event-stream"

    def __init__(self, chunks: AsyncIterator[bytes], *,
                 on_close: Callable[[], None]) -> None:
        self.status_code = 200
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            (b"cache-control", b"no-cache"), (b"x-accel-buffering", b"no")]
        self.background = None
        self.chunks = chunks
        self.on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def watch(cancel: anyio.CancelScope) -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            cancel.cancel()

        try:
            async with anyio.create_task_group() as group:
                group.start_soon(watch, group.cancel_scope)
                await send({"type": "http.response.start", "status": self.status_code,
                            "headers": self.raw_headers})
                async for chunk in self.chunks:
                    await send({"type": "http.response.body", "body": chunk,
                                "more_body": True})
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                group.cancel_scope.cancel()
        except OSError:
            pass  # the client went away between two writes
        finally:
            self.on_close()
