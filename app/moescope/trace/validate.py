"""Checking a trace's records field by field, against the header's model.

Every number read from a trace is bounded before it is used (a hostile file must not make
the replay's core or the simulator allocate by it); a bad field raises ``ValueError``
naming the field and showing the value briefly, which :mod:`.reader` turns into a
:class:`~moescope.trace.schema.TraceFormatError` naming the line. A token's event rows and
router inputs are checked column by column in a few numpy calls (a token has a row per MoE
layer; per-row Python checks were most of the cost of reading).

About 750 lines on purpose: it is the one list of every field's bound, for every record
kind of both trace formats (JSON lines and Arrow); kept together so that a bound is
written once and a reviewer can check the whole schema against ``docs/trace-format.md``
in one place.
"""

from __future__ import annotations

import base64
import functools
import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from moescope.cache.audit import AuditRecord
from moescope.cache.native import EVENT_DTYPE, FETCH, HIT, MAX_K, SUBSTITUTE
from moescope.cache.policy import DEFAULT_BONUS, Eviction, MissRule, Policy, SubstituteWeight
from moescope.cache.residency import masks_from_json
from moescope.trace.schema import (
    PHASES,
    TIMING_KEYS,
    TRACE_FORMAT,
    TRACE_VERSION,
    Change,
    RouterInput,
    TokenRecord,
    TraceFormatError,
    TraceHeader,
    TraceModel,
)
from moescope.util.words import utf8_name

MAX_LAYERS = 1024
MAX_EXPERTS = 8192
MAX_LAYER_EXPERTS = 1 << 20
"""Bounds of a trace's model geometry, checked before anything is sized by it: the replay's
core allocates per layer and expert, the simulator lays out rows x experts. The largest MoE
models have about 100 layers, 512 experts and 50,000 layer-experts."""
MAX_STEP_SLACK = 1 << 20
"""How far a trace's steps may run ahead of its records. The core's step advances once per
governed decode step (at most once per token, so never more than the records so far), and
a replay walks every step (the core's step cannot be set), so a row's step is bounded by
the initial step, the tokens and rows read so far, and this slack (about a second of
walking) for steps recorded without rows."""
_MAX_BYTES = 1 << 50
_I32 = (1 << 31) - 1
_INT = {int}
_NONE = object()
_I64 = (1 << 63) - 1
_FLT_MAX = 3.4028234663852886e38
_REQUIRED: Any = object()


class _ReadState:
    """What the reader carries from token to token to bound the next one: the last row's
    step, the rows read, and the slots in force."""

    def __init__(self, header: TraceHeader) -> None:
        self.step = header.initial_step
        self.step_base = header.initial_step + MAX_STEP_SLACK
        self.rows = 0
        self.slots = header.slots_per_layer



# --- field checks: each names its field, and shows a bad value without printing it whole


