"""``moescope replay TRACE --policy a,b --budget 25%,50% [--cost-model pcie4|pcie5|calibrated]``.

The router-logit simulator: replays a recorded session's routing through the native core
under every policy x budget asked for, and prints per combination the hit rate, fetched
experts and bytes per token, % substituted, mean substituted mass and an estimated time per
token. Answers "what would quality-first at 12 GiB have done to this chat?" in seconds,
without loading the model. ``--perfetto`` also writes the trace for ui.perfetto.dev,
``--tokens-csv`` one CSV row per recorded token.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.cache.budget import parse_budget, plan_slots
from moescope.cache.policy import PRESET_NAMES
from moescope.cli.commands.generate import check_outputs, write_output
from moescope.cli.options import check_list, check_ram_budget, check_range, path_arg, refuse_guard
from moescope.trace import TRACE_SUFFIXES
from moescope.util.errors import MoEScopeError
from moescope.util.words import plural

if TYPE_CHECKING:
    from moescope.sim.cost import CostModel
    from moescope.trace import Trace


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``replay`` subcommand."""
    p = subparsers.add_parser(
        "replay", help="replay a trace's routing under other policies and budgets",
        description="Router-logit simulator: replay the routing recorded in a MoEScope "
                    "trace through the expert-cache core under several policies and "
                    "budgets, and estimate time per token with a cost model.")
    p.add_argument("trace", type=path_arg, metavar="TRACE",
                   help=f"a trace written by MoEScope ({', '.join(TRACE_SUFFIXES)})")
    p.add_argument("--policy", "-p", action="append", metavar="P[,P...]",
                   help="policies: 'recorded' (as traced, changes included), a preset "
                        f"({', '.join(PRESET_NAMES)}) or preset:key=value, e.g. "
                        "threshold:theta=0.3 (default: recorded,exact,quality-first,"
                        "speed-first)")
    p.add_argument("--budget", "-b", action="append", metavar="B[,B...]",
                   help="budgets: 'recorded', 25%%, 12GiB ... (default: recorded)")
    p.add_argument("--cost-model", default="pcie4",
                   help="pcie4 (25 GB/s), pcie5 (50 GB/s) or calibrated (fitted to the "
                        "engine's timings in the trace: copies, compute, and the waits for "
                        "background copies); default pcie4")
    p.add_argument("--bandwidth", type=float, metavar="GB/s",
                   help="override the cost model's copy bandwidth (0.01 to 10000)")
    p.add_argument("--latency-us", type=float, metavar="µs",
                   help="override the cost model's latency per copy (0 to 1000000)")
    p.add_argument("--compute-ms", type=float, metavar="ms",
                   help="override the cost model's compute time per token (0 to 60000)")
    p.add_argument("--ram-budget", metavar="B",
                   help="replay under a RAM tier of this size (25%%, 12GiB, experts per "
                        "layer): the rest of the experts are read from disk, priced by the "
                        "cost model's disk bandwidth and latency (default: every expert in RAM)")
    p.add_argument("--csv", type=path_arg, metavar="FILE",
                   help="also write the table as CSV (- for stdout)")
    p.add_argument("--json", type=path_arg, metavar="FILE",
                   help="also write the table as JSON (- for stdout)")
    p.add_argument("--perfetto", type=path_arg, metavar="FILE",
                   help="also export the trace as Chrome/Perfetto trace-event JSON")
    p.add_argument("--tokens-csv", type=path_arg, metavar="FILE",
                   help="also write the recorded session as CSV, one row per token "
                        "(hits, fetches, substituted mass, bytes, copy times)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Read the trace, sweep, print the table; user errors raise MoEScopeError (exit 2)."""
    from moescope.cache.native import NativeLibraryNotFoundError
    from moescope.sim.cost import cost_model
    from moescope.sim.sweep import (
        format_table,
        nothing_to_replay,
        parse_policy,
        split_list,
        sweep,
        to_csv,
        to_json,
    )

    policies = split_list(args.policy or ["recorded,exact,quality-first,speed-first"])
    budgets = split_list(args.budget or ["recorded"])
    if not policies:
        raise MoEScopeError("--policy names no policy (e.g. --policy exact,quality-first)")
    if not budgets:
        raise MoEScopeError("--budget names no budget (e.g. --budget recorded,25%)")
    check_list("--policy", policies, "policies")
    check_list("--budget", budgets, "budgets")
    for spec in policies:
        refuse_guard(spec, "--policy", "a replay has no answers to audit ('recorded' "
                                       "replays a guarded session as it went)")
        parse_policy(spec)  # fail on a typo before reading a large trace
    for b in budgets:
        if b != "recorded":
            parse_budget(b)
    check_ram_budget(args.ram_budget, auto=False)  # a typo fails before a large trace is read
    _check_cost_overrides(args)
    inputs = [args.trace]
    to_stdout = check_outputs([("--csv", args.csv), ("--json", args.json),
                               ("--perfetto", args.perfetto),
                               ("--tokens-csv", args.tokens_csv)], inputs)
    _check_not_only_a_journal(args.trace)
    trace = _read(args.trace)
    if trace.truncated:
        print(f"moescope: note: {args.trace.name} ends mid-token (the session was cut off); "
              f"replaying its {plural(len(trace.tokens), 'complete token')}", file=sys.stderr)
    if not trace.tokens:
        raise MoEScopeError(f"{args.trace.name}: the trace has no tokens to replay")
    why = nothing_to_replay(trace)
    if why is not None:  # a table of zeros otherwise; the trace's own exports still hold
        _prefill_only(args, trace, why)
        return 0
    cost = _with_overrides(cost_model(args.cost_model, trace), args)
    ram_slots = 0
    if args.ram_budget:
        m = trace.header.model
        ram_slots = plan_slots(args.ram_budget, n_expert=m.n_expert, top_k=m.top_k,
                               bytes_per_expert=m.bytes_per_expert).slots_per_layer
    try:
        result = sweep(trace, policies, budgets, cost, ram_slots=ram_slots)
    except NativeLibraryNotFoundError as err:
        raise MoEScopeError(str(err)) from None
    print(format_table(result, trace.header.model),
          file=sys.stderr if to_stdout else sys.stdout)
    if args.csv:
        write_output(args.csv, to_csv(result), "--csv", inputs)
    if args.json:
        write_output(args.json, to_json(result), "--json", inputs)
    _write_exports(args, trace)
    return 0


def _read(path: Path) -> Trace:
    """The trace at ``path``; a file that is not one and whose name has no trace suffix
    (``replay README.md``) is refused naming the suffixes a trace has, not by the first
    line the reader could not parse (a folder, a missing file and a GGUF model keep the
    reader's words: "is a folder", "open it as a model")."""
    from moescope.trace import read_trace
    from moescope.trace.names import not_a_trace_name_message, record_suffix
    from moescope.trace.schema import TraceFormatError

    try:
        return read_trace(path)
    except TraceFormatError:
        if (record_suffix(path) is not None or not os.path.isfile(path)  # a folder, a
                or _starts_with(path, b"GGUF")):  # device: the reader's words say so
            raise
        raise MoEScopeError(not_a_trace_name_message(path)) from None


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False


def _check_not_only_a_journal(path: Path) -> None:
    """A ``.parquet`` trace whose session was killed is not there, only its journal
    (``NAME.parquet.journal.arrows``): say so and how to use it, rather than "no such trace
    file" (the name the user recorded to)."""
    from moescope.trace.names import journal_path

    if os.path.lexists(path):
        return
    journal = journal_path(path)
    if os.path.isfile(journal):  # Path.is_file raised on a name too long (ENAMETOOLONG)
        raise MoEScopeError(f"{path}: no such trace file, but its journal {journal.name} is "
                            f"there (the session was cut off): replay the journal, or finish "
                            f"it with: moescope trace compact {journal}")


EXPORTS = (("--perfetto", "perfetto"), ("--tokens-csv", "tokens_csv"))
"""The outputs that export the trace itself, one event or row per recorded token: they need
no replay, so a trace without a decoded token writes them too."""
TABLES = (("--csv", "csv"), ("--json", "json"))
"""The outputs of the replay's table."""


def _prefill_only(args: argparse.Namespace, trace: Trace, why: str) -> None:
    """A trace with no decoded token: its exports are written as asked and the table's
    place says in one line that there is nothing to replay; asked for no export, or for
    the table as a file, it is refused in one line (nothing written)."""
    name = args.trace.name
    exports = [option for option, dest in EXPORTS if getattr(args, dest)]
    tables = [option for option, dest in TABLES if getattr(args, dest)]
    if tables:
        raise MoEScopeError(f"{name}: nothing to replay: {why}, so {' and '.join(tables)} "
                            f"would be a table of zeros; nothing was written "
                            f"(--perfetto and --tokens-csv export its tokens alone)")
    if not exports:
        raise MoEScopeError(f"{name}: nothing to replay: {why}; --perfetto and "
                            "--tokens-csv still export its tokens")
    _write_exports(args, trace)
    print(f"moescope: note: {name}: nothing to replay: {why}; wrote "
          f"{' and '.join(exports)} only", file=sys.stderr)


def _write_exports(args: argparse.Namespace, trace: Trace) -> None:
    """Write ``--perfetto`` and ``--tokens-csv`` where asked; a write error is one line."""
    from moescope.trace import write_perfetto
    from moescope.trace.tokens_csv import write_tokens_csv
    from moescope.util.files import OutputPathError

    for option, path, write in (("--perfetto", args.perfetto, write_perfetto),
                                ("--tokens-csv", args.tokens_csv, write_tokens_csv)):
        if not path:
            continue
        try:
            write(trace, path)
        except OutputPathError as err:  # names the path and what is wrong with it
            raise MoEScopeError(f"{option} {path}: {err.strerror}") from None
        except OSError as err:  # a full disk: the error names no file, or a temporary
            raise MoEScopeError(f"{option} {path}: cannot write "
                                f"({err.strerror or err})") from None


COST_OVERRIDES = (("--bandwidth", "bandwidth", 0.01, 10_000.0, " GB/s"),
                  ("--latency-us", "latency_us", 0.0, 1e6, " µs"),
                  ("--compute-ms", "compute_ms", 0.0, 60_000.0, " ms"))
"""The cost model's overrides and their physical ranges: 10 MB/s (a slow USB disk) to
10 TB/s, up to a second per copy, up to a minute of compute per token. Outside them (a
zero or NaN bandwidth, ``--compute-ms 1e300``) the table printed meaningless times."""


def _check_cost_overrides(args: argparse.Namespace) -> None:
    """Every override within :data:`COST_OVERRIDES`' range, in one line if not."""
    for option, dest, lo, hi, unit in COST_OVERRIDES:
        value = getattr(args, dest)
        if value is not None:
            check_range(option, value, lo, hi, unit)


def _with_overrides(cost: CostModel, args: argparse.Namespace) -> CostModel:
    """``cost`` with the overrides given, and its note saying which: the footer named the
    preset as if its figures were used."""
    from dataclasses import replace

    given = [(option, getattr(args, dest), unit)
             for option, dest, _lo, _hi, unit in COST_OVERRIDES
             if getattr(args, dest) is not None]
    if not given:
        return cost
    cost = cost.with_overrides(
        bandwidth=args.bandwidth * 1e9 if args.bandwidth is not None else None,
        latency=args.latency_us * 1e-6 if args.latency_us is not None else None,
        compute_s=args.compute_ms * 1e-3 if args.compute_ms is not None else None)
    said = ", ".join(f"{option} {value:g}{unit}" for option, value, unit in given)
    return replace(cost, note=f"{said} given" + (f"; otherwise {cost.note}" if cost.note
                                                 else ""))
