"""The Engine: one loaded model, its expert cache, and streaming generation.

Headless on purpose (no Qt): the CLI, the tests, the evaluation tool and the GUI's worker
thread all drive this one class. It owns a ``llama_cpp.Llama`` whose libllama carries our
patch; the expert cache lives inside llama.cpp's context and is steered through
``llama_moe_*`` (bindings.py) and the core's C API on the handle the context exposes.

Threading: every method runs on the thread that owns the engine, except :meth:`stop`,
which only sets a flag read between tokens (GPT4All's atomic stop).

About 700 lines because load, the decode loop and live steering all hold the same
llama.cpp context; what can stand alone already does (``load_hooks``, ``changes``,
``stats``, ``bindings``).
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import io
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.cache.audit import check_every, compare
from moescope.cache.budget import BudgetPlan, format_bytes, plan_for_model
from moescope.cache.guard import GuardController, GuardSpec, parse_guard
from moescope.cache.native import (
    EVENT_DTYPE,
    ExpertCache,
    LayerStats,
    event_ring_rows,
    policy_to_c,
)
from moescope.cache.policy import Policy
from moescope.cache.prefetch import PrefetchMeter
from moescope.engine import bindings
from moescope.engine.changes import ChangeLog, RequestNumbers
from moescope.engine.chat_tokens import ChatTokens, chat_tokens
from moescope.engine.grammar import Grammar, GrammarError
from moescope.engine.load_hooks import (
    LoadCancelled,
    first_line,
    is_template_error,
    llama_errors,
    load_message,
    load_progress,
    loading,
    report_native_aborts,
)
from moescope.engine.logprobs import MAX_TOP, Alternative, TokenLogprob, log_probabilities
from moescope.engine.stats import AnswerStats, CacheTotals, TokenStats
from moescope.model.gguf_info import ModelInfo, read_model_info
from moescope.model.ram_fit import (
    AUTO_CHANGE_MARK,
    host_bytes_needed,
    is_auto,
    kv_cache_bytes,
    ram_start_experts,
)
from moescope.model.reasoning import reasoning_prefix, template_variables, thinking_choices
from moescope.trace.schema import Change
from moescope.util.errors import MoEScopeError, NotMoEError
from moescope.util.memory_limit import memory_limit

ProgressFn = Callable[[str, float], None]


class ModelLoadError(MoEScopeError):
    """llama.cpp could not load the model (corrupt tensors, out of memory, ...)."""


class CacheError(MoEScopeError):
    """The expert cache could not be set up or resized; the previous state is kept."""


class DiskReadError(MoEScopeError):
    """Reading experts from the model file failed (read error, or the file was deleted,
    truncated or replaced since it was loaded); the answer ends, the model must be
    reloaded to read it again."""


class ChatTemplateError(MoEScopeError):
    """The model's own chat template (Jinja code from the GGUF) failed: it does not parse,
    or it refuses the conversation (e.g. "System role not supported"). Nothing about the
    conversation is wrong for another model, so front ends say so without suggesting a
    reset."""


@dataclass
class Sampling:
    """Sampling settings of one answer; temperature 0 means greedy."""

    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    frequency_penalty: float = 0.0
    """Subtracted from a token's logit once per time it was sampled among the last
    ``last_n_tokens_size`` (64) tokens of the answer (llama.cpp's penalties sampler;
    OpenAI's ``frequency_penalty``, -2..2); 0: off."""
    presence_penalty: float = 0.0
    """Subtracted once from the logit of any token sampled among those (OpenAI's
    ``presence_penalty``); 0: off."""
    xtc_probability: float = 0.0
    """XTC ("exclude top choices", llama.cpp's ``xtc`` sampler): the chance, per token,
    that every candidate at least ``xtc_threshold`` likely but the least likely of them is
    left out, after min-p (also at temperature 0); 0: off."""
    xtc_threshold: float = 0.1
    """XTC's threshold (llama.cpp's default 0.1); above 0.5 XTC does nothing."""
    mirostat: int = 0
    """Mirostat sampling, llama.cpp's: 0 off, 1 (Mirostat), 2 (Mirostat 2.0); it replaces
    top-k, top-p, min-p and XTC, after the penalties and the temperature."""
    mirostat_tau: float = 5.0
    """Mirostat's target surprise (cross-entropy), llama.cpp's default 5."""
    mirostat_eta: float = 0.1
    """Mirostat's learning rate, llama.cpp's default 0.1."""
    max_tokens: int = 256
    seed: int | None = None
    thinking: str = "default"
    """The chat template's thinking switch (``model.reasoning.THINKING_SETTINGS``: off/on
    for Qwen3 hybrids, low/medium/high for gpt-oss); "default" leaves the template be."""
    grammar: Grammar | None = None
    """Constrains the answer (:meth:`Engine.compile_grammar`); one answer's only: its
    parse state moves with the tokens."""
    logprobs: int | None = None
    """Give each token its log-probability and this many likeliest alternatives
    (0..``logprobs.MAX_TOP``) in :attr:`TokenStats.logprob`; None: none computed."""
    logit_bias: dict[int, float] | None = None
    """Added to these tokens' logits before anything samples (OpenAI's ``logit_bias``,
    -100..100; -100 bans a token, 100 all but forces it); None or empty: none."""


LOGIT_BIAS = 100.0
"""The bound of a :attr:`Sampling.logit_bias` value (OpenAI's)."""
MAX_LOGIT_BIAS = 1024
"""Tokens one :attr:`Sampling.logit_bias` may bias."""


TURN_STARTS = ("<|im_start|>", "<start_of_turn>", "<|start_header_id|>", "<|user|>",
               "<|system|>", "<|observation|>", "<\uff5cUser\uff5c>")
"""Chat templates' turn openers (ChatML, Gemma, Llama 3, GLM, DeepSeek's full-width
bars) that end an answer where the model writes one (:meth:`Engine.turn_stops`)."""


SAMPLING_BOUNDS: dict[str, tuple[float, float]] = {
    "xtc_probability": (0.0, 1.0),
    "xtc_threshold": (0.0, 1.0),
    "mirostat": (0, 2),
    "mirostat_tau": (0.0, 100.0),
    "mirostat_eta": (0.0, 1.0),
}
"""The bounds of :class:`Sampling`'s XTC and mirostat fields (``mirostat`` whole), which
every front end checks its numbers against."""


def check_sampling(s: Sampling) -> None:
    """:class:`MoEScopeError` in one line for an XTC or mirostat field out of
    :data:`SAMPLING_BOUNDS` (not finite, or of the wrong kind)."""
    import math

    for name, (lo, hi) in SAMPLING_BOUNDS.items():
        value = getattr(s, name)
        whole = isinstance(lo, int)
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or (whole and not isinstance(value, int)) \
                or not math.isfinite(value) or not lo <= value <= hi:
            raise MoEScopeError(f"{name} must be {'a whole number' if whole else 'a number'}"
                                f" from {lo:g} to {hi:g}, got {value!r}")
    for token, bias in (s.logit_bias or {}).items():
        if isinstance(token, bool) or not isinstance(token, int) or token < 0 \
                or isinstance(bias, bool) or not isinstance(bias, int | float) \
                or not math.isfinite(bias) or not -LOGIT_BIAS <= bias <= LOGIT_BIAS:
            raise MoEScopeError(f"logit_bias maps token ids to numbers from {-LOGIT_BIAS:g} "
                                f"to {LOGIT_BIAS:g}, got {token!r}: {bias!r}")


@dataclass
class LoadedModel:
    """What the app shows about the loaded model and its cache."""

    info: ModelInfo | None
    path: Path
    cache_enabled: bool
    plan: BudgetPlan | None
    notice: str = ""
    n_ctx: int = 0
    n_gpu_layers: int = 0
    n_threads: int = 0
    """Decode threads llama.cpp was given (its default when none was asked for)."""
    ram_plan: BudgetPlan | None = None
    """The RAM tier's plan (experts per layer kept in host memory); None: every expert is
    in host memory (the tier is off)."""
    disk_experts: bool = False
    """The experts stayed in the file at load (read on demand by the RAM tier)."""
    ram_note: str = ""
    """Why the RAM tier is what it is when auto chose it: at load (``ram_budget="auto"``
    for a model larger than the memory available) or live (``set_ram_budget("auto")``,
    which says so whatever it chose); "" otherwise (an explicit budget clears it)."""
    expert_buffer: str = ""
    """Where the experts live in host memory: llama.cpp's buffer name, e.g. ``CUDA_Host``
    (pinned: copies to VRAM at full PCIe speed) or ``CPU`` (pageable)."""
    slot_buffer: str = ""
    """Where the slots live: ``CUDA0``/``Vulkan0`` (device memory) or ``CPU`` (RAM)."""

    @property
    def pinned_experts(self) -> bool:
        return self.expert_buffer.endswith("_Host")


@dataclass
class Message:
    role: str
    content: str


class Engine:
    """Load a GGUF MoE model with the expert cache, generate, steer policy and budget."""

    def __init__(self) -> None:
        self._llm: Any = None
        self._cache: ExpertCache | None = None
        self._prefetch: PrefetchMeter | None = None
        self._lib: Any = None
        self.model: LoadedModel | None = None
        self._stop = threading.Event()
        self._cancel_load = threading.Event()
        self._policy_name = "exact"
        self._policy: Policy = Policy.preset("exact")
        self.last_answer = AnswerStats()
        self._requests_lock = threading.Lock()
        self._pending_policy: Policy | str | GuardSpec | None = None
        self._pending_budget: str | None = None
        self._pending_ram_budget: str | None = None
        self._file_identity: tuple[int, int, int, int] | None = None
        self._request_count = 0
        self._pending_numbers = RequestNumbers()  # the numbers of the queued requests
        self.applied_requests = RequestNumbers()
        """Numbers of the latest policy and budget requests applied (0: none yet). A UI
        that numbers its requests can tell a stale "applied" report from the current one."""
        self._steps_done = 0  # decode steps generated by this engine (for change markers)
        self._previous: tuple[list[int], list[int]] | None = None
        self._route_buffers: _RouteBuffers | None = None
        self._eog_mask: npt.NDArray[np.bool_] | None = None
        self._control: tuple[frozenset[int], frozenset[str]] | None = None
        """The vocabulary's control tokens and their texts' first characters, once asked."""
        self._turn_stops: frozenset[int] | None = None
        """Control tokens that open a turn in the model's chat template (``<|im_start|>``),
        which end an answer as its end-of-generation tokens do (:meth:`turn_stops`)."""
        """Which tokens end generation: what a grammar at a dead end lets through."""
        """The last generate call's prompt tokens and generated tokens (see _continuation)."""
        self.changes = ChangeLog()
        """What :meth:`apply_requests` changed, for readers holding a cursor."""
        self._audit_every = 0  # audits: every Nth decode step also computed exactly (0: off)
        self._pending_audit: int | None = None
        self._guard: GuardController | None = None  # the quality guard, when it is the policy
        self._audit_outside_guard = 0  # the user's audit period: the guard's ends with it
        self._guard_held: float | None = None
        """The end step's audited KL: given to the guard when the next answer starts, so
        that the step a trace records after the answer still saw the policy it ran with."""

    # ------------------------------------------------------------------ loading
    def load(self, path: str | os.PathLike[str], *, budget: str = "25%",
             policy: Policy | str | GuardSpec = "quality-first", n_gpu_layers: int | None = None,
             n_ctx: int = 2048, n_threads: int | None = None, cache: bool = True,
             host_experts: bool | None = None, pinned_experts: bool | None = None,
             ram_budget: str | None = None, disk_experts: bool | None = None,
             progress: ProgressFn | None = None) -> LoadedModel:
        """Load ``path``; the expert cache is on for MoE models unless ``cache=False``.

        ``n_gpu_layers`` (default: every layer when the engine has a GPU backend with a
        device, else none) places layers, and so their expert slots, on the GPU.

        A dense model loads with the cache off and says so in ``LoadedModel.notice``. A
        file that is not a GGUF raises ``ModelFormatError`` before llama.cpp sees it.
        ``host_experts`` (default: same as ``cache``) keeps experts in GGUF layout in host
        memory; a cache-off run with it on is the exact reference for the cache.
        ``pinned_experts`` (default: with the cache on, when layers are offloaded to a GPU)
        reads the experts into the GPU's pinned host memory instead of mapping the file:
        slower to load and not shared with the page cache, but every fetch then copies at
        full PCIe speed instead of staging through pageable memory.
        ``ram_budget`` (same grammar as ``budget``) sizes the RAM tier: experts beyond it
        are read from the model file on demand with explicit aligned reads. When the
        experts exceed it, ``disk_experts`` (default) leaves them in the file at load, so a
        model larger than RAM loads in seconds. A budget below one token's experts (top-k
        per layer) is refused with the minimum.
        """
        report = progress or (lambda stage, frac: None)
        self._cancel_load.clear()  # a cancel meant for an earlier load is not for this one
        if n_ctx < 1:  # llama.cpp reads 0 as "the model's own", which may not fit memory
            raise MoEScopeError(f"context size {n_ctx} is too small: give at least 1 token "
                                f"(e.g. 4096)")
        self.close()
        self._discard_requests()  # the load's own budget and policy supersede them
        p = Path(path)
        report("reading metadata", 0.0)
        notice = ""
        info: ModelInfo | None
        try:
            info = read_model_info(p)
        except NotMoEError as err:
            info, cache, notice = None, False, f"{err}; loaded with the expert cache off"
        plan = plan_for_model(info, budget) if cache and info is not None else None  # fail fast
        auto_note = ""
        if is_auto(ram_budget):
            ram_budget, auto_note = auto_ram_budget(
                info, min(n_ctx, info.context_length or n_ctx),
                slot_bytes=plan.bytes_used if _slots_in_ram(n_gpu_layers) else 0) \
                if plan is not None and info is not None else (None, "")
        ram_plan = _ram_plan(info, ram_budget) if plan is not None and ram_budget else None
        if disk_experts is None:
            disk_experts = ram_plan is not None and not ram_plan.fits_all
        disk_experts = bool(disk_experts and plan is not None)
        if info is not None:
            p = info.path  # a split model opens at its first part, whichever was given
        if info is not None and info.context_length:
            n_ctx = min(n_ctx, info.context_length)
        self._lib = bindings.engine_library()
        self._lib.llama_moe_set_host_experts(bool(cache if host_experts is None
                                                   else host_experts) or disk_experts)
        self._lib.llama_moe_set_disk_experts(disk_experts)
        report("loading weights", 0.1)
        import llama_cpp  # deferred: loading the shared library takes a moment

        if n_gpu_layers is None:
            n_gpu_layers = -1 if llama_cpp.llama_supports_gpu_offload() else 0
        if pinned_experts is None:
            pinned_experts = bool(cache and n_gpu_layers != 0 and not disk_experts
                                  and llama_cpp.llama_supports_gpu_offload())
        report_native_aborts()
        try:
            with _quiet_stderr(), llama_errors() as errors, loading(p), load_progress(
                    lambda f: report("loading weights", 0.1 + 0.7 * f), self._cancel_load):
                self._llm = bindings.llama_type()(
                    model_path=bindings.model_path_argument(p), n_ctx=n_ctx,
                    n_gpu_layers=n_gpu_layers, n_threads=n_threads, verbose=False, logits_all=False,
                    use_mmap=not (pinned_experts or disk_experts))
        except (ValueError, RuntimeError, OSError) as err:
            self._lib.llama_moe_set_disk_experts(False)
            if self._cancel_load.is_set():
                raise LoadCancelled(f"loading {p.name} was cancelled") from None
            raise ModelLoadError(load_message(p, n_ctx, str(err), errors)) from err
        except Exception as err:
            if not is_template_error(err):
                raise
            raise ChatTemplateError(
                f"{p.name}: its chat template (tokenizer.chat_template) is not valid Jinja "
                f"({first_line(err)}), so llama-cpp-python cannot load the model; a "
                f"corrected GGUF is needed") from err
        if self._cancel_load.is_set():  # asked for while the last tensors were read
            self.close()
            raise LoadCancelled(f"loading {p.name} was cancelled")
        if plan is not None and info is not None:
            report("allocating expert slots", 0.8)
            self.set_policy(policy, _apply=False)
            rc = self._lib.llama_moe_cache_enable(
                self._ctx, plan.slots_per_layer, ctypes.byref(policy_to_c(self._policy)))
            if rc != bindings.RC_OK:
                self.close()
                raise CacheError(_enable_message(rc, plan))
            handle = self._lib.llama_moe_cache_core(self._ctx)
            self._cache = ExpertCache.attach(handle, n_layers=self._n_layers(),
                                             n_experts=info.n_expert, top_k=info.top_k,
                                             lib=self._lib)
            self._cache.set_event_capacity(event_ring_rows(len(info.moe_layers)))
            self._prefetch = PrefetchMeter(self._cache, info.moe_layers)
            if self._audit_every:
                self._enable_audit_slots(True)
            if plan.clamped:
                notice = plan.message
            if ram_plan is not None and (disk_experts or not ram_plan.fits_all):
                rc = self._lib.llama_moe_cache_set_ram_slots(self._ctx,
                                                             ram_plan.slots_per_layer)
                if rc != bindings.RC_OK:
                    self.close()
                    raise CacheError(_ram_message(rc, ram_plan))
            else:
                ram_plan = None
        self._lib.llama_moe_set_disk_experts(False)  # a setting for this load only
        st = p.stat()
        self._file_identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        report("warming up", 0.9)
        with loading(p):  # its first decode runs the file's numbers: a failed check blames it
            self._warm_up(short=disk_experts)
        buffer = self._lib.llama_moe_cache_expert_buffer(self._ctx) if self._cache else b""
        slots = self._lib.llama_moe_cache_slot_buffer(self._ctx) if self._cache else b""
        self.model = LoadedModel(info=info, path=p, cache_enabled=self._cache is not None,
                                 plan=plan, notice=notice, ram_note=auto_note, n_ctx=n_ctx,
                                 n_gpu_layers=n_gpu_layers, ram_plan=ram_plan,
                                 disk_experts=disk_experts,
                                 n_threads=int(getattr(self._llm, "n_threads", 0) or 0),
                                 expert_buffer=(buffer or b"").decode(errors="replace"),
                                 slot_buffer=(slots or b"").decode(errors="replace"))
        self._set_prefill_ahead()
        report("ready", 1.0)
        return self.model

    def _set_prefill_ahead(self) -> None:
        """With the experts read from the file (the RAM tier on), a prompt's prefill reads
        them through the model's mapping; the native side then has each MoE layer's experts
        read into the page cache while the layer before computes, if memory holds two
        layers' experts beside what the process takes now. With less, the layer read ahead
        evicts the one computing: at a 1,400 MB limit on a 2.65 GB model a 1,565-token
        prompt took 21-23 s with it and 74-77 s without, at 880 MB 147 s with it and 100 s
        without (``bench/prefill_bench.py``, docs/benchmarks.md)."""
        if self._cache is None or self.model is None or self.model.info is None:
            return
        info = self.model.info
        layer = max((info.bytes_per_expert[il] * info.n_expert for il in info.moe_layers),
                    default=0)
        room = self.ram_slots_per_layer > 0 and memory_limit().available >= 2 * layer
        self._lib.llama_moe_cache_set_prefill_ahead(self._ctx, room)

    def _warm_up(self, short: bool = False) -> None:
        """Decode a short prompt and one token, then forget them: the first decodes of a
        context size llama.cpp's compute buffers (~0.2-0.5 s), which would otherwise land
        in the first answer's time to first token. The cache is emptied afterwards, so
        every session starts from the same logical state. ``short``: one token only (experts
        left in the file: a batch would read them through the memory map)."""
        bos = max(int(self._llm.token_bos()), 0)
        n = 0 if short else min(16, self.n_ctx - 1)  # prompt and token fit a tiny context
        if n > 0:
            self._llm.eval([bos] * n)
        self._llm.eval([bos])
        self._llm.reset()
        bindings.clear_kv_cache(self._llm)
        self.clear_cache()

    def clear_cache(self) -> None:
        """Empty the expert cache (every slot free), zero its counters and timings and drop
        undrained event rows: the cache as right after loading, without reloading, so runs
        that must start alike (benchmarks, evaluations) can."""
        if self._cache is not None:
            self._cache.clear()
            self._cache.reset_stats()
            self._cache.drain_events()
            self._lib.llama_moe_cache_reset_timings(self._ctx)

    def _n_layers(self) -> int:
        return bindings.n_layers(self._llm)

    @property
    def _ctx(self) -> Any:
        if self._llm is None:
            raise MoEScopeError("no model is loaded")
        return bindings.context_pointer(self._llm)

    @property
    def loaded(self) -> bool:
        return self._llm is not None

    @property
    def cache(self) -> ExpertCache | None:
        return self._cache

    def close(self) -> None:
        """Free the model and its cache (the cache is owned by llama.cpp's context)."""
        self._cache = None
        self._prefetch = None
        if self._llm is not None:
            with contextlib.suppress(Exception):
                self._llm.close()
            self._llm = None
        self.model = None
        self._route_buffers = None
        self._previous = None
        self._eog_mask = None
        self._control = None
        self._turn_stops = None
        self._file_identity = None

    # ------------------------------------------------------------------ steering
    def set_policy(self, policy: Policy | str | GuardSpec | GuardController, *,
                   _apply: bool = True) -> None:
        """Switch the policy; the core applies it from the next token. The quality guard
        (a :class:`GuardSpec`, or ``guard[:target=1%...]``) starts at its base preset,
        turns audits on at its period, and then moves its policy between tokens; another
        policy ends it and its audits (back to the period last set by :meth:`set_audit`)."""
        if isinstance(policy, str):
            spec = parse_guard(policy)
            if spec is not None:
                policy = spec
        if isinstance(policy, (GuardSpec, GuardController)):  # a controller resumes as it was
            self._guard = GuardController(policy) if isinstance(policy, GuardSpec) else policy
            self._guard_held = None
            self._policy_name, self._policy = self._guard.policy.name or "guard", \
                self._guard.policy
            self._set_audit_period(self._guard.spec.every)
            if _apply and self._cache is not None:
                self._cache.set_policy(self._policy)
            return
        if self._guard is not None:  # the guard's own audits end with it
            self._set_audit_period(self._audit_outside_guard)
        self._guard = None
        self._guard_held = None
        if isinstance(policy, str):
            self._policy_name, self._policy = policy, Policy.preset(policy)
        else:
            self._policy_name, self._policy = policy.name or "custom", policy
        if _apply and self._cache is not None:
            self._cache.set_policy(self._policy)

    @property
    def policy_name(self) -> str:
        return self._policy_name

    @property
    def policy(self) -> Policy:
        return self._policy

    @property
    def guard(self) -> GuardController | None:
        """The quality guard's controller while the guard is the policy (else None)."""
        return self._guard

    def _guard_observe(self, kl: float) -> None:
        """Feed one audited KL to the guard; a new setting is applied at once (the caller
        is between tokens) and logged like any policy change, so traces record it."""
        if self._guard is None:
            return
        new = self._guard.observe(kl)
        if new is None:
            return
        self._policy = new
        if self._cache is not None:
            self._cache.set_policy(new)
        self.changes.append(self._steps_done, [Change("policy", policy=new)])

    # Requests from other threads (the GUI): queued, applied by the decode thread between
    # tokens, so a policy or budget change never lands in the middle of a token.
    def request_policy(self, policy: Policy | str | GuardSpec) -> int:
        """Thread-safe: switch policy from the next token. Returns the request's number
        (see :attr:`applied_requests`); a newer request replaces a pending one."""
        with self._requests_lock:
            self._pending_policy = policy
            self._request_count += 1
            self._pending_numbers = dataclasses.replace(self._pending_numbers,
                                                        policy=self._request_count)
            return self._request_count

    def request_budget(self, budget: str) -> int:
        """Thread-safe: resize the cache before the next token (or at the next
        :meth:`apply_requests` when idle). Returns the request's number."""
        with self._requests_lock:
            self._pending_budget = budget
            self._request_count += 1
            self._pending_numbers = dataclasses.replace(self._pending_numbers,
                                                        budget=self._request_count)
            return self._request_count

    def request_audit(self, every: int) -> None:
        """Thread-safe: audit every ``every``-th step from the next token on (0: off);
        checked now, applied by :meth:`apply_requests` like a budget."""
        every = check_every(every)
        with self._requests_lock:
            self._pending_audit = every

    def request_ram_budget(self, budget: str) -> None:
        """Thread-safe: resize the RAM tier before the next token (like the budget);
        ``"auto"`` chooses it then, as :meth:`set_ram_budget` does."""
        with self._requests_lock:
            self._pending_ram_budget = budget

    def _discard_requests(self) -> None:
        """Drop queued requests, counting them as handled (their numbers are applied)."""
        with self._requests_lock:
            self._pending_policy = self._pending_budget = self._pending_ram_budget = None
            self.applied_requests = self._pending_numbers

    def apply_requests(self) -> list[Change]:
        """Apply queued requests now (decode thread only); returns what changed, for the
        UI's markers. A failed resize keeps the previous budget and reports why."""
        with self._requests_lock:
            policy, self._pending_policy = self._pending_policy, None
            budget, self._pending_budget = self._pending_budget, None
            ram_budget, self._pending_ram_budget = self._pending_ram_budget, None
            audit, self._pending_audit = self._pending_audit, None
            numbers = self._pending_numbers
        applied = self.applied_requests
        self.applied_requests = RequestNumbers(
            policy=numbers.policy if policy is not None else applied.policy,
            budget=numbers.budget if budget is not None else applied.budget)
        changes: list[Change] = []
        if policy is not None:
            self.set_policy(policy)
            changes.append(Change("policy", policy=self._policy))
        if budget is not None and self._cache is not None:
            try:
                plan = self.set_budget(budget)
                changes.append(Change("slots", slots=plan.slots_per_layer))
            except MoEScopeError as err:
                changes.append(Change("error", text=f"budget error: {err}"))
        if ram_budget is not None and self._cache is not None:
            try:
                ram = self.set_ram_budget(ram_budget)
                auto = AUTO_CHANGE_MARK if is_auto(ram_budget) else ""
                changes.append(Change("note", text=f"ram={ram.slots_per_layer if ram else 'all'}"
                                                   f"{auto}"))
            except MoEScopeError as err:
                changes.append(Change("error", text=f"RAM budget error: {err}"))
        if audit is not None:
            try:
                self.set_audit(audit)
            except MoEScopeError as err:
                changes.append(Change("error", text=f"audit error: {err}"))
        self.changes.append(self._steps_done, changes)
        return changes

    def set_budget(self, budget: str) -> BudgetPlan:
        """Resize the cache between tokens; model, KV cache and chat are kept."""
        if self._cache is None or self.model is None or self.model.info is None:
            raise CacheError("the expert cache is off for this model")
        plan = plan_for_model(self.model.info, budget)
        rc = self._lib.llama_moe_cache_resize(self._ctx, plan.slots_per_layer)
        if rc != bindings.RC_OK:
            raise CacheError(_enable_message(rc, plan))
        self.model.plan = plan
        return plan

    def set_ram_budget(self, budget: str, *, available: int | None = None) -> BudgetPlan | None:
        """Resize the RAM tier between tokens (model, KV cache and chat kept). Returns its
        plan, or None when every expert is in host memory (tier off: only possible when
        the experts were read at load).

        ``"auto"`` (:data:`AUTO_RAM_BUDGET`) chooses as a load does, from the memory this
        process may take now (``available``: that many bytes instead) plus what the model
        holds now: every expert in RAM when the whole model fits (the tier off, or every
        expert in it when the experts stayed in the file at load), else what fits, at
        least top-k per layer; ``model.ram_note`` says why in one line. Where the tier is
        off and cannot be turned on in this load (the experts in pinned memory, which it
        would not free, or their places in the file unknown), nothing changes and the
        note says so. An explicit budget clears the note."""
        if self._cache is None or self.model is None or self.model.info is None:
            raise CacheError("the expert cache is off for this model")
        if is_auto(budget):
            return self._set_auto_ram_budget(available)
        ram_plan = self._resize_ram(budget)
        self.model.ram_note = ""
        return ram_plan

    def _set_auto_ram_budget(self, available: int | None) -> BudgetPlan | None:
        """:meth:`set_ram_budget`'s ``"auto"``."""
        m = self.model
        assert m is not None and m.info is not None
        info = m.info
        slot_bytes = m.plan.bytes_used if m.plan is not None and \
            _slots_in_ram(m.n_gpu_layers, m.slot_buffer) else 0
        experts = info.total_expert_bytes if m.ram_plan is None else m.ram_plan.bytes_used
        held = info.non_expert_bytes + kv_cache_bytes(info, m.n_ctx) + slot_bytes + experts
        budget, note = auto_ram_budget(info, m.n_ctx, available, slot_bytes, held=held,
                                       live=True)
        if budget is None:  # the whole model fits: every expert in RAM, as a load keeps it
            ram_plan = self._resize_ram(str(info.n_expert))
        elif m.ram_plan is None and (why := self._no_live_tier()):
            note = (f"RAM budget auto: {budget} of {info.n_expert} experts per layer fit the "
                    f"memory available now, but {why}: every expert stays in host memory "
                    f"(reopen the model for a RAM tier)")
            ram_plan = None
        else:
            ram_plan = self._resize_ram(budget)
        m.ram_note = note
        return ram_plan

    def _no_live_tier(self) -> str:
        """Why this load cannot turn a RAM tier on now ("" when it can)."""
        assert self.model is not None
        if self.model.pinned_experts:
            return "its experts were read into pinned memory at load, which a RAM tier " \
                   "would not free"
        if not self._lib.llama_moe_cache_disk_capable(self._ctx):
            return "the experts' places in the model file are unknown to this load"
        return ""

    def _resize_ram(self, budget: str) -> BudgetPlan | None:
        """Set the RAM tier to ``budget`` (explicit); its plan, None for the tier off."""
        assert self.model is not None and self.model.info is not None
        ram_plan = _ram_plan(self.model.info, budget)
        off = ram_plan.fits_all and not self.model.disk_experts
        rc = self._lib.llama_moe_cache_set_ram_slots(
            self._ctx, 0 if off else ram_plan.slots_per_layer)
        if rc != bindings.RC_OK:
            raise CacheError(_ram_message(rc, ram_plan))
        self.model.ram_plan = None if off else ram_plan
        self._set_prefill_ahead()
        return self.model.ram_plan

    @property
    def ram_slots_per_layer(self) -> int:
        """RAM-tier experts per layer (0: the tier is off, every expert in host memory)."""
        return int(self._lib.llama_moe_cache_ram_slots(self._ctx)) if self._cache else 0

    def set_fail_reads(self, after: int) -> None:
        """Test hook: reads of the model file fail (EIO) after ``after`` more (-1: never)."""
        self._lib.llama_moe_cache_set_fail_reads(self._ctx, after)

    def _check_disk(self) -> None:
        """With experts read from the file: raise :class:`DiskReadError` when a read failed
        or the file is no longer the one loaded (deleted, replaced, truncated, rewritten).
        The KV cache and the cache's residency are dropped (their bytes may be wrong), so
        the next answer starts clean once the model is reloaded."""
        if self.model is None or self.model.ram_plan is None:
            return
        buf = ctypes.create_string_buffer(512)
        message = ""
        if self._lib.llama_moe_cache_io_error(self._ctx, buf, len(buf)):
            message = buf.value.decode(errors="replace")
        else:
            try:
                st = self.model.path.stat()
                now = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
            except OSError:
                now = None
            if now != self._file_identity:
                message = ("the model file was deleted or replaced since it was loaded"
                           if now is None or now[:2] != (self._file_identity or now)[:2]
                           else "the model file changed on disk since it was loaded")
        if not message:
            return
        self._lib.llama_moe_cache_clear_io_error(self._ctx)
        self._llm.reset()
        self._llm._ctx.kv_cache_clear()
        self._previous = None
        raise DiskReadError(f"{self.model.path.name}: {message}; reload the model")

    @property
    def audit_every(self) -> int:
        """Audits: every Nth decode step is also computed exactly (0: off)."""
        return self._audit_every

    def set_audit(self, every: int) -> None:
        """Audit every ``every``-th decode step (0: off; between answers or from the decode
        thread). Each audited step is decoded twice: first exactly (every miss fetched into
        scratch slots outside the cache, the model's memory of it removed), then by the
        policy as always, so tokens, decisions and traces are the same with audits on or
        off; the step's :class:`TokenStats` carries the comparison
        (:class:`~moescope.cache.audit.AuditRecord`). Costs top-k scratch slots per layer.
        It is also the period audits return to when the quality guard, which sets its own,
        is left for another policy."""
        self._set_audit_period(every)
        self._audit_outside_guard = self._audit_every

    def _set_audit_period(self, every: int) -> None:
        every = check_every(every)
        if self._cache is not None and bool(every) != bool(self._audit_every):
            self._enable_audit_slots(bool(every))
        self._audit_every = every

    def _enable_audit_slots(self, on: bool) -> None:
        rc = self._lib.llama_moe_cache_set_audit(self._ctx, 1 if on else 0)
        if rc != bindings.RC_OK:
            raise CacheError("out of memory allocating the audits' scratch slots (top-k "
                             "experts per layer); audits stay off" if rc == bindings.RC_ALLOC_FAILED
                             else f"audits could not be turned {'on' if on else 'off'} "
                             f"(code {rc})")

    def audit_timings(self) -> tuple[int, int]:
        """Audits' total microseconds in the route op and scratch copies made."""
        if self._cache is None:
            return 0, 0
        us, copies = ctypes.c_int64(0), ctypes.c_int64(0)
        self._lib.llama_moe_cache_audit_timings(self._ctx, ctypes.byref(us), ctypes.byref(copies))
        return int(us.value), int(copies.value)

    @property
    def slots_per_layer(self) -> int:
        return int(self._lib.llama_moe_cache_n_slots(self._ctx)) if self._cache else 0

    def set_copy_delay(self, max_us: int) -> None:
        """Test hook: each expert copy first sleeps up to ``max_us`` µs (decisions unchanged)."""
        self._lib.llama_moe_cache_set_copy_delay(self._ctx, max_us)

    def timings(self) -> dict[str, int]:
        out = bindings.MoeCacheTimings()
        self._lib.llama_moe_cache_get_timings(self._ctx, ctypes.byref(out))
        return out.as_dict()

    def layer_stats(self) -> dict[int, LayerStats]:
        if self._cache is None or self.model is None or self.model.info is None:
            return {}
        return {il: self._cache.layer_stats(il) for il in self.model.info.moe_layers}

    def last_route(self, layer: int) -> tuple[npt.NDArray[np.float32],
                                              npt.NDArray[np.float32],
                                              npt.NDArray[np.int32]] | None:
        """Router inputs of ``layer``'s latest decoded token: full probabilities, gate
        weights before the cache's decision, selected ids. Traces record them so that a
        replay through the core makes exactly the engine's decisions."""
        if self._cache is None or self.model is None or self.model.info is None:
            return None
        info = self.model.info
        probs = np.empty(info.n_expert, dtype=np.float32)
        weights = np.empty(info.top_k, dtype=np.float32)
        ids = np.empty(info.top_k, dtype=np.int32)
        f32 = ctypes.POINTER(ctypes.c_float)
        rc = self._lib.llama_moe_cache_last_route(
            self._ctx, layer, probs.ctypes.data_as(f32), weights.ctypes.data_as(f32),
            ids.ctypes.data_as(ctypes.POINTER(ctypes.c_int32)))
        return (probs, weights, ids) if rc == 0 else None

    def last_routes(self, layers: Sequence[int]) -> tuple[
            npt.NDArray[np.float32], npt.NDArray[np.float32], npt.NDArray[np.int32],
            npt.NDArray[np.bool_]] | None:
        """:meth:`last_route` of several layers at once, as fresh arrays ``(probs [n,
        experts], weights [n, top-k], ids [n, top-k], found [n])``: the trace recorder
        reads every MoE layer after every token, and a call per layer with its own arrays
        and pointers was most of what recording cost the engine's thread."""
        buf = self._routes_buffers()
        if buf is None:
            return None
        found = np.zeros(len(layers), dtype=np.bool_)
        read, ctx = self._lib.llama_moe_cache_last_route, self._ctx
        for j, layer in enumerate(layers):
            if 0 <= layer < len(buf.route_ptrs):
                found[j] = read(ctx, layer, *buf.route_ptrs[layer]) == 0
        rows = np.clip(np.asarray(layers, dtype=np.intp), 0, len(buf.route_ptrs) - 1)
        return buf.probs[rows], buf.weights[rows], buf.ids[rows], found

    def last_predictions(self, layers: Sequence[int]) -> tuple[
            npt.NDArray[np.int32], npt.NDArray[np.float32]] | None:
        """:meth:`last_prediction` of several layers at once: ``(next_layer [n], scores [n,
        experts])``, fresh arrays; ``next_layer`` is 0 or less where there is none."""
        buf = self._routes_buffers()
        if buf is None:
            return None
        nxt = np.zeros(len(layers), dtype=np.int32)
        read, ctx = self._lib.llama_moe_cache_last_prediction, self._ctx
        n_expert = buf.scores.shape[1]
        for j, layer in enumerate(layers):
            if 0 <= layer < len(buf.score_ptrs):
                nxt[j] = read(ctx, layer, buf.score_ptrs[layer], n_expert)
        rows = np.clip(np.asarray(layers, dtype=np.intp), 0, len(buf.score_ptrs) - 1)
        return nxt, buf.scores[rows]

    def _routes_buffers(self) -> _RouteBuffers | None:
        """Arrays the batch reads fill, a row per layer, with their pointers made once per
        loaded model (what ``ctypes`` spends most of a call on)."""
        if self._cache is None or self.model is None or self.model.info is None:
            return None
        if self._route_buffers is None:
            info = self.model.info
            self._route_buffers = _RouteBuffers(max(info.moe_layers, default=0) + 1,
                                                info.n_expert, info.top_k)
        return self._route_buffers

    def last_prediction(self, layer: int) -> tuple[int, npt.NDArray[np.float32]] | None:
        """PSR: the next MoE layer and its router's scores as predicted at ``layer`` for the
        latest decoded token (what ``prefetch`` ranked), or None. Traces keep the ranking
        so a replay can prefetch exactly as the engine did."""
        if self._cache is None or self.model is None or self.model.info is None:
            return None
        scores = np.empty(self.model.info.n_expert, dtype=np.float32)
        nxt = self._lib.llama_moe_cache_last_prediction(
            self._ctx, layer, scores.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            scores.size)
        return (int(nxt), scores) if nxt > 0 else None

    def drain_events(self) -> npt.NDArray[Any]:
        if self._cache is None:
            return np.zeros(0, dtype=EVENT_DTYPE)
        return self._cache.drain_events()

    # ------------------------------------------------------------------ text
    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        return list(self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(self._llm.detokenize(list(tokens))).decode("utf-8", errors="replace")

    @property
    def chat_template(self) -> str | None:
        """The model's chat template (GGUF ``tokenizer.chat_template``), if it has one."""
        template = self._llm.metadata.get("tokenizer.chat_template")
        return template or None

    def format_chat(self, messages: Sequence[Message | dict[str, str]],
                    thinking: str = "default", *,
                    tools: Sequence[dict[str, Any]] | None = None) -> str:
        """The model's own chat template (GGUF ``tokenizer.chat_template``), else a plain
        one; ``thinking`` sets the template's thinking switch (see ``Sampling.thinking``);
        ``tools`` (OpenAI's function tools) go to the template's ``tools`` variable."""
        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content}
                for m in messages]
        template = self._llm.metadata.get("tokenizer.chat_template")
        if template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            eos = self._token_text(self._llm.token_eos())
            bos = self._token_text(self._llm.token_bos())
            try:
                return Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)(
                    messages=msgs, tools=list(tools) if tools else None,
                    **template_variables(thinking)).prompt
            except Exception as err:  # the template is the model's code, not ours
                raise ChatTemplateError(
                    f"the model's chat template refused this conversation: "
                    f"{first_line(err)}") from err
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in msgs]
        return "\n".join(lines) + "\nAssistant:"

    def thinking_choices(self) -> tuple[str, ...]:
        """The thinking settings the model's chat template understands ("default" first)."""
        return thinking_choices(self._llm.metadata.get("tokenizer.chat_template"))

    def answer_prefix(self, thinking: str = "default") -> str:
        """Text the chat template puts at the start of every answer under the thinking
        setting ``thinking``: ``"<think>\\n"`` for templates that open the reasoning in the
        prompt (Qwen3 *Thinking*, Qwen3.5 unless thinking is off), else "". Prepended to
        stored answers so their reasoning splits like any other model's."""
        try:
            return reasoning_prefix(self.format_chat([{"role": "user", "content": "Hi"}],
                                                     thinking))
        except Exception:  # a template that fails here fails (and says why) at generate
            return ""

    @property
    def n_vocab(self) -> int:
        """Tokens in the model's vocabulary (ids 0 to ``n_vocab - 1``)."""
        return int(self._llm.n_vocab())

    @property
    def n_ctx(self) -> int:
        """Tokens the conversation may use: the context size asked for. llama.cpp may pad
        its context beyond it, but llama-cpp-python's token buffer has the size asked for,
        and a prompt longer than that buffer fails inside ``eval``."""
        return min(self._llm.n_ctx(), int(self._llm.context_params.n_ctx))

    def chat_tokens(self, messages: Sequence[Message | dict[str, str]],
                    thinking: str = "default", answer_start: str = "", *,
                    seen: dict[str, bool] | None = None,
                    tools: Sequence[dict[str, Any]] | None = None) -> ChatTokens:
        """The conversation's prompt tokens: the template's markup with its special tokens,
        the users' and tools' words as words (see :mod:`moescope.engine.chat_tokens`), then
        ``answer_start`` (ours: special tokens parsed); ``tools`` as :meth:`format_chat`
        takes them (the caller checks that they hold no control token's text:
        :meth:`holds_control`)."""
        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content}
                for m in messages]
        return chat_tokens(msgs, (lambda ms: self.format_chat(ms, thinking, tools=tools))
                           if tools else (lambda ms: self.format_chat(ms, thinking)),
                           lambda text, bos, special: self.tokenize(text, add_bos=bos,
                                                                    special=special),
                           answer_start, seen, self._holds_control)

    def holds_control(self, text: str) -> bool:
        """Whether ``text`` holds a control token's text (``<|im_end|>``) that special-token
        parsing would read as the token."""
        return self._holds_control(text)

    def _holds_control(self, text: str) -> bool:
        """Whether ``text`` tokenizes to a control token when special tokens are parsed:
        none of their first characters in it, no tokenizing (a long pasted text without
        ``<`` costs a scan); else one tokenizing, its ids looked up."""
        if self._control is None:
            self._control = bindings.control_tokens(self._llm)
        ids, firsts = self._control
        if firsts.isdisjoint(text):
            return False
        return any(t in ids for t in self.tokenize(text, add_bos=False, special=True))

    def fit_conversation(self, messages: Sequence[Message | dict[str, str]], *,
                         room: int, thinking: str = "default",
                         answer_start: str = "") -> tuple[list[int], int]:
        """The prompt's tokens, leaving out the earliest turns while the prompt leaves less
        than ``room`` tokens of the context for the answer (a rolling window: the system
        prompt and the last user message always stay; a turn is a user message with the
        answers after it, so roles keep alternating, as some templates require).

        Returns the tokens and how many messages were left out. A conversation whose last
        turn alone does not fit is returned whole: the caller says it does not fit.
        """
        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content}
                for m in messages]
        head = [m for m in msgs[:1] if m["role"] == "system"]
        body = msgs[len(head):]
        limit = self.n_ctx - room
        dropped = 0
        seen: dict[str, bool] = {}
        while True:
            tokens = self.chat_tokens(head + body, thinking, answer_start, seen=seen).tokens
            starts = [i for i, m in enumerate(body) if m["role"] == "user"]
            if len(tokens) <= limit or len(starts) < 2:
                return tokens, dropped
            dropped += starts[1]
            body = body[starts[1]:]

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        return bindings.token_piece(self._llm, token)

    def _is_eog(self, token: int) -> bool:
        """End of generation: EOS, any token the vocabulary marks as end-of-turn, or a
        control token that opens a turn in the chat template (:meth:`turn_stops`)."""
        return bindings.is_end_of_generation(self._vocab, token) or token in self.turn_stops()

    def turn_stops(self) -> frozenset[int]:
        """The control tokens that open a new turn in the model's chat template and that
        llama.cpp does not count as an end of generation: ChatML's ``<|im_start|>``
        (Qwen's vocabularies mark only ``<|im_end|>`` and ``<|endoftext|>``), Gemma's
        ``<start_of_turn>``, Llama 3's ``<|start_header_id|>``, GLM's ``<|user|>``... A
        model that writes one mid-answer has begun a turn of its own (``assistant``,
        then a made-up exchange): the answer ends there. Only a marker of
        :data:`TURN_STARTS` that the template writes, that is one token and a control
        token (only the template's markup gives it, never a text) counts: harmony's
        ``<|start|>`` is not one (gpt-oss writes it between its channels)."""
        if self._turn_stops is None:
            template = self._llm.metadata.get("tokenizer.chat_template") or ""
            if self._control is None:
                self._control = bindings.control_tokens(self._llm)
            ids = self._control[0]
            voc = bindings.vocab(self._llm)
            stops = set()
            for marker in TURN_STARTS:
                if marker not in template:
                    continue
                tokens = self.tokenize(marker, add_bos=False, special=True)
                if len(tokens) == 1 and tokens[0] in ids \
                        and not bindings.is_end_of_generation(voc, tokens[0]):
                    stops.add(tokens[0])
            self._turn_stops = frozenset(stops)
        return self._turn_stops

    # ------------------------------------------------------------------ generation
    def stop(self) -> None:
        """Ask a running generation to stop after the current token (any thread)."""
        self._stop.set()

    def cancel_load(self) -> None:
        """Any thread: end a running :meth:`load` at llama.cpp's next progress step (it
        raises :class:`LoadCancelled`, nothing loaded); no effect on a later load."""
        self._cancel_load.set()

    def generate(self, prompt: str | Sequence[Message | dict[str, str]] | ChatTokens,
                 sampling: Sampling | None = None, *,
                 answer_start: str = "") -> Iterator[TokenStats]:
        """Stream tokens with per-token cache stats; the last item's ``AnswerStats`` is in
        :attr:`last_answer`. The prompt's shared prefix with the previous call is reused
        from the KV cache (no re-prefill of the conversation). The end-of-generation token
        is not yielded, but the step that chose it was governed: its stats are
        ``last_answer.end_step`` (a trace records them with ``TraceRecorder.end_answer``).

        ``answer_start`` (messages only): text the answer already has, written after the
        template's generation prompt; the model continues from there. "Answer now" uses it
        to close a thinking model's thoughts and have it answer (``model.reasoning``).
        """
        s = sampling or Sampling()
        if s.max_tokens < 1:  # the loop checks the count after a token: 0 would give one
            raise MoEScopeError(f"max_tokens is {s.max_tokens}: ask for at least 1 token")
        if s.logprobs is not None and not 0 <= s.logprobs <= MAX_TOP:
            raise MoEScopeError(f"logprobs is {s.logprobs}: ask for 0 to {MAX_TOP} "
                                "alternatives per token")
        check_sampling(s)
        bias = self._bias(s.logit_bias) if s.logit_bias else None
        n_ctx = self.n_ctx
        dropped = 0
        if isinstance(prompt, ChatTokens):  # a conversation tokenized already, whole
            tokens = list(prompt.tokens)
        elif isinstance(prompt, str):
            tokens = self.tokenize(prompt, add_bos=True, special=True)
            if not tokens:  # an empty prompt of a model that adds no BOS (Qwen3 ...)
                bos = int(self._llm.token_bos())
                if bos < 0:
                    raise MoEScopeError("the prompt is empty and the model has no "
                                        "beginning-of-text token to start from; give a prompt")
                tokens = [bos]  # as llama.cpp's own CLI does: generate from BOS
        else:
            room = min(s.max_tokens, n_ctx // 4)
            tokens, dropped = self.fit_conversation(prompt, room=room, thinking=s.thinking,
                                                    answer_start=answer_start)
            if answer_start and not dropped:
                tokens = self._continuation(prompt, room, s.thinking, answer_start) or tokens
        if len(tokens) >= n_ctx:
            if isinstance(prompt, (str, ChatTokens)):
                raise MoEScopeError(f"the conversation ({len(tokens)} tokens) does not fit "
                                    f"the context of {n_ctx} tokens")
            # the earlier turns were left out already: the last one alone is too long
            raise MoEScopeError(f"your last message needs {len(tokens)} tokens with the chat "
                                f"template, so it does not fit the context of {n_ctx} "
                                f"tokens: shorten it, or use a larger context")
        self._check_disk()  # before a prefill reads the file through its memory map
        self._stop.clear()
        if s.seed is not None:
            self._llm.set_seed(s.seed)
        answer = AnswerStats(n_prompt_tokens=len(tokens), policies=[self._policy_name],
                             dropped_messages=dropped, n_cached_tokens=self._reusable(tokens),
                             ram_tier=self.model is not None and self.model.ram_plan is not None)
        self.last_answer = answer
        self.drain_events()  # rows from earlier calls are not this answer's
        t0 = time.perf_counter()
        t_prev = t0
        pending = b""
        out_tokens: list[int] = []
        self._vocab = bindings.vocab(self._llm)  # once, not per token
        if self._guard_held is not None:
            held, self._guard_held = self._guard_held, None
            self._guard_observe(held)
        self.apply_requests()
        grammar = s.grammar
        xtc = (s.xtc_probability, s.xtc_threshold) \
            if s.xtc_probability > 0 and s.xtc_threshold <= 0.5 and not s.mirostat else None
        if grammar is not None:  # with the settings of the chain that samples after its mask
            # (XTC and mirostat: a chain its proof does not model, so the whole vocabulary)
            grammar.claim(temperature=None if xtc or s.mirostat else s.temperature,
                          top_k=s.top_k,
                          repeat_penalty=s.repeat_penalty,
                          penalty_last_n=int(self._llm.last_n_tokens_size),
                          frequency_penalty=s.frequency_penalty,
                          presence_penalty=s.presence_penalty)
        self._llm.moescope_xtc = xtc  # read when generate makes its sampler chain
        processors: list[Any] = []
        if bias is not None:
            processors.append(bias)
        if grammar is not None:
            processors.append(grammar.mask)
        gen = self._llm.generate(tokens, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
                                 temp=s.temperature, repeat_penalty=s.repeat_penalty,
                                 frequency_penalty=s.frequency_penalty,
                                 presence_penalty=s.presence_penalty, reset=True,
                                 mirostat_mode=s.mirostat, mirostat_tau=s.mirostat_tau,
                                 mirostat_eta=s.mirostat_eta,
                                 logits_processor=processors or None)
        stop_reason = "length"
        exact: npt.NDArray[np.float32] | None = None  # the audited step's exact logits
        try:
            for token in gen:
                self._check_disk()  # a token decoded from bytes that failed is not shown
                now = time.perf_counter()
                self._steps_done += 1
                pair = None  # an audited step: (exact logits, the policy's)
                if exact is not None:
                    pair = (exact, self._policy_logits())
                    exact = None
                if grammar is not None and grammar.failed:
                    raise GrammarError(f"the grammar could not be applied ({grammar.failed})")
                if self._is_eog(token):
                    # at a dead end the grammar let only the end through: nothing fitted
                    stop_reason = "grammar" if grammar is not None and grammar.dead_end \
                        else "eos"
                    answer.end_step = self._end_step(answer, token, len(out_tokens),
                                                      now - t_prev, pair)
                    if answer.end_step.audit is not None:  # a trace records that step
                        self._guard_held = answer.end_step.audit.kl  # later: next answer's
                    break
                if grammar is not None:
                    if grammar.dead_end:  # and the vocabulary has no end token
                        stop_reason = "grammar"
                        break
                    grammar.accept(int(token))
                out_tokens.append(token)
                context = tokens + out_tokens[:-1]
                raw = bytes(self._llm.detokenize([token], prev_tokens=context))
                # read before anything decodes again: the logits ``token`` was sampled from
                logprob = None if s.logprobs is None else self._logprob(int(token), raw,
                                                                        s.logprobs)
                pending += raw
                piece, pending = _split_utf8(pending)
                rows = self.drain_events()
                totals = CacheTotals.from_events(rows, tokens=1)
                if len(out_tokens) == 1:
                    answer.time_to_first_token_s = now - t0
                answer.cache.add(totals)
                audit = None
                if pair is not None:
                    audit = compare(*pair, int(token), totals.substituted_mass)
                    answer.audits.append(audit)
                if self._policy_name not in answer.policies:
                    answer.policies.append(self._policy_name)
                answer.n_tokens = len(out_tokens)
                answer.seconds = now - t0
                yield TokenStats(index=len(out_tokens) - 1, token_id=int(token), text=piece,
                                 seconds=now - t_prev, cache=totals, policy=self._policy_name,
                                 slots_per_layer=self.slots_per_layer, events=rows,
                                 prefetch=self._prefetch.take() if self._prefetch else None,
                                 audit=audit, logprob=logprob)
                t_prev = now
                if audit is not None:  # after the token is out: its change is the next's
                    self._guard_observe(audit.kl)
                if self._stop.is_set():
                    stop_reason = "stopped"
                    break
                self.apply_requests()  # before the next token is decoded
                if len(out_tokens) >= s.max_tokens:
                    stop_reason = "length"
                    break
                if len(tokens) + len(out_tokens) >= n_ctx - 1:
                    stop_reason = "context full"
                    break
                if self._audit_every and self._cache is not None and \
                        len(out_tokens) % self._audit_every == 0:
                    # the next step (decoding this token) is audited: its exact pass first
                    exact = bindings.audit_decode(self._llm, int(token), int(self._llm.n_tokens))
        finally:
            gen.close()
            if grammar is not None:
                grammar.close()
            answer.stop_reason = stop_reason
            answer.seconds = time.perf_counter() - t0
            self._previous = (tokens, out_tokens)

    def _bias(self, bias: dict[int, float]) -> Callable[[Any, npt.NDArray[np.float32]],
                                                     npt.NDArray[np.float32]]:
        """A logits processor adding ``bias`` (token ids checked against the vocabulary
        here: one past it is a :class:`MoEScopeError` before anything decodes)."""
        n_vocab = self.n_vocab
        if len(bias) > MAX_LOGIT_BIAS:
            raise MoEScopeError(f"logit_bias has {len(bias)} tokens; at most {MAX_LOGIT_BIAS}")
        wrong = [t for t in bias if t >= n_vocab]
        if wrong:
            raise MoEScopeError(f"logit_bias has token {wrong[0]}; this model's tokens are "
                                f"0 to {n_vocab - 1}")
        ids = np.fromiter(bias, dtype=np.int64, count=len(bias))
        values = np.fromiter(bias.values(), dtype=np.float32, count=len(bias))

        def add(_input_ids: Any, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
            logits[ids] += values
            return logits
        return add

    def compile_grammar(self, text: str) -> Grammar:
        """``text`` (GBNF) compiled for the loaded vocabulary, for one answer's
        :attr:`Sampling.grammar`. Any thread (it reads the vocabulary only); a grammar
        llama.cpp cannot use raises :class:`GrammarError` here, never in generation."""
        if self._llm is None:
            raise MoEScopeError("no model is loaded")
        from moescope.engine.grammar import check_grammar

        check_grammar(text)
        n_vocab = int(self._llm.n_vocab())
        if self._eog_mask is None or len(self._eog_mask) != n_vocab:
            voc = bindings.vocab(self._llm)
            self._eog_mask = np.array([bindings.is_end_of_generation(voc, t)
                                       for t in range(n_vocab)], dtype=bool)
        return Grammar(bindings.vocab(self._llm), n_vocab, text, self._eog_mask)

    def _reusable(self, tokens: Sequence[int]) -> int:
        """Prompt tokens ``Llama.generate`` will take from the KV cache rather than
        prefill: the prefix shared with the tokens it holds, less the last prompt token
        when that prefix is the whole prompt (it is decoded again for fresh logits)."""
        held = int(self._llm.n_tokens)
        if held <= 0:
            return 0
        n = 0
        for a, b in zip(self._llm.input_ids[:held], tokens, strict=False):
            if a != b:
                break
            n += 1
        if n == len(tokens):
            return n if held == n and not bindings.logits_stale(self._llm) else n - 1
        return n

    def _policy_logits(self) -> npt.NDArray[np.float32]:
        """A copy of the last decode's logits: the policy's pass of an audited step, which
        the shipped token was sampled from."""
        n_vocab = int(self._llm.n_vocab())
        return np.ctypeslib.as_array(bindings.last_logits(self._llm), shape=(n_vocab,)).copy()

    def _logprob(self, token: int, piece: bytes, n_top: int) -> TokenLogprob:
        """``token``'s log-probability under the last decode's logits (the ones it was
        sampled from, after the cache policy) and the ``n_top`` likeliest tokens there."""
        n_vocab = int(self._llm.n_vocab())
        logits = np.ctypeslib.as_array(bindings.last_logits(self._llm), shape=(n_vocab,))
        lp, top = log_probabilities(logits, token, n_top)
        return TokenLogprob(lp, piece, tuple(
            Alternative(t, piece if t == token else self._piece(t), p) for t, p in top))

    def _piece(self, token: int) -> bytes:
        """``token``'s bytes as an answer would have them; a control token (which the
        answer would not show) as its vocabulary text."""
        return bytes(self._llm.detokenize([token])) or \
            bytes(self._llm.detokenize([token], special=True))

    def _end_step(self, answer: AnswerStats, token: int, index: int,
                  seconds: float,
                  pair: tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]] | None = None
                  ) -> TokenStats:
        """The step that chose the end-of-generation ``token``: the decode of the answer's
        last token was governed, so its rows wait in the ring. Drained here, into the
        answer's totals and :attr:`AnswerStats.end_step`; left there, the next answer's
        first drain would discard them and a trace would lack the step."""
        rows = self.drain_events()
        totals = CacheTotals.from_events(rows, tokens=1)
        answer.cache.add(totals)
        audit = None
        if pair is not None:
            audit = compare(*pair, token, totals.substituted_mass)
            answer.audits.append(audit)
        return TokenStats(index=index, token_id=int(token), text="", seconds=seconds,
                          cache=totals, policy=self._policy_name,
                          slots_per_layer=self.slots_per_layer, events=rows,
                          prefetch=self._prefetch.take() if self._prefetch else None,
                          audit=audit)

    def _continuation(self, prompt: Sequence[Message | dict[str, str]], room: int,
                      thinking: str, answer_start: str) -> list[int] | None:
        """The tokens to continue the previous answer with (``answer_start`` = its text
        plus what the caller added, e.g. "Answer now"'s closing of the thoughts): the
        previous prompt and the very tokens the model generated, then the added text.
        Tokenizing the whole text again would split the generated part differently (BPE
        merges across token boundaries), and the KV cache would be reused only up to the
        first difference: the rest of a long chain of thoughts read again, in batches the
        expert cache does not govern. None when the previous call was not this answer's
        beginning (another prompt, or its text is not how ``answer_start`` begins)."""
        if self._previous is None:
            return None
        before, generated = self._previous
        base, dropped = self.fit_conversation(prompt, room=room, thinking=thinking)
        if dropped or base != before:
            return None
        text = self._llm.detokenize(generated, prev_tokens=before).decode("utf-8", "replace")
        if not answer_start.startswith(text):
            return None
        rest = answer_start[len(text):]
        return [*before, *generated,
                *(self.tokenize(rest, add_bos=False, special=True) if rest else [])]

    # ------------------------------------------------------------------ teacher forcing
    def forced_logits(self, prompt_tokens: Sequence[int],
                      forced_tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Logits after each forced token, decoding one token at a time (the cache governs
        every step; a wide batch would bypass it). Row i is the distribution after
        ``prompt + forced[:i+1]``. Used by exactness tests and ``moescope eval``."""
        self._llm.reset()
        bindings.clear_kv_cache(self._llm)
        n_vocab = self._llm.n_vocab()
        self._llm.eval(list(prompt_tokens))
        out = np.empty((len(forced_tokens), n_vocab), dtype=np.float32)
        for i, tok in enumerate(forced_tokens):
            self._llm.eval([int(tok)])
            ptr = bindings.last_logits(self._llm)
            out[i] = np.ctypeslib.as_array(ptr, shape=(n_vocab,))
        return out


def _split_utf8(data: bytes) -> tuple[str, bytes]:
    """Decode the complete UTF-8 prefix; keep a trailing partial character for later."""
    for cut in range(len(data), max(len(data) - 4, -1), -1):
        try:
            return data[:cut].decode("utf-8"), data[cut:]
        except UnicodeDecodeError:
            continue
    return data.decode("utf-8", errors="replace"), b""


class _RouteBuffers:
    """:meth:`Engine.last_routes`' arrays (a row per layer) and each row's pointers."""

    def __init__(self, n_layers: int, n_expert: int, top_k: int) -> None:
        self.probs = np.zeros((n_layers, n_expert), dtype=np.float32)
        self.weights = np.zeros((n_layers, top_k), dtype=np.float32)
        self.ids = np.zeros((n_layers, top_k), dtype=np.int32)
        self.scores = np.zeros((n_layers, n_expert), dtype=np.float32)
        f32, i32 = ctypes.POINTER(ctypes.c_float), ctypes.POINTER(ctypes.c_int32)

        def rows(a: npt.NDArray[Any], kind: Any) -> list[Any]:
            return [ctypes.cast(a.ctypes.data + i * a.strides[0], kind) for i in range(len(a))]

        self.route_ptrs = list(zip(rows(self.probs, f32), rows(self.weights, f32),
                                   rows(self.ids, i32), strict=True))
        self.score_ptrs = rows(self.scores, f32)


def _slots_in_ram(n_gpu_layers: int | None, slot_buffer: str = "") -> bool:
    """The expert slots take host memory: no layer on a GPU, a CPU build, a GPU build that
    sees no GPU, or an integrated GPU (its memory is the machine's RAM). ``slot_buffer``:
    llama.cpp's name for a loaded model's slot buffer ("CPU": in RAM), where known."""
    from moescope.engine.backend import engine_build
    from moescope.engine.devices import slot_device

    if n_gpu_layers == 0 or engine_build().backend == "cpu" or \
            slot_buffer.upper().startswith("CPU"):
        return True
    device = slot_device()
    return device is None or device.host_memory


def auto_ram_budget(info: ModelInfo, n_ctx: int, available: int | None = None,
                    slot_bytes: int = 0, held: int = 0,
                    live: bool = False) -> tuple[str | None, str]:
    """``(ram_budget, note)`` for :data:`AUTO_RAM_BUDGET`: ``(None, "")`` when the whole
    model fits in ``available`` bytes (default: what this process may take now), else the
    experts per layer that fit and one line saying so. ``slot_bytes``: expert slots that
    take host memory too (a CPU build's). ``held``: bytes the loaded model holds now,
    available to it too (a live choice: the memory it would have with nothing loaded);
    ``live``: a line also when everything fits (the user asked, so it is said)."""
    limit = memory_limit() if available is None else None
    free = (limit.available if limit is not None else int(available or 0)) + max(0, held)
    n = ram_start_experts(info, n_ctx, available=free, slot_bytes=slot_bytes)
    if n >= info.n_expert and not live:
        return None, ""
    need = host_bytes_needed(info, n_ctx, slot_bytes)
    where = ""
    if limit is not None and limit.group is not None and limit.group_limit is not None:
        where = f" (memory cgroup {limit.group}: limit {format_bytes(limit.group_limit)})"
    if held > 0:
        where += f", counting the {format_bytes(held)} it holds now"
    head = (f"{info.path.name} needs about {format_bytes(need)} of memory (with its KV cache "
            f"and working buffers) and {format_bytes(free)} is available{where}: ")
    if n >= info.n_expert:
        return None, head + f"all {info.n_expert} experts per layer stay in RAM"
    return str(n), head + (
        f"{n} of {info.n_expert} experts per layer "
        f"stay in RAM and the others are read from the model file when routed to (a RAM "
        f"budget sets it: --ram-budget, /ram, or the RAM budget slider)")


def _ram_plan(info: ModelInfo | None, budget: str) -> BudgetPlan:
    """The RAM tier's experts per layer for ``budget`` (the budget grammar of the slots);
    a budget below one token's experts (top-k in every layer) is refused."""
    from moescope.util.errors import BudgetError

    if info is None:
        raise CacheError("a RAM budget needs a model with routed experts")
    ram = plan_for_model(info, budget)
    if ram.clamped and ram.slots_per_layer == ram.top_k and ram.budget_bytes < ram.bytes_used:
        raise BudgetError(
            f"RAM budget {budget.strip()} ({format_bytes(ram.budget_bytes)}) cannot hold one "
            f"token's experts: the minimum is {format_bytes(ram.bytes_used)} (top-k = "
            f"{ram.top_k} experts in each of {ram.n_moe_layers} layers)")
    return ram


def _ram_message(rc: int, plan: BudgetPlan) -> str:
    if rc == bindings.RC_NOT_MOE:
        return "the experts' places in the model file are unknown; reload the model"
    if rc == bindings.RC_ALLOC_FAILED:
        return (f"out of memory allocating a RAM tier of {plan.slots_per_layer} experts per "
                f"layer ({plan.bytes_used / 2**30:.2f} GiB); the previous one is kept")
    return f"{plan.slots_per_layer} RAM experts per layer is outside [top-k, experts]"


def _enable_message(rc: int, plan: BudgetPlan) -> str:
    if rc == bindings.RC_NOT_MOE:
        return "this model has no routed experts in host layout; the expert cache is off"
    if rc == bindings.RC_BAD_SLOTS:
        return (f"{plan.slots_per_layer} slots per layer is outside [top-k={plan.top_k}, "
                f"experts={plan.n_expert}]")
    if rc == bindings.RC_ALLOC_FAILED:
        return (f"out of memory allocating {plan.slots_per_layer} expert slots per layer "
                f"({plan.bytes_used / 2**30:.2f} GiB); the previous budget is kept — try "
                "a smaller budget")
    return f"the expert cache failed (code {rc})"


@contextlib.contextmanager
def _quiet_stderr() -> Iterator[None]:
    """llama.cpp prints load logs to fd 2 even with verbose=False; hide them unless
    MOESCOPE_DEBUG is set (errors still surface as exceptions)."""
    if os.environ.get("MOESCOPE_DEBUG"):
        yield
        return
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, 2)
        with contextlib.redirect_stderr(io.StringIO()):  # llama_cpp's Python log callback
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