def _show(value: Any) -> str:
    """A value as an error message shows it: short, on one line, containers by their type
    (a hostile file may hold a thousand-digit integer or a deeply nested list)."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if isinstance(value, int):
        return str(value) if value.bit_length() <= 128 else f"a {value.bit_length()}-bit integer"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return repr(value) if len(value) <= 40 else repr(value[:40]) + "..."
    if isinstance(value, list):
        return f"a list of {len(value)}"
    if isinstance(value, dict):
        return "an object"
    return type(value).__name__


def _is_scalar(value: Any) -> bool:
    return value is None or type(value) in (str, int, float, bool)


def _get(d: Mapping[str, Any], key: str, where: str = "", default: Any = _REQUIRED) -> Any:
    if key in d:
        return d[key]
    if default is _REQUIRED:
        raise ValueError(f"missing field {where}{key}")
    return default


def _int(value: Any, name: str, lo: int = -_I64 - 1, hi: int = _I64) -> int:
    if type(value) is not int:  # bool is not an integer here
        raise ValueError(f"{name} is {_show(value)}, not an integer")
    if not lo <= value <= hi:
        raise ValueError(f"{name} {_show(value)} is outside {lo}..{hi}")
    return value


def _number(value: Any, name: str, lo: float, hi: float) -> float:
    if type(value) is int:
        if not lo <= value <= hi:
            raise ValueError(f"{name} {_show(value)} is outside {_range(lo, hi)}")
        return float(value)
    if type(value) is not float:
        raise ValueError(f"{name} is {_show(value)}, not a number")
    if not lo <= value <= hi:
        raise ValueError(f"{name} {value!r} is outside {_range(lo, hi)}")
    return value


def _text(value: Any, name: str, *, optional: bool = False) -> Any:
    if type(value) is str or (optional and value is None):
        return value
    raise ValueError(f"{name} is {_show(value)}, not a string")


def _object(value: Any, name: str) -> dict[str, Any]:
    if type(value) is not dict:
        raise ValueError(f"{name} is {_show(value)}, not an object")
    return value


def _list(value: Any, name: str) -> list[Any]:
    if type(value) is not list:
        raise ValueError(f"{name} is {_show(value)}, not a list")
    return value


def _column(values: list[Any], name: str, kind: str, width: int | None = None
            ) -> npt.NDArray[Any]:
    """``values`` (scalars, or lists of ``width`` scalars) as one int64 (``kind`` "i") or
    float64 ("f") array, converted by numpy in one call; ``name`` formats with the index
    of a bad entry (``"events[{}].ids"``)."""
    n = len(values)
    shape = (n,) if width is None else (n, width)
    if width is not None:
        for i, v in enumerate(values):
            if type(v) is not list or len(v) != width:
                raise ValueError(f"{name.format(i)} is {_show(v)}, expected a list of {width}")
    if n == 0 or width == 0:
        return np.zeros(shape, dtype=np.int64 if kind == "i" else np.float64)
    try:
        a = np.array(values)
    except (ValueError, TypeError, OverflowError):
        a = None
    if a is not None and a.shape == shape and a.dtype.kind in ("i" if kind == "i" else "if"):
        return a
    for i, v in enumerate(values):
        for j, x in enumerate([v] if width is None else v):
            if type(x) is int and -_I64 - 1 <= x <= _I64:
                continue
            if kind == "f" and type(x) is float:
                continue
            at = name.format(i) + ("" if width is None else f"[{j}]")
            what = "an integer" if kind == "i" else "a number"
            if type(x) is int:
                raise ValueError(f"{at} {_show(x)} is outside the 64-bit range")
            raise ValueError(f"{at} is {_show(x)}, not {what}")
    raise ValueError(f"{name.format(0)}: entries of mixed kinds")


def _range(lo: float, hi: float) -> str:
    return f"{lo}..{hi}" if isinstance(lo, int) and isinstance(hi, int) else f"{lo:g}..{hi:g}"


def _bad_at(bad: npt.NDArray[np.bool_]) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(bad)), bad.shape))


def _label(name: str, at: tuple[int, ...]) -> str:
    return name.format(at[0]) + "".join(f"[{i}]" for i in at[1:])


def _within(a: npt.NDArray[Any], name: str, lo: float, hi: float, what: str = "") -> None:
    """Every entry of ``a`` in ``lo..hi`` (NaN is not), else ``ValueError`` naming the
    first that is not; ``what`` replaces the range in the message."""
    if not a.size or (a.min() >= lo and a.max() <= hi):  # NaN fails both
        return
    bad = ~((a >= lo) & (a <= hi))
    if bad.any():
        at = _bad_at(bad)
        raise ValueError(f"{_label(name, at)} {_show(a[at].item())} "
                         f"{what or f'is outside {_range(lo, hi)}'}")


def _first_repeat(ids: npt.NDArray[Any], padded: bool = False) -> int:
    """The first row of ``ids`` (each entry a value, or with ``padded`` a negative padding
    entry, left out) that names a value twice, -1 if none does: each row sorted
    (numpy sorts a 2-D array's rows in one call), then neighbours compared, a chunk of
    rows at a time. Measured on 19,200 rows of 512 experts (a 400-token trace): 0.46 ms
    for top-10 and 0.79 ms for 32-wide padded predictions, where marking a bitmap of
    (row, value) cells and counting it took 0.84 and 2.08 ms (a row's cells are the
    experts, 50 bytes an entry to clear and count)."""
    n, w = ids.shape
    if n == 0 or w < 2:
        return -1
    per = max(1, (1 << 20) // w)  # rows a chunk: a sorted copy of ~8 MB at most
    for a in range(0, n, per):
        s = np.sort(ids[a:a + per], axis=1)
        same = s[:, 1:] == s[:, :-1]
        if padded:
            same &= s[:, 1:] >= 0  # padding (negative) sorts first and never repeats
        if same.any():  # flat: the row only where one repeats
            return a + int(np.argmax(same.any(axis=1)))
    return -1


def _distinct(ids: npt.NDArray[Any], name: str) -> None:
    """No row of ``ids`` names an expert twice (the core refuses such a selection)."""
    i = _first_repeat(ids)
    if i >= 0:
        s = np.sort(ids[i])
        j = int(np.argmax(s[1:] == s[:-1]))
        raise ValueError(f"{name.format(i)} names expert {int(s[j])} twice")


# --- records


def _model_from_json(raw: Any) -> TraceModel:
    d = _object(raw, "model")
    n_layers = _int(_get(d, "n_layers", "model."), "model.n_layers", 1, MAX_LAYERS)
    n_expert = _int(_get(d, "n_expert", "model."), "model.n_expert", 1, MAX_EXPERTS)
    if n_layers * n_expert > MAX_LAYER_EXPERTS:
        raise ValueError(f"model: {n_layers} layers x {n_expert} experts is more than "
                         f"{MAX_LAYER_EXPERTS}")
    top_k = _int(_get(d, "top_k", "model."), "model.top_k")
    if not 0 < top_k <= min(n_expert, MAX_K):
        raise ValueError(f"top_k {top_k} does not fit {n_expert} experts (at most {MAX_K})")
    moe = _column(_list(_get(d, "moe_layers", "model."), "model.moe_layers"),
                  "model.moe_layers[{}]", "i")
    _within(moe, "model.moe_layers[{}]", 0, n_layers - 1,
            f"is not a layer of the model's {n_layers}")
    if not len(moe) or (np.diff(moe) <= 0).any():
        raise ValueError("model.moe_layers must be distinct layers in increasing order")
    per_expert = _column(_list(_get(d, "bytes_per_expert", "model."),
                               "model.bytes_per_expert"), "model.bytes_per_expert[{}]", "i")
    if len(per_expert) != len(moe):
        raise ValueError("bytes_per_expert needs one entry per MoE layer")
    _within(per_expert, "model.bytes_per_expert[{}]", 0, _MAX_BYTES)
    return TraceModel(
        # a trace written before names were escaped holds the byte as JSON's \udcff
        file_name=utf8_name(_text(_get(d, "file_name", "model."), "model.file_name")),
        metadata_sha256=_text(_get(d, "metadata_sha256", "model."), "model.metadata_sha256"),
        architecture=_text(_get(d, "architecture", "model."), "model.architecture"),
        n_layers=n_layers, moe_layers=tuple(moe.tolist()), n_expert=n_expert, top_k=top_k,
        bytes_per_expert=tuple(per_expert.tolist()),
        non_expert_bytes=_int(d.get("non_expert_bytes") or 0, "model.non_expert_bytes", 0,
                              _MAX_BYTES),
        name=_text(d.get("name"), "model.name", optional=True),
    )


def _info_from_json(raw: Any, name: str) -> dict[str, Any]:
    """``software`` or ``machine``: informational, so entries other than scalars and lists
    of scalars are left out rather than refused."""
    if raw is None:
        return {}
    return {k: v for k, v in _object(raw, name).items()
            if _is_scalar(v) or (type(v) is list and all(_is_scalar(x) for x in v))}


def _header_from_json(d: Mapping[str, Any], versions: tuple[int, int] = (1, TRACE_VERSION)
                      ) -> TraceHeader:
    """The header record; ``versions`` is the range this container may hold (JSON Lines
    holds version 1, an Arrow stream version 2)."""
    if d.get("format") != TRACE_FORMAT:
        raise ValueError(f"format is {_show(d.get('format'))}, expected {TRACE_FORMAT!r}")
    version = _int(_get(d, "version"), "version")
    if version > 2 or version < 1:
        raise TraceFormatError(f"trace version {version} is not supported (this MoEScope "
                               f"reads versions 1 and 2); update MoEScope")
    if not versions[0] <= version <= versions[1]:
        raise TraceFormatError(f"trace version {version} is not supported in this file's "
                               f"format (version {versions[1]}'s)")
    router = d.get("router_inputs")
    if router not in (None, "f32", "f16"):
        raise ValueError(f"router_inputs {_show(router)} is not f32, f16 or null")
    model = _model_from_json(_get(d, "model"))
    slots = _checked_slots(_int(_get(d, "slots_per_layer"), "slots_per_layer"), model,
                           "slots_per_layer {}")
    policy = _policy_from_json(_get(d, "policy"), "policy")
    state = d.get("initial_state")
    state = {} if state is None else _object(state, "initial_state")
    return TraceHeader(
        model=model, budget=_text(d.get("budget", ""), "budget"),
        slots_per_layer=slots, policy=policy, router_inputs=router,
        initial_step=_int(state.get("step", 0), "initial_state.step", 0, MAX_STEP_SLACK),
        initial_resident=_int(state.get("resident", 0), "initial_state.resident", 0,
                              len(model.moe_layers) * slots),
        software=_info_from_json(d.get("software"), "software"),
        machine=_info_from_json(d.get("machine"), "machine"),
        created=_text(d.get("created", ""), "created"), version=version,
    )


def policy_from_json(d: Mapping[str, Any]) -> Policy:
    """Inverse of :func:`policy_to_json`; ``ValueError`` naming the field on bad input
    (numbers outside :class:`Policy`'s ranges, which the native core would refuse or
    round to another meaning, included)."""
    return _policy_from_json(d, "policy")


def _policy_from_json(raw: Any, where: str) -> Policy:
    d = _object(raw, where)

    def enum(cls: Any, key: str) -> Any:
        value = _text(_get(d, key, f"{where}."), f"{where}.{key}")
        try:
            return cls[value.upper()]
        except KeyError:
            known = ", ".join(m.name.lower() for m in cls)
            raise ValueError(f"{where}.{key} {_show(value)} is not one of {known}") from None

    def number(key: str, default: Any = _REQUIRED) -> float:
        return _number(_get(d, key, f"{where}.", default), f"{where}.{key}",
                       -_FLT_MAX, _FLT_MAX)

    admission = _get(d, "admission", f"{where}.")
    if admission not in (True, False) or type(admission) not in (bool, int):
        raise ValueError(f"{where}.admission is {_show(admission)}, not true or false")
    # recorded before the setting existed: the rule alone decided, as the replay must
    fill_free = d.get("fill_free", False)
    if fill_free not in (True, False) or type(fill_free) not in (bool, int):
        raise ValueError(f"{where}.fill_free is {_show(fill_free)}, not true or false")
    try:
        policy = Policy(
            miss_rule=enum(MissRule, "miss_rule"), theta=number("theta"),
            eviction=enum(Eviction, "eviction"), half_life=number("half_life"),
            admission=bool(admission), beta=number("beta"),
            substitute_weight=enum(SubstituteWeight, "substitute_weight"),
            bonus=number("bonus", DEFAULT_BONUS),
            prefetch=_int(d.get("prefetch", 0), f"{where}.prefetch", -1, _I32),
            theta_disk=number("theta_disk", -1.0), fill_free=bool(fill_free),
            name=_text(d.get("name"), f"{where}.name", optional=True),
        )
    except ValueError as err:  # Policy's own ranges: what the core keeps meaningful
        if str(err).startswith(where):
            raise
        raise ValueError(f"{where}: {err}") from None
    return policy


def _token_slots(d: Mapping[str, Any], header: TraceHeader, expected: int,
                 state: _ReadState) -> tuple[list[Change], int, int]:
    """A token's changes, its slots, and the most slots in force during it (a resize
    applies before the token's rows: a row's slot is below the largest in force)."""
    index = d.get("index")  # the named checks only when the plain test fails
    if type(index) is not int or index != expected:
        index = _int(_get(d, "index"), "index")
        raise ValueError(f"token index {index}, expected {expected}")
    m = header.model
    raw = d.get("changes", _NONE)
    changes = [] if raw is _NONE else _changes_from_json(raw, m)
    slots = d.get("slots_per_layer")
    if type(slots) is not int:
        slots = _int(_get(d, "slots_per_layer"), "slots_per_layer")
    slots = _checked_slots(slots, m, "slots_per_layer {}")
    if not changes:
        return changes, slots, max(state.slots, slots)
    in_force = max([state.slots, slots, *(c.slots for c in changes if c.slots is not None)])
    return changes, slots, in_force


def _token_from_json(d: Mapping[str, Any], header: TraceHeader, expected: int,
                     state: _ReadState) -> TokenRecord:
    m = header.model
    changes, slots, in_force = _token_slots(d, header, expected, state)
    events = _events_from_json(_get(d, "events"), m, state, expected, in_force)
    routes = _routes_from_json(d.get("routes", []), m, events)
    return _token_record(d, header, expected, state, changes, slots, events, routes)


def _token_record(d: Mapping[str, Any], header: TraceHeader, index: int, state: _ReadState,
                  changes: list[Change], slots: int, events: npt.NDArray[Any] | None,
                  routes: Mapping[int, RouterInput],
                  make: Callable[..., TokenRecord] = TokenRecord,
                  counters: tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None = None,
                  ) -> TokenRecord:
    """The token's own fields, checked, around its already checked rows; ``make`` builds
    the record from them (a version-2 reader's lays its rows out when first read);
    ``counters``, its PSR counters already checked (:func:`prefetch_rows`)."""
    get = d.get  # each field: a type and range test, the named check only when it fails
    phase = get("phase")
    if type(phase) is not str or phase not in PHASES:
        phase = _text(_get(d, "phase"), "phase")
        raise ValueError(f"phase {_show(phase)} is not one of {', '.join(PHASES)}")
    seconds = get("seconds")
    if type(seconds) is not float or not 0.0 <= seconds <= 1e9:
        seconds = _number(_get(d, "seconds"), "seconds", 0.0, 1e9)
    token_id, text, policy = get("token_id"), get("text"), get("policy")
    if type(token_id) is not int or not 0 <= token_id <= _I32:
        token_id = _int(_get(d, "token_id"), "token_id", 0, _I32)
    if type(text) is not str:
        text = _text(_get(d, "text"), "text")
    if type(policy) is not str:
        policy = _text(_get(d, "policy"), "policy")
    answer, position = get("answer", 0), get("position", 0)
    if type(answer) is not int or not 0 <= answer <= index:
        answer = _int(answer, "answer", 0, index)
    if type(position) is not int or not 0 <= position <= _I32:
        position = _int(position, "position", 0, _I32)
    m = header.model
    timings = d.get("timings")
    if timings is not None:
        timings = _object(timings, "timings")
        values = [timings.get(k, 0) for k in TIMING_KEYS]
        if set(map(type, values)) != _INT or not -(1 << 53) <= min(values) <= max(values) \
                <= 1 << 53:
            for k, v in zip(TIMING_KEYS, values, strict=True):  # the first bad one, named
                _int(v, f"timings.{k}", -(1 << 53), 1 << 53)
        timings = dict(zip(TIMING_KEYS, values, strict=True))
    prefetches = prefetch_hits = None
    if counters is not None:  # checked with the other tokens' (prefetch_rows)
        prefetches, prefetch_hits = counters
    elif "prefetch" in d:  # absent: written before the counters existed, so unknown
        prefetches, prefetch_hits = _prefetch_from_json(d["prefetch"], m.moe_layers)
    resident = None
    if "resident" in d:  # absent: the event rows explain residency (or an older trace)
        resident = masks_from_json(d["resident"], m.moe_layers, m.n_expert, slots)
    audit = AuditRecord.from_json(_object(d["audit"], "audit")) if "audit" in d else None
    state.slots = slots
    return make(
        index=index, phase=phase, token_id=token_id, text=text, seconds=seconds,
        policy=policy, slots_per_layer=slots, events=events,
        routes=routes, changes=changes, timings=timings,  # type: ignore[arg-type]
        answer=answer, position=position,
        prefetches=prefetches, prefetch_hits=prefetch_hits, resident=resident,
        audit=audit,
    )


def _checked_slots(slots: int, model: TraceModel, what: str) -> int:
    """``slots`` per layer if the model can have that many (top-k to all experts);
    ``what`` names the field, ``{}`` standing for the value."""
    if not model.top_k <= slots <= model.n_expert:
        raise ValueError(f"{what.format(slots)} is outside [top-k {model.top_k}, "
                         f"{model.n_expert} experts]")
    return slots


def _events_from_json(raw: Any, m: TraceModel, state: _ReadState, token: int,
                      slots: int) -> npt.NDArray[Any]:
    """A token's event rows, every field checked against the model (and ``slots``, the
    most slots in force during the token) column by column, in one numpy call per field:
    a token has a row per MoE layer, 48 on Qwen3-Next."""
    rows = _list(raw, "events")
    n = len(rows)
    for i, e in enumerate(rows):
        if type(e) is not dict:
            raise ValueError(f"events[{i}] is {_show(e)}, not an object")
    events = np.zeros(n, dtype=EVENT_DTYPE)
    if not n:
        return events
    k, n_expert = m.top_k, m.n_expert

    def col(name: str, kind: str, width: int | None = None) -> npt.NDArray[Any]:
        try:
            values = [e[name] for e in rows]
        except KeyError:
            i = next(i for i, e in enumerate(rows) if name not in e)
            raise ValueError(f"missing field events[{i}].{name}") from None
        return _column(values, f"events[{{}}].{name}", kind, width)

    _within(col("k", "i"), "events[{}].k", k, k, f"is not the model's top-k {k}")
    layer = col("layer", "i")
    bad = ~np.isin(layer, m.moe_layers)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"events[{i}].layer {int(layer[i])} is not a MoE layer of the model")
    step = col("step", "i")
    limit = state.step_base + state.rows + n + token
    _within(step, "events[{}].step", 0, limit,
            f"is beyond step {limit}, more than the trace's records can reach")
    back = np.diff(step, prepend=state.step) < 0
    if back.any():
        i = int(np.argmax(back))
        raise ValueError(f"events[{i}].step {int(step[i])} goes back (after step "
                         f"{state.step if i == 0 else int(step[i - 1])})")
    batch = col("token", "i")
    _within(batch, "events[{}].token", 0, _I32)
    ids = col("ids", "i", k)
    _within(ids, "events[{}].ids", 0, n_expert - 1, f"is not an expert (0..{n_expert - 1})")
    _distinct(ids, "events[{}].ids")
    weights = col("weights", "f", k)
    _within(weights, "events[{}].weights", 0.0, 1.0, "is not a normalized weight (0..1)")
    action = col("action", "i", k)
    _within(action, "events[{}].action", HIT, SUBSTITUTE,
            f"is not an action (hit {HIT}, fetch {FETCH}, substitute {SUBSTITUTE})")
    used = col("used_ids", "i", k)
    _within(used, "events[{}].used_ids", 0, n_expert - 1,
            f"is not an expert (0..{n_expert - 1})")
    slot = col("slots", "i", k)
    _within(slot, "events[{}].slots", 0, slots - 1, f"is not a slot (0..{slots - 1})")
    mass = col("substituted_mass", "f")
    _within(mass, "events[{}].substituted_mass", 0.0, 1.001,
            "is not a substituted weight (0..1)")
    for name, code in (("n_hit", HIT), ("n_fetch", FETCH), ("n_substitute", SUBSTITUTE)):
        count = col(name, "i")
        wrong = count != (action == code).sum(axis=1)
        if wrong.any():
            i = int(np.argmax(wrong))
            raise ValueError(f"events[{i}].{name} {_show(count[i].item())} does not match "
                             f"the row's actions")
    n_admit = col("n_admit", "i")
    _within(n_admit, "events[{}].n_admit", 0, k)
    n_evict = col("n_evict", "i")
    _within(n_evict, "events[{}].n_evict", 0, 2 * k)
    for name in ("bytes_sync", "bytes_async"):
        values = col(name, "i")
        _within(values, f"events[{{}}].{name}", 0, _MAX_BYTES)
        events[name] = values
    if "tier" in rows[0]:  # the disk tier's fields (traces before it have none: zeros)
        tier = col("tier", "i", k)
        _within(tier, "events[{}].tier", 0, 2, "is not a tier (0 slot, 1 RAM, 2 disk)")
        n_disk = col("n_disk", "i")
        _within(n_disk, "events[{}].n_disk", 0, n_expert)
        bytes_disk = col("bytes_disk", "i")
        _within(bytes_disk, "events[{}].bytes_disk", 0, _MAX_BYTES)
        events["tier"][:, :k], events["n_disk"], events["bytes_disk"] = tier, n_disk, bytes_disk
    for name, counts in (("admitted", n_admit), ("evicted", n_evict)):
        for i, e in enumerate(rows):
            values = _list(e.get(name, []), f"events[{i}].{name}")
            want = min(int(counts[i]), MAX_K)
            if len(values) != want:
                raise ValueError(f"events[{i}].{name} has {len(values)} entries, "
                                 f"n_{'admit' if name == 'admitted' else 'evict'} is {want}")
            if values:
                got = _column(values, f"events[{i}].{name}[{{}}]", "i")
                _within(got, f"events[{i}].{name}[{{}}]", 0, n_expert - 1,
                        f"is not an expert (0..{n_expert - 1})")
                events[name][i, :want] = got
    events["step"], events["layer"], events["token"], events["k"] = step, layer, batch, k
    events["ids"][:, :k], events["weights"][:, :k] = ids, weights
    events["action"][:, :k], events["used_ids"][:, :k], events["slots"][:, :k] = (
        action, used, slot)
    events["substituted_mass"] = mass
    events["n_hit"] = (action == HIT).sum(axis=1)
    events["n_fetch"] = (action == FETCH).sum(axis=1)
    events["n_substitute"] = (action == SUBSTITUTE).sum(axis=1)
    events["n_admit"], events["n_evict"] = n_admit, n_evict
    state.step = int(step[-1])
    state.rows += n
    return events


def _routes_from_json(raw: Any, m: TraceModel, events: npt.NDArray[Any]
                      ) -> dict[int, RouterInput]:
    """A token's router inputs, checked against the model and its rows; ids, weights and
    probabilities of all its rows are converted and checked together (a token has a row
    per MoE layer, and small numpy calls per row were most of the cost of reading)."""
    items = _list(raw, "routes")
    if not items:
        return {}
    n_expert, k = m.n_expert, m.top_k
    rows: list[int] = []
    blobs: list[bytes] = []
    dtype: str | None = None
    for i, item in enumerate(items):
        where = f"routes[{i}]"
        r = _object(item, where)
        row = _int(_get(r, "row", f"{where}."), f"{where}.row")
        if not 0 <= row < len(events):
            raise ValueError(f"route row {row} is not an event row of this token")
        probs_dtype = r.get("probs_dtype")
        this = {"f32": "<f4", "f16": "<f2"}.get(probs_dtype) if type(probs_dtype) is str \
            else None
        if this is None or (dtype is not None and this != dtype):
            raise ValueError(f"{where}: unknown probs_dtype {_show(probs_dtype)}")
        dtype = this
        text = _text(_get(r, "probs", f"{where}."), f"{where}.probs")
        size = 4 if dtype == "<f4" else 2
        if len(text) != 4 * -(-n_expert * size // 3):  # base64 of exactly n_expert values
            raise ValueError(f"route probs have {len(text) * 3 // 4 // size} entries, the "
                             f"model has {n_expert}")
        blobs.append(base64.b64decode(text, validate=True)[:n_expert * size])
        rows.append(row)
    if len(set(rows)) != len(rows):
        raise ValueError(f"routes name row {next(r for r in rows if rows.count(r) > 1)} twice")
    assert dtype is not None
    probs = np.frombuffer(b"".join(blobs), dtype=dtype).reshape(len(items), n_expert)
    if not np.isfinite(probs).all():
        i = int(np.argmax(~np.isfinite(probs).all(axis=1)))
        raise ValueError(f"routes[{i}].probs hold a value that is not finite")
    ids = _column([_get(r, "ids", f"routes[{i}].") for i, r in enumerate(items)],
                  "routes[{}].ids", "i", k)
    if not ((ids >= 0) & (ids < n_expert)).all():
        i = int(np.argmax(~((ids >= 0) & (ids < n_expert)).all(axis=1)))
        raise ValueError(f"router input of row {rows[i]}: expert ids outside "
                         f"0..{n_expert - 1}")
    _distinct(ids, "routes[{}].ids")
    weights = _column([_get(r, "weights", f"routes[{i}].") for i, r in enumerate(items)],
                      "routes[{}].weights", "f", k)
    _within(weights, "routes[{}].weights", 0.0, _FLT_MAX, "is not a gate weight (0 or more)")
    probs32 = probs.astype(np.float32)
    ids32 = ids.astype(np.int32)
    weights32 = weights.astype(np.float32)
    predicted = _predictions_from_json(items, rows, m)
    return {row: RouterInput(row=row, probs=probs32[i], weights=weights32[i], ids=ids32[i],
                             next_layer=predicted[i][0], predicted=predicted[i][1])
            for i, row in enumerate(rows)}


def _predictions_from_json(items: list[dict[str, Any]], rows: list[int], m: TraceModel
                           ) -> list[tuple[int, npt.NDArray[np.int32] | None]]:
    """PSR: each route's ``(next_layer, ranked ids)``, ``(-1, None)`` where it has none;
    checked together when all have as many ids (the usual case)."""
    out: list[tuple[int, npt.NDArray[np.int32] | None]] = [(-1, None)] * len(items)
    have = [i for i, r in enumerate(items) if "predicted" in r]
    if not have:
        return out
    lists = [_list(items[i]["predicted"], f"routes[{i}].predicted") for i in have]
    width = len(lists[0])
    groups = ([(have, lists)] if all(len(x) == width for x in lists)
              else [([i], [x]) for i, x in zip(have, lists, strict=True)])
    ranked: dict[int, npt.NDArray[np.int32]] = {}
    for idx, values in groups:
        got = _column(values, "routes[{}].predicted", "i", len(values[0]))
        bad = ~((got >= 0) & (got < m.n_expert)).all(axis=1)
        if not 0 < got.shape[1] <= m.n_expert or bad.any():
            raise ValueError(f"row {rows[idx[int(np.argmax(bad))]]}: route predicted ids "
                             f"out of range")
        _distinct(got, "routes[{}].predicted")
        ranked.update(zip(idx, got.astype(np.int32), strict=True))
    for i in have:
        layer = _int(_get(items[i], "next_layer", f"routes[{i}]."), f"routes[{i}].next_layer")
        if layer not in m.moe_layers:
            raise ValueError(f"row {rows[i]}: a prediction for layer {layer}, not a MoE layer")
        out[i] = (layer, ranked[i])
    return out


@functools.lru_cache(maxsize=8)
def _layer_rows(moe_layers: tuple[int, ...]) -> dict[int, int]:
    return {layer: i for i, layer in enumerate(moe_layers)}


def _prefetch_from_json(items: Any, moe_layers: Sequence[int]
                        ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Inverse of :func:`_prefetch_to_json`: dense per-MoE-layer arrays (raises on a layer
    that is not a MoE layer, a repeated layer, or a count out of range). Every token of a
    PSR session holds one entry per MoE layer, so the checks are plain comparisons; a bad
    entry is described by :func:`_prefetch_entry`."""
    if type(items) is not list:
        raise ValueError("prefetch must be a list of [layer, prefetches, hits]")
    row_of = _layer_rows(tuple(moe_layers))
    n = len(row_of)
    pf, hits = [0] * n, [0] * n
    seen: set[int] = set()
    for i, item in enumerate(items):
        if type(item) is not list or len(item) != 3:
            _prefetch_entry(i, item, row_of, seen)
        layer, a, b = item
        row = row_of.get(layer) if type(layer) is int else None
        if (row is None or layer in seen or type(a) is not int or type(b) is not int
                or not 0 <= a <= _I32 or not 0 <= b <= _I32):
            _prefetch_entry(i, item, row_of, seen)
        seen.add(layer)
        pf[row], hits[row] = a, b
    return np.array(pf, dtype=np.int64), np.array(hits, dtype=np.int64)


