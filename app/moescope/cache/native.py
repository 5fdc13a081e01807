"""Thin ctypes binding to the native expert-cache core (``native/include/moecache.h``).

The engine and the simulator must make identical decisions, so both go through this one C
implementation of *Which Expert Misses Are Worth Waiting For?*'s miss rules, eviction and
admission. This module mirrors the header's structs, finds the library, and wraps a cache
handle in :class:`ExpertCache`, which speaks numpy so a router-logit replay needs no loop
per expert. No Qt, no llama_cpp import (only its shipped library, if it carries the core).

A little above 600 lines on purpose: it is the one binding of the core's C API (structs,
signatures, the numpy wrappers, and the by-address batch path the replay uses); split, the
binding would have two homes again.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from types import TracebackType
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache.policy import Eviction, MissRule, Policy, SubstituteWeight
from moescope.util.errors import MoEScopeError
from moescope.util.resources import engine_lib_dir

MAX_K = 32
"""``MOECACHE_MAX_K``: the largest top-k an event row holds."""

OK, E_ARG, E_NO_SLOT, E_PLAN_CAP = 0, -1, -2, -3
HIT, FETCH, SUBSTITUTE = 0, 1, 2
"""``enum moecache_action`` values as they appear in event rows' ``action``."""

ENV_LIBRARY = "MOESCOPE_NATIVE_LIB"
_LIBRARY_NAMES = ("libmoecache.so", "libmoecache.dylib", "moecache.dll")


class CPolicy(ctypes.Structure):
    """``moecache_policy``."""

    _fields_ = [
        ("miss_rule", ctypes.c_int32),
        ("theta", ctypes.c_float),
        ("eviction", ctypes.c_int32),
        ("half_life", ctypes.c_float),
        ("admission", ctypes.c_int32),
        ("beta", ctypes.c_float),
        ("substitute_weight", ctypes.c_int32),
        ("bonus", ctypes.c_float),
        ("prefetch", ctypes.c_int32),
        ("theta_disk", ctypes.c_float),
        ("fill_free", ctypes.c_int32),
    ]


def policy_to_c(policy: Policy) -> CPolicy:
    """The ``moecache_policy`` struct of ``policy`` (here, not on :class:`Policy`: the
    policy is plain data and imports nothing of the binding)."""
    return CPolicy(
        miss_rule=int(policy.miss_rule), theta=policy.theta, eviction=int(policy.eviction),
        half_life=policy.half_life, admission=int(policy.admission), beta=policy.beta,
        substitute_weight=int(policy.substitute_weight), bonus=policy.bonus,
        prefetch=policy.prefetch, theta_disk=policy.theta_disk,
        fill_free=int(policy.fill_free),
    )


def policy_from_c(c: CPolicy) -> Policy:
    """Read a ``moecache_policy`` back; float32 parameters come back as the shortest
    decimal that rounds to them (0.15f -> 0.15), so ``policy_from_c(policy_to_c(p)) == p``."""
    return Policy(
        miss_rule=MissRule(c.miss_rule), theta=_from_float32(c.theta),
        eviction=Eviction(c.eviction), half_life=_from_float32(c.half_life),
        admission=bool(c.admission), beta=_from_float32(c.beta),
        substitute_weight=SubstituteWeight(c.substitute_weight),
        bonus=_from_float32(c.bonus), prefetch=int(c.prefetch),
        theta_disk=_from_float32(c.theta_disk), fill_free=bool(c.fill_free),
    )


def _from_float32(value: float) -> float:
    return float(str(np.float32(value)))


class CCopy(ctypes.Structure):
    """``moecache_copy``: one copy the executor performs (async 0 = fetch, 1 = admission)."""

    _fields_ = [
        ("layer", ctypes.c_int32),
        ("expert", ctypes.c_int32),
        ("slot", ctypes.c_int32),
        ("async", ctypes.c_int32),
        ("ram_slot", ctypes.c_int32),
        ("from_disk", ctypes.c_int32),
    ]


