"""Sums over the core's event rows: what one token, one answer or a session cost.

The core writes one row per (step, layer, token); everything the CLI, the GUI and the
trace exports (Perfetto, CSV) show is a sum over rows, computed here once so all of them
agree. Qt-free and engine-free, so the trace code in ``core`` counts with it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt


@dataclass
class CacheTotals:
    """Sums over event rows (one token, one answer, or a whole session)."""

    rows: int = 0
    selections: int = 0
    hits: int = 0
    fetches: int = 0
    substitutions: int = 0
    admissions: int = 0
    evictions: int = 0
    substituted_mass: float = 0.0
    bytes_sync: int = 0
    bytes_async: int = 0
    tokens: int = 0
    disk_fills: int = 0
    """Slot fills (fetches and admissions) read from the model file (RAM tier on)."""
    bytes_disk: int = 0

    @classmethod
    def from_events(cls, rows: npt.NDArray[Any], tokens: int = 0) -> CacheTotals:
        """Totals of ``rows`` (``EVENT_DTYPE``); ``tokens`` is how many decode steps they span."""
        if len(rows) == 0:
            return cls(tokens=tokens)
        tiered = "n_disk" in (rows.dtype.names or ())
        return cls(
            disk_fills=int(rows["n_disk"].sum()) if tiered else 0,
            bytes_disk=int(rows["bytes_disk"].sum()) if tiered else 0,
            rows=len(rows),
            selections=int(rows["k"].sum()),
            hits=int(rows["n_hit"].sum()),
            fetches=int(rows["n_fetch"].sum()),
            substitutions=int(rows["n_substitute"].sum()),
            admissions=int(rows["n_admit"].sum()),
            evictions=int(rows["n_evict"].sum()),
            substituted_mass=float(rows["substituted_mass"].astype(np.float64).sum()),
            bytes_sync=int(rows["bytes_sync"].sum()),
            bytes_async=int(rows["bytes_async"].sum()),
            tokens=tokens,
        )

    def add(self, other: CacheTotals) -> None:
        for name in self.__dataclass_fields__:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def hit_rate(self) -> float:
        """Hits / selections: how often the router's choice was already resident."""
        return self.hits / self.selections if self.selections else 0.0

    @property
    def substituted_fraction(self) -> float:
        """% of expert calls that ran a substitute instead of the routed expert."""
        return self.substitutions / self.selections if self.selections else 0.0

    @property
    def mass_per_token(self) -> float:
        """Mean substituted gate mass per token, summed over layers (paper 1's metric)."""
        return self.substituted_mass / self.tokens if self.tokens else 0.0

    @property
    def disk_mb_per_token(self) -> float:
        """MB read from the model file per token (fetches and admissions)."""
        return self.bytes_disk / 1e6 / self.tokens if self.tokens else 0.0

    @property
    def ram_hit_rate(self) -> float:
        """Of the slot fills (fetches and admissions), the share served from the RAM tier
        rather than read from disk (1.0 with no fills or the tier off)."""
        fills = self.fetches + self.admissions
        return 1.0 - self.disk_fills / fills if fills else 1.0

    @property
    def fetched_mb_per_token(self) -> float:
        return self.bytes_sync / 1e6 / self.tokens if self.tokens else 0.0
