"""``moescope bench [MODEL] [--budget 25%] [--policies a,b,c] [--tokens 64] [--runs 3]``.

"How much faster is speed-first than exact on *my* model and machine?" answered in one
process, honestly: the model is loaded once; one untimed round warms every policy up (page
cache, allocator, first-touch of experts); then the policies take turns (run 1 of each, then
run 2 of each, ..., the starting policy rotating each round) so machine noise hits all of
them alike. Before every run the policy is switched live, the expert cache is emptied and
its counters zeroed, and the prompt is the same (its KV prefix reused), so every run starts
from the same state; decoding is greedy, so a policy repeats the same work each run. The
table gives the median decode speed, its ratio to the first policy, and what the cache did
(hit rate, % substituted, substituted mass and fetched MB per token). ``bench/`` holds the
developers' benchmark (separate processes, stock llama.cpp as a reference); this is the
user's quick check.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from moescope.cache.budget import format_bytes, parse_budget
from moescope.cache.guard import GuardSpec
from moescope.cli.commands.generate import (
    add_gpu_layers_argument,
    check_outputs,
    model_inputs,
    parse_live_policy,
    resolve_model,
    write_output,
)
from moescope.cli.options import (
    MAX_TOKENS,
    add_budget_arguments,
    add_model_argument,
    add_threads_argument,
    add_tokens_argument,
    check_list,
    check_ram_budget,
    check_range,
    check_threads,
    check_utf8,
    path_arg,
    print_load_notes,
)
from moescope.util.errors import MoEScopeError
from moescope.util.words import plural

if TYPE_CHECKING:
    from moescope.cache.policy import Policy
    from moescope.engine import CacheTotals, Engine, Sampling

DEFAULT_POLICIES = "exact,quality-first,speed-first"
DEFAULT_PROMPT = "Once upon a time, in a small village by the sea, there lived"
"""Plain story text that base and chat models alike continue for hundreds of tokens
greedily (the engine stops at end-of-text, and a run that ends early measures less)."""


MAX_RUNS = 1000
"""Most timed runs ``--runs`` may ask for per policy (99999999999 was taken, to run for
ever)."""


def register(subparsers: argparse._SubParsersAction[Any]) -> None:
    """Add the ``bench`` subcommand."""
    p = subparsers.add_parser(
        "bench", help="compare the decode speed of policies on your model and machine",
        description="Load the model once, then decode the same tokens greedily under each "
                    "policy in turn (cache emptied before every run) and print median "
                    "tokens/s, the ratio to the first policy and what the cache did.")
    add_model_argument(p)
    add_budget_arguments(p)
    p.add_argument("--policies", action="append", metavar="P[,P...]",
                   help=f"policies, the first is the reference (default {DEFAULT_POLICIES}); "
                        "preset:key=value works too, e.g. threshold:theta=0.3, and the "
                        "quality guard, guard:target=1%%")
    add_tokens_argument(p, default=64, what="tokens decoded per run, like llama-bench -n")
    p.add_argument("--runs", type=int, default=3, metavar="R",
                   help=f"timed runs per policy, at most {MAX_RUNS}; the table shows the "
                        "median (default 3)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT,
                   help="prompt text (raw, no template; default: a story's opening, 'Once upon "
                        "a time, ...')")
    p.add_argument("--json", type=path_arg, metavar="FILE",
                   help="also write the results as JSON (- for stdout)")
    add_gpu_layers_argument(p)
    add_threads_argument(p)
    p.set_defaults(func=run)


# ------------------------------------------------------------------------------ results
@dataclass
class Run:
    """One timed run of one policy."""

    tok_s: float
    tokens: int
    stop_reason: str
    cache: CacheTotals
    token_ids: tuple[int, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        c = self.cache
        return {"tok_s": self.tok_s, "tokens": self.tokens, "stop_reason": self.stop_reason,
                "hit_rate": c.hit_rate, "substituted": c.substituted_fraction,
                "mass_per_token": c.mass_per_token,
                "fetched_mb_per_token": c.fetched_mb_per_token}


@dataclass
class PolicyResult:
    """Every timed run of one policy; the cache columns sum over its runs."""

    name: str
    runs: list[Run] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(r.tok_s for r in self.runs)

    @property
    def cache(self) -> CacheTotals:
        from moescope.engine import CacheTotals

        total = CacheTotals()
        for r in self.runs:
            total.add(r.cache)
        return total

    def same_as(self, reference: PolicyResult) -> tuple[int, float]:
        """``(same_prefix, agreement)`` of this policy's greedy text with ``reference``'s
        (``engine.compare.agreement``): tokens identical at the start, share that agree."""
        from moescope.engine.compare import agreement

        return agreement(reference.runs[0].token_ids, self.runs[0].token_ids)

    @property
    def deterministic(self) -> bool:
        """Whether every run made the same cache decisions, as a clean start promises."""
        keys = {(r.token_ids, r.cache.hits, r.cache.fetches, r.cache.substitutions)
                for r in self.runs}
        return len(keys) <= 1


@dataclass
class BenchResult:
    """What the table and the JSON report."""

    model: Path
    budget: str
    slots_per_layer: int
    n_expert: int
    slot_bytes: int
    tokens: int
    prompt_tokens: int
    n_gpu_layers: int
    gpu_offload: bool
    rows: list[PolicyResult]
    notes: list[str] = field(default_factory=list)

    def ratio(self, row: PolicyResult) -> float:
        base = self.rows[0].median
        return row.median / base if base > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        from moescope.trace import machine_info, software_versions

        rows = []
        for r in self.rows:
            c = r.cache
            rows.append({
                "policy": r.name, "tok_s_median": r.median,
                "tok_s_runs": [run.tok_s for run in r.runs], "ratio": self.ratio(r),
                "hit_rate": c.hit_rate, "substituted": c.substituted_fraction,
                "mass_per_token": c.mass_per_token,
                "fetched_mb_per_token": c.fetched_mb_per_token,
                "background_mb_per_token": c.bytes_async / 1e6 / c.tokens if c.tokens else 0.0,
                "disk_mb_per_token": c.disk_mb_per_token, "ram_hit_rate": c.ram_hit_rate,
                "same_start_tokens": r.same_as(self.rows[0])[0],
                "agreement": r.same_as(self.rows[0])[1],
                "runs": [run.to_dict() for run in r.runs]})
        return {
            "model": self.model.name, "path": str(self.model), "budget": self.budget,
            "slots_per_layer": self.slots_per_layer, "n_expert": self.n_expert,
            "residency": self.slots_per_layer / self.n_expert, "slot_bytes": self.slot_bytes,
            "tokens": self.tokens, "runs": len(self.rows[0].runs) if self.rows else 0,
            "prompt_tokens": self.prompt_tokens, "n_gpu_layers": self.n_gpu_layers,
            "gpu_offload": self.gpu_offload, "baseline": self.rows[0].name if self.rows else None,
            "sampling": "greedy", "order": "round-robin, first policy rotating each round",
            "rows": rows, "notes": self.notes, "software": software_versions(),
            "machine": machine_info()}


# ------------------------------------------------------------------------------ command
def run(args: argparse.Namespace) -> int:
    """Validate, load once, measure, print the table (and JSON)."""
    from moescope.engine import Engine
    from moescope.sim.sweep import split_list

    names = split_list(args.policies or [DEFAULT_POLICIES])
    if not names:
        raise MoEScopeError("--policies names no policy")
    check_list("--policies", names, "policies")
    policies = [parse_live_policy(n) for n in names]
    parse_budget(args.budget)
    check_ram_budget(args.ram_budget)
    if args.tokens < 2:
        raise MoEScopeError("--tokens must be at least 2 (speed is measured between the "
                            "first and the last token)")
    check_range("--tokens", args.tokens, 2, MAX_TOKENS)
    check_range("--runs", args.runs, 1, MAX_RUNS)
    check_threads(args.threads)
    check_utf8("--prompt", args.prompt)
    inputs = model_inputs(args.model)
    to_stdout = check_outputs([("--json", args.json)], inputs)
    model = resolve_model(args.model)

    engine = Engine()
    try:
        loaded = engine.load(model, budget=args.budget, policy=policies[0],
                             n_gpu_layers=args.n_gpu_layers, n_threads=args.threads,
                             ram_budget=args.ram_budget,
                             n_ctx=max(512, args.tokens + 256))
        if not loaded.cache_enabled or loaded.plan is None or loaded.info is None:
            raise MoEScopeError(f"{model.name}: the expert cache is off "
                                f"({loaded.notice or 'not a MoE model'}); nothing to compare")
        print_load_notes(loaded)
        prompt_tokens = len(engine.tokenize(args.prompt, add_bos=True, special=True))
        if prompt_tokens + args.tokens >= loaded.n_ctx:
            raise MoEScopeError(f"the prompt ({plural(prompt_tokens, 'token')}) and --tokens "
                                f"{args.tokens} do not fit the model's context of "
                                f"{loaded.n_ctx} tokens")
        rows = measure(engine, policies, args.prompt, args.tokens, args.runs, _progress)
        plan = loaded.plan
        result = BenchResult(
            model=model, budget=args.budget, slots_per_layer=plan.slots_per_layer,
            n_expert=plan.n_expert, slot_bytes=plan.bytes_used, tokens=args.tokens,
            prompt_tokens=prompt_tokens, n_gpu_layers=loaded.n_gpu_layers,
            gpu_offload=_gpu_offload(), rows=rows, notes=_notes(rows, args.tokens))
        if plan.clamped:
            result.notes.insert(0, plan.message)
    finally:
        engine.close()
    print(format_report(result), file=sys.stderr if to_stdout else sys.stdout)
    if args.json:
        write_output(args.json, json.dumps(result.to_dict(), indent=2) + "\n", "--json",
                     inputs)
    return 0


def measure(engine: Engine, policies: Sequence[Policy | GuardSpec], prompt: str, tokens: int,
            runs: int, progress: Callable[[str], None] = lambda _: None) -> list[PolicyResult]:
    """One untimed warm-up round, then ``runs`` timed rounds of every policy in turn."""
    from moescope.engine import Sampling

    sampling = Sampling(temperature=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0,
                        max_tokens=tokens, seed=0)
    labels = [p.label if isinstance(p, GuardSpec) else p.name or "custom" for p in policies]
    progress(f"warm-up: {', '.join(labels)}")
    for policy in policies:
        _one_run(engine, policy, prompt, sampling)
    results = [PolicyResult(label) for label in labels]
    n = len(policies)
    for r in range(runs):
        order = [(r + i) % n for i in range(n)]  # rotate who goes first
        for i in order:
            results[i].runs.append(_one_run(engine, policies[i], prompt, sampling))
        progress(f"run {r + 1}/{runs}: " + " · ".join(
            f"{results[i].name} {results[i].runs[-1].tok_s:.1f}" for i in range(n)) + " tok/s")
    return results


def _one_run(engine: Engine, policy: Policy | GuardSpec, prompt: str,
             sampling: Sampling) -> Run:
    """Switch the policy live, empty the cache, decode; the same start every time."""
    engine.request_policy(policy)
    engine.apply_requests()
    engine.clear_cache()
    ids = tuple(t.token_id for t in engine.generate(prompt, sampling))
    a = engine.last_answer
    return Run(tok_s=a.tokens_per_second, tokens=a.n_tokens, stop_reason=a.stop_reason,
               cache=a.cache, token_ids=ids)


def _notes(rows: Sequence[PolicyResult], tokens: int) -> list[str]:
    notes = []
    for row in rows:
        short = [r for r in row.runs if r.tokens < tokens]
        if short:
            notes.append(f"{row.name}: {len(short)} of {plural(len(row.runs), 'run')} ended "
                         f"early ({short[0].stop_reason} after "
                         f"{plural(short[0].tokens, 'token')}); its "
                         "numbers cover fewer tokens")
        if not row.deterministic:
            notes.append(f"{row.name}: runs made different cache decisions although each "
                         "started from the same state")
    return notes


def _gpu_offload() -> bool:
    """Whether this engine build can run on a GPU at all (else slots are host RAM)."""
    import llama_cpp

    return bool(llama_cpp.llama_supports_gpu_offload())


def _progress(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


# ------------------------------------------------------------------------------ output
COLUMNS = ("policy", "tok/s", "runs", "vs {base}", "same text", "hit", "subst", "mass/tok",
           "MB/tok")


def format_report(result: BenchResult) -> str:
    """Setup lines, then an aligned table, then notes."""
    base = result.rows[0].name
    runs = len(result.rows[0].runs)
    if result.gpu_offload and result.n_gpu_layers != 0:
        layers = "all" if result.n_gpu_layers < 0 else str(result.n_gpu_layers)
        where = f"GPU build, --n-gpu-layers {layers}"
    elif result.gpu_offload:
        where = "GPU build, but --n-gpu-layers 0: everything runs on the CPU"
    else:
        where = ("CPU build: slots are host RAM and a fetch is a memory copy, so ratios "
                 "show what the policies save here, not on a GPU")
    lines = [
        f"model   {result.model.name} ({format_bytes(result.model.stat().st_size)})",
        f"budget  {result.budget}: {result.slots_per_layer}/{result.n_expert} slots per "
        f"layer ({result.slots_per_layer / result.n_expert:.1%} resident), "
        f"{format_bytes(result.slot_bytes)} of expert slots",
        f"decode  {result.tokens} tokens greedy from the same {result.prompt_tokens}-token "
        f"prompt; {plural(runs, 'timed run')} per policy after a warm-up, "
        "round-robin, cache emptied before each run; tok/s is the median",
        f"engine  {where}",
        "",
    ]
    header = [c.format(base=base) for c in COLUMNS]
    disk = any(row.cache.bytes_disk for row in result.rows)  # experts read from the file
    if disk:
        header.append("disk MB/tok")
    body = []
    for row in result.rows:
        c = row.cache
        speeds = [r.tok_s for r in row.runs]
        prefix, share = row.same_as(result.rows[0])
        same = ("identical" if prefix == len(row.runs[0].token_ids)
                else f"{prefix} tok, {share:.0%}")
        body.append([row.name, f"{row.median:.1f}", f"{min(speeds):.1f}-{max(speeds):.1f}",
                     f"{result.ratio(row):.2f}x", same, f"{c.hit_rate:.1%}",
                     f"{c.substituted_fraction:.1%}", f"{c.mass_per_token:.3f}",
                     f"{c.fetched_mb_per_token:.3f}"]
                    + ([f"{c.disk_mb_per_token:.3f}"] if disk else []))
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(header)]
    for cells in [header, *body]:
        lines.append("  ".join(cell.ljust(w) if i == 0 else cell.rjust(w)
                               for i, (cell, w) in enumerate(zip(cells, widths, strict=True))))
    if result.notes:
        lines.append("")
        lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)
