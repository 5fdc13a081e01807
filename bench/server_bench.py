"""What does the HTTP server cost? tok/s through ``moescope serve`` against in-process.

One engine in this process and one ``moescope serve`` child process load the same model
with the same policy, budget and threads. Variants run round-robin (so machine noise hits
all alike), with the same seeded sampling, from the same prompt:

- ``in-process``: ``Engine.generate`` consumed in a loop (what ``moescope generate`` does);
- ``server, whole``: ``POST /v1/completions`` (no streaming), timed by the client;
- ``server, stream``: the same with ``stream: true``, tokens timed as SSE chunks arrive.

tok/s is tokens / (last token's arrival - the call), end to end: the streamed answer
arrives in chunks of several tokens (one write per 10 ms at most), so a rate between
chunks would not mean what the engine's decode rate means;
CPU ms per token is the CPU time of the process that generates (this one in-process, the
server's for the others, all its threads: decode, event loop, HTTP) over the run: on a
shared, loaded machine wall-clock tok/s swings several-fold run to run, CPU time much less.
TTFT is from the request (or the call) to the first token. Then 4 clients send at once:
one generates, three wait in the queue; the table gives their total throughput and each
one's time to first token, queue wait included. Seeded sampling under ``exact`` (the
default) makes every run decode the same tokens, wherever it runs. A raw HTTP client
(httpx) is used so the client's own parsing costs as little as it can.

    .venv/bin/python bench/server_bench.py --reps 5 --tokens 256
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

PROMPT = "ROMEO:"
SAMPLING = {"temperature": 0.8, "top_p": 0.95, "top_k": 40, "min_p": 0.05,
            "repeat_penalty": 1.0, "seed": 7}
"""The same sampling in both (seeded: under ``exact`` every run decodes the same tokens)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(model: Path, policy: str, budget: str, threads: int,
                  port: int) -> subprocess.Popen[bytes]:
    import httpx2 as httpx

    argv = [sys.executable, "-c", "import sys; from moescope.cli import main; sys.exit(main())",
            "serve", str(model), "--port", str(port), "--policy", policy, "--budget", budget,
            "--threads", str(threads), "--ctx", "4096", "--queue", "8"]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("moescope serve did not start")


def _in_process(engine: Any, tokens: int) -> dict[str, float]:
    from moescope.engine import Sampling

    c0 = time.process_time()
    t0 = time.perf_counter()
    times = [time.perf_counter() for _ in engine.generate(
        PROMPT, Sampling(max_tokens=tokens, **SAMPLING))]
    out = _numbers(t0, times, len(times))
    out["cpu_ms"] = (time.process_time() - c0) * 1000 / max(len(times), 1)
    return out


def _cpu_s(process: Any) -> float:
    t = process.cpu_times()
    return float(t.user + t.system)


def _measured(process: Any, run: Any) -> dict[str, float]:
    """``run()``'s numbers plus the server process's CPU ms per token."""
    c0 = _cpu_s(process)
    out: dict[str, float] = run()
    out["cpu_ms"] = (_cpu_s(process) - c0) * 1000 / max(out["tokens"], 1)
    return out


def _numbers(t0: float, times: list[float], n: int) -> dict[str, float]:
    total = times[-1] - t0 if times else 0.0
    return {"tok_s": n / total if total > 0 else 0.0,
            "ttft_s": times[0] - t0 if times else 0.0, "tokens": n}


def _body(tokens: int, stream: bool) -> dict[str, Any]:
    return {"prompt": PROMPT, "max_tokens": tokens, **SAMPLING, "stream": stream,
            "stream_options": {"include_usage": True} if stream else None}


