"""About: the versions a bug report needs (engine build key, llama.cpp commit, GPU)."""

from __future__ import annotations

import html
import platform

import pyqtgraph as pg
import PySide6
from PySide6.QtCore import Qt, qVersion
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QVBoxLayout, QWidget

from moescope import __version__
from moescope.cache.native import version as core_version
from moescope.engine.backend import backend_text, engine_build
from moescope.gui.widgets.screen_fit import fit_wrapped_height
from moescope.util.gpu import gpu_description

ABOUT_MAX_WIDTH = 640
"""Wider than this, the rows wrap: the backend's reason alone made the box 1,210 px wide,
more than a 1024-pixel screen."""
LLAMA_CPP_COMMIT = "0c1e570"
"""The llama.cpp commit vendored in llama-cpp-python 0.3.36, which our patches target."""


def versions() -> list[tuple[str, str]]:
    """(component, version) rows; a missing engine is reported, not raised."""
    try:
        import llama_cpp

        engine = str(llama_cpp.__version__)
    except Exception as err:  # the engine wheel is optional for the About box
        engine = f"not available ({err.__class__.__name__})"
    try:
        core = core_version()
    except Exception:
        core = "not available"
    return [
        ("MoEScope", __version__),
        ("Engine (llama-cpp-python + patch key)", engine),
        ("Engine backend", backend_text(engine_build())),
        ("llama.cpp commit", LLAMA_CPP_COMMIT),
        ("Expert-cache core", core),
        ("GPU", gpu_description()),
        ("Qt / PySide6", f"{qVersion()} / {PySide6.__version__}"),
        ("pyqtgraph", pg.__version__),
        ("Python", platform.python_version()),
        ("System", f"{platform.system()} {platform.release()} {platform.machine()}"),
    ]


class AboutDialog(QDialog):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("About MoEScope")
        layout = QVBoxLayout(self)
        head = QLabel("<h3>MoEScope</h3><p>Chat with big Mixture-of-Experts models on one "
                      "consumer GPU, and see what the expert cache does.</p>")
        head.setWordWrap(True)
        layout.addWidget(head)
        rows = "".join(f"<tr><td><b>{html.escape(k)}</b>&nbsp;&nbsp;</td>"
                       f"<td>{html.escape(v)}</td></tr>" for k, v in versions())
        self.table = QLabel(f"<table>{rows}</table>")
        self.table.setWordWrap(True)
        self.table.setMaximumWidth(ABOUT_MAX_WIDTH)
        self.table.setMinimumWidth(ABOUT_MAX_WIDTH * 3 // 4)
        self.table.setTextInteractionFlags(self.table.textInteractionFlags()
                                           | Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.table)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        buttons.accepted.connect(self.accept)
        layout.addWidget(buttons)

    def showEvent(self, event: QShowEvent) -> None:
        """At 12 pt on a 1024x700 screen the table's last row was cut in half."""
        super().showEvent(event)
        fit_wrapped_height(self)
