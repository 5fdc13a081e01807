"""Deterministic synthetic Mixture-of-Experts GGUF models, from tiny test fixtures to
benchmark-sized files.

Tests need real models that llama.cpp loads in milliseconds; benchmarks need models whose
expert bytes have the shape of real ones (Qwen3-30B-A3B, a copy-bound layout) without
downloading tens of gigabytes. Both are produced here from a :class:`SynthSpec`: seeded
random weights scaled so that every projection keeps unit-variance activations (no NaN or
inf in the logits), a real byte-level BPE tokenizer with a ChatML template, and the tensor
names, shapes and metadata keys that the vendored llama.cpp (commit 0c1e570) requires for
each architecture (see ``src/models/<arch>.cpp`` there).

Architectures (``SynthSpec.arch``):

* ``qwen3moe``, ``olmoe`` — softmax routing, plain gate/up/down experts;
* ``gpt-oss`` — biases on router and experts, SOFTMAX_WEIGHT gating, attention sinks,
  alternating sliding-window attention;
* ``deepseek2`` — MLA attention, sigmoid gating with an ``exp_probs_b`` selection bias, a
  shared expert and ``n_dense_lead`` leading dense layers;
* ``mixtral`` — written as arch ``llama`` with ``expert_count > 0``;
* ``qwen3next`` — hybrid gated-delta-net linear attention and gated full attention, with a
  gated shared expert, optionally a merged ``ffn_gate_up_exps``;
* ``qwen35moe`` — Qwen3.5's MoE: qwen3next's layout with the delta net's beta and alpha as
  two projections and interleaved multimodal RoPE sections;
* ``glm4moe`` — GLM-4.5: q/k/v biases, half-rotary heads, a leading dense layer, sigmoid
  gating with an ``exp_probs_b`` selection bias and a shared expert, and a last NextN (MTP)
  block whose experts llama.cpp leaves unloaded;
* ``qwen3`` and ``llama`` — dense models (``n_expert == 0``) for negative tests.

Tensors are streamed to disk one expert at a time, so even multi-gigabyte presets need
little memory; each tensor's values depend only on ``(seed, tensor name)``, so changing one
dimension does not reshuffle unrelated tensors.

Long (about 800 lines) because every synthetic architecture's writer is here, side by
side: they differ in a few tensors each, and one file keeps the fixtures comparable.

CLI::

    python -m moescope_testing.synth --arch qwen3moe --preset tiny --out x.gguf
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import math
import os
import sys
import uuid
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, ExpertGatingFuncType, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

from moescope_testing.vocab import Vocab, build_vocab

MOE_ARCHES: tuple[str, ...] = ("qwen3moe", "olmoe", "gpt-oss", "deepseek2", "mixtral", "qwen3next",
                               "glm4moe", "qwen35moe")
DENSE_ARCHES: tuple[str, ...] = ("qwen3", "llama")
ARCHES: tuple[str, ...] = MOE_ARCHES + DENSE_ARCHES

# SynthSpec.arch -> general.architecture written to the file.
_GGUF_ARCH: dict[str, str] = {a: a for a in ARCHES} | {"mixtral": "llama"}

_QTYPES: dict[str, GGMLQuantizationType] = {
    "f32": GGMLQuantizationType.F32,
    "f16": GGMLQuantizationType.F16,
    "q8_0": GGMLQuantizationType.Q8_0,
    "q4_0": GGMLQuantizationType.Q4_0,
    "mxfp4": GGMLQuantizationType.MXFP4,  # how gpt-oss ships its experts
    "q4_k": GGMLQuantizationType.Q4_K,
    "q6_k": GGMLQuantizationType.Q6_K,
}
_MIXES: dict[str, tuple[GGMLQuantizationType, GGMLQuantizationType]] = {
    # (gate and up, down): llama.cpp's Q4_K_M keeps the down projection at Q6_K, so one
    # expert spans two types, as in the Qwen3-30B-A3B-Q4_K_M files users run
    "q4_k_m": (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q6_K),
}
EXPERT_TYPES: tuple[str, ...] = (*_QTYPES, *_MIXES)
WEIGHT_TYPES: tuple[str, ...] = ("f32", "f16")

_F32 = GGMLQuantizationType.F32


@dataclass(frozen=True)
class SynthSpec:
    """Everything that determines a synthetic model file, byte for byte.

    Dimensions use the GGUF/llama.cpp meaning: ``n_ff_exp`` is the width of one routed
    expert, ``n_ff`` the width of a dense FFN (dense models and deepseek2's leading dense
    layers), ``head_dim`` the per-head query/key size. Fields that only one architecture
    reads are grouped at the end and ignored by the others.
    """

    arch: str = "qwen3moe"
    n_layers: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    head_dim: int = 16
    n_expert: int = 16
    top_k: int = 4
    n_ff_exp: int = 32
    n_ff: int = 64
    vocab_size: int = 320
    ctx: int = 512
    expert_type: str = "f32"
    weight_type: str = "f32"
    seed: int = 0
    router_scale: float = 1.0
    name: str | None = None
    add_bos: bool = False
    """Whether the tokenizer adds BOS (``tokenizer.ggml.add_bos_token``), as Llama's do."""
    chat_template: str | None = None
    """None: the vocabulary's ChatML template (``vocab.THINKING_CHAT_TEMPLATE`` opens a
    reasoning block in the prompt, as Qwen3 Thinking models do)."""
    # deepseek2, qwen3next/qwen35moe and glm4moe: shared expert width is n_shared_experts *
    # n_ff_exp.
    n_shared_experts: int = 1
    # deepseek2 and glm4moe: leading dense layers; deepseek2: MLA ranks (qk_nope = head_dim
    # - qk_rope_dim).
    n_dense_lead: int = 1
    q_lora_rank: int = 32
    kv_lora_rank: int = 32
    qk_rope_dim: int = 8
    # deepseek2 and qwen3next/qwen35moe: one merged ffn_gate_up_exps tensor, not gate + up.
    merged_gate_up: bool = False
    # gpt-oss: window of the sliding-window layers (every other layer).
    sliding_window: int = 64
    # qwen3next/qwen35moe: every full_attn_interval-th layer is full attention, the rest
    # linear.
    full_attn_interval: int = 2
    ssm_conv_kernel: int = 4
    ssm_state: int = 16
    ssm_k_heads: int = 2
    ssm_v_heads: int = 4
    # glm4moe and qwen3next/qwen35moe: the last n_nextn of the n_layers blocks are
    # multi-token prediction (NextN) blocks with experts of their own, which llama.cpp does
    # not load unless asked to (qwen3next's is a full-attention block).
    n_nextn: int = 0

    def __post_init__(self) -> None:
        self.validate()

    @property
    def gguf_arch(self) -> str:
        """The ``general.architecture`` value (``mixtral`` is written as ``llama``)."""
        return _GGUF_ARCH[self.arch]

    @property
    def is_moe(self) -> bool:
        return self.n_expert > 0

    @property
    def moe_layers(self) -> tuple[int, ...]:
        """Indices of the layers that route tokens to experts (a glm4moe NextN block has
        expert tensors in the file too, but llama.cpp's decoder never runs it)."""
        if not self.is_moe:
            return ()
        first = self.n_dense_lead if self.arch in ("deepseek2", "glm4moe") else 0
        return tuple(range(first, self.n_layers - self.n_nextn))

    def replace(self, **changes: Any) -> SynthSpec:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def validate(self) -> None:
        """Reject specs that llama.cpp would refuse or that cannot be quantized."""
        errors: list[str] = []
        if self.arch not in ARCHES:
            errors.append(f"arch must be one of {', '.join(ARCHES)}, got {self.arch!r}")
        if self.expert_type not in EXPERT_TYPES:
            errors.append(f"expert_type must be one of {', '.join(EXPERT_TYPES)}")
        if self.weight_type not in WEIGHT_TYPES:
            errors.append(f"weight_type must be one of {', '.join(WEIGHT_TYPES)}")
        for field in ("n_layers", "n_embd", "n_head", "n_head_kv", "head_dim", "vocab_size",
                      "ctx"):
            if getattr(self, field) <= 0:
                errors.append(f"{field} must be > 0")
        if errors:
            raise ValueError("; ".join(errors))
        if self.n_head % self.n_head_kv:
            errors.append("n_head must be a multiple of n_head_kv")
        if self.arch in DENSE_ARCHES:
            if self.n_expert != 0:
                errors.append(f"{self.arch} is a dense architecture: n_expert must be 0")
        else:
            if self.n_expert <= 0:
                errors.append(f"{self.arch} needs n_expert > 0")
            if not 0 < self.top_k <= self.n_expert:
                errors.append("top_k must be in [1, n_expert]")
            if self.n_ff_exp <= 0:
                errors.append("n_ff_exp must be > 0")
        if self.expert_type not in ("f32", "f16") and self.is_moe:
            block = max(GGML_QUANT_SIZES[t][0] for t in _expert_qtypes(self.expert_type))
            if self.n_embd % block or self.n_ff_exp % block:
                errors.append(
                    f"{self.expert_type} experts need n_embd and n_ff_exp to be multiples "
                    f"of {block}"
                )
        full_width = self.n_head * self.head_dim == self.n_embd
        if self.arch in ("olmoe", "mixtral", "llama") and not full_width:
            errors.append(f"{self.arch} needs n_head * head_dim == n_embd")
        if self.arch == "olmoe" and self.n_head_kv != self.n_head:
            errors.append("olmoe normalizes K with an n_embd-sized weight: n_head_kv == n_head")
        if self.arch == "deepseek2":
            if not 0 < self.qk_rope_dim < self.head_dim:
                errors.append("deepseek2 needs 0 < qk_rope_dim < head_dim")
            if self.qk_rope_dim % 2:
                errors.append("deepseek2 needs an even qk_rope_dim")
            if not 0 <= self.n_dense_lead < self.n_layers:
                errors.append("deepseek2 needs 0 <= n_dense_lead < n_layers")
            if self.kv_lora_rank <= 0 or self.q_lora_rank < 0:
                errors.append("deepseek2 needs kv_lora_rank > 0 and q_lora_rank >= 0")
        if self.arch in ("qwen3next", "qwen35moe"):
            # llama.cpp's hybrid memory asserts when either kind of layer is absent.
            if not 2 <= self.full_attn_interval <= self.n_layers - self.n_nextn:
                errors.append(f"{self.arch} needs 2 <= full_attn_interval <= n_layers, so that "
                              "there are both linear and full attention layers")
            if self.ssm_v_heads % self.ssm_k_heads:
                errors.append("ssm_v_heads must be a multiple of ssm_k_heads")
        if self.arch == "glm4moe" and not 0 <= self.n_dense_lead < self.n_layers - self.n_nextn:
            errors.append("glm4moe needs 0 <= n_dense_lead < n_layers - n_nextn (at least one "
                          "MoE layer before the NextN blocks)")
        if self.n_nextn > 1:
            errors.append("llama.cpp runs at most one NextN block (n_nextn <= 1)")
        if self.n_nextn and self.arch not in ("glm4moe", "qwen3next", "qwen35moe"):
            errors.append("n_nextn is only read by glm4moe, qwen3next and qwen35moe")
        if self.n_nextn < 0:
            errors.append("n_nextn must be >= 0")
        if self.merged_gate_up and self.arch not in ("deepseek2", "qwen3next", "qwen35moe"):
            errors.append("merged_gate_up is only read by deepseek2 and qwen3next")
        if self.head_dim % 2:
            errors.append("head_dim must be even (RoPE)")
        if errors:
            raise ValueError("; ".join(errors))


