"""ctypes bindings to the llama.h functions our patch adds (``llama_moe_*``).

They live in the same ``libllama.so`` that ``llama_cpp`` loads, so we declare them on
``llama_cpp.llama_cpp._lib`` rather than opening a second copy. The cache's policy, counters
and events are reached through the core's own C API (:mod:`moescope.cache.native`) on the
handle ``llama_moe_cache_core`` returns: one implementation, shared with the simulator.

The end of this module is also the one place the engine reaches past ``llama_cpp.Llama``'s
public API (its ``_ctx`` and ``_model`` wrappers, its ``_init_sampler`` and the way it
encodes a model path), each function with its reason, so an upgrade of llama-cpp-python
that renames them breaks here and nowhere else.
"""

from __future__ import annotations

import ctypes
from typing import Any

from moescope.util.errors import MoEScopeError

# return codes of llama_moe_cache_enable / _resize (see engine_patch/0002)
RC_OK = 0
RC_NOT_MOE = -1
RC_BAD_SLOTS = -2
RC_ALLOC_FAILED = -3
RC_ALREADY_ENABLED = -4


class EngineNotPatchedError(MoEScopeError):
    """The installed llama_cpp is stock: it has no expert cache."""


class MoeCacheTimings(ctypes.Structure):
    """``struct llama_moe_cache_timings``: where the time of the cache went (µs)."""

    _fields_ = [
        ("route_us", ctypes.c_int64),
        ("sync_copy_us", ctypes.c_int64),
        ("async_copy_us", ctypes.c_int64),
        ("wait_us", ctypes.c_int64),
        ("n_sync", ctypes.c_int64),
        ("n_async", ctypes.c_int64),
        ("disk_us", ctypes.c_int64),
        ("n_disk_reads", ctypes.c_int64),
        ("disk_bytes", ctypes.c_int64),
        ("n_readahead", ctypes.c_int64),
        ("n_readahead_used", ctypes.c_int64),
        ("n_prefill_ahead", ctypes.c_int64),
    ]

    def as_dict(self) -> dict[str, int]:
        return {name: int(getattr(self, name)) for name, _ in self._fields_}


_declared: Any = None


def engine_library() -> Any:
    """The llama library of the installed ``llama_cpp``, with our functions declared."""
    global _declared
    if _declared is not None:
        return _declared
    try:
        from llama_cpp import llama_cpp as low
    except ImportError as err:  # pragma: no cover - depends on the installation
        raise EngineNotPatchedError(
            f"llama_cpp is not installed ({err}); run `make engine`") from err
    lib = low._lib
    if not hasattr(lib, "llama_moe_cache_enable"):
        raise EngineNotPatchedError(
            "the installed llama_cpp has no MoEScope expert cache (stock build?); "
            "run `make engine` to install the patched one")
    vp, i32, i64 = ctypes.c_void_p, ctypes.c_int32, ctypes.c_int64
    signatures: dict[str, tuple[Any, list[Any]]] = {
        "llama_moe_set_host_experts": (None, [ctypes.c_bool]),
        "llama_moe_cache_enable": (i32, [vp, i32, vp]),
        "llama_moe_cache_resize": (i32, [vp, i32]),
        "llama_moe_cache_disable": (None, [vp]),
        "llama_moe_cache_core": (vp, [vp]),
        "llama_moe_cache_n_slots": (i32, [vp]),
        "llama_moe_cache_expert_bytes": (i64, [vp, i32]),
        "llama_moe_cache_set_max_tokens": (None, [vp, i32]),
        "llama_moe_cache_set_copy_delay": (None, [vp, i32]),
        "llama_moe_cache_set_prefill_ahead": (None, [vp, ctypes.c_bool]),
        "llama_moe_cache_get_timings": (None, [vp, ctypes.POINTER(MoeCacheTimings)]),
        "llama_moe_cache_reset_timings": (None, [vp]),
        "llama_moe_cache_last_route": (i32, [vp, i32, ctypes.POINTER(ctypes.c_float),
                                             ctypes.POINTER(ctypes.c_float),
                                             ctypes.POINTER(ctypes.c_int32)]),
        "llama_moe_cache_last_prediction": (i32, [vp, i32, ctypes.POINTER(ctypes.c_float), i32]),
        "llama_moe_cache_expert_buffer": (ctypes.c_char_p, [vp]),
        "llama_moe_set_disk_experts": (None, [ctypes.c_bool]),
        "llama_moe_cache_set_ram_slots": (i32, [vp, i32]),
        "llama_moe_cache_ram_slots": (i32, [vp]),
        "llama_moe_cache_disk_capable": (i32, [vp]),
        "llama_moe_cache_io_error": (i32, [vp, ctypes.c_char_p, i32]),
        "llama_moe_cache_clear_io_error": (None, [vp]),
        "llama_moe_cache_set_fail_reads": (None, [vp, i64]),
        "llama_moe_cache_slot_buffer": (ctypes.c_char_p, [vp]),
        "llama_moe_cache_set_audit": (i32, [vp, i32]),
        "llama_moe_cache_audit_pass": (i32, [vp, i32]),
        "llama_moe_cache_audit_timings": (None, [vp, ctypes.POINTER(i64),
                                                 ctypes.POINTER(i64)]),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name, None)
        if fn is None:  # an engine built from an older patch
            raise EngineNotPatchedError(
                f"the installed engine lacks {name} (built from an older patch); run "
                "`make engine` to rebuild it")
        fn.restype = restype
        fn.argtypes = argtypes
    _declared = lib
    return lib


