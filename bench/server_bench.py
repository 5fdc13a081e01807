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

``--baseline-app DIR`` adds a second server run from another checkout's ``app`` folder
(e.g. ``git archive COMMIT app | tar -x -C /tmp/base``), measured in the same rounds:
a change to the server is compared with the code before it on the same machine at the
same moment, which on a shared machine is the only comparison that means anything.
Load averages are printed before and after.

    .venv/bin/python bench/server_bench.py --reps 5 --tokens 256
    .venv/bin/python bench/server_bench.py MODEL.gguf --budget 100% --seed 1 --tokens 64
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
"""The same sampling in both (seeded: under ``exact`` every run decodes the same tokens);
``--seed`` replaces the seed (one with which the model does not end its answer early)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start_server(model: Path, policy: str, budget: str, threads: int,
                  port: int, app: Path | None = None) -> subprocess.Popen[bytes]:
    """``moescope serve`` from this checkout, or from ``app`` (another checkout's)."""
    import httpx2 as httpx

    argv = [sys.executable, "-c", "import sys; from moescope.cli import main; sys.exit(main())",
            "serve", str(model), "--port", str(port), "--policy", policy, "--budget", budget,
            "--threads", str(threads), "--ctx", "4096", "--queue", "8"]
    env = {**os.environ, "PYTHONPATH": str(app.resolve())} if app is not None else None
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            env=env)
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


def _cpu_s(process: Any) -> tuple[float, float]:
    """CPU seconds of the server process: (its main thread, the event loop; all others:
    the decode thread and any llama.cpp threads). From the scheduler's nanosecond counts
    where Linux has them (``/proc/PID/task/TID/schedstat``): psutil's 10 ms ticks are
    about 10% of a 147-token answer's CPU time."""
    tasks = Path(f"/proc/{process.pid}/task")
    try:
        loop = other = 0.0
        for task in tasks.iterdir():
            ns = int((task / "schedstat").read_text().split()[0]) / 1e9
            if task.name == str(process.pid):
                loop += ns
            else:
                other += ns
        return loop, other
    except (OSError, ValueError, IndexError):
        t = process.cpu_times()
        return 0.0, float(t.user + t.system)


def _measured(process: Any, run: Any) -> dict[str, float]:
    """``run()``'s numbers plus the server process's CPU ms per token (all threads, and
    the event loop's share)."""
    loop0, other0 = _cpu_s(process)
    out: dict[str, float] = run()
    loop1, other1 = _cpu_s(process)
    n = max(out["tokens"], 1)
    out["cpu_ms"] = (loop1 + other1 - loop0 - other0) * 1000 / n
    out["loop_ms"] = (loop1 - loop0) * 1000 / n
    return out


_FEED_COST = """
import json, sys, time
from moescope.server.service import TextStream
pieces = json.load(sys.stdin)
out = {}
for name, stops, split in (("completion", [], False), ("chat", [], True),
                           ("chat, 1 stop", ["###"], True)):
    best = float("inf")
    for _ in range(9):
        t0 = time.perf_counter()
        for _ in range(20):
            s = TextStream(stops, split=split)
            for p in pieces:
                s.feed(p)
            s.finish()
        best = min(best, (time.perf_counter() - t0) / (20 * len(pieces)))
    out[name] = best * 1e6
print(json.dumps(out))
"""


def _feed_cost(pieces: list[str], app: Path | None) -> dict[str, float]:
    """Microseconds per token of the server's own work on the decode thread (stop
    sequences and the thinking split: ``TextStream.feed``) over a real answer's pieces,
    best of 9 (the least disturbed by the machine's load), in a child process that
    imports this checkout's server or ``app``'s."""
    env = {**os.environ, "PYTHONPATH": str((app or REPO / "app").resolve())}
    out = subprocess.run([sys.executable, "-c", _FEED_COST], input=json.dumps(pieces),
                         capture_output=True, text=True, env=env, timeout=300)
    if out.returncode != 0:
        print(f"TextStream cost not measured: {out.stderr.strip().splitlines()[-1:]}",
              file=sys.stderr)
        return {}
    return {k: float(v) for k, v in json.loads(out.stdout).items()}


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


