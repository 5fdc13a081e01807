"""The Preferences window (Edit ▸ Preferences…, Ctrl+,).

What changes at once is applied at once (theme, font size, recording, folders); threads
and GPU layers shape how llama.cpp opens a model, so they apply at the next model load, and
the window says so next to them. Apply keeps the window open; OK applies and closes.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import QEvent, QSize, QTimer
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from moescope.engine.backend import NAMES, EngineBuild, engine_build
from moescope.gui.preferences.values import (
    FONT_MAX_PT,
    FONT_MIN_PT,
    MAX_GPU_LAYERS,
    MAX_THREADS,
    Preferences,
)
from moescope.util import paths

THEMES = (("system", "Follow the system"), ("light", "Light"), ("dark", "Dark"))


class WholeTextSpinBox(QSpinBox):
    """Never narrower than its whole "Automatic (…)" text, in the font of the moment.

    A minimum width measured once, when the dialog opened, kept the old font's width
    after a larger font size was applied from the dialog (Apply), which then showed
    "utomatic (half the cores: 1)"; the size hint, which Qt measures again at every font
    change, includes the special value text."""

    def minimumSizeHint(self) -> QSize:
        return super().minimumSizeHint().expandedTo(self.sizeHint())


class WholePlaceholderLineEdit(QLineEdit):
    """A folder box wide enough for its placeholder, "default: FOLDER", in the font of the
    moment, up to half its screen's width (a longer one is named in the tooltip).

    The placeholder is the answer to "where do my models and traces go?", and the box's
    own width (17 characters) showed "default: /home/…/Mo" of it."""

    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        metrics = self.fontMetrics()
        need = (hint.width() - 17 * metrics.horizontalAdvance("x")  # Qt's own width
                + metrics.horizontalAdvance(self.placeholderText()) + 2 * metrics.height())
        screen = self.screen()
        if screen is not None:
            need = min(need, screen.availableGeometry().width() // 2)
        return QSize(max(hint.width(), need), hint.height())

    def minimumSizeHint(self) -> QSize:
        return super().minimumSizeHint().expandedTo(self.sizeHint())


def gpu_layers_auto_text(build: EngineBuild) -> tuple[str, str]:
    """What Automatic GPU layers does with the engine that runs (the engine puts every
    layer on the GPU where its build has a GPU backend, none otherwise), and a sentence
    for the tooltip. On a CPU build it read "all on a GPU build", which said nothing true
    of the build in use."""
    if build.backend == "cpu":
        return ("Automatic (none: CPU build)",
                "This engine is a CPU build: it runs every layer on the CPU whatever is "
                "set here.")
    if build.backend in NAMES:
        name = NAMES[build.backend]
        return (f"Automatic (all layers: {name} build)",
                f"This engine is a {name} build: Automatic puts every layer on the GPU.")
    return ("Automatic (all on a GPU build, none on a CPU one)",
            "The engine's backend is not known: Automatic puts every layer on the GPU if "
            "it has a GPU backend, none otherwise.")


class PreferencesDialog(QDialog):
    """Edits a :class:`Preferences`; ``apply`` hands the new one to the window."""

    def __init__(self, prefs: Preferences, apply: Callable[[Preferences], None],
                 parent: QWidget | None = None, build: EngineBuild | None = None) -> None:
        """``build``: the engine's backend (default: the installed engine's, as the About
        dialog and the memory view read it)."""
        super().__init__(parent)
        self.setWindowTitle("Preferences")
        self._apply = apply
        layout = QVBoxLayout(self)

        engine = QGroupBox("Engine (from the next model load)")
        form = QFormLayout(engine)
        self.threads = WholeTextSpinBox()
        self.threads.setRange(0, MAX_THREADS)
        self.threads.setSpecialValueText(f"Automatic (half the cores: {_half_cores()})")
        self.threads.setAccessibleName("Decode threads")
        self.threads.setToolTip("CPU threads llama.cpp decodes with; the experts' matrix "
                                "products on the CPU run on these")
        form.addRow("&Threads:", self.threads)
        self.gpu_layers = WholeTextSpinBox()
        self.gpu_layers.setRange(-1, MAX_GPU_LAYERS)
        auto, why = gpu_layers_auto_text(engine_build() if build is None else build)
        self.gpu_layers.setSpecialValueText(auto)
        self.gpu_layers.setAccessibleName("GPU layers")
        self.gpu_layers.setToolTip("Layers placed on the GPU, their expert slots with them; "
                                   f"0 keeps everything on the CPU. {why}")
        form.addRow("&GPU layers:", self.gpu_layers)
        layout.addWidget(engine)

        look = QGroupBox("Appearance")
        form = QFormLayout(look)
        self.theme = QComboBox()
        for key, label in THEMES:
            self.theme.addItem(label, key)
        self.theme.setAccessibleName("Theme")
        form.addRow("T&heme:", self.theme)
        self.font_pt = QSpinBox()
        self.font_pt.setRange(FONT_MIN_PT - 1, FONT_MAX_PT)
        self.font_pt.setSpecialValueText("System size")
        self.font_pt.setSuffix(" pt")
        self.font_pt.setAccessibleName("Font size")
        form.addRow("&Font size:", self.font_pt)
        layout.addWidget(look)

        files = QGroupBox("Folders and recording")
        form = QFormLayout(files)
        self.models_dir, models_browse = self._folder_row(
            form, "&Models folder:", "Models folder",
            "where downloads land and File ▸ Open starts")
        self.data_dir, _ = self._folder_row(form, "&Data folder:", "Data folder",
                                            "session traces are recorded in its traces/ "
                                            "folder")
        self.data_dir.setPlaceholderText(f"default: {paths.data_dir()}")
        self.data_dir.setToolTip(f"{self.data_dir.toolTip()}; empty: {paths.data_dir()}")
        forced = os.environ.get(paths.ENV_MODELS_DIR)
        if forced:  # the environment wins: a folder chosen here would do nothing
            where = paths.models_dir()
            self.models_dir.setPlaceholderText(f"{where} (set by {paths.ENV_MODELS_DIR})")
            self.models_dir.setToolTip(
                f"{paths.ENV_MODELS_DIR} is set to {where}: it decides where downloads land "
                "and File ▸ Open starts. Unset it to choose the folder here.")
            for widget in (self.models_dir, models_browse):
                widget.setEnabled(False)
        else:
            default = paths.data_dir() / "models"
            self.models_dir.setPlaceholderText(f"default: {default}")
            self.models_dir.setToolTip(f"{self.models_dir.toolTip()}; empty: {default}")
        profile = QLabel(f"Chats and settings stay in {paths.data_dir()} "
                         f"(set {paths.ENV_DATA_DIR} to move them).")
        profile.setObjectName("statsLabel")
        self.profile_note = profile
        profile.setWordWrap(True)
        form.addRow(profile)
        self.record = QCheckBox("&Record session traces")
        self.record.setToolTip("Off stops the current recording at once; on starts with "
                               "the next model load")
        form.addRow(self.record)
        layout.addWidget(files)

        self.error = QLabel()
        self.error.setObjectName("warningLabel")
        self.error.setWordWrap(True)
        self.error.hide()
        layout.addWidget(self.error)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok
                                        | QDialogButtonBox.StandardButton.Apply
                                        | QDialogButtonBox.StandardButton.Cancel)
        self.buttons.accepted.connect(self.accept)
        self.buttons.rejected.connect(self.reject)
        self.apply_button = self.buttons.button(QDialogButtonBox.StandardButton.Apply)
        self.apply_button.clicked.connect(self.apply)
        layout.addWidget(self.buttons)
        self.set_values(prefs)

    def _folder_row(self, form: QFormLayout, label: str, name: str,
                    tip: str) -> tuple[QLineEdit, QPushButton]:
        edit = WholePlaceholderLineEdit()
        edit.setAccessibleName(name)
        edit.setPlaceholderText("default")
        edit.setToolTip(tip)
        browse = QPushButton("Browse…")
        browse.setAccessibleName(f"Choose the {name.lower()}")
        browse.clicked.connect(lambda: self._browse(edit, name))
        row = QHBoxLayout()
        row.addWidget(edit, 1)
        row.addWidget(browse)
        form.addRow(label, row)
        lbl = form.labelForField(row)
        if isinstance(lbl, QLabel):
            lbl.setBuddy(edit)
        return edit, browse

    def _browse(self, edit: QLineEdit, name: str) -> None:
        start = edit.text() or str(Path.home())
        path = QFileDialog.getExistingDirectory(self, name, start)
        if path:
            edit.setText(path)

    def set_values(self, prefs: Preferences) -> None:
        self.threads.setValue(prefs.threads)
        self.gpu_layers.setValue(prefs.gpu_layers)
        self.theme.setCurrentIndex(max(0, self.theme.findData(prefs.theme)))
        self.font_pt.setValue(prefs.font_pt or self.font_pt.minimum())
        self.models_dir.setText(prefs.models_dir)
        self.data_dir.setText(prefs.data_dir)
        self.record.setChecked(prefs.record_traces)

    def values(self) -> Preferences:
        font = self.font_pt.value()
        return Preferences(
            threads=self.threads.value(), gpu_layers=self.gpu_layers.value(),
            theme=str(self.theme.currentData()),
            font_pt=0 if font < FONT_MIN_PT else font,
            models_dir=self.models_dir.text().strip(), data_dir=self.data_dir.text().strip(),
            record_traces=self.record.isChecked())

    def problem(self) -> str:
        """Why the values cannot be applied ("" when they can): a folder that is not one."""
        for name, edit in (("models folder", self.models_dir),
                           ("data folder", self.data_dir)):
            text = edit.text().strip()
            if text:
                path = Path(text).expanduser()
                if not path.is_dir():
                    return f"The {name} {path} is not an existing folder."
                if not os.access(path, os.W_OK | os.X_OK):
                    return f"The {name} {path} cannot be written to."
        return ""

    def changeEvent(self, event: QEvent) -> None:
        """A font size applied from the dialog (Apply) grows its rows: the dialog grows with
        them once Qt has laid them out in the new font. Its wrapped note's height depends on
        the width, which a dialog's minimum size does not count, so the note was cut off
        under the Data folder row (new-user review, 12 pt at 1366x768)."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._fit_pending = True

    def event(self, event: QEvent) -> bool:
        """After a font change, each relayout the new font brings (the rows' hints change
        one by one) fits the dialog again."""
        done = super().event(event)
        if event.type() == QEvent.Type.LayoutRequest and getattr(self, "_fit_pending", False):
            QTimer.singleShot(0, self, self.fit_to_contents)  # not after the dialog is gone
        return done

    def fit_to_contents(self) -> None:
        """At least as large as its rows need at the current width (the wrapped lines
        included), within the screen."""
        layout = self.layout()
        if layout is None:
            return
        layout.activate()
        width = max(self.width(), self.sizeHint().width())
        height = max(self.height(), self.sizeHint().height())
        if layout.hasHeightForWidth():
            height = max(height, layout.totalHeightForWidth(width))
        screen = self.screen()
        if screen is not None:
            room = screen.availableGeometry()
            width, height = min(width, room.width()), min(height, room.height())
        if (width, height) != (self.width(), self.height()):
            self.resize(width, height)

    def apply(self) -> bool:
        """Hand the values to the window; False (and the reason shown) when a folder is
        wrong."""
        problem = self.problem()
        self.error.setText(problem)
        self.error.setVisible(bool(problem))
        if problem:
            return False
        self._apply(self.values())
        return True

    def accept(self) -> None:
        if self.apply():
            super().accept()


def _half_cores() -> int:
    return max((os.cpu_count() or 2) // 2, 1)
