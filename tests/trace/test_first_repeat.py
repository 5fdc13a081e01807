"""The rows' repeat check (validate._first_repeat) against a plain per-row reference: the
first row naming a value twice, across chunk boundaries, with and without padding, at
several widths and numbers of experts."""

from __future__ import annotations

import numpy as np
import pytest

from moescope.trace.validate import _first_repeat


def reference(ids: np.ndarray, padded: bool) -> int:
    for i, row in enumerate(ids.tolist()):
        named = [v for v in row if not (padded and v < 0)]
        if len(set(named)) != len(named):
            return i
    return -1


def rows(rng: np.random.Generator, n: int, width: int, n_values: int) -> np.ndarray:
    return np.stack([rng.choice(n_values, width, replace=False) for _ in range(n)])


@pytest.mark.parametrize("n_values,width", [(512, 10), (512, 32), (8, 8), (3000, 2), (8192, 10),
                                            (1, 1)])
def test_the_first_repeating_row_is_found_wherever_it_is(n_values: int, width: int) -> None:
    rng = np.random.default_rng(n_values + width)
    n = 5000  # several of the check's chunks at 512 values
    ids = rows(rng, n, width, n_values)
    assert _first_repeat(ids) == -1
    if width < 2:
        return
    for at in (0, 1, 2047, 2048, 2049, n - 1, int(rng.integers(n))):
        bad = ids.copy()
        j = int(rng.integers(1, width))
        bad[at, j] = bad[at, int(rng.integers(j))]
        later = min(n - 1, at + 7)
        bad[later, 0] = bad[later, 1]
        assert _first_repeat(bad) == reference(bad, False) == at


@pytest.mark.parametrize("n_values", [512, 8192])
def test_padding_is_left_out_and_never_repeats(n_values: int) -> None:
    rng = np.random.default_rng(7)
    n, width = 3000, 32
    ids = rows(rng, n, width, n_values).astype(np.int16)
    lengths = rng.integers(0, width + 1, n)
    ids[np.arange(width)[None, :] >= lengths[:, None]] = -1
    assert _first_repeat(ids, padded=True) == reference(ids, True) == -1
    long_rows = np.flatnonzero(lengths >= 2)
    for at in (long_rows[0], long_rows[len(long_rows) // 2], long_rows[-1]):
        bad = ids.copy()
        bad[at, 1] = bad[at, 0]
        assert _first_repeat(bad, padded=True) == reference(bad, True) == at