# --------------------------------------------------------------------------- presets

def _tiny() -> dict[str, Any]:
    """Two layers (three for deepseek2), 16 experts, top-4: about 1 MB, loads in milliseconds."""
    return {}


def _copy_bound() -> dict[str, Any]:
    """Experts dominate every byte and every copy: 16 layers x 128 experts of 1.6 MiB (q8_0)."""
    return dict(
        n_layers=16, n_embd=1024, n_head=8, n_head_kv=4, head_dim=128, n_expert=128, top_k=8,
        n_ff_exp=512, n_ff=2048, vocab_size=512, ctx=4096, expert_type="q8_0",
        weight_type="f16", q_lora_rank=256, kv_lora_rank=256, qk_rope_dim=32,
        sliding_window=128, ssm_state=64, ssm_k_heads=4, ssm_v_heads=8, full_attn_interval=4,
    )


def _qwen3_30b_a3b_like() -> dict[str, Any]:
    """Qwen3-30B-A3B's expert geometry: 48 layers, hidden 2048, 128 experts of width 768,
    top-8, q4_0 experts (about 17 GiB; override n_layers to shrink it)."""
    return dict(
        n_layers=48, n_embd=2048, n_head=32, n_head_kv=4, head_dim=128, n_expert=128, top_k=8,
        n_ff_exp=768, n_ff=6144, vocab_size=4096, ctx=4096, expert_type="q4_0",
        weight_type="f16", q_lora_rank=512, kv_lora_rank=256, qk_rope_dim=64,
        sliding_window=128, ssm_state=128, ssm_k_heads=16, ssm_v_heads=32, full_attn_interval=4,
    )


