"""``moescope generate MODEL --prompt TEXT --policy P --budget B [-n N] [--seed S]``.

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
import re
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.cache.audit import check_every
from moescope.cache.guard import parse_live_policy
from moescope.cli.options import (
    MAX_TOKENS,
    add_budget_arguments,
    add_ctx_argument,
    add_model_argument,
    add_no_cache_argument,
    add_policy_argument,
    add_threads_argument,
    add_tokens_argument,
    check_ctx,
    check_model_header,
    check_ram_budget,
    check_range,
    check_threads,
    check_utf8,
    path_arg,
    print_load_notes,
)
from moescope.trace.names import formats_help, record_suffix
from moescope.util.errors import MoEScopeError
from moescope.util.resources import demo_model_path

if TYPE_CHECKING:  # the engine loads llama.cpp: import it only where a command runs
    from moescope.engine import CacheTotals, Engine, Sampling
    from moescope.trace import TraceRecorder


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    p = subparsers.add_parser(
        "generate", help="generate text with the expert cache and print what it did",
        description="Generate from a prompt with the expert cache on; prints the text, then "
                    "a summary line of the cache's work.")
    add_model_argument(p)
    p.add_argument("--prompt", "-p", default="ROMEO:",
                   help="prompt text (raw, no template; default '%(default)s')")
    p.add_argument("--chat", action="store_true",
                   help="wrap the prompt as a user message in the model's chat template")
    add_policy_argument(p)
    add_budget_arguments(p)
    add_sampling_arguments(p, n_default=128, n_help="tokens to generate")
    add_xtc_mirostat_arguments(p)
    add_ctx_argument(p)
    add_gpu_layers_argument(p)
    add_threads_argument(p)
    add_no_cache_argument(p)
    p.add_argument("--trace", type=path_arg, metavar="FILE",
                   help="record a session trace, in the format its name ends with: "
                        f"{formats_help()} (replay it with `moescope replay`)")
    add_audit_argument(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from moescope.engine import Engine, Message

    sampling = sampling_from_args(args)  # fail fast, before loading
    check_utf8("--prompt", args.prompt)
    check_every(args.audit, "--audit")
    policy = parse_live_policy(args.policy)
    check_budget(args.budget)
    check_ram_budget(args.ram_budget)
    ctx_given = check_ctx(args)
    check_threads(args.threads)
    inputs = model_inputs(args.model)
    check_trace_output(args.trace, inputs)
    model = resolve_model(args.model)
    check_model_header(model, budget=args.budget, ram_budget=args.ram_budget, ctx=ctx_given,
                       cache=not args.no_cache)
    engine = Engine()
    loaded = engine.load(model, budget=args.budget, policy=policy, n_ctx=args.ctx,
                         n_gpu_layers=args.n_gpu_layers, n_threads=args.threads,
                         cache=not args.no_cache, ram_budget=args.ram_budget)
    print_load_notes(loaded)
    print(backend_line(engine), file=sys.stderr)
    sampling = with_model_sampling(sampling, engine, args)
    start_audits(engine, args.audit)
    prompt: Any = [Message("user", args.prompt)] if args.chat else args.prompt
    recorder = None
    if args.trace:
        recorder = open_trace(args.trace, engine, inputs)
    if not args.chat:
        sys.stdout.write(args.prompt)
    failed: OSError | None = None  # a write of the trace (a full disk): the answer stops
    during = False
    try:
        for tok in engine.generate(prompt, sampling):
            if recorder is not None:
                try:
                    recorder.record(tok, engine)
                except OSError as err:
                    failed, during = err, True
                    break
            sys.stdout.write(tok.text)
            sys.stdout.flush()
    finally:
        if recorder is not None:
            stop_reason = engine.last_answer.stop_reason
            closing = recorder
            try:
                close_trace(args.trace, lambda: closing.close(stop_reason=stop_reason))
            except OSError as err:  # the same failure again, or the end's own
                failed = failed or err
    sys.stdout.write("\n")
    if failed is not None and args.trace is not None:
        sys.stdout.flush()
        engine.close()
        raise recording_failed(args.trace, failed, during=during)
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


MAX_TEMPERATURE = 100.0
"""The highest ``--temperature``: far past any useful one (2 is already near-uniform
sampling), bounded as every number an argument gives is."""
MAX_SEED = 0xFFFFFFFF - 1
"""The largest ``--seed`` that reproduces: llama.cpp takes a 32-bit seed (4294967296 was
seed 0 again) and ``LLAMA_DEFAULT_SEED``, 0xFFFFFFFF (-1 too, as 32 bits), means "a random
seed each run"."""


