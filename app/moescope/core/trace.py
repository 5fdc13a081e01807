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
from moescope.core.files import open_stream, write_atomic
from moescope.core.native import EVENT_DTYPE, FETCH, HIT, MAX_K, SUBSTITUTE
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
        self._raw: IO[bytes] = open_stream(self.path)  # closed in close(); files.py's rules
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
        recorder.end_answer(engine)  # the step that chose EOS, which generate() holds back
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
        self._last_end: Any = None  # the end step end_answer recorded last
        self._source: Any = None  # the latest source: close() records its answer's end
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
        if source is not None:
            self._source = source
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

    def end_answer(self, source: Any) -> TokenRecord | None:
        """The answer is over: record the step that chose its end-of-generation token, if
        it ended on one, then wait until every token is on disk (raises if writing failed).

        That step (``source.last_answer.end_step``) is decoded and governed like any
        token, but the engine does not yield it; without it the trace lacks a step, and a
        replay of the turns after it decides differently. Call this after every
        ``generate`` loop, before the next one and before reading the engine otherwise:
        the router inputs, timings and masks read for the step are the engine's latest.
        Calling it twice for the same answer records the step once."""
        record = self._record_end(source)
        self._background.flush()
        return record

    def _record_end(self, source: Any) -> TokenRecord | None:
        end = getattr(getattr(source, "last_answer", None), "end_step", None)
        if end is None or end is self._last_end:
            return None
        self._last_end = end
        return self.record(end, source)

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
            try:
                if self._source is not None and getattr(self._source, "loaded", True):
                    self._record_end(self._source)  # a caller that did not call end_answer
            finally:
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

MAX_LINE_BYTES = 64 << 20
"""The longest record read: a token of a 48-layer, 512-expert model with f32 router inputs
is about 0.2 MB, so this leaves room for batched rows, and a file that is one endless line
(or a small gzip that inflates to one) ends after a fraction of a second."""
MAX_BLANK_LINES = 1024
"""The writer writes no blank line; a few from hand editing are forgiven, a gigabyte of
them (a small gzip that inflates to newlines) ends the read at once."""
MAX_UNKNOWN_RECORDS = 1024
"""Records of an unknown type (a newer minor version's) are skipped, up to this many plus
four per token: a file made of them is not a trace, and would take minutes to skip."""
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
_I64 = (1 << 63) - 1
_FLT_MAX = 3.4028234663852886e38
_REQUIRED: Any = object()


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number a trace can hold")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
"""Strict JSON: ``NaN`` and ``Infinity`` are refused while parsing (an out-of-range number
such as ``1e999`` parses to infinity and is refused by the field's bounds). Integers are not
hooked (a Python call per integer doubled the parse time): each field bounds its own."""