_LITERAL = re.compile(rb"[\[,:][ \t\r\n]*(?:true|false)")


def may_hold_literals(text: bytes) -> bool:
    """Whether JSON ``text`` may hold a ``true`` or ``false`` value (one after ``[``,
    ``,`` or ``:``; the word inside a token's text, as in "is it true", is not one unless
    a comma or colon comes before it): :func:`prefetch_rows` is then not used. The words
    are looked for first (a plain substring search, much faster than the pattern's)."""
    if b"true" not in text and b"false" not in text:
        return False
    return _LITERAL.search(text) is not None


def prefetch_rows(metas: Sequence[Mapping[str, Any]], moe_layers: Sequence[int],
                  no_literals: bool) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """Every token's PSR counters (:func:`_prefetch_from_json`) checked at once, as two
    (tokens, MoE layers) arrays, where every token holds them as the recorder writes them
    (a list of [layer, prefetches, hits] of ints, each layer a MoE layer once); None
    otherwise, and each token is then read alone (which names a bad entry). A JSON
    ``true`` would pass numpy's conversion as 1: ``no_literals`` says the tokens' JSON
    holds no ``true`` or ``false`` value (:func:`may_hold_literals`; otherwise None)."""
    if not no_literals or not metas:
        return None
    try:
        lists = [d["prefetch"] for d in metas]
    except KeyError:  # a token without counters (older trace): each read alone
        return None
    if not all(type(x) is list for x in lists):
        return None
    counts = np.fromiter(map(len, lists), dtype=np.int64, count=len(lists))
    flat = [item for x in lists for item in x]
    try:
        a = np.array(flat) if flat else np.zeros((0, 3), np.int64)
    except (ValueError, TypeError, OverflowError):  # ragged or not numbers
        return None
    if a.dtype != np.int64 or a.ndim != 2 or a.shape[1] != 3:
        return None
    row_of = _layer_rows(tuple(moe_layers))
    n = len(row_of)
    lut = np.full(max(moe_layers, default=0) + 2, -1, dtype=np.int64)
    lut[np.fromiter(row_of, dtype=np.int64, count=n)] = np.arange(n)
    layer = a[:, 0]
    inside = (layer >= 0) & (layer < len(lut) - 1)
    row = lut[np.where(inside, layer, len(lut) - 1)]
    token = np.repeat(np.arange(len(lists)), counts)
    if (row < 0).any() or (a[:, 1:] < 0).any() or (a[:, 1:] > _I32).any():
        return None
    cell = token * n + row
    if len(cell) and np.bincount(cell, minlength=len(lists) * n).max() > 1:
        return None  # a layer repeats within a token
    pf = np.zeros(len(lists) * n, dtype=np.int64)
    hits = np.zeros(len(lists) * n, dtype=np.int64)
    pf[cell] = a[:, 1]
    hits[cell] = a[:, 2]
    return pf.reshape(len(lists), n), hits.reshape(len(lists), n)


