"""Does the window keep up at the cache geometry of the models users run?

The real window over the real engine, streaming greedy answers from a synthetic model with
the cache geometry of the demo model (6 x 64, top-4) or Qwen3-Next-80B-A3B (48 MoE layers x
512 experts, top-10; tiny hidden sizes, so it decodes far faster than a real 80B model:
a stress test). Reported: decode rate, event-loop latency (a 10 ms heartbeat's lateness,
what a user feels as a sluggish window), the cache panel's work per token (the GUI side
of a snapshot) and per repaint (heatmap, plots, labels), with the session trace off and on.

    QT_QPA_PLATFORM=offscreen .venv/bin/python bench/window_bench.py
    QT_QPA_PLATFORM=offscreen .venv/bin/python bench/window_bench.py \
        --model resources/models/moescope-demo-qwen3moe.gguf
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

GEOMETRIES = {"demo": (6, 64, 4), "qwen3-next": (48, 512, 10)}
PROMPT = "The quick brown fox jumps over the lazy dog and keeps on running."


def measure(geometry: str, tokens: int, policy: str, models: Path, record: bool,
            model: Path | None = None) -> str:
    from PySide6.QtCore import Qt, QTimer

    from moescope.gui.app import create_app
    from moescope.gui.main_window import MainWindow
    from moescope.gui.worker import LoadRequest
    from moescope_testing.synth import SynthSpec, ensure_synth_model

    if model is not None:  # a real file: its own geometry
        from moescope.model.gguf_info import read_model_info

        info = read_model_info(model)
        layers, experts, k = len(info.moe_layers), info.n_expert, info.top_k
        path = model
    else:
        layers, experts, k = GEOMETRIES[geometry]
        spec = SynthSpec(arch="qwen3moe", n_layers=layers, n_expert=experts, top_k=k,
                         n_embd=64, n_ff_exp=32, expert_type="q8_0", ctx=1024)
        path = ensure_synth_model(models, spec)
    app = create_app([sys.argv[0]])
    window = MainWindow()
    window.resize(1440, 900)
    window.show()
    if window.recording != record:
        window.record_action.trigger()
    panel = window.cache_panel
    beats: list[float] = []
    add_cost: list[tuple[float, int]] = []
    draw_cost: list[float] = []
    add, draw = panel.add_snapshots, panel.draw

    def timed_add(snaps: list[Any]) -> None:
        t = time.perf_counter()
        add(snaps)
        add_cost.append((time.perf_counter() - t, len(snaps)))

    def timed_draw(*args: Any, **kw: Any) -> Any:
        t = time.perf_counter()
        out = draw(*args, **kw)
        draw_cost.append(time.perf_counter() - t)
        return out

    panel.add_snapshots, panel.draw = timed_add, timed_draw
    heartbeat = QTimer()
    heartbeat.setTimerType(Qt.TimerType.PreciseTimer)
    heartbeat.setInterval(10)
    heartbeat.timeout.connect(lambda: beats.append(time.perf_counter()))
    state: dict[str, Any] = {"n": 0, "t0": 0.0, "line": ""}

    def loaded(_summary: object) -> None:
        window.chat_settings.max_tokens.setValue(150)
        window.chat_settings.seed.setValue(5)
        gc.collect()
        heartbeat.start()
        state["t0"] = time.perf_counter()
        window.chat.send(PROMPT)

    def finished(summary: Any) -> None:
        state["n"] += summary.n_tokens
        if state["n"] < tokens:
            QTimer.singleShot(0, window.chat.regenerate)
            return
        heartbeat.stop()
        seconds = time.perf_counter() - state["t0"]
        late = np.diff(beats) * 1000.0 - 10.0
        per_token = sum(t for t, _ in add_cost) / max(1, sum(n for _, n in add_cost)) * 1000
        state["line"] = (
            f"| {geometry} ({layers} x {experts}, top-{k}) | {policy} | "
            f"{'on' if record else 'off'} | "
            f"{state['n'] / seconds:.0f} | {np.percentile(late, 50):.1f} | "
            f"{np.percentile(late, 99):.1f} | {per_token:.2f} | "
            f"{np.median(draw_cost) * 1000:.2f} | {np.percentile(draw_cost, 99) * 1000:.1f} |")
        window.close()
        app.quit()

    window.modelLoaded.connect(loaded)
    window.chat.answerFinished.connect(finished)
    window.load_model(LoadRequest(str(path), budget="25%", policy=policy, n_ctx=1024))
    QTimer.singleShot(600_000, app.quit)
    app.exec()
    return str(state["line"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=300)
    parser.add_argument("--policy", default="quality-first")
    parser.add_argument("--model", type=Path, default=None,
                        help="measure this GGUF (e.g. the shipped demo model) instead of "
                             "the synthetic geometries")
    parser.add_argument("--models", type=Path,
                        default=Path(tempfile.gettempdir()) / "moescope-window-bench")
    args = parser.parse_args()
    os.environ.setdefault("MOESCOPE_DATA_DIR", tempfile.mkdtemp(prefix="moescope-bench-"))
    print("| geometry | policy | trace | tok/s | loop latency p50 ms | p99 ms "
          "| panel ms/token | frame median ms | frame p99 ms |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|")
    for geometry in [args.model.name] if args.model is not None else GEOMETRIES:
        for record in (False, True):
            print(measure(geometry, args.tokens, args.policy, args.models, record,
                          args.model), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
