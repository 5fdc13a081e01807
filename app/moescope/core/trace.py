"""Session traces: what the expert cache did, token by token, in a file you can replay.

Every number MoEScope shows must be recomputable offline (ARCHITECTURE.md, "Where numbers
come from"), and the router-logit simulator must be able to replay a chat under other
policies and budgets. Both need a record of the session, so this module defines one:

* a **header** line: the model (file name, metadata hash, experts, top-k, bytes one copy
  moves per layer), the budget, slots and policy at the start, software and machine;
* one **token** line per generated token: wall time, phase, the policy or budget changes
  that took effect at that token, the core's event rows for every routed layer, optionally
  the router inputs (full probabilities, raw gate weights, ids) that make a replay exact,
  the engine's copy timings spent on it, PSR's prefetch counters (the core keeps them
  only as cumulative layer stats, with no event row, so without them a reopened trace
  could not show prefetch accuracy), and, only for the MoE layers where the event rows do
  not explain it (a PSR prefetch, a budget shrink), the real resident mask
  (:mod:`moescope.core.residency`), so a reopened trace draws exactly what the live panel
  drew;
* an optional **end** line (a crash simply leaves it out).

The file is JSON Lines, optionally gzip-compressed, and flushed after every token so that a
crash loses at most the token being written; :func:`read_trace` validates every record,
names the line of a bad one, and accepts a truncated last line. :func:`to_perfetto` turns a
trace into Chrome/Perfetto trace-event JSON (open it in ui.perfetto.dev). The schema is
documented in ``docs/trace-format.md`` and versioned by :data:`TRACE_VERSION`.

This module is engine-agnostic on purpose (``core`` may not import ``engine``): the
:class:`TraceRecorder` takes any object shaped like the Engine (:class:`RouteSource`) and
any object shaped like its ``TokenStats`` (:class:`TokenLike`).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import datetime as _dt
import gzip
import json
import os
import platform
import re
import sys
import threading
import zlib
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Literal, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from moescope.core.errors import MoEScopeError
from moescope.core.files import write_atomic
from moescope.core.native import EVENT_DTYPE, FETCH, MAX_K, SUBSTITUTE
from moescope.core.policy import DEFAULT_BONUS, Eviction, MissRule, Policy, SubstituteWeight
from moescope.core.prefetch import PrefetchCounters, prefetch_delta
from moescope.core.residency import Residency, masks_from_json, masks_to_json, read_resident
from moescope.core.totals import CacheTotals

TRACE_FORMAT = "moescope-trace"
TRACE_VERSION = 1
"""Schema version written in the header; readers refuse a newer major version."""

RouterDtype = Literal["f32", "f16"]
PHASES = ("prefill", "decode")
TIMING_KEYS = ("route_us", "sync_copy_us", "async_copy_us", "wait_us", "n_sync", "n_async")

_EVENT_SCALARS = ("step", "layer", "token", "k", "substituted_mass", "n_hit", "n_fetch",
                  "n_substitute", "n_admit", "n_evict", "bytes_sync", "bytes_async")
_EVENT_K_ARRAYS = ("ids", "weights", "action", "used_ids", "slots")


class TraceFormatError(MoEScopeError):
    """A trace file is not a valid MoEScope trace; the message names the line."""


# --------------------------------------------------------------------------- header


@dataclass(frozen=True)
class ModelSummary:
    """The model facts a replay needs (and a reader uses to tell models apart)."""

    file_name: str
    metadata_sha256: str
    architecture: str
    n_layers: int
    moe_layers: tuple[int, ...]
    n_expert: int
    top_k: int
    bytes_per_expert: tuple[int, ...]
    """Bytes one copy of an expert moves, per entry of ``moe_layers`` (the engine's unit:
    the expert's weight matrices, not biases or scales)."""
    non_expert_bytes: int = 0
    name: str | None = None

    def expert_bytes(self, layer: int) -> int:
        """Bytes of one expert of ``layer`` (0 for a dense layer)."""
        try:
            return self.bytes_per_expert[self.moe_layers.index(layer)]
        except ValueError:
            return 0

    @classmethod
    def from_info(cls, info: Any) -> ModelSummary:
        """From a :class:`~moescope.core.gguf_info.ModelInfo`; bytes per expert count only
        the ``*_exps.weight`` tensors, which is what the engine's slots hold and copy."""
        per_layer = []
        for layer in info.moe_layers:
            tensors = info.expert_tensors.get(layer, ())
            weights = sum(t.bytes_per_expert for t in tensors if t.part == "weight")
            per_layer.append(int(weights or info.bytes_per_expert[layer]))
        return cls(
            file_name=str(info.file_name), metadata_sha256=str(info.metadata_sha256),
            architecture=str(info.architecture), n_layers=int(info.n_layers),
            moe_layers=tuple(int(x) for x in info.moe_layers), n_expert=int(info.n_expert),
            top_k=int(info.top_k), bytes_per_expert=tuple(per_layer),
            non_expert_bytes=int(info.non_expert_bytes), name=info.name,
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "file_name": self.file_name, "metadata_sha256": self.metadata_sha256,
            "architecture": self.architecture, "name": self.name, "n_layers": self.n_layers,
            "moe_layers": list(self.moe_layers), "n_expert": self.n_expert,
            "top_k": self.top_k, "bytes_per_expert": list(self.bytes_per_expert),
            "non_expert_bytes": self.non_expert_bytes,
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ModelSummary:
        return cls(
            file_name=str(d["file_name"]), metadata_sha256=str(d["metadata_sha256"]),
            architecture=str(d["architecture"]), n_layers=int(d["n_layers"]),
            moe_layers=tuple(int(x) for x in d["moe_layers"]), n_expert=int(d["n_expert"]),
            top_k=int(d["top_k"]), bytes_per_expert=tuple(int(x) for x in d["bytes_per_expert"]),
            non_expert_bytes=int(d.get("non_expert_bytes") or 0), name=d.get("name"),
        )


@dataclass(frozen=True)
class TraceHeader:
    """The first line of a trace: model, starting cache state, software, machine."""

    model: ModelSummary
    budget: str
    slots_per_layer: int
    policy: Policy
    router_inputs: RouterDtype | None = "f32"
    initial_step: int = 0
    """The core's step when recording began; a replay starts from this step."""
    initial_resident: int = 0
    """Experts resident (all layers) when recording began; 0 means the replay, which starts
    from an empty cache, can be exact."""
    software: Mapping[str, str | None] = field(default_factory=dict)
    machine: Mapping[str, Any] = field(default_factory=dict)
    created: str = ""
    version: int = TRACE_VERSION

    def to_json(self) -> dict[str, Any]:
        return {
            "type": "header", "format": TRACE_FORMAT, "version": self.version,
            "created": self.created, "model": self.model.to_json(), "budget": self.budget,
            "slots_per_layer": self.slots_per_layer, "policy": policy_to_json(self.policy),
            "router_inputs": self.router_inputs,
            "initial_state": {"step": self.initial_step, "resident": self.initial_resident},
            "software": dict(self.software), "machine": dict(self.machine),
        }


def policy_to_json(policy: Policy) -> dict[str, Any]:
    """A policy as readable JSON (enum names, not numbers) that round-trips exactly."""
    return {
        "name": policy.name, "miss_rule": policy.miss_rule.name.lower(),
        "theta": policy.theta, "eviction": policy.eviction.name.lower(),
        "half_life": policy.half_life, "admission": policy.admission, "beta": policy.beta,
        "substitute_weight": policy.substitute_weight.name.lower(),
        "bonus": policy.bonus, "prefetch": policy.prefetch, "theta_disk": policy.theta_disk,
    }


def policy_from_json(d: Mapping[str, Any]) -> Policy:
    """Inverse of :func:`policy_to_json`; ``ValueError``/``KeyError`` on bad input."""
    return Policy(
        miss_rule=MissRule[str(d["miss_rule"]).upper()], theta=float(d["theta"]),
        eviction=Eviction[str(d["eviction"]).upper()], half_life=float(d["half_life"]),
        admission=bool(d["admission"]), beta=float(d["beta"]),
        substitute_weight=SubstituteWeight[str(d["substitute_weight"]).upper()],
        bonus=float(d.get("bonus", DEFAULT_BONUS)), prefetch=int(d.get("prefetch", 0)),
        theta_disk=float(d.get("theta_disk", -1.0)), name=d.get("name"),
    )


def software_versions() -> dict[str, str | None]:
    """moescope, the engine (llama_cpp), the native core, Python and numpy versions.

    llama_cpp is not imported here (that would load the engine library from ``core``):
    its ``__version__`` is read if it is already loaded, else the installed distribution's.
    """
    from moescope import __version__

    out: dict[str, str | None] = {"moescope": __version__, "python": platform.python_version(),
                                  "numpy": np.__version__}
    mod = sys.modules.get("llama_cpp")
    version = getattr(mod, "__version__", None) if mod is not None else None
    if version is None:
        from importlib import metadata

        with contextlib.suppress(metadata.PackageNotFoundError):
            version = metadata.version("llama_cpp_python")
    out["llama_cpp"] = version
    try:
        from moescope.core import native

        out["moecache"] = native.version()
    except Exception:  # the core may be missing on a machine that only reads traces
        out["moecache"] = None
    return out


def machine_info() -> dict[str, Any]:
    """CPU and GPU names, so a trace says where its timings were measured."""
    cpu = platform.processor() or None
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    gpus: list[str] = []
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(i))
                gpus.append(name.decode() if isinstance(name, bytes) else str(name))
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVIDIA driver: an empty list says so
        pass
    return {"cpu": cpu, "gpus": gpus, "os": platform.platform(), "cpu_count": os.cpu_count()}


# --------------------------------------------------------------------------- records


ANSWER_NOW_NOTE = "answer now"
"""The note on the first token of a generation that continues a thinking model's answer
after "Answer now" closed its thoughts: the closing text is written into the prompt, not
generated, so the token texts alone cannot show where that answer began."""


@dataclass(frozen=True)
class Change:
    """A policy or budget change that took effect at a token (applied before its decode)."""

    kind: Literal["policy", "slots", "note"]
    policy: Policy | None = None
    slots: int | None = None
    text: str = ""

    @property
    def label(self) -> str:
        """The short text the live window's markers show for the same change."""
        if self.kind == "policy" and self.policy is not None:
            return f"policy={self.policy.name or 'custom'}"
        if self.kind == "slots":
            return f"slots={self.slots}"
        return self.text

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"kind": self.kind}
        if self.policy is not None:
            out["policy"] = policy_to_json(self.policy)
        if self.slots is not None:
            out["slots"] = self.slots
        if self.text:
            out["text"] = self.text
        return out


