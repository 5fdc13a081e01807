#!/usr/bin/env python3
"""Engine benchmark: decode speed of every cache configuration, side by side in one run.

Variants (each in its own worker process, loaded once, asked in round-robin so that
machine noise hits all of them alike; medians of --reps runs of --tokens decoded tokens):

  stock        unpatched llama-cpp-python 0.3.36 (same flags; experts may be repacked)
  cache-off    our patched engine with the cache off           -> overhead of the patch
  exact-100    cache on, every expert resident, policy exact
  exact-25     25% of experts resident, fetch every miss        -> the paper's reference
  quality-25   25%, quality-first (0.15 rule + frequency + admission beta 0.5)
  speed-25     25%, speed-first (first-choice rule + frequency + admission beta 0.5)

The model is synthetic and copy-bound (default: 16 layers x 128 experts, top-8,
n_embd 1024, q8_0 experts, ~3.2 GiB), written once into $MOESCOPE_CACHE/bench-models.
On a CPU-only machine slots are host RAM and a "fetch" is a memcpy, so absolute numbers
say little about a GPU; the ratios show what the policies save.

    .venv/bin/python bench/engine_bench.py [--reps 5] [--tokens 128] [--layers 16]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

VARIANTS: dict[str, dict[str, Any]] = {
    "stock": {"stock": True},
    "cache-off": {"cache": False},
    "exact-100": {"cache": True, "budget": "100%", "policy": "exact"},
    "exact-25": {"cache": True, "budget": "25%", "policy": "exact"},
    "quality-25": {"cache": True, "budget": "25%", "policy": "quality-first"},
    "speed-25": {"cache": True, "budget": "25%", "policy": "speed-first"},
}
PROMPT = "The quick brown fox jumps over the lazy dog. " * 4


# ----------------------------------------------------------------------------- worker
def worker(model: str, variant: str, tokens: int, threads: int) -> None:
    """Load once, then answer 'run' lines on stdin with one JSON line per run."""
    cfg = VARIANTS[variant]
    events_fn = None
    if cfg.get("stock") or not cfg.get("cache"):
        import llama_cpp

        if not cfg.get("stock"):
            from moescope.engine.bindings import engine_library

            engine_library().llama_moe_set_host_experts(False)
        llm = llama_cpp.Llama(model_path=model, n_ctx=tokens + 256, n_threads=threads,
                              verbose=False)
    else:
        from moescope.engine import Engine

        eng = Engine()
        eng.load(model, budget=cfg["budget"], policy=cfg["policy"], n_ctx=tokens + 256,
                 n_threads=threads)
        llm = eng._llm
        events_fn = eng.drain_events
    import llama_cpp

    prompt = llm.tokenize(PROMPT.encode(), add_bos=True)
    print(json.dumps({"ready": variant, "version": llama_cpp.__version__}), flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        llm.reset()
        llm._ctx.kv_cache_clear()
        if events_fn:
            events_fn()
        gen = llm.generate(prompt, temp=0.0, top_k=1, repeat_penalty=1.0, reset=True)
        t_first = t_last = 0.0
        for n, _ in enumerate(gen):  # greedy: the same computation every run
            now = time.perf_counter()
            if n == 0:
                t_first = now
            t_last = now
            if n >= tokens:
                break
        gen.close()
        result: dict[str, Any] = {"tok_s": tokens / (t_last - t_first)}
        if events_fn:
            from moescope.engine.stats import CacheTotals

            c = CacheTotals.from_events(events_fn(), tokens=tokens + 1)
            result.update(hit_rate=c.hit_rate, substituted=c.substituted_fraction,
                          mass_per_token=c.mass_per_token,
                          fetched_mb_per_token=c.fetched_mb_per_token)
        print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------- driver
def stock_site(python: str) -> str:
    """A folder with the unpatched llama_cpp package (built and cached like the engine)."""
    out = subprocess.run([python, str(REPO / "engine_patch" / "build_engine.py"), "--stock"],
                         check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


def bench_model(layers: int) -> Path:
    from moescope_testing import ensure_synth_model, preset

    cache = Path(os.environ.get("MOESCOPE_CACHE", Path.home() / ".cache" / "moescope"))
    return ensure_synth_model(cache / "bench-models",
                              preset("copy-bound", "qwen3moe", n_layers=layers))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", type=Path, help="write results here")
    ap.add_argument("--worker", nargs=2, metavar=("MODEL", "VARIANT"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker[0], args.worker[1], args.tokens, args.threads)
        return 0

    names = args.variants.split(",")
    t0 = time.time()
    model = bench_model(args.layers)
    print(f"model: {model.name} ({model.stat().st_size / 2**30:.2f} GiB), "
          f"{args.tokens} tokens x {args.reps} reps, {args.threads} threads", flush=True)
    procs: dict[str, subprocess.Popen[str]] = {}
    for name in names:
        env = dict(os.environ)
        if VARIANTS[name].get("stock"):
            env["PYTHONPATH"] = stock_site(sys.executable)
        procs[name] = subprocess.Popen(
            [sys.executable, __file__, "--worker", str(model), name, "--tokens",
             str(args.tokens), "--threads", str(args.threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        ready = json.loads(procs[name].stdout.readline())  # type: ignore[union-attr]
        print(f"  {name:11s} loaded ({ready['version']})", flush=True)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for rep in range(args.reps):
        order = names[rep % len(names):] + names[:rep % len(names)]  # rotate the order
        for name in order:
            p = procs[name]
            p.stdin.write("run\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
            runs[name].append(json.loads(p.stdout.readline()))  # type: ignore[union-attr]
        print(f"  rep {rep + 1}/{args.reps} done", flush=True)
    for p in procs.values():
        p.stdin.close()  # type: ignore[union-attr]
        p.wait()
    med = {n: statistics.median(r["tok_s"] for r in runs[n]) for n in names}
    rows = []
    print()
    print(f"{'variant':12s} {'tok/s':>8s} {'vs stock':>9s} {'vs exact-25':>12s} "
          f"{'hit':>6s} {'subst':>6s} {'mass/tok':>9s} {'MB/tok':>7s}")
    for n in names:
        last = runs[n][-1]
        row = {"variant": n, "tok_s_median": med[n],
               "tok_s_runs": [r["tok_s"] for r in runs[n]],
               "vs_stock": med[n] / med["stock"] if "stock" in med else None,
               "vs_exact_25": med[n] / med["exact-25"] if "exact-25" in med else None,
               **{k: v for k, v in last.items() if k != "tok_s"}}
        rows.append(row)

        def fmt(v: float | None, spec: str) -> str:
            return format(v, spec) if v is not None else "-"

        print(f"{n:12s} {med[n]:8.2f} {fmt(row['vs_stock'], '9.3f')} "
              f"{fmt(row['vs_exact_25'], '12.3f')} {fmt(last.get('hit_rate'), '6.1%')} "
              f"{fmt(last.get('substituted'), '6.1%')} "
              f"{fmt(last.get('mass_per_token'), '9.3f')} "
              f"{fmt(last.get('fetched_mb_per_token'), '7.1f')}")
    print(f"\n({time.time() - t0:.0f} s)")
    if args.json:
        args.json.write_text(json.dumps({"model": model.name, "tokens": args.tokens,
                                         "reps": args.reps, "rows": rows}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