def add_sampling_arguments(p: argparse.ArgumentParser, *, n_default: int,
                           n_help: str) -> None:
    """``--tokens`` (``-n``, ``--n``), ``--seed``, ``--temperature``: the same spelling in
    every command."""
    add_tokens_argument(p, default=n_default, what=n_help)
    p.add_argument("--seed", type=int, default=0, metavar="S",
                   help=f"sampling seed, 0 to {MAX_SEED}: the same seed, prompt and options "
                        "give the same text; -1: a random seed each run (default 0)")
    p.add_argument("--temperature", type=float, default=None, metavar="T",
                   help=f"sampling temperature, 0 to {MAX_TEMPERATURE:g}: 0 is greedy (the "
                        "most likely token every time), higher is more varied (default: the "
                        "model's recommendation, else 0.7)")


XTC_MIROSTAT_OPTIONS = {"xtc_probability": "--xtc-probability",
                        "xtc_threshold": "--xtc-threshold", "mirostat": "--mirostat",
                        "mirostat_tau": "--mirostat-ent", "mirostat_eta": "--mirostat-lr"}
"""Sampling field -> option, llama-cli's spellings (``--mirostat-tau``/``-eta`` too)."""


def add_xtc_mirostat_arguments(p: argparse.ArgumentParser) -> None:
    """llama-cli's XTC and mirostat options (default: the model's recommendation, else
    off); :func:`sampling_from_args` checks them against ``engine.SAMPLING_BOUNDS``."""
    p.add_argument("--xtc-probability", type=float, default=None, metavar="P",
                   help="XTC: the chance per token, 0 to 1, that the likeliest candidates "
                        "above --xtc-threshold are left out (all but the least likely of "
                        "them); default: the model's recommendation, else 0 (off)")
    p.add_argument("--xtc-threshold", type=float, default=None, metavar="T",
                   help="XTC's threshold, 0 to 1 (above 0.5: XTC does nothing); default: "
                        "the model's recommendation, else 0.1")
    p.add_argument("--mirostat", type=int, default=None, metavar="N",
                   help="mirostat sampling: 0 off, 1 Mirostat, 2 Mirostat 2.0 (replaces "
                        "top-k, top-p, min-p and XTC); default: the model's "
                        "recommendation, else 0")
    p.add_argument("--mirostat-ent", "--mirostat-tau", dest="mirostat_tau", type=float,
                   default=None, metavar="TAU",
                   help="mirostat's target entropy, 0 to 100 (default: the model's, else 5)")
    p.add_argument("--mirostat-lr", "--mirostat-eta", dest="mirostat_eta", type=float,
                   default=None, metavar="ETA",
                   help="mirostat's learning rate, 0 to 1 (default: the model's, else 0.1)")


def sampling_from_args(args: argparse.Namespace) -> Sampling:
    """The :class:`Sampling` that :func:`add_sampling_arguments`' options describe.

    Checked here, before a model loads: ``--tokens 0`` would otherwise still generate one token,
    a NaN temperature samples garbage without a word, and a seed outside 32 bits wraps.
    """
    from moescope.engine import Sampling

    if args.tokens < 1:
        raise MoEScopeError(f"--tokens must be at least 1, got {args.tokens}")
    check_range("--tokens", args.tokens, 1, MAX_TOKENS)
    # neither the option nor (until the model loads) its file says: the engine's default
    temperature = Sampling.temperature if args.temperature is None else args.temperature
    if not math.isfinite(temperature) or temperature < 0:
        raise MoEScopeError(f"--temperature {temperature:g} must be from 0 to "
                            f"{MAX_TEMPERATURE:g} (0 is greedy)")
    check_range("--temperature", temperature, 0.0, MAX_TEMPERATURE)
    if args.seed != -1 and not 0 <= args.seed <= MAX_SEED:
        raise MoEScopeError(f"--seed {args.seed} must be from 0 to {MAX_SEED}, or -1 for a "
                            "random seed each run (llama.cpp takes 32 bits)")
    from moescope.engine.engine import SAMPLING_BOUNDS

    given: dict[str, Any] = {}
    for name, option in XTC_MIROSTAT_OPTIONS.items():
        value = getattr(args, name, None)
        if value is not None:
            lo, hi = SAMPLING_BOUNDS[name]
            check_range(option, value, lo, hi)
            given[name] = value
    return Sampling(temperature=temperature, max_tokens=args.tokens,
                    seed=None if args.seed == -1 else args.seed, **given)


