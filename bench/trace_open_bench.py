"""How long does opening a long trace hold the window's GUI thread?

A synthetic trace at Qwen3-Next's cache geometry (48 MoE layers x 512 experts, top-10, f32
router inputs, PSR predictions: ``moescope_testing.traces.synthetic_trace``) is reopened
(``reopen``: on the opener's thread in the window), then its snapshots are accounted into
the cache panel's numbers token by token (``CacheModel.add``, what the window did before
session 17) and in one pass (``CacheModel.add_many``), alternating, medians; then what the
opener's thread does after reading since session 18 (``account``: the panel's numbers and
the cost models' calibration), and the whole trace window built from the accounted trace
(``TraceWindow``: plots, what-if view; its preparation ahead off, so only the GUI thread's
own work counts).

    QT_QPA_PLATFORM=offscreen OPENBLAS_NUM_THREADS=1 .venv/bin/python \\
        bench/trace_open_bench.py --tokens 10000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tokens", type=int, default=10_000)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--dir", type=Path, default=None)
    args = ap.parse_args()

    from moescope.display.cache_model import CacheModel
    from moescope.display.trace_io import account, reopen
    from moescope_testing.traces import bench_trace

    _, path = bench_trace(args.dir, args.tokens, "moescope-open-bench-")
    t = time.perf_counter()
    reopened = reopen(path)
    t_reopen = time.perf_counter() - t

    def accounting(bulk: bool) -> float:
        model = CacheModel()
        model.reset(reopened.model)
        t0 = time.perf_counter()
        if bulk:
            model.add_many(reopened.tokens)
        else:
            for snap in reopened.tokens:
                model.add(snap)
        return time.perf_counter() - t0

    # the residency rebuild reopen does token by token (Residency, as the recorder does)
    from moescope.cache.residency import Residency

    def rebuild() -> float:
        h = reopened.trace.header
        residency = Residency(h.model.moe_layers, h.model.n_expert, h.slots_per_layer)
        t0 = time.perf_counter()
        for rec in reopened.trace.tokens:
            residency.advance_token(rec)
            if rec.resident is not None:
                residency.apply_masks(rec.resident)
        return time.perf_counter() - t0

    rebuilds = [rebuild() for _ in range(args.reps)]
    one, many = [], []
    for _ in range(args.reps):
        one.append(accounting(False))
        many.append(accounting(True))

    from PySide6.QtWidgets import QApplication

    from moescope.gui.traces.trace_window import TraceWindow
    from moescope.gui.traces.whatif_view import WhatIfView

    app = QApplication.instance() or QApplication([])
    WhatIfView.prepare_ahead = False
    accounts, builds = [], []
    for _ in range(args.reps):
        t0 = time.perf_counter()
        accounted = account(reopened)
        accounts.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        window = TraceWindow(path, accounted)
        window.show()
        app.processEvents()
        builds.append(time.perf_counter() - t0)
        window.close()
        window.deleteLater()
        app.processEvents()

    # closing just after opening, while the what-if prepares ahead: the window hides and
    # the worker's thread ends after its step in flight (since session 18), against
    # joining that thread on the GUI thread first (before)
    WhatIfView.prepare_ahead = True
    accounted = account(reopened)
    closes: dict[str, list[float]] = {"close": [], "join": []}
    for _ in range(args.reps):
        for how in closes:
            window = TraceWindow(path, accounted)
            window.show()
            app.processEvents()
            time.sleep(0.3)  # the worker is inside the layout or the ranking
            t0 = time.perf_counter()
            if how == "join":
                window.whatif.shutdown()
            window.close()
            closes[how].append(time.perf_counter() - t0)
            window.whatif.shutdown()
            window.deleteLater()
            app.processEvents()

    m_one, m_many = statistics.median(one), statistics.median(many)
    print(f"trace: {args.tokens} tokens x 48 layers x 512 experts, top-10 ({path})")
    print()
    print("| measure | result |")
    print("|---|---|")
    print(f"| reopen (the opener's thread) | {t_reopen:.2f} s |")
    print(f"| the residency rebuilt token by token (Residency) | "
          f"{statistics.median(rebuilds):.2f} s |")
    print(f"| the panel's numbers, token by token (add) | {m_one:.2f} s |")
    print(f"| the panel's numbers, one pass (add_many) | {m_many:.2f} s "
          f"({m_one / m_many:.1f}x) |")
    print(f"| the window's numbers and cost models (account, the opener's thread) | "
          f"{statistics.median(accounts):.2f} s |")
    print(f"| the trace window built and shown (GUI thread) | "
          f"{statistics.median(builds):.2f} s |")
    print(f"| closing it while the what-if prepares (GUI thread; joining first, as before) | "
          f"{statistics.median(closes['close']):.3f} s "
          f"({statistics.median(closes['join']):.2f} s) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
