"""Does a window kept open for hours stay the same size?

The real window over the real engine on a synthetic model with Qwen3-Next's cache geometry
(48 MoE layers x 512 experts, top-10; tiny hidden sizes, so thousands of tokens stream in
minutes), session traces on. It streams answers back to back in one chat, switches the
policy every 5 answers and the budget every 7, and every ``--trace-every`` answers opens
the session's trace in a trace window (read on its thread) and closes it again, as a user
looking back now and then would. After every ``--sample`` tokens (and ``gc.collect()``) it
records the process's resident memory, Python objects, live widgets, trace windows kept,
threads and open file descriptors. Once the ring buffers are full, none of these should
grow with the tokens.

    QT_QPA_PLATFORM=offscreen .venv/bin/python bench/soak_bench.py --tokens 3000
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "app"))

GEOMETRY = (48, 512, 10)
PROMPTS = ("Tell me a long story.", "Explain the expert cache in detail.",
           "What happens next?", "Go on, please.")
POLICIES = ("quality-first", "speed-first", "psr", "exact")


def rss_mib() -> float:
    """Resident memory of this process (Linux ``/proc``), in MiB."""
    with open("/proc/self/statm", encoding="ascii") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def trimmed_rss_mib() -> float:
    """Resident memory after glibc hands its free pages back (``malloc_trim``): what is
    really held, as opposed to freed memory the allocator keeps for later."""
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return rss_mib()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=3000)
    parser.add_argument("--answer-tokens", type=int, default=200)
    parser.add_argument("--sample", type=int, default=500, help="tokens between samples")
    parser.add_argument("--trace-every", type=int, default=6,
                        help="answers between opening and closing the session's trace")
    parser.add_argument("--models", type=Path,
                        default=Path(tempfile.gettempdir()) / "moescope-window-bench")
    args = parser.parse_args()
    os.environ.setdefault("MOESCOPE_DATA_DIR", tempfile.mkdtemp(prefix="moescope-soak-"))

    from PySide6.QtCore import QTimer
    from PySide6.QtWidgets import QApplication, QMessageBox

    from moescope.gui.app import create_app
    from moescope.gui.main_window import MainWindow
    from moescope.gui.worker import LoadRequest
    from moescope_testing.synth import SynthSpec, ensure_synth_model

    for kind in ("critical", "warning", "information"):  # never block on a dialog
        setattr(QMessageBox, kind, staticmethod(
            lambda _parent, title, text, *_a, **_k: print(f"  dialog: {title}: {text}")))
    layers, experts, k = GEOMETRY
    spec = SynthSpec(arch="qwen3moe", n_layers=layers, n_expert=experts, top_k=k,
                     n_embd=64, n_ff_exp=32, expert_type="q8_0", ctx=1024)
    path = ensure_synth_model(args.models, spec)
    app = create_app([sys.argv[0]])
    window = MainWindow()
    window.resize(1440, 900)
    window.show()
    if not window.recording:
        window.record_action.trigger()
    rows: list[str] = []
    state: dict[str, Any] = {"tokens": 0, "answers": 0, "next_sample": 0, "t0": 0.0}

    def sample() -> None:
        gc.collect()
        rows.append(
            f"| {state['tokens']} | {rss_mib():.0f} | {trimmed_rss_mib():.0f} | "
            f"{len(gc.get_objects()) / 1000:.1f}k | "
            f"{len(QApplication.allWidgets())} | {len(window.trace_windows)} | "
            f"{threading.active_count()} | {len(os.listdir('/proc/self/fd'))} |")
        print(rows[-1], flush=True)
        state["next_sample"] += args.sample

    def send() -> None:
        window.chat.send(PROMPTS[state["answers"] % len(PROMPTS)])

    def loaded(_summary: object) -> None:
        window.chat_settings.max_tokens.setValue(args.answer_tokens)
        if not state["t0"]:
            state["t0"] = time.perf_counter()
            sample()
            send()

    def finished(summary: Any) -> None:
        state["tokens"] += summary.n_tokens
        state["answers"] += 1
        n = state["answers"]
        if state["tokens"] >= state["next_sample"]:
            sample()
        if state["tokens"] >= args.tokens:
            app.quit()
            return
        if n % 5 == 0:
            window.controls.select_policy(POLICIES[n // 5 % len(POLICIES)])
        if n % 7 == 0:
            window.controls.budget.setValue(64 + 64 * (n // 7 % 3))
        if n % args.trace_every == 0 and window.trace_path is not None:
            window.open_trace(window.trace_path)
            return  # the next answer starts once the trace window has come and gone
        QTimer.singleShot(0, send)

    def trace_opened(trace_window: Any) -> None:
        QTimer.singleShot(200, trace_window.close)
        QTimer.singleShot(400, send)

    window.modelLoaded.connect(loaded)
    window.traceOpened.connect(trace_opened)
    window.chat.answerFinished.connect(finished)
    print("| tokens | RSS MiB | after malloc_trim | Python objects | widgets "
          "| trace windows kept | threads | open fds |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|", flush=True)
    window.load_model(LoadRequest(str(path), budget="25%", policy="quality-first",
                                  n_ctx=1024))
    app.exec()
    seconds = time.perf_counter() - state["t0"]
    print(f"\n{state['tokens']} tokens in {state['answers']} answers, {seconds:.0f} s")
    window.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
