"""The engine's thread: one ``EngineWorker`` owns the Engine and lives on its own QThread.

GPT4All's pattern (``ChatLLM`` on a QThread): the window never calls the engine directly.
Requests go in as queued signals (load, generate, apply idle requests, shut down) and come
out as signals carrying copied snapshots, never widgets or live buffers. Three calls are
deliberately *not* queued, because the worker's event loop is busy for the whole answer:
``stop``, ``request_policy`` and ``request_budget`` use the Engine's thread-safe methods,
so they take effect at the next token even mid-generation.

The window's answer is saved here, on the decode thread, each token's text before the next
token is decoded (``GenerateRequest.save``): the window gets its tokens in coalesced
batches, later, and a killed process must lose at most the token in flight.

Token snapshots are coalesced: at most one ``tokens`` signal per :data:`EMIT_INTERVAL_S`
(a real model gives one token per signal; a tiny test model decoding thousands of tokens
per second would otherwise flood the GUI's event queue and stall it).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sqlite3
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PySide6.QtCore import QObject, QThread, Signal, Slot

from moescope.cache.budget import format_bytes
from moescope.cache.guard import GuardSpec
from moescope.cache.policy import Policy
from moescope.cache.residency import read_ram_resident, read_resident
from moescope.display.trace_io import TraceLimits, open_new_session, prune_traces
from moescope.engine import AnswerStats, Engine, LoadCancelled, Sampling
from moescope.engine.compare import compare_policies, conversation_tokens
from moescope.model.ram_fit import AUTO_RAM_BUDGET
from moescope.session.recording import Recording, RecordingStopped
from moescope.session.snapshots import AnswerSummary, ModelSummary, TokenSnapshot
from moescope.session.store import AnswerWriter
from moescope.session.turns import EngineQueue, Turn
from moescope.trace import TraceRecorder
from moescope.trace.compactor import Compactor
from moescope.trace.names import live_trace_file
from moescope.trace.schema import Change
from moescope.util.errors import MoEScopeError

log = logging.getLogger("moescope.gui.worker")

EMIT_INTERVAL_S = 0.015
DECODE_NICE = 5
"""Niceness added to the decode thread (Linux, per thread; ``MOESCOPE_DECODE_NICE``
overrides). When decoding and the window compete for a core, the window wins, so
typing and plots never stutter; with a free core it changes nothing. Measured on 2
loaded cores: event-loop p99 latency 30-115 ms at nice 0, 16-32 ms at nice 5."""

QUIT_COMPACT_WAIT_S = 1.0
"""At quit, how long the window waits for traces still being compacted (a long session
takes seconds), and then as long again for the compaction to stop at its next step
(``Compactor.stop``): their journals are whole traces, finished at the next start, and
no compaction is left writing while the process exits. The compactor's thread is started
from the decode thread's (or its trace writer's), so it runs at their lowered priority."""


@dataclass(frozen=True)
class LoadRequest:
    path: str
    budget: str = "25%"
    policy: Policy | str = "quality-first"
    n_ctx: int = 2048
    n_gpu_layers: int | None = None  # None: every layer on a GPU build, else none
    n_threads: int | None = None  # None: llama.cpp's choice (the machine's cores)
    ram_budget: str | None = AUTO_RAM_BUDGET
    """Host memory for experts (``--ram-budget``); experts beyond it stay in the file.
    None: all of them; the default: all if the model fits the memory available, else what
    fits (a model opened without the Open dialog: the last one, from Get models)."""
    trace_dir: str | None = None
    """Record the session (core trace format) into this directory; None: no recording."""


@dataclass(frozen=True)
class AnswerSave:
    """Where the decode thread appends the answer's tokens: the chat database and the
    answer's message (created, with its prefix, by the window)."""

    store_path: str
    message_id: int


@dataclass(frozen=True)
class GenerateRequest:
    messages: tuple[dict[str, str], ...]
    sampling: Sampling = field(default_factory=Sampling)
    answer_start: str = ""
    """Text the answer already has (``Engine.generate``): "Answer now" continues from it."""
    save: AnswerSave | None = None
    """Save each token as it is decoded (None: not saved here, e.g. tests; the window
    saves what the snapshots do not mark ``saved``)."""


