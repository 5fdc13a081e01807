"""bench/bonus_bench.py: the routing-bonus calibration users run on their own model.

It is a benchmark (never run for timings in tests), but its table is what the README tells
users to trust, so its parts are checked: windows are disjoint and taken from the text's
end, and a tiny run over the real demo model prints one row per policy with Exact at
zero.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[1] / "bench" / "bonus_bench.py"


def _module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("bonus_bench", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_windows_are_disjoint_and_end_at_the_texts_end() -> None:
    w = _module().windows(list(range(100)), 3, 30)
    assert w == [list(range(10, 40)), list(range(40, 70)), list(range(70, 100))]
    assert _module().windows(list(range(50)), 3, 30) == [list(range(20, 50))]


def test_a_tiny_run_over_the_demo_model(engine_required: None, tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("ROMEO:\nBut soft, what light through yonder window breaks?\n" * 20,
                    encoding="utf-8")
    out = subprocess.run(
        [sys.executable, str(BENCH), "--text", str(text), "--windows", "2",
         "--window-tokens", "24", "--policies", "exact,cache-prior,psr:bonus=0.2"],
        capture_output=True, text=True, timeout=300, check=True).stdout
    rows = [line for line in out.splitlines() if line.startswith("| ") and "---" not in line]
    assert [r.split("|")[1].strip() for r in rows[1:]] == ["exact", "cache-prior",
                                                          "psr:bonus=0.2"]
    assert "+0.00% [+0.00, +0.00]" in rows[1]
