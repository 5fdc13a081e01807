"""The main window's menu bar: File, Chat, Cache and Help, and the recent-models list.

A mixin of :class:`~moescope.gui.main_window.MainWindow` (it builds the window's actions,
which call the window's features); kept apart so the window's file reads as its layout
and wiring.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtGui import QAction, QActionGroup, QKeySequence

from moescope.display.policy_choices import POLICY_TIPS
from moescope.gui.hub import show_get_models
from moescope.gui.model_loading import shown_path

if TYPE_CHECKING:
    from moescope.gui.main_window import MainWindow

    _Window = MainWindow
else:
    _Window = object

TOGGLE_SHORTCUT = "Ctrl+T"
MENU_POLICIES: tuple[tuple[str, str], ...] = (
    ("exact", "&Exact"), ("quality-first", "&Quality-first"), ("speed-first", "&Speed-first"),
    ("cache-prior", "Cache-&prior (routing bonus)"), ("psr", "PS&R (prefetch + bonus)"),
    ("guard", "Quality &guard (cost under a target)"),
)
"""The Cache menu's presets (the operating points of both papers)."""


class WindowMenus(_Window):
    """Builds the menu bar (``_build_menus``) and keeps File ▸ Open recent current."""

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
        file.addAction(self._action("&Get models…", lambda: show_get_models(self),
                                    "Ctrl+Shift+G", "Find GGUF models on the Hugging Face "
                                    "Hub, see their fit, download and open them"))
        file.addSeparator()
        file.addAction(self._action("Export chat as &Markdown…",
                                    lambda: self.export_chat_dialog("md")))
        file.addAction(self._action("Export chat as &JSON…",
                                    lambda: self.export_chat_dialog("json")))
        file.addAction(self._action("&Import chat…", self.import_chat_dialog,
                                    tip="Open a chat exported as JSON (by MoEScope) as a new "
                                        "chat"))
        file.addSeparator()
        self.export_trace_action = self._action(
            "E&xport trace…", self.export_trace_dialog, "Ctrl+Shift+E",
            "Save a copy of this session's trace, with a Perfetto timeline and a CSV of "
            "every token")
        file.addAction(self.export_trace_action)
        file.addAction(self._action("Open &trace…", self.open_trace_dialog, "Ctrl+Shift+O"))
        self.sessions_menu = file.addMenu("Recent &sessions")
        """The newest recorded sessions, listed each time it opens."""
        self.sessions_action = self._action(
            "&All recorded sessions…", self.show_sessions, "Ctrl+Shift+R",
            "Every session trace in the traces folder: when, model, tokens, size; open one")
        self.sessions_menu.aboutToShow.connect(self._rebuild_sessions_menu)
        self.sessions_menu.addAction(self.sessions_action)
        self.record_action = self._action(
            "Recor&d session traces", self._toggle_recording,
            tip="Record each model session to a trace file: off stops the current one at "
                "once, on starts with the next model load")
        self.record_action.setCheckable(True)
        self.record_action.setChecked(self.recording)
        file.addAction(self.record_action)
        file.addAction(self._action("Serve &API…", self.serve.show_panel,
                                    tip="Serve this model over an OpenAI-compatible API"))
        file.addSeparator()
        # in File, not an Edit menu: every letter of "Edit" is another control's Alt+key
        file.addAction(self._action("&Preferences…", self.show_preferences, "Ctrl+,",
                                    "Threads, GPU layers, theme and font size, folders, "
                                    "trace recording"))
        file.addAction(self._action("&Quit", self.close, QKeySequence.StandardKey.Quit))

        chat = bar.addMenu("&Chat")
        chat.addAction(self._action("&New chat", self.new_chat, QKeySequence.StandardKey.New))
        chat.addAction(self._action("&Stop", self.stop, "Esc",
                                    "Stop the answer (or the model load) in progress; with "
                                    "neither, cancel the edit of a message"))
        chat.addAction(self._action("&Regenerate", self.chat.regenerate, "Ctrl+R"))
        chat.addAction(self._action("&Edit last message", self.chat.edit_last, "Ctrl+E"))
        chat.addAction(self._action("Ren&ame chat…", self.rename_current_dialog, "F2"))
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
        # the policy in use is ticked (none while Custom is): the combo's choice
        group = QActionGroup(self)
        group.setExclusionPolicy(QActionGroup.ExclusionPolicy.ExclusiveOptional)
        self.policy_actions: dict[str, QAction] = {}
        for key, label in MENU_POLICIES:
            action = self._action(label, lambda _=False, k=key: self._menu_policy(k),
                                  tip=POLICY_TIPS[key])
            action.setCheckable(True)
            group.addAction(action)
            cache.addAction(action)
            self.policy_actions[key] = action
        self.controls.policy_combo.currentIndexChanged.connect(self._tick_policy)
        self._tick_policy()

        help_menu = bar.addMenu("&Help")
        help_menu.addAction(self._action("&Keyboard shortcuts", self.show_shortcuts,
                                         "Ctrl+/"))
        help_menu.addAction(self._action("&About MoEScope", self.show_about))
        self._rebuild_recent_menu()

    def _menu_policy(self, key: str) -> None:
        self.controls.select_policy(key)
        self._tick_policy()  # a second click on the ticked entry keeps its tick

    def _tick_policy(self, _index: int = -1) -> None:
        """Tick the Cache menu's entry of the policy the panel shows (untick all for
        Custom, which has no entry)."""
        key = self.controls.policy_combo.currentData()
        for name, action in self.policy_actions.items():
            action.setChecked(name == key)

    def _rebuild_recent_menu(self) -> None:
        self.recent_menu.clear()
        recent = self.recent_models()
        for path in recent:
            action = self.recent_menu.addAction(shown_path(Path(path).name))
            action.setStatusTip(shown_path(path))
            action.triggered.connect(lambda _=False, p=path: self.prepare_open(p))
        self.recent_menu.setEnabled(bool(recent))
