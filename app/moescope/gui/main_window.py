"""The main window: chats on the left, the conversation in the centre, the cache on the right.

The window wires parts together and owns what outlives a chat: the engine client (worker
thread), the chat store, QSettings, the session recording. Conversation rules live in
:mod:`chat_controller`, drawing in the panels; errors from anywhere end up in one dialog
(:meth:`MainWindow.show_error`) and the app stays usable.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import math
import re
from collections import deque
from pathlib import Path

from PySide6.QtCore import (
    QByteArray,
    QCoreApplication,
    QEvent,
    QSettings,
    Qt,
    QTimer,
    Signal,
    Slot,
)
from PySide6.QtGui import QAction, QCloseEvent, QDragEnterEvent, QDropEvent, QKeySequence
from PySide6.QtWidgets import (
    QFileDialog,
    QInputDialog,
    QMainWindow,
    QMessageBox,
    QProgressBar,
    QProgressDialog,
    QPushButton,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from moescope.core.errors import MoEScopeError
from moescope.core.files import write_atomic
from moescope.core.gguf_info import read_model_info
from moescope.core.memory import release_freed_memory
from moescope.core.resources import demo_model_path
from moescope.engine import Engine
from moescope.gui import paths
from moescope.gui.about_dialog import AboutDialog
from moescope.gui.cache_panel import CachePanel
from moescope.gui.chat_controller import ChatController
from moescope.gui.chat_list import ChatListPanel
from moescope.gui.chat_settings import ChatSettingsPanel
from moescope.gui.chat_view import ChatView
from moescope.gui.compare_dialog import CompareDialog
from moescope.gui.controls import ControlsPanel
from moescope.gui.elided_label import ElidedLabel
from moescope.gui.logs_view import LogsView
from moescope.gui.open_model_dialog import OpenModelDialog
from moescope.gui.policy_choices import POLICY_TIPS
from moescope.gui.shortcuts_dialog import ShortcutsDialog
from moescope.gui.snapshots import ModelSummary, TokenSnapshot
from moescope.gui.store import ChatStore
from moescope.gui.trace_io import ReopenedTrace, export_session, prune_traces
from moescope.gui.trace_opener import PROGRESS_STEPS, TraceOpener
from moescope.gui.trace_window import TraceWindow
from moescope.gui.worker import EngineClient, LoadRequest

log = logging.getLogger("moescope.gui")

MAX_RECENT = 8
RECENT_TOKENS = 256
"""Snapshots kept in memory for inspection; the full session is in the trace file. Each
holds its event rows and resident masks: about 65 KB a token with Qwen3-Next's 48 x 512
cache, so 4,096 of them (as before) held 258 MiB of a machine whose RAM holds the experts."""
RELEASE_DELAY_MS = 500
"""After a trace window closes, when its memory is handed back (it is deleted by then)."""
TOGGLE_SHORTCUT = "Ctrl+T"
MENU_POLICIES: tuple[tuple[str, str], ...] = (
    ("exact", "&Exact"), ("quality-first", "&Quality-first"), ("speed-first", "&Speed-first"),
    ("cache-prior", "Cache-&prior (routing bonus)"), ("psr", "PS&R (prefetch + bonus)"),
)
"""The Cache menu's presets (the operating points of both papers)."""
REMEMBERED_POLICIES = frozenset(key for key, _ in MENU_POLICIES)
"""Presets remembered as the next model's starting policy (Custom and the bare rules are
experiments, not a default)."""


def budget_percent(slots: int, n_expert: int) -> str:
    """A percentage budget that buys exactly ``slots`` per layer on any model with
    ``n_expert`` experts (rounded up so the core's floor lands on ``slots``)."""
    return f"{math.ceil(slots * 100 / n_expert * 1e6) / 1e6}%"


def model_key(path: str | Path) -> str:
    """The settings group of one model file: its resolved path, hashed (any part of a split
    model names the first), so budget, policy and context are remembered per model."""
    p = Path(path).expanduser().resolve()
    name = re.sub(r"-\d{5}-of-(\d{5})\.gguf$", r"-00001-of-\1.gguf", p.name)
    return "model-" + hashlib.sha1(str(p.with_name(name)).encode()).hexdigest()[:16]