def with_model_sampling(sampling: Sampling, engine: Any,
                        args: argparse.Namespace) -> Sampling:
    """``sampling`` with the loaded model's recommended values (its GGUF's
    ``general.sampling.*``: temperature, top-p, top-k, min-p, repeat penalty) for what the
    options leave unset (all but a given ``--temperature``), as llama-cli does; one line on
    stderr says which."""
    import dataclasses

    from moescope.model.sampling_defaults import describe, model_sampling

    info = engine.model.info if engine.model is not None else None
    # XTC and mirostat where the command has their options (a value the model
    # recommends can then be overridden)
    extra = hasattr(args, "mirostat")
    values = model_sampling(info.metadata, extra=extra) if info is not None else {}
    if args.temperature is not None:
        values.pop("temperature", None)
    for name in XTC_MIROSTAT_OPTIONS:
        if getattr(args, name, None) is not None:
            values.pop(name, None)
    if not values:
        return sampling
    print(f"sampling: {describe(values)} (the model's recommendation)", file=sys.stderr)
    return dataclasses.replace(sampling, **values)  # type: ignore[arg-type]


def check_budget(text: str) -> None:
    """``--budget`` read by ``cache.budget``'s one grammar before a model loads (an empty
    one too: it used to slip through as "no budget")."""
    from moescope.cache.budget import parse_budget

    parse_budget(text)


def model_inputs(model: Path | None) -> list[Path]:
    """The files a command reads for ``model``: the file itself, and every part of a split
    model (``PREFIX-00001-of-00003.gguf``, named by llama.cpp's pattern), so no output can
    be one of them."""
    from moescope.model.gguf_info import split_paths

    if model is None:
        demo = demo_model_path()
        return [demo] if demo is not None else []
    m = _SPLIT_PART.match(model.name)
    if m is None or not 1 < int(m["count"]) <= 9999:
        return [model]
    try:
        return [model, *split_paths(model, int(m["count"]))]
    except MoEScopeError:
        return [model]


_SPLIT_PART = re.compile(r"^.+-\d{5}-of-(?P<count>\d{5})\.gguf$")


def check_output_path(path: Path | None, option: str,
                      inputs: Sequence[Path] = ()) -> None:
    """Refuse an output file that cannot or must not be written, before the work that
    fills it: a typo in ``--json`` must not cost a benchmark's minutes, nor ``--trace`` a
    traceback after the model has loaded, and ``--trace model.gguf`` must not truncate
    the model (``util.files.check_output``: inputs, folders, block devices)."""
    if path is None:
        return
    from moescope.util.files import OutputPathError, check_output

    try:
        check_output(path, inputs)
    except OutputPathError as err:
        raise MoEScopeError(f"{option} {path}: {err.strerror}") from None


def check_outputs(outputs: Sequence[tuple[str, Path | None]],
                  inputs: Sequence[Path] = ()) -> bool:
    """:func:`check_output_path` for each ``(option, path)``, and no file given to two
    options (the second would replace the first); at most one may be ``-`` (stdout).
    Returns whether one is ``-``, so the command prints its table to stderr instead."""
    from moescope.util.files import is_stdout, same_file

    given = [(option, path) for option, path in outputs if path is not None]
    for option, path in given:
        check_output_path(path, option, inputs)
    dashes = [option for option, path in given if is_stdout(path)]
    if len(dashes) > 1:
        raise MoEScopeError(f"{' and '.join(dashes)} both write to stdout; "
                            "give one of them a file")
    for i, (option, path) in enumerate(given):
        for other, path2 in given[i + 1:]:
            # one file by name too, not only by inode: neither is there yet (x.csv and
            # ./x.csv, or a symlink to the other's name) and each was written, the second
            # over the first
            if not is_stdout(path) and (path == path2 or same_file(path, path2)
                                        or _lands(path) == _lands(path2)):
                raise MoEScopeError(f"{option} and {other} name the same file {path}; "
                                    "give each its own")
    return bool(dashes)


def _lands(path: Path) -> str:
    """Where a write to ``path`` lands, by name: symlinks followed (a dangling one to its
    target's name), ``.`` and ``..`` resolved; the path itself when that cannot be said."""
    try:
        return os.path.realpath(path)
    except (OSError, ValueError):
        return os.fspath(path)