@dataclass(frozen=True)
class CompareRequest:
    """Greedy answers to ``messages`` under each of ``policies`` (``engine.compare``)."""

    messages: tuple[dict[str, str], ...]
    policies: tuple[Policy | str, ...]
    max_tokens: int = 64
    thinking: str = "default"
    transcript: tuple[dict[str, str], ...] = ()
    """The whole chat to score under each policy (perplexity); () scores nothing."""


class EngineWorker(QObject):
    """Owns the Engine; every slot runs on the worker thread."""

    loadProgress = Signal(str, float)
    loaded = Signal(object)  # ModelSummary
    loadFailed = Signal(str)
    loadCancelled = Signal(str)
    tokens = Signal(object)  # list[TokenSnapshot], oldest first
    finished = Signal(object)  # AnswerSummary
    failed = Signal(str)
    requestsApplied = Signal(object, object)  # ModelSummary, list[str]
    compareProgress = Signal(int, int, str)  # done, total, policy now answering
    compareFinished = Signal(object, object)  # Comparison, ModelSummary
    compareFailed = Signal(str)
    recordingStopped = Signal(str)  # why, and where the trace so far is
    closed = Signal()

    def __init__(self, engine: Engine | None = None) -> None:
        super().__init__()
        self.engine = engine or Engine()
        self.step = 0
        """Tokens decoded this session (the x axis of the time plots)."""
        self.answer_tokens = 0
        """Tokens of the answer being generated (read by other threads: stop accounting)."""
        self.tokens_at_stop: int | None = None
        self.generating = False
        self._changes = self.engine.changes.cursor()
        self.recording: Recording | None = None
        self.trace_limits = TraceLimits()
        """The disk the session traces may take (tests shrink it)."""
        self.compactor = Compactor()
        """Finishes closed sessions' Parquet traces in the background (any thread)."""
        self._answer_prefixes: dict[str, str] = {}
        self._thinking_choices: tuple[str, ...] = ("default",)
        self._cancel_compare = threading.Event()
        self._recording_off = threading.Event()
        """Set from the GUI thread: stop recording at the next token (or now, if idle)."""
        self.turns: EngineQueue | None = None
        """Shared with the API server while the window serves (``gui/serve``): loads,
        answers and comparisons take a turn on it, so the engine runs one at a time."""
        self._waiting: Turn | None = None
        self._writer: AnswerWriter | None = None
        """The decode thread's own connection to the chat database (kept between answers)."""

    # ------------------------------------------------------------------ slots
    @Slot()
    def threadStarted(self) -> None:
        """Runs first on the worker thread: lower its CPU priority (see DECODE_NICE)."""
        nice = int(os.environ.get("MOESCOPE_DECODE_NICE", DECODE_NICE))
        if nice and hasattr(os, "setpriority") and sys.platform.startswith("linux"):
            try:
                tid = threading.get_native_id()
                os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid)
                               + nice)
            except OSError as err:
                log.info("could not lower the decode thread's priority: %s", err)

    @Slot(object)
    def load(self, request: LoadRequest) -> None:
        name = request.path.rsplit("/", 1)[-1]
        log.info("loading %s (budget %s, policy %s)", name, request.budget,
                 _policy_label(request.policy))
        t0 = time.perf_counter()
        try:
            with self._turn():
                self._close_recorder()
                self.engine.load(request.path, budget=request.budget, policy=request.policy,
                                 n_ctx=request.n_ctx, n_gpu_layers=request.n_gpu_layers,
                                 n_threads=request.n_threads,
                                 ram_budget=request.ram_budget,
                                 progress=self.loadProgress.emit)
        except LoadCancelled as err:
            log.info("%s", err)
            self.loadCancelled.emit(str(err))
            return
        except MoEScopeError as err:
            log.warning("load failed: %s", err)
            self.loadFailed.emit(str(err))
            return
        except Exception as err:  # a bug or an engine failure: still one sentence
            log.exception("load failed")
            self.loadFailed.emit(f"could not load {name}: {err}")
            return
        self._changes = self.engine.changes.cursor()
        self.step = 0
        self._thinking_choices = self.engine.thinking_choices()
        self._answer_prefixes = {c: self.engine.answer_prefix(c)  # once: renders the template
                                 for c in self._thinking_choices}
        if request.trace_dir and self.engine.cache is not None:
            self._open_recorder(Path(request.trace_dir), request.path)
        summary = self.summary()
        log.info("loaded %s in %.2f s: %s", name, time.perf_counter() - t0,
                 summary.budget_message or "expert cache off")
        self.loaded.emit(summary)

    @Slot(object)
    def generate(self, request: GenerateRequest) -> None:
        engine = self.engine
        self.generating = True
        self.answer_tokens = 0
        self.tokens_at_stop = None
        error: str | None = None
        previous = engine.last_answer
        batch: list[TokenSnapshot] = []
        last_emit = 0.0
        if request.answer_start and self.recording is not None:
            self.recording.answer_now()
        save = request.save
        try:
            with self._turn():
                if save is not None and not self._open_writer(save.store_path):
                    save = None
                for ts in engine.generate(list(request.messages), request.sampling,
                                          answer_start=request.answer_start):
                    self.answer_tokens = ts.index + 1
                    self._record(ts)
                    saved = save is not None and self._save_token(save.message_id, ts.text)
                    if save is not None and not saved:
                        save = None  # the window saves the rest, after what is saved
                    batch.append(self._snapshot(ts, saved=saved))
                    now = time.perf_counter()
                    if now - last_emit >= EMIT_INTERVAL_S:
                        self.tokens.emit(batch)
                        batch, last_emit = [], now
        except MoEScopeError as err:
            error = str(err)
        except Exception as err:
            log.exception("generation failed")
            error = f"generation failed: {err}"
        finally:
            end = engine.last_answer.end_step if engine.last_answer is not previous else None
            if end is not None:  # the step that chose EOS: recorded and drawn like a token
                self._record(None)
                batch.append(self._snapshot(end, end=True))
            self.generating = False
            if batch:
                self.tokens.emit(batch)
        if self.recording is not None:  # the answer's last token on disk before it is over
            self.recording.flush()
        if error is not None:
            log.warning("%s", error)
            self.failed.emit(error)
        a = engine.last_answer
        if a is previous:  # failed before the answer began (e.g. context too small)
            a = AnswerStats(stop_reason="error")
        c = a.cache
        self.finished.emit(AnswerSummary(
            n_prompt_tokens=a.n_prompt_tokens, n_tokens=a.n_tokens,
            time_to_first_token_s=a.time_to_first_token_s, seconds=a.seconds,
            tokens_per_second=a.tokens_per_second, hit_rate=c.hit_rate,
            substituted_fraction=c.substituted_fraction, mass_per_token=c.mass_per_token,
            fetched_mb_per_token=c.fetched_mb_per_token, policies=tuple(a.policies),
            stop_reason=a.stop_reason or ("error" if error else ""),
            summary=a.summary(), audit=a.audit.describe() if a.audit is not None else ""))

    @Slot(object)
    def compare(self, request: CompareRequest) -> None:
        """Answer the message under each policy (``engine.compare``). The session trace
        ends before and a new one starts after: the comparison's cache traffic is not the
        chat's, and the chat goes on from an empty cache, from which a replay is exact."""
        engine = self.engine
        trace_dir = self.recorder.path.parent if self.recorder is not None else None
        self._close_recorder()
        self._cancel_compare.clear()
        self.generating = True
        result = None
        try:
            score = conversation_tokens(engine, list(request.transcript), request.thinking) \
                if request.transcript else []
            with self._turn():
                result = compare_policies(
                    engine, list(request.messages), request.policies,
                    max_tokens=request.max_tokens, thinking=request.thinking, score=score,
                    progress=self.compareProgress.emit, stopped=self._cancel_compare.is_set)
        except MoEScopeError as err:
            self.compareFailed.emit(str(err))
        except Exception as err:
            log.exception("comparison failed")
            self.compareFailed.emit(f"comparison failed: {err}")
        finally:
            self.generating = False
            m = engine.model
            if trace_dir is not None and m is not None:
                self._open_recorder(trace_dir, str(m.path))
        if result is not None:
            log.info("compared %s", ", ".join(
                f"{a.policy} {a.tokens_per_second:.1f} tok/s {a.agreement:.0%}"
                for a in result.answers))
            self.compareFinished.emit(result, self.summary())

    def cancel_compare(self) -> None:
        """Any thread: end a comparison after the token being decoded."""
        self._cancel_compare.set()
        self.engine.stop()

    @Slot()
    def applyRequests(self) -> None:
        """Apply queued policy/budget requests while idle (mid-answer they are already
        applied by the decode loop before this queued call runs)."""
        if not self.engine.loaded:
            return
        turn = self.turns.join_if_idle("window") if self.turns is not None else None
        if self.turns is not None and turn is None:
            return  # the API's answer applies them before its next token
        try:
            changes = self.engine.apply_requests()
            self.report_applied(changes)
        finally:
            if turn is not None and self.turns is not None:
                self.turns.leave(turn)

    def report_applied(self, changes: list[Change]) -> None:
        """Tell the window what :meth:`Engine.apply_requests` just changed while no answer
        ran (this thread's or the API server's, holding the engine's turn), so that its
        controls follow now rather than at the next token."""
        if not changes or not self.engine.loaded:
            return
        log.info("applied: %s", ", ".join(c.label for c in changes))
        summary = self.summary()
        cache, m = self.engine.cache, self.engine.model
        if cache is not None and m is not None and m.info is not None:
            summary = dataclasses.replace(summary, resident=read_resident(
                cache, m.info.moe_layers, m.info.n_expert))  # a budget cut evicted
        self.requestsApplied.emit(summary, changes)

    @Slot()
    def shutdown(self) -> None:
        """Free the model on its own thread, then end the thread's event loop."""
        self.engine.stop()
        self._close_recorder()
        self._close_writer()
        self.engine.close()
        self.closed.emit()
        thread = QThread.currentThread()
        if thread is not None:
            thread.quit()

    # ------------------------------------------------------------------ chat saving
    def _open_writer(self, store_path: str) -> bool:
        """The decode thread's connection to ``store_path`` (reused); False when it cannot
        be opened (the window then saves every token, as it reports failures)."""
        if self._writer is not None and self._writer.path == Path(store_path):
            return True
        self._close_writer()
        try:
            self._writer = AnswerWriter(store_path)
        except (sqlite3.Error, OSError) as err:
            log.warning("the decode thread cannot save the answer (the window will): %s", err)
            return False
        return True

    def _save_token(self, message_id: int, text: str) -> bool:
        """Append a token's text to the answer; False when the write failed (disk full,
        locked beyond the busy timeout...): this answer is then not saved here any more."""
        if self._writer is None:
            return False
        if not text:
            return True
        try:
            self._writer.append(message_id, text)
        except (sqlite3.Error, OSError) as err:
            log.warning("the decode thread could not save the answer (the window will "
                        "retry): %s", err)
            self._close_writer()  # the next answer opens anew
            return False
        return True

    def _close_writer(self) -> None:
        if self._writer is not None:
            writer, self._writer = self._writer, None
            with contextlib.suppress(sqlite3.Error):
                writer.close()

    # ------------------------------------------------------------------ recording
    @Slot(str)
    def pruneTraces(self, directory: str) -> None:
        """Startup: old session traces beyond :attr:`trace_limits` are deleted, then the
        journals a crash left are compacted in the background (:attr:`compactor`)."""
        for old in prune_traces(Path(directory), self.trace_limits, keep=self._live_traces()):
            log.info("deleted old session trace %s", old.name)
        self.compactor.finish_leftovers(directory)

    def _live_traces(self) -> set[Path]:
        """The session being recorded and those being compacted: never pruned."""
        live = self.compactor.busy()
        if self.recorder is not None:
            live.add(self.recorder.path)
        return live

    def request_recording_off(self) -> None:
        """Any thread: stop recording this session (at the next token, or at once when
        idle, through the queued ``stopRecording``)."""
        self._recording_off.set()

    @property
    def recorder(self) -> TraceRecorder | None:
        """The session's trace being written, or None (decode thread only)."""
        return self.recording.recorder if self.recording is not None else None

    @Slot()
    def stopRecording(self) -> None:
        """Close the session's trace (what was recorded stays readable)."""
        self._recording_off.clear()
        if self.recorder is not None:
            log.info("recording stopped by the user: %s", self.recorder.path)
            self._close_recorder(stop_reason="recording turned off")

    def _open_recorder(self, directory: Path, model_path: str) -> None:
        """Start the session's trace right after loading (the cache is empty then, so a
        replay of it is exact). Recording problems are logged, never fatal."""
        self._recording_off.clear()  # a stop asked for before this session is not for it
        try:
            directory.mkdir(parents=True, exist_ok=True)
            # older sessions make room for this one to reach its own limit
            for old in prune_traces(directory, self.trace_limits,
                                    room=self.trace_limits.session_bytes,
                                    keep=self._live_traces()):
                log.info("deleted old session trace %s to make room", old.name)
            recorder = open_new_session(
                directory, model_path,
                lambda path: TraceRecorder.for_engine(path, self.engine,
                                                      compactor=self.compactor))
        except (OSError, MoEScopeError) as err:
            log.warning("session recording is off: %s", err)
            self.recording = None
            self.recordingStopped.emit(f"This session is not recorded: {err}. The chat is "
                                       "not affected.")
            return
        self.recording = Recording(recorder, on_stopped=self._recording_stopped,
                                   limit_bytes=lambda: self.trace_limits.session_bytes)
        log.info("recording this session to %s", recorder.path)

    def _record(self, ts: Any | None) -> None:
        """Record a token; None: the answer's end step (``Recording.end_answer``)."""
        if self.recording is None:
            return
        if self._recording_off.is_set():
            self.stopRecording()
            return
        if ts is None:
            self.recording.end_answer(self.engine)
        else:
            self.recording.record(ts, self.engine)

    def _recording_stopped(self, stopped: RecordingStopped) -> None:
        """Recording ended on its own (a failed write, the size limit); the chat goes on,
        the next model load records anew."""
        self.recording = None
        if stopped.kind == "size limit":
            self.recordingStopped.emit(
                f"This session's trace reached its size limit "
                f"({format_bytes(stopped.limit_bytes)}), so recording stopped here; the "
                f"chat goes on. The trace so far is readable: {stopped.path}")  # compacted
        else:
            self.recordingStopped.emit(
                f"Writing the trace failed ({stopped.error}); recording stopped for this "
                f"session and the chat goes on. The trace so far is readable: "
                f"{live_trace_file(stopped.path)}")

    def _close_recorder(self, stop_reason: str | None = None) -> None:
        if self.recording is not None:
            self.recording.close(stop_reason or self.engine.last_answer.stop_reason)
            self.recording = None

    # ------------------------------------------------------------------ thread-safe
    def stop(self) -> None:
        """Any thread: stop after the token being decoded (or stop waiting for the
        engine while the API server has it: its answer goes on)."""
        waiting = self._waiting
        if waiting is not None and self.turns is not None:
            self.turns.cancel(waiting)
            return
        if self.generating:
            self.tokens_at_stop = self.answer_tokens
        self._cancel_compare.set()  # a comparison ends too (and the window can close)
        self.engine.stop()

    # ------------------------------------------------------------------ helpers
    @contextlib.contextmanager
    def _turn(self) -> Iterator[None]:
        """The engine to this thread for the block: at once unless the API server
        shares it and is generating (``turns``); then after its answer."""
        if self.turns is None:
            yield
            return
        turn = self.turns.join("window")
        self._waiting = turn
        try:
            ok = self.turns.wait(turn)
            self._waiting = None
            if not ok:
                raise MoEScopeError("stopped while waiting for the API server's answer")
            yield
        finally:
            self._waiting = None
            self.turns.leave(turn)

    def follow(self, ts: Any) -> TokenSnapshot:
        """A decoded token as the window shows it, recorded in the session's trace:
        the window's own, or one the API server decoded while holding the turn (so the
        trace stays a replayable record of everything the cache saw)."""
        self._record(ts)
        return self._snapshot(ts)

    def follow_end(self) -> TokenSnapshot | None:
        """After another front end's answer (the API server's): its end step recorded
        and snapshotted, as :meth:`generate` does for the window's own, and the trace
        flushed. None when the answer did not end on an end-of-generation token."""
        end = self.engine.last_answer.end_step
        snap = None
        if end is not None:
            self._record(None)
            snap = self._snapshot(end, end=True)
        if self.recording is not None:
            self.recording.flush()
        return snap

    def summary(self) -> ModelSummary:
        """The loaded model as plain data (worker thread: reads the engine)."""
        from moescope.model.sampling_defaults import model_sampling

        m = self.engine.model
        assert m is not None
        info, plan = m.info, m.plan
        return ModelSummary(
            path=str(m.path), name=(info.name if info and info.name else m.path.name),
            architecture=info.architecture if info else "",
            n_expert=info.n_expert if info else 0, top_k=info.top_k if info else 0,
            moe_layers=tuple(info.moe_layers) if info and m.cache_enabled else (),
            slot_row_bytes=plan.slot_row_bytes if plan else 0,
            total_expert_bytes=info.total_expert_bytes if info else 0,
            non_expert_bytes=info.non_expert_bytes if info else 0,
            cache_enabled=m.cache_enabled,
            slots_per_layer=self.engine.slots_per_layer,
            policy=self.engine.policy_name, n_ctx=m.n_ctx, notice=m.notice,
            ram_note=m.ram_note,
            budget_message=plan.message if plan else "",
            trace_path=str(self.recorder.path) if self.recorder else "",
            expert_buffer=m.expert_buffer, slot_buffer=m.slot_buffer,
            ram_slots_per_layer=self.engine.ram_slots_per_layer,
            answer_prefixes=dict(self._answer_prefixes),
            thinking_choices=self._thinking_choices,
            sampling_defaults=model_sampling(info.metadata) if info else {},
            requests=self.engine.applied_requests)

    def _snapshot(self, ts: Any, *, end: bool = False, saved: bool = False) -> TokenSnapshot:
        engine = self.engine
        changes = [change for _, change in self._changes.take()]
        resident = ram = None
        prefetch: np.ndarray | None = None
        cache, m = engine.cache, engine.model
        ram_slots = engine.ram_slots_per_layer
        if cache is not None and m is not None and m.info is not None:
            layers = m.info.moe_layers
            resident = read_resident(cache, layers, m.info.n_expert)  # a copy: the GUI's
            if ram_slots:
                ram = read_ram_resident(cache, layers, m.info.n_expert)
            if self.engine.policy.prefetch:  # shown only for tokens whose policy prefetches
                prefetch = ts.prefetch
        answer = engine.last_answer
        self.step += 1
        return TokenSnapshot(
            step=self.step, index=ts.index, text=ts.text, seconds=float(ts.seconds),
            policy=ts.policy, slots_per_layer=int(ts.slots_per_layer),
            n_prompt_tokens=answer.n_prompt_tokens, n_ctx=m.n_ctx if m else 0,
            events=np.array(ts.events, copy=True), resident=resident,
            changes=tuple(c.label for c in changes),
            errors=tuple(c.text for c in changes if c.kind == "error"),
            ttft=answer.time_to_first_token_s if ts.index == 0 else None,
            prefetches=prefetch[0] if prefetch is not None else None,
            prefetch_hits=prefetch[1] if prefetch is not None else None,
            requests=engine.applied_requests, end=end, audit=ts.audit,
            ram_resident=ram, ram_slots_per_layer=ram_slots, saved=saved)