def _prefetch_entry(i: int, item: Any, row_of: Mapping[int, int], seen: set[int]) -> NoReturn:
    """Raises the reason entry ``i`` of a token's prefetch list is refused."""
    if type(item) is not list or len(item) != 3:
        raise ValueError(f"prefetch entry {_show(item)} is not [layer, prefetches, hits]")
    layer = _int(item[0], f"prefetch[{i}] layer")
    if layer not in row_of or layer in seen:
        raise ValueError(f"prefetch layer {layer} is not a MoE layer, or repeats")
    _int(item[1], f"prefetch[{i}] prefetches", 0, _I32)
    _int(item[2], f"prefetch[{i}] hits", 0, _I32)
    raise ValueError(f"prefetch entry {_show(item)} is refused")


def _changes_from_json(raw: Any, m: TraceModel) -> list[Change]:
    out = []
    for i, item in enumerate(_list(raw, "changes")):
        where = f"changes[{i}]"
        d = _object(item, where)
        kind = _get(d, "kind", f"{where}.")
        if kind == "policy":
            out.append(Change("policy", policy=_policy_from_json(
                _get(d, "policy", f"{where}."), f"{where}.policy")))
        elif kind == "slots":
            slots = _int(_get(d, "slots", f"{where}."), f"{where}.slots")
            out.append(Change("slots", slots=_checked_slots(slots, m,
                                                            "a budget change to {} slots")))
        elif kind == "note":
            out.append(Change("note", text=_text(d.get("text", ""), f"{where}.text")))
        else:
            raise ValueError(f"unknown change kind {_show(kind)}")
    return out




