"""Reading a trace back: every record validated, the bad line named, a truncated tail accepted.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from moescope.cache.native import EVENT_DTYPE, MAX_K
from moescope.cache.residency import masks_from_json
from moescope.trace.schema import (
    PHASES,
    TIMING_KEYS,
    TRACE_FORMAT,
    TRACE_VERSION,
    Change,
    ModelSummary,
    TokenRecord,
    Trace,
    TraceFormatError,
    TraceHeader,
    _event_from_json,
    _prefetch_from_json,
    _route_from_json,
    policy_from_json,
)
from moescope.util.errors import MoEScopeError

# --------------------------------------------------------------------------- reading


class TraceReadCancelled(MoEScopeError):
    """``read_trace``'s ``progress`` asked to stop (the user closed the window, say)."""


ReadProgress = Callable[[int, int], bool]
"""``progress(bytes_read, file_bytes)`` after each record; False stops the read."""


def _read_lines(path: Path, progress: ReadProgress | None = None
                ) -> Iterator[tuple[int, bytes, bool]]:
    """(line number, raw line, ended with newline) for every line, read as they come (a
    long session's trace is gigabytes: never all in memory at once); a gzip stream cut
    off (a crash: everything sync-flushed before it is still complete) ends the lines
    with ``(n, b"", False)``. ``progress`` hears of the bytes read (compressed bytes of a
    gzip file) after every line."""
    with open(path, "rb") as raw:
        size = os.fstat(raw.fileno()).st_size
        gz = raw.read(2) == b"\x1f\x8b"
        raw.seek(0)
        stream: IO[bytes] = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
        n = 0
        while True:
            try:
                line = stream.readline()
            except (EOFError, zlib.error, gzip.BadGzipFile):
                yield n + 1, b"", False
                return
            if not line:
                return
            n += 1
            yield n, line, line.endswith(b"\n")
            if progress is not None and not progress(raw.tell(), size):
                raise TraceReadCancelled(f"{path.name}: reading the trace was cancelled")


def read_trace(path: str | os.PathLike[str], progress: ReadProgress | None = None) -> Trace:
    """Read and validate a trace (plain or gzip JSON Lines).

    A malformed record raises :class:`TraceFormatError` naming its line; a last line
    without its newline (a writer killed mid-token) is dropped and flagged ``truncated``.
    ``progress(bytes_read, file_bytes)`` is called after every record; returning False
    raises :class:`TraceReadCancelled`.
    """
    p = Path(path)
    header: TraceHeader | None = None
    tokens: list[TokenRecord] = []
    end: dict[str, Any] | None = None
    truncated = False
    lines = _read_lines(p, progress)
    n = 0
    while True:
        try:
            n, raw, complete = next(lines)
        except StopIteration:
            break
        except FileNotFoundError:
            raise TraceFormatError(f"{p}: no such trace file") from None
        except IsADirectoryError:
            raise TraceFormatError(f"{p}: is a folder, not a trace file") from None
        except OSError as err:
            raise TraceFormatError(f"{p}: cannot read trace ({err})") from None
        if not raw and not complete:  # a gzip stream cut off
            if header is None:
                raise TraceFormatError(f"{p.name}: a damaged gzip stream before any "
                                       f"record, not a readable MoEScope trace")
            truncated = True
            break
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise ValueError("a record must be a JSON object")
        except ValueError as err:
            if not complete and header is not None:  # only the last line can lack its \n
                truncated = True  # the writer died while writing this line
                break
            raise TraceFormatError(f"{p.name}: line {n}: not valid JSON ({err})") from None
        kind = obj.get("type")
        try:
            if n == 1 or header is None:
                if kind != "header":
                    raise ValueError("the first record must be the header")
                header = _header_from_json(obj)
            elif kind == "token":
                tokens.append(_token_from_json(obj, header, len(tokens)))
            elif kind == "end":
                end = obj
            elif kind == "header":
                raise ValueError("a second header")
            # other record types: written by a newer minor version, skipped
        except TraceFormatError as err:
            if str(err).startswith(p.name):
                raise
            raise TraceFormatError(f"{p.name}: {err}") from None
        except (KeyError, TypeError, ValueError, IndexError) as err:
            what = f"missing field {err}" if isinstance(err, KeyError) else str(err)
            raise TraceFormatError(f"{p.name}: line {n}: bad {kind or 'record'} "
                                   f"record: {what}") from None
    if n == 0:
        raise TraceFormatError(f"{p.name}: empty file, not a MoEScope trace")
    if header is None:
        raise TraceFormatError(f"{p.name}: no header record")
    return Trace(header=header, tokens=tokens, end=end, truncated=truncated, path=p)


