"""A trace as a spreadsheet: one CSV row per token.

The JSONL trace is for replay and the Perfetto file for a timeline; a user who wants to
plot tokens/s against substituted mass in a notebook or a spreadsheet wants neither, but
one row per token with the numbers the live panel showed. Counts are sums over the
token's event rows (:class:`moescope.cache.totals.CacheTotals`, as everywhere else);
an empty cell is a number the trace did not record (copy timings, prefetch counters),
never a zero.
"""

from __future__ import annotations

import csv
import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from moescope.cache.totals import CacheTotals
from moescope.trace import TIMING_KEYS, Trace
from moescope.trace.perfetto import Progress
from moescope.util.files import fill_atomic

COUNT_COLUMNS: tuple[str, ...] = (
    "selections", "hits", "fetches", "substitutions", "admissions", "evictions",
    "substituted_mass", "bytes_sync", "bytes_async",
)
"""The :class:`CacheTotals` fields a row gives (sums over the token's event rows)."""
TOKEN_COLUMNS: tuple[str, ...] = (
    "token", "answer", "phase", "position", "token_id", "text", "policy",
    "slots_per_layer", "seconds", *COUNT_COLUMNS, *TIMING_KEYS, "prefetches",
    "prefetch_hits", "changes",
)
"""The CSV's columns, in order (docs/trace-format.md explains each field)."""


def token_rows(trace: Trace) -> list[dict[str, Any]]:
    """One dict per token, keyed by :data:`TOKEN_COLUMNS` (None: not recorded)."""
    return list(_rows(trace))


def _rows(trace: Trace) -> Iterator[dict[str, Any]]:
    for tok in trace.tokens:
        totals = CacheTotals.from_events(tok.events)
        timings = tok.timings or {}
        yield {
            "token": tok.index, "answer": tok.answer, "phase": tok.phase,
            "position": tok.position, "token_id": tok.token_id, "text": tok.text,
            "policy": tok.policy, "slots_per_layer": tok.slots_per_layer,
            "seconds": tok.seconds,
            **{name: getattr(totals, name) for name in COUNT_COLUMNS},
            **{k: timings.get(k) if tok.timings is not None else None for k in TIMING_KEYS},
            "prefetches": int(tok.prefetches.sum()) if tok.prefetches is not None else None,
            "prefetch_hits": (int(tok.prefetch_hits.sum())
                              if tok.prefetch_hits is not None else None),
            "changes": "; ".join(c.label for c in tok.changes),
        }


def to_tokens_csv(trace: Trace) -> str:
    """:func:`token_rows` as CSV text with a header line."""
    out = io.BytesIO()
    dump_tokens_csv(trace, out)
    return out.getvalue().decode("utf-8")


def dump_tokens_csv(trace: Trace, out: IO[bytes], progress: Progress | None = None) -> None:
    """Write :func:`to_tokens_csv`'s text (UTF-8) to ``out`` a row at a time;
    ``progress`` as :func:`moescope.trace.perfetto.dump_perfetto`'s."""
    text = io.TextIOWrapper(out, encoding="utf-8", newline="", write_through=True)
    try:
        writer = csv.DictWriter(text, fieldnames=TOKEN_COLUMNS, lineterminator="\n")
        writer.writeheader()
        n = len(trace.tokens)
        for i, row in enumerate(_rows(trace), 1):
            writer.writerow({k: "" if v is None else v for k, v in row.items()})
            if progress is not None:
                progress(i, n)
        text.flush()
    finally:
        text.detach()  # ``out`` stays open: its owner closes it


def write_tokens_csv(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write :func:`to_tokens_csv` to ``path``, all or nothing."""
    return fill_atomic(path, lambda f: dump_tokens_csv(trace, f))
