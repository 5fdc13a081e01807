"""A fixed-size ring buffer of several named float columns, readable without copying.

Each value is written twice (at ``i`` and ``i + capacity``), so the last ``n`` values are
always one contiguous slice: the plots hand that view straight to pyqtgraph with no
``np.roll`` per frame (Friture's ring buffer trick).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
import numpy.typing as npt


class RingBuffer:
    """The latest ``capacity`` rows of named float64 columns."""

    def __init__(self, columns: Iterable[str], capacity: int) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self.capacity = capacity
        self._data = {name: np.zeros(2 * capacity) for name in columns}
        self._head = 0  # next write position in [0, capacity)
        self.count = 0  # rows held (<= capacity)
        self.total = 0  # rows ever appended

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self._data)

    def append(self, row: Mapping[str, float]) -> None:
        i = self._head
        for name, buf in self._data.items():
            value = row.get(name, np.nan)
            buf[i] = value
            buf[i + self.capacity] = value
        self._head = (i + 1) % self.capacity
        self.count = min(self.count + 1, self.capacity)
        self.total += 1

    def extend(self, rows: Mapping[str, npt.NDArray[np.float64]], n: int) -> None:
        """:meth:`append` of ``n`` rows given as columns (each of length ``n``; a column
        left out is NaN), to the same state: only the last ``capacity`` are written."""
        cap = self.capacity
        keep = min(n, cap)
        # the positions the last `keep` of n appends write, in order
        at = (self._head + n - keep + np.arange(keep)) % cap
        for name, buf in self._data.items():
            col = rows.get(name)
            values = np.nan if col is None else np.asarray(col, np.float64)[n - keep:]
            buf[at] = values
            buf[at + cap] = values
        self._head = (self._head + n) % cap
        self.count = min(self.count + n, cap)
        self.total += n

    def view(self, name: str) -> npt.NDArray[np.float64]:
        """The held values of ``name``, oldest first (a read-only view)."""
        end = self._head + self.capacity
        out = self._data[name][end - self.count:end]
        out.flags.writeable = False
        return out

    def last(self, name: str, default: float = float("nan")) -> float:
        if self.count == 0:
            return default
        return float(self._data[name][self._head + self.capacity - 1])

    def clear(self) -> None:
        for buf in self._data.values():
            buf[:] = 0.0
        self._head = self.count = self.total = 0