@dataclass(frozen=True)
class RouterInput:
    """The exact inputs the core got for one event row: what a replay feeds back."""

    row: int
    probs: npt.NDArray[np.float32]
    weights: npt.NDArray[np.float32]
    """Gate weights as the router produced them (before normalization or any decision)."""
    ids: npt.NDArray[np.int32]
    next_layer: int = -1
    """PSR: the MoE layer this row's prediction is for (-1: none recorded)."""
    predicted: npt.NDArray[np.int32] | None = None
    """PSR: that layer's experts as its router ranked them from this layer's input, best
    first (the first :data:`PREDICTED_KEEP`), which is all ``moecache_prefetch`` uses."""


PREDICTED_KEEP = 32
"""How many ranked predictions a trace keeps per row: a replay prefetches exactly for any
``Policy.prefetch`` up to this (the ``psr`` preset prefetches top-k <= 32)."""


def rank_predictions(scores: npt.ArrayLike, keep: int = PREDICTED_KEEP) -> npt.NDArray[np.int32]:
    """Expert ids by descending score, ties by lower id (the core's order), NaN last.
    ``scores`` may be one layer's row or a [layers, experts] block, ranked row by row in
    one call (a token has a prediction per layer: 48 x 512 scores on Qwen3-Next, and a
    call per layer was a visible share of recording a token)."""
    raw = np.asarray(scores, dtype=np.float32)
    neg = np.atleast_2d(np.where(np.isnan(raw), np.float32(np.inf), -raw))
    n = neg.shape[1]
    if keep >= n:
        ranked = np.argsort(neg, axis=1, kind="stable")[:, :keep]
    else:  # the best `keep` of each row, then only those sorted (ties by lower id)
        part = np.argpartition(neg, keep - 1, axis=1)[:, :keep]
        vals = np.take_along_axis(neg, part, axis=1)
        ranked = np.take_along_axis(part, np.lexsort((part, vals), axis=1), axis=1)
        kth = vals.max(axis=1, keepdims=True)
        tied = (neg == kth).sum(axis=1) != (vals == kth).sum(axis=1)
        if tied.any():  # a tie across the cut: the partition may have kept a higher id
            ranked[tied] = np.argsort(neg[tied], axis=1, kind="stable")[:, :keep]
    ranked = ranked.astype(np.int32)
    return ranked if raw.ndim > 1 else ranked[0]


