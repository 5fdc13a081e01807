"""How fast is a long prompt read in when the model is larger than the memory it may use?

A prompt longer than a governed step is prefilled on llama.cpp's own path, which reads
every expert of every MoE layer through the model's mapping. With the RAM tier on (the
experts left in the file) MoEScope has each MoE layer's experts read into the page cache
by an I/O thread while the layer before computes (`MOESCOPE_PREFILL_AHEAD`, default on);
`+noahead` turns that off (page faults only, as before). Each variant runs in its own
process in a cgroup v1/v2 memory group of ``--limit-mb`` (page cache included; root only),
the page cache dropped first; a run is the time to the first token of a fresh prompt of
``--words`` words (the KV cache cleared, so the whole prompt is prefilled). Variants
alternate; medians of ``--runs``.

    sudo .venv/bin/python bench/prefill_bench.py --model /tmp/disk-bench/MODEL.gguf \\
        --limit-mb 1400 --words 600 --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))
sys.path.insert(0, str(REPO / "bench"))

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "and", "keeps",
         "on", "running", "far", "away", "from", "its", "home", "while", "the", "sun", "goes",
         "down"]


def child(spec: dict[str, Any]) -> dict[str, Any]:
    """Inside the group: load, then one prompt's time to first token."""
    from moescope.engine import Engine, Sampling

    e = Engine()
    kw: dict[str, Any] = dict(n_ctx=spec["ctx"], n_threads=spec["threads"])
    if spec["variant"] == "stock":
        e.load(spec["model"], cache=False, host_experts=False, **kw)
    else:
        e.load(spec["model"], budget=spec["budget"], policy="quality-first",
               ram_budget=spec["ram_budget"], **kw)
    rng = random.Random(spec["seed"])
    prompt = " ".join(rng.choice(WORDS) for _ in range(spec["words"]))
    n_prompt = len(e.tokenize(prompt))
    e.clear_cache()
    t = time.perf_counter()
    for _ in e.generate(prompt, Sampling(max_tokens=1, temperature=0.0)):
        pass
    ttft = time.perf_counter() - t
    ahead = e.timings().get("n_prefill_ahead", 0) if e.cache else 0
    e.close()
    return {"ttft": ttft, "prompt_tokens": n_prompt, "layers_read_ahead": ahead}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", type=Path, default=None,
                   help="default: disk_bench's synthetic model (made if missing)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/disk-bench"))
    p.add_argument("--limit-mb", type=int, default=1400)
    p.add_argument("--words", type=int, default=600)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--budget", default="15%")
    p.add_argument("--ram-budget", default="8 slots")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--ctx", type=int, default=2048)
    p.add_argument("--variants", default="quality-first,quality-first+noahead,stock")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        Path(args.out).write_text(json.dumps(child(json.loads(args.child))))
        return 0
    if os.geteuid() != 0:
        raise SystemExit("prefill_bench needs root to make a memory cgroup")
    if not (1 <= args.runs <= 50 and 1 <= args.words <= 100_000 and 64 <= args.limit_mb
            <= 10**7 and 1 <= args.threads <= 256 and 256 <= args.ctx <= 1 << 20):
        raise SystemExit("--runs 1-50, --words 1-100000, --limit-mb >= 64, --threads 1-256, "
                         "--ctx 256-1048576")
    from disk_bench import MemoryLimit, drop_page_cache

    model = args.model
    if model is None:
        from moescope_testing.synth import ensure_synth_model, preset

        args.workdir.mkdir(parents=True, exist_ok=True)
        model = ensure_synth_model(args.workdir, preset("copy-bound", "qwen3moe", n_layers=12))
    variants = [v for v in args.variants.split(",") if v]
    print(f"model   {model.name}: {model.stat().st_size / 1e9:.2f} GB, limit {args.limit_mb} MB "
          f"(page cache included), {args.words}-word prompts, {args.threads} thread(s)")
    limit = MemoryLimit(args.limit_mb * 10**6)
    results: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        for run in range(args.runs):
            for variant in variants:
                drop_page_cache()
                spec = {"model": str(model), "variant": variant.split("+")[0],
                        "budget": args.budget, "ram_budget": args.ram_budget,
                        "threads": args.threads, "ctx": args.ctx, "words": args.words,
                        "seed": run}
                env = {**os.environ, "OMP_WAIT_POLICY": "passive"}
                if variant.endswith("+noahead"):
                    env["MOESCOPE_PREFILL_AHEAD"] = "0"
                procs = limit.procs_file()

                def enter(procs: str = procs) -> None:
                    with open(procs, "w") as f:
                        f.write(str(os.getpid()))

                # a new file of our own (a fixed name in /tmp could be anyone's symlink)
                with tempfile.NamedTemporaryFile("r", suffix=".json") as out:
                    proc = subprocess.run([sys.executable, __file__, "--child",
                                           json.dumps(spec), "--out", out.name],
                                          preexec_fn=enter, env=env, capture_output=True,
                                          text=True, check=False)
                    if proc.returncode != 0:
                        tail = (proc.stderr or proc.stdout).strip().splitlines()[-2:]
                        print(f"  {variant}: exit {proc.returncode}: {' | '.join(tail)}")
                        continue
                    r = json.loads(Path(out.name).read_text())
                results[variant].append(r)
                print(f"  run {run + 1} {variant:28s} {r['ttft']:7.1f} s", flush=True)
    finally:
        limit.close()
    print()
    print("| variant | time to first token (median, runs) | prompt tok/s | MoE layers read ahead |")
    print("|---|---:|---:|---:|")
    for variant, rows in results.items():
        if not rows:
            continue
        ttft = statistics.median(r["ttft"] for r in rows)
        n = rows[0]["prompt_tokens"]
        runs = " / ".join(f"{r['ttft']:.1f}" for r in rows)
        print(f"| {variant} | {ttft:.1f} s ({runs}) | {n / ttft:.0f} | "
              f"{rows[0]['layers_read_ahead']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
