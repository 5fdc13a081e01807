"""Open a model: the fit estimate, the starting budget, policy and context size.

Shown before anything is loaded, so a model that does not fit is caught in a second from
its header instead of after minutes of loading. Everything recomputes as the budget
slider moves.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, Qt
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from moescope.core.errors import MoEScopeError
from moescope.core.gguf_info import ModelInfo
from moescope.core.reasoning import thinking_choices
from moescope.gui.controls import BUDGET_ENTRY_TIP, typed_slots
from moescope.gui.fit import FitEstimate, estimate_fit
from moescope.gui.policy_choices import CUSTOM, POLICY_CHOICES, POLICY_TIPS
from moescope.gui.worker import LoadRequest


def model_facts(info: ModelInfo) -> list[tuple[str, str]]:
    """What else a user should know before loading: a split model's files, and a chat
    template's thinking switch."""
    out = []
    if info.parts:
        out.append(("Files", f"{len(info.parts)} parts ({info.parts[0].name} …)"))
    template = info.metadata.get("tokenizer.chat_template")
    choices = thinking_choices(template if isinstance(template, str) else None)[1:]
    if choices:
        out.append(("Thinking", f"switch in Chat settings: {'/'.join(choices)}"))
    return out


class OpenModelDialog(QDialog):
    """Fit estimate and load settings for one GGUF; ``request()`` after ``exec()``."""

    def __init__(self, info: ModelInfo, *, budget: str = "25%", policy: str = "quality-first",
                 n_ctx: int = 2048, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.info = info
        self.setWindowTitle(f"Open {info.file_name}")
        self.setAccessibleName("Open model")
        self.setMinimumWidth(520)  # the fit's lines ("RAM needed", the GPU) unwrapped
        layout = QVBoxLayout(self)
        settings = QFormLayout()
        self.budget = QSlider(Qt.Orientation.Horizontal)
        self.budget.setAccessibleName("Expert slots per layer")
        self.budget.setEnabled(info.is_moe)
        if info.is_moe:
            self.budget.setRange(info.top_k, info.n_expert)
            start = estimate_fit(info, budget, n_ctx).plan
            self.budget.setValue(start.slots_per_layer if start else info.top_k)
        self.budget_entry = QLineEdit()
        self.budget_entry.setAccessibleName("VRAM budget, typed")
        self.budget_entry.setPlaceholderText("e.g. 12GiB")
        self.budget_entry.setToolTip(BUDGET_ENTRY_TIP)
        self.budget_entry.setMaximumWidth(96)
        self.budget_entry.setEnabled(info.is_moe)
        self.budget_entry.installEventFilter(self)  # Enter applies it, not "Open"
        row = QHBoxLayout()
        row.addWidget(self.budget, 1)
        row.addWidget(self.budget_entry)
        budget_label = QLabel("VRAM &budget")
        budget_label.setBuddy(self.budget)  # a row of two has no buddy of its own: Alt+B
        settings.addRow(budget_label, row)
        self.policy = QComboBox()
        self.policy.setAccessibleName("Cache policy")
        for key, label in POLICY_CHOICES:
            if key != CUSTOM:
                self.policy.addItem(label, key)
                self.policy.setItemData(self.policy.count() - 1, POLICY_TIPS[key],
                                        Qt.ItemDataRole.ToolTipRole)
        index = self.policy.findData(policy)
        self.policy.setCurrentIndex(max(index, 0))
        settings.addRow("&Policy", self.policy)
        self.n_ctx = QSpinBox()
        self.n_ctx.setRange(256, info.context_length or 131072)
        self.n_ctx.setSingleStep(256)
        self.n_ctx.setValue(min(n_ctx, self.n_ctx.maximum()))
        self.n_ctx.setAccessibleName("Context size in tokens")
        settings.addRow("&Context", self.n_ctx)
        layout.addLayout(settings)
        self.estimate_form = QFormLayout()
        layout.addLayout(self.estimate_form)
        self.warning = QLabel()
        self.warning.setObjectName("warningLabel")
        self.warning.setWordWrap(True)
        layout.addWidget(self.warning)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Open
                                   | QDialogButtonBox.StandardButton.Cancel)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        self.budget.valueChanged.connect(self._update)
        self.n_ctx.valueChanged.connect(self._update)
        self.estimate: FitEstimate | None = None
        self._update()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """Enter in the typed budget applies it and stays in the dialog (a dialog's Enter
        would otherwise also press Open, loading a budget the user has not seen)."""
        if (watched is self.budget_entry and event.type() == QEvent.Type.KeyPress
                and isinstance(event, QKeyEvent)
                and event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter)):
            self.apply_typed_budget()
            return True
        return super().eventFilter(watched, event)

    def apply_typed_budget(self) -> bool:
        """Move the slider to the typed budget (a size, a share, or slots per layer, as
        in the main window); a typo is explained in place and changes nothing."""
        text = self.budget_entry.text().strip()
        if not self.info.is_moe or not text:
            return False
        try:
            slots, note = typed_slots(text, self.info.n_expert, self.info.top_k,
                                      self._row_bytes())
        except MoEScopeError as err:
            self.budget_entry.setToolTip(f"{err}\n\n{BUDGET_ENTRY_TIP}")
            self.budget_entry.setProperty("invalid", True)
            self._restyle()
            return False
        self.budget_entry.setToolTip(f"{note}\n\n{BUDGET_ENTRY_TIP}" if note
                                     else BUDGET_ENTRY_TIP)
        self.budget_entry.setProperty("invalid", False)
        self._restyle()
        self.budget.setValue(slots)
        self.budget_entry.clear()
        return True

    def _restyle(self) -> None:
        self.budget_entry.style().unpolish(self.budget_entry)
        self.budget_entry.style().polish(self.budget_entry)

    def _row_bytes(self) -> int:
        return sum(self.info.bytes_per_expert[layer] for layer in self.info.moe_layers)

    def budget_text(self) -> str:
        """The budget as bytes that buy exactly the chosen number of slots."""
        if not self.info.is_moe:
            return "25%"
        return str(self.budget.value() * self._row_bytes())

    def _update(self) -> None:
        self.estimate = estimate_fit(self.info, self.budget_text(), self.n_ctx.value())
        while self.estimate_form.rowCount():
            self.estimate_form.removeRow(0)
        for label, value in [*self.estimate.lines(), *model_facts(self.info)]:
            v = QLabel(value)
            v.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            self.estimate_form.addRow(label, v)
        self.warning.setText("\n".join(self.estimate.warnings()))

    def request(self) -> LoadRequest:
        return LoadRequest(path=str(self.info.path), budget=self.budget_text(),
                           policy=self.policy.currentData(), n_ctx=self.n_ctx.value())
