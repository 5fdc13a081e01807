"""The Engine: one loaded model, its expert cache, and streaming generation.

Headless on purpose (no Qt): the CLI, the tests, the evaluation tool and the GUI's worker
thread all drive this one class. It owns a ``llama_cpp.Llama`` whose libllama carries our
patch; the expert cache lives inside llama.cpp's context and is steered through
``llama_moe_*`` (bindings.py) and the core's C API on the handle the context exposes.

Threading: every method runs on the thread that owns the engine, except :meth:`stop`,
which only sets a flag read between tokens (GPT4All's atomic stop).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.core.budget import BudgetPlan, plan_for_model
from moescope.core.errors import MoEScopeError, NotMoEError
from moescope.core.gguf_info import ModelInfo, read_model_info
from moescope.core.native import ExpertCache, LayerStats
from moescope.core.policy import Policy
from moescope.engine import bindings
from moescope.engine.stats import AnswerStats, CacheTotals, TokenStats

ProgressFn = Callable[[str, float], None]


class ModelLoadError(MoEScopeError):
    """llama.cpp could not load the model (corrupt tensors, out of memory, ...)."""


class CacheError(MoEScopeError):
    """The expert cache could not be set up or resized; the previous state is kept."""


@dataclass
class Sampling:
    """Sampling settings of one answer; temperature 0 means greedy."""

    temperature: float = 0.7
    top_p: float = 0.95
    top_k: int = 40
    min_p: float = 0.05
    repeat_penalty: float = 1.1
    max_tokens: int = 256
    seed: int | None = None


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


@dataclass
class Message:
    role: str
    content: str


class Engine:
    """Load a GGUF MoE model with the expert cache, generate, steer policy and budget."""

    def __init__(self) -> None:
        self._llm: Any = None
        self._cache: ExpertCache | None = None
        self._lib: Any = None
        self.model: LoadedModel | None = None
        self._stop = threading.Event()
        self._policy_name = "exact"
        self._policy: Policy = Policy.preset("exact")
        self.last_answer = AnswerStats()

    # ------------------------------------------------------------------ loading
    def load(self, path: str | os.PathLike[str], *, budget: str = "25%",
             policy: Policy | str = "quality-first", n_gpu_layers: int = 0,
             n_ctx: int = 2048, n_threads: int | None = None, cache: bool = True,
             progress: ProgressFn | None = None) -> LoadedModel:
        """Load ``path``; the expert cache is on for MoE models unless ``cache=False``.

        A dense model loads with the cache off and says so in ``LoadedModel.notice``. A
        file that is not a GGUF raises ``ModelFormatError`` before llama.cpp sees it.
        """
        report = progress or (lambda stage, frac: None)
        self.close()
        p = Path(path)
        report("reading metadata", 0.0)
        notice = ""
        info: ModelInfo | None
        try:
            info = read_model_info(p)
        except NotMoEError as err:
            info, cache, notice = None, False, f"{err}; loaded with the expert cache off"
        self._lib = bindings.engine_library()
        self._lib.llama_moe_set_host_experts(bool(cache))
        report("loading weights", 0.1)
        import llama_cpp  # deferred: loading the shared library takes a moment

        try:
            with _quiet_stderr():
                self._llm = llama_cpp.Llama(
                    model_path=str(p), n_ctx=n_ctx, n_gpu_layers=n_gpu_layers,
                    n_threads=n_threads, verbose=False, logits_all=False)
        except (ValueError, RuntimeError, OSError) as err:
            raise ModelLoadError(f"llama.cpp could not load {p.name}: {err}") from err
        plan = None
        if cache and info is not None:
            report("allocating expert slots", 0.8)
            plan = plan_for_model(info, budget)
            self.set_policy(policy, _apply=False)
            rc = self._lib.llama_moe_cache_enable(
                self._ctx, plan.slots_per_layer, ctypes.byref(self._policy.to_c()))
            if rc != bindings.RC_OK:
                self.close()
                raise CacheError(_enable_message(rc, plan))
            handle = self._lib.llama_moe_cache_core(self._ctx)
            self._cache = ExpertCache.attach(handle, n_layers=self._n_layers(),
                                             n_experts=info.n_expert, top_k=info.top_k,
                                             lib=self._lib)
            self._cache.set_event_capacity(1 << 16)
            if plan.clamped:
                notice = plan.message
        self.model = LoadedModel(info=info, path=p, cache_enabled=self._cache is not None,
                                 plan=plan, notice=notice, n_ctx=n_ctx,
                                 n_gpu_layers=n_gpu_layers)
        report("ready", 1.0)
        return self.model

    def _n_layers(self) -> int:
        from llama_cpp import llama_cpp as low

        return int(low.llama_model_n_layer(self._llm._model.model))

    @property
    def _ctx(self) -> Any:
        if self._llm is None:
            raise MoEScopeError("no model is loaded")
        return self._llm._ctx.ctx

    @property
    def loaded(self) -> bool:
        return self._llm is not None

    @property
    def cache(self) -> ExpertCache | None:
        return self._cache

    def close(self) -> None:
        """Free the model and its cache (the cache is owned by llama.cpp's context)."""
        self._cache = None
        if self._llm is not None:
            with contextlib.suppress(Exception):
                self._llm.close()
            self._llm = None
        self.model = None

    # ------------------------------------------------------------------ steering
    def set_policy(self, policy: Policy | str, *, _apply: bool = True) -> None:
        """Switch the policy; the core applies it from the next token."""
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

    def drain_events(self) -> npt.NDArray[Any]:
        if self._cache is None:
            from moescope.core.native import EVENT_DTYPE

            return np.zeros(0, dtype=EVENT_DTYPE)
        return self._cache.drain_events()

    # ------------------------------------------------------------------ text
    def tokenize(self, text: str, *, add_bos: bool = True, special: bool = True) -> list[int]:
        return list(self._llm.tokenize(text.encode("utf-8"), add_bos=add_bos, special=special))

    def detokenize(self, tokens: Sequence[int]) -> str:
        return bytes(self._llm.detokenize(list(tokens))).decode("utf-8", errors="replace")

    def format_chat(self, messages: Sequence[Message | dict[str, str]]) -> str:
        """The model's own chat template (GGUF ``tokenizer.chat_template``), else a plain one."""
        msgs = [m if isinstance(m, dict) else {"role": m.role, "content": m.content}
                for m in messages]
        template = self._llm.metadata.get("tokenizer.chat_template")
        if template:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            eos = self._token_text(self._llm.token_eos())
            bos = self._token_text(self._llm.token_bos())
            return Jinja2ChatFormatter(template=template, eos_token=eos, bos_token=bos)(
                messages=msgs).prompt
        lines = [f"{m['role'].capitalize()}: {m['content']}" for m in msgs]
        return "\n".join(lines) + "\nAssistant:"

    def _token_text(self, token: int) -> str:
        if token < 0:
            return ""
        text = self._llm._model.token_get_text(token)
        return text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)

    def _is_eog(self, token: int, eos: set[int]) -> bool:
        """End of generation: EOS, or any token the vocabulary marks as end-of-turn."""
        from llama_cpp import llama_cpp as low

        if token in eos:
            return True
        vocab = low.llama_model_get_vocab(self._llm._model.model)
        return bool(low.llama_vocab_is_eog(vocab, token))

    # ------------------------------------------------------------------ generation
    def stop(self) -> None:
        """Ask a running generation to stop after the current token (any thread)."""
        self._stop.set()

    def generate(self, prompt: str | Sequence[Message | dict[str, str]],
                 sampling: Sampling | None = None) -> Iterator[TokenStats]:
        """Stream tokens with per-token cache stats; the last item's ``AnswerStats`` is in
        :attr:`last_answer`. The prompt's shared prefix with the previous call is reused
        from the KV cache (no re-prefill of the conversation)."""
        s = sampling or Sampling()
        text = prompt if isinstance(prompt, str) else self.format_chat(prompt)
        tokens = self.tokenize(text, add_bos=True, special=True)
        n_ctx = self._llm.n_ctx()
        if len(tokens) >= n_ctx:
            raise MoEScopeError(f"the conversation ({len(tokens)} tokens) does not fit the "
                                f"context of {n_ctx} tokens")
        self._stop.clear()
        if s.seed is not None:
            self._llm.set_seed(s.seed)
        answer = AnswerStats(n_prompt_tokens=len(tokens), policies=[self._policy_name])
        self.last_answer = answer
        self.drain_events()  # rows from earlier calls are not this answer's
        t0 = time.perf_counter()
        t_prev = t0
        pending = b""
        out_tokens: list[int] = []
        eos = {self._llm.token_eos()}
        gen = self._llm.generate(tokens, top_k=s.top_k, top_p=s.top_p, min_p=s.min_p,
                                 temp=s.temperature, repeat_penalty=s.repeat_penalty,
                                 reset=True)
        stop_reason = "length"
        try:
            for token in gen:
                now = time.perf_counter()
                if self._is_eog(token, eos):
                    stop_reason = "eos"
                    break
                out_tokens.append(token)
                context = tokens + out_tokens[:-1]
                pending += bytes(self._llm.detokenize([token], prev_tokens=context))
                piece, pending = _split_utf8(pending)
                rows = self.drain_events()
                totals = CacheTotals.from_events(rows, tokens=1)
                if len(out_tokens) == 1:
                    answer.time_to_first_token_s = now - t0
                answer.cache.add(totals)
                if self._policy_name not in answer.policies:
                    answer.policies.append(self._policy_name)
                answer.n_tokens = len(out_tokens)
                answer.seconds = now - t0
                yield TokenStats(index=len(out_tokens) - 1, token_id=int(token), text=piece,
                                 seconds=now - t_prev, cache=totals, policy=self._policy_name,
                                 slots_per_layer=self.slots_per_layer, events=rows)
                t_prev = now
                if self._stop.is_set():
                    stop_reason = "stopped"
                    break
                if len(out_tokens) >= s.max_tokens:
                    stop_reason = "length"
                    break
                if len(tokens) + len(out_tokens) >= n_ctx - 1:
                    stop_reason = "context full"
                    break
        finally:
            gen.close()
            answer.stop_reason = stop_reason
            answer.seconds = time.perf_counter() - t0

    # ------------------------------------------------------------------ teacher forcing
    def forced_logits(self, prompt_tokens: Sequence[int],
                      forced_tokens: Sequence[int]) -> npt.NDArray[np.float32]:
        """Logits after each forced token, decoding one token at a time (the cache governs
        every step; a wide batch would bypass it). Row i is the distribution after
        ``prompt + forced[:i+1]``. Used by exactness tests and ``moescope eval``."""
        from llama_cpp import llama_cpp as low

        self._llm.reset()
        self._llm._ctx.kv_cache_clear()
        n_vocab = self._llm.n_vocab()
        self._llm.eval(list(prompt_tokens))
        out = np.empty((len(forced_tokens), n_vocab), dtype=np.float32)
        for i, tok in enumerate(forced_tokens):
            self._llm.eval([int(tok)])
            ptr = low.llama_get_logits_ith(self._ctx, -1)
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
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)