class CEvent(ctypes.Structure):
    """``moecache_event``: one row per (step, layer, token)."""

    _fields_ = [
        ("step", ctypes.c_int64),
        ("layer", ctypes.c_int32),
        ("token", ctypes.c_int32),
        ("k", ctypes.c_int32),
        ("ids", ctypes.c_int32 * MAX_K),
        ("weights", ctypes.c_float * MAX_K),
        ("action", ctypes.c_int8 * MAX_K),
        ("used_ids", ctypes.c_int32 * MAX_K),
        ("slots", ctypes.c_int32 * MAX_K),
        ("substituted_mass", ctypes.c_float),
        ("n_hit", ctypes.c_int32),
        ("n_fetch", ctypes.c_int32),
        ("n_substitute", ctypes.c_int32),
        ("n_admit", ctypes.c_int32),
        ("n_evict", ctypes.c_int32),
        ("admitted", ctypes.c_int32 * MAX_K),
        ("evicted", ctypes.c_int32 * MAX_K),
        ("bytes_sync", ctypes.c_int64),
        ("bytes_async", ctypes.c_int64),
        ("tier", ctypes.c_int8 * MAX_K),
        ("n_disk", ctypes.c_int32),
        ("bytes_disk", ctypes.c_int64),
    ]


class CLayerStats(ctypes.Structure):
    """``moecache_layer_stats``."""

    _fields_ = [
        ("tokens", ctypes.c_int64),
        ("selections", ctypes.c_int64),
        ("hits", ctypes.c_int64),
        ("fetches", ctypes.c_int64),
        ("substitutions", ctypes.c_int64),
        ("admissions", ctypes.c_int64),
        ("evictions", ctypes.c_int64),
        ("substituted_mass", ctypes.c_double),
        ("bytes_sync", ctypes.c_int64),
        ("bytes_async", ctypes.c_int64),
        ("resize_evictions", ctypes.c_int64),
        ("prefetches", ctypes.c_int64),
        ("prefetch_hits", ctypes.c_int64),
        ("ram_fills", ctypes.c_int64),
        ("disk_fills", ctypes.c_int64),
        ("bytes_disk", ctypes.c_int64),
        ("ram_evictions", ctypes.c_int64),
    ]


EVENT_DTYPE: np.dtype[Any] = np.dtype(CEvent)
"""numpy dtype of one event row, byte-identical to ``moecache_event``."""
COPY_DTYPE: np.dtype[Any] = np.dtype(CCopy)
"""numpy dtype of one copy-plan entry, byte-identical to ``moecache_copy``."""

EVENT_STEPS_HELD = 256
"""Governed steps of event rows the ring holds before the oldest are dropped. The engine
drains every token (generation, evaluation); teacher forcing (``Engine.forced_logits``)
drains once at the end, so this is also the longest forced run whose rows all survive."""


def event_ring_rows(n_moe_layers: int, tokens_per_step: int = 1,
                    steps: int = EVENT_STEPS_HELD) -> int:
    """Rows of the core's event ring for a model: one row per (step, MoE layer, token) of a
    governed step (a decode step is one token; prefill is not governed and writes none),
    for ``steps`` steps, at least 1,024. Sized to the model rather than a fixed 65,536
    rows: a row is ``EVENT_DTYPE.itemsize`` (864) bytes, so 48 MoE layers hold
    12,288 rows (10.6 MB) instead of 57 MB."""
    return max(1024, max(0, n_moe_layers) * max(1, tokens_per_step) * max(1, steps))


class NativeLibraryNotFoundError(MoEScopeError):
    """Neither a built libmoecache nor an engine library carrying the core was found."""