SYNTH_PRESETS: dict[str, Callable[[], dict[str, Any]]] = {
    "tiny": _tiny,
    "copy-bound": _copy_bound,
    "qwen3-30b-a3b-like": _qwen3_30b_a3b_like,
}


def _arch_defaults(name: str, arch: str, fields: dict[str, Any],
                   explicit: set[str]) -> dict[str, Any]:
    """Adjust a preset to an architecture's constraints, never overriding ``explicit`` keys."""
    out = dict(fields)

    def default(key: str, value: Any) -> None:
        if key not in explicit:
            out[key] = value

    n_head = out.get("n_head", SynthSpec.n_head)
    if arch in ("olmoe", "mixtral", "llama"):
        default("head_dim", out.get("n_embd", SynthSpec.n_embd) // n_head)
    if arch == "olmoe":
        default("n_head_kv", n_head)
    if arch == "mixtral" and name == "tiny":
        default("n_expert", 8)
        default("top_k", 2)
    if arch == "deepseek2" and "n_layers" not in fields:
        default("n_layers", 3)  # one leading dense layer plus two MoE layers
    if arch == "glm4moe":
        default("n_nextn", 1)
        if "n_layers" not in fields:
            default("n_layers", 4)  # a leading dense layer, two MoE layers, a NextN block
    if arch in DENSE_ARCHES:
        default("n_expert", 0)
        default("top_k", 0)
    return out


def preset(name: str, arch: str = "qwen3moe", **overrides: Any) -> SynthSpec:
    """A named preset for one architecture, with optional field overrides.

    >>> preset("tiny", "olmoe", expert_type="q8_0").n_expert
    16
    """
    if name not in SYNTH_PRESETS:
        raise ValueError(f"unknown preset {name!r}; choose from {', '.join(SYNTH_PRESETS)}")
    if arch not in ARCHES:
        raise ValueError(f"unknown arch {arch!r}; choose from {', '.join(ARCHES)}")
    fields = SYNTH_PRESETS[name]() | overrides
    return SynthSpec(arch=arch, **_arch_defaults(name, arch, fields, set(overrides)))


# --------------------------------------------------------------------------- tensor plan

@dataclass(frozen=True)
class _Init:
    """How to fill a tensor: uniform noise with a given std, or a constant."""

    std: float = 0.0
    const: float = 0.0
    negative: bool = False  # values in [-(const + 3 std), -const]: qwen3next ssm_a


@dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]  # ggml order: ne0 (contiguous) first
    qtype: GGMLQuantizationType
    init: _Init

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.qtype]
        return math.prod(self.shape) // block * size


def _w(name: str, shape: Sequence[int], qtype: GGMLQuantizationType, gain: float = 1.0) -> _Tensor:
    """A weight matrix whose output keeps the variance of its input (fan-in scaling)."""
    return _Tensor(name, tuple(shape), qtype, _Init(std=gain / math.sqrt(shape[0])))


def _ones(name: str, shape: Sequence[int]) -> _Tensor:
    return _Tensor(name, tuple(shape), _F32, _Init(const=1.0))


def _small(name: str, shape: Sequence[int], std: float = 0.02) -> _Tensor:
    return _Tensor(name, tuple(shape), _F32, _Init(std=std))


def _expert_qtypes(expert_type: str) -> tuple[GGMLQuantizationType, GGMLQuantizationType]:
    """(gate and up, down) types of ``expert_type``."""
    if expert_type in _MIXES:
        return _MIXES[expert_type]
    return _QTYPES[expert_type], _QTYPES[expert_type]


