"""The window's side of Preferences: the dialog, and applying what it says.

A mixin of :class:`~moescope.gui.main_window.MainWindow` (applying touches the theme, the
chat view, the recording toggle and the folders the window reads).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from moescope.gui import theme
from moescope.gui.preferences.dialog import PreferencesDialog
from moescope.gui.preferences.values import Preferences, read_preferences, write_preferences
from moescope.gui.worker import LoadRequest
from moescope.util import paths

log = logging.getLogger("moescope.gui")

if TYPE_CHECKING:
    from moescope.gui.main_window import MainWindow

    _Window = MainWindow
else:
    _Window = object


class PreferencesFeature(_Window):
    """Edit ▸ Preferences…: ``show_preferences``, ``apply_preferences``."""

    preferences: Preferences

    def show_preferences(self) -> PreferencesDialog:
        dialog = PreferencesDialog(read_preferences(self.settings), self.apply_preferences,
                                   parent=self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.open()
        return dialog

    def apply_preferences(self, prefs: Preferences, *, startup: bool = False) -> None:
        """Store ``prefs`` and apply them: theme, font and folders at once, recording at
        once (off) or from the next load (on), threads and GPU layers at the next load."""
        old = getattr(self, "preferences", None)
        self.preferences = prefs
        if not startup:
            write_preferences(self.settings, prefs)
        self._choose_folders(prefs)
        app = QApplication.instance()
        if isinstance(app, QApplication) and theme.applied() != (prefs.theme, prefs.font_pt):
            theme.apply_theme(app, prefs.theme, prefs.font_pt)
            theme.recolour_views(self)  # not shown yet at startup: apply_theme skips it
            self.restyle()
        if prefs.record_traces != self.recording and not startup:
            self.record_action.setChecked(prefs.record_traces)
            self._toggle_recording(prefs.record_traces)
        if old is not None and (old.threads, old.gpu_layers) != (prefs.threads,
                                                                 prefs.gpu_layers):
            self.statusBar().showMessage("Threads and GPU layers apply from the next model "
                                         "load.", 8000)
        log.info("preferences: %s", prefs)

    def _choose_folders(self, prefs: Preferences) -> None:
        """Use the models and data folders ``prefs`` chose; one that cannot be made (an
        external disk not plugged in, a file in its way) is told in a notice and this
        session uses the default instead: the traces folder is made at start, and its
        error ended the start in a traceback, every start, with Preferences out of reach."""
        for kind, chosen, made, what in (
                ("models", prefs.models_dir, paths.models_dir, "models folder"),
                ("data", prefs.data_dir, paths.traces_dir, "data folder (traces)")):
            paths.choose_folder(kind, chosen)
            if not chosen:
                continue
            try:
                made()
            except OSError as err:
                paths.choose_folder(kind, None)
                self.notify("Folder not available",
                            f"The {what} chosen in Preferences, {chosen}, cannot be used "
                            f"({err.strerror or err}): this session uses the default "
                            f"instead. Connect the disk it is on, or choose another in "
                            f"Preferences.")

    def restyle(self) -> None:
        """Draw the chat again in the current theme's colours (its text keeps the colours
        it was drawn with)."""
        self.chat_view.forget_rendering()
        if self.chat.chat_id is not None:
            self.chat.render()
        else:
            self.chat_view.render([], self.chat_view.title.text())

    def with_preferences(self, request: LoadRequest) -> LoadRequest:
        """``request`` with the preferred threads and GPU layers where it names none."""
        options = self.preferences.load_options()
        return dataclasses.replace(
            request,
            n_threads=request.n_threads if request.n_threads is not None
            else options["n_threads"],
            n_gpu_layers=request.n_gpu_layers if request.n_gpu_layers is not None
            else options["n_gpu_layers"])
