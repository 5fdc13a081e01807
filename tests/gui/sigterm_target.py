"""Child process for the SIGTERM test: ``moescope MODEL`` as a user starts it, with a hook
on the window: once the model loads, one short chat answer, then the line ``answered``
(and the trace's path) on stdout; the parent then sends a signal and the window must
close as File → Quit does.

Run as ``python sigterm_target.py MODEL.gguf`` with MOESCOPE_DATA_DIR and
QT_QPA_PLATFORM=offscreen set.
"""

from __future__ import annotations

import sys
from typing import Any

from moescope.cli import main
from moescope.gui.main_window import MainWindow

_autoload = MainWindow.autoload


def autoload(self: MainWindow, model: Any = None) -> bool:
    """The window's own autoload, then the chat once the model is in."""

    def loaded(_summary: Any) -> None:
        self.chat_settings.seed.setValue(3)
        self.chat_settings.max_tokens.setValue(6)
        self.chat.send("Hello there")

    def finished(_answer: Any) -> None:
        print("answered", self.trace_path or "", flush=True)

    self.modelLoaded.connect(loaded)
    self.chat.answerFinished.connect(finished)
    return _autoload(self, model)


MainWindow.autoload = autoload  # type: ignore[method-assign]

if __name__ == "__main__":
    sys.exit(main())
