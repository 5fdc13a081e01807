"""``moescope eval MODEL --text FILE --policies ... --budgets ... [--tokens N] [--window W]``.

Exact emulation from *Which Expert Misses Are Worth Waiting For?*: the same tokens of a
text are forced through the engine, one token at a time so the cache governs every step,
once per policy and budget. Prints a Markdown table (perplexity, change against ``exact``,
% of expert calls substituted, mean substituted mass, fetched bytes and time per token) and
the mass hypothesis (Pearson r between substituted mass and perplexity change, bootstrap
CIs); ``--csv`` writes the numbers. A progress bar with ETA goes to stderr.
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from moescope.cli.commands.generate import add_gpu_layers_argument
from moescope.cli.options import (
    MAX_TOKENS,  # the most tokens --tokens may ask to score (each decoded once per run)
    add_budget_arguments,
    add_model_argument,
    add_threads_argument,
    add_tokens_argument,
    check_list,
    check_ram_budget,
    check_threads,
    path_arg,
    print_load_notes,
    refuse_guard,
)
from moescope.util.errors import MoEScopeError
from moescope.util.resources import demo_model_path
from moescope.util.words import plural

MAX_CONTEXT = 32_768
"""Largest context eval asks for: a longer text is scored in segments, so the KV cache of a
long-context model stays small."""
MAX_BOOTSTRAP = 100_000
TEXT_BYTES_PER_TOKEN = 256
"""Bytes of ``--text`` read per token asked for: far more than any text's tokens take (a
few bytes each), so the tokens scored are the same as from the whole file, while a huge
file, or ``/dev/zero``, is not read whole into memory and tokenized."""
"""Most bootstrap resamples (each recomputes r over every run)."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``eval`` subcommand."""
    p = subparsers.add_parser(
        "eval", help="teacher-forced perplexity per policy and budget (quality cost)",
        description="Force the same tokens through the engine under each policy and "
                    "budget, one token at a time, and compare perplexity with exact.")
    add_model_argument(p)
    p.add_argument("--text", type=path_arg, required=True, metavar="FILE",
                   help="UTF-8 text file to score, or a FIFO such as <(zcat corpus.gz) "
                        "(read as it comes: the command waits for its writer)")
    p.add_argument("--policies", action="append", metavar="P[,P...]",
                   help="policies (presets or preset:key=value); default "
                        "exact,quality-first,speed-first,threshold,first-choice,substitute-all")
    p.add_argument("--budgets", action="append", metavar="B[,B...]",
                   help="budgets: 25%%, 12GiB ... (default 25%%,50%%)")
    add_budget_arguments(p, vram=False)
    p.add_argument("--sweep-theta", metavar="LO:HI:N",
                   help="also run quality-first at N thetas from LO to HI (first-choice "
                        "preserving runs for the mass hypothesis), e.g. 0.05:0.6:8")
    p.add_argument("--sweep-bonus", metavar="LO:HI:N",
                   help="also run cache-prior at N routing bonuses from LO to HI; runs "
                        "that substituted a first choice are left out of r")
    add_tokens_argument(p, default=512, what=f"tokens to score, at most {MAX_TOKENS} (fewer "
                        "if the text is shorter); beyond the model's context, in consecutive "
                        "segments each from an empty context")
    p.add_argument("--window", type=int, default=64, metavar="W",
                   help="window, in tokens, of the mass-hypothesis correlation (default 64)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="B",
                   help="bootstrap resamples for the confidence intervals (default 1000)")
    p.add_argument("--audit", type=int, default=0, metavar="N",
                   help="every Nth token also compute the exact output: the table adds the "
                        "cost measured on the text's tokens and the KL estimate (default 0: "
                        "off)")
    p.add_argument("--csv", type=path_arg, metavar="FILE",
                   help="write the table as CSV (- for stdout)")
    p.add_argument("--markdown", type=path_arg, metavar="FILE",
                   help="also write the Markdown table to a file")
    add_gpu_layers_argument(p)
    add_threads_argument(p)
    p.set_defaults(func=run)


