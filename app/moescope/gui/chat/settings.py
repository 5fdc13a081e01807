"""System prompt and sampling settings of the current chat (temperature, top-p, top-k,
max tokens, seed, thinking). Plain widgets; the controller saves them with the chat (chat
store), the window the user's defaults (QSettings).

Each chat keeps its own settings: opening a chat shows (and samples with) what it was
given; a change applies to the chat shown and is saved with it. A new chat starts from
the user's defaults: the settings last chosen in the panel (in any chat), or MoEScope's
own until then. A chat from before settings were kept per chat has none saved: it is
shown with the user's defaults, and keeps them once it is sent to or edited.

A model whose GGUF recommends sampling (``general.sampling.*``: Qwen3's temperature 0.6,
top-p 0.95, top-k 20) has it shown under the settings, with *Use* to take it; while the
settings are MoEScope's own defaults, or were the previous model's recommendation, a newly
loaded model's recommendation replaces them at once, as llama-server uses it for whatever
is not set. Its min-p and repeat penalty, which the panel does not show, apply as they are.
A chat whose settings follow the model's recommendation (``from_model``) follows the model
loaded when it is opened; a chat whose settings the user chose keeps them."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from moescope.engine import Sampling
from moescope.model.reasoning import THINKING_DEFAULT
from moescope.model.sampling_defaults import describe

DEFAULTS: dict[str, float | int] = {k: getattr(Sampling(), k)
                                     for k in ("temperature", "top_p", "top_k")}
"""MoEScope's own starting values of the settings the panel shows (the engine's)."""

THINKING_LABELS = {
    "default": "Model default", "on": "On", "off": "Off (answer at once)",
    "low": "Low effort", "medium": "Medium effort", "high": "High effort",
}
NO_SWITCH_TIP = "This model's chat template has no thinking switch"


def _rounded(values: Mapping[str, object]) -> dict[str, float | int] | None:
    """The three values the panel shows, as it shows them (None: one is not a number)."""
    try:
        return {"temperature": round(float(values["temperature"]), 2),  # type: ignore[arg-type]
                "top_p": round(float(values["top_p"]), 2),  # type: ignore[arg-type]
                "top_k": int(float(values["top_k"]))}  # type: ignore[arg-type]
    except (KeyError, TypeError, ValueError, OverflowError):
        return None


def follow_model(values: Mapping[str, object], recommended: Mapping[str, float | int], *,
                 at_defaults_too: bool = True) -> dict[str, object]:
    """``values`` with a loaded model's recommendation taken where the panel's rule takes
    it: when they follow the model (``from_model``) or, with ``at_defaults_too``, are
    MoEScope's own defaults; what the model leaves unsaid is MoEScope's default."""
    out = dict(values)
    follows = out.get("from_model") in (True, "true")
    if not follows and at_defaults_too:
        follows = _rounded(out) == _rounded(DEFAULTS)
    if follows:
        out.update({**DEFAULTS, **{k: v for k, v in recommended.items() if k in DEFAULTS}})
        out["from_model"] = True
    return out


class ChatSettingsPanel(QWidget):
    changed = Signal(bool)
    """The settings shown changed: by the user (True: an edit, *Use*) or by a loaded
    model's recommendation (False); not when a chat's saved settings are shown."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        outer.addLayout(form)
        outer.addStretch(1)
        # Alt+letters only where the window has no other use for them (Alt+P Stop, Alt+M
        # Rename, Alt+E the Cache menu, Alt+H Help): a shared letter only moves the focus
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setPlaceholderText("Optional: instructions for the whole chat")
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.setMaximumHeight(110)
        form.addRow("S&ystem prompt", self.system_prompt)
        self.temperature = self._double(0.0, 2.0, 0.05, DEFAULTS["temperature"],
                                        "Temperature (0 = greedy)")
        form.addRow("&Temperature", self.temperature)
        self.top_p = self._double(0.0, 1.0, 0.01, DEFAULTS["top_p"], "Top-p")
        form.addRow("Top-p", self.top_p)
        self.top_k = self._int(0, 1000, int(DEFAULTS["top_k"]), "Top-k (0 = off)")
        form.addRow("Top-k", self.top_k)
        self.max_tokens = self._int(1, 32768, 512, "Maximum new tokens")
        form.addRow("Ma&x tokens", self.max_tokens)
        self.seed = self._int(-1, 2**31 - 1, -1, "Seed (random when -1)")
        self.seed.setSpecialValueText("random")
        form.addRow("Seed", self.seed)
        self.thinking = QComboBox()
        self.thinking.setAccessibleName("Thinking")
        form.addRow("Thin&king", self.thinking)
        self._wanted_thinking = THINKING_DEFAULT
        """The saved choice, kept while a model without it is loaded."""
        self._listing = False  # the choices are being listed anew: not the user's choice
        self._restoring = False  # a chat's saved settings are being shown: no change
        self.thinking.currentIndexChanged.connect(self._thinking_chosen)
        self.set_thinking_choices((THINKING_DEFAULT,))
        # the loaded model's recommendation, and whether the settings shown are it
        self.model_sampling: dict[str, float | int] = {}
        self.model_known = False
        """A model's recommendation (or its lack) was set: a loaded model's rule applies."""
        self.from_model = False
        self._setting = False  # the panel itself is setting values: not the user's edit
        self.model_note = QLabel()
        self.model_note.setWordWrap(True)
        self.model_note.setToolTip("From the model file (general.sampling.*: its authors' "
                                   "generation_config.json, as llama.cpp converts it)")
        # no Alt+letter: every letter of "Use" is another control's in this window (Alt+U
        # the cache controls' RAM budget); Tab from Thinking reaches it
        self.use_model = QPushButton("Use")
        self.use_model.setAccessibleName("Use the model's recommended sampling")
        self.use_model.clicked.connect(self.apply_model_sampling)
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.model_note, 1)
        row.addWidget(self.use_model)
        self.model_row = QWidget()
        self.model_row.setLayout(row)
        self.model_row.hide()
        outer.insertWidget(1, self.model_row)
        for widget in (self.temperature, self.top_p, self.top_k):
            widget.valueChanged.connect(self._edited)
        for widget in (self.max_tokens, self.seed):
            widget.valueChanged.connect(self._other_edited)
        self.defaults: dict[str, object] = self.values()
        """What a new chat starts from: the settings last chosen by the user (restored
        with the window's settings), before a loaded model's rule."""

    def _shown(self) -> dict[str, float | int]:
        return {"temperature": round(self.temperature.value(), 2),
                "top_p": round(self.top_p.value(), 2), "top_k": self.top_k.value()}

    def _edited(self) -> None:
        if self._restoring:
            return
        if not self._setting:
            self.from_model = False
        self._show_model_row()
        if not self._setting:
            self._user_changed()

    def _other_edited(self) -> None:
        if not self._restoring:
            self._user_changed()

    def _thinking_chosen(self, _index: int) -> None:
        if self._restoring or self._listing or self.thinking.currentData() is None:
            return
        self._wanted_thinking = self.thinking.currentData()
        self._user_changed()

    def _user_changed(self) -> None:
        """The user chose these settings: they are the next new chat's too."""
        self.defaults = self.values()
        self.changed.emit(True)

    def _show_model_row(self) -> None:
        shown = {k: v for k, v in self.model_sampling.items() if k in DEFAULTS}
        self.model_row.setVisible(bool(self.model_sampling))
        self.model_note.setText("Recommended by the model: " + describe(self.model_sampling))
        current = self._shown()
        self.use_model.setVisible(any(round(float(v), 2) != current[k]
                                      for k, v in shown.items()))

    def set_model_sampling(self, values: dict[str, float | int]) -> None:
        """The loaded model's recommended sampling ({} for none): shown, and taken at once
        while the settings are MoEScope's defaults or the previous model's."""
        self.model_sampling = dict(values)
        self.model_known = True
        shown = self.values()
        taken = follow_model(shown, values)
        if taken.get("from_model") is True:
            self._set_shown(taken)  # type: ignore[arg-type]
            self.from_model = True
        self._show_model_row()
        if self.values() != shown:  # the chat shown samples with them: saved with it
            self.changed.emit(False)

    def apply_model_sampling(self) -> None:
        """*Use*: the model's recommended values in the settings."""
        self._set_shown({**self._shown(), **self.model_sampling})
        self.from_model = True
        self._show_model_row()
        self._user_changed()

    def _set_shown(self, values: dict[str, float | int]) -> None:
        self._setting = True
        try:
            self.temperature.setValue(float(values["temperature"]))
            self.top_p.setValue(float(values["top_p"]))
            self.top_k.setValue(int(values["top_k"]))
        finally:
            self._setting = False

    def set_thinking_choices(self, choices: tuple[str, ...]) -> None:
        """Offer the thinking settings the loaded model's template understands; the choice
        made earlier is kept when the new model offers it too."""
        self._listing = True
        try:
            self.thinking.clear()
            for choice in choices:
                self.thinking.addItem(THINKING_LABELS.get(choice, choice), choice)
            index = self.thinking.findData(self._wanted_thinking)
            self.thinking.setCurrentIndex(max(index, 0))
        finally:
            self._listing = False
        switch = len(choices) > 1
        self.thinking.setEnabled(switch)
        self.thinking.setToolTip(
            "How much the model thinks before it answers: each thought is a token, and on "
            "an offloaded MoE each token costs expert copies" if switch else NO_SWITCH_TIP)

    @staticmethod
    def _double(lo: float, hi: float, step: float, value: float, name: str) -> QDoubleSpinBox:
        w = QDoubleSpinBox()
        w.setRange(lo, hi)
        w.setSingleStep(step)
        w.setDecimals(2)
        w.setValue(value)
        w.setAccessibleName(name)
        return w

    @staticmethod
    def _int(lo: int, hi: int, value: int, name: str) -> QSpinBox:
        w = QSpinBox()
        w.setRange(lo, hi)
        w.setValue(value)
        w.setAccessibleName(name)
        return w

    def sampling(self) -> Sampling:
        seed = self.seed.value()
        extra = {k: v for k, v in self.model_sampling.items()
                 if k in ("min_p", "repeat_penalty")}  # not shown: the model's, if it says
        return Sampling(temperature=self.temperature.value(), top_p=self.top_p.value(),
                        top_k=self.top_k.value(), max_tokens=self.max_tokens.value(),
                        **extra,  # type: ignore[arg-type]
                        seed=None if seed < 0 else seed,
                        thinking=self.thinking.currentData() or THINKING_DEFAULT)

    def values(self) -> dict[str, object]:
        return {"temperature": self.temperature.value(), "top_p": self.top_p.value(),
                "top_k": self.top_k.value(), "max_tokens": self.max_tokens.value(),
                "seed": self.seed.value(), "thinking": self._wanted_thinking,
                "from_model": self.from_model}

    def set_values(self, values: Mapping[str, object]) -> None:
        """Restore the user's defaults (the window's settings at start): shown, and what
        a new chat starts from; unknown or malformed entries keep MoEScope's own."""
        self._apply(self.defaults)
        self._apply(values)
        self.defaults = self.values()

    def show_chat(self, saved: Mapping[str, object] | None) -> None:
        """Show a chat's saved settings (None or {}: it has none: a new chat's, from the
        user's defaults), without it counting as a change. Malformed saved entries keep
        the user's defaults. Settings that follow the model's recommendation follow the
        model loaded now; saved ones the user chose stay as they are."""
        self._apply(self.defaults)  # what a malformed saved entry leaves
        self._apply(saved or {})
        if self.model_known:
            self._apply(follow_model(self.values(), self.model_sampling,
                                     at_defaults_too=not saved))

    def new_chat_values(self) -> dict[str, object]:
        """The settings a new chat starts with (the user's defaults, the loaded model's
        recommendation where the rule takes it), as :meth:`values` gives them."""
        values = dict(self.defaults)
        if self.model_known:
            values = follow_model(values, self.model_sampling)
        return values

    def _apply(self, values: Mapping[str, object]) -> None:
        """Set every setting from ``values`` (no change signalled); a missing, malformed
        or non-finite entry leaves the setting as it is."""
        self._restoring = True
        try:
            for key, widget in (("temperature", self.temperature), ("top_p", self.top_p)):
                with contextlib.suppress(KeyError, TypeError, ValueError):
                    number = float(values[key])  # type: ignore[arg-type]
                    if math.isfinite(number):
                        widget.setValue(number)
            for key, iwidget in (("top_k", self.top_k), ("max_tokens", self.max_tokens),
                                 ("seed", self.seed)):
                with contextlib.suppress(KeyError, TypeError, ValueError, OverflowError):
                    iwidget.setValue(int(float(values[key])))  # type: ignore[arg-type]
            if "from_model" in values:
                self.from_model = values["from_model"] in (True, "true")  # an INI: "true"
            wanted = values.get("thinking")
            if isinstance(wanted, str) and wanted in THINKING_LABELS:
                self._wanted_thinking = wanted
                index = self.thinking.findData(wanted)
                self.thinking.setCurrentIndex(max(index, 0))
        finally:
            self._restoring = False
        self._show_model_row()
