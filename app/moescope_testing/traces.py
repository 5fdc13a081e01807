"""Test support for traces: a recorded trace as an older MoEScope would have written it."""

from __future__ import annotations

import json
import tempfile
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
    from moescope.trace import RouterInput, TokenRecord, TraceHeader, TraceModel
    from moescope.trace.writer import open_writer

    rng = np.random.default_rng(seed)
    model = TraceModel(file_name="core.gguf", metadata_sha256="ef" * 32,
                         architecture="qwen3moe", n_layers=n_layers, moe_layers=moe_layers,
                         n_expert=n_expert, top_k=top_k,
                         bytes_per_expert=tuple(1000 + i for i in range(len(moe_layers))))
    header = TraceHeader(model=model, budget="test", slots_per_layer=slots,
                         policy=Policy.preset(policy), router_inputs="f32")
    with ExpertCache(n_layers, n_expert, top_k, slots, policy) as cache, \
            open_writer(path, header) as writer:
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


PREFILL_PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman"


def prefill_only_trace(path: Path) -> Path:
    """A session of the demo model stopped after its prompt (``-n 1``: its one token comes
    out of the prefill), recorded at ``path`` by the real engine under psr."""
    from moescope.cli import main
    from moescope.trace import read_trace

    if main(["generate", "-n", "1", "--policy", "psr", "-p", PREFILL_PROMPT, "--trace",
             str(path)]) != 0:
        raise RuntimeError("moescope generate failed to record the prefill-only trace")
    phases = [t.phase for t in read_trace(path).tokens]
    if phases != ["prefill"]:
        raise RuntimeError(f"the prefill-only trace has tokens of phases {phases}")
    return path