class _LineReader:
    """Reads a trace's lines as they come (a long session's trace is gigabytes: never all
    in memory at once), plain or gzip, and tells a gzip stream that was cut off (a crash:
    everything sync-flushed before it is still complete) from one that is corrupt."""

    def __init__(self, path: Path, progress: ReadProgress | None) -> None:
        self.path = path
        self.progress = progress
        self.raw: IO[bytes] | None = None
        self.stream: IO[bytes] | None = None
        self.size = 0
        self.n = 0

    def lines(self) -> Iterator[tuple[int, bytes, bool]]:
        """(line number, raw line, ended with newline) for every line. A gzip stream cut
        off ends the lines with ``(n, b"", False)``; a corrupt one (bad data or CRC,
        garbage after it) raises :class:`TraceFormatError`, so it is never mistaken for a
        session that was cut off. ``progress`` hears of the bytes read (compressed bytes of
        a gzip file) after every line."""
        with open(self.path, "rb") as raw:
            self.raw = raw
            self.size = os.fstat(raw.fileno()).st_size
            gz = raw.read(2) == b"\x1f\x8b"
            raw.seek(0)
            self.stream = gzip.GzipFile(fileobj=raw, mode="rb") if gz else raw
            while True:
                line = self._next_line()
                if line is None:
                    yield self.n + 1, b"", False
                    return
                if not line:
                    return
                self.n += 1
                if len(line) > MAX_LINE_BYTES:
                    raise TraceFormatError(f"{self.path.name}: line {self.n} is longer than "
                                           f"{MAX_LINE_BYTES >> 20} MiB: not a MoEScope trace")
                if not line.endswith(b"\n"):  # the last line: is it cut off, or corrupt?
                    after = self._next_line()  # raises for a corrupt stream
                    yield self.n, line, False
                    if after is None:
                        yield self.n + 1, b"", False
                    return
                yield self.n, line, True
                if self.progress is not None and not self.progress(raw.tell(), self.size):
                    raise TraceReadCancelled(f"{self.path.name}: reading the trace was "
                                             f"cancelled")

    def _next_line(self) -> bytes | None:
        """The next line (``b""`` at the end), or None where the stream was cut off."""
        assert self.stream is not None
        try:
            return self.stream.readline(MAX_LINE_BYTES + 1)
        except EOFError:  # ends inside a deflate block or the trailer: cut off
            return None
        except (zlib.error, gzip.BadGzipFile) as err:
            raise TraceFormatError(f"{self.path.name}: corrupt gzip stream at line "
                                   f"{self.n + 1} ({self._where()}: {err})") from None

    def _where(self) -> str:
        return f"compressed byte {self.raw.tell() if self.raw else 0} of {self.size}"

    def damage(self, budget: int = MAX_LINE_BYTES) -> str | None:
        """Why the rest of a gzip stream is corrupt, or None (intact as far as ``budget``
        decompressed bytes, cut off, or not gzip): a record that does not parse in a gzip
        file is most often corruption, which the stream's CRC tells for certain."""
        if self.stream is None or self.stream is self.raw or self.raw is None \
                or self.raw.closed:
            return None
        read = 0
        try:
            while read < budget:
                chunk = self.stream.read(1 << 20)
                if not chunk:
                    return None
                read += len(chunk)
        except EOFError:
            return None
        except (zlib.error, gzip.BadGzipFile) as err:
            return f"{self._where()}: {err}"
        return None


def read_trace(path: str | os.PathLike[str], progress: ReadProgress | None = None) -> Trace:
    """Read and validate a trace (plain or gzip JSON Lines).

    A malformed record raises :class:`TraceFormatError` naming its line and field; a last
    line without its newline (a writer killed mid-token) is dropped and flagged
    ``truncated``. Every count, size, id and step is checked against the header's model
    before anything is sized or looped by it (see ``docs/trace-format.md``).
    ``progress(bytes_read, file_bytes)`` is called after every record; returning False
    raises :class:`TraceReadCancelled`.
    """
    p = Path(path)
    header: TraceHeader | None = None
    tokens: list[TokenRecord] = []
    end: dict[str, Any] | None = None
    truncated = False
    blank = unknown = 0
    state: _ReadState | None = None
    reader = _LineReader(p, progress)
    lines = reader.lines()
    n = 0

    def refuse(message: str) -> TraceFormatError:
        """The error for line ``n``, unless the gzip stream it came from is corrupt: a
        flipped byte most often makes a line that does not parse, and the stream's CRC
        says why."""
        damage = reader.damage()
        if damage is not None:
            return TraceFormatError(f"{p.name}: corrupt gzip stream at line {n} (the line "
                                    f"does not read back; {damage})")
        return TraceFormatError(message)

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
            blank += 1
            if blank > MAX_BLANK_LINES:
                raise refuse(f"{p.name}: line {n}: more than {MAX_BLANK_LINES} blank "
                             f"lines, not a MoEScope trace")
            continue
        try:
            obj = _DECODER.decode(raw.decode("utf-8"))
            if not isinstance(obj, dict):
                raise ValueError("a record must be a JSON object")
        except (ValueError, RecursionError) as err:
            if not complete and header is not None:  # only the last line can lack its \n
                truncated = True  # the writer died while writing this line
                break
            what = ("nested deeper than any record" if isinstance(err, RecursionError)
                    else str(err))
            raise refuse(f"{p.name}: line {n}: not valid JSON ({what})") from None
        kind = obj.get("type")
        try:
            if header is None:
                if kind != "header":
                    raise ValueError("the first record must be the header")
                header = _header_from_json(obj)
                state = _ReadState(header)
            elif type(kind) is not str:
                raise ValueError(f"type is {_show(kind)}, not a record type")
            elif kind == "token":
                assert state is not None
                tokens.append(_token_from_json(obj, header, len(tokens), state))
            elif kind == "end":
                end = {k: v for k, v in obj.items() if _is_scalar(v)}
            elif kind == "header":
                raise ValueError("a second header")
            else:  # written by a newer minor version: skipped, within reason
                unknown += 1
                if unknown > MAX_UNKNOWN_RECORDS + 4 * len(tokens):
                    raise ValueError(f"more than {unknown - 1} records of unknown types")
        except TraceFormatError as err:
            raise refuse(f"{p.name}: line {n}: {err}") from None
        except (KeyError, TypeError, ValueError, IndexError) as err:
            what = f"missing field {err}" if isinstance(err, KeyError) else str(err)
            shown = f"{kind} record" if isinstance(kind, str) and len(kind) < 20 else "record"
            raise refuse(f"{p.name}: line {n}: bad {shown}: {what}") from None
    if n == 0:
        raise TraceFormatError(f"{p.name}: empty file, not a MoEScope trace")
    if header is None:
        raise TraceFormatError(f"{p.name}: no header record")
    return Trace(header=header, tokens=tokens, end=end, truncated=truncated, path=p)


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
    if not a.size:
        return
    bad = ~((a >= lo) & (a <= hi))
    if bad.any():
        at = _bad_at(bad)
        raise ValueError(f"{_label(name, at)} {_show(a[at].item())} "
                         f"{what or f'is outside {_range(lo, hi)}'}")