def write_output(path: Path, text: str, option: str, inputs: Sequence[Path] = ()) -> None:
    """Write an output file whole or not at all (a full disk leaves an older file as it
    was); a failure is one line, not a traceback, and what was printed stays printed."""
    from moescope.util.files import OutputPathError, write_atomic

    try:
        write_atomic(path, text, inputs=inputs)
    except OutputPathError as err:  # names what is wrong with the path
        raise MoEScopeError(f"{option} {path}: {err.strerror}") from None
    except OSError as err:
        raise MoEScopeError(f"{option} {path}: cannot write ({err.strerror or err})") from None


def check_trace_output(path: Path | None, inputs: Sequence[Path]) -> None:
    """:func:`check_output_path` for ``--trace``, which cannot be ``-`` (the answer is
    written to stdout)."""
    from moescope.util.files import is_stdout

    if path is not None and is_stdout(path):
        raise MoEScopeError(f"--trace {path}: the answer is written to stdout; give a file name")
    check_output_path(path, "--trace", inputs)
    if path is None:
        return
    from moescope.trace.names import record_suffix, unknown_suffix_message
    from moescope.trace.parquet_format import check_journal_free

    if record_suffix(path) is None:  # the writer would refuse it too, after the load
        raise MoEScopeError(f"--trace {unknown_suffix_message(path)}")
    check_journal_free(path)  # a crash's journal (X.PARQUET's too): refused now


COMPACT_NOTICE_S = 1.0
"""Closing a Parquet trace compacts it (0.5 ms a token): past this many seconds, stderr
says so, so that a long session's last seconds are not a silent hang."""


def close_trace(path: Path, close: Callable[[], None]) -> None:
    """Run ``close`` (ending the recording of ``path``); the command returns with the
    file finished, so a Parquet trace is compacted first, and "compacting trace..." is
    said on stderr if that takes longer than :data:`COMPACT_NOTICE_S`."""
    timer = None
    if record_suffix(path.name) == ".parquet":
        timer = threading.Timer(COMPACT_NOTICE_S, lambda: _say_compacting(path))
        timer.daemon = True
        timer.start()
    try:
        close()
    finally:
        if timer is not None:
            timer.cancel()


def _say_compacting(path: Path) -> None:
    print(f"moescope: compacting trace {path}...", file=sys.stderr, flush=True)


def open_trace(path: Path, engine: Engine, inputs: Sequence[Path] = ()) -> TraceRecorder:
    """Start recording ``engine``'s session to ``path``, or say in one line why not. The
    answer goes to stdout, so ``-`` is refused; an input (the model) is refused again
    here, just before the file is opened."""
    from moescope.trace import TraceRecorder

    check_trace_output(path, inputs)
    try:
        return TraceRecorder.for_engine(path, engine)
    except OSError as err:
        raise write_error("--trace", path, err) from None


def recording_failed(path: Path, err: OSError, *, during: bool) -> MoEScopeError:
    """The line for a recording to ``path`` that a failed write stopped (a full disk was
    an OSError traceback, twice chained): ``during`` the answer (which stopped with it),
    or in finishing the file (a Parquet trace's compaction); what failed, and where what
    was recorded is (a Parquet trace's journal, when it was not compacted)."""
    from moescope.trace.names import journal_path, live_trace_file

    said = err.strerror or str(err)
    journal = journal_path(path)  # a journal left behind is the trace, whatever path is
    where = journal if record_suffix(path) == ".parquet" and journal.is_file() \
        else live_trace_file(path)
    if during:
        return MoEScopeError(f"--trace {path}: recording stopped ({said}), and the answer "
                             f"with it; the trace so far is in {where}")
    return MoEScopeError(f"--trace {path}: the trace could not be finished ({said}); what "
                         f"was recorded is in {where}")


def write_error(option: str, path: Path, err: OSError) -> MoEScopeError:
    """The one line for output ``path`` of ``option`` that could not be written: "cannot
    write" said once. An :class:`~moescope.util.files.OutputPathError` already says what is
    wrong ("cannot write (File name too long)", "is a folder"), so it was wrapped into
    "cannot write (cannot write (...))"; the file it names is said when it is not ``path``
    (the journal beside a ``.parquet``)."""
    from moescope.util.files import OutputPathError

    said = err.strerror or str(err)
    named = err.filename is not None and os.fspath(err.filename) != os.fspath(path)
    if isinstance(err, OutputPathError):
        return MoEScopeError(f"{option} {path}: "
                             + (f"{os.fsdecode(err.filename)}: " if named else "") + said)
    if err.strerror is None or said.startswith("cannot write"):  # a sentence of its own
        return MoEScopeError(f"{option} {path}: {said}")
    return MoEScopeError(f"{option} {path}: cannot write ({said})")


