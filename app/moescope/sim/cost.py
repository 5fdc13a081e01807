"""Time per token from what the cache did: the simulator's cost model.

The simulator knows, per token, how many experts were copied synchronously (the token
waits for them) and in the background (admissions), and how many bytes each moved. A cost
model turns that into seconds:

    t = compute + n_sync * latency + bytes_sync / bandwidth
        + max(0, n_async * latency + bytes_async / bandwidth - compute)

Compute runs with background copies in flight; only the part of the background copying that
does not fit under the compute time delays the token (one copy stream, as in the engine).
That is the presets' assumption, a GPU's copy engine. Where the machine itself showed
otherwise, a share ``e`` of the background copying is exposed on the critical path (the
decode waited for copies still in flight):

    t = compute + sync + e * background + max(0, (1 - e) * background - compute)

``e`` is 0 for the presets; ``calibrated`` fits it to the waits the trace recorded.

With a RAM tier (a replay with ``ram_slots``), fills of experts that are only in the model
file first wait for a read from disk:

    t += n_disk * disk_latency + bytes_disk / disk_bandwidth

counted on the critical path whether the fill was a fetch or an admission (the core's rows
sum both), so it is an upper bound when admissions read from disk in the background. The
presets' disk is an NVMe SSD read with O_DIRECT: about 2.5 GB/s and 80 µs per read.

Presets come from ``shared/docs/research/offload-anchors.md``: PCIe 4.0 x16 moves about
25 GB/s from pinned host memory, a ``cudaMemcpyAsync`` costs about 5-10 µs of latency, and
decode compute is bound by reading the active weights at the GPU's memory bandwidth (936
GB/s on an RTX 3090). ``pcie5`` doubles the link (about 50 GB/s pinned) with an RTX 5090's
1792 GB/s. ``calibrated`` fits bandwidth, compute and the exposed share of background
copying to the copy, wait and wall timings the engine measured while the trace was
recorded, i.e. this machine (:func:`calibrate`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt

from moescope.trace import TokenRecord, Trace, TraceModel
from moescope.util.errors import MoEScopeError


@dataclass(frozen=True)
class CostModel:
    """Copy link and compute speed; ``compute_s=None`` derives compute from the model."""

    name: str
    bandwidth: float
    """Host-to-device copy bandwidth, bytes per second."""
    latency: float
    """Fixed cost of one expert copy, seconds."""
    gpu_bandwidth: float = 936e9
    """Bytes per second the GPU reads weights at (derives compute when not given)."""
    compute_s: float | None = None
    """Seconds of compute per decoded token (None: active weight bytes / gpu_bandwidth)."""
    note: str = ""
    disk_bandwidth: float = 2.5e9
    """Bytes per second an expert is read from the model file at (RAM tier on)."""
    disk_latency: float = 80e-6
    """Fixed cost of one read from the model file, seconds."""
    background_exposed: float = 0.0
    """Share of the background copying (PSR prefetches, admissions) that lands on the
    critical path: 0 hides it under compute (a GPU's copy engine, the presets), 1 serializes
    it; above 1 the decode waited longer than the copies took (copies on a thread sharing a
    CPU's cores with the decode). Fitted by :func:`calibrate` from the time the decode
    waited for background copies."""

    def compute_for(self, model: TraceModel) -> float:
        """Compute per token: given, or the active bytes (non-expert weights plus top-k
        experts in every MoE layer) read once at ``gpu_bandwidth``."""
        if self.compute_s is not None:
            return self.compute_s
        active = model.non_expert_bytes + model.top_k * sum(model.bytes_per_expert)
        return active / self.gpu_bandwidth

    def token_seconds(self, per_token: npt.NDArray[Any], model: TraceModel) -> npt.NDArray[
            np.float64]:
        """Estimated seconds of every token of a replay's ``per_token`` array."""
        compute = self.compute_for(model)
        sync = per_token["n_sync"] * self.latency + per_token["bytes_sync"] / self.bandwidth
        background = (per_token["n_async"] * self.latency
                      + per_token["bytes_async"] / self.bandwidth)
        disk = 0.0
        if "n_disk" in (per_token.dtype.names or ()):
            disk = (per_token["n_disk"] * self.disk_latency
                    + per_token["bytes_disk"] / self.disk_bandwidth)
        return np.asarray(compute + sync + disk + _background_cost(
            background, compute, self.background_exposed), dtype=np.float64)

    def with_overrides(self, *, bandwidth: float | None = None, latency: float | None = None,
                       compute_s: float | None = None, disk_bandwidth: float | None = None,
                       disk_latency: float | None = None) -> CostModel:
        """A copy with some parameters replaced (the CLI's --bandwidth, ...)."""
        changes: dict[str, Any] = {}
        if disk_bandwidth is not None:
            changes["disk_bandwidth"] = disk_bandwidth
        if disk_latency is not None:
            changes["disk_latency"] = disk_latency
        if bandwidth is not None:
            changes["bandwidth"] = bandwidth
        if latency is not None:
            changes["latency"] = latency
        if compute_s is not None:
            changes["compute_s"] = compute_s
        return replace(self, **changes) if changes else self

    def describe(self, model: TraceModel | None = None) -> str:
        """One line: the parameters used."""
        if model is not None:
            compute = f"{self.compute_for(model) * 1e3:.3f} ms"
        elif self.compute_s is not None:
            compute = f"{self.compute_s * 1e3:.3f} ms"
        else:
            compute = "from the model's bytes"
        text = (f"{self.name}: {self.bandwidth / 1e9:.2f} GB/s, {self.latency * 1e6:.1f} µs per "
                f"copy, compute {compute}/token, disk {self.disk_bandwidth / 1e9:.2f} GB/s + "
                f"{self.disk_latency * 1e6:.0f} µs per read")
        if self.background_exposed > 0:
            text += (f", background copies {self.background_exposed:.2f}x their copy time "
                     "on the critical path")
        return text + (f" ({self.note})" if self.note else "")


PRESETS: dict[str, CostModel] = {
    "pcie4": CostModel("pcie4", bandwidth=25e9, latency=7e-6, gpu_bandwidth=936e9,
                       note="PCIe 4.0 x16 pinned, RTX 3090-class compute"),
    "pcie5": CostModel("pcie5", bandwidth=50e9, latency=7e-6, gpu_bandwidth=1792e9,
                       note="PCIe 5.0 x16 pinned, RTX 5090-class compute"),
}
COST_MODEL_NAMES: tuple[str, ...] = (*PRESETS, "calibrated")


def _background_cost(background: Any, compute: float, exposed: float) -> Any:
    """What background copying adds to a token: the exposed share ``exposed * background``
    plus whatever of the rest does not fit under ``compute``."""
    return exposed * background + np.maximum(0.0, (1.0 - exposed) * background - compute)


def fit_exposed(background: npt.NDArray[np.float64], compute: float, waited: float) -> float:
    """The exposed share ``e`` of background copying that makes the model's extra time over
    tokens whose background copying took ``background`` seconds each (modelled) equal the
    ``waited`` seconds measured; 0 when the part that does not fit under ``compute``
    already accounts for the waits (a GPU, where a wait is a copy longer than compute)."""
    total = float(np.sum(background))
    if total <= 0 or waited <= float(np.sum(_background_cost(background, compute, 0.0))):
        return 0.0
    low, high = 0.0, max(1.0, waited / total)  # e >= 1: the model's extra time is e * total
    for _ in range(60):  # the extra time only grows with e: bisect
        mid = (low + high) / 2
        if float(np.sum(_background_cost(background, compute, mid))) < waited:
            low = mid
        else:
            high = mid
    return (low + high) / 2


def _background_bytes(token: TokenRecord, bytes_per_expert: npt.NDArray[np.int64],
                      admitted: int | None = None) -> int:
    """Bytes ``token`` copied in the background: its admissions (its event rows'
    ``bytes_async``; ``admitted`` where the caller summed them) and its PSR prefetches
    (counters per MoE layer, which no event row holds)."""
    if admitted is None:
        admitted = int(token.events["bytes_async"].sum())
    if token.prefetches is None:
        return admitted
    return admitted + int((token.prefetches * bytes_per_expert).sum())


def calibrate(trace: Trace) -> CostModel:
    """Fit the cost model to the engine's own measurements in ``trace``.

    Bandwidth is the effective one of the synchronous copies (bytes fetched / time spent
    copying, per-copy latency included, so latency is 0); compute is the mean over decode
    tokens of wall time minus copy and wait time (the mean, like the tokens/s it is compared
    with, so one-off stalls such as a graph rebuild after a resize count).

    The time the decode waited for background copies (PSR prefetches, admissions) is not
    compute: it is given back as the exposed share of background copying
    (:func:`fit_exposed`), so that the recorded policy's estimate is its measured mean.
    Near 0 on a GPU, whose copy engine runs beside compute; on a CPU-only build the
    background copies are memcpys on a thread sharing the decode's cores, and the decode
    waits for them. Part of that wait is inside the fetches' own copy time (a fetch into a
    slot whose background copy is in flight waits for it, and the engine counts the wait in
    both): where the fetches were slower than the background copies' own rate, up to the
    waits, the difference is taken as waiting, not copying, so the copy speed that prices
    every policy's fetches is not the waiting rate of this one (on the demo model, a psr
    trace's fetches took 84 µs a copy, its background copies 10 µs). A trace without
    background copies (recorded under exact) cannot tell: they are assumed hidden, and the
    note says so. Raises when the trace has no timings (not recorded from the engine) or
    never copied anything.
    """
    at = [i for i, t in enumerate(trace.tokens) if t.timings is not None]
    timed = [trace.tokens[i] for i in at]
    if not timed:
        raise MoEScopeError("the trace has no engine timings; record it from the engine "
                            "(TraceRecorder with the engine as source) to calibrate")
    m = trace.header.model
    per_expert = np.asarray(m.bytes_per_expert, dtype=np.int64)
    # each token's bytes from the rows' columns (no event rows laid out)
    fetched, admitted = trace.token_sums("bytes_sync"), trace.token_sums("bytes_async")
    sync_us = sum(t.timings["sync_copy_us"] for t in timed if t.timings)
    sync_bytes = int(fetched[at].sum())
    async_us = sum(t.timings["async_copy_us"] for t in timed if t.timings)
    async_bytes = sum(_background_bytes(trace.tokens[i], per_expert, int(admitted[i]))
                      for i in at)
    waited_us = sum(t.timings["wait_us"] for t in timed if t.timings)
    held = False
    if sync_us > 0 and sync_bytes > 0:
        # a fetch into a slot whose background copy is still in flight waits for it within
        # its own copy time, and the engine counts that wait in both: up to the waits, the
        # fetches' time beyond the background copies' own rate is waiting, not copying
        if async_us > 0 and async_bytes > 0 and waited_us > 0:
            beyond = sync_us - sync_bytes / async_bytes * async_us
            held = beyond > 0
            sync_us -= min(waited_us, max(0.0, beyond))
        bandwidth = sync_bytes / (sync_us * 1e-6)
    elif async_us > 0 and async_bytes > 0:
        bandwidth = async_bytes / (async_us * 1e-6)
    else:
        raise MoEScopeError("the trace records no timed expert copies to calibrate "
                            "bandwidth from")
    decode_at = [i for i in at if trace.tokens[i].phase == "decode"
                 and trace.tokens[i].timings]
    decode = [trace.tokens[i] for i in decode_at]
    if not decode:
        raise MoEScopeError("the trace has no timed decode tokens to calibrate compute from")
    decode_sync = sum(t.timings["sync_copy_us"] for t in decode if t.timings) * 1e-6
    decode_wait = sum(t.timings["wait_us"] for t in decode if t.timings) * 1e-6
    if held:  # the waits within the decode's fetches, counted once (as waits)
        copying = int(fetched[decode_at].sum()) / bandwidth
        decode_sync -= max(0.0, decode_sync - copying)
    compute = max(0.0, float(np.mean([t.seconds for t in decode]))
                  - (decode_sync + decode_wait) / len(decode))
    note = f"fitted to {len(decode)} decode tokens of this trace"
    background = np.array([_background_bytes(trace.tokens[i], per_expert, int(admitted[i]))
                           for i in decode_at], dtype=np.float64) / bandwidth
    timed_background = (sum(t.timings["async_copy_us"] for t in decode if t.timings) > 0
                        and background.sum() > 0)
    exposed = 0.0
    if not timed_background:
        note += "; background copies assumed hidden: none in this trace to measure"
    else:
        exposed = fit_exposed(background, compute, decode_wait)
        per_token = f"{decode_wait / len(decode) * 1e3:.3f} ms/token"
        note += (f"; the decode waited {per_token} for background copies" if exposed > 0
                 else f"; background copies hidden under compute, as measured: the decode "
                      f"waited {per_token} for them")
    fitted = CostModel("calibrated", bandwidth=bandwidth, latency=0.0, compute_s=compute,
                       background_exposed=exposed, note=note)
    from moescope.sim.calibration import load_calibration

    machine = load_calibration()
    if machine is None:  # the trace times no disk reads: say the disk's figures are assumed
        return replace(fitted, note=f"{fitted.note}; disk not measured, the presets' "
                                    "NVMe figures: moescope calibrate measures yours")
    return replace(fitted.with_overrides(disk_bandwidth=machine.disk_bandwidth,
                                         disk_latency=machine.disk_latency),
                   note=f"{fitted.note}; disk from moescope calibrate ({machine.created})")


def cost_model(name: str, trace: Trace | None = None) -> CostModel:
    """A preset by name, or ``calibrated`` (needs ``trace``)."""
    if name == "calibrated":
        if trace is None:
            raise MoEScopeError("the calibrated cost model needs a trace")
        return calibrate(trace)
    try:
        return PRESETS[name]
    except KeyError:
        raise MoEScopeError(f"unknown cost model {name!r} (known: "
                            f"{', '.join(COST_MODEL_NAMES)})") from None