class MainWindow(QMainWindow):
    modelLoaded = Signal(object)  # ModelSummary
    modelFailed = Signal(str)
    traceOpened = Signal(object)  # TraceWindow
    traceFailed = Signal(str)
    changesApplied = Signal(object, object)  # ModelSummary, list[str] (GUI thread)

    def __init__(self, *, engine: Engine | None = None, store: ChatStore | None = None,
                 settings: QSettings | None = None) -> None:
        super().__init__()
        self.setWindowTitle("MoEScope")
        self.setAcceptDrops(True)
        self.settings = settings or QSettings(str(paths.settings_path()),
                                              QSettings.Format.IniFormat)
        self.store = store or ChatStore(paths.chats_db_path())
        self.client = EngineClient(engine, parent=self)
        self.model: ModelSummary | None = None
        self.requested = (0, 0)
        """Numbers of the latest policy and budget requests sent to the engine: a report
        of an older one is stale, and must not move the control the user just moved."""
        self.loading = False
        self.recording = self._setting_bool("record_traces", True)
        self.trace_path: Path | None = None
        """The current session's trace file (recorded by the worker), if recording."""
        self.recent_tokens: deque[TokenSnapshot] = deque(maxlen=RECENT_TOKENS)
        self.trace_windows: list[TraceWindow] = []
        self._trace_openers: dict[TraceOpener, QProgressDialog] = {}
        """Traces being read, with their progress dialogs."""
        self.notices: list[tuple[str, str]] = []
        """Non-blocking warnings shown (``notify``), oldest first."""
        self._notice_boxes: list[QMessageBox] = []
        self._closed = False

        self.chat_list = ChatListPanel()
        self.chat_view = ChatView()
        self.controls = ControlsPanel()
        self.cache_panel = CachePanel()
        self.chat_settings = ChatSettingsPanel()
        self.logs = LogsView()
        self.logs.attach()
        self._build_layout()
        self.chat = ChatController(self.store, self.client, self.chat_view, self.chat_list,
                                   self.chat_settings, parent=self)
        self._build_menus()
        self._build_status_bar()
        self._connect()
        self._restore_settings()
        self.chat.refresh_list()
        chats = self.store.chats()
        if chats:
            self.chat.select_chat(chats[0].id)
        else:
            self.chat_view.render([], "No chat yet: type a message to start one")
            self.chat._update_buttons()
        for old in prune_traces(paths.traces_dir(), self.client.worker.trace_limits):
            log.info("deleted old session trace %s", old.name)
        if self.store.recovered:
            log.warning("%d answer(s) were cut off when MoEScope last stopped; their text "
                        "is kept and marked interrupted", self.store.recovered)

    # ------------------------------------------------------------------ building
    def _build_layout(self) -> None:
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 6, 6, 6)
        right_layout.addWidget(self.controls)
        self.right_tabs = QTabWidget()
        self.right_tabs.setAccessibleName("Side panels")
        self.right_tabs.addTab(self.cache_panel, "Cache")  # Alt+C is the Chat menu's
        self.right_tabs.addTab(self.chat_settings, "Chat settin&gs")
        self.right_tabs.addTab(self.logs, "&Logs")
        right_layout.addWidget(self.right_tabs, 1)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.chat_list)
        self.splitter.addWidget(self.chat_view)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setStretchFactor(2, 3)
        self.splitter.setSizes([200, 530, 620])  # the heatmap legend on one row
        self.setCentralWidget(self.splitter)
        self.resize(1380, 860)

    def _action(self, text: str, slot: object, shortcut: str | QKeySequence | None = None,
                tip: str = "") -> QAction:
        action = QAction(text, self)
        if shortcut is not None:
            action.setShortcut(QKeySequence(shortcut))
        if tip:
            action.setStatusTip(tip)
        action.triggered.connect(slot)
        self.addAction(action)
        return action

    def _build_menus(self) -> None:
        bar = self.menuBar()
        file = bar.addMenu("&File")
        file.addAction(self._action("&Open model…", self.open_model_dialog,
                                    QKeySequence.StandardKey.Open, "Open a GGUF model"))
        self.recent_menu = file.addMenu("Open &recent")
        file.addSeparator()
        file.addAction(self._action("Export chat as &Markdown…",
                                    lambda: self.export_chat_dialog("md")))
        file.addAction(self._action("Export chat as &JSON…",
                                    lambda: self.export_chat_dialog("json")))
        file.addSeparator()
        file.addAction(self._action("E&xport trace…", self.export_trace_dialog,
                                    "Ctrl+Shift+E", "Save this session's trace (JSONL), "
                                    "with a Perfetto timeline and a CSV of every token"))
        file.addAction(self._action("Open &trace…", self.open_trace_dialog, "Ctrl+Shift+O"))
        self.record_action = self._action(
            "&Record session traces", self._toggle_recording,
            tip="Record each model session to a trace file: off stops the current one at "
                "once, on starts with the next model load")
        self.record_action.setCheckable(True)
        self.record_action.setChecked(self.recording)
        file.addAction(self.record_action)
        file.addSeparator()
        file.addAction(self._action("&Quit", self.close, QKeySequence.StandardKey.Quit))

        chat = bar.addMenu("&Chat")
        chat.addAction(self._action("&New chat", self.new_chat, QKeySequence.StandardKey.New))
        chat.addAction(self._action("&Stop", self.stop, "Esc",
                                    "Stop the answer (or the model load) in progress"))
        chat.addAction(self._action("&Regenerate", self.chat.regenerate, "Ctrl+R"))
        chat.addAction(self._action("&Edit last message", self.chat.edit_last, "Ctrl+E"))
        chat.addAction(self._action("Re&name chat…", self.rename_current_dialog, "F2"))
        chat.addAction(self._action("&Delete chat", self.delete_current_dialog))
        chat.addAction(self._action("Focus &message box", self.chat_view.input.setFocus,
                                    "Ctrl+L"))

        cache = bar.addMenu("Cach&e")  # Alt+A is Answer now's, Alt+C the Chat menu's
        self.toggle_action = self._action(
            "&Toggle Speed-first / previous policy", self.controls.toggle_quality_speed,
            TOGGLE_SHORTCUT, "Switch to Speed-first (first-choice rule) and back to the "
                             "policy you were using")
        cache.addAction(self.toggle_action)
        cache.addAction(self._action(
            "Co&mpare policies on the last message…", self.open_compare_dialog,
            "Ctrl+Shift+P", "Greedy answers to your last message under several policies, "
                            "side by side with Exact's: speed, and where the answers part"))
        cache.addSeparator()
        for key, label in MENU_POLICIES:
            cache.addAction(self._action(label, lambda _=False, k=key:
                                         self.controls.select_policy(k), tip=POLICY_TIPS[key]))

        help_menu = bar.addMenu("&Help")
        help_menu.addAction(self._action("&Keyboard shortcuts", self.show_shortcuts,
                                         "Ctrl+/"))
        help_menu.addAction(self._action("&About MoEScope", self.show_about))
        self._rebuild_recent_menu()

    def _build_status_bar(self) -> None:
        self.model_label = ElidedLabel("No model loaded — File ▸ Open model… (Ctrl+O)")
        self.model_label.setAccessibleName("Model status")
        self.progress = QProgressBar()
        self.progress.setRange(0, 100)
        self.progress.setMaximumWidth(220)
        self.progress.setAccessibleName("Loading progress")
        self.progress.hide()
        self.cancel_load_button = QPushButton("Cancel")
        self.cancel_load_button.setAccessibleName("Cancel loading")
        self.cancel_load_button.setToolTip("Stop loading this model (a large model takes "
                                           "minutes to read into memory)")
        self.cancel_load_button.clicked.connect(self.cancel_load)
        self.cancel_load_button.hide()
        self.statusBar().addWidget(self.model_label, 1)
        self.statusBar().addPermanentWidget(self.progress)
        self.statusBar().addPermanentWidget(self.cancel_load_button)

    def _connect(self) -> None:
        w = self.client.worker
        w.loadProgress.connect(self._on_load_progress)
        w.loaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.loadCancelled.connect(self._on_load_cancelled)
        w.tokens.connect(self._on_tokens)
        # bound methods of this QObject, never lambdas: a lambda connected to a worker
        # signal would run on the worker thread
        w.failed.connect(self._on_generation_failed)
        w.requestsApplied.connect(self._on_requests_applied)
        self.controls.policyRequested.connect(self.request_policy)
        self.controls.budgetRequested.connect(self.request_budget)
        self.chat.answerBegan.connect(lambda step: self.cache_panel.add_marker(step, "answer"))
        self.chat.problem.connect(self.show_error)
        self.chat.saveFailed.connect(self._on_save_failed)
        self.chat.saveRecovered.connect(self._on_save_recovered)
        # a bound slot, not a lambda: the worker emits on its own thread, and only a
        # receiver with a thread makes Qt queue the call to the GUI thread
        self.client.worker.recordingStopped.connect(self._on_recording_stopped)
        self.chat.answerFinished.connect(lambda _s: self._update_title())
        self.chat_list.renameRequested.connect(self.rename_chat_dialog)
        # after the controller made the chat (it connected first): the next keys are its text
        self.chat_list.newRequested.connect(self.chat_view.input.setFocus)
        self.chat_list.deleteRequested.connect(self.delete_chat_dialog)
        # one display clock: the cache panel's frame timer also flushes streamed text
        self.cache_panel.timer.timeout.connect(self.chat_view.flush)

    # ------------------------------------------------------------------ settings
    def _setting_bool(self, key: str, default: bool) -> bool:
        value = self.settings.value(key, default)
        return value in (True, "true", "1", 1) if not isinstance(value, bool) else value

    def _restore_settings(self) -> None:
        geometry = self.settings.value("window/geometry")
        if isinstance(geometry, QByteArray):
            self.restoreGeometry(geometry)
        state = self.settings.value("window/splitter")
        if isinstance(state, QByteArray):
            self.splitter.restoreState(state)
        sampling = self.settings.value("chat/sampling")
        if isinstance(sampling, dict):
            self.chat_settings.set_values(sampling)

    def _save_settings(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        self.settings.setValue("window/splitter", self.splitter.saveState())
        self.settings.setValue("chat/sampling", self.chat_settings.values())
        self.settings.setValue("record_traces", self.recording)
        self.settings.sync()

    def recent_models(self) -> list[str]:
        value = self.settings.value("recent_models", [])
        if isinstance(value, str):
            value = [value]
        return [str(v) for v in (value or [])]

    def _remember_model(self, path: str) -> None:
        recent = [path] + [p for p in self.recent_models() if p != path]
        self.settings.setValue("recent_models", recent[:MAX_RECENT])
        self.settings.setValue("last_model", path)
        self._rebuild_recent_menu()

    def _rebuild_recent_menu(self) -> None:
        self.recent_menu.clear()
        recent = self.recent_models()
        for path in recent:
            action = self.recent_menu.addAction(Path(path).name)
            action.setStatusTip(path)
            action.triggered.connect(lambda _=False, p=path: self.prepare_open(p))
        self.recent_menu.setEnabled(bool(recent))

    def _toggle_recording(self, on: bool) -> None:
        """Off stops the session's recording at once (at the next token mid-answer); on
        starts with the next model load, since a trace must begin with an empty cache for
        its replay to be exact."""
        self.recording = bool(on)
        self.settings.setValue("record_traces", self.recording)
        if not self.recording and self.trace_path is not None:
            self.client.stop_recording()
            self.statusBar().showMessage(
                f"Recording stopped; the trace so far is kept: {self.trace_path}", 8000)
        elif self.recording and self.client.worker.recorder is None:
            self.statusBar().showMessage(
                "Recording starts with the next model load (a trace begins with an empty "
                "cache, so that its replay is exact).", 8000)

    # ------------------------------------------------------------------ model
    def open_model_dialog(self) -> None:
        start = self.settings.value("last_model", "") or str(Path.home())
        path, _ = QFileDialog.getOpenFileName(self, "Open a GGUF model", str(start),
                                              "GGUF models (*.gguf);;All files (*)")
        if path:
            self.prepare_open(path)

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
                                 n_ctx=int(self.model_setting(info.path, "n_ctx", 2048)),
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
                                  n_ctx=int(self.model_setting(path, "n_ctx", 2048)))
        if self.recording and request.trace_dir is None:
            request = dataclasses.replace(request, trace_dir=str(paths.traces_dir()))
        if self.chat.generating or self.loading:
            self.show_error("Busy", "Wait for the current answer or load to finish (Esc "
                                    "stops an answer).")
            return False
        self.loading = True
        self.chat.model_loaded = False
        self.chat._update_buttons()
        self.model_label.setText(f"Loading {Path(request.path).name}…")
        self.progress.setValue(0)
        self.progress.show()
        self.cancel_load_button.setEnabled(True)
        self.cancel_load_button.show()
        self._pending_request = request
        self.client.load(request)
        return True

    def stop(self) -> None:
        """Esc: stop the answer, or the model load, in progress."""
        if self.loading:
            self.cancel_load()
        else:
            self.chat.stop()

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
        self.cache_panel.set_model(summary)
        self.controls.set_model(summary)
        self.trace_path = Path(summary.trace_path) if summary.trace_path else None
        self.recent_tokens.clear()
        self._remember_model(summary.path)
        req = getattr(self, "_pending_request", None)
        if req is not None:
            self.remember_setting(summary.path, "n_ctx", req.n_ctx)
            if isinstance(req.policy, str):
                self.remember_setting(summary.path, "policy", req.policy)
        if summary.cache_enabled and summary.n_expert:
            self.remember_setting(summary.path, "budget", budget_percent(
                summary.slots_per_layer, summary.n_expert))
        self._update_title()
        self.chat._update_buttons()
        self.chat_view.set_context(0, summary.n_ctx)
        self.modelLoaded.emit(summary)
        if summary.notice:
            self.show_warning("Model loaded with a note", summary.notice)

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
        self.model = None
        self.chat.model_loaded = False
        self.cache_panel.set_model(None)
        self.controls.set_model(None)
        self.chat_view.set_context(0, 0)
        self._update_title()
        self.chat._update_buttons()

    def _update_title(self) -> None:
        m = self.model
        if m is None:
            self.setWindowTitle("MoEScope")
            self.model_label.setText("No model loaded — File ▸ Open model… (Ctrl+O)")
            return
        self.setWindowTitle(f"{m.name} — MoEScope")
        cache = (f"{m.slots_per_layer}/{m.n_expert} expert slots per layer · "
                 f"{m.n_moe_layers} MoE layers" if m.cache_enabled else "expert cache off")
        self.model_label.setText(f"{m.name} · {m.architecture} · {cache} · "
                                 f"context {m.n_ctx}")

    # ------------------------------------------------------------------ live control
    def request_policy(self, policy: object) -> None:
        from moescope.core.policy import Policy

        assert isinstance(policy, Policy)
        log.info("policy requested: %s", policy.name or "custom")
        self.requested = (self.client.request_policy(policy), self.requested[1])
        if policy.name in REMEMBERED_POLICIES:
            self.remember_setting(self.model.path if self.model else None, "policy",
                                  policy.name)

    def request_budget(self, slots: int) -> None:
        m = self.model
        if m is None or not m.cache_enabled:
            return
        log.info("budget requested: %d slots per layer", slots)
        self.requested = (self.requested[0],
                          self.client.request_budget(f"{slots * m.slot_row_bytes}B"))
        self.remember_setting(m.path, "budget", budget_percent(slots, m.n_expert))

    def _on_requests_applied(self, summary: ModelSummary, changes: list[str]) -> None:
        self.model = summary
        self._show_applied(summary.requests)
        self.cache_panel.update_model(summary)
        self._update_title()
        self._report_change_errors(changes)
        self.changesApplied.emit(summary, changes)

    def _show_applied(self, applied: tuple[int, int]) -> None:
        """Reflect what the engine applied, except where a newer request is still on its
        way: reports are queued, so one from before the user's latest change can arrive
        after it and would flip the control back for a moment."""
        assert self.model is not None
        self.controls.show_applied(self.model, policy=applied[0] >= self.requested[0],
                                   budget=applied[1] >= self.requested[1])

    def _on_tokens(self, snaps: list[TokenSnapshot]) -> None:
        if self._closed and self.chat.closed:
            return
        self.cache_panel.add_snapshots(snaps)
        self.recent_tokens.extend(snaps)
        changed = [s for s in snaps if s.changes]
        if changed and self.model is not None:
            last = snaps[-1]
            self.model = dataclasses.replace(self.model, slots_per_layer=last.slots_per_layer,
                                             policy=last.policy)
            self._show_applied(last.requests)
            self._update_title()
            for s in changed:
                self._report_change_errors(list(s.changes))

    def _on_generation_failed(self, message: str) -> None:
        self.show_error("Generation failed", message)

    def _report_change_errors(self, changes: list[str]) -> None:
        for change in changes:
            if change.startswith("budget error"):
                self.statusBar().showMessage(change, 8000)
                log.warning("%s", change)

    # ------------------------------------------------------------------ compare
    def open_compare_dialog(self) -> CompareDialog | None:
        """The comparison dialog for the chat's last user message (None, with the reason
        shown, when there is nothing to compare yet)."""
        m = self.model
        reason = ("Open a model first." if m is None else
                  "This model has no expert cache to compare policies on." if not m.cache_enabled
                  else "Wait for the answer to finish (or stop it)." if self.chat.generating
                  else "")
        messages = self.chat.prompt_of_last_answer() if not reason else []
        if not reason and not messages:
            reason = "Send a message first: the comparison answers your last message."
        if reason:
            self.show_warning("Nothing to compare", reason)
            return None
        assert m is not None
        dialog = CompareDialog(self.client, m, messages,
                               self.chat_settings.sampling().thinking, parent=self,
                               transcript=self.chat.history(),
                               custom=self.controls.custom_setting())
        dialog.finished.connect(lambda _r: self._after_compare(dialog))
        dialog.open()
        return dialog

    def _after_compare(self, dialog: CompareDialog) -> None:
        """A comparison empties the cache and starts a new session trace."""
        if dialog.result is not None:
            self.model = dialog.model
            self.trace_path = Path(dialog.model.trace_path) if dialog.model.trace_path \
                else None
        dialog.deleteLater()

    # ------------------------------------------------------------------ chats
    def new_chat(self) -> int:
        """Chat ▸ New chat: a new chat, and the keyboard in its message box."""
        chat_id = self.chat.new_chat()
        self.chat_view.input.setFocus()
        return chat_id

    def rename_current_dialog(self) -> None:
        if self.chat.chat_id is not None:
            self.rename_chat_dialog(self.chat.chat_id)

    def rename_chat_dialog(self, chat_id: int) -> None:
        chat = self.store.chat(chat_id)
        if chat is None:
            return
        title, ok = QInputDialog.getText(self, "Rename chat", "Title:", text=chat.title)
        if ok:
            self.chat.rename(chat_id, title)

    def delete_current_dialog(self) -> None:
        if self.chat.chat_id is not None:
            self.delete_chat_dialog(self.chat.chat_id)

    def delete_chat_dialog(self, chat_id: int) -> None:
        chat = self.store.chat(chat_id)
        if chat is None:
            return
        # No is the default: Enter (pressed once too often) never deletes a chat
        answer = QMessageBox.question(self, "Delete chat",
                                      f"Delete “{chat.title}” and all its messages?",
                                      QMessageBox.StandardButton.Yes
                                      | QMessageBox.StandardButton.No,
                                      QMessageBox.StandardButton.No)
        if answer == QMessageBox.StandardButton.Yes:
            self.chat.delete(chat_id)

    def export_chat_dialog(self, kind: str) -> None:
        if self.chat.chat_id is None:
            self.show_error("Nothing to export", "Select a chat first.")
            return
        chat = self.store.chat(self.chat.chat_id)
        name = (chat.title if chat else "chat").replace("/", "_")[:40] or "chat"
        pattern = "Markdown (*.md)" if kind == "md" else "JSON (*.json)"
        path, _ = QFileDialog.getSaveFileName(self, "Export chat", f"{name}.{kind}", pattern)
        if path:
            self.export_chat(path, kind)

    def export_chat(self, path: str | Path, kind: str) -> Path | None:
        """Write the chat as Markdown or JSON; None (and the user told) if it failed."""
        assert self.chat.chat_id is not None
        text = (self.store.export_markdown(self.chat.chat_id) if kind == "md"
                else self.store.export_json(self.chat.chat_id))
        try:
            dest = write_atomic(path, text)
        except OSError as err:
            self._export_failed("chat", path, err)
            return None
        log.info("chat exported to %s", dest)
        self.statusBar().showMessage(f"Chat saved to {dest}", 8000)
        return dest

    def _export_failed(self, what: str, path: str | Path, err: OSError) -> None:
        self.show_error(f"Could not export the {what}",
                        f"{Path(path)}: {err.strerror or err}. Nothing was written there "
                        "(a file already there is unchanged); free some space or pick "
                        "another folder.")

    # ------------------------------------------------------------------ traces
    def export_trace_dialog(self) -> None:
        if self.trace_path is None:
            self.show_error("No trace to export", "This session is not being recorded: turn "
                                                  "on File ▸ Record session traces and load "
                                                  "the model again.")
            return
        default = str(Path.home() / f"{self.trace_path.stem}.jsonl")
        path, _ = QFileDialog.getSaveFileName(self, "Export trace", default,
                                              "MoEScope trace (*.jsonl)")
        if path:
            self.export_trace(path)

    def export_trace(self, path: str | Path) -> tuple[Path, Path, Path] | None:
        """Copy the session's trace to ``path`` and write Perfetto JSON and a per-token
        CSV next to it; None (and the user told) if writing failed."""
        if self.trace_path is None:
            raise MoEScopeError("this session is not being recorded")
        recorder = self.client.worker.recorder
        if recorder is not None:  # the token its writer thread may still be writing
            with contextlib.suppress(OSError, ValueError):
                recorder.flush()
        try:
            files = export_session(self.trace_path, Path(path))
        except OSError as err:
            self._export_failed("trace", path, err)
            return None
        jsonl, perfetto, csv = files
        log.info("trace exported: %s, %s and %s", jsonl, perfetto.name, csv.name)
        self.statusBar().showMessage(
            f"Trace saved to {jsonl}, with {perfetto.name} and {csv.name}", 8000)
        return files

    def open_trace_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self, "Open trace", str(paths.traces_dir()),
            "MoEScope traces (*.jsonl *.jsonl.gz);;All files (*)")
        if path:
            self.open_trace(path)

    def open_trace(self, path: str | Path) -> TraceOpener:
        """Show a recorded session's plots in their own window, read on a thread (a long
        session's trace takes seconds to read): a progress dialog with Cancel appears if
        it takes a while, the chat goes on meanwhile, and ``traceOpened`` (the window)
        or ``traceFailed`` (the message, also shown) says how it ended."""
        opener = TraceOpener(path)
        dialog = QProgressDialog(f"Reading {Path(path).name}…", "Cancel", 0,
                                 PROGRESS_STEPS, self)
        dialog.setWindowTitle("Open trace")
        dialog.setMinimumDuration(400)
        dialog.setAutoClose(False)
        dialog.setAutoReset(False)
        dialog.setValue(0)
        dialog.canceled.connect(opener.cancel)
        # the opener emits from its own thread: only bound slots of GUI-thread objects
        # (queued), never lambdas, which would run on the reading thread
        opener.progressed.connect(dialog.setValue)
        opener.opened.connect(self._trace_opened)
        opener.failed.connect(self._trace_failed)
        opener.finished.connect(self._trace_opener_finished)
        self._trace_openers[opener] = dialog
        opener.start()
        return opener

    @Slot()
    def _trace_opener_finished(self) -> None:
        opener = self.sender()
        dialog = self._trace_openers.pop(opener, None)  # type: ignore[call-overload]
        if dialog is not None:
            dialog.reset()
            dialog.deleteLater()
        if opener is not None:
            opener.deleteLater()

    @Slot(str, object)
    def _trace_opened(self, path: str, reopened: ReopenedTrace) -> None:
        if self._closed:
            return
        window = TraceWindow(path, reopened)
        window.closed.connect(self._trace_window_closed)
        window.show()
        self.trace_windows.append(window)
        self.traceOpened.emit(window)

    @Slot(object)
    def _trace_window_closed(self, window: TraceWindow) -> None:
        """Free a closed trace window: it holds the whole trace (every token's masks and
        router inputs), and a closed window is never shown again."""
        self.trace_windows = [w for w in self.trace_windows if w is not window]
        window.deleteLater()
        if not self._closed and self.isVisible():
            self.activateWindow()  # the keyboard goes back where it was, not nowhere
        # once it is gone, hand its memory back to the system (the allocator would keep
        # the peak for the rest of the session)
        QTimer.singleShot(RELEASE_DELAY_MS, release_freed_memory)

    @Slot(str)
    def _trace_failed(self, message: str) -> None:
        if not self._closed:
            self.show_error("Cannot open the trace", message)
            self.traceFailed.emit(message)

    # ------------------------------------------------------------------ dialogs
    def show_error(self, title: str, message: str) -> None:
        log.error("%s: %s", title, message)
        QMessageBox.critical(self, title, message)

    @Slot(str)
    def _on_save_failed(self, text: str) -> None:
        self.notify("Could not save the chat", text)

    @Slot()
    def _on_save_recovered(self) -> None:
        self.statusBar().showMessage("The chat is saved again.", 8000)

    @Slot(str)
    def _on_recording_stopped(self, text: str) -> None:
        self.notify("Session recording stopped", text)

    def notify(self, title: str, message: str) -> QMessageBox:
        """A warning that does not block: tokens keep streaming while it is shown (a modal
        box mid-answer would stall the display). It also stays in the status bar and the
        log; ``notices`` keeps every one shown."""
        log.warning("%s: %s", title, message)
        self.notices.append((title, message))
        self.statusBar().showMessage(f"{title}: {message}")
        box = QMessageBox(QMessageBox.Icon.Warning, title, message,
                          QMessageBox.StandardButton.Ok, self)
        box.setModal(False)
        box.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)  # a long session has many
        box.finished.connect(lambda _r, b=box: self._notice_boxes.remove(b))
        self._notice_boxes.append(box)
        box.show()
        return box

    def show_warning(self, title: str, message: str) -> None:
        log.warning("%s: %s", title, message)
        QMessageBox.warning(self, title, message)

    def show_shortcuts(self) -> ShortcutsDialog:
        """Every shortcut of the window, its chat view and chat list (non-modal, closes on
        Esc)."""
        dialog = ShortcutsDialog([*self.actions(), *self.chat_view.actions(),
                                  *self.chat_list.list.actions()], parent=self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.show()
        return dialog

    def show_about(self) -> None:
        dialog = AboutDialog(self)
        dialog.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose)
        dialog.exec()

    # ------------------------------------------------------------------ drag and drop
    def dragEnterEvent(self, event: QDragEnterEvent) -> None:
        urls = event.mimeData().urls()
        if urls and urls[0].isLocalFile() and urls[0].toLocalFile().endswith(
                (".gguf", ".jsonl", ".jsonl.gz")):
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        path = event.mimeData().urls()[0].toLocalFile()
        event.acceptProposedAction()
        if path.endswith((".jsonl", ".jsonl.gz")):
            self.open_trace(path)
        else:
            self.prepare_open(path)

    # ------------------------------------------------------------------ startup / close
    def autoload(self, model: str | Path | None = None) -> bool:
        """Load ``model``, else the last model, else the bundled demo model."""
        candidates = [model, self.settings.value("last_model", ""), demo_model_path()]
        for candidate in candidates:
            if candidate and Path(str(candidate)).is_file():
                return self.load_model(str(candidate))
        return False

    def closeEvent(self, event: QCloseEvent) -> None:
        """Stop a running answer (it is saved as stopped), free the engine, save state."""
        if not self._closed:
            self._closed = True
            self.chat.stop()
            self.cache_panel.stop()
            self.client.shutdown()
            # deliver what the worker emitted before it stopped (the last tokens and the
            # answer's finished signal), so the stopped answer is saved with its stats
            QCoreApplication.sendPostedEvents(None, QEvent.Type.MetaCall)
            self.chat.closed = True
            if self.chat.answer_id is not None:  # the finished signal will not arrive now
                self.chat.close_answer(self.chat.answer_id)
                self.chat.answer_id = None
            if not self.chat.flush_pending():  # a last try: the process is about to end
                log.error("closing with unsaved answer text (%s): it is lost",
                          self.chat.save_error)
            self._save_settings()
            for box in list(self._notice_boxes):
                box.done(0)
            self.logs.detach()
            for opener in list(self._trace_openers):  # a trace being read: stop, join
                opener.cancel()
                opener.wait()
            for window in list(self.trace_windows):  # each closed one leaves the list
                window.close()
            self.store.close()
        super().closeEvent(event)
