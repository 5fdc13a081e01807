#!/usr/bin/env python3
"""Train MoEScope's embedded demo model: a tiny qwen3moe LM, exported as a GGUF.

Why this exists: MoEScope needs a Mixture-of-Experts model that ships inside the repository
(tests, first-run demo, CI without downloads). Real MoE checkpoints are gigabytes, so we train
a small one here, on CPU, in the *qwen3moe* architecture so that stock llama.cpp loads it and
the expert cache sees the same tensor layout as on Qwen3-30B-A3B.

This is a developer tool, not a runtime dependency: it needs the ``train`` extra
(torch==2.13.0, tokenizers) plus gguf and numpy. Everything is seeded and the number of
optimizer steps is fixed, so a rerun on the same machine (same Python stdlib sources, same
thread count) reproduces the same file.

Outputs:
  * ``--out`` (default resources/models/moescope-demo-qwen3moe.gguf): the model, q8_0 experts;
  * ``--workdir``: train.log, report.json (all numbers for docs/demo-model.md), the tokenizer,
    the final checkpoint and ``reference_logits.npz`` (logits of the PyTorch reference
    computed from the weights *read back from the GGUF*; packaging/verify_demo_model.py
    compares them with llama.cpp's).

Example (the command used for the shipped file)::

    /work/train-venv/bin/python packaging/train_demo_model.py --workdir /work/demo-train
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import random
import sys
import sysconfig
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

import gguf
import numpy as np
import torch
import torch.nn.functional as F
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
from torch import nn

LOG = logging.getLogger("train_demo_model")

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_OUT = REPO_ROOT / "resources" / "models" / "moescope-demo-qwen3moe.gguf"
DEFAULT_SHAKESPEARE = Path("/work/shared/data/tinyshakespeare.txt")

# Special tokens, ids 0..2. <|endoftext|> separates documents (and is BOS/PAD, as in Qwen3),
# <|im_start|>/<|im_end|> are the ChatML turn markers; <|im_end|> is EOS so chat turns stop.
ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END)

# ChatML, the format llama.cpp and llama-cpp-python's Jinja formatter both recognise.
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Synthetic chat wrappers: a fraction of training segments is framed as an assistant turn so
# that the embedded model answers sensibly when the app talks to it with the chat template.
CHAT_PROMPTS: dict[str, tuple[str, ...]] = {
    "shakespeare": (
        "Write a scene from a play.",
        "Speak like a character from Shakespeare.",
        "Give me some lines of verse.",
        "Continue the play.",
        "Recite some Shakespeare.",
    ),
    "python": (
        "Write some Python code.",
        "Show me a Python function.",
        "Write part of a Python module.",
        "Give me an example from the Python standard library.",
        "Continue this Python file.",
    ),
}

DOMAINS = ("shakespeare", "python")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters of the qwen3moe model; every field maps to a GGUF key."""

    vocab_size: int = 4096
    n_embd: int = 192
    n_layer: int = 6
    n_head: int = 6
    n_head_kv: int = 2
    head_dim: int = 32
    n_expert: int = 64
    n_expert_used: int = 4
    n_ff_exp: int = 64
    context_length: int = 512
    rms_eps: float = 1e-6
    rope_base: float = 10000.0


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Optimisation settings; a fixed step count keeps the run deterministic."""

    seed: int = 1234
    steps: int = 1000
    batch_size: int = 8
    lr: float = 3e-3
    min_lr_frac: float = 0.1
    warmup: int = 150
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    dropout: float = 0.1
    aux_coef: float = 0.02
    z_coef: float = 1e-3
    eval_every: int = 200
    eval_windows: int = 24
    threads: int = 1
    holdout_frac: float = 0.1
    chat_frac: float = 0.15
    seg_min_chars: int = 300
    seg_max_chars: int = 1500
    boundary_rate: float = 1 / 150
    boundary_space_rate: float = 0.1


# --------------------------------------------------------------------------------------------
# Corpus
# --------------------------------------------------------------------------------------------


def load_python_corpus(target_chars: int, max_file_chars: int = 40_000) -> tuple[str, list[str]]:
    """Concatenate a deterministic, sorted subset of this interpreter's stdlib sources.

    Top-level ``Lib/*.py`` files are taken in sorted order, skipping very large files so the
    corpus covers many modules, until ``target_chars`` is reached (similar size to the
    Shakespeare text, so neither domain dominates).
    """
    lib = Path(sysconfig.get_paths()["stdlib"])
    parts: list[str] = []
    names: list[str] = []
    total = 0
    for path in sorted(lib.glob("*.py")):
        text = path.read_text(encoding="utf-8", errors="replace")
        if len(text) > max_file_chars or not text.strip() or path.name.startswith("_sysconfigdata"):
            continue
        parts.append(text.rstrip("\n") + "\n")
        names.append(path.name)
        total += len(parts[-1])
        if total >= target_chars:
            break
    return "\n\n".join(parts), names


def split_holdout(text: str, frac: float) -> tuple[str, str]:
    """Return (train, held-out): the last ``frac`` of the text, cut at a line boundary."""
    cut = text.rfind("\n", 0, int(len(text) * (1.0 - frac))) + 1
    return text[:cut], text[cut:]


def segment_lines(text: str, rng: random.Random, min_chars: int, max_chars: int) -> list[str]:
    """Cut text into runs of whole lines of random length, the unit that gets mixed."""
    lines = text.splitlines(keepends=True)
    segments: list[str] = []
    cur: list[str] = []
    size = 0
    target = rng.randint(min_chars, max_chars)
    for line in lines:
        cur.append(line)
        size += len(line)
        if size >= target:
            segments.append("".join(cur))
            cur, size = [], 0
            target = rng.randint(min_chars, max_chars)
    if cur:
        segments.append("".join(cur))
    return [s for s in segments if s.strip()]


# Qwen2's pre-tokenizer regex (llama.cpp pre-tokenizer "qwen2", the one Qwen3 models use):
# single digits, newlines split from indentation, no clean-up of spaces when detokenizing.
QWEN2_PRETOKENIZER_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """Byte-level BPE with Qwen2's pre-tokenizer, so llama.cpp (pre='qwen2') splits the same."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZER_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def encode_segments(tok: Tokenizer, segments: Sequence[str]) -> list[list[int]]:
    """Tokenize segments independently, as a prompt would be tokenized at inference."""
    return [e.ids for e in tok.encode_batch(list(segments), add_special_tokens=False)]


def boundary_pieces(text: str, rng: random.Random, rate: float, space_rate: float) -> list[str]:
    """Cut text at random character positions (prompt-boundary augmentation).

    Why: a prompt like "def " or "import " ends where the tokenizer would normally merge
    across the boundary (" name"), so its last token (a lone space) is one the model never
    saw in that position, except before inline comments ("x = 1  # ..."). Encoding the
    pieces separately puts such non-canonical boundaries into the training data and the
    model learns to continue them. Cuts happen anywhere with probability ``rate`` per
    character and, more often (``space_rate``), right after a space that precedes a word.
    """
    cuts = sorted(
        i for i in range(1, len(text))
        if rng.random() < (space_rate if text[i - 1] == " " and text[i].isalnum() else rate)
    )
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def chat_wrap(prompt: str, body: str) -> str:
    """Render one user/assistant exchange exactly as CHAT_TEMPLATE would."""
    return f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n{body}{IM_END}\n"


# --------------------------------------------------------------------------------------------
# Model: a faithful PyTorch copy of llama.cpp's qwen3moe graph (src/models/qwen3moe.cpp)
# --------------------------------------------------------------------------------------------


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * w, as ggml_rms_norm followed by ggml_mul."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_neox(x: torch.Tensor, base: float) -> torch.Tensor:
    """NEOX rotary embedding (rotate the two halves), llama.cpp's rope type for qwen3moe.

    x: [B, T, H, D]; position = index along T.
    """
    _, t, _, d = x.shape
    half = d // 2
    inv = base ** (-torch.arange(0, half, dtype=torch.float32, device=x.device) * 2.0 / d)
    ang = torch.arange(t, dtype=torch.float32, device=x.device)[:, None] * inv[None, :]
    cos = ang.cos()[None, :, None, :]
    sin = ang.sin()[None, :, None, :]
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class Attention(nn.Module):
    """GQA attention with per-head RMSNorm on q and k before RoPE (Qwen3)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.wq = nn.Linear(cfg.n_embd, cfg.n_head * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.n_embd, cfg.n_head_kv * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.n_embd, cfg.n_head_kv * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_head * cfg.head_dim, cfg.n_embd, bias=False)
        self.q_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)
        self.k_norm = RMSNorm(cfg.head_dim, cfg.rms_eps)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = self.cfg
        b, t, _ = x.shape
        q = self.q_norm(self.wq(x).view(b, t, c.n_head, c.head_dim))
        k = self.k_norm(self.wk(x).view(b, t, c.n_head_kv, c.head_dim))
        v = self.wv(x).view(b, t, c.n_head_kv, c.head_dim)
        q = rope_neox(q, c.rope_base).transpose(1, 2)
        k = rope_neox(k, c.rope_base).transpose(1, 2)
        v = v.transpose(1, 2)
        rep = c.n_head // c.n_head_kv
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.wo(y.transpose(1, 2).reshape(b, t, c.n_head * c.head_dim))


class MoE(nn.Module):
    """Qwen3 MoE block: softmax over all experts, top-k, renormalise, SiLU-gated experts.

    Assignments are sorted by expert and each expert runs on its contiguous slice (split +
    unbind, whose backward is a cheap concatenation), so no token is ever dropped (as in
    llama.cpp) and no compute is spent on padding while the router is still unbalanced.
    """

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        e, d, f = cfg.n_expert, cfg.n_embd, cfg.n_ff_exp
        self.router = nn.Linear(d, e, bias=False)
        self.w_gate = nn.Parameter(torch.empty(e, d, f))
        self.w_up = nn.Parameter(torch.empty(e, d, f))
        self.w_down = nn.Parameter(torch.empty(e, f, d))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        c = self.cfg
        shape = x.shape
        x = x.reshape(-1, c.n_embd)
        n, k, e = x.shape[0], c.n_expert_used, c.n_expert
        logits = self.router(x).float()
        probs = logits.softmax(-1)
        w, idx = probs.topk(k, dim=-1)
        w = w / w.sum(-1, keepdim=True).clamp_min(6.103515625e-5)
        flat = idx.reshape(-1)
        counts = torch.bincount(flat, minlength=e)
        order = torch.argsort(flat, stable=True)
        xs = x.index_select(0, order // k).split(counts.tolist())
        outs = [
            (F.silu(xe @ g) * (xe @ u)) @ dn
            for xe, g, u, dn in zip(
                xs, self.w_gate.unbind(0), self.w_up.unbind(0), self.w_down.unbind(0),
                strict=True,
            )
        ]
        inv = torch.empty_like(order)
        inv[order] = torch.arange(n * k, device=x.device)
        y = torch.cat(outs).index_select(0, inv).view(n, k, c.n_embd)
        y = (y * w.unsqueeze(-1).to(y.dtype)).sum(1)
        stats = {"logits": logits, "probs": probs, "idx": idx, "counts": counts}
        return y.view(shape), stats


class Block(nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then + moe(norm(.))."""

    def __init__(self, cfg: ModelConfig, dropout: float) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        self.attn = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)
        self.moe = MoE(cfg)
        # Residual dropout is training-only regularisation (the corpus is small and seen many
        # times); it does not exist in the exported graph, which matches eval mode.
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        x = x + self.drop(self.attn(self.attn_norm(x)))
        y, stats = self.moe(self.ffn_norm(x))
        return x + self.drop(y), stats


class Qwen3MoE(nn.Module):
    """Embedding, blocks, final RMSNorm, LM head tied to the embedding."""

    def __init__(self, cfg: ModelConfig, dropout: float = 0.0) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok_embd = nn.Embedding(cfg.vocab_size, cfg.n_embd)
        self.blocks = nn.ModuleList(Block(cfg, dropout) for _ in range(cfg.n_layer))
        self.out_norm = RMSNorm(cfg.n_embd, cfg.rms_eps)

    def init_weights(self, gen: torch.Generator) -> None:
        """GPT-2 style init; residual projections scaled down by depth for stability."""
        std = 0.02
        resid_std = std / math.sqrt(2 * self.cfg.n_layer)
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
            elif name.endswith(("wo.weight", "w_down")):
                nn.init.normal_(p, 0.0, resid_std, generator=gen)
            else:
                nn.init.normal_(p, 0.0, std, generator=gen)

    def forward(self, ids: torch.Tensor) -> tuple[torch.Tensor, list[dict[str, torch.Tensor]]]:
        x = self.tok_embd(ids)
        stats = []
        for blk in self.blocks:
            x, s = blk(x)
            stats.append(s)
        return self.out_norm(x) @ self.tok_embd.weight.T, stats


def aux_losses(stats: list[dict[str, torch.Tensor]], cfg: ModelConfig) -> tuple[torch.Tensor, ...]:
    """Switch/Qwen load-balancing loss E * sum_e f_e * P_e (1.0 when balanced) and router
    z-loss, averaged over layers."""
    lb = torch.zeros(())
    z = torch.zeros(())
    for s in stats:
        n = s["probs"].shape[0]
        frac = s["counts"].float() / (n * cfg.n_expert_used)
        lb = lb + cfg.n_expert * (frac * s["probs"].mean(0)).sum()
        z = z + torch.logsumexp(s["logits"], -1).pow(2).mean()
    return lb / len(stats), z / len(stats)


# --------------------------------------------------------------------------------------------
# Evaluation and routing statistics
# --------------------------------------------------------------------------------------------


def windows(tokens: Sequence[int], length: int) -> torch.Tensor:
    """Non-overlapping windows of ``length`` tokens (the tail that does not fit is dropped)."""
    n = len(tokens) // length
    return torch.tensor(tokens[: n * length], dtype=torch.long).view(n, length)


@torch.no_grad()
def evaluate(
    model: Qwen3MoE, data: torch.Tensor, batch: int = 16
) -> tuple[float, list[torch.Tensor]]:
    """Mean next-token NLL over windows, plus each layer's top-k expert ids per token."""
    model.eval()
    total, count = 0.0, 0
    routes: list[list[torch.Tensor]] = [[] for _ in range(model.cfg.n_layer)]
    for i in range(0, data.shape[0], batch):
        x = data[i : i + batch]
        logits, stats = model(x[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), x[:, 1:].reshape(-1),
                               reduction="sum")
        total += float(loss)
        count += x[:, 1:].numel()
        for layer, s in enumerate(stats):
            routes[layer].append(s["idx"].view(x.shape[0], -1, model.cfg.n_expert_used))
    model.train()
    return total / count, [torch.cat(r) for r in routes]


def unigram_nll(train_tokens: Sequence[int], test_tokens: Sequence[int], vocab: int) -> float:
    """Add-one-smoothed unigram cross-entropy: the baseline any LM must beat."""
    counts = np.bincount(np.asarray(train_tokens), minlength=vocab).astype(np.float64) + 1.0
    logp = np.log(counts / counts.sum())
    return float(-logp[np.asarray(test_tokens)].mean())


def usage(routes: torch.Tensor, n_expert: int) -> np.ndarray:
    """Fraction of routing assignments that went to each expert."""
    c = torch.bincount(routes.reshape(-1), minlength=n_expert).double().numpy()
    return c / c.sum()


def entropy(p: np.ndarray) -> float:
    """Shannon entropy in nats."""
    q = p[p > 0]
    return float(-(q * np.log(q)).sum())


def routing_report(
    routes_by_domain: dict[str, list[torch.Tensor]], cfg: ModelConfig
) -> list[dict[str, float]]:
    """Per layer: usage entropy, coverage, max share and domain specialisation of experts."""
    out = []
    for layer in range(cfg.n_layer):
        u = {d: usage(routes_by_domain[d][layer], cfg.n_expert) for d in DOMAINS}
        both = (u["shakespeare"] + u["python"]) / 2.0
        share_py = np.divide(u["python"], 2.0 * both, out=np.full_like(both, 0.5), where=both > 0)
        m = (u["shakespeare"] + u["python"]) / 2.0
        js = 0.5 * sum(
            float((u[d][u[d] > 0] * np.log(u[d][u[d] > 0] / m[u[d] > 0])).sum()) for d in DOMAINS
        )
        top = {d: set(np.argsort(-u[d])[:16].tolist()) for d in DOMAINS}
        out.append(
            {
                "layer": layer,
                "entropy_nats": entropy(both),
                "entropy_norm": entropy(both) / math.log(cfg.n_expert),
                "effective_experts": math.exp(entropy(both)),
                "experts_used": int((both > 0).sum()),
                "max_share": float(both.max()),
                "min_share": float(both.min()),
                "js_divergence_bits": js / math.log(2.0),
                "python_specialists": int((share_py >= 0.9).sum()),
                "shakespeare_specialists": int((share_py <= 0.1).sum()),
                "mixed_experts": int(((share_py > 0.1) & (share_py < 0.9)).sum()),
                "top16_overlap": len(top["shakespeare"] & top["python"]),
            }
        )
    return out


@torch.no_grad()
def topic_switch_report(
    model: Qwen3MoE,
    held: dict[str, list[int]],
    eot: int,
    window: int,
    n_pairs: int,
    seed: int,
) -> list[dict[str, float]]:
    """How much the expert working set changes when the topic switches.

    For each layer, the working set of a window is the union of the top-k experts of its
    tokens. We compare the ``window`` tokens before a switch with the ``window`` tokens after
    it (Shakespeare -> <|endoftext|> -> Python and the reverse) against a control: the same
    split point inside one domain's contiguous text.
    """
    rng = random.Random(seed)
    cfg = model.cfg

    def piece(domain: str, length: int) -> list[int]:
        toks = held[domain]
        start = rng.randrange(0, len(toks) - length)
        return toks[start : start + length]

    switch_seqs, control_seqs = [], []
    for i in range(n_pairs):
        a, b = (DOMAINS[0], DOMAINS[1]) if i % 2 == 0 else (DOMAINS[1], DOMAINS[0])
        switch_seqs.append([*piece(a, window), eot, *piece(b, window)])
        control_seqs.append(piece(a, 2 * window + 1))
    result = []
    model.eval()
    _, s_stats = model(torch.tensor(switch_seqs))
    _, c_stats = model(torch.tensor(control_seqs))
    model.train()
    for layer in range(cfg.n_layer):
        rows = {}
        for name, st in (("switch", s_stats[layer]), ("control", c_stats[layer])):
            idx = st["idx"].view(n_pairs, 2 * window + 1, cfg.n_expert_used)
            jac, new = [], []
            for r in range(n_pairs):
                before = set(idx[r, :window].reshape(-1).tolist())
                after = set(idx[r, window + 1 :].reshape(-1).tolist())
                jac.append(len(before & after) / len(before | after))
                new.append(len(after - before) / len(after))
            rows[f"{name}_jaccard"] = float(np.mean(jac))
            rows[f"{name}_new_frac"] = float(np.mean(new))
            ws = [len(set(idx[r, window + 1 :].reshape(-1).tolist())) for r in range(n_pairs)]
            rows[f"{name}_working_set"] = float(np.mean(ws))
        result.append({"layer": layer, **rows})
    return result


@torch.no_grad()
def sample(
    model: Qwen3MoE,
    tok: Tokenizer,
    prompt: str,
    n_tokens: int,
    temperature: float,
    seed: int,
    stop: Sequence[int],
) -> str:
    """Generate from the PyTorch model (full recompute; fine for a few hundred tokens)."""
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    ids = tok.encode(prompt, add_special_tokens=False).ids
    for _ in range(n_tokens):
        logits, _ = model(torch.tensor([ids[-model.cfg.context_length :]]))
        last = logits[0, -1]
        if temperature <= 0:
            nxt = int(last.argmax())
        else:
            nxt = int(torch.multinomial((last / temperature).softmax(-1), 1, generator=gen))
        if nxt in stop:
            break
        ids.append(nxt)
    model.train()
    return tok.decode(ids, skip_special_tokens=False)


# --------------------------------------------------------------------------------------------
# GGUF export and read-back
# --------------------------------------------------------------------------------------------


def gguf_tensors(model: Qwen3MoE) -> list[tuple[str, np.ndarray, gguf.GGMLQuantizationType]]:
    """Map parameters to llama.cpp names and layouts.

    gguf-py writes numpy shapes reversed, so a numpy (n_expert, n_ff_exp, n_embd) array is the
    ggml tensor {n_embd, n_ff_exp, n_expert} that qwen3moe expects for ffn_gate_exps.
    Experts and attention matrices are q8_0 (size), the embedding f16, norms and router f32
    (routing decisions are what MoEScope studies, so they stay exact).
    """
    q8 = gguf.GGMLQuantizationType.Q8_0
    f16 = gguf.GGMLQuantizationType.F16
    f32 = gguf.GGMLQuantizationType.F32

    def a(t: torch.Tensor) -> np.ndarray:
        return t.detach().float().contiguous().numpy()

    out = [
        ("token_embd.weight", a(model.tok_embd.weight), f16),
        ("output_norm.weight", a(model.out_norm.weight), f32),
    ]
    for i, blk in enumerate(model.blocks):
        p = f"blk.{i}."
        out += [
            (p + "attn_norm.weight", a(blk.attn_norm.weight), f32),
            (p + "attn_q.weight", a(blk.attn.wq.weight), q8),
            (p + "attn_k.weight", a(blk.attn.wk.weight), q8),
            (p + "attn_v.weight", a(blk.attn.wv.weight), q8),
            (p + "attn_output.weight", a(blk.attn.wo.weight), q8),
            (p + "attn_q_norm.weight", a(blk.attn.q_norm.weight), f32),
            (p + "attn_k_norm.weight", a(blk.attn.k_norm.weight), f32),
            (p + "ffn_norm.weight", a(blk.ffn_norm.weight), f32),
            (p + "ffn_gate_inp.weight", a(blk.moe.router.weight), f32),
            (p + "ffn_gate_exps.weight", a(blk.moe.w_gate.transpose(1, 2)), q8),
            (p + "ffn_up_exps.weight", a(blk.moe.w_up.transpose(1, 2)), q8),
            (p + "ffn_down_exps.weight", a(blk.moe.w_down.transpose(1, 2)), q8),
        ]
    return out


def export_gguf(model: Qwen3MoE, tok: Tokenizer, path: Path, description: str) -> None:
    """Write the model, tokenizer and chat template as a qwen3moe GGUF."""
    cfg = model.cfg
    arch = "qwen3moe"
    path.parent.mkdir(parents=True, exist_ok=True)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name("MoEScope demo qwen3moe")
    w.add_description(description)
    w.add_license("MIT")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_quantization_version(gguf.GGML_QUANT_VERSION)
    w.add_context_length(cfg.context_length)
    w.add_embedding_length(cfg.n_embd)
    w.add_block_count(cfg.n_layer)
    w.add_feed_forward_length(cfg.n_ff_exp * cfg.n_expert_used)
    w.add_expert_feed_forward_length(cfg.n_ff_exp)
    w.add_expert_count(cfg.n_expert)
    w.add_expert_used_count(cfg.n_expert_used)
    w.add_head_count(cfg.n_head)
    w.add_head_count_kv(cfg.n_head_kv)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_eps)
    w.add_rope_freq_base(cfg.rope_base)

    vocab = tok.get_vocab()
    tokens = [""] * len(vocab)
    for text, i in vocab.items():
        tokens[i] = text
    special = {tok.token_to_id(t) for t in SPECIAL_TOKENS}
    types = [
        gguf.TokenType.CONTROL if i in special else gguf.TokenType.NORMAL
        for i in range(len(tokens))
    ]
    merges = json.loads(tok.to_str())["model"]["merges"]
    merges = [m if isinstance(m, str) else " ".join(m) for m in merges]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(tok.token_to_id(ENDOFTEXT))
    w.add_eos_token_id(tok.token_to_id(IM_END))
    w.add_pad_token_id(tok.token_to_id(ENDOFTEXT))
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)

    for name, arr, qtype in gguf_tensors(model):
        if qtype == gguf.GGMLQuantizationType.F32:
            w.add_tensor(name, arr.astype(np.float32))
        elif qtype == gguf.GGMLQuantizationType.F16:
            w.add_tensor(name, arr.astype(np.float16))
        else:
            w.add_tensor(name, gguf.quants.quantize(arr, qtype), raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def load_gguf_into(model: Qwen3MoE, path: Path) -> None:
    """Overwrite the model's weights with the (dequantized) tensors of a GGUF.

    Running the reference on these weights isolates llama.cpp's arithmetic from quantization
    error when comparing logits, and proves the export layout round-trips.
    """
    reader = gguf.GGUFReader(str(path))
    by_name = {t.name: t for t in reader.tensors}

    def get(name: str) -> torch.Tensor:
        t = by_name[name]
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        return torch.from_numpy(np.array(arr, dtype=np.float32, copy=True))

    with torch.no_grad():
        model.tok_embd.weight.copy_(get("token_embd.weight"))
        model.out_norm.weight.copy_(get("output_norm.weight"))
        for i, blk in enumerate(model.blocks):
            p = f"blk.{i}."
            blk.attn_norm.weight.copy_(get(p + "attn_norm.weight"))
            blk.attn.wq.weight.copy_(get(p + "attn_q.weight"))
            blk.attn.wk.weight.copy_(get(p + "attn_k.weight"))
            blk.attn.wv.weight.copy_(get(p + "attn_v.weight"))
            blk.attn.wo.weight.copy_(get(p + "attn_output.weight"))
            blk.attn.q_norm.weight.copy_(get(p + "attn_q_norm.weight"))
            blk.attn.k_norm.weight.copy_(get(p + "attn_k_norm.weight"))
            blk.ffn_norm.weight.copy_(get(p + "ffn_norm.weight"))
            blk.moe.router.weight.copy_(get(p + "ffn_gate_inp.weight"))
            blk.moe.w_gate.copy_(get(p + "ffn_gate_exps.weight").transpose(1, 2))
            blk.moe.w_up.copy_(get(p + "ffn_up_exps.weight").transpose(1, 2))
            blk.moe.w_down.copy_(get(p + "ffn_down_exps.weight").transpose(1, 2))


# --------------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------------


def lr_at(step: int, tc: TrainConfig) -> float:
    """Linear warmup then cosine decay to min_lr_frac * lr."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    prog = (step - tc.warmup) / max(1, tc.steps - tc.warmup)
    return tc.lr * (tc.min_lr_frac + (1 - tc.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * prog)))


def build_data(
    cfg: ModelConfig, tc: TrainConfig, shakespeare_path: Path
) -> tuple[Tokenizer, list[int], dict[str, list[int]], dict[str, list[int]], dict[str, object]]:
    """Corpus -> tokenizer -> mixed training stream and per-domain held-out token streams."""
    rng = random.Random(tc.seed)
    shakes = shakespeare_path.read_text(encoding="utf-8")
    python, files = load_python_corpus(len(shakes))
    texts = {"shakespeare": shakes, "python": python}
    train_txt, held_txt = {}, {}
    for d in DOMAINS:
        train_txt[d], held_txt[d] = split_holdout(texts[d], tc.holdout_frac)
    tok = train_tokenizer([train_txt[d] for d in DOMAINS], cfg.vocab_size)
    eot = tok.token_to_id(ENDOFTEXT)

    # Training stream: line-aligned segments of both domains in a seeded random order, each
    # followed by <|endoftext|>, so most training windows contain a topic switch.
    # Plain segments are cut into pieces that are tokenized separately (boundary_pieces);
    # chat segments are kept whole so their special tokens stay intact.
    segs: list[tuple[str, list[str]]] = []
    for d in DOMAINS:
        for s in segment_lines(train_txt[d], rng, tc.seg_min_chars, tc.seg_max_chars):
            if rng.random() < tc.chat_frac:
                segs.append((d, [chat_wrap(rng.choice(CHAT_PROMPTS[d]), s.rstrip("\n"))]))
            else:
                segs.append((d, boundary_pieces(s, rng, tc.boundary_rate,
                                                tc.boundary_space_rate)))
    rng.shuffle(segs)
    flat_pieces = [p for _, pieces in segs for p in pieces]
    encoded = iter(encode_segments(tok, flat_pieces))
    stream: list[int] = []
    per_domain_train: dict[str, list[int]] = {d: [] for d in DOMAINS}
    for d, pieces in segs:
        ids = [t for _ in pieces for t in next(encoded)]
        stream.extend(ids)
        stream.append(eot)
        per_domain_train[d].extend(ids)
    held: dict[str, list[int]] = {}
    for d in DOMAINS:
        pieces = segment_lines(held_txt[d], random.Random(tc.seed + 1), 2000, 2000)
        held[d] = [t for ids in encode_segments(tok, pieces) for t in ids]
    info: dict[str, object] = {
        "python_files": files,
        "chars": {d: {"train": len(train_txt[d]), "held": len(held_txt[d])} for d in DOMAINS},
        "sha256": {d: hashlib.sha256(texts[d].encode()).hexdigest() for d in DOMAINS},
        "train_tokens": {d: len(per_domain_train[d]) for d in DOMAINS},
        "held_tokens": {d: len(held[d]) for d in DOMAINS},
        "stream_tokens": len(stream),
        "segments": len(segs),
        "per_domain_train": per_domain_train,
    }
    return tok, stream, held, per_domain_train, info


def train(args: argparse.Namespace) -> None:
    """Run the whole pipeline; see the module docstring."""
    cfg = ModelConfig()
    tc = dataclasses.replace(TrainConfig(), steps=args.steps, threads=args.threads)
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(message)s",
        handlers=[logging.FileHandler(workdir / "train.log", mode="w"), logging.StreamHandler()],
    )
    # A fixed thread count (not "all cores") keeps the result reproducible. The default is
    # one: on a shared 2-core machine two OpenMP threads spin at barriers whenever the other
    # core is busy (measured 1.4 s vs 8 s per step while a C++ build was running). On an idle
    # 2-core machine --threads 2 is ~1.8x faster, but gives a (reproducibly) different file.
    torch.set_num_threads(tc.threads)
    torch.manual_seed(tc.seed)
    torch.use_deterministic_algorithms(True)
    t_start = time.time()
    LOG.info("argv: %s", " ".join(sys.argv))
    LOG.info("model config: %s", dataclasses.asdict(cfg))
    LOG.info("train config: %s", dataclasses.asdict(tc))

    tok, stream, held, per_domain_train, info = build_data(cfg, tc, Path(args.shakespeare))
    tok.save(str(workdir / "tokenizer.json"))
    LOG.info(
        "corpus: %s",
        json.dumps({k: v for k, v in info.items()
                    if k not in ("python_files", "per_domain_train")}),
    )
    LOG.info("python files (%d): %s ... %s", len(info["python_files"]),  # type: ignore[arg-type]
             info["python_files"][:3], info["python_files"][-3:])  # type: ignore[index]
    eot = tok.token_to_id(ENDOFTEXT)
    t = cfg.context_length
    held_w = {d: windows(held[d], t + 1) for d in DOMAINS}
    eval_sub = {d: held_w[d][: tc.eval_windows] for d in DOMAINS}

    gen = torch.Generator().manual_seed(tc.seed)
    model = Qwen3MoE(cfg, tc.dropout)
    model.init_weights(gen)
    n_params = sum(p.numel() for p in model.parameters())
    n_expert_params = sum(p.numel() for n, p in model.named_parameters() if n.split(".")[-1]
                          in ("w_gate", "w_up", "w_down"))
    active = n_params - n_expert_params * (1 - cfg.n_expert_used / cfg.n_expert)
    LOG.info("params: total %d, experts %d, active per token %.0f", n_params, n_expert_params,
             active)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": tc.weight_decay},
         {"params": no_decay, "weight_decay": 0.0}],
        lr=tc.lr, betas=(0.9, 0.95), eps=1e-8,
    )
    data = torch.tensor(stream, dtype=torch.long)
    history = []
    t_train = time.time()
    for step in range(tc.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc)
        starts = torch.randint(0, len(data) - t - 1, (tc.batch_size,), generator=gen)
        batch = torch.stack([data[s : s + t + 1] for s in starts.tolist()])
        logits, stats = model(batch[:, :-1])
        ce = F.cross_entropy(logits.reshape(-1, cfg.vocab_size), batch[:, 1:].reshape(-1))
        lb, z = aux_losses(stats, cfg)
        loss = ce + tc.aux_coef * lb + tc.z_coef * z
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        opt.step()
        if step % 25 == 0 or step == tc.steps - 1:
            el = time.time() - t_train
            LOG.info("step %5d  ce %.4f  lb %.4f  z %.2f  gnorm %.2f  lr %.2e  %.0fs (%.2fs/step)",
                     step, ce.item(), lb.item(), z.item(), gnorm.item(), lr_at(step, tc), el,
                     el / (step + 1))
        if (step + 1) % tc.eval_every == 0 or step == tc.steps - 1:
            ev = {d: evaluate(model, eval_sub[d])[0] for d in DOMAINS}
            LOG.info("eval step %5d  held-out ce  shakespeare %.4f (ppl %.2f)  python %.4f "
                     "(ppl %.2f)", step + 1, ev["shakespeare"], math.exp(ev["shakespeare"]),
                     ev["python"], math.exp(ev["python"]))
            history.append({"step": step + 1, "train_ce": ce.item(), **ev})
    train_seconds = time.time() - t_train
    LOG.info("training took %.1f s", train_seconds)
    torch.save(model.state_dict(), workdir / "model.pt")

    # Final metrics on the complete held-out text of each domain.
    report: dict[str, object] = {
        "model": dataclasses.asdict(cfg),
        "train": dataclasses.asdict(tc),
        "params_total": n_params,
        "params_experts": n_expert_params,
        "params_active": active,
        "train_seconds": train_seconds,
        "corpus": {k: v for k, v in info.items() if k != "per_domain_train"},
        "history": history,
        "argv": sys.argv,
    }
    all_train = [x for d in DOMAINS for x in per_domain_train[d]]
    final: dict[str, dict[str, float]] = {}
    routes: dict[str, list[torch.Tensor]] = {}
    for d in DOMAINS:
        nll, routes[d] = evaluate(model, held_w[d])
        final[d] = {
            "nll": nll,
            "ppl": math.exp(nll),
            "unigram_ppl_mixed": math.exp(unigram_nll(all_train, held[d], cfg.vocab_size)),
            "unigram_ppl_domain": math.exp(
                unigram_nll(per_domain_train[d], held[d], cfg.vocab_size)),
            "tokens": int(held_w[d][:, 1:].numel()),
            "bytes_per_token": len(tok.decode(held[d]).encode()) / len(held[d]),
        }
    report["heldout"] = final
    report["routing"] = routing_report(routes, cfg)
    report["topic_switch"] = {
        str(wdw): topic_switch_report(model, held, eot, wdw, 64, tc.seed) for wdw in (16, 64)
    }
    for d in DOMAINS:
        LOG.info("held-out %s: %s", d, json.dumps(final[d]))
    for row in report["routing"]:  # type: ignore[union-attr]
        LOG.info("routing %s", json.dumps(row))
    for wdw, rows in report["topic_switch"].items():  # type: ignore[union-attr]
        for row in rows:
            LOG.info("switch w=%s %s", wdw, json.dumps(row))

    stop = [tok.token_to_id(s) for s in SPECIAL_TOKENS]
    samples = []
    for prompt in ("ROMEO:", "def ", "import ", "KING RICHARD III:\n"):
        for temp, seed in ((0.0, 0), (0.8, 1)):
            text = sample(model, tok, prompt, 120, temp, tc.seed + seed, stop)
            samples.append({"prompt": prompt, "temperature": temp, "text": text})
            LOG.info("sample %r T=%.1f:\n%s\n", prompt, temp, text)
    report["samples_torch"] = samples

    desc = (
        f"Tiny qwen3moe demo model trained by packaging/train_demo_model.py on tinyshakespeare "
        f"and Python {sys.version_info.major}.{sys.version_info.minor} stdlib sources; "
        f"{cfg.n_expert} experts, top-{cfg.n_expert_used}, {cfg.n_layer} layers."
    )
    out = Path(args.out)
    export_gguf(model, tok, out, desc)
    LOG.info("wrote %s (%.2f MB)", out, out.stat().st_size / 1e6)
    report["gguf_bytes"] = out.stat().st_size
    report["gguf_sha256"] = hashlib.sha256(out.read_bytes()).hexdigest()

    # Reference for llama.cpp: the model with weights read back from the GGUF.
    ref = Qwen3MoE(cfg)
    load_gguf_into(ref, out)
    q_final = {}
    for d in DOMAINS:
        q_final[d] = math.exp(evaluate(ref, held_w[d])[0])
    report["heldout_ppl_gguf_weights"] = q_final
    LOG.info("held-out ppl with GGUF (q8_0) weights: %s", q_final)
    ref_text = {d: held[d][:t] for d in DOMAINS}
    mixed = [*held["shakespeare"][:96], eot, *held["python"][:96]]
    ref_logits = {}
    ref_routes = {}
    with torch.no_grad():
        ref.eval()
        for name, ids in (*ref_text.items(), ("mixed", mixed)):
            lg, st = ref(torch.tensor([ids]))
            ref_logits[name] = lg[0].numpy()
            ref_routes[name] = np.stack([s["idx"].numpy() for s in st])
    np.savez(
        workdir / "reference_logits.npz",
        **{f"tokens_{k}": np.asarray(v if k != "mixed" else mixed) for k, v in
           (*ref_text.items(), ("mixed", mixed))},
        **{f"logits_{k}": v for k, v in ref_logits.items()},
        **{f"routes_{k}": v for k, v in ref_routes.items()},
        **{f"text_{d}": np.asarray(tok.decode(ref_text[d])) for d in DOMAINS},
        **{f"hf_tokens_{d}": np.asarray(tok.encode(tok.decode(ref_text[d]),
                                                   add_special_tokens=False).ids)
           for d in DOMAINS},
    )
    report["total_seconds"] = time.time() - t_start
    (workdir / "report.json").write_text(json.dumps(report, indent=1))
    LOG.info("done in %.1f s", time.time() - t_start)


def main(argv: Sequence[str] | None = None) -> None:
    """CLI entry point."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", default="/work/demo-train", help="logs, report, checkpoint")
    ap.add_argument("--out", default=str(DEFAULT_OUT), help="GGUF to write")
    ap.add_argument("--shakespeare", default=str(DEFAULT_SHAKESPEARE))
    ap.add_argument("--steps", type=int, default=TrainConfig.steps, help="optimizer steps")
    ap.add_argument(
        "--threads", type=int, default=TrainConfig.threads,
        help="torch threads; the result is reproducible for a given count, not across counts",
    )
    train(ap.parse_args(argv))


if __name__ == "__main__":
    main()