def _print_costs(costs: dict[str, dict[str, float]], n: int) -> None:
    first = next(iter(costs.values()))
    print(f"| server work per token on the decode thread (TextStream.feed, µs, best of 9, "
          f"{n} real pieces) | {' | '.join(first)} |")
    print(f"|---|{'---|' * len(first)}")
    for name, c in costs.items():
        print(f"| {name} | {' | '.join(f'{v:.2f}' for v in c.values())} |")
    print()


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
    parser.add_argument("--seed", type=int, default=SAMPLING["seed"])
    parser.add_argument("--baseline-app", type=Path, metavar="DIR",
                        help="also serve from this app folder (another checkout's) and "
                             "compare, same rounds")
    args = parser.parse_args()
    if not 1 <= args.reps <= 1000 or not 1 <= args.tokens <= 4096 \
            or not 1 <= args.clients <= 8 or not 1 <= args.threads <= 256:
        parser.error("--reps 1-1000, --tokens 1-4096, --clients 1-8, --threads 1-256")
    if args.baseline_app is not None and not (args.baseline_app / "moescope").is_dir():
        parser.error(f"--baseline-app {args.baseline_app}: no moescope package there")
    SAMPLING["seed"] = args.seed

    import httpx2 as httpx
    import psutil

    from moescope.engine import Engine, Sampling
    from moescope.util.resources import demo_model_path

    model = args.model or demo_model_path()
    load_before = os.getloadavg()
    port = _free_port()
    servers = {"server": _start_server(model, args.policy, args.budget, args.threads, port)}
    ports = {"server": port}
    if args.baseline_app is not None:
        ports["baseline"] = _free_port()
        servers["baseline"] = _start_server(model, args.policy, args.budget, args.threads,
                                            ports["baseline"], args.baseline_app)
    engine = Engine()
    engine.load(model, budget=args.budget, policy=args.policy, n_threads=args.threads,
                n_ctx=4096)
    clients = {name: httpx.Client(base_url=f"http://127.0.0.1:{p}", timeout=300)
               for name, p in ports.items()}
    procs = {name: psutil.Process(proc.pid) for name, proc in servers.items()}
    variants: dict[str, Any] = {"in-process": lambda: _in_process(engine, args.tokens)}
    for name, client in clients.items():
        label = "server" if name == "server" else "baseline server"
        variants[f"{label}, whole"] = (
            lambda c=client, p=procs[name]: _measured(p, lambda: _whole(c, args.tokens)))
        variants[f"{label}, stream"] = (
            lambda c=client, p=procs[name]: _measured(p, lambda: _stream(c, args.tokens)))
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in variants}
    try:
        for fn in variants.values():
            fn()  # warm-up, not counted
        names = list(variants)
        for rep in range(args.reps):
            k = rep % len(names)
            for name in names[k:] + names[:k]:
                runs[name].append(variants[name]())
        single = statistics.median(r["tok_s"] for r in runs["server, stream"])
        crowd = [_concurrent(port, args.tokens, args.clients) for _ in range(args.reps)]
        pieces = [t.text for t in engine.generate(PROMPT, Sampling(max_tokens=args.tokens,
                                                                   **SAMPLING))]
    finally:
        for client in clients.values():
            client.close()
        for proc in servers.values():
            proc.terminate()
            proc.wait(timeout=30)
        engine.close()
    load_after = os.getloadavg()
    costs = {"server": _feed_cost(pieces, None)}
    if args.baseline_app is not None:
        costs["baseline server"] = _feed_cost(pieces, args.baseline_app)

    base = statistics.median(r["tok_s"] for r in runs["in-process"])
    print(f"model {model.name} · {args.policy} @ {args.budget} · threads {args.threads} · "
          f"up to {args.tokens} tokens, seed {args.seed} · medians of {args.reps} · load "
          f"average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
          f"({os.cpu_count()} CPUs)")
    print()
    cpu_base = statistics.median(r["cpu_ms"] for r in runs["in-process"])
    print("| variant | tok/s, end to end (median) | runs | vs in-process | paired | "
          "CPU ms/token (median) | of which event loop | CPU vs in-process | "
          "TTFT ms (median) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        tok = statistics.median(r["tok_s"] for r in rs)
        ttft = statistics.median(r["ttft_s"] for r in rs) * 1000
        cpu = statistics.median(r["cpu_ms"] for r in rs)
        loop = statistics.median(r.get("loop_ms", 0.0) for r in rs)
        each = ", ".join(f"{r['tok_s']:.0f}" for r in rs)
        paired = statistics.median(r["tok_s"] / b["tok_s"]
                                   for r, b in zip(rs, runs["in-process"], strict=True))
        print(f"| {name} | {tok:.1f} | {each} | {tok / base:.3f} | {paired:.3f} | "
              f"{cpu:.3f} | {loop:.3f} | {cpu / cpu_base:.3f} | {ttft:.1f} |")
    if args.baseline_app is not None:
        for kind in ("whole", "stream"):
            ours, theirs = runs[f"server, {kind}"], runs[f"baseline server, {kind}"]
            ratio = statistics.median(a["tok_s"] / b["tok_s"]
                                      for a, b in zip(ours, theirs, strict=True))
            cpu = statistics.median(a["cpu_ms"] / b["cpu_ms"]
                                    for a, b in zip(ours, theirs, strict=True))
            print(f"\nserver vs baseline server, {kind}: tok/s x{ratio:.3f}, CPU per token "
                  f"x{cpu:.3f} (paired medians)", end="")
        print()
    print("\npaired: the median of each rep's ratio to the in-process run of the same rep "
          "(run back to back, so the machine's slow drifts cancel).\nTTFT: in-process and "
          "stream as the caller sees it; whole: the server's own (the client sees no token "
          "before the last).\n")
    costs = {name: c for name, c in costs.items() if c}
    if costs:
        _print_costs(costs, len(pieces))
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
