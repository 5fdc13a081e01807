"""Helpers of the fuzz tests."""

from __future__ import annotations

from moescope_testing.forkrun import RunResult


def explain(r: RunResult) -> str:
    """What a failing run did, for the assertion message."""
    return (f"moescope {' '.join(r.argv)} -> {r.outcome} (exit {r.returncode}, signal "
            f"{r.signal}, {r.seconds:.1f} s, {r.max_rss >> 20} MiB)\n{r.stderr[-3000:]}")
