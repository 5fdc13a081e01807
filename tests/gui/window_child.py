"""Child process for the window tests that need a process of their own: ``moescope MODEL``
as a user starts it (the command line's own ``main``, so ``sys.argv`` holds a name Python
decoded with lone surrogates), with a hook on the window: once the model loads, one short
chat answer; then one JSON line (what the window shows and saved), and the window closes,
or with ``--stay`` (taken out of the arguments first) stays open for the parent to signal.

Run as ``python window_child.py [--stay] MODEL.gguf`` with MOESCOPE_DATA_DIR and
QT_QPA_PLATFORM=offscreen set.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

from moescope.cli import main
from moescope.gui.main_window import MainWindow

_autoload = MainWindow.autoload
STAY = "--stay" in sys.argv
if STAY:
    sys.argv.remove("--stay")


def autoload(self: MainWindow, model: Any = None) -> bool:
    """The window's own autoload, then the chat once the model is in."""
    seen: dict[str, Any] = {}

    def loaded(summary: Any) -> None:
        seen["path"] = os.fsencode(summary.path).hex()
        seen["title"] = self.windowTitle()
        seen["recent"] = [a.text() for a in self.recent_menu.actions()]
        self.chat_settings.seed.setValue(3)
        self.chat_settings.max_tokens.setValue(6)
        seen["sent"] = self.chat.send("Hello there")

    def finished(answer: Any) -> None:
        seen["tokens"] = answer.n_tokens
        seen["streamed"] = self.chat.tokens_received
        seen["answer"] = self.store.messages(self.chat.chat_id)[-1].content
        seen["trace"] = os.fsencode(self.trace_path).hex() if self.trace_path else ""
        print(json.dumps(seen), flush=True)
        if not STAY:
            self.close()

    self.modelLoaded.connect(loaded)
    self.chat.answerFinished.connect(finished)
    return _autoload(self, model)


MainWindow.autoload = autoload  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