def is_patched() -> bool:
    """True when the installed llama_cpp carries the MoEScope expert cache."""
    try:
        engine_library()
    except EngineNotPatchedError:
        return False
    return True


# ---------------------------------------------- llama-cpp-python internals, in one place


def context_pointer(llm: Any) -> Any:
    """The ``llama_context *`` of ``llm``: our ``llama_moe_*`` functions and llama.h's
    ``llama_get_logits_ith`` take it, and ``Llama`` has no public accessor for it."""
    return llm._ctx.ctx


def model_pointer(llm: Any) -> Any:
    """The ``llama_model *`` of ``llm`` (no public accessor): for llama.h's model queries
    (the layer count, the vocabulary)."""
    return llm._model.model


def logits_stale(llm: Any) -> bool:
    """Whether ``Llama.generate`` must decode again before it can sample (its logits were
    restored, not decoded): then even a fully cached prompt has its last token decoded
    again, which the count of reused prompt tokens must know."""
    return bool(getattr(llm, "_requires_eval", True))


def clear_kv_cache(llm: Any) -> None:
    """Empty ``llm``'s KV cache. ``Llama.reset()`` only rewinds its token count, which
    leaves the memory of the warm-up (or of a scoring pass) behind."""
    llm._ctx.kv_cache_clear()


def token_piece(llm: Any, token: int) -> str:
    """The vocabulary's text of ``token`` as stored (special tokens included), which
    ``Llama.detokenize`` renders differently or drops: the chat template needs the real
    BOS/EOS strings."""
    text = llm._model.token_get_text(token)
    return text.decode("utf-8", errors="replace") if isinstance(text, bytes) else str(text)


def n_layers(llm: Any) -> int:
    """The model's layer count (llama.h's ``llama_model_n_layer``)."""
    from llama_cpp import llama_cpp as low  # loaded by then: llm exists

    return int(low.llama_model_n_layer(model_pointer(llm)))


def vocab(llm: Any) -> Any:
    """The model's ``llama_vocab *`` (llama.h), for :func:`is_end_of_generation`."""
    from llama_cpp import llama_cpp as low

    return low.llama_model_get_vocab(model_pointer(llm))


def control_tokens(llm: Any) -> tuple[frozenset[int], frozenset[str]]:
    """The vocabulary's tokens that only special-token parsing produces (control and
    unknown: llama.cpp matches user-defined ones either way), and the first characters of
    their texts."""
    from llama_cpp import llama_cpp as low

    voc = vocab(llm)
    mask = low.LLAMA_TOKEN_ATTR_CONTROL | low.LLAMA_TOKEN_ATTR_UNKNOWN
    ids = [t for t in range(int(low.llama_vocab_n_tokens(voc)))
           if int(low.llama_vocab_get_attr(voc, t)) & mask]
    firsts = {text[0] for text in (token_piece(llm, t) for t in ids) if text}
    return frozenset(ids), frozenset(firsts)


def is_end_of_generation(vocab_ptr: Any, token: int) -> bool:
    """EOS or any token the vocabulary marks as end-of-turn."""
    from llama_cpp import llama_cpp as low

    return bool(low.llama_vocab_is_eog(vocab_ptr, token))


def last_logits(llm: Any) -> Any:
    """A pointer to the logits of ``llm``'s last decoded token (``llama_get_logits_ith``)."""
    from llama_cpp import llama_cpp as low

    return low.llama_get_logits_ith(context_pointer(llm), -1)



