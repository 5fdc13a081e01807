"""Open a model: the fit estimate, the starting budget, policy and context size.

Shown before anything is loaded, so a model that does not fit is caught in a second from
its header instead of after minutes of loading. Everything recomputes as the budget
slider moves.
"""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QSlider,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from moescope.display.fit import FitEstimate, estimate_fit
from moescope.display.policy_choices import CUSTOM, POLICY_CHOICES, POLICY_TIPS
from moescope.gui.controls.budget_entry import BudgetEntry
from moescope.gui.widgets.screen_fit import fit_wrapped_height
from moescope.gui.worker import LoadRequest
from moescope.model.gguf_info import ModelInfo
from moescope.model.ram_fit import AUTO_RAM_BUDGET, DEFAULT_CONTEXT, is_auto, ram_start_experts
from moescope.model.reasoning import thinking_choices
from moescope.util.words import utf8_name


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
                 n_ctx: int = DEFAULT_CONTEXT, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.info = info
        self.setWindowTitle(f"Open {utf8_name(info.file_name)}")  # Qt drops a non-UTF-8 byte
        self.setAccessibleName("Open model")
        self.setMinimumWidth(520)  # the fit's lines ("RAM needed", the GPU) unwrapped
        layout = QVBoxLayout(self)
        settings = QFormLayout()
        self.budget = QSlider(Qt.Orientation.Horizontal)
        self.budget.setAccessibleName("Expert slots per layer")
        self.budget.setEnabled(info.is_moe)
        slots_in_ram = 0  # a CPU build's slots take host memory too
        if info.is_moe:
            self.budget.setRange(info.top_k, info.n_expert)
            first = estimate_fit(info, budget, n_ctx)
            start = first.plan
            self.budget.setValue(start.slots_per_layer if start else info.top_k)
            slots_in_ram = 0 if first.slots_on_gpu else first.vram_needed
        self.budget_entry = BudgetEntry()  # its Enter applies it, never presses Open
        self.budget_entry.setEnabled(info.is_moe)
        self.budget_entry.submitted.connect(self.apply_typed_budget)
        row = QHBoxLayout()
        row.addWidget(self.budget, 1)
        row.addWidget(self.budget_entry)
        budget_label = QLabel("VRAM &budget")
        budget_label.setBuddy(self.budget)  # a row of two has no buddy of its own: Alt+B
        settings.addRow(budget_label, row)
        self.ram_budget = QSlider(Qt.Orientation.Horizontal)
        self.ram_budget.setAccessibleName("Experts per layer kept in RAM")
        self.ram_budget.setToolTip(
            "The RAM tier: experts per layer kept in host memory. Below all of them, the rest "
            "stay in the model file and are read from disk when needed: a model larger than "
            "RAM loads in seconds, and misses on disk cost about ten times a copy from RAM. "
            "All the way right: every expert in RAM.")
        self.ram_budget.setEnabled(info.is_moe)
        self._slots_in_ram = slots_in_ram
        self._ram_following = False
        """The slider moves to Auto's figure (not the user's move)."""
        if info.is_moe:
            self.ram_budget.setRange(info.top_k, info.n_expert)
            self.ram_budget.setValue(ram_start_experts(info, n_ctx, slot_bytes=slots_in_ram))
        # as the main window's: ticked, the engine chooses at load from the memory available
        # (the slider shows its choice now), and the window's Auto shows ticked after it;
        # the dialog sent the figure itself, and the window showed Auto unticked
        self.ram_auto = QCheckBox("Auto")
        self.ram_auto.setAccessibleName("RAM budget: auto")
        self.ram_auto.setToolTip(
            "Auto: every expert in RAM when the model fits the memory this process may use, "
            "else the experts per layer that fit; chosen again at load. Moving the slider "
            "or typing a budget sets one yourself.")
        self.ram_auto.setChecked(info.is_moe)
        self.ram_auto.setEnabled(info.is_moe)
        self.ram_auto.toggled.connect(self._ram_auto_toggled)
        self.ram_budget_entry = BudgetEntry()  # as the main window's RAM budget row
        self.ram_budget_entry.setAccessibleName("RAM budget, typed")
        self.ram_budget_entry.setEnabled(info.is_moe)
        self.ram_budget_entry.submitted.connect(self.apply_typed_ram_budget)
        ram_row = QHBoxLayout()
        ram_row.addWidget(self.ram_budget, 1)
        ram_row.addWidget(self.ram_auto)
        ram_row.addWidget(self.ram_budget_entry)
        ram_label = QLabel("RAM b&udget")
        ram_label.setBuddy(self.ram_budget)
        settings.addRow(ram_label, ram_row)
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
        self.ram_budget.valueChanged.connect(self._ram_moved)
        self.n_ctx.valueChanged.connect(self._update)
        self.estimate: FitEstimate | None = None
        self._update()

    def apply_typed_budget(self) -> bool:
        """Move the slider to the typed budget (as in the main window)."""
        return self._apply_typed(self.budget_entry, self.budget)

    def apply_typed_ram_budget(self) -> bool:
        """Move the RAM slider to the typed RAM budget (a size, a share, experts); "auto"
        ticks Auto."""
        if self.info.is_moe and is_auto(self.ram_budget_entry.text()):
            self.ram_budget_entry.clear()
            self.ram_auto.setChecked(True)
            return True
        return self._apply_typed(self.ram_budget_entry, self.ram_budget)

    def _auto_experts(self) -> int:
        return ram_start_experts(self.info, self.n_ctx.value(), slot_bytes=self._slots_in_ram)

    def _ram_moved(self, _value: int) -> None:
        """The user's own RAM budget, unless it is where Auto put it."""
        if self._ram_following:
            return
        self.ram_auto.setChecked(False)
        self._update()

    def _ram_auto_toggled(self, on: bool) -> None:
        if on and self.info.is_moe:  # back to the automatic figure for the context now
            self._ram_following = True
            self.ram_budget.setValue(self._auto_experts())
            self._ram_following = False
        self._update()

    def _apply_typed(self, entry: BudgetEntry, slider: QSlider) -> bool:
        if not self.info.is_moe:
            return False
        slots = entry.take_slots(self.info.n_expert, self.info.top_k, self._row_bytes())
        if slots is None:
            return False
        slider.setValue(slots)
        return True

    def _row_bytes(self) -> int:
        return sum(self.info.bytes_per_expert[layer] for layer in self.info.moe_layers)

    def budget_text(self) -> str:
        """The budget as bytes that buy exactly the chosen number of slots."""
        if not self.info.is_moe:
            return "25%"
        return f"{self.budget.value() * self._row_bytes()}B"  # a bare number is slots

    def ram_budget_text(self) -> str | None:
        """The RAM tier's budget as the load asks for it: ``auto`` while Auto is ticked,
        else in bytes; None: every expert in RAM (no tier)."""
        if self.info.is_moe and self.ram_auto.isChecked():
            return AUTO_RAM_BUDGET
        return self._ram_figure()

    def _ram_figure(self) -> str | None:
        """The slider's RAM budget in bytes (None: every expert)."""
        if not self.info.is_moe or self.ram_budget.value() >= self.info.n_expert:
            return None
        return f"{self.ram_budget.value() * self._row_bytes()}B"

    def _update(self) -> None:
        if self.info.is_moe and self.ram_auto.isChecked():  # a new context: Auto's figure
            auto = self._auto_experts()
            if auto != self.ram_budget.value():
                self._ram_following = True
                self.ram_budget.setValue(auto)
                self._ram_following = False
        self.estimate = estimate_fit(self.info, self.budget_text(), self.n_ctx.value(),
                                     ram_budget=self._ram_figure())
        while self.estimate_form.rowCount():
            self.estimate_form.removeRow(0)
        for label, value in [*self.estimate.lines(), *model_facts(self.info)]:
            v = QLabel(value)
            v.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
            # wrapped: the dialog's minimum width is 520 px and "Experts in RAM" runs to
            # ~590 px alone, so it and "Expert slots" were cut at the right edge
            v.setWordWrap(True)
            self.estimate_form.addRow(label, v)
        self.warning.setText("\n".join(self.estimate.warnings()))
        if self.isVisible():  # a moved slider rewrites the lines: longer ones wrap more
            fit_wrapped_height(self)

    def showEvent(self, event: QShowEvent) -> None:
        """At 12 pt on a 1024x700 screen the dialog was 520 px wide and ~80 px too short
        for the fit's lines wrapped at that width: "Expert slots", "Experts in RAM",
        "Experts on disk" and the GPU line showed half their second line."""
        super().showEvent(event)
        fit_wrapped_height(self)

    def request(self) -> LoadRequest:
        return LoadRequest(path=str(self.info.path), budget=self.budget_text(),
                           policy=self.policy.currentData(), n_ctx=self.n_ctx.value(),
                           ram_budget=self.ram_budget_text())