def _plan(spec: SynthSpec) -> list[_Tensor]:
    """Every tensor of the file, in write order, with llama.cpp's names and ggml shapes."""
    wt = _QTYPES[spec.weight_type]
    et, dt = _expert_qtypes(spec.expert_type)
    E, F, D, V = spec.n_expert, spec.n_ff_exp, spec.n_embd, spec.vocab_size
    H, HKV, HD = spec.n_head, spec.n_head_kv, spec.head_dim
    out: list[_Tensor] = [
        _Tensor("token_embd.weight", (D, V), wt, _Init(std=1.0)),
        _ones("output_norm.weight", (D,)),
        _w("output.weight", (D, V), wt),
    ]

    def experts(blk: str, biases: bool = False) -> None:
        if spec.merged_gate_up:
            out.append(_w(f"{blk}.ffn_gate_up_exps.weight", (D, 2 * F, E), et))
        else:
            out.append(_w(f"{blk}.ffn_gate_exps.weight", (D, F, E), et))
            out.append(_w(f"{blk}.ffn_up_exps.weight", (D, F, E), et))
        out.append(_w(f"{blk}.ffn_down_exps.weight", (F, D, E), dt))
        if biases:
            out.append(_small(f"{blk}.ffn_gate_exps.bias", (F, E)))
            out.append(_small(f"{blk}.ffn_up_exps.bias", (F, E)))
            out.append(_small(f"{blk}.ffn_down_exps.bias", (D, E)))

    def router(blk: str) -> None:
        out.append(_w(f"{blk}.ffn_gate_inp.weight", (D, E), _F32, gain=spec.router_scale))

    def dense_ffn(blk: str, width: int, suffix: str = "") -> None:
        out.append(_w(f"{blk}.ffn_gate{suffix}.weight", (D, width), wt))
        out.append(_w(f"{blk}.ffn_up{suffix}.weight", (D, width), wt))
        out.append(_w(f"{blk}.ffn_down{suffix}.weight", (width, D), wt))

    def gqa(blk: str, q_width: int, qk_norm: int = 0, biases: bool = False) -> None:
        out.append(_w(f"{blk}.attn_q.weight", (D, q_width), wt))
        out.append(_w(f"{blk}.attn_k.weight", (D, HKV * HD), wt))
        out.append(_w(f"{blk}.attn_v.weight", (D, HKV * HD), wt))
        out.append(_w(f"{blk}.attn_output.weight", (H * HD, D), wt))
        if biases:
            out.append(_small(f"{blk}.attn_q.bias", (q_width,)))
            out.append(_small(f"{blk}.attn_k.bias", (HKV * HD,)))
            out.append(_small(f"{blk}.attn_v.bias", (HKV * HD,)))
            out.append(_small(f"{blk}.attn_output.bias", (D,)))
        if qk_norm:
            out.append(_ones(f"{blk}.attn_q_norm.weight", (qk_norm,)))
            out.append(_ones(f"{blk}.attn_k_norm.weight", (qk_norm,)))

    for il in range(spec.n_layers):
        blk = f"blk.{il}"
        out.append(_ones(f"{blk}.attn_norm.weight", (D,)))
        arch = spec.arch
        if arch in ("qwen3moe", "qwen3"):
            gqa(blk, H * HD, qk_norm=HD)
            out.append(_ones(f"{blk}.ffn_norm.weight", (D,)))
            if arch == "qwen3":
                dense_ffn(blk, spec.n_ff)
            else:
                router(blk)
                experts(blk)
        elif arch == "olmoe":
            gqa(blk, H * HD, qk_norm=D)
            out.append(_ones(f"{blk}.ffn_norm.weight", (D,)))
            router(blk)
            experts(blk)
        elif arch in ("mixtral", "llama"):
            gqa(blk, H * HD)
            out.append(_ones(f"{blk}.ffn_norm.weight", (D,)))
            if arch == "llama":
                dense_ffn(blk, spec.n_ff)
            else:
                router(blk)
                experts(blk)
        elif arch == "gpt-oss":
            gqa(blk, H * HD, biases=True)
            out.append(_small(f"{blk}.attn_sinks.weight", (H,), std=0.5))
            out.append(_ones(f"{blk}.post_attention_norm.weight", (D,)))
            router(blk)
            out.append(_small(f"{blk}.ffn_gate_inp.bias", (E,)))
            experts(blk, biases=True)
        elif arch == "deepseek2":
            _deepseek2_layer(spec, il, out, wt, router, experts, dense_ffn)
        elif arch in ("qwen3next", "qwen35moe"):
            _qwen3next_layer(spec, il, out, wt, router, experts, dense_ffn)
        elif arch == "glm4moe":
            _glm4moe_layer(spec, il, out, wt, router, experts, dense_ffn, gqa)
        else:  # pragma: no cover - validate() rejects unknown arches
            raise AssertionError(arch)
    return out