def cache_state(engine: Engine) -> str:
    """``quality-first @ 16/64 slots``, or ``cache off``: the label in front of a summary."""
    m = engine.model
    if m is not None and m.cache_enabled and m.plan is not None:
        name = engine.guard.describe() if engine.guard is not None else engine.policy_name
        return f"{name} @ {m.plan.slots_per_layer}/{m.plan.n_expert} slots"
    return "cache off"


NO_DECODE_RATE = "– tok/s (no decode token)"
"""The rate's place when no token was decoded (only the prompt's first token, ``-n 1``):
tok/s is taken over decode time, and "0.0 tok/s" read as a measurement."""


def summary_line(label: str, tokens_per_second: float | None, cache: CacheTotals, tail: str,
                 *, ram_tier: bool = False) -> str:
    """``[label] tok/s | hit | fetched MB/tok | substituted | mass/tok | tail``, with
    ``disk MB/tok | RAM hit`` after the fetches when the RAM tier is on (``ram_tier``) or
    an expert was read from disk, as the window's summary (``AnswerStats.summary``); when
    no expert went through the cache (cache off) only tok/s and the tail: a 0% hit rate
    would read as a measurement. ``tokens_per_second`` None: no token was decoded
    (:data:`NO_DECODE_RATE`)."""
    c = cache
    rate = NO_DECODE_RATE if tokens_per_second is None else f"{tokens_per_second:.1f} tok/s"
    if c.selections == 0:
        return f"[{label}] {rate} | {tail}"
    disk = (f"disk {c.disk_mb_per_token:.3f} MB/tok | RAM hit {c.ram_hit_rate:.1%} | "
            if ram_tier or c.disk_fills else "")
    return (f"[{label}] {rate} | hit {c.hit_rate:.1%} | "
            f"fetched {c.fetched_mb_per_token:.3f} MB/tok | {disk}substituted "
            f"{c.substituted_fraction:.1%} | mass/tok {c.mass_per_token:.3f} | {tail}")


def answer_summary(engine: Engine) -> str:
    """The summary line of the engine's last answer (what ``generate`` ends with), with
    the audits' estimate of the quality cost when the answer had audits."""
    a = engine.last_answer
    audit = a.audit
    return summary_line(cache_state(engine), a.tokens_per_second if a.n_tokens > 1 else None,
                        a.cache,
                        (f"{audit.describe()} | " if audit is not None else "")
                        + f"{a.n_tokens} token{'' if a.n_tokens == 1 else 's'}, stop: "
                          f"{a.stop_reason}",
                        ram_tier=a.ram_tier)


def _gpu_layers(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not -1 <= n <= 100_000:
        raise argparse.ArgumentTypeError(f"{n} is out of range (-1 for all layers, or 0 "
                                         "and up)")
    return n


def add_gpu_layers_argument(p: argparse.ArgumentParser) -> None:
    """``--n-gpu-layers``, defaulting as the window does: every layer on a GPU build of
    the engine, none on a CPU build (where offloading has nowhere to go)."""
    from moescope.engine.backend import NAMES, engine_build

    build = engine_build().backend
    this = f"; this engine is a {NAMES[build]} build" if build in NAMES else ""
    p.add_argument("--n-gpu-layers", type=_gpu_layers, default=None, metavar="N",
                   help=f"layers on the GPU, -1 for all (default: all on a CUDA or Vulkan "
                        f"build of the engine, 0 on a CPU build{this})")


def backend_line(engine: Engine) -> str:
    """One line: the engine's backend, why, and where the loaded model's slots are."""
    from moescope.engine.backend import backend_text, engine_build

    model = engine.model
    return "engine: " + backend_text(engine_build(), model.slot_buffer if model else "")


def add_audit_argument(p: argparse.ArgumentParser) -> None:
    """``--audit N``: the same option in generate and chat."""
    p.add_argument("--audit", type=int, default=0, metavar="N",
                   help="every Nth token also compute the exact output and estimate what the "
                        "policy costs in perplexity (e.g. 16; default 0: off)")


def start_audits(engine: Engine, every: int) -> None:
    """Turn audits on when asked and the cache is on (a note otherwise)."""
    if not every:
        return
    if engine.cache is None:
        print("moescope: --audit needs the expert cache; no audits", file=sys.stderr)
        return
    engine.set_audit(every)