def _distinct(ids: npt.NDArray[Any], name: str) -> None:
    """No row of ``ids`` names an expert twice (the core refuses such a selection)."""
    if ids.shape[1] < 2:
        return
    s = np.sort(ids, axis=1)
    dup = s[:, 1:] == s[:, :-1]
    if dup.any():
        i, j = _bad_at(dup)
        raise ValueError(f"{name.format(i)} names expert {int(s[i, j])} twice")


# --- records


def _model_from_json(raw: Any) -> ModelSummary:
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
    return ModelSummary(
        file_name=_text(_get(d, "file_name", "model."), "model.file_name"),
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


def _header_from_json(d: Mapping[str, Any]) -> TraceHeader:
    if d.get("format") != TRACE_FORMAT:
        raise ValueError(f"format is {_show(d.get('format'))}, expected {TRACE_FORMAT!r}")
    version = _int(_get(d, "version"), "version")
    if version > TRACE_VERSION or version < 1:
        raise TraceFormatError(f"trace version {version} is not supported (this MoEScope "
                               f"reads version {TRACE_VERSION}); update MoEScope")
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
    try:
        policy = Policy(
            miss_rule=enum(MissRule, "miss_rule"), theta=number("theta"),
            eviction=enum(Eviction, "eviction"), half_life=number("half_life"),
            admission=bool(admission), beta=number("beta"),
            substitute_weight=enum(SubstituteWeight, "substitute_weight"),
            bonus=number("bonus", DEFAULT_BONUS),
            prefetch=_int(d.get("prefetch", 0), f"{where}.prefetch", -1, _I32),
            theta_disk=number("theta_disk", -1.0),
            name=_text(d.get("name"), f"{where}.name", optional=True),
        )
    except ValueError as err:  # Policy's own ranges: what the core keeps meaningful
        if str(err).startswith(where):
            raise
        raise ValueError(f"{where}: {err}") from None
    return policy


def _token_from_json(d: Mapping[str, Any], header: TraceHeader, expected: int,
                     state: _ReadState) -> TokenRecord:
    index = _int(_get(d, "index"), "index")
    if index != expected:
        raise ValueError(f"token index {index}, expected {expected}")
    phase = _text(_get(d, "phase"), "phase")
    if phase not in PHASES:
        raise ValueError(f"phase {_show(phase)} is not one of {', '.join(PHASES)}")
    seconds = _number(_get(d, "seconds"), "seconds", 0.0, 1e9)
    m = header.model
    changes = _changes_from_json(d.get("changes", []), m)
    slots = _checked_slots(_int(_get(d, "slots_per_layer"), "slots_per_layer"), m,
                           "slots_per_layer {}")
    # a resize applies before the token's rows: a row's slot is below the largest in force
    in_force = max([state.slots, slots, *(c.slots for c in changes if c.slots is not None)])
    events = _events_from_json(_get(d, "events"), m, state, expected, in_force)
    routes = _routes_from_json(d.get("routes", []), m, events)
    timings = d.get("timings")
    if timings is not None:
        timings = _object(timings, "timings")
        timings = {k: _int(timings.get(k, 0), f"timings.{k}", -(1 << 53), 1 << 53)
                   for k in TIMING_KEYS}
    prefetches = prefetch_hits = None
    if "prefetch" in d:  # absent: written before the counters existed, so unknown
        prefetches, prefetch_hits = _prefetch_from_json(d["prefetch"], m.moe_layers)
    resident = None
    if "resident" in d:  # absent: the event rows explain residency (or an older trace)
        resident = masks_from_json(d["resident"], m.moe_layers, m.n_expert, slots)
    state.slots = slots
    return TokenRecord(
        index=index, phase=phase,
        token_id=_int(_get(d, "token_id"), "token_id", 0, _I32),
        text=_text(_get(d, "text"), "text"), seconds=seconds,
        policy=_text(_get(d, "policy"), "policy"), slots_per_layer=slots, events=events,
        routes=routes, changes=changes, timings=timings,
        answer=_int(d.get("answer", 0), "answer", 0, index),
        position=_int(d.get("position", 0), "position", 0, _I32),
        prefetches=prefetches, prefetch_hits=prefetch_hits, resident=resident,
    )


def _checked_slots(slots: int, model: ModelSummary, what: str) -> int:
    """``slots`` per layer if the model can have that many (top-k to all experts);
    ``what`` names the field, ``{}`` standing for the value."""
    if not model.top_k <= slots <= model.n_expert:
        raise ValueError(f"{what.format(slots)} is outside [top-k {model.top_k}, "
                         f"{model.n_expert} experts]")
    return slots


def _events_from_json(raw: Any, m: ModelSummary, state: _ReadState, token: int,
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


def _routes_from_json(raw: Any, m: ModelSummary, events: npt.NDArray[Any]
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


def _predictions_from_json(items: list[dict[str, Any]], rows: list[int], m: ModelSummary
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


def _prefetch_from_json(items: Any, moe_layers: Sequence[int]
                        ) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
    """Inverse of :func:`_prefetch_to_json`: dense per-MoE-layer arrays (raises on a layer
    that is not a MoE layer, a repeated layer, or a count out of range)."""
    if type(items) is not list:
        raise ValueError("prefetch must be a list of [layer, prefetches, hits]")
    row_of = {layer: i for i, layer in enumerate(moe_layers)}
    pf = np.zeros(len(moe_layers), dtype=np.int64)
    hits = np.zeros(len(moe_layers), dtype=np.int64)
    seen: set[int] = set()
    for i, item in enumerate(items):
        if type(item) is not list or len(item) != 3:
            raise ValueError(f"prefetch entry {_show(item)} is not [layer, prefetches, hits]")
        layer = _int(item[0], f"prefetch[{i}] layer")
        if layer not in row_of or layer in seen:
            raise ValueError(f"prefetch layer {layer} is not a MoE layer, or repeats")
        a = _int(item[1], f"prefetch[{i}] prefetches", 0, _I32)
        b = _int(item[2], f"prefetch[{i}] hits", 0, _I32)
        seen.add(layer)
        pf[row_of[layer]], hits[row_of[layer]] = a, b
    return pf, hits


def _changes_from_json(raw: Any, m: ModelSummary) -> list[Change]:
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