def _deepseek2_layer(spec: SynthSpec, il: int, out: list[_Tensor], wt: GGMLQuantizationType,
                     router: Callable[[str], None], experts: Callable[[str], None],
                     dense_ffn: Callable[..., None]) -> None:
    """MLA attention in the absorbed (k_b / v_b split) form that current converters write."""
    blk = f"blk.{il}"
    D, H, HD = spec.n_embd, spec.n_head, spec.head_dim
    rope, nope, rank = spec.qk_rope_dim, spec.head_dim - spec.qk_rope_dim, spec.kv_lora_rank
    if spec.q_lora_rank > 0:
        out.append(_w(f"{blk}.attn_q_a.weight", (D, spec.q_lora_rank), wt))
        out.append(_ones(f"{blk}.attn_q_a_norm.weight", (spec.q_lora_rank,)))
        out.append(_w(f"{blk}.attn_q_b.weight", (spec.q_lora_rank, H * HD), wt))
    else:
        out.append(_w(f"{blk}.attn_q.weight", (D, H * HD), wt))
    out.append(_w(f"{blk}.attn_kv_a_mqa.weight", (D, rank + rope), wt))
    out.append(_ones(f"{blk}.attn_kv_a_norm.weight", (rank,)))
    # 3D per-head matrices: kept f32 so any head size works.
    out.append(_w(f"{blk}.attn_k_b.weight", (nope, rank, H), _F32))
    out.append(_w(f"{blk}.attn_v_b.weight", (rank, HD, H), _F32))
    out.append(_w(f"{blk}.attn_output.weight", (H * HD, D), wt))
    out.append(_ones(f"{blk}.ffn_norm.weight", (D,)))
    if il < spec.n_dense_lead:
        dense_ffn(blk, spec.n_ff)
        return
    router(blk)
    out.append(_small(f"{blk}.exp_probs_b.bias", (spec.n_expert,), std=0.05))
    experts(blk)
    dense_ffn(blk, spec.n_ff_exp * spec.n_shared_experts, suffix="_shexp")


def _glm4moe_layer(spec: SynthSpec, il: int, out: list[_Tensor], wt: GGMLQuantizationType,
                   router: Callable[[str], None], experts: Callable[[str], None],
                   dense_ffn: Callable[..., None], gqa: Callable[..., None]) -> None:
    """GLM-4.5: attention with q/k/v biases, a post-attention norm, leading dense layers,
    then sigmoid-routed experts with a selection bias and a shared expert; the last
    ``n_nextn`` blocks add the NextN (MTP) projection."""
    blk = f"blk.{il}"
    D = spec.n_embd
    out.append(_w(f"{blk}.attn_q.weight", (D, spec.n_head * spec.head_dim), wt))
    out.append(_w(f"{blk}.attn_k.weight", (D, spec.n_head_kv * spec.head_dim), wt))
    out.append(_w(f"{blk}.attn_v.weight", (D, spec.n_head_kv * spec.head_dim), wt))
    out.append(_small(f"{blk}.attn_q.bias", (spec.n_head * spec.head_dim,)))
    out.append(_small(f"{blk}.attn_k.bias", (spec.n_head_kv * spec.head_dim,)))
    out.append(_small(f"{blk}.attn_v.bias", (spec.n_head_kv * spec.head_dim,)))
    out.append(_w(f"{blk}.attn_output.weight", (spec.n_head * spec.head_dim, D), wt))
    out.append(_ones(f"{blk}.post_attention_norm.weight", (D,)))
    if il < spec.n_dense_lead:
        dense_ffn(blk, spec.n_ff)
    else:
        router(blk)
        out.append(_small(f"{blk}.exp_probs_b.bias", (spec.n_expert,), std=0.05))
        experts(blk)
        dense_ffn(blk, spec.n_ff_exp * spec.n_shared_experts, suffix="_shexp")
    if il >= spec.n_layers - spec.n_nextn:
        out.append(_w(f"{blk}.nextn.eh_proj.weight", (2 * D, D), wt))
        out.append(_ones(f"{blk}.nextn.enorm.weight", (D,)))
        out.append(_ones(f"{blk}.nextn.hnorm.weight", (D,)))


def _qwen3next_layer(spec: SynthSpec, il: int, out: list[_Tensor], wt: GGMLQuantizationType,
                     router: Callable[[str], None], experts: Callable[[str], None],
                     dense_ffn: Callable[..., None]) -> None:
    """Gated-delta-net (linear) or gated full attention, then MoE plus a gated shared expert."""
    blk = f"blk.{il}"
    D, H, HKV, HD = spec.n_embd, spec.n_head, spec.n_head_kv, spec.head_dim
    out.append(_ones(f"{blk}.post_attention_norm.weight", (D,)))
    nextn = il >= spec.n_layers - spec.n_nextn  # a NextN block attends in full
    if (il + 1) % spec.full_attn_interval != 0 and not nextn:
        key_dim = spec.ssm_state * spec.ssm_k_heads
        value_dim = spec.ssm_state * spec.ssm_v_heads
        conv_dim = 2 * key_dim + value_dim
        out.append(_w(f"{blk}.attn_qkv.weight", (D, conv_dim), wt))
        out.append(_w(f"{blk}.attn_gate.weight", (D, value_dim), wt))
        out.append(_small(f"{blk}.ssm_conv1d.weight", (spec.ssm_conv_kernel, conv_dim),
                          std=1.0 / math.sqrt(spec.ssm_conv_kernel)))
        out.append(_small(f"{blk}.ssm_dt.bias", (spec.ssm_v_heads,), std=0.3))
        # ssm_a = -exp(A_log): negative decay rates, here in [-1.5, -0.5].
        out.append(_Tensor(f"{blk}.ssm_a", (spec.ssm_v_heads,), _F32,
                           _Init(std=1.0 / math.sqrt(12.0), const=0.5, negative=True)))
        if spec.arch == "qwen35moe":  # Qwen3.5: beta and alpha as two projections
            out.append(_w(f"{blk}.ssm_beta.weight", (D, spec.ssm_v_heads), wt))
            out.append(_w(f"{blk}.ssm_alpha.weight", (D, spec.ssm_v_heads), wt))
        else:
            out.append(_w(f"{blk}.ssm_ba.weight", (D, 2 * spec.ssm_v_heads), wt))
        out.append(_ones(f"{blk}.ssm_norm.weight", (spec.ssm_state,)))
        out.append(_w(f"{blk}.ssm_out.weight", (value_dim, D), wt))
    else:
        out.append(_w(f"{blk}.attn_q.weight", (D, 2 * H * HD), wt))
        out.append(_w(f"{blk}.attn_k.weight", (D, HKV * HD), wt))
        out.append(_w(f"{blk}.attn_v.weight", (D, HKV * HD), wt))
        out.append(_w(f"{blk}.attn_output.weight", (H * HD, D), wt))
        out.append(_ones(f"{blk}.attn_q_norm.weight", (HD,)))
        out.append(_ones(f"{blk}.attn_k_norm.weight", (HD,)))
    router(blk)
    experts(blk)
    out.append(_w(f"{blk}.ffn_gate_inp_shexp.weight", (D,), _F32))
    dense_ffn(blk, spec.n_ff_exp * spec.n_shared_experts, suffix="_shexp")
    if nextn:
        out.append(_w(f"{blk}.nextn.eh_proj.weight", (2 * D, D), wt))
        out.append(_ones(f"{blk}.nextn.enorm.weight", (D,)))
        out.append(_ones(f"{blk}.nextn.hnorm.weight", (D,)))