class NativeError(RuntimeError):
    """The core rejected a call; carries the ``moecache_status`` code."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


class NativeArgumentError(NativeError, ValueError):
    """An argument the core refuses (out-of-range id or layer, duplicate id in a token)."""


class NoSlotError(NativeError):
    """The batch needs more distinct experts than a layer has slots (nothing changed)."""


@dataclass(frozen=True)
class LayerStats:
    """Cumulative counters of one layer (``moecache_layer_stats``)."""

    tokens: int
    selections: int
    hits: int
    fetches: int
    substitutions: int
    admissions: int
    evictions: int
    substituted_mass: float
    bytes_sync: int
    bytes_async: int
    resize_evictions: int
    prefetches: int
    prefetch_hits: int
    ram_fills: int = 0
    disk_fills: int = 0
    bytes_disk: int = 0
    ram_evictions: int = 0


@dataclass(frozen=True)
class RouteResult:
    """What ``moecache_route`` decided for one layer's batch.

    Arrays have the shape of the ``ids`` passed in: ``(k,)`` for one token, else
    ``(n_tokens, k)``. ``plan`` lists sync fetches first, then async admissions.
    """

    out_ids: npt.NDArray[np.int32]
    out_slots: npt.NDArray[np.int32]
    weights: npt.NDArray[np.float32]
    plan: npt.NDArray[Any]

    @property
    def fetches(self) -> npt.NDArray[Any]:
        """Copies needed before this layer's matmul."""
        return self.plan[self.plan["async"] == 0]

    @property
    def admissions(self) -> npt.NDArray[Any]:
        """Background copies (the experts are already logically resident)."""
        return self.plan[self.plan["async"] == 1]


# --------------------------------------------------------------------------- loading

_lock = threading.Lock()
_library: ctypes.CDLL | None = None


def _repo_build_dir() -> Path:
    return Path(__file__).resolve().parents[3] / "build" / "native"


def _engine_library() -> Path | None:
    """The libllama.so the engine loads (``$LLAMA_CPP_LIB_PATH`` honoured, as llama_cpp
    does), located without importing llama_cpp."""
    lib_dir = engine_lib_dir()
    candidate = lib_dir / "libllama.so" if lib_dir is not None else None
    return candidate if candidate is not None and candidate.is_file() else None


def _exports_core(lib: ctypes.CDLL) -> bool:
    return hasattr(lib, "moecache_create")


def find_library() -> Path:
    """Where the core comes from, in order: $MOESCOPE_NATIVE_LIB; the engine's libllama if
    it exports ``moecache_create`` (so engine and simulator share one copy of the code);
    the repo's ``build/native``. Raises :class:`NativeLibraryNotFoundError`."""
    env = os.environ.get(ENV_LIBRARY)
    if env:
        path = Path(env)
        if not path.is_file():
            raise NativeLibraryNotFoundError(f"{ENV_LIBRARY}={env} is not a file")
        return path
    engine = _engine_library()
    if engine is not None:
        try:
            if _exports_core(ctypes.CDLL(str(engine))):
                return engine
        except OSError:
            pass
    for name in _LIBRARY_NAMES:
        candidate = _repo_build_dir() / name
        if candidate.is_file():
            return candidate
    raise NativeLibraryNotFoundError(
        "the native expert-cache core is not built: run `make` (or cmake -S native -B "
        f"build/native && cmake --build build/native), or set {ENV_LIBRARY}"
    )