def _header_from_json(d: Mapping[str, Any]) -> TraceHeader:
    if d.get("format") != TRACE_FORMAT:
        raise ValueError(f"format is {d.get('format')!r}, expected {TRACE_FORMAT!r}")
    version = int(d["version"])
    if version > TRACE_VERSION or version < 1:
        raise TraceFormatError(f"trace version {version} is not supported (this MoEScope "
                               f"reads version {TRACE_VERSION}); update MoEScope")
    router = d.get("router_inputs")
    if router not in (None, "f32", "f16"):
        raise ValueError(f"router_inputs {router!r} is not f32, f16 or null")
    state = d.get("initial_state") or {}
    model = ModelSummary.from_json(d["model"])
    if len(model.bytes_per_expert) != len(model.moe_layers):
        raise ValueError("bytes_per_expert needs one entry per MoE layer")
    if not 0 < model.top_k <= min(model.n_expert, MAX_K):
        raise ValueError(f"top_k {model.top_k} does not fit {model.n_expert} experts")
    slots = _checked_slots(int(d["slots_per_layer"]), model, "slots_per_layer {}")
    return TraceHeader(
        model=model, budget=str(d.get("budget", "")),
        slots_per_layer=slots, policy=policy_from_json(d["policy"]),
        router_inputs=router, initial_step=int(state.get("step", 0)),
        initial_resident=int(state.get("resident", 0)),
        software=dict(d.get("software") or {}), machine=dict(d.get("machine") or {}),
        created=str(d.get("created", "")), version=version,
    )


def _token_from_json(d: Mapping[str, Any], header: TraceHeader, expected: int) -> TokenRecord:
    index = int(d["index"])
    if index != expected:
        raise ValueError(f"token index {index}, expected {expected}")
    phase = str(d["phase"])
    if phase not in PHASES:
        raise ValueError(f"phase {phase!r} is not one of {', '.join(PHASES)}")
    seconds = float(d["seconds"])
    if not seconds >= 0.0:
        raise ValueError(f"seconds {seconds} must be >= 0")
    raw_events = d["events"]
    events = np.zeros(len(raw_events), dtype=EVENT_DTYPE)
    m = header.model
    for i, e in enumerate(raw_events):
        _event_from_json(e, events[i])
        if int(e["k"]) != m.top_k or int(e["layer"]) not in m.moe_layers:
            raise ValueError(f"event {i}: layer {e['layer']} / k {e['k']} do not fit the model")
    _check_expert_ids(events, m.n_expert)
    routes = {}
    for r in d.get("routes", ()):
        route = _route_from_json(r, m.n_expert, len(events))
        if route.ids.size and not (route.ids.min() >= 0 and route.ids.max() < m.n_expert):
            raise ValueError(f"router input of row {route.row}: expert ids outside "
                             f"0..{m.n_expert - 1}")
        if route.predicted is not None and route.next_layer not in m.moe_layers:
            raise ValueError(f"row {route.row}: a prediction for layer {route.next_layer}, "
                             f"not a MoE layer")
        routes[route.row] = route
    changes = [_change_from_json(c) for c in d.get("changes", ())]
    for c in changes:
        if c.kind == "slots" and c.slots is not None:
            _checked_slots(c.slots, m, "a budget change to {} slots")
    timings = d.get("timings")
    prefetches = prefetch_hits = None
    if "prefetch" in d:  # absent: written before the counters existed, so unknown
        prefetches, prefetch_hits = _prefetch_from_json(d["prefetch"], m.moe_layers)
    slots = _checked_slots(int(d["slots_per_layer"]), m, "slots_per_layer {}")
    resident = None
    if "resident" in d:  # absent: the event rows explain residency (or an older trace)
        resident = masks_from_json(d["resident"], m.moe_layers, m.n_expert, slots)
    return TokenRecord(
        index=index, phase=phase, token_id=int(d["token_id"]), text=str(d["text"]),
        seconds=seconds, policy=str(d["policy"]), slots_per_layer=slots, events=events,
        routes=routes, changes=changes,
        timings={k: int(timings.get(k, 0)) for k in TIMING_KEYS} if timings else None,
        answer=int(d.get("answer", 0)), position=int(d.get("position", 0)),
        prefetches=prefetches, prefetch_hits=prefetch_hits, resident=resident,
    )


def _checked_slots(slots: int, model: ModelSummary, what: str) -> int:
    """``slots`` per layer if the model can have that many (top-k to all experts);
    ``what`` names the field, ``{}`` standing for the value."""
    if not model.top_k <= slots <= model.n_expert:
        raise ValueError(f"{what.format(slots)} is outside [top-k {model.top_k}, "
                         f"{model.n_expert} experts]")
    return slots


def _check_expert_ids(events: npt.NDArray[Any], n_expert: int) -> None:
    """Every expert id a row names (routed, used, admitted, evicted) is one of the model's:
    the views and the simulator index arrays with them, and the core refuses them."""
    if not len(events):
        return
    for name, count in (("ids", "k"), ("used_ids", "k"), ("admitted", "n_admit"),
                        ("evicted", "n_evict")):
        ids = events[name]
        named = np.arange(ids.shape[1]) < np.minimum(events[count], ids.shape[1])[:, None]
        bad = (named & ((ids < 0) | (ids >= n_expert))).any(axis=1)
        if bad.any():
            raise ValueError(f"event {int(np.argmax(bad))}: {name} outside "
                             f"0..{n_expert - 1}")


def _change_from_json(d: Mapping[str, Any]) -> Change:
    kind = d["kind"]
    if kind == "policy":
        return Change("policy", policy=policy_from_json(d["policy"]))
    if kind == "slots":
        return Change("slots", slots=int(d["slots"]))
    if kind == "note":
        return Change("note", text=str(d.get("text", "")))
    raise ValueError(f"unknown change kind {kind!r}")