# --------------------------------------------------------------------------- metadata

def _write_metadata(w: GGUFWriter, spec: SynthSpec, name: str,
                    vocab: Vocab | None = None) -> None:
    """The KV section: hyperparameters each architecture's loader asks for, and the vocab
    (``build_vocab``'s of the spec's size unless another is given)."""
    vocab = vocab or build_vocab(spec.vocab_size)
    if vocab.size != spec.vocab_size:
        raise ValueError(f"the vocabulary has {vocab.size} tokens, the spec {spec.vocab_size}")
    arch = spec.arch
    w.add_name(name)
    w.add_file_type(_file_type(spec))
    w.add_quantization_version(2)
    w.add_context_length(spec.ctx)
    w.add_embedding_length(spec.n_embd)
    w.add_block_count(spec.n_layers)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(1 if arch == "deepseek2" else spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(spec.vocab_size)
    if arch == "glm4moe":
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
        w.add_rope_dimension_count(spec.head_dim // 2)  # GLM-4.5 rotates half of each head
        w.add_leading_dense_block_count(spec.n_dense_lead)
        w.add_expert_shared_count(spec.n_shared_experts)
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(1.0)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
        w.add_nextn_predict_layers(spec.n_nextn)
    elif arch == "deepseek2":
        w.add_key_length(spec.kv_lora_rank + spec.qk_rope_dim)
        w.add_value_length(spec.kv_lora_rank)
        w.add_key_length_mla(spec.head_dim)
        w.add_value_length_mla(spec.head_dim)
        w.add_rope_dimension_count(spec.qk_rope_dim)
        w.add_q_lora_rank(spec.q_lora_rank)
        w.add_kv_lora_rank(spec.kv_lora_rank)
        w.add_leading_dense_block_count(spec.n_dense_lead)
        w.add_expert_shared_count(spec.n_shared_experts)
        w.add_expert_weights_norm(True)
        w.add_expert_weights_scale(1.0)
        w.add_expert_gating_func(ExpertGatingFuncType.SIGMOID)
    else:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
        w.add_rope_dimension_count(spec.head_dim)
    # olmoe and llama/mixtral take the expert width from feed_forward_length.
    w.add_feed_forward_length(spec.n_ff_exp if arch in ("olmoe", "mixtral") else spec.n_ff)
    if spec.is_moe:
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.top_k)
        w.add_expert_feed_forward_length(spec.n_ff_exp)
    if arch == "gpt-oss":
        w.add_sliding_window(spec.sliding_window)
    if arch == "qwen35moe":  # interleaved multimodal RoPE: its sections fill half a head
        half = spec.head_dim // 2
        w.add_rope_dimension_sections([half - 2 * (half // 3), half // 3, half // 3, 0])
    if arch in ("qwen3next", "qwen35moe"):
        w.add_expert_shared_feed_forward_length(spec.n_ff_exp * spec.n_shared_experts)
        w.add_ssm_conv_kernel(spec.ssm_conv_kernel)
        w.add_ssm_inner_size(spec.ssm_state * spec.ssm_v_heads)
        w.add_ssm_state_size(spec.ssm_state)
        w.add_ssm_time_step_rank(spec.ssm_v_heads)
        w.add_ssm_group_count(spec.ssm_k_heads)
        w.add_full_attention_interval(spec.full_attn_interval)
        if spec.n_nextn:
            w.add_nextn_predict_layers(spec.n_nextn)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(list(vocab.tokens))
    w.add_token_types(list(vocab.token_types))
    w.add_token_merges(list(vocab.merges))
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_pad_token_id(vocab.pad_id)
    w.add_add_bos_token(spec.add_bos)
    w.add_chat_template(spec.chat_template or vocab.chat_template)


def _file_type(spec: SynthSpec) -> int:
    """llama_ftype of the dominant tensors (informational; llama.cpp prints it)."""
    return {"f32": 0, "f16": 1, "q4_0": 2, "q8_0": 7, "mxfp4": 38, "q4_k": 15, "q6_k": 18,
            "q4_k_m": 15}[
        spec.expert_type if spec.is_moe else spec.weight_type
    ]


# --------------------------------------------------------------------------- data

def _rng(seed: int, name: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(name.encode("utf-8"))])


def _chunks(t: _Tensor, seed: int) -> Iterator[np.ndarray]:
    """The tensor's bytes, one outermost slice (one expert) at a time.

    Uniform noise with the requested std is three times cheaper to draw than Gaussian noise
    and just as good at keeping activations in range.
    """
    rng = _rng(seed, t.name)
    np_shape = tuple(reversed(t.shape))
    if len(np_shape) == 3:
        slices: list[tuple[int, ...]] = [np_shape[1:]] * np_shape[0]
    else:
        slices = [np_shape]
    half_width = t.init.std * math.sqrt(3.0)
    for shape in slices:
        if t.init.std == 0.0:
            x = np.full(shape, t.init.const, dtype=np.float32)
        else:
            x = rng.random(shape, dtype=np.float32)
            if t.init.negative:
                x = -(t.init.const + 2.0 * half_width * x)
            else:
                x = (2.0 * half_width) * x - half_width + t.init.const
            x = x.astype(np.float32, copy=False)
        if t.qtype == GGMLQuantizationType.F32:
            yield x
        elif t.qtype == GGMLQuantizationType.F16:
            yield x.astype(np.float16)
        elif t.qtype in _K_QUANTS:
            yield _k_quant_blocks(shape, t.qtype, t.init.std, rng)
        else:
            yield quantize(x, t.qtype)


# K-quant block layouts (ggml-common.h): where the fp16 super-block scales sit, and the
# spread of the integer part of a weight, to pick scales that give the requested std.
_K_QUANTS: dict[GGMLQuantizationType, tuple[tuple[int, ...], float]] = {
    # block_q4_K: half d, half dmin, u8 scales[12], u8 qs[128]; w = d*sc*q - dmin*m
    GGMLQuantizationType.Q4_K: ((0, 2), 218.0),
    # block_q6_K: u8 ql[128], u8 qh[64], i8 scales[16], half d; w = d*sc*(q-32)
    GGMLQuantizationType.Q6_K: ((208,), 1366.0),
}


def _k_quant_blocks(shape: Sequence[int], qtype: GGMLQuantizationType, std: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Valid K-quant blocks with weights of about ``std`` (gguf-py cannot quantize to
    K-quants): random quants and sub-block scales, and super-block scales set to finite
    values so no weight is NaN or huge. For Q4_K the min scale is set near the mean of the
    positive part, which keeps the weights roughly centred."""
    block, size = GGML_QUANT_SIZES[qtype]
    n_blocks = math.prod(shape) // block
    raw = rng.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    offsets, spread = _K_QUANTS[qtype]
    d = np.float16(std / spread)
    scales = [d, np.float16(float(d) * 7.5)] if len(offsets) == 2 else [d]
    for offset, value in zip(offsets, scales, strict=True):
        raw[:, offset:offset + 2] = np.frombuffer(np.float16(value).tobytes(), dtype=np.uint8)
    return raw.reshape(*shape[:-1], shape[-1] // block * size)


# --------------------------------------------------------------------------- public API

def default_name(spec: SynthSpec) -> str:
    """``general.name`` of a synthetic model: arch, expert type and a short spec hash."""
    return f"moescope-synth-{spec.arch}-{spec.expert_type}-{spec_digest(spec)[:8]}"


def spec_digest(spec: SynthSpec) -> str:
    """A stable hash of every field; two specs with equal digests write identical files."""
    fields = dataclasses.asdict(spec)
    if fields["chat_template"] is None:  # the default: digests of older specs stay valid
        del fields["chat_template"]
    if not fields["add_bos"]:  # likewise
        del fields["add_bos"]
    if not fields["n_nextn"]:  # likewise
        del fields["n_nextn"]
    text = repr(sorted(fields.items()))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def estimate_file_bytes(spec: SynthSpec) -> int:
    """Tensor data bytes of the file the spec would produce (the header adds a few KB)."""
    return sum(-(-t.nbytes // 32) * 32 for t in _plan(spec))


def expert_bytes_per_layer(spec: SynthSpec) -> int:
    """Bytes of all routed experts of one MoE layer (gate, up, down and their biases)."""
    if not spec.moe_layers:
        return 0
    layer = spec.moe_layers[0]
    return sum(t.nbytes for t in _plan(spec)
               if t.name.startswith(f"blk.{layer}.") and "_exps." in t.name)


def write_synth_model(path: str | os.PathLike[str], spec: SynthSpec, *,
                      sparse: bool = False, parts: int = 1, vocab: Vocab | None = None) -> Path:
    """Write the model described by ``spec`` to ``path`` and return the path.

    The file is written next to its destination and renamed into place, so a reader never
    sees a half-written model (benchmarks cache these files across runs).

    With ``sparse=True`` only the header is written and the tensor data is left as a hole
    of zeros (a sparse file): a "17 GiB" model in milliseconds, for tests of code that
    must read only the header. All weights are zero, so it is useless for generation.

    With ``parts > 1`` the model is split as llama.cpp's ``gguf-split`` does: files
    ``STEM-00001-of-0000N.gguf`` …, the metadata in the first, each with ``split.*`` keys
    and a contiguous share of the tensors; the first part's path is returned.

    ``vocab`` replaces the spec's ``build_vocab`` vocabulary (same size), e.g.
    ``vocab.build_wide_vocab``'s: it is not part of the spec (nor of its digest).
    """
    spec.validate()
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    plan = _plan(spec)
    if parts < 1 or parts > len(plan):
        raise ValueError(f"parts must be 1..{len(plan)}, got {parts}")
    if parts == 1:
        _write_part(dest, spec, plan, sparse=sparse, vocab=vocab)
        return dest
    stem = dest.name[:-len(".gguf")] if dest.name.endswith(".gguf") else dest.name
    names = [dest.with_name(f"{stem}-{i + 1:05d}-of-{parts:05d}.gguf") for i in range(parts)]
    share = -(-len(plan) // parts)
    for i, name in enumerate(names):
        _write_part(name, spec, plan[i * share:(i + 1) * share], sparse=sparse,
                    split=(i, parts, len(plan)), vocab=vocab)
    return names[0]


def _write_part(dest: Path, spec: SynthSpec, plan: list[_Tensor], *, sparse: bool,
                split: tuple[int, int, int] | None = None, vocab: Vocab | None = None) -> None:
    """One GGUF file: the metadata (only in the first part of a split model), the
    ``split.*`` keys of part ``split = (index, count, total tensors)``, and ``plan``'s
    tensors."""
    # Unique per writer, so parallel test workers never share a half-written file.
    tmp = dest.with_name(f"{dest.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.partial")
    w = GGUFWriter(tmp, arch=spec.gguf_arch)
    try:
        if split is None or split[0] == 0:
            _write_metadata(w, spec, spec.name or default_name(spec), vocab)
        if split is not None:
            w.add_uint16("split.no", split[0])
            w.add_uint16("split.count", split[1])
            w.add_int32("split.tensors.count", split[2])
        for t in plan:
            # A non-uint8 dtype makes the writer keep our element shape as-is.
            w.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), t.nbytes,
                              raw_dtype=t.qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        assert w.fout is not None
        fout = w.fout[0]
        if sparse:
            w.write_padding(fout, fout.tell())
            fout.truncate(fout.tell() + sum(-(-t.nbytes // w.data_alignment) * w.data_alignment
                                            for t in plan))
            plan = []
        for t in plan:
            w.write_padding(fout, fout.tell())
            written = 0
            for chunk in _chunks(t, spec.seed):
                chunk.tofile(fout)
                written += chunk.nbytes
            if written != t.nbytes:  # pragma: no cover - guards the size arithmetic
                raise AssertionError(f"{t.name}: wrote {written} bytes, expected {t.nbytes}")
            w.write_padding(fout, t.nbytes)
        w.close()
        os.replace(tmp, dest)
    except BaseException:
        w.close()
        tmp.unlink(missing_ok=True)
        raise


def ensure_synth_model(directory: str | os.PathLike[str], spec: SynthSpec) -> Path:
    """Return a cached file for ``spec`` in ``directory``, writing it only if missing."""
    path = Path(directory) / f"{spec.arch}-{spec.expert_type}-{spec_digest(spec)[:16]}.gguf"
    if not path.is_file():
        write_synth_model(path, spec)
    return path


def ensure_wide_vocab_model(directory: str | os.PathLike[str], vocab_size: int = 151_936,
                            **overrides: Any) -> Path:
    """A cached tiny MoE model (the ``tiny`` preset) whose vocabulary is ``vocab_size``
    tokens of real text (``vocab.build_wide_vocab``: Qwen3's size by default), for what
    scales with the vocabulary, e.g. a grammar checking every token."""
    from moescope_testing.vocab import build_wide_vocab

    spec = preset("tiny", vocab_size=vocab_size, **overrides)
    path = Path(directory) / f"wide-{spec.arch}-{spec_digest(spec)[:16]}.gguf"
    if not path.is_file():
        write_synth_model(path, spec, vocab=build_wide_vocab(vocab_size))
    return path


def write_dense_model(path: str | os.PathLike[str], arch: str = "qwen3", seed: int = 0,
                      **overrides: Any) -> Path:
    """Write a tiny dense (no experts) model: the input for "not an MoE model" tests."""
    if arch not in DENSE_ARCHES:
        raise ValueError(f"dense arch must be one of {', '.join(DENSE_ARCHES)}")
    return write_synth_model(path, preset("tiny", arch, seed=seed, **overrides))


# --------------------------------------------------------------------------- CLI

def _parse_override(text: str) -> tuple[str, Any]:
    key, sep, raw = text.partition("=")
    fields = {f.name: f for f in dataclasses.fields(SynthSpec)}
    if not sep or key not in fields:
        raise argparse.ArgumentTypeError(f"expected FIELD=VALUE with FIELD in SynthSpec: {text}")
    default = getattr(SynthSpec(), key)
    value: Any
    if isinstance(default, bool):
        value = raw.lower() in ("1", "true", "yes", "on")
    elif isinstance(default, int):
        value = int(raw)
    elif isinstance(default, float):
        value = float(raw)
    else:
        value = raw
    return key, value


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m moescope_testing.synth``: write one synthetic model."""
    p = argparse.ArgumentParser(prog="python -m moescope_testing.synth",
                                description="Write a deterministic synthetic (MoE) GGUF model.")
    p.add_argument("--arch", choices=ARCHES, default="qwen3moe")
    p.add_argument("--preset", choices=tuple(SYNTH_PRESETS), default="tiny")
    p.add_argument("--out", required=True, type=Path, help="output .gguf path")
    p.add_argument("--expert-type", choices=EXPERT_TYPES, help="override the preset's")
    p.add_argument("--layers", type=int, help="override the number of layers")
    p.add_argument("--seed", type=int, help="override the seed")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="FIELD=VALUE",
                   type=_parse_override, help="override any SynthSpec field (repeatable)")
    args = p.parse_args(argv)
    overrides: dict[str, Any] = dict(args.overrides)
    if args.expert_type:
        overrides["expert_type"] = args.expert_type
    if args.layers is not None:
        overrides["n_layers"] = args.layers
    if args.seed is not None:
        overrides["seed"] = args.seed
    try:
        spec = preset(args.preset, args.arch, **overrides)
    except ValueError as err:
        print(f"synth: error: {err}", file=sys.stderr)
        return 2
    size = estimate_file_bytes(spec)
    print(f"writing {args.out} ({spec.arch}, {spec.n_layers} layers, {spec.n_expert} experts, "
          f"{spec.expert_type}, ~{size / 2**20:.1f} MiB)", file=sys.stderr)
    write_synth_model(args.out, spec)
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
