"""Screenshot of the window mid-generation: ``python packaging/screenshot.py OUT.png``.

``make screenshot`` runs it under Xvfb. It opens the window with the demo model (or
``--model``; without either, a synthetic MoE model with enough experts to fill the
heatmap), sends a prompt, and ``--delay`` seconds after the first token, while tokens
still stream, grabs the window to ``OUT.png``. Chats and settings go to a temporary data directory,
so the user's own profile is never touched.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

PROMPT = "Recite some Shakespeare."
"""A prompt of the demo model's training (it knows only Shakespeare and Python)."""


def synthetic_model(directory: Path) -> Path:
    """A small qwen3moe with 8 layers x 64 experts (top-8): a readable heatmap."""
    from moescope_testing import ensure_synth_model, preset

    spec = preset("tiny", "qwen3moe", n_layers=8, n_expert=64, top_k=8, expert_type="q8_0")
    return ensure_synth_model(directory, spec)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="PNG file to write")
    parser.add_argument("--model", type=Path, help="GGUF model (default: the demo model)")
    parser.add_argument("--delay", type=float, default=2.0,
                        help="seconds after the first token before the grab (default 2)")
    parser.add_argument("--size", default="1920x1080", help="window size WxH")
    parser.add_argument("--budget", default="25%", help="expert budget (default 25%%)")
    args = parser.parse_args(argv)

    tmp = tempfile.TemporaryDirectory(prefix="moescope-shot-")
    os.environ["MOESCOPE_DATA_DIR"] = tmp.name
    from PySide6.QtCore import QTimer

    from moescope.gui.app import create_app
    from moescope.gui.main_window import MainWindow
    from moescope.gui.worker import LoadRequest
    from moescope.util.resources import demo_model_path

    model = args.model or demo_model_path()
    synthetic = model is None
    if model is None:
        model = synthetic_model(Path(tmp.name) / "models")
    app = create_app([sys.argv[0]])
    window = MainWindow()
    width, height = (int(v) for v in args.size.lower().split("x"))
    window.resize(width, height)
    window.show()
    status = {"code": 1, "armed": False}

    def grab() -> None:
        if status["code"] == 0:
            return
        args.out.parent.mkdir(parents=True, exist_ok=True)
        ok = window.grab().save(str(args.out), "PNG")
        print(f"{'wrote' if ok else 'could not write'} {args.out}")
        status["code"] = 0 if ok else 1
        window.close()
        app.quit()

    def loaded(_summary: object) -> None:
        # a small model decodes hundreds of tokens/s and would fill its context before the
        # grab; slow the copies (decisions do not depend on copy timing) to a big model's pace
        window.client.worker.engine.set_copy_delay(4000 if synthetic else 1500)
        window.chat_settings.max_tokens.setValue(2000)
        window.chat_settings.seed.setValue(3)
        window.chat.send(PROMPT)
        QTimer.singleShot(120_000, grab)  # never hang: grab whatever is there

    def answered(_summary: object) -> None:
        """An early end of text: keep the conversation going so the grab is mid-answer."""
        if status["code"] != 0 and not status.get("resent"):
            status["resent"] = True
            QTimer.singleShot(0, lambda: window.chat.send("Continue the play."))

    def first_tokens(_snaps: object) -> None:
        if not status["armed"]:
            status["armed"] = True
            QTimer.singleShot(int(args.delay * 1000), grab)

    def failed(message: str) -> None:
        print(f"screenshot: could not load {model}: {message}", file=sys.stderr)
        app.quit()

    window.modelLoaded.connect(loaded)
    window.chat.tokensArrived.connect(first_tokens)
    window.chat.answerFinished.connect(answered)
    window.modelFailed.connect(failed)
    window.load_model(LoadRequest(str(model), budget=args.budget, policy="quality-first",
                                  n_ctx=2048))
    app.exec()
    tmp.cleanup()
    return status["code"]


if __name__ == "__main__":
    sys.exit(main())