class ProgressBar:
    """``[#####.....]  45%  123/270 tok  ETA 0:12  quality-first @ 25%`` on stderr.

    Redrawn in place on a terminal (at most 10 times a second); elsewhere (a log, a pipe)
    one line per run and a final one, so logs stay readable.
    """

    def __init__(self, stream: TextIO | None = None, width: int = 24) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.width = width
        self.tty = bool(getattr(stream, "isatty", lambda: False)())
        self.t0 = time.monotonic()
        self._last_draw = 0.0
        self._last_label = ""

    def __call__(self, done: int, total: int, label: str) -> None:
        now = time.monotonic()
        new_run = label != self._last_label
        finished = done >= total
        if not (new_run or finished or (self.tty and now - self._last_draw >= 0.1)):
            return
        self._last_draw = now
        self._last_label = label
        frac = done / total if total else 1.0
        elapsed = now - self.t0
        eta = elapsed / frac * (1.0 - frac) if frac > 0 else float("nan")
        eta_text = "--:--" if eta != eta else _clock(eta)
        fill = round(frac * self.width)
        line = (f"[{'#' * fill}{'.' * (self.width - fill)}] {frac:4.0%}  {done}/{total} tok  "
                f"ETA {eta_text}  {label}")
        if finished:
            line = f"{line}  done in {_clock(elapsed)}"
        if self.tty:
            self.stream.write("\r" + line.ljust(100) + ("\n" if finished else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()


def _clock(seconds: float) -> str:
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"
    return f"{s // 60}:{s % 60:02d}"


def run(args: argparse.Namespace) -> int:
    """Load the model, evaluate every policy x budget, print the table."""
    from moescope.cache.audit import check_every
    from moescope.cache.budget import parse_budget
    from moescope.cli.commands.generate import (
        check_outputs,
        model_inputs,
        write_output,
    )
    from moescope.engine import Engine
    from moescope.engine.evaluate import RunSpec, evaluate, split_segments
    from moescope.sim.sweep import parse_policy, split_list

    policy_specs = split_list(args.policies or [
        "exact,quality-first,speed-first,threshold,first-choice,substitute-all"])
    budgets = split_list(args.budgets or ["25%,50%"])
    check_list("--policies", policy_specs, "policies")
    check_list("--budgets", budgets, "budgets")
    policies = []
    for spec in policy_specs:
        refuse_guard(spec, "--policies", "eval scores fixed policies (its base, e.g. psr, "
                                         "with --audit N says what it would steer by)")
        policy = parse_policy(spec, recorded=False)
        if policy is None:
            raise MoEScopeError("'recorded' is a replay policy; name presets for eval")
        policies.append(policy)
    for key, preset in (("theta", "quality-first"), ("bonus", "cache-prior")):
        spec = getattr(args, f"sweep_{key}")
        if spec is not None:  # '' is a mistake to say, not "no sweep"
            for value in sweep_values(spec, f"--sweep-{key}", 0.0, 1.0 if key == "theta"
                                      else 10.0):
                policies.append(parse_policy(f"{preset}:{key}={value:g}"))  # type: ignore[arg-type]
    for b in budgets:
        parse_budget(b)
    check_ram_budget(args.ram_budget)
    if not policies:
        raise MoEScopeError("--policies names no policy")
    if not budgets:
        raise MoEScopeError("--budgets names no budget")
    if not 1 <= args.tokens <= MAX_TOKENS:
        raise MoEScopeError(f"--tokens must be 1..{MAX_TOKENS}, not {args.tokens}")
    if not 1 <= args.window <= MAX_TOKENS:
        raise MoEScopeError(f"--window must be 1..{MAX_TOKENS}, not {args.window}")
    if not 0 <= args.bootstrap <= MAX_BOOTSTRAP:
        raise MoEScopeError(f"--bootstrap must be 0..{MAX_BOOTSTRAP}, not {args.bootstrap}")
    check_every(args.audit, "--audit")
    check_threads(args.threads)
    inputs = [*model_inputs(args.model), args.text]
    to_stdout = check_outputs([("--csv", args.csv), ("--markdown", args.markdown)], inputs)
    model = args.model or demo_model_path()
    if model is None:
        raise MoEScopeError("no model given and no demo model in resources/models/")
    text = read_text_head(args.text, (args.tokens + 1) * TEXT_BYTES_PER_TOKEN)
    if not text.strip():  # said before the model loads, not after
        raise MoEScopeError(f"{args.text}: the text is empty; nothing to score")

    engine = Engine()
    try:
        loaded = engine.load(model, budget=budgets[0], policy="exact",
                             n_gpu_layers=args.n_gpu_layers, n_threads=args.threads,
                             ram_budget=args.ram_budget,
                             n_ctx=min(MAX_CONTEXT, max(256, args.tokens + 16)))
        if not loaded.cache_enabled:
            raise MoEScopeError(f"{Path(model).name}: the expert cache is off "
                                f"({loaded.notice or 'not a MoE model'}); nothing to evaluate")
        print_load_notes(loaded)
        n_tokens = args.tokens
        tokens = engine.tokenize(text, add_bos=True, special=False)[: n_tokens + 1]
        if len(tokens) < 2:
            raise MoEScopeError(f"{args.text}: the text has fewer than 2 tokens")
        if len(tokens) < n_tokens + 1:
            print(f"moescope: note: the text has only {plural(len(tokens) - 1, 'token')} to "
                  "score",
                  file=sys.stderr)
        per_segment = loaded.n_ctx - 1  # the engine clamps n_ctx to the model's context
        prefix = engine.tokenize("", add_bos=True, special=False)  # [BOS] if it adds one
        bos = prefix[0] if len(prefix) == 1 and tokens[0] == prefix[0] else None
        segments = split_segments(tokens, per_segment, bos=bos)
        if len(segments) > 1:
            print(f"moescope: note: the model's context is {loaded.n_ctx} tokens; scoring "
                  f"{len(tokens) - 1} in {len(segments)} segments of at most {per_segment}, "
                  "each from an empty context "
                  + ("with BOS first" if bos is not None else
                     "after the previous segment's last token"), file=sys.stderr)
        specs = [RunSpec(p, b) for b in budgets for p in policies]
        report = evaluate(engine, segments, specs, window=args.window, n_boot=args.bootstrap,
                          progress=ProgressBar(), audit_every=args.audit)
    finally:
        engine.close()
    table = report.to_markdown()
    print(table, file=sys.stderr if to_stdout else sys.stdout)
    if args.csv:
        write_output(args.csv, report.to_csv(), "--csv", inputs)
    if args.markdown:
        write_output(args.markdown, table + "\n", "--markdown", inputs)
    return 0


def sweep_values(spec: str, option: str, lo: float, hi: float) -> list[float]:
    """``LO:HI:N`` as N evenly spaced values, each bounded to ``lo..hi``; N is 1..64."""
    parts = spec.split(":")
    try:
        if len(parts) != 3:
            raise ValueError
        a, b, n = float(parts[0]), float(parts[1]), int(parts[2])
    except ValueError:
        raise MoEScopeError(f"{option} {spec!r}: expected LO:HI:N, e.g. 0.05:0.6:8") from None
    if not 1 <= n <= 64:
        raise MoEScopeError(f"{option}: N must be 1..64, not {n}")
    if not (lo <= a <= hi and lo <= b <= hi):
        raise MoEScopeError(f"{option}: values must lie in {lo:g}..{hi:g}")
    import numpy as np

    return [float(round(v, 6)) for v in np.linspace(a, b, n)]


def _text_kind(mode: int) -> str | None:
    """What a file of ``mode`` is, if it is not text to read (a regular file or a FIFO)."""
    if stat.S_ISREG(mode) or stat.S_ISFIFO(mode):
        return None
    if stat.S_ISDIR(mode):
        return "a folder"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def read_text_head(path: Path, limit: int) -> str:
    """The first ``limit`` bytes of the UTF-8 text at ``path`` (a character cut at the
    limit is left out); a missing, unreadable or non-UTF-8 file is one line. A FIFO or
    ``/dev/stdin`` on a pipe is read like a file (``--text <(zcat corpus.gz)``), up to the
    limit, waiting for its writer as ``cat`` does. Anything else is refused before it is
    opened: a folder, a socket, a device (``/dev/zero`` was scored as a text of NULs,
    ``/dev/null`` failed only once the model had loaded, a terminal waited for typing)."""
    try:
        kind = _text_kind(os.stat(path).st_mode)
        if kind is None:
            with open(path, "rb") as f:
                kind = _text_kind(os.fstat(f.fileno()).st_mode)  # swapped since the stat
                if kind is None:
                    data = f.read(limit + 1)
    except FileNotFoundError:
        raise MoEScopeError(f"{path}: no such text file") from None
    except OSError as err:
        raise MoEScopeError(f"{path}: cannot read text ({err.strerror or err})") from None
    if kind is not None:
        raise MoEScopeError(f"{path}: is {kind}, not a text file; give a file or a FIFO")
    cut = len(data) > limit
    data = data[:limit]
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        if cut and err.start >= len(data) - 3 and err.reason == "unexpected end of data":
            return data[:err.start].decode("utf-8")
        raise MoEScopeError(f"{path}: not UTF-8 text (byte {err.start})") from None
