"""Recording a trace from the engine, on the decode thread, one token at a time.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import os
import platform
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from moescope import __version__
from moescope.cache import native
from moescope.cache.native import EVENT_DTYPE
from moescope.cache.policy import Policy
from moescope.cache.residency import Residency, read_resident
from moescope.trace.compactor import Compactor
from moescope.trace.schema import (
    TIMING_KEYS,
    Change,
    RouteBlock,
    RouterDtype,
    RouterInput,
    TokenRecord,
    TraceHeader,
    TraceModel,
    rank_predictions,
)
from moescope.trace.writer import _BackgroundWriter, open_writer
from moescope.util.errors import MoEScopeError


def software_versions() -> dict[str, str | None]:
    """moescope, the engine (llama_cpp), the native core, Python and numpy versions.

    llama_cpp is not imported here (that would load the engine library from ``core``):
    its ``__version__`` is read if it is already loaded, else the installed distribution's.
    """
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

    ``changes`` (a :class:`~moescope.engine.changes.ChangeLog`: the recorder reads it
    through its own cursor) and ``cache`` (with ``step`` and
    ``resident(layer)``, or the faster ``resident_masks(layers)``) are read too when
    present.
    """

    @property
    def policy(self) -> Policy: ...

    @property
    def slots_per_layer(self) -> int: ...

    def last_routes(self, layers: Sequence[int]) -> tuple[Any, Any, Any, Any] | None: ...

    def timings(self) -> dict[str, int]: ...




class TraceRecorder:
    """Turns the engine's per-token output into trace records, written as they come.

    Feed it every ``TokenStats`` the engine yields, with the engine as ``source``::

        recorder = TraceRecorder.for_engine("chat.jsonl.gz", engine)
        for stats in engine.generate(prompt):
            recorder.record(stats, engine)
        recorder.end_answer(engine)  # the step that chose EOS, which generate() holds back
        recorder.close(stop_reason=engine.last_answer.stop_reason)

    For each token it reads the router inputs of every layer that token routed
    (``last_routes``), the change of the engine's copy timings, the change of the core's
    prefetch counters (``cache.layer_stats``: PSR writes no event row, so this is the only
    record of it), and the policy or budget changes made since the previous token.

    It also rebuilds residency from the event rows as it goes, exactly as a reader will
    (:class:`~moescope.cache.residency.Residency`), reads the cache's real resident masks
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
                 fsync: bool = False, compactor: Compactor | None = None) -> None:
        self.header = header
        self.writer = open_writer(path, header, compress=compress, fsync=fsync)
        self.compactor = compactor
        """Finishes a Parquet trace after :meth:`close` (None: ``close`` does, and waits)."""
        self._policy = header.policy
        self._slots = header.slots_per_layer
        self._index = 0
        self._answer = -1
        self._last_position = -1
        self._timings = _timings_of(source)
        self._dropped = _dropped_of(source)
        changes = getattr(source, "changes", None)
        self._change_cursor = changes.cursor() if changes is not None else None
        self._notes: list[str] = []
        self._last_end: Any = None  # the end step end_answer recorded last
        self._source: Any = None  # the latest source: close() records its answer's end
        m = header.model
        self._residency = Residency(m.moe_layers, m.n_expert, header.slots_per_layer)
        self.route_mismatches = 0
        """Rows whose ``last_routes`` ids disagreed with the event (left without inputs)."""
        self._background = _BackgroundWriter(self.writer)
        self._closed = False

    @classmethod
    def for_engine(cls, path: str | os.PathLike[str], engine: Any, *,
                   router_inputs: RouterDtype | None = "f32", compress: bool | None = None,
                   fsync: bool = False, compactor: Compactor | None = None) -> TraceRecorder:
        """A recorder whose header describes ``engine``'s loaded model, budget and policy."""
        return cls(path, header_for(engine, router_inputs=router_inputs), source=engine,
                   compress=compress, fsync=fsync, compactor=compactor)

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
            audit=getattr(stats, "audit", None),
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
            counts = getattr(stats, "prefetch", None)  # the engine's TokenStats.prefetch
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
        if self._change_cursor is not None:  # the policy in force is compared below instead
            out.extend(c for _, c in self._change_cursor.take() if c.kind != "policy")
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

    def _routes(self, source: RouteSource, events: npt.NDArray[Any]) -> Mapping[int, RouterInput]:
        """Router inputs of the last row of every layer this token routed: that is what
        ``last_routes`` still holds (earlier rows of a batched ubatch have none). Every
        layer is read in one block (``last_routes``, ``last_predictions``), checked
        against the event rows in one pass and kept as blocks (:class:`RouteBlock`)."""
        layer_of_row = events["layer"]
        if len(layer_of_row) == 0 or getattr(source, "last_routes", None) is None:
            return {}
        # each layer's last row, in row order
        last = len(layer_of_row) - 1 - np.unique(layer_of_row[::-1], return_index=True)[1]
        rows = np.sort(last).astype(np.intp)
        layers = layer_of_row[rows].astype(np.int64).tolist()
        got = source.last_routes(layers)
        if got is None:
            return {}
        probs, weights, ids, found = got
        k = ids.shape[1]
        want = events["ids"][rows, :k]
        used = np.arange(k)[None, :] < events["k"][rows, None]
        same = ((ids == want) | ~used).all(axis=1)
        self.route_mismatches += int((found & ~same).sum())
        kept = np.flatnonzero(found & same)
        next_layer = np.full(len(kept), -1, dtype=np.int32)
        predicted = np.zeros((len(kept), 0), dtype=np.int32)
        n_pred = np.zeros(len(kept), dtype=np.int32)
        read = getattr(source, "last_predictions", None)
        nxt_scores = read(layers) if read is not None and len(kept) else None
        if nxt_scores is not None:
            nxt, scores = nxt_scores
            with_pred = np.flatnonzero(nxt[kept] > 0)  # positions in kept
            if len(with_pred):
                ranked = rank_predictions(scores[kept[with_pred]])
                predicted = np.zeros((len(kept), ranked.shape[1]), dtype=np.int32)
                predicted[with_pred] = ranked
                next_layer[with_pred] = nxt[kept[with_pred]]
                n_pred[with_pred] = ranked.shape[1]
        return RouteBlock(rows[kept], probs[kept], weights[kept], ids[kept], next_layer,
                          predicted, n_pred)

    def close(self, **end: Any) -> None:
        """Write the last token and the end record and close the file; the file is closed
        even when writing failed (then the error is raised, once: closing again does
        nothing). A Parquet trace is compacted before this returns, unless the recorder
        has a :attr:`compactor`: then its journal, closed and whole, is the trace until
        the compactor is done."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._source is not None and getattr(self._source, "loaded", True):
                self._record_end(self._source)  # a caller that did not call end_answer
        finally:
            # on the writer thread: a Parquet trace is compacted there, not on the caller's
            self._background.close(lambda: self._close_writer(end))

    def _close_writer(self, end: dict[str, Any]) -> None:
        close_journal = getattr(self.writer, "close_journal", None)
        if self.compactor is None or close_journal is None:
            self.writer.close(**end)
        elif close_journal(**end):
            self.compactor.submit(self.writer)

    def __enter__(self) -> TraceRecorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()



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
        model=TraceModel.from_info(info),
        budget=budget or (plan.budget.text if plan is not None else ""),
        slots_per_layer=int(engine.slots_per_layer), policy=engine.policy,
        router_inputs=router_inputs, initial_step=step, initial_resident=resident,
        software=software_versions(), machine=machine_info(),
        created=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    )