def declare(lib: ctypes.CDLL) -> ctypes.CDLL:
    """Set argument and result types of every ``moecache_*`` function on ``lib`` (ours, or
    the engine's libllama that has the core compiled in), so ctypes checks calls."""
    i32, i64, f32p = ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(ctypes.c_float)
    i32p, vp = ctypes.POINTER(ctypes.c_int32), ctypes.c_void_p
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "moecache_preset": (i32, [ctypes.c_char_p, ctypes.POINTER(CPolicy)]),
        "moecache_create": (vp, [i32, i32, i32, i32, ctypes.POINTER(CPolicy)]),
        "moecache_destroy": (None, [vp]),
        "moecache_set_policy": (i32, [vp, ctypes.POINTER(CPolicy)]),
        "moecache_get_policy": (None, [vp, ctypes.POINTER(CPolicy)]),
        "moecache_set_slots": (i32, [vp, i32]),
        "moecache_get_slots": (i32, [vp]),
        "moecache_set_expert_bytes": (None, [vp, i32, i64]),
        "moecache_set_ram_slots": (i32, [vp, i32]),
        "moecache_get_ram_slots": (i32, [vp]),
        "moecache_layer_ram": (None, [vp, i32, i32p]),
        "moecache_layer_ram_slots": (None, [vp, i32, i32p]),
        "moecache_begin_step": (None, [vp]),
        "moecache_step": (i64, [vp]),
        "moecache_route": (
            i32,
            [vp, i32, i32, f32p, i32p, f32p, i32p, i32p, ctypes.POINTER(CCopy), i32, i32p],
        ),
        "moecache_prefetch": (i32, [vp, i32, i32, f32p, ctypes.POINTER(CCopy), i32, i32p]),
        "moecache_layer_experts": (None, [vp, i32, i32p]),
        "moecache_layer_slots": (None, [vp, i32, i32p]),
        "moecache_layer_lost_mass": (None, [vp, i32, f32p]),
        "moecache_drain_events": (i32, [vp, ctypes.POINTER(CEvent), i32]),
        "moecache_events_pending": (i32, [vp]),
        "moecache_events_dropped": (i64, [vp]),
        "moecache_set_event_capacity": (None, [vp, i32]),
        "moecache_get_layer_stats": (None, [vp, i32, ctypes.POINTER(CLayerStats)]),
        "moecache_reset_stats": (None, [vp]),
        "moecache_clear": (None, [vp]),
        "moecache_version": (ctypes.c_char_p, []),
        "moecache_rank_predictions": (i32, [vp, i64, i32, i32, vp]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes
    found = lib.moecache_version().decode(errors="replace")
    if _version_tuple(found) < CORE_VERSION:
        # its structs are smaller than ours: every call passing a policy would misread them
        raise NativeLibraryNotFoundError(
            f"the native core is version {found[:20]}, older than this MoEScope's "
            f"{'.'.join(map(str, CORE_VERSION))}: rebuild it with `make` (the engine and "
            "build/native)")
    return lib


CORE_VERSION = (0, 4)
"""The oldest ``moecache_version()`` whose structs match these (0.4: ``fill_free``)."""


def _version_tuple(text: str) -> tuple[int, ...]:
    parts = []
    for part in text.split(".")[:3]:
        if not part.isdigit():
            return ()
        parts.append(int(part))
    return tuple(parts)


def rank_predictions(scores: npt.ArrayLike, keep: int) -> npt.NDArray[np.int32]:
    """Expert ids by descending score, ties by lower id, NaN last: the first ``keep`` of
    each row as ``moecache_prefetch`` ranks them (``moecache_rank_predictions``). ``scores``
    is one row or a ``[rows, experts]`` block; the result has the same number of axes."""
    raw = np.ascontiguousarray(scores, dtype=np.float32)
    block = np.atleast_2d(raw)
    if block.ndim != 2 or block.shape[1] < 1 or keep < 1:
        raise ValueError(f"rank_predictions needs rows of at least one score and keep >= 1, "
                         f"got shape {raw.shape} and keep {keep}")
    n_rows, n_experts = block.shape
    out = np.empty((n_rows, min(keep, n_experts)), dtype=np.int32)
    if n_rows:
        _check(load_library().moecache_rank_predictions(
            block.ctypes.data, n_rows, n_experts, keep, out.ctypes.data), "rank_predictions")
    return out if raw.ndim > 1 else out[0]


def load_library() -> ctypes.CDLL:
    """The core, loaded once per process (see :func:`find_library` for the search order)."""
    global _library
    with _lock:
        if _library is None:
            _library = declare(ctypes.CDLL(str(find_library())))
        return _library


def version() -> str:
    """``moecache_version()`` of the loaded core."""
    raw: bytes = load_library().moecache_version()
    return raw.decode()


def c_preset(name: str) -> CPolicy:
    """The C table's preset, to check the Python presets against it."""
    out = CPolicy()
    if load_library().moecache_preset(name.encode(), ctypes.byref(out)) != OK:
        raise ValueError(f"unknown policy preset {name!r}")
    return out


# --------------------------------------------------------------------------- the cache


def _ptr(array: npt.NDArray[Any], ctype: Any) -> Any:
    return array.ctypes.data_as(ctypes.POINTER(ctype))


ROUTE_BY_ADDRESS = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p,
    ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p,
    ctypes.c_int32, ctypes.c_void_p)
