"""A trace as Chrome/Perfetto trace-event JSON (open it in ui.perfetto.dev).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from moescope.cache.native import FETCH, SUBSTITUTE
from moescope.cache.totals import CacheTotals
from moescope.trace.schema import Trace
from moescope.util.files import fill_atomic

# --------------------------------------------------------------------------- Perfetto

_PID = 1
_TID_TOKENS, _TID_LAYERS, _TID_SYNC, _TID_ASYNC, _TID_WAIT = 1, 2, 3, 4, 5


Progress = Callable[[int, int], object]
"""``progress(tokens_done, tokens)``, called after each token; an exception it raises
stops the work (a GUI export's Cancel)."""


def to_perfetto(trace: Trace) -> dict[str, Any]:
    """The trace as Chrome/Perfetto trace-event JSON (``{"traceEvents": [...]}``).

    One complete slice (``ph: "X"``) per token, laid end to end so that the slices' sum
    is the recorded wall time; an instant per fetch and per substitution, spread over the
    token's slice in layer order (rows carry no timestamps of their own); and the engine's
    measured copy time per token as slices on their own tracks (sync copies, background
    copies, waits), starting at the token's start. Times are in microseconds.
    """
    ev = [e for events in _event_groups(trace) for e in events]
    return {"traceEvents": ev, **_closing(trace)}


def _event_groups(trace: Trace) -> Iterator[list[dict[str, Any]]]:
    """:func:`to_perfetto`'s events: the metadata first, then each token's."""
    h = trace.header
    yield [
        _meta("process_name", 0, {"name": f"MoEScope {h.model.file_name}"}),
        _meta("thread_name", _TID_TOKENS, {"name": "tokens"}),
        _meta("thread_name", _TID_LAYERS, {"name": "fetch / substitute"}),
        _meta("thread_name", _TID_SYNC, {"name": "sync copies (measured)"}),
        _meta("thread_name", _TID_ASYNC, {"name": "background copies (measured)"}),
        _meta("thread_name", _TID_WAIT, {"name": "waits for background copies"}),
    ]
    t = 0.0
    for tok in trace.tokens:
        ev: list[dict[str, Any]] = []
        dur = tok.seconds * 1e6
        rows = tok.events
        c = CacheTotals.from_events(rows)
        args: dict[str, Any] = {
            "index": tok.index, "token_id": tok.token_id, "text": tok.text,
            "policy": tok.policy, "slots_per_layer": tok.slots_per_layer,
            "hits": c.hits, "fetches": c.fetches, "substitutions": c.substitutions,
            "substituted_mass": c.substituted_mass, "bytes_sync": c.bytes_sync,
        }
        if tok.prefetches is not None and tok.prefetch_hits is not None:
            args["prefetches"] = int(tok.prefetches.sum())
            args["prefetch_hits"] = int(tok.prefetch_hits.sum())
        if tok.changes:
            args["changes"] = [c.to_json() for c in tok.changes]
        ev.append({"name": f"{tok.phase} {tok.text!r}", "cat": tok.phase, "ph": "X",
                   "pid": _PID, "tid": _TID_TOKENS, "ts": t, "dur": dur, "args": args})
        for c in tok.changes:
            label = (f"policy → {c.policy.name or 'custom'}" if c.policy is not None
                     else f"slots → {c.slots}" if c.slots is not None else c.text)
            ev.append({"name": label, "cat": "change", "ph": "i", "s": "g", "pid": _PID,
                       "tid": _TID_TOKENS, "ts": t})
        n = len(rows)
        for i, row in enumerate(rows):
            ts = t + dur * (i + 0.5) / n
            for j in range(int(row["k"])):
                action = int(row["action"][j])
                if action not in (FETCH, SUBSTITUTE):
                    continue
                expert = int(row["ids"][j])
                a: dict[str, Any] = {"layer": int(row["layer"]), "expert": expert,
                                     "weight": float(row["weights"][j]),
                                     "step": int(row["step"])}
                if action == SUBSTITUTE:
                    a["substitute"] = int(row["used_ids"][j])
                name = f"{'fetch' if action == FETCH else 'substitute'} L{a['layer']} E{expert}"
                ev.append({"name": name, "cat": "fetch" if action == FETCH else "substitute",
                           "ph": "i", "s": "t", "pid": _PID, "tid": _TID_LAYERS, "ts": ts,
                           "args": a})
        if tok.timings:
            for tid, key, count, label in ((_TID_SYNC, "sync_copy_us", "n_sync", "sync copies"),
                                           (_TID_ASYNC, "async_copy_us", "n_async",
                                            "background copies"),
                                           (_TID_WAIT, "wait_us", None, "wait")):
                us = tok.timings.get(key, 0)
                if us > 0:
                    a = {"us": us} | ({"copies": tok.timings.get(count, 0)} if count else {})
                    ev.append({"name": label, "cat": "copy", "ph": "X", "pid": _PID,
                               "tid": tid, "ts": t, "dur": float(us), "args": a})
        t += dur
        yield ev


def _closing(trace: Trace) -> dict[str, Any]:
    """The document's keys after ``traceEvents``."""
    h = trace.header
    return {
        "displayTimeUnit": "ms",
        "otherData": {"moescope_trace_version": h.version, "model": h.model.file_name,
                      "policy": h.policy.name, "budget": h.budget,
                      "slots_per_layer": h.slots_per_layer},
    }


def dump_perfetto(trace: Trace, out: IO[bytes], progress: Progress | None = None) -> None:
    """Write :func:`to_perfetto`'s JSON (the same bytes as ``json.dumps`` of it) to
    ``out`` a token at a time: a long trace's million events are never one document in
    memory nor one encoder call that holds the interpreter (a GUI export runs on a
    thread beside the window's)."""
    n = len(trace.tokens)
    out.write(b'{"traceEvents": [')
    first = True
    for i, events in enumerate(_event_groups(trace)):
        if events:
            text = json.dumps(events, ensure_ascii=False)[1:-1]
            out.write((text if first else ", " + text).encode("utf-8"))
            first = False
        if i and progress is not None:
            progress(i, n)
    rest = json.dumps(_closing(trace), ensure_ascii=False)[1:]
    out.write(b"], " + rest.encode("utf-8"))


def _meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": _PID, "tid": tid, "args": args}


def write_perfetto(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write :func:`to_perfetto` to ``path`` (a ``.json`` file ui.perfetto.dev opens)."""
    return fill_atomic(path, lambda f: dump_perfetto(trace, f))
