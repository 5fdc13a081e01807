"""The fit of a file on the Hub, from its header alone, before any download.

The same :func:`~moescope.display.fit.estimate_fit` the Open dialog shows for a file on
disk, fed from a few MB read with range requests: slots per layer and the share of
experts resident at the chosen VRAM budget, the expert bytes that stay in host RAM, and
whether that RAM is there.
"""

from __future__ import annotations

from dataclasses import dataclass

from moescope.cache.budget import format_bytes, parse_budget
from moescope.display.fit import FitEstimate, estimate_fit
from moescope.hub.remote import FIRST_HEADER_BYTES, HubClient, RemoteModel
from moescope.model.gguf_info import ModelInfo
from moescope.model.ram_fit import DEFAULT_CONTEXT


@dataclass(frozen=True)
class RemoteFit:
    model: RemoteModel
    info: ModelInfo
    estimate: FitEstimate
    bytes_read: int
    """Bytes fetched for the header (all parts together)."""

    @property
    def fits(self) -> bool:
        return self.estimate.fits_ram and self.estimate.fits_vram

    def summary(self) -> str:
        """One line: what stays in VRAM, what lands in RAM, and whether it fits."""
        e = self.estimate
        if e.plan is None:
            where = (f"dense model (no routed experts): all "
                     f"{format_bytes(e.non_expert_bytes)} of weights load as usual")
        else:
            p = e.plan
            where = (f"{p.slots_per_layer}/{p.n_expert} experts per layer cached in VRAM "
                     f"({p.residency:.1%} resident, {format_bytes(p.bytes_used)}), all "
                     f"{format_bytes(e.expert_bytes)} of experts in RAM")
        verdict = ("fits" if self.fits else
                   f"needs {format_bytes(e.ram_needed)} RAM, "
                   f"{format_bytes(e.ram_available)} available" if not e.fits_ram else
                   "expert slots exceed free VRAM: choose a smaller budget")
        return f"{where}; RAM needed {format_bytes(e.ram_needed)}: {verdict}"


def remote_fit(client: HubClient, model: RemoteModel, budget: str = "25%",
               n_ctx: int = DEFAULT_CONTEXT, *, first_bytes: int = FIRST_HEADER_BYTES) -> RemoteFit:
    """Read ``model``'s header over HTTP and estimate its fit at ``budget``."""
    parse_budget(budget)  # a bad budget fails before any request
    info, read = client.read_header(model, first_bytes=first_bytes)
    return RemoteFit(model=model, info=info, estimate=estimate_fit(info, budget, n_ctx),
                     bytes_read=read)
