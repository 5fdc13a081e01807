"""System prompt and sampling settings of the current chat (temperature, top-p, top-k,
max tokens, seed). Plain widgets; the window saves them (QSettings, chat store)."""

from __future__ import annotations

import contextlib

from PySide6.QtWidgets import (
    QDoubleSpinBox,
    QFormLayout,
    QPlainTextEdit,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from moescope.engine import Sampling


class ChatSettingsPanel(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        outer = QVBoxLayout(self)
        form = QFormLayout()
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.DontWrapRows)
        outer.addLayout(form)
        outer.addStretch(1)
        self.system_prompt = QPlainTextEdit()
        self.system_prompt.setAccessibleName("System prompt")
        self.system_prompt.setPlaceholderText("Optional: instructions for the whole chat")
        self.system_prompt.setTabChangesFocus(True)
        self.system_prompt.setMaximumHeight(110)
        form.addRow("S&ystem prompt", self.system_prompt)
        self.temperature = self._double(0.0, 2.0, 0.05, 0.7, "Temperature (0 = greedy)")
        form.addRow("&Temperature ", self.temperature)
        self.top_p = self._double(0.0, 1.0, 0.01, 0.95, "Top-p")
        form.addRow("Top-&p", self.top_p)
        self.top_k = self._int(0, 1000, 40, "Top-k (0 = off)")
        form.addRow("Top-&k", self.top_k)
        self.max_tokens = self._int(1, 32768, 512, "Maximum new tokens")
        form.addRow("&Max tokens", self.max_tokens)
        self.seed = self._int(-1, 2**31 - 1, -1, "Seed (random when -1)")
        self.seed.setSpecialValueText("random")
        form.addRow("S&eed", self.seed)

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
                        seed=None if seed < 0 else seed)

    def values(self) -> dict[str, float]:
        return {"temperature": self.temperature.value(), "top_p": self.top_p.value(),
                "top_k": self.top_k.value(), "max_tokens": self.max_tokens.value(),
                "seed": self.seed.value()}

    def set_values(self, values: dict[str, object]) -> None:
        """Restore saved values; unknown or malformed entries keep the defaults."""
        for key, widget in (("temperature", self.temperature), ("top_p", self.top_p)):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                widget.setValue(float(values[key]))  # type: ignore[arg-type]
        for key, iwidget in (("top_k", self.top_k), ("max_tokens", self.max_tokens),
                             ("seed", self.seed)):
            with contextlib.suppress(KeyError, TypeError, ValueError):
                iwidget.setValue(int(float(values[key])))  # type: ignore[arg-type]
