"""Child process for the kill test: chat, start a long answer, report, wait to be killed.

Run as ``python kill_target.py MODEL.gguf`` with MOESCOPE_DATA_DIR set. Prints one JSON
line once the second answer is streaming: the answer text the window has saved so far.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from moescope.gui.app import create_app
from moescope.gui.main_window import MainWindow
from moescope.gui.worker import LoadRequest


def main(model: str) -> int:
    app = create_app([])
    w = MainWindow()
    w.show()
    phase = {"n": 0}

    def loaded(_summary: object) -> None:
        w.client.worker.engine.set_copy_delay(20_000)  # slow tokens: plenty of time
        w.chat_settings.seed.setValue(3)
        w.chat_settings.max_tokens.setValue(4)
        w.chat.send("first question")

    def finished(_summary: object) -> None:
        if phase["n"] == 0:
            phase["n"] = 1
            w.chat_settings.max_tokens.setValue(400)
            w.chat.send("Tell me a story")

    def tokens(_snaps: object) -> None:
        if phase["n"] == 1 and w.chat.tokens_received >= 5:
            phase["n"] = 2
            saved = w.store.messages(w.chat.chat_id)[-1].content
            print(json.dumps({"saved": saved, "received": w.chat.tokens_received}), flush=True)

    w.modelLoaded.connect(loaded)
    w.chat.answerFinished.connect(finished)
    w.chat.tokensArrived.connect(tokens)
    w.load_model(LoadRequest(model, budget="25%", policy="quality-first", n_ctx=512))
    return int(app.exec())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
