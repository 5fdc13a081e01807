"""ctypes binding of the core's batch replay (``moecache_replay_batch``, native/src/
batch_replay.cpp): a whole trace under many policies and budgets in one call.

Kept beside :mod:`.native` rather than in it: the per-call binding serves the engine and the
recorder, this one only the simulator, and the engine's libllama (which carries the core)
may predate the batch entry point, in which case the repo's ``libmoecache.so`` serves it.

A trace's per-trace preparation (validating its rows, packing them layer by layer for the
replay loop) is made once and kept (:class:`ReplayPlan`, ``moecache_replay_plan``) where the
core has it; a core before it replays every batch from scratch, deciding the same.

A window's what-if wants the batch's progress and a way to stop it without a call per
budget (each call re-plans the trace): ``replay_batch(progress=...)`` runs the native call on
a helper thread (ctypes releases the GIL) and polls its ``moecache_replay_control`` from the
caller's thread, which can then stop it at the next layer.
"""

from __future__ import annotations

import ctypes
import threading
import weakref
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache import native
from moescope.cache.native import CEvent, CPolicy, NativeLibraryNotFoundError, policy_to_c
from moescope.cache.policy import Policy


class CReplayTrace(ctypes.Structure):
    """``moecache_replay_trace``."""

    _fields_ = [
        ("n_layers", ctypes.c_int32), ("n_experts", ctypes.c_int32),
        ("top_k", ctypes.c_int32), ("pred_width", ctypes.c_int32),
        ("initial_step", ctypes.c_int64), ("start_slots", ctypes.c_int32),
        ("start_policy", CPolicy), ("expert_bytes", ctypes.c_void_p),
        ("n_rows", ctypes.c_int64), ("probs", ctypes.c_void_p), ("ids", ctypes.c_void_p),
        ("weights", ctypes.c_void_p), ("next_layer", ctypes.c_void_p),
        ("predicted", ctypes.c_void_p), ("n_calls", ctypes.c_int64),
        ("call_step", ctypes.c_void_p), ("call_layer", ctypes.c_void_p),
        ("call_start", ctypes.c_void_p), ("call_stop", ctypes.c_void_p),
        ("n_tokens", ctypes.c_int64), ("token_calls", ctypes.c_void_p),
        ("n_changes", ctypes.c_int64), ("change_token", ctypes.c_void_p),
        ("change_slots", ctypes.c_void_p), ("change_policy", ctypes.c_void_p),
        ("ranks", ctypes.c_void_p), ("rank_counts", ctypes.c_void_p),
        ("selected_probs", ctypes.c_void_p),
    ]


class CReplayConfig(ctypes.Structure):
    """``moecache_replay_config``."""

    _fields_ = [("policy", CPolicy), ("follow_policy", ctypes.c_int32),
                ("slots", ctypes.c_int32)]


class CReplayToken(ctypes.Structure):
    """``moecache_replay_token``."""

    _fields_ = [
        ("rows", ctypes.c_int64), ("selections", ctypes.c_int64), ("hits", ctypes.c_int64),
        ("fetches", ctypes.c_int64), ("substitutions", ctypes.c_int64),
        ("admissions", ctypes.c_int64), ("substituted_mass", ctypes.c_double),
        ("bytes_sync", ctypes.c_int64), ("bytes_async", ctypes.c_int64),
        ("n_sync", ctypes.c_int64), ("n_async", ctypes.c_int64),
        ("prefetches", ctypes.c_int64), ("prefetch_hits", ctypes.c_int64),
    ]


REPLAY_TOKEN_DTYPE: np.dtype[Any] = np.dtype(CReplayToken)
"""numpy dtype of one ``moecache_replay_token``."""

_lock = threading.Lock()
_library: ctypes.CDLL | None = None