def check_columns(cols: Mapping[str, Any], header: TraceHeader,
                  token_rows: npt.NDArray[np.int64], in_force: npt.NDArray[np.int64]) -> None:
    """Version 2: every row field of the whole trace bounded against the header's model,
    as :func:`_events_from_json` and :func:`_routes_from_json` bound version 1's, but in a
    few numpy calls over whole columns. ``token_rows`` delimits each token's rows and
    ``in_force`` is the most slots in force during each token. Names the first bad row
    (``row N``, counted from the start of the file)."""
    n = int(cols["n"])
    if not n:
        return
    m = header.model
    k, n_expert = m.top_k, m.n_expert
    n_tokens = len(token_rows) - 1
    counts = np.diff(token_rows)
    tok = np.repeat(np.arange(n_tokens, dtype=np.int64), counts)
    bad = cols["token"] != tok
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"row {i}.token {int(cols['token'][i])} is not its batch's token "
                         f"{int(tok[i])}")
    layer = cols["layer"]
    bad = ~np.isin(layer, m.moe_layers)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"row {i}.layer {int(layer[i])} is not a MoE layer of the model")
    step = cols["step"]
    limit = header.initial_step + MAX_STEP_SLACK + np.repeat(token_rows[1:], counts) + tok
    bad = ~((step >= 0) & (step <= limit))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"row {i}.step {int(step[i])} is beyond step {int(limit[i])}, more "
                         f"than the trace's records can reach")
    back = np.diff(step, prepend=header.initial_step) < 0
    if back.any():
        i = int(np.argmax(back))
        raise ValueError(f"row {i}.step {int(step[i])} goes back")
    _within(cols["batch"], "row {}.batch", 0, _I32)
    ids = cols["ids"]
    _within(ids, "row {}.ids", 0, n_expert - 1, f"is not an expert (0..{n_expert - 1})")
    _distinct(ids, "row {}.ids")
    _within(cols["action"], "row {}.action", HIT, SUBSTITUTE,
            f"is not an action (hit {HIT}, fetch {FETCH}, substitute {SUBSTITUTE})")
    _within(cols["used_ids"], "row {}.used_ids", 0, n_expert - 1,
            f"is not an expert (0..{n_expert - 1})")
    slots = cols["slots"]
    # int(): slots are int16 in a stream, and 32767 + 1 overflowed with numpy's warning
    if slots.size and (slots.min() < 0
                       or slots.max() >= in_force.min(initial=int(slots.max()) + 1)):
        row_slots = np.repeat(in_force, counts)  # some token had fewer slots: row by row
        bad = ~((slots >= 0) & (slots < row_slots[:, None]))
    else:
        bad = np.zeros(1, np.bool_)
    if bad.any():
        i, j = _bad_at(bad)
        raise ValueError(f"row {i}.slots[{j}] {int(slots[i, j])} is not a slot "
                         f"(0..{int(row_slots[i]) - 1})")
    _within(cols["substituted_mass"], "row {}.substituted_mass", 0.0, 1.001,
            "is not a substituted weight (0..1)")
    _within(cols["n_admit"], "row {}.n_admit", 0, k)
    _within(cols["n_evict"], "row {}.n_evict", 0, 2 * k)
    for name, count in (("admitted", "n_admit"), ("evicted", "n_evict")):
        values, lengths = cols[name]
        want = np.minimum(cols[count].astype(np.int64), MAX_K)
        bad = lengths != want
        if bad.any():
            i = int(np.argmax(bad))
            raise ValueError(f"row {i}.{name} has {int(lengths[i])} entries, {count} is "
                             f"{int(want[i])}")
        # entries past a row's length are -1 (as columns_of pads them)
        if values.size and (values.max() >= n_expert
                            or np.count_nonzero(values >= 0) != lengths.sum()):
            mask = np.arange(values.shape[1])[None, :] < lengths[:, None]
            i, j = _bad_at(mask & ~((values >= 0) & (values < n_expert)))
            raise ValueError(f"row {i}.{name}[{j}] {int(values[i, j])} is not an expert "
                             f"(0..{n_expert - 1})")
    for name in ("bytes_sync", "bytes_async"):
        _within(cols[name], f"row {{}}.{name}", 0, _MAX_BYTES)
    if "tier" in cols:
        _within(cols["tier"], "row {}.tier", 0, 2, "is not a tier (0 slot, 1 RAM, 2 disk)")
        _within(cols["n_disk"], "row {}.n_disk", 0, n_expert)
        _within(cols["bytes_disk"], "row {}.bytes_disk", 0, _MAX_BYTES)
    exact = cols["probs_valid"]
    gate = cols["gate"]
    if not gate.size or (gate.min() >= 0 and gate.max() <= _FLT_MAX  # NaN fails both
                         and (exact.all() or gate[~exact].max() <= 1)):
        bad = np.zeros(1, np.bool_)
    else:
        bad = ~np.isfinite(gate) | (gate < 0) | (~exact[:, None] & (gate > 1))
    if bad.any():
        i, j = _bad_at(bad)
        raise ValueError(f"row {i}.gate[{j}] {_show(float(gate[i, j]))} is not a gate weight")
    _, lengths = cols["weights"]
    present = cols["weights_valid"]
    bad = present & (lengths != k)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"row {i}.weights has {int(lengths[i])} entries, expected {k}")
    if (~present & ~exact).any():
        i = int(np.argmax(~present & ~exact))
        raise ValueError(f"row {i} has neither router inputs nor normalized weights")
    # the probabilities (cols["probs"], a block per token) are checked where first used:
    # TraceColumns.probs / row_probs
    next_layer = cols["next_layer"]
    pred, plen = cols["predicted"]
    has = next_layer >= 0
    bad = (has & ~np.isin(next_layer, m.moe_layers)) | (next_layer < -1)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"row {i}: a prediction for layer {int(next_layer[i])}, not a MoE "
                         f"layer")
    bad = (has & ((plen < 1) | ~exact)) | (~has & (plen > 0))
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"row {i}: predicted ids without a layer or router inputs, or a "
                         f"layer without ids")
    # a row's entries past its length are -1 (columns_of pads them so): every entry is
    # an expert exactly when as many are 0 or more as the rows hold
    if pred.size and (pred.max() >= n_expert or np.count_nonzero(pred >= 0) != plen.sum()):
        mask = np.arange(pred.shape[1])[None, :] < plen[:, None]
        bad = mask & ~((pred >= 0) & (pred < n_expert))
        i, _ = _bad_at(bad)
        raise ValueError(f"row {i}: route predicted ids out of range")
    if pred.shape[1] > 1 and has.any():
        i = _first_repeat(pred, padded=True)  # past its length a row is padding
        if i >= 0:
            raise ValueError(f"row {i}.predicted names an expert twice")


