"""System prompt and sampling settings of the current chat (temperature, top-p, top-k,
max tokens, seed, thinking). Plain widgets; the window saves them (QSettings, chat store)."""

from __future__ import annotations

import contextlib

from PySide6.QtWidgets import (
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from moescope.engine import Sampling
from moescope.model.reasoning import THINKING_DEFAULT

THINKING_LABELS = {
    "default": "Model default", "on": "On", "off": "Off (answer at once)",
    "low": "Low effort", "medium": "Medium effort", "high": "High effort",
}
NO_SWITCH_TIP = "This model's chat template has no thinking switch"


class ChatSettingsPanel(QWidget):
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
        self.temperature = self._double(0.0, 2.0, 0.05, 0.7, "Temperature (0 = greedy)")
        form.addRow("&Temperature", self.temperature)
        self.top_p = self._double(0.0, 1.0, 0.01, 0.95, "Top-p")
        form.addRow("Top-p", self.top_p)
        self.top_k = self._int(0, 1000, 40, "Top-k (0 = off)")
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
        self.thinking.activated.connect(
            lambda _i: setattr(self, "_wanted_thinking", self.thinking.currentData()))
        self.set_thinking_choices((THINKING_DEFAULT,))

    def set_thinking_choices(self, choices: tuple[str, ...]) -> None:
        """Offer the thinking settings the loaded model's template understands; the choice
        made earlier is kept when the new model offers it too."""
        self.thinking.clear()
        for choice in choices:
            self.thinking.addItem(THINKING_LABELS.get(choice, choice), choice)
        index = self.thinking.findData(self._wanted_thinking)
        self.thinking.setCurrentIndex(max(index, 0))
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
        return Sampling(temperature=self.temperature.value(), top_p=self.top_p.value(),
                        top_k=self.top_k.value(), max_tokens=self.max_tokens.value(),
                        seed=None if seed < 0 else seed,
                        thinking=self.thinking.currentData() or THINKING_DEFAULT)

    def values(self) -> dict[str, object]:
        return {"temperature": self.temperature.value(), "top_p": self.top_p.value(),
                "top_k": self.top_k.value(), "max_tokens": self.max_tokens.value(),
                "seed": self.seed.value(), "thinking": self._wanted_thinking}

    def set_values(self, values: dict[str, object]) -> None:
        """Restore saved values; unknown or malformed entries keep the defaults."""
        for key, widget in (("temperature", self.temperature), ("top_p", self.top_p)):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                widget.setValue(float(values[key]))  # type: ignore[arg-type]
        for key, iwidget in (("top_k", self.top_k), ("max_tokens", self.max_tokens),
                             ("seed", self.seed)):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                iwidget.setValue(int(float(values[key])))  # type: ignore[arg-type]
        wanted = values.get("thinking")
        if isinstance(wanted, str) and wanted in THINKING_LABELS:
            self._wanted_thinking = wanted
            index = self.thinking.findData(wanted)
            if index >= 0:
                self.thinking.setCurrentIndex(index)
