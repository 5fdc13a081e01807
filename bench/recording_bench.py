"""What does recording a session trace cost the decode thread, per model geometry?

The trace recorder runs on the engine's thread after every token (so a crash loses at most
the last one): it reads the router inputs of every MoE layer, ranks PSR's predictions,
and hands the token to a writer thread (JSON Lines, or the Arrow stream the window
records). That cost grows with layers x experts, so it is measured on
synthetic models with the cache geometry of the models users run (tiny hidden sizes:
the decode itself is cheap here, the recorder's work is not) and reported per token, next
to decode without recording. Variants run round-robin, each from an empty cache, on the
same greedy tokens; medians of ``--reps`` runs. A second table gives each trace's size on
disk and the time to read it back, per token.

    .venv/bin/python bench/recording_bench.py --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

GEOMETRIES = {
    "demo (6 x 64, top-4)": (6, 64, 4),
    "Qwen3-30B-A3B (48 x 128, top-8)": (48, 128, 8),
    "Qwen3-Next-80B-A3B (48 x 512, top-10)": (48, 512, 10),
}
VARIANTS = ("no trace", "trace, no router inputs", "trace, f32 router inputs",
            "trace, f32 router inputs, .arrows")
"""JSON Lines unless the variant names another suffix (the window records ``.arrows``)."""
PROMPT = "The quick brown fox jumps over the lazy dog and keeps on running."


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=100)
    parser.add_argument("--models", type=Path, default=Path(tempfile.gettempdir())
                        / "moescope-recording-bench")
    args = parser.parse_args()

    from moescope.engine import Engine, Sampling
    from moescope.trace import TraceRecorder, read_trace
    from moescope_testing.synth import SynthSpec, ensure_synth_model

    sampling = Sampling(temperature=0.0, max_tokens=args.tokens, seed=0)
    footprint: list[str] = []
    print("| geometry | variant | tok/s (median) | recording ms/token (median) | vs no trace |")
    print("|---|---|---:|---:|---:|")
    for label, (layers, experts, k) in GEOMETRIES.items():
        spec = SynthSpec(arch="qwen3moe", n_layers=layers, n_expert=experts, top_k=k,
                         n_embd=64, n_ff_exp=32, expert_type="q8_0", ctx=1024)
        engine = Engine()
        engine.load(ensure_synth_model(args.models, spec), budget="25%", policy="psr",
                    n_ctx=1024)
        rates: dict[str, list[float]] = {v: [] for v in VARIANTS}
        costs: dict[str, list[float]] = {v: [] for v in VARIANTS}
        reads: dict[str, list[float]] = {v: [] for v in VARIANTS}
        sizes: dict[str, list[float]] = {v: [] for v in VARIANTS}
        with tempfile.TemporaryDirectory() as tmp:
            for rep in range(args.reps):
                order = VARIANTS[rep % len(VARIANTS):] + VARIANTS[:rep % len(VARIANTS)]
                for variant in order:
                    engine.clear_cache()
                    recorder = None if variant == "no trace" else TraceRecorder.for_engine(
                        Path(tmp) / f"{rep}-{len(variant)}{_suffix(variant)}", engine,
                        router_inputs="f32" if "f32" in variant else None)
                    n, spent, t0 = 0, 0.0, time.perf_counter()
                    for stats in engine.generate(PROMPT, sampling):
                        n += 1
                        if recorder is not None:
                            t = time.perf_counter()
                            recorder.record(stats, engine)
                            spent += time.perf_counter() - t
                    rates[variant].append(n / (time.perf_counter() - t0))
                    costs[variant].append(spent / n * 1000.0)
                    if recorder is not None:
                        recorder.close()
                        t = time.perf_counter()
                        n_read = len(read_trace(recorder.path).tokens)
                        reads[variant].append((time.perf_counter() - t) / n_read * 1000.0)
                        sizes[variant].append(recorder.path.stat().st_size / n_read)
        engine.close()
        base = statistics.median(rates["no trace"])
        for variant in VARIANTS:
            rate = statistics.median(rates[variant])
            print(f"| {label} | {variant} | {rate:.1f} | "
                  f"{statistics.median(costs[variant]):.2f} | {rate / base:.2f}x |", flush=True)
            if reads[variant]:
                footprint.append(f"| {label} | {variant} | "
                                 f"{statistics.median(sizes[variant]) / 1000:.1f} | "
                                 f"{statistics.median(reads[variant]):.2f} |")
    print("\nOn disk and read back (`read_trace`, what opening a trace costs):\n")
    print("| geometry | variant | kB/token | read ms/token |")
    print("|---|---|---:|---:|")
    print("\n".join(footprint))
    return 0


def _suffix(variant: str) -> str:
    return variant.rsplit(", ", 1)[1] if variant.endswith(".arrows") else ".jsonl"


if __name__ == "__main__":
    raise SystemExit(main())
