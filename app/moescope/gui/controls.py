"""The user's dials: cache policy (presets or custom θ/β) and the VRAM budget.

Both only *request* a change (signals); the window forwards it to the engine, which applies
it between tokens. The budget slider moves in whole slots per layer, the unit the cache
actually allocates, and shows what that costs in bytes and % of experts resident: a GiB
slider would snap unpredictably to slot boundaries.
"""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QSlider,
    QWidget,
)

from moescope.core.budget import format_bytes
from moescope.core.policy import PRESETS, Policy
from moescope.gui.snapshots import ModelSummary

CUSTOM = "custom"
POLICY_CHOICES: tuple[tuple[str, str], ...] = (
    ("exact", "Exact (fetch every miss)"),
    ("quality-first", "Quality-first (0.15 rule)"),
    ("speed-first", "Speed-first (first choice)"),
    (CUSTOM, "Custom (θ, β)"),
    ("threshold", "Threshold rule, LRU"),
    ("first-choice", "First-choice rule, LRU"),
    ("substitute-all", "Substitute every miss"),
)
"""Policy menu: the paper's three operating points first, then the bare rules."""


def custom_policy(theta: float, beta: float) -> Policy:
    """Quality-first's machinery (threshold rule, frequency eviction, admission) with the
    user's θ (fetch threshold) and β (admission threshold)."""
    return PRESETS["quality-first"].replace(theta=theta, beta=beta, name=CUSTOM)