@dataclass
class TokenRecord:
    """One token of a trace (see the module docstring)."""

    index: int
    phase: str
    token_id: int
    text: str
    seconds: float
    policy: str
    slots_per_layer: int
    events: npt.NDArray[Any]
    routes: dict[int, RouterInput] = field(default_factory=dict)
    changes: list[Change] = field(default_factory=list)
    timings: dict[str, int] | None = None
    answer: int = 0
    position: int = 0
    prefetches: npt.NDArray[np.int64] | None = None
    """PSR: experts ``moecache_prefetch`` brought in during this token, per MoE layer (in
    the order of ``model.moe_layers``), whatever the policy (0 where it does not prefetch).
    None: not recorded (a trace written before these counters): unknown, not zero."""
    prefetch_hits: npt.NDArray[np.int64] | None = None
    """PSR: prefetched experts the router first computed during this token (as a hit or
    a substitute), per MoE layer; None exactly when ``prefetches`` is."""
    resident: dict[int, npt.NDArray[np.bool_]] | None = None
    """The cache's real resident mask after this token (model layer index -> ``n_expert``
    booleans), only for the MoE layers where it differs from what the event rows rebuild
    (:class:`~moescope.core.residency.Residency`): PSR prefetches and budget shrinks
    change residency without rows. None: nothing to correct (or, on a token that shrank
    the budget, a trace written before the masks: its residency is then a guess)."""

    def to_json(self, router_dtype: RouterDtype | None = "f32",
                moe_layers: Sequence[int] | None = None) -> dict[str, Any]:
        """The token record; ``moe_layers`` (the header's) names the layers of the prefetch
        counters, which are written only when known (see :func:`_prefetch_to_json`)."""
        out: dict[str, Any] = {
            "type": "token", "index": self.index, "answer": self.answer,
            "position": self.position, "phase": self.phase, "token_id": self.token_id,
            "text": self.text, "seconds": self.seconds, "policy": self.policy,
            "slots_per_layer": self.slots_per_layer,
        }
        if self.changes:
            out["changes"] = [c.to_json() for c in self.changes]
        if self.timings is not None:
            out["timings"] = {k: int(self.timings.get(k, 0)) for k in TIMING_KEYS}
        if self.prefetches is not None and self.prefetch_hits is not None:
            if moe_layers is None:
                raise ValueError("prefetch counters need the model's MoE layers to be written")
            out["prefetch"] = _prefetch_to_json(self.prefetches, self.prefetch_hits, moe_layers)
        if self.resident is not None:
            out["resident"] = masks_to_json(self.resident)
        out["events"] = _events_to_json(self.events)
        if self.routes and router_dtype is not None:
            routes = list(self.routes.values())
            weights = _f32_lists([r.weights for r in routes])
            out["routes"] = [_route_to_json(r, router_dtype, w)
                             for r, w in zip(routes, weights, strict=True)]
        return out


