"""``moescope serve [MODEL] [--host H] [--port P] [--api-key KEY] [--policy P --budget B]``.

Serves the model over an OpenAI-compatible HTTP API (``/v1/chat/completions``,
``/v1/completions``, ``/v1/models``) so editors, chat front ends and scripts use it with
the expert cache, plus ``/v1/moescope/cache`` to read the cache's numbers and steer its
policy and budget live. One line per request on stderr: client, tokens in and out,
tok/s, hit rate, substituted mass, policy. Binds 127.0.0.1 unless told otherwise; any
other address needs an API key (or a loud opt-out).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from moescope.cli.commands.generate import add_audit_argument, add_gpu_layers_argument
from moescope.cli.options import (
    add_budget_arguments,
    add_ctx_argument,
    add_model_argument,
    add_no_cache_argument,
    add_policy_argument,
    add_threads_argument,
    check_ctx,
    check_model_header,
    check_ram_budget,
    check_range,
    check_threads,
    print_load_notes,
)
from moescope.util.errors import MoEScopeError


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "serve", help="serve the model over an OpenAI-compatible API (localhost)",
        description="Serve a model over an OpenAI-compatible HTTP API with the expert "
                    "cache on: point Open WebUI, Continue or the openai client at "
                    "http://HOST:PORT/v1. One generation at a time; more requests wait "
                    "in a bounded queue.")
    add_model_argument(p)
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (default: $MOESCOPE_API_KEY, "
                        "else none); needed for any --host other than loopback")
    p.add_argument("--insecure-no-api-key", action="store_true",
                   help="allow a non-loopback --host without an API key (anyone who can "
                        "reach the port can use the model)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="URL",
                   help="let web pages of this origin (scheme://host[:port]) call the API "
                        "from a browser; repeatable (default: none; never *)")
    p.add_argument("--model-id", default=None, metavar="NAME",
                   help="the model's name in the API (default: the file name without "
                        ".gguf)")
    add_policy_argument(p)
    add_budget_arguments(p)
    add_ctx_argument(p)
    p.add_argument("--max-tokens", type=int, default=2048, metavar="N",
                   help="most tokens per answer; larger requests are clamped (default 2048)")
    p.add_argument("--queue", type=int, default=8, metavar="N",
                   help="requests that may wait while one generates; more get 503 "
                        "(default 8)")
    p.add_argument("--max-body", type=int, default=4, metavar="MIB",
                   help="largest request body in MiB (default 4)")
    p.add_argument("--read-timeout", type=int, default=30, metavar="S",
                   help="seconds a client has to send a whole request; slower ones are "
                        "disconnected (default 30)")
    add_gpu_layers_argument(p)
    add_threads_argument(p)
    add_no_cache_argument(p)
    add_audit_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from moescope.cache.audit import check_every
    from moescope.cache.budget import parse_budget
    from moescope.cli.commands.generate import (
        backend_line,
        cache_state,
        parse_live_policy,
        resolve_model,
        start_audits,
    )
    from moescope.server.run import (
        MAX_CORS_ORIGINS,
        READ_TIMEOUT_RANGE,
        ExposureRefused,
        check_api_key,
        check_cors_origin,
        check_exposure,
        check_port,
        host_resolves,
        port_free,
    )

    if args.api_key is not None:
        check_api_key("--api-key", args.api_key)
    elif os.environ.get("MOESCOPE_API_KEY"):
        check_api_key("MOESCOPE_API_KEY", os.environ["MOESCOPE_API_KEY"])
    api_key = args.api_key or os.environ.get("MOESCOPE_API_KEY") or None
    if not args.host.strip():  # "--host  is not an address": say what it is
        raise MoEScopeError("--host is empty: keep 127.0.0.1 (this machine only), or give "
                            "one of its addresses (0.0.0.0: all of them) with an --api-key")
    if not host_resolves(args.host):  # else refused below as reaching other machines
        raise MoEScopeError(f"--host {args.host} is not an address of this machine: keep "
                            "127.0.0.1 (this machine only), or give one of its addresses "
                            "(0.0.0.0: all of them) with an --api-key")
    try:
        warning = check_exposure(args.host, api_key, args.insecure_no_api_key)
    except ExposureRefused as refused:
        raise MoEScopeError(
            f"--host {refused.host} makes the model reachable from other machines: give "
            f"an --api-key (or set MOESCOPE_API_KEY), or --insecure-no-api-key to serve "
            f"it to anyone who can reach this port") from None
    check_port(args.port)
    if len(args.cors_origin) > MAX_CORS_ORIGINS:
        raise MoEScopeError(f"at most {MAX_CORS_ORIGINS} --cors-origin, got "
                            f"{len(args.cors_origin)}")
    cors_origins = tuple(dict.fromkeys(check_cors_origin(o) for o in args.cors_origin))
    for name, value, lo, hi in (("--max-tokens", args.max_tokens, 1, 1 << 20),
                                ("--queue", args.queue, 0, 1024),
                                ("--max-body", args.max_body, 1, 1024),
                                ("--read-timeout", args.read_timeout, *READ_TIMEOUT_RANGE)):
        check_range(name, value, lo, hi)
    ctx_given = check_ctx(args)
    check_threads(args.threads)  # 99999999999 aborted in llama.cpp (std::bad_alloc)
    check_model_id(args.model_id)
    policy = parse_live_policy(args.policy)  # fail fast, before loading
    parse_budget(args.budget)
    check_ram_budget(args.ram_budget)
    check_every(args.audit, "--audit")
    if not port_free(args.host, args.port):
        raise MoEScopeError(f"cannot listen on {args.host}:{args.port}: the port is in use "
                            "or the address is not this machine's; try another --port")
    model = resolve_model(args.model)
    check_model_header(model, budget=args.budget, ram_budget=args.ram_budget, ctx=ctx_given,
                       cache=not args.no_cache)

    import uvicorn

    from moescope.engine import Engine
    from moescope.server.app import create_app
    from moescope.server.params import Limits
    from moescope.server.run import uvicorn_config
    from moescope.server.service import Service
    from moescope.session.turns import EngineQueue

    engine = Engine()
    try:
        loaded = engine.load(model, budget=args.budget, policy=policy, n_ctx=args.ctx,
                             n_gpu_layers=args.n_gpu_layers, n_threads=args.threads,
                             cache=not args.no_cache, ram_budget=args.ram_budget)
        print_load_notes(loaded)
        print(backend_line(engine), file=sys.stderr)
        start_audits(engine, args.audit)
        delay = os.environ.get("MOESCOPE_TEST_COPY_DELAY_US", "")
        if delay.isdigit() and engine.cache is not None:  # tests: answers that take a while
            engine.set_copy_delay(min(int(delay), 100_000))
        service = Service(engine, EngineQueue(args.queue), model_id=args.model_id,
                          limits=Limits(max_tokens=args.max_tokens,
                                        max_body_bytes=args.max_body << 20))
        app = create_app(service, api_key=api_key, cors_origins=cors_origins)
        host = f"[{args.host}]" if ":" in args.host else args.host
        if warning:
            print(f"moescope: {warning}", file=sys.stderr)
        cors = f" · pages of {', '.join(cors_origins)} allowed" if cors_origins else ""
        print(f"moescope serve · {service.model_id} · {cache_state(engine)} · context "
              f"{loaded.n_ctx} tokens · http://{host}:{args.port}/v1"
              f"{' · API key required' if api_key else ''}{cors} · Ctrl+C stops",
              file=sys.stderr, flush=True)
        uvicorn.Server(uvicorn_config(app, args.host, args.port,
                                      read_timeout_s=args.read_timeout)).run()
    finally:
        engine.close()
    return 0


MAX_MODEL_ID = 256
"""Longest ``--model-id``: API model names are short (``unsloth/Qwen3-30B-A3B``)."""


def check_model_id(name: str | None) -> None:
    """``--model-id`` is a name of at most :data:`MAX_MODEL_ID` printable characters: a
    newline or an escape sequence in it broke the one-line banner and request log (and
    reached every client's ``/v1/models``), and its length was unbounded."""
    if name is None:
        return
    if len(name) > MAX_MODEL_ID:
        raise MoEScopeError(f"--model-id is {len(name):,} characters; at most "
                            f"{MAX_MODEL_ID}")
    bad = next((c for c in name if not c.isprintable()), None)
    if bad is not None:
        raise MoEScopeError(f"--model-id holds the control character {bad!r}; give a "
                            "printable name")
