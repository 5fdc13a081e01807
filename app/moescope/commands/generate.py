"""``moescope generate MODEL --prompt TEXT --policy P --budget B [--n N] [--seed S]``.

Generates with the expert cache on and ends with one summary line: tokens/s, hit rate,
fetched MB per token, % of expert calls substituted, mean substituted mass per token — the
numbers that say what the policy traded.

The helpers at the end of this module (default model, policy spec, sampling options, the
summary line) are shared with ``chat`` and ``bench``, so every command takes the same
options and reports the cache's work in the same words.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.core.errors import MoEScopeError
from moescope.core.policy import PRESET_NAMES, Policy
from moescope.core.resources import demo_model_path

if TYPE_CHECKING:  # the engine loads llama.cpp: import it only where a command runs
    from moescope.core.trace import TraceRecorder
    from moescope.engine import CacheTotals, Engine, Sampling


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
    p.add_argument("--policy", default="quality-first", metavar="POLICY",
                   help=f"expert-cache policy: {', '.join(PRESET_NAMES)}, or "
                        f"preset:key=value, e.g. threshold:theta=0.3 (default quality-first)")
    p.add_argument("--budget", default="25%",
                   help="VRAM for expert slots: 25%% of experts, 12GiB, 512MiB, or 16 "
                        "(slots per layer)")
    p.add_argument("--ram-budget", default=None, metavar="B",
                   help="host memory for experts (same units as --budget); experts beyond "
                        "it stay in the model file and are read on demand (default: all)")
    add_sampling_arguments(p, n_default=128, n_help="tokens to generate")
    p.add_argument("--n-gpu-layers", type=int, default=0, help="layers on the GPU (default 0)")
    p.add_argument("--no-cache", action="store_true", help="run stock llama.cpp (cache off)")
    p.add_argument("--trace", type=Path, metavar="FILE.jsonl[.gz]",
                   help="record a session trace (replay it with `moescope replay`)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from moescope.engine import Engine, Message

    sampling = sampling_from_args(args)  # fail fast, before loading
    policy = parse_live_policy(args.policy)
    check_output_path(args.trace, "--trace")
    model = resolve_model(args.model)
    engine = Engine()
    loaded = engine.load(model, budget=args.budget, policy=policy,
                         n_gpu_layers=args.n_gpu_layers, cache=not args.no_cache,
                         ram_budget=args.ram_budget)
    if loaded.notice:
        print(f"moescope: {loaded.notice}", file=sys.stderr)
    prompt: Any = [Message("user", args.prompt)] if args.chat else args.prompt
    recorder = None
    if args.trace:
        recorder = open_trace(args.trace, engine)
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
    print(answer_summary(engine))
    engine.close()
    return 0


# ---------------------------------------------------------------- shared with chat, bench
def resolve_model(path: Path | None) -> Path:
    """The model to load: the one given, else the bundled demo model."""
    model = path or demo_model_path()
    if model is None:
        raise MoEScopeError("no model given and no demo model in resources/models/")
    return model


def parse_live_policy(spec: str) -> Policy:
    """A preset or ``preset:key=value`` (replay's syntax, without its ``recorded``)."""
    from moescope.sim.sweep import parse_policy

    name = spec.strip().split(":", 1)[0]
    if name not in PRESET_NAMES:
        raise MoEScopeError(f"unknown policy {name!r} (known: {', '.join(PRESET_NAMES)})")
    policy = parse_policy(spec)
    assert policy is not None  # only 'recorded' parses to None
    return policy


def add_sampling_arguments(p: argparse.ArgumentParser, *, n_default: int,
                           n_help: str) -> None:
    """``--n``, ``--seed``, ``--temperature``: the same spelling in every command."""
    p.add_argument("--n", type=int, default=n_default, help=f"{n_help} (default {n_default})")
    p.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    p.add_argument("--temperature", type=float, default=0.7)


def sampling_from_args(args: argparse.Namespace) -> Sampling:
    """The :class:`Sampling` that :func:`add_sampling_arguments`' options describe.

    Checked here, before a model loads: ``--n 0`` would otherwise still generate one token,
    and a NaN temperature samples garbage without a word.
    """
    from moescope.engine import Sampling

    if args.n < 1:
        raise MoEScopeError(f"--n must be at least 1, got {args.n}")
    if not math.isfinite(args.temperature) or args.temperature < 0:
        raise MoEScopeError(f"--temperature must be a number >= 0 (0 is greedy), got "
                            f"{args.temperature}")
    return Sampling(temperature=args.temperature, max_tokens=args.n, seed=args.seed)


def check_output_path(path: Path | None, option: str) -> None:
    """Refuse an output file that cannot be created, before the work that fills it: a
    typo in ``--json`` must not cost a benchmark's minutes, nor ``--trace`` a traceback
    after the model has loaded."""
    if path is None:
        return
    if path.is_dir():
        raise MoEScopeError(f"{option} {path}: is a folder; give a file name")
    parent = path.parent
    if not parent.is_dir():
        raise MoEScopeError(f"{option} {path}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise MoEScopeError(f"{option} {path}: cannot write in folder {parent}")


def write_output(path: Path, text: str, option: str) -> None:
    """Write an output file whole or not at all (a full disk leaves an older file as it
    was); a failure is one line, not a traceback, and what was printed stays printed."""
    from moescope.core.files import write_atomic

    try:
        write_atomic(path, text)
    except OSError as err:
        raise MoEScopeError(f"{option} {path}: cannot write ({err.strerror or err})") from None


def open_trace(path: Path, engine: Engine) -> TraceRecorder:
    """Start recording ``engine``'s session to ``path``, or say in one line why not."""
    from moescope.core.trace import TraceRecorder

    try:
        return TraceRecorder.for_engine(path, engine)
    except OSError as err:
        raise MoEScopeError(f"--trace {path}: cannot write ({err.strerror or err})") from None


def cache_state(engine: Engine) -> str:
    """``quality-first @ 16/64 slots``, or ``cache off``: the label in front of a summary."""
    m = engine.model
    if m is not None and m.cache_enabled and m.plan is not None:
        return f"{engine.policy_name} @ {m.plan.slots_per_layer}/{m.plan.n_expert} slots"
    return "cache off"


def summary_line(label: str, tokens_per_second: float, cache: CacheTotals, tail: str) -> str:
    """``[label] tok/s | hit | fetched MB/tok | substituted | mass/tok | tail``; when no
    expert went through the cache (cache off) only tok/s and the tail: a 0% hit rate
    would read as a measurement."""
    c = cache
    if c.selections == 0:
        return f"[{label}] {tokens_per_second:.1f} tok/s | {tail}"
    return (f"[{label}] {tokens_per_second:.1f} tok/s | hit {c.hit_rate:.1%} | "
            f"fetched {c.fetched_mb_per_token:.3f} MB/tok | substituted "
            f"{c.substituted_fraction:.1%} | mass/tok {c.mass_per_token:.3f} | {tail}")


def answer_summary(engine: Engine) -> str:
    """The summary line of the engine's last answer (what ``generate`` ends with)."""
    a = engine.last_answer
    return summary_line(cache_state(engine), a.tokens_per_second, a.cache,
                        f"{a.n_tokens} tokens, stop: {a.stop_reason}")