def _policy_label(policy: Policy | str) -> str:
    return policy if isinstance(policy, str) else (policy.name or "custom")


class EngineClient(QObject):
    """The window's handle on the worker: owns the QThread, forwards requests.

    Signals declared here are connected to the worker's slots; since the worker lives on
    another thread, Qt queues them (the GUI thread never waits on the engine). The
    worker's own signals are re-emitted here, on the GUI thread: the window and its parts
    connect to the client, never to the worker, and never read the worker's objects
    (its engine, recorder or limits belong to the decode thread). Besides the queued
    signals, only the Engine's documented thread-safe calls cross over (stop, cancel, the
    live policy and budget requests).
    """

    loadProgress = Signal(str, float)
    loaded = Signal(object)  # ModelSummary
    loadFailed = Signal(str)
    loadCancelled = Signal(str)
    tokens = Signal(object)  # list[TokenSnapshot], oldest first
    finished = Signal(object)  # AnswerSummary
    failed = Signal(str)
    requestsApplied = Signal(object, object)  # ModelSummary, list[Change]
    compareProgress = Signal(int, int, str)
    compareFinished = Signal(object, object)  # Comparison, ModelSummary
    compareFailed = Signal(str)
    recordingStopped = Signal(str)

    _RELAYED = ("loadProgress", "loaded", "loadFailed", "loadCancelled", "tokens", "finished",
                "failed", "requestsApplied", "compareProgress", "compareFinished",
                "compareFailed", "recordingStopped")

    _load = Signal(object)
    _generate = Signal(object)
    _compare = Signal(object)
    _apply = Signal()
    _shutdown = Signal()
    _stop_recording = Signal()
    _prune_traces = Signal(str)

    def __init__(self, engine: Engine | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.thread = QThread()
        self.thread.setObjectName("moescope-engine")
        self.worker = EngineWorker(engine)
        self.worker.moveToThread(self.thread)
        for name in self._RELAYED:  # first: whoever connects later hears of it after us
            getattr(self.worker, name).connect(getattr(self, name))
        self.thread.started.connect(self.worker.threadStarted)
        self._load.connect(self.worker.load)
        self._generate.connect(self.worker.generate)
        self._compare.connect(self.worker.compare)
        self._apply.connect(self.worker.applyRequests)
        self._shutdown.connect(self.worker.shutdown)
        self._stop_recording.connect(self.worker.stopRecording)
        self._prune_traces.connect(self.worker.pruneTraces)
        self.thread.start()
        self._closed = False

    def load(self, request: LoadRequest) -> None:
        self._load.emit(request)

    def generate(self, request: GenerateRequest) -> None:
        self._generate.emit(request)

    def stop(self) -> None:
        self.worker.stop()

    def cancel_load(self) -> None:
        """Any thread: end a model load at llama.cpp's next progress step."""
        self.worker.engine.cancel_load()

    def compare(self, request: CompareRequest) -> None:
        self._compare.emit(request)

    def cancel_compare(self) -> None:
        """Any thread: end a comparison after the token being decoded."""
        self.worker.cancel_compare()

    def prune_traces(self, directory: str | Path) -> None:
        """Delete the oldest session traces in ``directory`` beyond the worker's limits
        (on the worker thread, which owns the limits and writes the traces)."""
        self._prune_traces.emit(str(directory))

    def request_policy(self, policy: Policy | str | GuardSpec) -> int:
        """From the next token (mid-answer), or at once when idle; returns the request's
        number, which snapshots report back once it is applied."""
        number = self.worker.engine.request_policy(policy)
        self._apply.emit()
        return number

    def request_budget(self, budget: str) -> int:
        """Resize the expert cache between tokens; the model and the chat are kept."""
        number = self.worker.engine.request_budget(budget)
        self._apply.emit()
        return number

    def request_ram_budget(self, budget: str) -> None:
        """Resize the RAM tier between tokens, like the VRAM budget."""
        self.worker.engine.request_ram_budget(budget)
        self._apply.emit()

    def request_audit(self, every: int) -> None:
        """Audit every ``every``-th token from the next one on (0: off)."""
        self.worker.engine.request_audit(every)
        self._apply.emit()

    def stop_recording(self) -> None:
        """Close the session's trace: at the next token mid-answer, else at once."""
        self.worker.request_recording_off()
        self._stop_recording.emit()

    def shutdown(self, timeout_ms: int = 10_000) -> bool:
        """Stop any answer, free the model on the worker thread, join the thread."""
        if self._closed:
            return True
        self._closed = True
        self.worker.stop()
        self.worker.engine.cancel_load()  # a load in progress ends too (minutes, else)
        self._shutdown.emit()
        ok = self.thread.wait(timeout_ms)
        if not ok:
            log.error("the engine thread did not stop within %d ms", timeout_ms)
        compactor = self.worker.compactor
        if not compactor.wait(QUIT_COMPACT_WAIT_S):
            left = ", ".join(p.name for p in sorted(compactor.busy()))
            compactor.stop()
            stopped = compactor.wait(QUIT_COMPACT_WAIT_S)
            log.info("quitting with traces not yet compacted (%s): their journals are the "
                     "traces, finished at the next start%s", left,
                     "" if stopped else "; one was still being read")
        return bool(ok)
