"""Child process for the kill test: chat, start a long answer, report, wait to be killed.

Run as ``python kill_target.py MODEL.gguf`` with MOESCOPE_DATA_DIR set. Prints one JSON
line once the second answer is streaming: the answer text the window has saved so far, the
answer's prefix and the session's trace; then its GUI thread sleeps until it is killed.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")

from moescope.gui.app import create_app
from moescope.gui.main_window import MainWindow
from moescope.gui.worker import LoadRequest

CHILD_BUSY_S = 60


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
            print(json.dumps({"saved": saved, "received": w.chat.tokens_received,
                              "prefix": w.chat.answer_prefix,
                              "trace": str(w.trace_path or "")}), flush=True)
            # then the window handles no event until it is killed (as if busy with a long
            # redraw): only the decode thread can save the tokens that follow
            time.sleep(CHILD_BUSY_S)

    w.modelLoaded.connect(loaded)
    w.chat.answerFinished.connect(finished)
    w.chat.tokensArrived.connect(tokens)
    w.load_model(LoadRequest(model, budget="25%", policy="quality-first", n_ctx=512))
    return int(app.exec())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