def _whole(client: Any, tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    r = client.post("/v1/completions", json=_body(tokens, False))
    t1 = time.perf_counter()
    r.raise_for_status()
    body = r.json()
    m = body["moescope"]
    n = body["usage"]["completion_tokens"]
    # the client sees no token before the last: TTFT is the server's own
    return {"tok_s": n / (t1 - t0), "ttft_s": m["ttft_s"] + m["queued_s"], "tokens": n}


def _stream(client: Any, tokens: int) -> dict[str, float]:
    t0 = time.perf_counter()
    times: list[float] = []
    n = 0
    with client.stream("POST", "/v1/completions", json=_body(tokens, True)) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            now = time.perf_counter()
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                n = chunk["usage"]["completion_tokens"]
            elif chunk["choices"] and chunk["choices"][0]["text"]:
                times.append(now)
    return _numbers(t0, times, n or len(times))


def _concurrent(port: int, tokens: int, clients: int) -> dict[str, Any]:
    import httpx2 as httpx

    results: list[dict[str, float]] = []
    lock = threading.Lock()
    barrier = threading.Barrier(clients)

    def one() -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as c:
            barrier.wait()
            r = _stream(c, tokens)
        with lock:
            results.append(r)

    t0 = time.perf_counter()
    threads = [threading.Thread(target=one) for _ in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    total = sum(r["tokens"] for r in results)
    return {"wall_s": wall, "tokens": total, "tok_s": total / wall,
            "ttft_s": sorted(r["ttft_s"] for r in results)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path, nargs="?", help="GGUF (default: the demo model)")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--policy", default="exact",
                        help="default exact: every variant decodes the same tokens")
    parser.add_argument("--budget", default="25%")
    parser.add_argument("--threads", type=int, default=1,
                        help="llama.cpp threads (default 1: steadier on a loaded machine)")
    parser.add_argument("--clients", type=int, default=4)
    args = parser.parse_args()

    import httpx2 as httpx
    import psutil

    from moescope.engine import Engine
    from moescope.util.resources import demo_model_path

    model = args.model or demo_model_path()
    port = _free_port()
    server = _start_server(model, args.policy, args.budget, args.threads, port)
    served = psutil.Process(server.pid)
    engine = Engine()
    engine.load(model, budget=args.budget, policy=args.policy, n_threads=args.threads,
                n_ctx=4096)
    runs: dict[str, list[dict[str, float]]] = {"in-process": [], "server, whole": [],
                                               "server, stream": []}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=300) as client:
            for fn in (lambda: _in_process(engine, args.tokens),
                       lambda: _whole(client, args.tokens),
                       lambda: _stream(client, args.tokens)):
                fn()  # warm-up, not counted
            variants = list(runs)
            for rep in range(args.reps):
                order = variants[rep % 3:] + variants[:rep % 3]
                for name in order:
                    if name == "in-process":
                        runs[name].append(_in_process(engine, args.tokens))
                    elif name == "server, whole":
                        runs[name].append(_measured(served, lambda: _whole(client,
                                                                           args.tokens)))
                    else:
                        runs[name].append(_measured(served, lambda: _stream(client,
                                                                            args.tokens)))
            single = statistics.median(r["tok_s"] for r in runs["server, stream"])
            crowd = [_concurrent(port, args.tokens, args.clients) for _ in range(args.reps)]
    finally:
        server.terminate()
        server.wait(timeout=30)
        engine.close()

    base = statistics.median(r["tok_s"] for r in runs["in-process"])
    print(f"model {model.name} · {args.policy} @ {args.budget} · threads {args.threads} · "
          f"up to {args.tokens} seeded tokens · medians of {args.reps} · pid {os.getpid()}")
    print()
    cpu_base = statistics.median(r["cpu_ms"] for r in runs["in-process"])
    print("| variant | tok/s, end to end (median) | runs | vs in-process | paired | "
          "CPU ms/token (median) | CPU vs in-process | TTFT ms (median) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        tok = statistics.median(r["tok_s"] for r in rs)
        ttft = statistics.median(r["ttft_s"] for r in rs) * 1000
        cpu = statistics.median(r["cpu_ms"] for r in rs)
        each = ", ".join(f"{r['tok_s']:.0f}" for r in rs)
        paired = statistics.median(r["tok_s"] / b["tok_s"]
                                   for r, b in zip(rs, runs["in-process"], strict=True))
        print(f"| {name} | {tok:.1f} | {each} | {tok / base:.3f} | {paired:.3f} | "
              f"{cpu:.3f} | {cpu / cpu_base:.3f} | {ttft:.1f} |")
    print("\npaired: the median of each rep's ratio to the in-process run of the same rep "
          "(run back to back, so the machine's slow drifts cancel).\nTTFT: in-process and "
          "stream as the caller sees it; whole: the server's own (the client sees no token "
          "before the last).\n")
    wall = statistics.median(c["tok_s"] for c in crowd)
    ttfts = [statistics.median(c["ttft_s"][i] for c in crowd) * 1000
             for i in range(args.clients)]
    print(f"| {args.clients} clients at once (queued) | total tok/s (median) | vs one "
          f"client, end to end | TTFT ms, 1st..{args.clients}th served (median) |")
    print("|---|---|---|---|")
    per_round = sum(c["tokens"] for c in crowd) // len(crowd)
    waits = ", ".join(f"{t:.0f}" for t in ttfts)
    print(f"| {per_round} tokens per round | {wall:.1f} | {wall / single:.3f} | {waits} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