def synthetic_trace(path: Path, *, n_tokens: int, n_layers: int = 48, n_expert: int = 512,
                    top_k: int = 10, slots: int = 128, policy: str = "psr",
                    predictions: bool = True, seed: int = 0) -> Path:
    """A large trace at a real model's geometry (default Qwen3-Next: 48 MoE layers x 512
    experts, top-10) without running a model: softmax router probabilities over logits
    with a per-expert popularity (so caching matters), the top-k renormalized as Qwen3's
    router does, PSR predictions ranked from the next layer's logits plus noise, and event
    rows decided by the real core (the native batch replay), so the file is what the
    recorder would write for such routing. ``path``'s suffix picks the format."""
    import numpy as np

    from moescope.cache.policy import Policy
    from moescope.sim.replay import Routing, replay, replay_many
    from moescope.trace import RouterInput, TokenRecord, TraceHeader, TraceModel
    from moescope.trace.schema import PREDICTED_KEEP
    from moescope.trace.writer import open_writer

    rng = np.random.default_rng(seed)
    layers = tuple(range(n_layers))
    model = TraceModel(file_name="synthetic.gguf", metadata_sha256="ab" * 32,
                         architecture="qwen3next", n_layers=n_layers, moe_layers=layers,
                         n_expert=n_expert, top_k=top_k,
                         bytes_per_expert=(3 * 2048 * 512 * 2,) * n_layers,
                         non_expert_bytes=3 << 30, name="synthetic Qwen3-Next geometry")
    header = TraceHeader(model=model, budget=f"{slots} slots", slots_per_layer=slots,
                         policy=Policy.preset(policy), router_inputs="f32")
    n = n_tokens * n_layers
    popularity = rng.normal(0.0, 1.0, (n_layers, n_expert)).astype(np.float32)
    logits = np.empty((n, n_expert), dtype=np.float32)
    for t in range(n_tokens):
        logits[t * n_layers:(t + 1) * n_layers] = popularity + rng.normal(
            0.0, 1.5, (n_layers, n_expert)).astype(np.float32)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    probs = probs.astype(np.float32)
    ids = np.argsort(-probs, axis=1, kind="stable")[:, :top_k].astype(np.int32)
    gate = np.take_along_axis(probs, ids, axis=1)
    gate = (gate / gate.sum(axis=1, keepdims=True)).astype(np.float32)
    next_layer = np.tile(np.array([*layers[1:], -1], dtype=np.int32), n_tokens)
    keep = min(PREDICTED_KEEP, n_expert)
    predicted = np.full((n, keep), -1, dtype=np.int32)
    if predictions:
        noisy = np.roll(logits, -1, axis=0) + rng.normal(0, 0.5, logits.shape).astype(
            np.float32)
        predicted = np.argsort(-noisy, axis=1, kind="stable")[:, :keep].astype(np.int32)
        predicted[next_layer < 0] = -1
    rows = np.arange(n)
    events = np.zeros(n, dtype=_event_dtype())
    events["step"] = rows // n_layers
    events["layer"] = np.tile(np.array(layers, dtype=np.int32), n_tokens)
    events["k"] = top_k
    token_rows = np.arange(0, n + 1, n_layers, dtype=np.int64)
    routing = Routing(
        header=header, ids=ids, weights=gate, probs=probs, exact=np.ones(n, np.bool_),
        recorded_rows=events, call_step=events["step"].astype(np.int64),
        call_layer=events["layer"].astype(np.int32), call_start=rows.astype(np.int64),
        call_stop=rows.astype(np.int64) + 1,
        token_calls=np.arange(0, n + 1, n_layers, dtype=np.int64), token_rows=token_rows,
        changes=[() for _ in range(n_tokens)],
        decode=np.arange(n_tokens) > 0,
        next_layer=next_layer if predictions else None,
        predicted=predicted if predictions else None)
    counted = predictions and bool(header.policy.prefetch)
    if counted:
        # the recorder's per-layer PSR counters, as the core counted them (else a trace
        # window calls the file older than those counters); only the per-call replay counts
        # per layer (about 1 s a 1,000 tokens at Qwen3-Next's geometry, 10x the batch)
        result = replay(routing, None, None, keep_events=True)
    else:
        (result,) = replay_many(routing, [(None, None)], keep_events=True)
    decided = result.events
    assert decided is not None
    pf, pf_hits = result.layer_prefetches, result.layer_prefetch_hits
    with open_writer(path, header) as writer:
        for t in range(n_tokens):
            a, b = t * n_layers, (t + 1) * n_layers
            routes = {}
            for i in range(n_layers):
                r = a + i
                has = predictions and next_layer[r] >= 0
                routes[i] = RouterInput(row=i, probs=probs[r], weights=gate[r], ids=ids[r],
                                        next_layer=int(next_layer[r]) if has else -1,
                                        predicted=predicted[r] if has else None)
            writer.write_token(TokenRecord(
                index=t, phase="prefill" if t == 0 else "decode", token_id=t % 1000 + 3,
                text=f"t{t}", seconds=0.02, policy=policy, slots_per_layer=slots,
                events=decided[a:b], routes=routes, position=t,
                prefetches=pf[t] if counted and pf is not None else None,
                prefetch_hits=pf_hits[t] if counted and pf_hits is not None else None,
                timings=dict.fromkeys(("route_us", "sync_copy_us", "async_copy_us",
                                       "wait_us", "n_sync", "n_async"), 0)))
    return path


def _event_dtype() -> object:
    from moescope.cache.native import EVENT_DTYPE

    return EVENT_DTYPE


def bench_trace(work: Path | None, n_tokens: int, prefix: str) -> tuple[Path, Path]:
    """A bench's working folder (``work``, else a new temporary one named ``prefix``...)
    and in it a :func:`synthetic_trace` of ``n_tokens`` at Qwen3-Next's geometry, made once
    and kept for the next run with the same ``work``."""
    work = work or Path(tempfile.mkdtemp(prefix=prefix))
    work.mkdir(parents=True, exist_ok=True)
    path = work / f"t{n_tokens}.arrows"
    if not path.exists():
        synthetic_trace(path, n_tokens=n_tokens)
    return work, path