"""``moecache_route`` with plain addresses: a batch caller (the replay) passes row slices of
its big arrays without building a ctypes pointer object or a numpy copy per call
(:meth:`ExpertCache.route` is general but costs tens of microseconds a call)."""


PREFETCH_BY_ADDRESS = ctypes.CFUNCTYPE(
    ctypes.c_int32, ctypes.c_void_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_void_p,
    ctypes.c_void_p, ctypes.c_int32, ctypes.c_void_p)
"""``moecache_prefetch`` with plain addresses, like :data:`ROUTE_BY_ADDRESS`."""

STEP_BY_ADDRESS = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
"""``moecache_begin_step`` with a plain address (:meth:`ExpertCache.begin_steps`)."""


class ExpertCache:
    """One native cache: ``n_layers`` layers of ``slots_per_layer`` slots each.

    Thread-safe like the core (its mutex): ``route`` on the decode thread while another
    thread calls ``set_policy``, ``layer_stats`` or ``drain_events``.
    """

    def __init__(
        self,
        n_layers: int,
        n_experts: int,
        top_k: int,
        slots_per_layer: int,
        policy: Policy | str | None = None,
    ) -> None:
        self._lib = load_library()
        self.n_layers = n_layers
        self.n_experts = n_experts
        self.top_k = top_k
        c_policy = policy_to_c(_as_policy(policy))
        handle = self._lib.moecache_create(
            n_layers, n_experts, top_k, slots_per_layer, ctypes.byref(c_policy)
        )
        if not handle:
            raise ValueError(
                f"invalid cache shape: n_layers={n_layers} n_experts={n_experts} "
                f"top_k={top_k} slots_per_layer={slots_per_layer} (need top_k <= slots "
                f"<= n_experts, top_k <= {MAX_K})"
            )
        self._handle: int | None = handle
        self._owned = True
        self._plan = (CCopy * max(1, slots_per_layer))()
        self._masks_lock = threading.Lock()
        self._masks_buffer: tuple[tuple[int, ...], npt.NDArray[np.int32], list[Any]] | None = None

    @classmethod
    def attach(
        cls,
        handle: int,
        *,
        n_layers: int,
        n_experts: int,
        top_k: int,
        lib: ctypes.CDLL | None = None,
    ) -> ExpertCache:
        """Wrap a core someone else owns (the engine's ``llama_moe_cache_core``), calling it
        through ``lib`` (default: :func:`load_library`). :meth:`close` only forgets it."""
        if not handle:
            raise ValueError("cannot attach to a NULL moecache handle")
        self = cls.__new__(cls)
        self._lib = declare(lib) if lib is not None else load_library()
        self.n_layers, self.n_experts, self.top_k = n_layers, n_experts, top_k
        self._handle = handle
        self._owned = False
        self._plan = (CCopy * max(1, self.slots))()
        self._masks_lock = threading.Lock()
        self._masks_buffer = None
        return self

    # lifetime ------------------------------------------------------------------
    def close(self) -> None:
        """Free the native cache (unless attached); further calls raise."""
        if self._handle is not None:
            if self._owned:
                self._lib.moecache_destroy(self._handle)
            self._handle = None

    def __enter__(self) -> ExpertCache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_handle", None) is not None:
            self.close()

    @property
    def handle(self) -> int:
        """The raw ``moecache *`` (for a caller that shares the cache with C code)."""
        if self._handle is None:
            raise ValueError("the expert cache is closed")
        return self._handle

    # policy, capacity, time ---------------------------------------------------------
    def set_policy(self, policy: Policy | str) -> None:
        """Takes effect at the next :meth:`begin_step` (decisions within a token never mix)."""
        c_policy = policy_to_c(_as_policy(policy))
        code = self._lib.moecache_set_policy(self.handle, ctypes.byref(c_policy))
        _check(code, "set_policy")

    @property
    def policy(self) -> Policy:
        """The active policy."""
        out = CPolicy()
        self._lib.moecache_get_policy(self.handle, ctypes.byref(out))
        return policy_from_c(out)

    def set_slots(self, slots: int) -> None:
        """Resize every layer now (between tokens); the executor re-copies residents."""
        _check(self._lib.moecache_set_slots(self.handle, slots), f"set_slots({slots})")

    @property
    def slots(self) -> int:
        """Slots per layer."""
        return int(self._lib.moecache_get_slots(self.handle))

    def set_ram_slots(self, ram_slots: int) -> None:
        """Size the logical RAM tier (experts per layer in host memory; 0 = off: every
        expert is in host memory). Decisions then tell RAM copies from disk reads."""
        _check(self._lib.moecache_set_ram_slots(self.handle, ram_slots),
               f"set_ram_slots({ram_slots})")

    @property
    def ram_slots(self) -> int:
        """RAM-tier experts per layer (0: tier off)."""
        return int(self._lib.moecache_get_ram_slots(self.handle))

    def layer_ram(self, layer: int) -> npt.NDArray[np.int32]:
        """Expert -> RAM-tier slot (-1: only on disk, or the tier is off)."""
        self._check_layer(layer)
        out = np.empty(self.n_experts, dtype=np.int32)
        self._lib.moecache_layer_ram(self.handle, layer, _ptr(out, ctypes.c_int32))
        return out

    def set_expert_bytes(self, layer: int, n_bytes: int) -> None:
        """Bytes of one expert of ``layer``, for the byte counters."""
        self._lib.moecache_set_expert_bytes(self.handle, layer, n_bytes)

    def begin_step(self) -> None:
        """Start a decode step: applies a pending policy, advances frequency decay."""
        self._lib.moecache_begin_step(self.handle)

    def begin_steps(self, n: int) -> None:
        """``n`` :meth:`begin_step` calls through a bare prototype (a fraction of the
        binding's cost per call). The core's step cannot be set and its frequency keys
        depend on the absolute step, so an exact replay walks every step; the trace reader
        bounds how many."""
        fn, handle = STEP_BY_ADDRESS(("moecache_begin_step", self._lib)), self.handle
        for _ in range(n):
            fn(handle)

    @property
    def step(self) -> int:
        """The current step (0 before the first :meth:`begin_step`)."""
        return int(self._lib.moecache_step(self.handle))

    # routing ----------------------------------------------------------------------
    def route(
        self,
        layer: int,
        probs: npt.ArrayLike,
        ids: npt.ArrayLike,
        weights: npt.ArrayLike,
    ) -> RouteResult:
        """Decide hit / fetch / substitute for one layer's batch.

        ``probs`` is ``(n_tokens, n_experts)`` router probabilities, ``ids`` and ``weights``
        ``(n_tokens, k)`` in router order (1-D for a single token). ``weights`` is not
        modified; the returned copy carries the substitutes' weights.
        """
        ids_arr = np.ascontiguousarray(ids, dtype=np.int32)
        single = ids_arr.ndim == 1
        ids2 = ids_arr.reshape(-1, self.top_k)
        n_tokens = ids2.shape[0]
        probs2 = np.ascontiguousarray(probs, dtype=np.float32).reshape(n_tokens, self.n_experts)
        w2 = np.array(weights, dtype=np.float32, copy=True).reshape(n_tokens, self.top_k)
        out_ids = np.empty_like(ids2)
        out_slots = np.empty_like(ids2)
        plan_cap = min(self.slots, n_tokens * self.top_k)
        if len(self._plan) < plan_cap:
            self._plan = (CCopy * plan_cap)()
        n_plan = ctypes.c_int32(0)
        code = self._lib.moecache_route(
            self.handle,
            layer,
            n_tokens,
            _ptr(probs2, ctypes.c_float),
            _ptr(ids2, ctypes.c_int32),
            _ptr(w2, ctypes.c_float),
            _ptr(out_ids, ctypes.c_int32),
            _ptr(out_slots, ctypes.c_int32),
            self._plan,
            len(self._plan),
            ctypes.byref(n_plan),
        )
        _check(code, f"route(layer={layer}, n_tokens={n_tokens})")
        plan = np.frombuffer(self._plan, dtype=COPY_DTYPE, count=n_plan.value).copy()
        shape = ids_arr.shape if single else ids2.shape
        return RouteResult(
            out_ids=out_ids.reshape(shape),
            out_slots=out_slots.reshape(shape),
            weights=w2.reshape(shape),
            plan=plan,
        )

    def by_address(self) -> tuple[Any, Any]:
        """``moecache_route`` and ``moecache_prefetch`` of this cache's library as
        :data:`ROUTE_BY_ADDRESS` / :data:`PREFETCH_BY_ADDRESS` functions (the batch path:
        the caller passes the handle and addresses and keeps the buffers alive)."""
        return (ROUTE_BY_ADDRESS(("moecache_route", self._lib)),
                PREFETCH_BY_ADDRESS(("moecache_prefetch", self._lib)))

    def prefetch(self, layer: int, scores: npt.ArrayLike) -> npt.NDArray[Any]:
        """PSR: bring ``layer``'s predicted experts in (``scores`` ``(n_tokens, n_experts)``,
        or 1-D for one token, ranks them); returns the async copy plan. A no-op under a
        policy with ``prefetch == 0``."""
        scores2 = np.ascontiguousarray(scores, dtype=np.float32).reshape(-1, self.n_experts)
        n_tokens = scores2.shape[0]
        plan_cap = max(1, min(self.slots, n_tokens * self.n_experts))
        if len(self._plan) < plan_cap:
            self._plan = (CCopy * plan_cap)()
        n_plan = ctypes.c_int32(0)
        code = self._lib.moecache_prefetch(
            self.handle, layer, n_tokens, _ptr(scores2, ctypes.c_float), self._plan,
            len(self._plan), ctypes.byref(n_plan))
        _check(code, f"prefetch(layer={layer}, n_tokens={n_tokens})")
        return np.frombuffer(self._plan, dtype=COPY_DTYPE, count=n_plan.value).copy()

    # inspection ---------------------------------------------------------------------
    def layer_experts(self, layer: int) -> npt.NDArray[np.int32]:
        """expert -> slot, -1 where not resident (``n_experts`` entries)."""
        self._check_layer(layer)
        out = np.empty(self.n_experts, dtype=np.int32)
        self._lib.moecache_layer_experts(self.handle, layer, _ptr(out, ctypes.c_int32))
        return out

    def layer_slots(self, layer: int) -> npt.NDArray[np.int32]:
        """slot -> expert, -1 where free (``slots`` entries)."""
        self._check_layer(layer)
        out = np.empty(self.slots, dtype=np.int32)
        self._lib.moecache_layer_slots(self.handle, layer, _ptr(out, ctypes.c_int32))
        return out

    def resident(self, layer: int) -> set[int]:
        """The experts of ``layer`` that count as resident."""
        return {int(e) for e in np.flatnonzero(self.layer_experts(layer) >= 0)}

    def resident_masks(self, layers: Sequence[int]) -> npt.NDArray[np.bool_]:
        """Resident masks of ``layers`` (one row each, ``n_experts`` columns), read into one
        reused buffer: the trace recorder reads every MoE layer after every token, and
        :meth:`layer_experts` per layer spends most of its time building ctypes pointers.
        The buffer is guarded by a lock, so the class stays as thread-safe as the core."""
        key = tuple(int(x) for x in layers)
        with self._masks_lock:
            cached = self._masks_buffer
            if cached is None or cached[0] != key:
                for layer in key:
                    self._check_layer(layer)
                buf = np.empty((len(key), self.n_experts), dtype=np.int32)
                base, stride = buf.ctypes.data, buf.strides[0]
                i32p = ctypes.POINTER(ctypes.c_int32)
                pointers = [ctypes.cast(base + i * stride, i32p) for i in range(len(key))]
                cached = self._masks_buffer = (key, buf, pointers)
            _, buf, pointers = cached
            fn, handle = self._lib.moecache_layer_experts, self.handle
            for layer, ptr in zip(key, pointers, strict=True):
                fn(handle, layer, ptr)
            return buf >= 0

    def layer_lost_mass(self, layer: int) -> npt.NDArray[np.float32]:
        """Admission accumulators: gate mass each expert lost to substitution while missing."""
        self._check_layer(layer)
        out = np.empty(self.n_experts, dtype=np.float32)
        self._lib.moecache_layer_lost_mass(self.handle, layer, _ptr(out, ctypes.c_float))
        return out

    def layer_stats(self, layer: int) -> LayerStats:
        """Cumulative counters of ``layer``."""
        self._check_layer(layer)
        out = CLayerStats()
        self._lib.moecache_get_layer_stats(self.handle, layer, ctypes.byref(out))
        return LayerStats(**{f.name: getattr(out, f.name) for f in fields(LayerStats)})

    def reset_stats(self) -> None:
        """Zero every layer's counters (residency is kept)."""
        self._lib.moecache_reset_stats(self.handle)

    def clear(self) -> None:
        """Empty every slot and forget accumulators and history (policy and slots kept)."""
        self._lib.moecache_clear(self.handle)

    # events -------------------------------------------------------------------------
    def drain_events(self, max_rows: int | None = None) -> npt.NDArray[Any]:
        """Remove and return pending event rows, oldest first, as :data:`EVENT_DTYPE`."""
        pending = int(self._lib.moecache_events_pending(self.handle))
        cap = pending if max_rows is None else min(pending, max_rows)
        out = np.zeros(cap, dtype=EVENT_DTYPE)
        if cap == 0:
            return out
        n = self._lib.moecache_drain_events(
            self.handle, out.ctypes.data_as(ctypes.POINTER(CEvent)), cap
        )
        return out[:n]

    @property
    def events_dropped(self) -> int:
        """Rows overwritten before they were drained (cumulative)."""
        return int(self._lib.moecache_events_dropped(self.handle))

    def set_event_capacity(self, rows: int) -> None:
        """Ring size in rows (0 stops recording); the newest rows that fit are kept."""
        if rows < 0:
            raise ValueError("event capacity must be >= 0")
        self._lib.moecache_set_event_capacity(self.handle, rows)

    def _check_layer(self, layer: int) -> None:
        if not 0 <= layer < self.n_layers:
            raise IndexError(f"layer {layer} out of range [0, {self.n_layers})")


def _as_policy(policy: Policy | str | None) -> Policy:
    if policy is None:
        return Policy.preset("exact")
    if isinstance(policy, str):
        return Policy.preset(policy)
    return policy


def _check(code: int, what: str) -> None:
    if code == OK:
        return
    if code == E_NO_SLOT:
        raise NoSlotError(code, f"{what}: the batch needs more distinct experts than slots")
    if code == E_PLAN_CAP:
        raise NativeError(code, f"{what}: copy-plan buffer too small")
    raise NativeArgumentError(code, f"{what}: invalid argument (code {code})")