def batch_library() -> ctypes.CDLL:
    """A core library that exports ``moecache_replay_batch`` and its control: the one
    :mod:`.native` loads if it also has the kept plan (``moecache_replay_batch_plan``), else
    the repo's ``build/native`` library if that has it, else whichever has the control
    (:func:`has_plan` then says False)."""
    global _library
    with _lock:
        if _library is None:
            lib = native.load_library()
            if not hasattr(lib, "moecache_replay_batch_plan"):  # a core before the plan
                path = next((native._repo_build_dir() / name for name in native._LIBRARY_NAMES
                             if (native._repo_build_dir() / name).is_file()), None)
                built = native.declare(ctypes.CDLL(str(path))) if path is not None else None
                if built is not None and (hasattr(built, "moecache_replay_batch_plan") or
                                          not hasattr(lib, "moecache_replay_batch_ctl")):
                    lib = built
            if not hasattr(lib, "moecache_replay_batch_ctl"):  # a core before progress
                raise NativeLibraryNotFoundError(
                    "the loaded core predates the batch replay's progress control and "
                    "build/native has no newer library: run `make native`")
            fn = lib.moecache_replay_batch
            fn.restype = ctypes.c_int32
            fn.argtypes = [ctypes.POINTER(CReplayTrace), ctypes.POINTER(CReplayConfig),
                           ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p]
            ctl = lib.moecache_replay_batch_ctl
            ctl.restype = ctypes.c_int32
            ctl.argtypes = [*fn.argtypes, ctypes.c_void_p]
            lib.moecache_replay_control_new.restype = ctypes.c_void_p
            lib.moecache_replay_control_new.argtypes = []
            lib.moecache_replay_control_free.restype = None
            lib.moecache_replay_control_free.argtypes = [ctypes.c_void_p]
            lib.moecache_replay_cancel.restype = None
            lib.moecache_replay_cancel.argtypes = [ctypes.c_void_p]
            lib.moecache_replay_progress.restype = None
            lib.moecache_replay_progress.argtypes = [ctypes.c_void_p] + [
                ctypes.POINTER(ctypes.c_int64)] * 3
            if hasattr(lib, "moecache_replay_batch_plan"):
                lib.moecache_replay_plan_new.restype = ctypes.c_void_p
                lib.moecache_replay_plan_new.argtypes = [ctypes.POINTER(CReplayTrace),
                                                         ctypes.c_int32]
                lib.moecache_replay_plan_free.restype = None
                lib.moecache_replay_plan_free.argtypes = [ctypes.c_void_p]
                lib.moecache_replay_plan_bytes.restype = ctypes.c_int64
                lib.moecache_replay_plan_bytes.argtypes = [ctypes.c_void_p]
                planned = lib.moecache_replay_batch_plan
                planned.restype = ctypes.c_int32
                planned.argtypes = [fn.argtypes[0], ctypes.c_void_p, *fn.argtypes[1:],
                                    ctypes.c_void_p]
            rank = lib.moecache_rank_rows
            rank.restype = ctypes.c_int32
            rank.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32,
                             ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p, ctypes.c_void_p,
                             ctypes.c_void_p]
            _library = lib
        return _library


def has_plan() -> bool:
    """Whether the batch replay's core keeps plans (:class:`ReplayPlan`)."""
    return hasattr(batch_library(), "moecache_replay_batch_plan")


def plan_key(trace: CReplayTrace) -> tuple[int, ...]:
    """What ties a plan to a trace (``moecache_replay_batch_plan`` checks the same): its
    dimensions, initial step and the addresses of its row, call and ranking arrays."""
    return (trace.n_layers, trace.n_experts, trace.top_k, trace.pred_width,
            trace.initial_step, trace.n_rows, trace.n_calls, trace.n_tokens,
            *(getattr(trace, name) or 0 for name in (
                "probs", "ids", "weights", "next_layer", "predicted", "call_step", "call_layer",
                "call_start", "call_stop", "token_calls", "ranks", "rank_counts",
                "selected_probs")))