class ControlsPanel(QGroupBox):
    """Policy and budget controls; emits requests, shows what the engine applied."""

    policyRequested = Signal(object)  # Policy
    budgetRequested = Signal(int)  # slots per layer

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Cache controls", parent)
        self.model: ModelSummary | None = None
        form = QFormLayout(self)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        self.policy_combo = QComboBox()
        self.policy_combo.setAccessibleName("Cache policy")
        for key, label in POLICY_CHOICES:
            self.policy_combo.addItem(label, key)
        self.policy_combo.setToolTip(
            "What to do with a routed expert that is not in VRAM: wait for it (fetch) or "
            "use a resident one instead (substitute). Applies from the next token.")
        form.addRow("&Policy", self.policy_combo)

        self.theta = self._slider(0, 100, 15, "Fetch threshold θ")
        self.theta_label = QLabel()
        form.addRow("θ fetch", self._with_label(self.theta, self.theta_label))
        self.beta = self._slider(5, 200, 50, "Admission threshold β")
        self.beta_label = QLabel()
        form.addRow("β admit", self._with_label(self.beta, self.beta_label))

        self.budget = self._slider(1, 1, 1, "VRAM budget for expert slots")
        self.budget.setToolTip("Expert slots per layer kept in VRAM; applied live, the "
                               "model and the chat are kept.")
        self.budget_label = QLabel("–")
        self.budget_label.setObjectName("budgetLabel")
        form.addRow("&VRAM budget", self.budget)
        form.addRow("", self.budget_label)

        self.policy_combo.currentIndexChanged.connect(self._policy_chosen)
        for slider in (self.theta, self.beta):
            slider.valueChanged.connect(self._custom_changed)
            slider.sliderReleased.connect(self._custom_released)
        self.budget.valueChanged.connect(self._budget_moved)
        self.budget.sliderReleased.connect(self._budget_released)
        self._quiet = False
        self._update_custom_labels()
        self._update_custom_enabled()
        self.set_model(None)

    # ------------------------------------------------------------------ building
    def _slider(self, lo: int, hi: int, value: int, name: str) -> QSlider:
        s = QSlider(Qt.Orientation.Horizontal)
        s.setRange(lo, hi)
        s.setValue(value)
        s.setAccessibleName(name)
        s.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        return s

    @staticmethod
    def _with_label(slider: QSlider, label: QLabel) -> QWidget:
        w = QWidget()
        row = QHBoxLayout(w)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(slider, 1)
        label.setMinimumWidth(36)
        row.addWidget(label)
        return w

    # ------------------------------------------------------------------ state in
    def set_model(self, model: ModelSummary | None) -> None:
        """Configure the budget slider for ``model`` (disabled without an expert cache)."""
        self.model = model
        enabled = bool(model and model.cache_enabled)
        self._quiet = True
        if model and enabled:
            self.budget.setRange(model.top_k, model.n_expert)
            self.budget.setValue(model.slots_per_layer)
        self.budget.setEnabled(enabled)
        self.policy_combo.setEnabled(enabled)
        self._quiet = False
        if model is not None:
            self.show_policy(model.policy)
        self._update_budget_label()
        self._update_custom_enabled()

    def show_applied(self, model: ModelSummary) -> None:
        """The engine applied a change: reflect its slots and policy."""
        self.model = model
        self._quiet = True
        if model.cache_enabled and not self.budget.isSliderDown():
            self.budget.setValue(model.slots_per_layer)
        self._quiet = False
        self.show_policy(model.policy)
        self._update_budget_label()

    def show_policy(self, name: str) -> None:
        index = self.policy_combo.findData(name)
        if index >= 0 and index != self.policy_combo.currentIndex():
            self._quiet = True
            self.policy_combo.setCurrentIndex(index)
            self._quiet = False
        self._update_custom_enabled()

    # ------------------------------------------------------------------ requests out
    def current_policy(self) -> Policy:
        key = self.policy_combo.currentData()
        if key == CUSTOM:
            return custom_policy(self.theta.value() / 100, self.beta.value() / 100)
        return PRESETS[key]

    def select_policy(self, key: str) -> None:
        """Choose a menu entry as the user would (emits the request)."""
        index = self.policy_combo.findData(key)
        if index < 0:
            raise ValueError(f"unknown policy {key!r}")
        if index == self.policy_combo.currentIndex():
            self._policy_chosen(index)
        else:
            self.policy_combo.setCurrentIndex(index)

    def toggle_quality_speed(self) -> str:
        """The shortcut: Quality-first <-> Speed-first (from anything else: Speed-first)."""
        key = "quality-first" if self.policy_combo.currentData() == "speed-first" \
            else "speed-first"
        self.select_policy(key)
        return key

    def _policy_chosen(self, _index: int) -> None:
        self._update_custom_enabled()
        if not self._quiet:
            self.policyRequested.emit(self.current_policy())

    def _custom_changed(self, _value: int) -> None:
        self._update_custom_labels()
        dragging = self.theta.isSliderDown() or self.beta.isSliderDown()
        if not self._quiet and not dragging and self.policy_combo.currentData() == CUSTOM:
            self.policyRequested.emit(self.current_policy())

    def _custom_released(self) -> None:
        if self.policy_combo.currentData() == CUSTOM:
            self.policyRequested.emit(self.current_policy())

    def _budget_moved(self, _value: int) -> None:
        self._update_budget_label()
        if not self._quiet and not self.budget.isSliderDown():
            self.budgetRequested.emit(self.budget.value())

    def _budget_released(self) -> None:
        self.budgetRequested.emit(self.budget.value())

    # ------------------------------------------------------------------ labels
    def _update_custom_enabled(self) -> None:
        custom = self.policy_combo.currentData() == CUSTOM and self.policy_combo.isEnabled()
        self.theta.setEnabled(custom)
        self.beta.setEnabled(custom)

    def _update_custom_labels(self) -> None:
        self.theta_label.setText(f"{self.theta.value() / 100:.2f}")
        self.beta_label.setText(f"{self.beta.value() / 100:.2f}")

    def _update_budget_label(self) -> None:
        m = self.model
        if m is None:
            self.budget_label.setText("no model loaded")
            return
        if not m.cache_enabled:
            self.budget_label.setText("expert cache off for this model")
            return
        slots = self.budget.value()
        n_bytes = slots * m.slot_row_bytes
        size = f"{n_bytes / 2**30:.2f} GiB" if n_bytes >= 2**30 / 100 else format_bytes(n_bytes)
        text = f"{size} · {slots} slots/layer · {slots / m.n_expert:.1%} resident"
        if slots != m.slots_per_layer:
            text += f" (applied: {m.slots_per_layer})"
        self.budget_label.setText(text)