def audit_decode(llm: Any, token: int, pos: int) -> Any:
    """The exact logits of decoding ``token`` at ``pos`` (sequence 0) beside the policy's
    own pass, leaving the model's memory as it was: the audit pass (every miss in a scratch
    slot, no logical cache change: ``engine_patch/0004``) is decoded first, then its cell at
    ``pos`` is removed, and a recurrent state (hybrid models) is restored from a copy taken
    before, since recurrent memory cannot be rolled back a token. Goes around ``Llama.eval``
    so that llama-cpp-python's token count, scores and sampler never see the pass."""
    import numpy as np
    from llama_cpp import llama_cpp as low

    lib = engine_library()
    ctx = context_pointer(llm)
    model = model_pointer(llm)
    partial = bool(low.llama_model_is_recurrent(model) or low.llama_model_is_hybrid(model))
    flags = low.LLAMA_STATE_SEQ_FLAGS_PARTIAL_ONLY
    saved = None
    if partial:
        size = int(low.llama_state_seq_get_size_ext(ctx, 0, flags))
        saved = (ctypes.c_uint8 * size)()
        if int(low.llama_state_seq_get_data_ext(ctx, saved, size, 0, flags)) != size:
            raise MoEScopeError("could not save the recurrent state before an audit")
    batch = low.llama_batch_init(1, 0, 1)
    if lib.llama_moe_cache_audit_pass(ctx, 1) != 0:
        low.llama_batch_free(batch)
        raise MoEScopeError("audits are not enabled on this engine's cache")
    try:
        batch.n_tokens = 1
        batch.token[0] = int(token)
        batch.pos[0] = int(pos)
        batch.n_seq_id[0] = 1
        batch.seq_id[0][0] = 0
        batch.logits[0] = 1
        rc = int(low.llama_decode(ctx, batch))
        if rc != 0:
            raise MoEScopeError(f"the audit pass failed to decode (llama_decode returned {rc})")
        n_vocab = int(llm.n_vocab())
        logits = np.ctypeslib.as_array(low.llama_get_logits_ith(ctx, -1),
                                       shape=(n_vocab,)).copy()
    finally:
        lib.llama_moe_cache_audit_pass(ctx, 0)
        low.llama_batch_free(batch)
        if saved is not None:
            low.llama_state_seq_set_data_ext(ctx, saved, len(saved), 0, flags)
        low.llama_memory_seq_rm(low.llama_get_memory(ctx), 0, int(pos), -1)
    return logits


class FilePath(str):
    """A file path as ``llama_cpp.Llama(model_path=...)`` takes it, whose bytes reach
    llama.cpp's ``char *`` as the file system has them. llama-cpp-python passes
    ``model_path.encode("utf-8")`` (``_internals.LlamaModel``): a name that is not UTF-8,
    which Python holds as lone surrogates (``surrogateescape``), raised UnicodeEncodeError
    there, and the model could not be loaded. Here ``encode`` gives ``os.fsencode``'s bytes,
    which for a UTF-8 name are the same as before."""

    def encode(self, encoding: str = "utf-8", errors: str = "strict") -> bytes:
        import os
        import sys

        return str.encode(str(self), sys.getfilesystemencoding(),
                          "surrogateescape" if os.name == "posix" else errors)


def model_path_argument(path: Any) -> str:
    """``path`` (a ``Path``) for ``Llama(model_path=...)``: a plain ``str`` where it is
    UTF-8, else a :class:`FilePath` (its bytes as the file system has them)."""
    text = str(path)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return FilePath(text)
    return text


_llama_type: Any = None


def llama_type() -> Any:
    """``llama_cpp.Llama`` with the samplers its chain lacks, as llama.cpp's own chain has
    them (``common_sampler_init``):

    - XTC ("exclude top choices", ``llama_sampler_init_xtc``), after min-p and before the
      temperature, also at temperature 0 (before the greedy pick: what llama.cpp's chain
      does, whose temperature 0 keeps the likeliest of what XTC left);
    - mirostat 1 and 2 after a temperature sampler (llama-cpp-python left the temperature
      out, so a mirostat answer ignored it).

    Set per answer before ``generate`` in the instance's ``moescope_xtc`` ((probability,
    threshold), or None: off). It overrides ``Llama._init_sampler``, private: the one
    place the chain is made; it builds llama-cpp-python's chain, then moves its tail
    (``llama_sampler_chain_remove`` hands a sampler back, ``_add`` appends it again)."""
    global _llama_type
    if _llama_type is not None:
        return _llama_type
    import llama_cpp
    from llama_cpp import llama_cpp as low

    class MoeLlama(llama_cpp.Llama):  # type: ignore[misc]
        moescope_xtc: tuple[float, float] | None = None

        def _init_sampler(self, *args: Any, **kwargs: Any) -> Any:
            sampler = super()._init_sampler(*args, **kwargs)
            temp = float(kwargs.get("temp", 0.8))
            mirostat = int(kwargs.get("mirostat_mode", 0))
            chain = sampler.sampler
            if temp > 0 and mirostat in (1, 2):  # [.., mirostat] -> [.., temp, mirostat]
                tail = _take_tail(low, chain, 1)
                sampler.add_temp(temp)
                for s in tail:
                    low.llama_sampler_chain_add(chain, s)
            elif self.moescope_xtc is not None and temp >= 0 and mirostat == 0:
                p, t = self.moescope_xtc
                # [.., min_p, temp, dist] -> [.., min_p, xtc, temp, dist]; [.., greedy] ->
                # [.., xtc, greedy]
                tail = _take_tail(low, chain, 2 if temp > 0 else 1)
                sampler.add_xtc(p, t, 1, self._seed)
                for s in tail:
                    low.llama_sampler_chain_add(chain, s)
            return sampler

    _llama_type = MoeLlama
    return _llama_type


def _take_tail(low: Any, chain: Any, n: int) -> list[Any]:
    """The chain's last ``n`` samplers, removed (the caller owns them until it adds them
    back), in their order."""
    size = int(low.llama_sampler_chain_n(chain))
    if size < n:
        raise MoEScopeError(f"llama-cpp-python's sampler chain has {size} samplers, fewer "
                            f"than the {n} expected at its end")
    return [low.llama_sampler_chain_remove(chain, size - n) for _ in range(n)]