@dataclass
class Trace:
    """A trace read back: header, complete tokens, the end record if the session closed."""

    header: TraceHeader
    tokens: list[TokenRecord]
    end: dict[str, Any] | None = None
    truncated: bool = False
    """True when the last line was incomplete (the writer was killed mid-token)."""
    path: Path | None = None

    @property
    def total_seconds(self) -> float:
        return float(sum(t.seconds for t in self.tokens))

    def events(self) -> npt.NDArray[Any]:
        """Every event row of the trace, in order, as ``EVENT_DTYPE``."""
        parts = [t.events for t in self.tokens if len(t.events)]
        return np.concatenate(parts) if parts else np.zeros(0, dtype=EVENT_DTYPE)


def _f32_lists(groups: Sequence[npt.ArrayLike]) -> list[list[float]]:
    """Each group as the shortest decimals that round-trip to the same float32 (``0.15`` not
    ``0.1500000059``). All groups are converted in one numpy call: a token has a group per
    layer, and a Python ``str`` per value was most of the cost of writing it."""
    arrays = [np.asarray(g, dtype=np.float32).ravel() for g in groups]
    if not arrays:
        return []
    flat = [float(v) for v in np.concatenate(arrays).astype(str)]
    out, at = [], 0
    for a in arrays:
        out.append(flat[at:at + a.size])
        at += a.size
    return out


def _events_to_json(events: npt.NDArray[Any]) -> list[dict[str, Any]]:
    """A token's event rows, one dict per row; each column is read out of numpy once for
    all rows (a token has a row per MoE layer: 48 on Qwen3-Next)."""
    if not len(events):
        return []
    cols = {name: events[name].tolist() for name in _EVENT_SCALARS}
    ks = cols["k"]
    cols["substituted_mass"] = _f32_lists([events["substituted_mass"]])[0]
    weights = _f32_lists([w[:k] for w, k in zip(events["weights"], ks, strict=True)])
    arrays = {name: events[name].tolist() for name in ("ids", "action", "used_ids", "slots",
                                                        "admitted", "evicted")}
    out = []
    for i, k in enumerate(ks):
        d: dict[str, Any] = {name: cols[name][i] for name in _EVENT_SCALARS}
        d["ids"] = arrays["ids"][i][:k]
        d["weights"] = weights[i]
        d["action"] = arrays["action"][i][:k]
        d["used_ids"] = arrays["used_ids"][i][:k]
        d["slots"] = arrays["slots"][i][:k]
        d["admitted"] = arrays["admitted"][i][:min(cols["n_admit"][i], MAX_K)]
        d["evicted"] = arrays["evicted"][i][:min(cols["n_evict"][i], MAX_K)]
        out.append(d)
    return out


def _event_from_json(d: Mapping[str, Any], out: Any) -> None:
    """Fill one ``EVENT_DTYPE`` row from its JSON form (raises on a malformed row)."""
    for name in _EVENT_SCALARS:
        out[name] = d[name]
    k = int(d["k"])
    if not 0 < k <= MAX_K:
        raise ValueError(f"event k={k} outside 1..{MAX_K}")
    for name in _EVENT_K_ARRAYS:
        values = d[name]
        if len(values) != k:
            raise ValueError(f"event {name} has {len(values)} entries, k is {k}")
        out[name][:k] = values
    for name, count in (("admitted", "n_admit"), ("evicted", "n_evict")):
        values = d.get(name, [])
        if len(values) != min(int(d[count]), MAX_K):
            raise ValueError(f"event {name} has {len(values)} entries, {count} is {d[count]}")
        out[name][: len(values)] = values


def _route_to_json(r: RouterInput, dtype: RouterDtype,
                   weights: list[float]) -> dict[str, Any]:
    """One row's router inputs; ``weights`` are its gate weights as ``_f32_lists`` wrote
    them (converted for all rows of the token at once)."""
    probs = np.asarray(r.probs, dtype=np.float32).astype("<f2" if dtype == "f16" else "<f4")
    out: dict[str, Any] = {
        "row": r.row, "ids": np.asarray(r.ids).tolist(), "weights": weights,
        "probs_dtype": dtype, "probs": base64.b64encode(probs.tobytes()).decode("ascii"),
    }
    if r.predicted is not None and r.next_layer >= 0:
        out["next_layer"] = int(r.next_layer)
        out["predicted"] = np.asarray(r.predicted).tolist()
    return out


def _route_from_json(d: Mapping[str, Any], n_expert: int, n_rows: int) -> RouterInput:
    dtype = {"f32": "<f4", "f16": "<f2"}.get(str(d.get("probs_dtype")))
    if dtype is None:
        raise ValueError(f"unknown probs_dtype {d.get('probs_dtype')!r}")
    probs = np.frombuffer(base64.b64decode(d["probs"], validate=True), dtype=dtype)
    if probs.size != n_expert:
        raise ValueError(f"route probs have {probs.size} entries, the model has {n_expert}")
    row = int(d["row"])
    if not 0 <= row < n_rows:
        raise ValueError(f"route row {row} is not an event row of this token")
    ids = np.asarray(d["ids"], dtype=np.int32)
    weights = np.asarray(d["weights"], dtype=np.float32)
    if ids.shape != weights.shape:
        raise ValueError("route ids and weights differ in length")
    predicted, next_layer = None, -1
    if "predicted" in d:
        predicted = np.asarray(d["predicted"], dtype=np.int32)
        if predicted.ndim != 1 or ((predicted < 0) | (predicted >= n_expert)).any():
            raise ValueError("route predicted ids out of range")
        next_layer = int(d["next_layer"])
    return RouterInput(row=row, probs=probs.astype(np.float32), weights=weights, ids=ids,
                       next_layer=next_layer, predicted=predicted)