def normalized_weights(cols: Mapping[str, Any], k: int) -> npt.NDArray[np.float32]:
    """Each row's normalized gate weights: stored, or derived from its raw gate weights
    exactly as the core derives them; checked to be normalized weights (0..1)."""
    from moescope.trace.arrow_format import normalized

    out = normalized(cols["gate"]) if cols["n"] else np.zeros((0, k), np.float32)
    exact = cols["probs_valid"]
    out[~exact] = cols["gate"][~exact]
    stored, _ = cols["weights"]
    present = cols["weights_valid"]
    if present.any():
        out[present] = stored[present][:, :k].astype(np.float32)
    _within(out, "row {}.weights", 0.0, 1.0, "is not a normalized weight (0..1)")
    return out


def check_stored_weights(cols: Mapping[str, Any], k: int) -> None:
    """The normalized weights a version-2 file stores (rows whose weights do not follow
    from their raw gate weights) must be normalized weights (0..1); naming the row.

    The derived ones need no look: :func:`check_columns` bounds a recorded row's raw gate
    weights to finite values of 0 or more (and a row without router inputs, whose gate
    column holds its normalized weights, to 1), and a float32 sum of values of 0 or more
    is at least each of them, so each quotient is in 0..1. They are derived when the
    event rows are laid out (:func:`normalized_weights`), not when the trace is opened."""
    present = cols["weights_valid"] if cols["n"] else np.zeros(0, np.bool_)
    if not present.any():
        return
    stored, _ = cols["weights"]
    rows = np.flatnonzero(present)
    values = stored[rows][:, :k]
    if values.min() >= 0.0 and values.max() <= 1.0:  # NaN fails both
        return
    bad = ~((values >= 0.0) & (values <= 1.0))
    i, j = _bad_at(bad)
    raise ValueError(f"row {int(rows[i])}.weights[{j}] {_show(values[i, j].item())} is not a "
                     f"normalized weight (0..1)")
