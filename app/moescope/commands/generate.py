"""``moescope generate MODEL --prompt TEXT --policy P --budget B [--n N] [--seed S]``.

Generates with the expert cache on and ends with one summary line: tokens/s, hit rate,
fetched MB per token, % of expert calls substituted, mean substituted mass per token — the
numbers that say what the policy traded.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from moescope.core.errors import MoEScopeError
from moescope.core.policy import PRESET_NAMES
from moescope.core.resources import demo_model_path


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "generate", help="generate text with the expert cache and print what it did",
        description="Generate from a prompt with the expert cache on; prints the text, then "
                    "a summary line of the cache's work.")
    p.add_argument("model", type=Path, nargs="?", metavar="MODEL.gguf",
                   help="GGUF model (default: the bundled demo model)")
    p.add_argument("--prompt", "-p", default="ROMEO:", help="prompt text (raw, no template)")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message in the model's chat template")
    p.add_argument("--policy", default="quality-first", choices=PRESET_NAMES,
                   help="expert-cache policy (default quality-first)")
    p.add_argument("--budget", default="25%",
                   help="VRAM for expert slots: 25%% of experts, 12GiB, 512MiB ...")
    p.add_argument("--n", type=int, default=128, help="tokens to generate (default 128)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--n-gpu-layers", type=int, default=0, help="layers on the GPU (default 0)")
    p.add_argument("--no-cache", action="store_true", help="run stock llama.cpp (cache off)")
    p.add_argument("--trace", type=Path, metavar="FILE.jsonl[.gz]",
                   help="record a session trace (replay it with `moescope replay`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from moescope.engine import Engine, Message, Sampling

    model = args.model or demo_model_path()
    if model is None:
        raise MoEScopeError("no model given and no demo model in resources/models/")
    engine = Engine()
    loaded = engine.load(model, budget=args.budget, policy=args.policy,
                         n_gpu_layers=args.n_gpu_layers, cache=not args.no_cache)
    if loaded.notice:
        print(f"moescope: {loaded.notice}", file=sys.stderr)
    prompt: Any = [Message("user", args.prompt)] if args.chat else args.prompt
    sampling = Sampling(temperature=args.temperature, max_tokens=args.n, seed=args.seed)
    recorder = None
    if args.trace:
        from moescope.core.trace import TraceRecorder

        recorder = TraceRecorder.for_engine(args.trace, engine)
    if not args.chat:
        sys.stdout.write(args.prompt)
    try:
        for tok in engine.generate(prompt, sampling):
            if recorder is not None:
                recorder.record(tok, engine)
            sys.stdout.write(tok.text)
            sys.stdout.flush()
    finally:
        if recorder is not None:
            recorder.close(stop_reason=engine.last_answer.stop_reason)
    sys.stdout.write("\n")
    a = engine.last_answer
    c = a.cache
    cache_state = (f"{engine.policy_name} @ {loaded.plan.slots_per_layer}/"
                   f"{loaded.plan.n_expert} slots" if loaded.cache_enabled and loaded.plan
                   else "cache off")
    print(f"[{cache_state}] {a.tokens_per_second:.1f} tok/s | hit {c.hit_rate:.1%} | "
          f"fetched {c.fetched_mb_per_token:.3f} MB/tok | substituted "
          f"{c.substituted_fraction:.1%} | mass/tok {c.mass_per_token:.3f} | "
          f"{a.n_tokens} tokens, stop: {a.stop_reason}")
    engine.close()
    return 0