def _prefetch_to_json(prefetches: npt.ArrayLike, hits: npt.ArrayLike,
                      moe_layers: Sequence[int]) -> list[list[int]]:
    """``[[layer, prefetches, hits], ...]`` for the MoE layers with a nonzero count, in layer
    order; ``[]`` when nothing was prefetched or hit. Sparse because most tokens of most
    sessions prefetch nothing (every policy but PSR), and a present empty list still says
    "recorded: zero", unlike an absent field ("unknown")."""
    pf = np.asarray(prefetches, dtype=np.int64).ravel()
    h = np.asarray(hits, dtype=np.int64).ravel()
    if not len(pf) == len(h) == len(moe_layers):
        raise ValueError(f"prefetch counters have {len(pf)}/{len(h)} entries for "
                         f"{len(moe_layers)} MoE layers")
    return [[int(layer), int(a), int(b)]
            for layer, a, b in zip(moe_layers, pf, h, strict=True) if a or b]


def _prefetch_from_json(items: Any, moe_layers: Sequence[int]
                        ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Inverse of :func:`_prefetch_to_json`: dense per-MoE-layer arrays (raises on a layer
    that is not a MoE layer, a repeated layer, or a negative count)."""
    if not isinstance(items, list):
        raise ValueError("prefetch must be a list of [layer, prefetches, hits]")
    row_of = {layer: i for i, layer in enumerate(moe_layers)}
    pf = np.zeros(len(moe_layers), dtype=np.int64)
    hits = np.zeros(len(moe_layers), dtype=np.int64)
    seen: set[int] = set()
    for item in items:
        if not isinstance(item, list) or len(item) != 3:
            raise ValueError(f"prefetch entry {item!r} is not [layer, prefetches, hits]")
        layer, a, b = (int(x) for x in item)
        if layer not in row_of or layer in seen:
            raise ValueError(f"prefetch layer {layer} is not a MoE layer, or repeats")
        if a < 0 or b < 0:
            raise ValueError(f"prefetch counts of layer {layer} must be >= 0")
        seen.add(layer)
        pf[row_of[layer]], hits[row_of[layer]] = a, b
    return pf, hits


# --------------------------------------------------------------------------- writing


class TraceWriter:
    """Streams records to a ``.jsonl`` (or ``.jsonl.gz``) file, flushing after each.

    A gzip stream is sync-flushed after every record, so everything written so far is
    decodable even if the process dies. ``fsync=True`` also survives a power cut, at the
    cost of a disk sync per token.
    """

    def __init__(self, path: str | os.PathLike[str], header: TraceHeader, *,
                 compress: bool | None = None, fsync: bool = False) -> None:
        self.path = Path(path)
        self.header = header
        self._fsync = fsync
        self._raw: IO[bytes] = open(self.path, "wb")  # noqa: SIM115 - closed in close()
        gz = self.path.suffix == ".gz" if compress is None else compress
        self._gz = gzip.GzipFile(fileobj=self._raw, mode="wb", mtime=0) if gz else None
        self.n_tokens = 0
        self.bytes_written = 0
        """Bytes in the file so far (compressed, for a gzip stream): what the disk holds."""
        self._write(header.to_json())

    def _write(self, obj: Mapping[str, Any]) -> None:
        data = (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()
        if self._gz is not None:
            self._gz.write(data)
            self._gz.flush(zlib.Z_SYNC_FLUSH)
        else:
            self._raw.write(data)
        self._raw.flush()
        self.bytes_written = (self._raw.tell() if self._gz is not None
                              else self.bytes_written + len(data))
        if self._fsync:
            os.fsync(self._raw.fileno())

    def write_token(self, record: TokenRecord) -> None:
        """Append one token (written and flushed before this returns)."""
        self._write(record.to_json(self.header.router_inputs, self.header.model.moe_layers))
        self.n_tokens += 1

    def close(self, **end: Any) -> None:
        """Write the end record (``end`` adds fields, e.g. ``stop_reason``) and close."""
        if self._raw.closed:
            return
        try:
            self._write({"type": "end", "tokens": self.n_tokens, **end})
        finally:  # a full disk fails the end record: the file is closed all the same
            try:
                if self._gz is not None:
                    self._gz.close()
            finally:
                self._raw.close()

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@runtime_checkable
class TokenLike(Protocol):
    """What the recorder reads from one generated token (the engine's ``TokenStats``)."""

    index: int
    token_id: int
    text: str
    seconds: float
    policy: str
    slots_per_layer: int
    events: npt.NDArray[Any]


class RouteSource(Protocol):
    """What the recorder reads from the engine: policy, slots, router inputs, timings.

    ``changes`` (a list of ``(step, [text])``) and ``cache`` (with ``step`` and
    ``resident(layer)``, or the faster ``resident_masks(layers)``) are read too when
    present.
    """

    @property
    def policy(self) -> Policy: ...

    @property
    def slots_per_layer(self) -> int: ...

    def last_route(self, layer: int) -> tuple[Any, Any, Any] | None: ...

    def timings(self) -> dict[str, int]: ...


_SLOTS_CHANGE = re.compile(r"^slots=(\d+)$")


class TraceRecorder:
    """Turns the engine's per-token output into trace records, written as they come.

    Feed it every ``TokenStats`` the engine yields, with the engine as ``source``::

        recorder = TraceRecorder.for_engine("chat.jsonl.gz", engine)
        for stats in engine.generate(prompt):
            recorder.record(stats, engine)
        recorder.close(stop_reason=engine.last_answer.stop_reason)

    For each token it reads the router inputs of every layer that token routed
    (``last_route``), the change of the engine's copy timings, the change of the core's
    prefetch counters (``cache.layer_stats``: PSR writes no event row, so this is the only
    record of it), and the policy or budget changes made since the previous token.

    It also rebuilds residency from the event rows as it goes, exactly as a reader will
    (:class:`~moescope.core.residency.Residency`), reads the cache's real resident masks
    after each token (``cache.resident_masks``, else per layer) and writes the real mask
    of every MoE layer where the two differ (PSR prefetches and budget shrinks evict and
    admit without rows). A session whose rows explain everything gets no such field. Start
    it right after the model is loaded: a replay starts from an empty cache, so only then
    is it exact (the header says so).

    Reading the engine happens in :meth:`record`, on the engine's thread, because the next
    token changes what it reads; turning the record into JSON and writing it (most of the
    cost: 3-4 ms a token with 48 layers of router inputs) happens on a writer thread while
    the engine decodes the next token. At most one token is in flight: :meth:`record`
    first waits for the previous one to be on disk, so a crash still loses at most the
    last token. A write that failed (a full disk) raises from the next :meth:`record`,
    :meth:`flush` or :meth:`close`.
    """

    def __init__(self, path: str | os.PathLike[str], header: TraceHeader, *,
                 source: RouteSource | None = None, compress: bool | None = None,
                 fsync: bool = False) -> None:
        self.header = header
        self.writer = TraceWriter(path, header, compress=compress, fsync=fsync)
        self._policy = header.policy
        self._slots = header.slots_per_layer
        self._index = 0
        self._answer = -1
        self._last_position = -1
        self._timings = _timings_of(source)
        self._dropped = _dropped_of(source)
        self._prefetch: PrefetchCounters | None = None
        self._prefetch_base: npt.NDArray[np.int64] | None = None
        self._prefetch_counts(source)  # the baseline: what was counted before recording
        changes = getattr(source, "changes", None)
        self._n_changes = len(changes) if changes is not None else 0
        self._notes: list[str] = []
        m = header.model
        self._residency = Residency(m.moe_layers, m.n_expert, header.slots_per_layer)
        self.route_mismatches = 0
        """Rows whose ``last_route`` ids disagreed with the event (left without inputs)."""
        self._background = _BackgroundWriter(self.writer)
        self._closed = False

    @classmethod
    def for_engine(cls, path: str | os.PathLike[str], engine: Any, *,
                   router_inputs: RouterDtype | None = "f32", compress: bool | None = None,
                   fsync: bool = False) -> TraceRecorder:
        """A recorder whose header describes ``engine``'s loaded model, budget and policy."""
        return cls(path, header_for(engine, router_inputs=router_inputs), source=engine,
                   compress=compress, fsync=fsync)

    @property
    def path(self) -> Path:
        return self.writer.path

    @property
    def bytes_written(self) -> int:
        """The file's size so far, at most one token behind (the writer thread's token
        is not in it yet): what a caller compares with a size limit after :meth:`record`."""
        return self.writer.bytes_written

    def add_note(self, text: str) -> None:
        """Attach a note to the next recorded token (e.g. :data:`ANSWER_NOW_NOTE`)."""
        self._notes.append(text)

    def record(self, stats: TokenLike, source: RouteSource | None = None) -> TokenRecord:
        """Write one token; ``source`` supplies router inputs, timings and changes."""
        if stats.index <= self._last_position:
            self._answer += 1
        elif self._answer < 0:
            self._answer = 0
        self._last_position = stats.index
        events = np.asarray(stats.events)
        if events.dtype != EVENT_DTYPE:
            events = np.zeros(0, dtype=EVENT_DTYPE)
        record = TokenRecord(
            index=self._index, answer=self._answer, position=int(stats.index),
            phase="prefill" if stats.index == 0 else "decode", token_id=int(stats.token_id),
            text=str(stats.text), seconds=float(stats.seconds), policy=str(stats.policy),
            slots_per_layer=int(stats.slots_per_layer), events=events.copy(),
            changes=[*self._changes(source, stats),
                     *(Change("note", text=text) for text in self._notes)],
        )
        self._notes.clear()
        if source is not None:
            if self.header.router_inputs is not None:
                record.routes = self._routes(source, events)
            now = _timings_of(source)
            if now is not None:
                before = self._timings or dict.fromkeys(TIMING_KEYS, 0)
                record.timings = {k: int(now.get(k, 0)) - int(before.get(k, 0))
                                  for k in TIMING_KEYS}
                self._timings = now
            counts = self._prefetch_counts(source)
            if counts is not None:
                record.prefetches, record.prefetch_hits = counts[0], counts[1]
        record.resident = self._resident_masks(record, source)
        self._background.put(record)
        self._index += 1
        return record

    def flush(self) -> None:
        """Wait until every recorded token is on disk (raises if writing failed)."""
        self._background.flush()

    def _prefetch_counts(self, source: Any) -> npt.NDArray[np.int64] | None:
        """PSR counters since the previous reading, per MoE layer (rows: prefetches, hits),
        or None when ``source`` has no cache to read. Counted for every token whatever the
        policy, so a replay can be compared token by token; views show them only for tokens
        whose policy prefetches, as the live panel does."""
        cache = getattr(source, "cache", None) if source is not None else None
        if cache is None or not hasattr(cache, "layer_stats"):
            return None
        if self._prefetch is None or self._prefetch.cache is not cache:
            self._prefetch = PrefetchCounters(cache, self.header.model.moe_layers)
            self._prefetch_base = None
        totals = self._prefetch.read()
        counts = prefetch_delta(totals, self._prefetch_base)
        self._prefetch_base = totals
        return counts

    def _resident_masks(self, record: TokenRecord, source: RouteSource | None
                        ) -> dict[int, npt.NDArray[np.bool_]] | None:
        """The real masks of the layers the rows do not explain, or None (nothing to write).

        Advances the rebuilt residency as a reader will, then compares it with the cache.
        A token that shrank the budget always gets the field (``{}`` if the guess was right)
        so that a reader can tell it from a trace written before the masks, whose shrink
        it must call approximate. Without a cache to read, None: unknown, as before.
        """
        shrunk = self._residency.advance_token(record)
        cache = getattr(source, "cache", None) if source is not None else None
        if cache is None:
            return None
        m = self.header.model
        masks = self._residency.differing(read_resident(cache, m.moe_layers, m.n_expert))
        if not masks and not shrunk:
            return None
        self._residency.apply_masks(masks)
        return masks

    def _changes(self, source: RouteSource | None, stats: TokenLike) -> list[Change]:
        """Changes applied since the previous token: budget resizes in the order the engine
        made them, and the policy now in force if it differs from the last one recorded."""
        out: list[Change] = []
        changes = getattr(source, "changes", None) if source is not None else None
        if changes is not None:
            for _step, items in list(changes)[self._n_changes:]:
                for text in items:
                    m = _SLOTS_CHANGE.match(text)
                    if m:
                        out.append(Change("slots", slots=int(m.group(1))))
                    elif not text.startswith("policy="):
                        out.append(Change("note", text=text))
            self._n_changes = len(changes)
        dropped = _dropped_of(source)
        if dropped > self._dropped:  # the ring overflowed: a replay cannot be exact
            out.append(Change("note", text=f"{dropped - self._dropped} event rows dropped"))
            self._dropped = dropped
        slots = int(stats.slots_per_layer)
        last = self._slots
        for c in out:
            if c.kind == "slots" and c.slots is not None:
                last = c.slots
        if last != slots:  # resized without an entry in ``changes`` (a direct set_budget)
            out.append(Change("slots", slots=slots))
        self._slots = slots
        policy = source.policy if source is not None else None
        if policy is not None and (policy != self._policy or policy.name != self._policy.name):
            out.insert(0, Change("policy", policy=policy))
            self._policy = policy
        return out

    def _routes(self, source: RouteSource, events: npt.NDArray[Any]) -> dict[int, RouterInput]:
        """Router inputs of the last row of every layer this token routed: that is what
        ``last_route`` still holds (earlier rows of a batched ubatch have none)."""
        last_row: dict[int, int] = {}
        for i, layer in enumerate(events["layer"].tolist()):
            last_row[int(layer)] = i
        out: dict[int, RouterInput] = {}
        last_route = getattr(source, "last_route", None)
        last_prediction = getattr(source, "last_prediction", None)
        if last_route is None:
            return {}
        predictions: dict[int, tuple[int, npt.NDArray[np.float32]]] = {}
        for layer, i in sorted(last_row.items(), key=lambda kv: kv[1]):
            got = last_route(layer)
            if got is None:
                continue
            probs, weights, ids = (np.array(a, copy=True) for a in got)
            k = int(events[i]["k"])
            if not np.array_equal(np.asarray(ids[:k]), events[i]["ids"][:k]):
                self.route_mismatches += 1
                continue
            prediction = last_prediction(layer) if last_prediction is not None else None
            if prediction:
                predictions[i] = prediction
            out[i] = RouterInput(row=i, probs=probs.astype(np.float32),
                                 weights=weights.astype(np.float32), ids=ids.astype(np.int32))
        if predictions:  # ranked together: one sort call for every layer of the token
            rows = list(predictions)
            ranked = rank_predictions(np.stack([predictions[i][1] for i in rows]))
            for i, order in zip(rows, ranked, strict=True):
                out[i] = dataclasses.replace(out[i], next_layer=predictions[i][0],
                                             predicted=order)
        return out

    def close(self, **end: Any) -> None:
        """Write the last token and the end record and close the file; the file is closed
        even when writing failed (then the error is raised, once: closing again does
        nothing)."""
        if self._closed:
            return
        self._closed = True
        try:
            self._background.close()
        finally:
            self.writer.close(**end)

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _BackgroundWriter:
    """Writes a recorder's tokens on one thread, at most one token behind the caller."""

    def __init__(self, writer: TraceWriter) -> None:
        self._writer = writer
        self._cv = threading.Condition()
        self._pending: TokenRecord | None = None
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, name="moescope-trace-writer",
                                        daemon=True)
        self._thread.start()

    def put(self, record: TokenRecord) -> None:
        with self._cv:
            self._wait_idle()
            if self._closing:
                raise ValueError("the trace recorder is closed")
            self._pending = record
            self._cv.notify_all()

    def flush(self) -> None:
        with self._cv:
            self._wait_idle()

    def close(self) -> None:
        with self._cv:
            if self._closing:
                return
            self._closing = True
            self._cv.notify_all()
        self._thread.join()
        with self._cv:
            self._raise()

    def _wait_idle(self) -> None:
        while self._pending is not None and self._error is None:
            self._cv.wait()
        self._raise()

    def _raise(self) -> None:
        """The write that failed, raised again on every later call: nothing more is
        written after it (the thread has ended), and the caller stops recording."""
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            with self._cv:
                while self._pending is None and not self._closing:
                    self._cv.wait()
                record = self._pending
                if record is None:
                    return
            try:
                self._writer.write_token(record)
            except BaseException as err:  # any failure ends writing; the caller hears of it
                with self._cv:
                    self._error, self._pending = err, None
                    self._cv.notify_all()
                return
            with self._cv:
                self._pending = None
                self._cv.notify_all()


def _dropped_of(source: Any) -> int:
    cache = getattr(source, "cache", None)
    return int(getattr(cache, "events_dropped", 0) or 0) if cache is not None else 0


def _timings_of(source: Any) -> dict[str, int] | None:
    fn = getattr(source, "timings", None)
    if fn is None:
        return None
    try:
        return dict(fn())
    except MoEScopeError:
        return None


def header_for(engine: Any, *, router_inputs: RouterDtype | None = "f32",
               budget: str | None = None) -> TraceHeader:
    """The header describing ``engine`` now (model, budget, slots, policy, cache state).

    Duck-typed on the Engine: ``model.info`` (ModelInfo), ``model.plan`` (BudgetPlan),
    ``policy``, ``slots_per_layer`` and ``cache`` (``step``, ``resident(layer)``).
    """
    model = getattr(engine, "model", None)
    info = getattr(model, "info", None)
    if info is None:
        raise MoEScopeError("tracing needs a loaded MoE model with the expert cache on")
    plan = getattr(model, "plan", None)
    cache = getattr(engine, "cache", None)
    if cache is None:
        raise MoEScopeError("tracing needs the expert cache on (it records its decisions)")
    step = int(cache.step)
    resident = sum(len(cache.resident(il)) for il in info.moe_layers)
    return TraceHeader(
        model=ModelSummary.from_info(info),
        budget=budget or (plan.budget.text if plan is not None else ""),
        slots_per_layer=int(engine.slots_per_layer), policy=engine.policy,
        router_inputs=router_inputs, initial_step=step, initial_resident=resident,
        software=software_versions(), machine=machine_info(),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )


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


# --------------------------------------------------------------------------- Perfetto

_PID = 1
_TID_TOKENS, _TID_LAYERS, _TID_SYNC, _TID_ASYNC, _TID_WAIT = 1, 2, 3, 4, 5


def to_perfetto(trace: Trace) -> dict[str, Any]:
    """The trace as Chrome/Perfetto trace-event JSON (``{"traceEvents": [...]}``).

    One complete slice (``ph: "X"``) per token, laid end to end so that the slices' sum
    is the recorded wall time; an instant per fetch and per substitution, spread over the
    token's slice in layer order (rows carry no timestamps of their own); and the engine's
    measured copy time per token as slices on their own tracks (sync copies, background
    copies, waits), starting at the token's start. Times are in microseconds.
    """
    h = trace.header
    ev: list[dict[str, Any]] = [
        _meta("process_name", 0, {"name": f"MoEScope {h.model.file_name}"}),
        _meta("thread_name", _TID_TOKENS, {"name": "tokens"}),
        _meta("thread_name", _TID_LAYERS, {"name": "fetch / substitute"}),
        _meta("thread_name", _TID_SYNC, {"name": "sync copies (measured)"}),
        _meta("thread_name", _TID_ASYNC, {"name": "background copies (measured)"}),
        _meta("thread_name", _TID_WAIT, {"name": "waits for background copies"}),
    ]
    t = 0.0
    for tok in trace.tokens:
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
    return {
        "traceEvents": ev, "displayTimeUnit": "ms",
        "otherData": {"moescope_trace_version": h.version, "model": h.model.file_name,
                      "policy": h.policy.name, "budget": h.budget,
                      "slots_per_layer": h.slots_per_layer},
    }


def _meta(name: str, tid: int, args: dict[str, Any]) -> dict[str, Any]:
    return {"name": name, "ph": "M", "pid": _PID, "tid": tid, "args": args}


def write_perfetto(trace: Trace, path: str | os.PathLike[str]) -> Path:
    """Write :func:`to_perfetto` to ``path`` (a ``.json`` file ui.perfetto.dev opens)."""
    return write_atomic(path, json.dumps(to_perfetto(trace), ensure_ascii=False))


__all__ = [
    "TRACE_FORMAT", "TRACE_VERSION", "Change", "ModelSummary", "RouteSource", "RouterInput",
    "TokenLike", "TokenRecord", "Trace", "TraceFormatError", "TraceHeader", "TraceRecorder",
    "TraceWriter", "header_for", "machine_info", "policy_from_json", "policy_to_json",
    "read_trace", "software_versions", "to_perfetto", "write_perfetto",
]
