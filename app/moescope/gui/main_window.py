"""The main window: chats on the left, the conversation in the centre, the cache on the right.

The window wires parts together and owns what outlives a chat: the engine client (worker
thread), the chat store, QSettings, the session recording. Conversation rules live in
:mod:`.chat.controller`, drawing in the panels; errors from anywhere end up in one dialog
(:meth:`MainWindow.show_error`) and the app stays usable.
"""

from __future__ import annotations

import dataclasses
import errno
import logging
from collections import deque
from pathlib import Path

from PySide6.QtCore import (
    QByteArray,
    QCoreApplication,
    QEvent,
    QSettings,
    QSize,
    Qt,
    QTimer,
    Signal,
    Slot,
)
from PySide6.QtGui import QCloseEvent, QDragEnterEvent, QDropEvent, QResizeEvent, QTextCursor
from PySide6.QtWidgets import (
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

from moescope.cache.guard import GUARD, GuardSpec
from moescope.cache.policy import Policy
from moescope.display.trace_io import nothing_recorded
from moescope.engine import Engine
from moescope.engine.changes import RequestNumbers
from moescope.gui.cache.panel import CachePanel
from moescope.gui.chat.chat_actions import ChatActions
from moescope.gui.chat.chat_list import ChatListPanel
from moescope.gui.chat.chat_view import ChatView
from moescope.gui.chat.controller import ChatController
from moescope.gui.chat.settings import ChatSettingsPanel
from moescope.gui.chat.welcome import welcome_html
from moescope.gui.controls.cache_controls import ControlsPanel
from moescope.gui.dialogs.about import AboutDialog
from moescope.gui.dialogs.compare import CompareDialog
from moescope.gui.dialogs.shortcuts import ShortcutsDialog
from moescope.gui.menus import MENU_POLICIES, WindowMenus
from moescope.gui.model_loading import ModelLoading, budget_percent, found_on_disk, shown_path
from moescope.gui.preferences import PreferencesFeature, read_preferences
from moescope.gui.serve import ServeFeature
from moescope.gui.traces.session_list import SessionsDialog
from moescope.gui.traces.session_scan import SessionScanner
from moescope.gui.traces.session_traces import SessionTraces
from moescope.gui.traces.trace_opener import TraceOpener
from moescope.gui.traces.trace_window import TraceWindow
from moescope.gui.widgets.elided_label import ElidedLabel
from moescope.gui.widgets.logs_view import LogsView
from moescope.gui.widgets.named_tabs import name_tabs
from moescope.gui.widgets.screen_fit import fitting
from moescope.gui.widgets.scroll_column import ScrollColumn
from moescope.gui.widgets.status_tip import tooltip_follows_message
from moescope.gui.worker import EngineClient
from moescope.model.ram_fit import AUTO_CHANGE_MARK, AUTO_RAM_BUDGET
from moescope.session.snapshots import ModelSummary, TokenSnapshot
from moescope.session.store import ChatStore
from moescope.session.store_repair import OpenedStore, open_chat_store
from moescope.trace import TRACE_SUFFIXES, Change
from moescope.trace.names import live_trace_file
from moescope.util import paths

log = logging.getLogger("moescope.gui")

NO_MODEL = "No model loaded — File ▸ Open model… (Ctrl+O) or Get models… (Ctrl+Shift+G)"

RECENT_TOKENS = 256
"""Snapshots kept in memory for inspection; the full session is in the trace file. Each
holds its event rows and resident masks: about 65 KB a token with Qwen3-Next's 48 x 512
cache, so 4,096 of them (as before) held 258 MiB of a machine whose RAM holds the experts."""
REMEMBERED_POLICIES = frozenset(key for key, _ in MENU_POLICIES)
"""Presets remembered as the next model's starting policy (Custom and the bare rules are
experiments, not a default)."""
DRAFT_KEY = "chat/draft"
"""The message box's text when the window closed (a message typed, not yet sent), put back
at the next start: closing the window threw it away."""
DEFAULT_SIZE = QSize(1380, 860)
"""The first start's size: the heatmap legend on one row beside a roomy chat."""


def first_size(available: QSize) -> QSize:
    """The first start's size on a screen whose free area is ``available``: the default,
    or the whole free area where that is smaller (a 1366x768 laptop would otherwise show
    neither the message box's bottom nor the status bar, a 1024x700 one not the message
    box)."""
    return fitting(DEFAULT_SIZE, available)


class MainWindow(WindowMenus, ModelLoading, ChatActions, SessionTraces, PreferencesFeature,
                 QMainWindow):
    """Chats, the conversation and the cache side by side; features live in the mixins
    (:mod:`.menus`, :mod:`.model_loading`, :mod:`.chat.chat_actions`,
    :mod:`.traces.session_traces`, :mod:`.preferences`), this class builds, wires and
    closes."""

    modelLoaded = Signal(object)  # ModelSummary
    modelFailed = Signal(str)
    traceOpened = Signal(object)  # TraceWindow
    traceFailed = Signal(str)
    traceExportFinished = Signal(object)  # the three files, or None (failed or cancelled)
    changesApplied = Signal(object, object)  # ModelSummary, list[Change] (GUI thread)

    def __init__(self, *, engine: Engine | None = None,
                 store: ChatStore | OpenedStore | None = None,
                 settings: QSettings | None = None, owns_data: bool = True) -> None:
        """``owns_data``: this window holds its data folder's lock (:mod:`.instance_lock`);
        a window opened beside another one's leaves crash recovery of the chats, and the
        moving aside of a damaged chat database, to it."""
        super().__init__()
        self.setWindowTitle("MoEScope")
        self.setAcceptDrops(True)
        self.settings = settings or QSettings(str(paths.settings_path()),
                                              QSettings.Format.IniFormat)
        if store is None:
            store = open_chat_store(paths.chats_db_path(), recover=owns_data,
                                    repair=owns_data)
        opened = store if isinstance(store, OpenedStore) else OpenedStore(store)
        self.store = opened.store
        self.client = EngineClient(engine, parent=self)
        self.model: ModelSummary | None = None
        self.requested = RequestNumbers()
        """Numbers of the latest policy and budget requests sent to the engine: a report
        of an older one is stale, and must not move the control the user just moved."""
        self.loading = False
        self.recording = self._setting_bool("record_traces", True)
        self.trace_path: Path | None = None
        """The current session's trace file (recorded by the worker), if recording."""
        self.trace_before_compare: Path | None = None
        """The session's trace that the last comparison ended (its cache traffic is not
        the chat's): File ▸ Export trace names it until the new trace has a token."""
        self.recording_now = False
        """Whether the worker is still recording :attr:`trace_path` (told by the loaded
        model's summary and by ``recordingStopped``, never read from the worker)."""
        self.recent_tokens: deque[TokenSnapshot] = deque(maxlen=RECENT_TOKENS)
        self.trace_windows: list[TraceWindow] = []
        self._trace_openers: dict[TraceOpener, QProgressDialog] = {}
        """Traces being read, with their progress dialogs."""
        self._sessions_dialog: SessionsDialog | None = None
        """File ▸ Recent sessions ▸ All recorded sessions, while open."""
        self.sessions_scanner = SessionScanner()
        """Lists the traces folder on a thread for File ▸ Recent sessions."""
        self.sessions_scanner.listed.connect(self._sessions_listed)
        self.notices: list[tuple[str, str]] = []
        """Non-blocking warnings shown (``notify``), oldest first."""
        self._notice_boxes: list[QMessageBox] = []
        self._closed = False

        self.chat_list = ChatListPanel()
        self.chat_view = ChatView()
        self.chat_view.welcome = welcome_html(None)
        self.controls = ControlsPanel()
        self.cache_panel = CachePanel()
        self.chat_settings = ChatSettingsPanel()
        self.logs = LogsView()
        self.logs.attach()
        self._build_layout()
        self.chat = ChatController(self.store, self.client, self.chat_view, self.chat_list,
                                   self.chat_settings, parent=self)
        self.serve = ServeFeature(self)
        self._build_menus()
        self._build_status_bar()
        self._build_trace_exports()
        self._connect()
        self._restore_settings()
        self.apply_preferences(read_preferences(self.settings), startup=True)
        self.chat.refresh_list()
        chats = self.store.chats()
        if chats:
            self.chat.select_chat(chats[0].id)
        else:
            self.chat_view.render([], "No chat yet: type a message to start one")
            self.chat._update_buttons()
        draft = self.settings.value(DRAFT_KEY)
        if isinstance(draft, str) and draft:  # what was in the box when the window closed
            self.chat_view.input.setPlainText(draft)
            self.chat_view.input.moveCursor(QTextCursor.MoveOperation.End)
        # the keyboard starts in the message box, not in the first box of the focus chain
        # (Search chats, where a newcomer's first words emptied the chat list)
        self.chat_view.input.setFocus()
        self.client.prune_traces(paths.traces_dir())
        if self.store.recovered:
            log.warning("%d answer(s) were cut off when MoEScope last stopped; their text "
                        "is kept and marked interrupted", self.store.recovered)
        if opened.moved_to is not None:  # said once the window shows, on top of it
            notice = opened.notice()
            QTimer.singleShot(0, self, lambda: self.notify("Chat database damaged", notice))

    # ------------------------------------------------------------------ building
    def _build_layout(self) -> None:
        right = QWidget()
        right_layout = QVBoxLayout(right)
        right_layout.setContentsMargins(0, 3, 6, 3)
        self.right_split = QSplitter(Qt.Orientation.Vertical)  # drag the controls away
        self.right_split.addWidget(self.controls)
        self.right_tabs = QTabWidget()
        # scrolls where the window is shorter than the panel (its small print follows the
        # font size: at 11 pt on a 1024x700 screen it needs more height than there is)
        self.cache_scroll = ScrollColumn(self.cache_panel)
        self.right_tabs.addTab(self.cache_scroll, "Cache")  # Alt+C is the Chat menu's
        self.right_tabs.addTab(self.chat_settings, "Chat settin&gs")
        self.right_tabs.addTab(self.logs, "&Logs")
        name_tabs(self.right_tabs, "Side panels", [
            "The expert cache as the model runs: heatmap, plots, memory",
            "This chat's system prompt and sampling settings (temperature, max tokens, seed…)",
            "The app's and the engine's log records, live"])
        self.right_split.addWidget(self.right_tabs)
        self.right_split.setCollapsible(1, False)
        self.right_split.setStretchFactor(1, 1)
        self._controls_wanted: int | None = None
        """The cache controls' height wish last seen (``_give_controls_room``)."""
        self.controls.laidOut.connect(self._give_controls_room, Qt.ConnectionType.QueuedConnection)
        self.controls.laidOut.connect(self._fit_details, Qt.ConnectionType.QueuedConnection)
        self._controls_dragged = False
        """The user moved the border under the cache controls: their height is theirs."""
        self.right_split.splitterMoved.connect(
            lambda *_: setattr(self, "_controls_dragged", True))
        right_layout.addWidget(self.right_split, 1)
        self.splitter = QSplitter(Qt.Orientation.Horizontal)
        self.splitter.addWidget(self.chat_list)
        self.splitter.addWidget(self.chat_view)
        self.splitter.addWidget(right)
        self.splitter.setStretchFactor(0, 0)
        self.splitter.setStretchFactor(1, 3)
        self.splitter.setStretchFactor(2, 3)
        self.splitter.setSizes([170, 560, 650])  # the heatmap legend on one row
        self.splitter.setCollapsible(1, False)  # the chat list and the cache panel fold away
        self.setCentralWidget(self.splitter)
        self.resize(DEFAULT_SIZE)
        self._geometry_restored = False

    def _give_controls_room(self) -> None:
        """The cache controls as tall as they want (a larger font wraps the budget's line
        onto two), from the panel below, which scrolls; not where the user folded them
        away, nor past the tabs' least height. The splitter kept the height they had at
        the font of the first show: the budget's line was cut to one line at 11 pt. Only
        when they want more than before: a height the user dragged them to stays."""
        sizes = self.right_split.sizes()
        want = self.controls.sizeHint().height()
        wanted, self._controls_wanted = self._controls_wanted, want
        total = sum(sizes)
        if (not self.controls.details_shown() and sizes[0] > want
                and not self._controls_dragged):
            # rows folded away (Custom's parameters in a short window): the room they
            # leave goes to the plots below, unless the user dragged the border
            self.right_split.setSizes([want, total - want])
            return
        if wanted is None or want <= wanted:  # the first layout: as the splitter gave it
            return
        room = total - self.right_tabs.minimumSizeHint().height()
        if 0 < sizes[0] < want and sizes[0] < room:
            self.right_split.setSizes([min(want, room), total - min(want, room)])

    def _fit_details(self) -> None:
        """Fold Custom's parameter rows away under a preset where the right-hand column
        cannot hold the cache controls with them, the cache panel at its least and the
        first per-token plots whole (a 1024x700 screen at 12 pt: the plots were below the
        Cache tab's fold); and make the panel compact (no heatmap title, a two-line stats
        line) where it cannot hold them otherwise. Both are measured as if the rows were
        shown and the panel not compact, whatever they are now, so a window at the edge
        does not flip between the two."""
        controls, panel = self.controls, self.cache_panel
        if not self.right_split.sizes()[0]:  # folded away by the user: room enough
            controls.set_details_room(True)
            panel.set_compact(False)
            return
        shown = controls.details_shown()
        details = controls.details_height()
        full = controls.sizeHint().height() + (0 if shown else details)
        column = self.right_split.height() - self.right_split.handleWidth() - (
            self.right_tabs.tabBar().sizeHint().height() + 4)
        room = column >= full + panel.key_plots_height(compact=True)
        controls.set_details_room(room)
        rows = full if controls.details_shown() else full - details
        panel.set_compact(column < rows + panel.key_plots_height(compact=False))
        if shown != controls.details_shown():  # their room to the plots, or back
            QTimer.singleShot(0, self, self._give_controls_room)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        QTimer.singleShot(0, self, self._fit_details)

    def _build_status_bar(self) -> None:
        self.model_label = ElidedLabel(NO_MODEL)
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
        # a status bar clips a long message (an export's paths): the whole of it on hover
        tooltip_follows_message(self.statusBar())
        self.statusBar().addPermanentWidget(self.progress)
        self.statusBar().addPermanentWidget(self.cancel_load_button)
        # File → Serve API… keeps serving when its window is closed: say so here, where the
        # user looks, and open that window on a click (new-user review: nothing did)
        self.serving_button = QPushButton()
        self.serving_button.setFlat(True)
        self.serving_button.setAccessibleName("API server status")
        self.serving_button.clicked.connect(self.serve.show_panel)
        self.serving_button.hide()
        self.statusBar().addPermanentWidget(self.serving_button)
        self.serve.servingChanged.connect(self._show_serving)

    def _show_serving(self, serving: bool) -> None:
        """The status bar's API indicator: the address while serving, hidden otherwise."""
        self.serving_button.setVisible(serving)
        if serving:
            self.serving_button.setText(f"API: serving at {self.serve.url}")
            self.serving_button.setToolTip("Other programs can use the loaded model through "
                                           "this address. Click to see requests or stop.")

    def _connect(self) -> None:
        w = self.client
        w.loadProgress.connect(self._on_load_progress)
        w.loaded.connect(self._on_loaded)
        w.loadFailed.connect(self._on_load_failed)
        w.loadCancelled.connect(self._on_load_cancelled)
        w.tokens.connect(self._on_tokens)
        w.failed.connect(self._on_generation_failed)
        w.requestsApplied.connect(self._on_requests_applied)
        self.controls.policyRequested.connect(self.request_policy)
        self.controls.budgetRequested.connect(self.request_budget)
        self.controls.ramBudgetRequested.connect(self.request_ram_budget)
        self.controls.ramAutoRequested.connect(self.request_ram_auto)
        self.controls.auditRequested.connect(self._audit_requested)
        self.chat.answerBegan.connect(lambda step: self.cache_panel.add_marker(step, "answer"))
        self.chat.problem.connect(self.show_error)
        self.chat.saveFailed.connect(self._on_save_failed)
        self.chat.busy.connect(lambda why: self.statusBar().showMessage(why, 6000))
        self.chat_view.copied.connect(lambda what: self.statusBar().showMessage(what, 4000))
        self.chat.saveRecovered.connect(self._on_save_recovered)
        w.recordingStopped.connect(self._on_recording_stopped)
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
            self._geometry_restored = self.restoreGeometry(geometry)
        for key, splitter in self._splitters().items():  # folded panels stay folded
            state = self.settings.value(key)
            if isinstance(state, QByteArray):
                splitter.restoreState(state)
        sampling = self.settings.value("chat/sampling")
        if isinstance(sampling, dict):
            self.chat_settings.set_values(sampling)

    def _splitters(self) -> dict[str, QSplitter]:
        """The splitters whose positions a restart keeps, by settings key: the chat list's
        and the cache controls' (folded away on a small screen). The cache panel's fits
        its heatmap at each model load."""
        return {"window/splitter": self.splitter, "window/right_splitter": self.right_split}

    def fit_to_screen(self) -> None:
        """Before the first show: a window with no saved geometry fits its screen (a saved
        one is already brought onto the screen by ``restoreGeometry``)."""
        screen = self.screen()
        if self._geometry_restored or screen is None:
            return
        available = screen.availableGeometry()
        size = first_size(available.size())
        self.resize(size)
        if size != DEFAULT_SIZE:  # a small screen: all of it, from its top-left corner
            self.move(available.topLeft())

    def _save_settings(self) -> None:
        self.settings.setValue("window/geometry", self.saveGeometry())
        for key, splitter in self._splitters().items():
            self.settings.setValue(key, splitter.saveState())
        self.settings.setValue("chat/sampling", self.chat_settings.defaults)  # a new chat's
        self.settings.setValue("record_traces", self.recording)
        draft = self.chat_view.input.toPlainText()
        if draft.strip():
            self.settings.setValue(DRAFT_KEY, draft)
        else:
            self.settings.remove(DRAFT_KEY)
        self.settings.sync()

    def _update_title(self) -> None:
        m = self.model
        if m is None:
            self.setWindowTitle("MoEScope")
            self.model_label.setText(NO_MODEL)
            return
        # the file's name where the model has none: a byte of it that is not UTF-8, which
        # Qt would drop, written \xff
        name = shown_path(m.name)
        self.setWindowTitle(f"{name} — MoEScope")
        cache = (f"{m.slots_per_layer}/{m.n_expert} expert slots per layer · "
                 f"{m.n_moe_layers} MoE layers" if m.cache_enabled else "expert cache off")
        parts = [name, m.architecture, cache, f"context {m.n_ctx}"]
        self.model_label.setText(" · ".join(p for p in parts if p))  # a dense model: no arch

    # ------------------------------------------------------------------ live control
    def request_policy(self, policy: object) -> None:
        assert isinstance(policy, (Policy, GuardSpec))
        name = GUARD if isinstance(policy, GuardSpec) else policy.name
        log.info("policy requested: %s", name or "custom")
        self.requested = dataclasses.replace(self.requested,
                                             policy=self.client.request_policy(policy))
        if name in REMEMBERED_POLICIES:
            self.remember_setting(self.model.path if self.model else None, "policy", name)

    def _audit_requested(self, every: int) -> None:
        """Audit every ``every`` tokens (0 off), and remember it for the next start."""
        self.client.request_audit(every)
        self.cache_panel.set_audit_every(every)
        self.remember_setting(self.model.path if self.model else None, "audit", every)

    def request_budget(self, slots: int) -> None:
        m = self.model
        if m is None or not m.cache_enabled:
            return
        log.info("budget requested: %d slots per layer", slots)
        self.requested = dataclasses.replace(
            self.requested, budget=self.client.request_budget(f"{slots * m.slot_row_bytes}B"))
        self.remember_setting(m.path, "budget", budget_percent(slots, m.n_expert))

    def request_ram_budget(self, experts: int) -> None:
        """The RAM tier's experts per layer (``n_expert``: every expert in RAM), live."""
        m = self.model
        if m is None or not m.cache_enabled:
            return
        log.info("RAM budget requested: %d experts per layer", experts)
        self.client.request_ram_budget(f"{experts * m.slot_row_bytes}B")

    def request_ram_auto(self) -> None:
        """The RAM budget's Auto, live: the engine chooses from the memory available then,
        as at load; why comes back in the status bar (:meth:`_on_requests_applied`)."""
        m = self.model
        if m is None or not m.cache_enabled:
            return
        log.info("RAM budget requested: auto")
        self.client.request_ram_budget(AUTO_RAM_BUDGET)

    def _on_requests_applied(self, summary: ModelSummary, changes: list[Change]) -> None:
        self.model = summary
        self._show_applied(summary.requests)
        self.cache_panel.update_model(summary)
        self._update_title()
        self._report_change_errors([c.text for c in changes if c.kind == "error"])
        if summary.ram_note and any(c.kind == "note" and c.text.startswith("ram=") and
                                    c.text.endswith(AUTO_CHANGE_MARK) for c in changes):
            self.show_status_note(summary.ram_note)
        self.changesApplied.emit(summary, changes)

    def _show_applied(self, applied: RequestNumbers) -> None:
        """Reflect what the engine applied, except where a newer request is still on its
        way: reports are queued, so one from before the user's latest change can arrive
        after it and would flip the control back for a moment."""
        assert self.model is not None
        policy, budget = applied.at_least(self.requested)
        self.controls.show_applied(self.model, policy=policy, budget=budget)

    def _on_tokens(self, snaps: list[TokenSnapshot]) -> None:
        if self._closed and self.chat.closed:
            return
        self.cache_panel.add_snapshots(snaps)
        self.recent_tokens.extend(snaps)
        changed = [s for s in snaps if s.changes or s.errors]
        if changed and self.model is not None:
            last = snaps[-1]
            self.model = dataclasses.replace(self.model, slots_per_layer=last.slots_per_layer,
                                             policy=last.policy,
                                             ram_slots_per_layer=last.ram_slots_per_layer)
            self._show_applied(last.requests)
            self._update_title()
            for s in changed:
                self._report_change_errors(list(s.errors))

    def _on_generation_failed(self, message: str) -> None:
        self.show_error("Generation failed", message)

    def _report_change_errors(self, errors: list[str]) -> None:
        for error in errors:
            self.statusBar().showMessage(error, 8000)
            log.warning("%s", error)

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
            if self.trace_path is not None and not nothing_recorded(
                    live_trace_file(self.trace_path)):
                self.trace_before_compare = self.trace_path
            self.trace_path = Path(dialog.model.trace_path) if dialog.model.trace_path \
                else None
            self.recording_now = self.trace_path is not None
        dialog.deleteLater()

    # ------------------------------------------------------------------ dialogs
    def _export_failed(self, what: str, path: str | Path, err: OSError) -> None:
        full = err.errno in (errno.ENOSPC, errno.EDQUOT)  # else space is not the cure
        self.show_error(f"Could not export the {what}",
                        f"{Path(path)}: {err.strerror or err}. Nothing was written there "
                        "(a file already there is unchanged); "
                        + ("free some space or pick another folder." if full
                           else "pick another folder."))

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
        self.recording_now = False
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
        if urls and urls[0].isLocalFile() and urls[0].toLocalFile().lower().endswith(
                (".gguf", *TRACE_SUFFIXES)):  # any letter case, as `moescope X.GGUF` takes
            event.acceptProposedAction()

    def dropEvent(self, event: QDropEvent) -> None:
        path = found_on_disk(event.mimeData().urls()[0].toLocalFile())
        event.acceptProposedAction()
        if path.lower().endswith(TRACE_SUFFIXES):
            self.open_trace(path)
        else:
            self.prepare_open(path)

    # ------------------------------------------------------------------ startup / close
    def closeEvent(self, event: QCloseEvent) -> None:
        """Stop a running answer (it is saved as stopped), free the engine, save state."""
        if not self._closed:
            self._closed = True
            self.chat.stop()
            self.cache_panel.stop()
            self.sessions_scanner.cancel()
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
            self.trace_exports.shutdown()  # an export: stopped, joined, nothing left of it
            for window in list(self.trace_windows):  # each closed one leaves the list
                window.close()
            for window in self.trace_windows:  # closed, its what-if's thread still ending
                window.whatif.shutdown()
            self.store.close()
        super().closeEvent(event)
