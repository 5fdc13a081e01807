"""Opening a model in the main window: the file dialog, the fit estimate, the load on the
worker with progress and Cancel, what is remembered per model, and what a load's outcome
changes in the window.

A mixin of :class:`~moescope.gui.main_window.MainWindow` (the load flow drives the
window's status bar, chat, controls and cache panel); the engine work is the worker's.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import QByteArray
from PySide6.QtWidgets import QFileDialog

from moescope.gui.chat.welcome import has_get_models, welcome_html
from moescope.gui.dialogs.open_model import OpenModelDialog
from moescope.gui.worker import LoadRequest
from moescope.model.gguf_info import read_model_info
from moescope.model.ram_fit import DEFAULT_CONTEXT, is_auto
from moescope.session.snapshots import ModelSummary
from moescope.util import paths
from moescope.util.errors import MoEScopeError
from moescope.util.resources import demo_model_path
from moescope.util.words import utf8_name

log = logging.getLogger("moescope.gui")

if TYPE_CHECKING:
    from moescope.gui.main_window import MainWindow

    _Window = MainWindow
else:
    _Window = object

MAX_RECENT = 8


def budget_percent(slots: int, n_expert: int) -> str:
    """A percentage budget that buys exactly ``slots`` per layer on any model with
    ``n_expert`` experts (rounded up so the core's floor lands on ``slots``)."""
    return f"{math.ceil(slots * 100 / n_expert * 1e6) / 1e6}%"


def model_key(path: str | Path) -> str:
    """The settings group of one model file: its resolved path, hashed (any part of a split
    model names the first), so budget, policy and context are remembered per model."""
    p = Path(path).expanduser().resolve()
    name = re.sub(r"-\d{5}-of-(\d{5})\.gguf$", r"-00001-of-\1.gguf", p.name)
    # the name's bytes (the same as its UTF-8 for a UTF-8 name): one that is not UTF-8
    # (lone surrogates) could not be encoded
    return "model-" + hashlib.sha1(os.fsencode(p.with_name(name))).hexdigest()[:16]


def path_setting(path: str) -> str | QByteArray:
    """``path`` as the settings keep it: text, or where its name is not UTF-8 (a byte
    Python holds as a lone surrogate) its bytes, a ``@ByteArray`` in the settings file.
    QSettings drops a lone surrogate from a string: the path stored as text named another
    file (``demo-.gguf`` for ``demo-\\xff.gguf``), which was then "no longer there"."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return QByteArray(os.fsencode(path))
    return path


def setting_path(value: object) -> str:
    """A path read back from the settings (as :func:`path_setting` stored it); "" for
    anything else (an edited settings file)."""
    if isinstance(value, QByteArray | bytes | bytearray):
        return os.fsdecode(bytes(value)) if len(value) else ""
    return value if isinstance(value, str) else ""


def shown_path(path: str | Path) -> str:
    """``path`` as the window writes it: a byte that is not UTF-8 written ``\\xff`` (as the
    server's model id and the trace's model name are), which Qt would drop."""
    return utf8_name(str(path))


def found_on_disk(path: str) -> str:
    """The file a path from Qt names (the file dialog, a drop). Qt decodes a file name as
    UTF-8 with U+FFFD for each byte that is not: ``demo-\\ufffd.gguf`` names no file. Where
    ``path`` is missing and its folder holds exactly one file whose name decodes so, that
    file's (Python's) path; else ``path`` as it is."""
    if "\ufffd" not in path or os.path.exists(path):
        return path
    folder, name = os.path.split(path)
    try:
        entries = os.listdir(folder or ".")
    except OSError:
        return path
    fits = [e for e in entries if e != name and os.fsencode(e).decode("utf-8", "replace")
            == name]
    return os.path.join(folder, fits[0]) if len(fits) == 1 else path


class ModelLoading(_Window):
    """File ▸ Open model, Open recent, drag and drop, autoload: the path to a loaded model."""

    def recent_models(self) -> list[str]:
        value = self.settings.value("recent_models", [])
        if not isinstance(value, list):  # one entry reads back as itself
            value = [value]
        return [p for p in (setting_path(v) for v in value) if p]

    def last_model(self) -> str:
        """The model opened last ("" when none was)."""
        return setting_path(self.settings.value("last_model", ""))

    def _remember_model(self, path: str) -> None:
        recent = [path] + [p for p in self.recent_models() if p != path]
        self.settings.setValue("recent_models",
                               [path_setting(p) for p in recent[:MAX_RECENT]])
        self.settings.setValue("last_model", path_setting(path))
        self._rebuild_recent_menu()

    # ------------------------------------------------------------------ model
    def open_model_dialog(self) -> None:
        start = self._open_dialog_start()
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", str(start),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.prepare_open(found_on_disk(path))

    def _open_dialog_start(self) -> str:
        """The last model opened, unless that is the bundled demo (every first start):
        then the models folder, where Get models puts downloads, rather than the folder
        inside the checkout or bundle that the demo ships in."""
        last = self.last_model()
        demo = demo_model_path()
        if last and demo is not None:
            try:
                if Path(last).samefile(demo):
                    last = ""
            except OSError:  # gone or unreadable: the dialog copes with a missing file
                pass
        # a folder rather than the file where its name is not UTF-8 (Qt would drop the byte)
        if last and shown_path(last) != last:
            last = os.path.dirname(last)
        return last or str(paths.models_dir())

    def prepare_open(self, path: str | Path) -> None:
        """Read the header, show the fit estimate, load if the user confirms."""
        try:
            info = read_model_info(path, require_moe=False)
        except MoEScopeError as err:
            self.show_error("Cannot open this model", str(err))
            return
        dialog = OpenModelDialog(info, budget=self.default_budget(info.path),
                                 policy=str(self.model_setting(info.path, "policy",
                                                               "quality-first")),
                                 n_ctx=int(self.model_setting(info.path, "n_ctx", DEFAULT_CONTEXT)),
                                 parent=self)
        accepted = dialog.exec() == OpenModelDialog.DialogCode.Accepted
        request = dialog.request()
        dialog.deleteLater()  # one per File → Open: a long session opens many
        if accepted:
            self.load_model(request)

    def default_budget(self, path: str | Path | None = None) -> str:
        return str(self.model_setting(path, "budget", "25%"))

    def model_setting(self, path: str | Path | None, name: str, default: object) -> object:
        """``name`` as last used with the model at ``path``, else as last used with any
        model, else ``default``: a 30B and an 80B model want different budgets."""
        if path is not None:
            value = self.settings.value(f"{model_key(path)}/{name}")
            if value is not None:
                return value
        return self.settings.value(name, default)

    def _restore_audit(self, summary: ModelSummary) -> None:
        """The audit period last used with this model (or any), applied to the new engine:
        the control showed it while the engine audited nothing after a restart."""
        try:
            every = int(str(self.model_setting(summary.path, "audit", 0)))
        except ValueError:
            every = 0
        combo = self.controls.audit
        index = combo.findData(every if summary.cache_enabled else 0)
        if index < 0:  # a value no entry offers (an edited settings file): off
            index = combo.findData(0)
        combo.blockSignals(True)
        combo.setCurrentIndex(index)
        combo.blockSignals(False)
        self.cache_panel.set_audit_every(int(combo.currentData()))
        if combo.currentData():
            self.client.request_audit(int(combo.currentData()))

    def remember_setting(self, path: str | Path | None, name: str, value: object) -> None:
        """Remember ``name`` for the model at ``path`` and as the default for others."""
        self.settings.setValue(name, value)
        if path is not None:
            self.settings.setValue(f"{model_key(path)}/{name}", value)

    def load_model(self, request: LoadRequest | str | Path) -> bool:
        """Load in the worker (progress in the status bar); False if busy."""
        if isinstance(request, str | Path):
            path = request
            request = LoadRequest(path=str(path), budget=self.default_budget(path),
                                  policy=str(self.model_setting(path, "policy",
                                                                "quality-first")),
                                  n_ctx=int(self.model_setting(path, "n_ctx", DEFAULT_CONTEXT)))
        request = self.with_preferences(request)
        if self.recording and request.trace_dir is None:
            request = dataclasses.replace(request, trace_dir=str(paths.traces_dir()))
        if self.chat.generating or self.loading:
            self.show_error("Busy", "Wait for the current answer or load to finish (Esc "
                                    "stops an answer).")
            return False
        self.loading = True
        self.chat.model_loaded = False
        self.chat._update_buttons()
        self.model_label.setText(f"Loading {shown_path(Path(request.path).name)}…")
        self.progress.setValue(0)
        self.progress.show()
        self.cancel_load_button.setEnabled(True)
        self.cancel_load_button.show()
        self._pending_request = request
        self.client.load(request)
        return True

    def stop(self) -> None:
        """Esc: stop the answer, or the model load, in progress; with neither, cancel the
        edit of a message."""
        if self.loading:
            self.cancel_load()
        elif self.chat.generating:
            self.chat.stop()
        else:
            self.chat_view.cancel_edit()

    def cancel_load(self) -> None:
        """Stop the model load in progress (the worker says so with ``loadCancelled``)."""
        if self.loading:
            self._focus_off_cancel()
            self.cancel_load_button.setEnabled(False)
            self.model_label.setText("Cancelling…")
            self.client.cancel_load()

    def _on_load_progress(self, stage: str, fraction: float) -> None:
        self.progress.setValue(int(fraction * 100))
        self.progress.setFormat(f"{stage} %p%")

    def _focus_off_cancel(self) -> None:
        """Disabled or hidden, the focused Cancel button would hand the keyboard to the next
        widget in the chain (the chat search box, at the far end of the window)."""
        if self.cancel_load_button.hasFocus():
            self.chat_view.input.setFocus()

    def _load_ended(self) -> None:
        self.loading = False
        self._focus_off_cancel()
        self.progress.hide()
        self.cancel_load_button.hide()

    def _on_loaded(self, summary: ModelSummary) -> None:
        self._load_ended()
        self.model = summary
        self.chat.model_loaded = True
        self.chat.model_name = summary.name
        self.chat.answer_prefixes = dict(summary.answer_prefixes)
        self.chat_settings.set_thinking_choices(summary.thinking_choices)
        self.chat_settings.set_model_sampling(summary.sampling_defaults)
        self.cache_panel.set_model(summary)
        self.controls.set_model(summary)
        req = getattr(self, "_pending_request", None)
        self.controls.set_ram_auto(req is not None and is_auto(req.ram_budget))
        self._restore_audit(summary)
        self.trace_path = Path(summary.trace_path) if summary.trace_path else None
        self.trace_before_compare = None
        self.recording_now = self.trace_path is not None
        self.recent_tokens.clear()
        self._remember_model(summary.path)
        if req is not None:
            self.remember_setting(summary.path, "n_ctx", req.n_ctx)
            if isinstance(req.policy, str):
                self.remember_setting(summary.path, "policy", req.policy)
        if summary.cache_enabled and summary.n_expert:
            self.remember_setting(summary.path, "budget", budget_percent(
                summary.slots_per_layer, summary.n_expert))
        self._update_title()
        self.chat._update_buttons()
        self.chat.set_n_ctx(summary.n_ctx)
        self.chat_view.set_welcome(welcome_html(summary, get_models=has_get_models(self)))
        self.modelLoaded.emit(summary)
        notice, self._autoload_notice = getattr(self, "_autoload_notice", ""), ""
        # a RAM tier the load chose (a model larger than memory): told, not asked about
        notice = " · ".join(n for n in (notice, summary.ram_note) if n)
        if notice:
            self.show_status_note(notice)
        if summary.notice:
            self.show_warning("Model loaded with a note", summary.notice)

    def show_status_note(self, note: str) -> None:
        """Something chosen for the user, told not asked about (what auto chose for the RAM
        tier and why, at load or by the RAM budget's Auto live; a model opened instead of
        the last one): in the status bar and the log, not in a box."""
        log.warning("%s", note)
        self.statusBar().showMessage(note, 30_000)

    def _on_load_cancelled(self, message: str) -> None:
        """Nothing is loaded now (the previous model was freed before loading began)."""
        self._no_model()
        self.statusBar().showMessage(message, 8000)

    def _on_load_failed(self, message: str) -> None:
        self._no_model()
        self.modelFailed.emit(message)
        self.show_error("Could not load the model", message)

    def _no_model(self) -> None:
        self._load_ended()
        self._autoload_notice = ""  # what was opened instead did not open either
        self.model = None
        self.recording_now = False  # the worker ended the session's trace before loading
        self.chat.model_loaded = False
        self.cache_panel.set_model(None)
        self.controls.set_model(None)
        self.chat.set_n_ctx(0)
        self.chat_view.set_welcome(welcome_html(None, get_models=has_get_models(self)))
        self._update_title()
        self.chat._update_buttons()

    def autoload(self, model: str | Path | None = None) -> bool:
        """Load ``model``, else the last model, else the bundled demo model."""
        last = self.last_model()
        candidates = [model, last, demo_model_path()]
        for candidate in candidates:
            if candidate and Path(str(candidate)).is_file():
                if last and candidate != last and not model:  # the last one is gone
                    # said when the load ends, or the progress line would cover it
                    opened = ("the demo model" if candidate == candidates[-1]
                              else shown_path(candidate))
                    self._autoload_notice = (
                        f"The last model, {shown_path(last)}, is no longer there (moved, "
                        f"deleted or on a drive not mounted): opened {opened} instead.")
                return self.load_model(str(candidate))
        return False