class ReplayPlan:
    """A trace's kept replay plan (``moecache_replay_plan``): the trace validated once and
    its rows packed layer by layer for the replay loop, so that a batch over it
    (:func:`replay_batch` with ``plan``) starts replaying at once instead of redoing that
    per call (about 650 ns a row on the lead's 2,000-token trace, in fresh memory each time).

    It is a copy of what the loop reads, kept as long as this object:
    ``20 * top_k + 257`` bytes a row (with the trace's ranking; the plan ranks the rows
    itself without one, ``4 * top_k + 129`` more) and up to ``104 + 4 * pred_width`` a
    route call; :attr:`nbytes` says exactly (689 B a row at top-10 with 32 predictions
    and a call a row). The trace's arrays must stay alive and
    unchanged while the plan is used (the core refuses a trace at other addresses or of
    other dimensions: :attr:`key`). Freed when garbage-collected."""

    def __init__(self, handle: int, key: tuple[int, ...], nbytes: int) -> None:
        self.handle = handle
        self.key = key
        self.nbytes = nbytes
        """Bytes the plan holds (``moecache_replay_plan_bytes``)."""
        weakref.finalize(self, batch_library().moecache_replay_plan_free, handle)

    @classmethod
    def make(cls, trace: CReplayTrace, *, threads: int = 0) -> ReplayPlan | None:
        """The plan of ``trace`` on ``threads`` threads (0: one per core); None where the core
        keeps no plans, refuses the trace (a batch then says why) or has no memory for it."""
        lib = batch_library()
        if not hasattr(lib, "moecache_replay_plan_new"):
            return None
        handle = lib.moecache_replay_plan_new(ctypes.byref(trace), threads)
        if not handle:
            return None
        return cls(int(handle), plan_key(trace), int(lib.moecache_replay_plan_bytes(handle)))


def c_policy(policy: Policy) -> CPolicy:
    """A :class:`Policy` as the core's struct."""
    return policy_to_c(policy)


RANK_WIDTH = 64
"""``MOECACHE_RANK_WIDTH``: experts ranked per row for substitution, at most."""


Ranking = tuple[npt.NDArray[np.uint16], npt.NDArray[np.uint8], npt.NDArray[np.float32]]
"""``moecache_rank_rows``'s output: ranks ``[rows, RANK_WIDTH]``, counts ``[rows]``, the
selected experts' probabilities ``[rows, top_k]``."""


def rank_rows(probs: npt.NDArray[np.float32], ids: npt.NDArray[np.int32], *,
              threads: int = 0) -> Ranking | None:
    """``moecache_rank_rows`` over ``probs`` ``[rows, experts]`` and the router's ``ids``
    ``[rows, top_k]`` (C-contiguous): each row's best experts in the order a substitute is
    chosen, and the selection's probabilities, computed once and shared by every batch
    replay of the trace. None where the core cannot rank (65,535 experts or more): the
    replay then scans, deciding the same."""
    n_rows, n_experts = probs.shape
    top_k = ids.shape[1]
    if n_experts >= 0xFFFF or n_experts < 1 or ids.shape[0] != n_rows:
        return None
    ranks = np.zeros((n_rows, RANK_WIDTH), dtype=np.uint16)
    counts = np.zeros(n_rows, dtype=np.uint8)
    selected = np.zeros((n_rows, top_k), dtype=np.float32)
    code = batch_library().moecache_rank_rows(
        probs.ctypes.data if n_rows else None, ids.ctypes.data if n_rows else None, n_rows,
        n_experts, top_k, threads, ranks.ctypes.data if n_rows else None,
        counts.ctypes.data if n_rows else None, selected.ctypes.data if n_rows else None)
    if code != native.OK:
        native._check(code, "rank_rows")
    return ranks, counts, selected


E_CANCELLED = -4
"""``MOECACHE_E_CANCELLED``: a batch stopped by ``moecache_replay_cancel``."""

ProgressFn = Callable[[int, int], bool]
"""``progress(done, total)`` in work units (one per configuration and trace layer);
returning False stops the batch (:class:`ReplayCancelled`)."""

POLL_SECONDS = 0.05
"""How often a watched batch's progress is read (20 Hz: a smooth bar, a prompt stop)."""


class ReplayCancelled(Exception):
    """A batch replay stopped because its progress callback returned False."""


