"""Test support for traces: a recorded trace as an older MoEScope would have written it."""

from __future__ import annotations

import json
from pathlib import Path


def as_older_trace(source: Path, dest: Path, *fields: str) -> int:
    """Copy the trace ``source`` to ``dest`` without the token fields ``fields`` (fields a
    later version added: older traces must still open). Returns how many token lines had
    at least one of them."""
    lines, stripped = [], 0
    for line in source.read_text(encoding="utf-8").splitlines():
        obj = json.loads(line)
        if obj.get("type") == "token":
            stripped += any([obj.pop(f, None) is not None for f in fields])
        lines.append(json.dumps(obj))
    dest.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return stripped


def core_trace(path: Path, *, n_tokens: int = 8, n_layers: int = 3,
               moe_layers: tuple[int, ...] = (1, 2), n_expert: int = 16, top_k: int = 4,
               slots: int = 6, policy: str = "psr", seed: int = 0) -> Path:
    """Write to ``path`` a trace whose rows the real native core decided (standalone, no
    model): random routing, one step per decode token, router inputs and PSR predictions
    on every row. What the reader and replay tests mutate into hostile files, so that they
    run without the engine; replayed with its own policy it reproduces its rows."""
    import numpy as np

    from moescope.cache.native import ExpertCache
    from moescope.cache.policy import Policy
    from moescope.trace import RouterInput, TokenRecord, TraceHeader, TraceModel, TraceWriter

    rng = np.random.default_rng(seed)
    model = TraceModel(file_name="core.gguf", metadata_sha256="ef" * 32,
                         architecture="qwen3moe", n_layers=n_layers, moe_layers=moe_layers,
                         n_expert=n_expert, top_k=top_k,
                         bytes_per_expert=tuple(1000 + i for i in range(len(moe_layers))))
    header = TraceHeader(model=model, budget="test", slots_per_layer=slots,
                         policy=Policy.preset(policy), router_inputs="f32")
    with ExpertCache(n_layers, n_expert, top_k, slots, policy) as cache, \
            TraceWriter(path, header) as writer:
        for layer, n_bytes in zip(moe_layers, model.bytes_per_expert, strict=True):
            cache.set_expert_bytes(layer, n_bytes)
        for i in range(n_tokens):
            if i:
                cache.begin_step()
            routes = {}
            for row, layer in enumerate(moe_layers):
                probs = rng.dirichlet(np.ones(n_expert)).astype(np.float32)
                ids = np.argsort(-probs, kind="stable")[:top_k].astype(np.int32)
                cache.route(layer, probs, ids, probs[ids])
                nxt = moe_layers[(row + 1) % len(moe_layers)]
                predicted = np.argsort(-rng.random(n_expert), kind="stable")[:top_k]
                scores = np.full(n_expert, -np.inf, dtype=np.float32)
                scores[predicted] = np.arange(top_k, 0, -1)  # as the replay ranks them
                cache.prefetch(nxt, scores)
                routes[row] = RouterInput(row=row, probs=probs, weights=probs[ids], ids=ids,
                                          next_layer=nxt, predicted=predicted.astype(np.int32))
            writer.write_token(TokenRecord(
                index=i, phase="prefill" if i == 0 else "decode", token_id=i + 3,
                text=f"t{i}", seconds=0.001, policy=policy, slots_per_layer=slots,
                events=cache.drain_events(), routes=routes, position=i))
    return path