def replay_batch(trace: CReplayTrace, configs: list[CReplayConfig], *, threads: int = 0,
                 events: bool = False, progress: ProgressFn | None = None,
                 plan: ReplayPlan | None = None
                 ) -> tuple[npt.NDArray[Any], npt.NDArray[Any] | None]:
    """Run ``moecache_replay_batch``; returns per-token totals ``[configs, tokens]`` and,
    with ``events``, the replayed event rows ``[configs, rows]``. Raises
    :class:`~moescope.cache.native.NativeError` for a code other than OK (among them a
    ``plan`` made for another trace). With ``plan`` (:class:`ReplayPlan` of this trace) the
    batch skips validating and packing the rows again; the results are the same.

    With ``progress``, it is called on this thread with the work done so far (first
    ``(0, total)``, last ``(total, total)``, and about 20 times a second between when the
    count moved); when it returns False the batch stops at its next layer and
    :class:`ReplayCancelled` is raised. An exception from ``progress`` stops it too."""
    lib = batch_library()
    n_cfg = len(configs)
    out = np.zeros((n_cfg, int(trace.n_tokens)), dtype=REPLAY_TOKEN_DTYPE)
    rows = np.zeros((n_cfg, int(trace.n_rows)), dtype=native.EVENT_DTYPE) if events else None
    array = (CReplayConfig * max(n_cfg, 1))(*configs)
    args = (ctypes.byref(trace), array, n_cfg, threads, out.ctypes.data,
            rows.ctypes.data if rows is not None else None)

    def run(ctl: int | None) -> int:
        if plan is None:
            return int(lib.moecache_replay_batch_ctl(*args, ctl))
        return int(lib.moecache_replay_batch_plan(args[0], plan.handle, *args[1:], ctl))

    code = run(None) if progress is None else _watched(lib, run, n_cfg * int(trace.n_layers),
                                                       progress)
    if code != native.OK:
        if plan is not None and code == native.E_ARG and plan.key != plan_key(trace):
            raise native.NativeArgumentError(code, "replay_batch: the replay plan was made "
                                                   "for another trace")
        native._check(code, "replay_batch")
    return out, rows


def _watched(lib: ctypes.CDLL, run: Callable[[int | None], int], total: int,
             progress: ProgressFn) -> int:
    """``run(ctl)`` (the batch on a control) on a helper thread, its control polled here;
    returns its code, or raises :class:`ReplayCancelled` when ``progress`` asked to stop. The
    call is always joined before this returns or raises, so its buffers outlive it."""
    ctl = lib.moecache_replay_control_new()
    if not ctl:
        raise MemoryError("no memory for a replay control")
    codes: list[int] = []
    runner = threading.Thread(target=lambda: codes.append(run(ctl)),
                              name="moescope-replay-batch", daemon=True)
    done = ctypes.c_int64(0)
    stop = False
    try:
        if not progress(0, total):
            raise ReplayCancelled("the replay was cancelled")
        runner.start()
        shown = 0
        while runner.is_alive():
            runner.join(POLL_SECONDS)
            lib.moecache_replay_progress(ctl, None, ctypes.byref(done), None)
            now = min(int(done.value), total)
            if now != shown and runner.is_alive():
                shown = now
                if not progress(now, total):
                    stop = True
                    break
        if not stop and codes == [0] and not progress(total, total):
            stop = True
    finally:
        if runner.is_alive():  # stopped here, or an exception (KeyboardInterrupt) on the way
            lib.moecache_replay_cancel(ctl)
            runner.join()
        lib.moecache_replay_control_free(ctl)
    if stop or codes == [E_CANCELLED]:
        raise ReplayCancelled("the replay was cancelled")
    return codes[0] if codes else native.E_ARG


__all__ = ["E_CANCELLED", "RANK_WIDTH", "REPLAY_TOKEN_DTYPE", "CEvent", "CReplayConfig",
           "CReplayToken", "CReplayTrace", "ProgressFn", "Ranking", "ReplayCancelled",
           "ReplayPlan", "batch_library", "c_policy", "has_plan", "plan_key", "rank_rows",
           "replay_batch"]
