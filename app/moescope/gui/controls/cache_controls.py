"""The user's dials: cache policy (presets or Custom), the VRAM budget and the RAM budget.

Both only *request* a change (signals); the window forwards it to the engine, which applies
it between tokens. The budget slider moves in whole slots per layer, the unit the cache
actually allocates, and shows what that costs in bytes and % of experts resident: a GiB
slider would snap unpredictably to slot boundaries. What each preset does, and how Custom's
θ, β, routing bonus and prefetch map to a policy, is :mod:`moescope.display.policy_choices`.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEvent, QObject, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QSlider,
    QSpinBox,
    QWidget,
)

from moescope.cache.budget import format_bytes
from moescope.cache.guard import DEFAULT_TARGET, GUARD, GuardSpec
from moescope.cache.policy import PRESETS, THETA_DISK_AS_THETA, Policy
from moescope.display.policy_choices import (
    BONUS_MAX,
    BONUS_STEPS,
    CUSTOM,
    POLICY_CHOICES,
    POLICY_TIPS,
    PREFETCH_FIXED,
    PREFETCH_MAX,
    PREFETCH_MODES,
    THETA_DISK_OFF,
    control_values,
    custom_policy,
    prefetch_value,
)
from moescope.gui.controls.budget_entry import BudgetEntry
from moescope.gui.widgets.wrapped_label import WrappedLabel
from moescope.model.ram_fit import is_auto
from moescope.session.snapshots import ModelSummary

__all__ = ["CUSTOM", "POLICY_CHOICES", "ControlsPanel", "custom_policy"]

SPEED_FIRST = "speed-first"
TOGGLE_FALLBACK = "quality-first"
"""Where the shortcut returns from Speed-first when it did not come from another policy."""


POLICY_MIN_CHARS = 22
"""The policy menu's least width, in characters (its text ends in "…" below that)."""

GUARD_PREFIX, GUARD_SHORT_PREFIX = "guard ≤ ", "≤ "
"""The guard's target's word, and its form where the audit row is narrow."""

RAM_TIP = ("Experts per layer kept in host memory (the RAM tier); the rest stay in the model "
           "file and are read from disk when needed (about ten times slower than from RAM). "
           "All the way right: every expert in RAM. Applied live, like the VRAM budget.")
RAM_AUTO_TIP = ("Auto: what fits the memory this process may use now, chosen as at load: "
                "every expert in RAM when the model fits, else the experts per layer that "
                "fit (the status bar says why). Tick it again to choose again; moving the "
                "slider or typing a budget sets one yourself.")
CUSTOM_ONLY_TIP = ("Fixed by the chosen preset: choose Custom in Policy to set it "
                   "yourself.")
NO_CACHE_TIP = "Open a model with an expert cache to change the policy."


def ram_short_text(experts: int, n_expert: int, row_bytes: int) -> str:
    """The RAM budget in its row, short: the bytes of the experts it keeps in RAM (the
    slider says what share; the tooltip says the whole, and what is read from disk)."""
    return format_bytes(min(experts, n_expert) * row_bytes)


class DiskThresholdBox(QDoubleSpinBox):
    """The disk threshold, whose bottom step reads "disk = θ". The first step up from there
    is the first value above θ: a disk threshold is there to read less from disk than
    RAM's rule fetches, and the plain next step, 0.00, read every disk miss instead."""

    def __init__(self, theta: Callable[[], float]) -> None:
        super().__init__()
        self._theta = theta

    def stepBy(self, steps: int) -> None:
        if steps > 0 and self.value() <= THETA_DISK_OFF:
            above = round(self._theta() + steps * self.singleStep(), 2)
            self.setValue(min(self.maximum(), above))
        else:
            super().stepBy(steps)


class ControlsPanel(QGroupBox):
    """Policy and budget controls; emits requests, shows what the engine applied."""

    policyRequested = Signal(object)  # Policy
    budgetRequested = Signal(int)  # slots per layer
    ramBudgetRequested = Signal(int)  # RAM-tier experts per layer (n_expert: all)
    ramAutoRequested = Signal()  # the RAM budget's Auto: chosen from the memory available
    auditRequested = Signal(int)  # audit every N tokens, 0 off
    laidOut = Signal()
    """The rows were laid out again (a font size, a line under a slider that wraps): the
    window gives the panel the height it now wants where it has it."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__("Cache controls", parent)
        self.model: ModelSummary | None = None
        self._quiet = True
        self._last_other = TOGGLE_FALLBACK
        """The latest policy other than Speed-first: where the shortcut returns to."""
        self._ram_requested = 0
        """The RAM budget last requested: a report applied before it does not move the
        slider back."""
        self.budget_note = ""
        """Why the typed budget became another slot count (shown under the slider)."""
        self._custom_saved = custom_policy()
        """Custom's settings while a preset is shown in its controls."""
        form = QFormLayout(self)
        self.form = form
        self._tips: dict[QWidget, str] = {}
        """The Custom controls' own tooltips, before the reason they are greyed is added."""
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        form.setVerticalSpacing(3)  # a row more than before (RAM budget); still fits 1024x700
        # the group box's own padding is the margin at the sides: 9 px more each side made
        # the window 1046 px wide at least with a 10 pt font, wider than a 1024 px screen
        # and the group box's title already stands above the first row: the style's 11 px
        # above and below the rows made the window 658 px tall at least with an 11 pt font,
        # taller than a 1024x700 screen's 652 px of work area
        form.setContentsMargins(2, 2, 2, 2)
        self.policy_combo = QComboBox()
        self.policy_combo.setAccessibleName("Cache policy")
        for key, label in POLICY_CHOICES:
            self.policy_combo.addItem(label, key)
            self.policy_combo.setItemData(self.policy_combo.count() - 1, POLICY_TIPS[key],
                                          Qt.ItemDataRole.ToolTipRole)
        # as wide as the usual entries at least, not as the longest ("Quality guard (cost
        # under a target)"): that one set the window's least width at 12 pt; where the
        # column is narrower it ends in "…" closed, whole in the list, its tooltip says it
        self.policy_combo.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.policy_combo.setMinimumContentsLength(POLICY_MIN_CHARS)
        form.addRow("P&olicy", self.policy_combo)  # Alt+P is Stop's
        self.guard_target = QDoubleSpinBox()
        self.guard_target.setAccessibleName("Quality guard target")
        self.guard_target.setRange(0.1, 10.0)
        self.guard_target.setSingleStep(0.1)
        self.guard_target.setDecimals(1)
        self.guard_target.setPrefix(GUARD_PREFIX)
        self.guard_target.setSuffix("%")
        self.guard_target.setValue(100 * DEFAULT_TARGET)
        self.guard_target.setToolTip(
            "Quality guard: keep the audited estimate of the perplexity cost, expected on "
            "the model's own text, under this. "
            "Lower: closer to Exact, more waits; higher: faster.")

        self.theta = self._slider(0, 100, 15, "Fetch threshold θ")
        self.theta_label = QLabel()
        self.theta_disk = DiskThresholdBox(lambda: self.theta.value() / 100)
        self.theta_disk.setAccessibleName("Fetch threshold for experts only on disk")
        self.theta_disk.setRange(THETA_DISK_OFF, 1.0)  # the bottom step reads "disk = θ"
        self.theta_disk.setSingleStep(0.05)
        self.theta_disk.setDecimals(2)
        self.theta_disk.setPrefix("disk ")
        self.theta_disk.setSpecialValueText("disk = θ")
        self.theta_disk.setValue(THETA_DISK_OFF)
        self.theta_disk.setToolTip(
            "With a RAM budget below the experts: the fetch threshold for a missing expert "
            "that is only on disk (a read from disk costs about ten times a copy from RAM). "
            "Above θ: fewer disk reads, more substituted mass; 0.3 cost +2-4% perplexity on "
            "code on the demo model. \"disk = θ\": the same rule as for RAM (Quality-first).")
        theta_row = self._row(self.theta, self.theta_label)
        theta_row.layout().addWidget(self.theta_disk)
        form.addRow("θ fetch", theta_row)
        self.beta = self._slider(5, 200, 50, "Admission threshold β")
        self.beta.setToolTip("Background admission: an expert that lost this much gate mass "
                             "to substitution is copied in, off the critical path.")
        self.beta_label = QLabel()
        form.addRow("β admit", self._row(self.beta, self.beta_label))
        self.bonus = self._slider(0, round(BONUS_MAX * BONUS_STEPS), 0, "Routing bonus")
        self.bonus.setToolTip(
            "Cache-Prior: a resident expert takes a missing one's place when its gate weight "
            "is within this much of the miss's (the units of θ), so routing prefers what is "
            "already in VRAM. 0 = off (the 0.15 rule with θ). Larger: fewer copies, more "
            "substituted mass; above ~0.15 perplexity rises on the demo model.")
        self.bonus_label = QLabel()
        form.addRow("Bonus", self._row(self.bonus, self.bonus_label))
        self.prefetch_mode = QComboBox()
        self.prefetch_mode.setAccessibleName("Prefetch (PSR)")
        for key, label in PREFETCH_MODES:
            self.prefetch_mode.addItem(label, key)
        self.prefetch_mode.setToolTip(
            "PSR: per token, bring the next layer's predicted experts into the cache before "
            "it routes (their copies overlap this layer's compute). Right predictions save "
            "waits; wrong ones cost PCIe traffic and evict useful experts.")
        self.prefetch_count = QSpinBox()
        self.prefetch_count.setAccessibleName("Experts prefetched per token")
        self.prefetch_count.setRange(1, PREFETCH_MAX)
        self.prefetch_count.setValue(2)
        self.prefetch_count.setSuffix(" experts")
        form.addRow("Prefetch", self._row(self.prefetch_mode, self.prefetch_count))
        self.detail_rows = [self.theta.parentWidget(), self.beta.parentWidget(),
                            self.bonus.parentWidget(), self.prefetch_mode.parentWidget()]
        """The rows of Custom's parameters (θ, β, bonus, prefetch): under a preset they
        only show its values, greyed, and fold away where the window is short
        (:meth:`set_details_room`), so that the live plots below keep their room."""
        self._details_room = True

        self.budget = self._slider(1, 1, 1, "VRAM budget for expert slots")
        self.budget.setToolTip("Expert slots per layer kept in VRAM; applied live, the "
                               "model and the chat are kept.")
        # and a typed budget's clamp note under it, where the column has room; at the
        # window's least height one line (a two-line note made it 672 px at 11 pt) ending
        # in "…", the whole text in its tooltip
        self.budget_label = WrappedLabel("–", lines=1)
        self.budget_label.setObjectName("budgetLabel")
        self.budget_entry = BudgetEntry()
        self.budget_entry.submitted.connect(self.apply_typed_budget)
        form.addRow("&VRAM budget", self._row(self.budget, self.budget_entry))
        form.addRow("", self.budget_label)
        self.ram_budget = self._slider(1, 1, 1, "RAM budget for experts")
        self.ram_budget.setMinimumWidth(40)  # its value beside it: not squeezed to a dot
        self.ram_budget.setToolTip(RAM_TIP)
        self.ram_budget_entry = BudgetEntry()
        self.ram_budget_entry.setAccessibleName("RAM budget, typed")
        self.ram_budget_entry.setToolTip(
            "Type a RAM budget for experts and press Enter: a size (24GiB), a share of the "
            "experts (50%), experts per layer (32), or auto.")
        self.ram_budget_entry.submitted.connect(self.apply_typed_ram_budget)
        # what the RAM budget buys, in the row: it was only in the slider's tooltip and the
        # Memory tab (the whole sentence stays in the tooltip)
        self.ram_label = QLabel()
        self.ram_label.setObjectName("ramLabel")
        self.ram_label.setAccessibleName("RAM budget now")
        self.ram_auto = QCheckBox("Auto")
        self.ram_auto.setAccessibleName("RAM budget: auto")
        self.ram_auto.setToolTip(RAM_AUTO_TIP)
        self.ram_auto.toggled.connect(self._ram_auto_toggled)
        form.addRow("RAM b&udget", self._row(self.ram_budget, self.ram_label, self.ram_auto,
                                              self.ram_budget_entry))
        # what it buys in short beside the slider; the whole of it in the slider's tooltip
        # and spoken description, and the memory view lists the tiers
        self.audit = QComboBox()
        self.audit.setAccessibleName("Audit tokens")
        for every in (0, 8, 16, 32, 64):
            self.audit.addItem("off" if every == 0 else f"every {every} tokens", every)
        self.audit.setToolTip(
            "Measure what the policy costs: every Nth token is also computed exactly (every "
            "missing expert fetched into scratch slots outside the cache) and compared with "
            "the policy's output. Tokens and decisions are unchanged; each audit costs about "
            "one more token of time. The cache panel shows the estimate: the perplexity "
            "cost expected on the model's own text (its answers).")
        self.audit.currentIndexChanged.connect(
            lambda _i: self.auditRequested.emit(int(self.audit.currentData())))
        # one row, for the height; where the column is too narrow for the guard's target
        # with its word, it says "≤ 1.0%" (_fit_guard): "guard ≤ 1.0%" beside the audit's
        # choice set the window's least width at 12 pt (1037 px, past a 1024 px screen)
        self.audit_row = self._row(self.audit, self.guard_target)
        self.audit_row.installEventFilter(self)
        form.addRow("&Quality audit", self.audit_row)
        audit_label = form.labelForField(self.audit.parentWidget())
        if isinstance(audit_label, QLabel):
            audit_label.setBuddy(self.audit)
        for control in (self.theta, self.beta, self.bonus, self.prefetch_mode, self.budget,
                        self.ram_budget):
            # the row's name labels the control itself, not the row holding it and its value:
            # Alt+V reaches the slider, and a screen reader reads the name with it
            label = form.labelForField(control.parentWidget())
            if isinstance(label, QLabel):
                label.setBuddy(control)

        self.policy_combo.currentIndexChanged.connect(self._policy_chosen)
        self.guard_target.valueChanged.connect(self._guard_target_changed)
        for slider in (self.theta, self.beta, self.bonus):
            slider.valueChanged.connect(self._custom_changed)
            slider.sliderReleased.connect(self._custom_released)
        self.prefetch_mode.currentIndexChanged.connect(self._custom_changed)
        self.prefetch_count.valueChanged.connect(self._custom_changed)
        self.theta_disk.valueChanged.connect(self._custom_changed)
        self.budget.valueChanged.connect(self._budget_moved)
        self.budget.sliderReleased.connect(self._budget_released)
        self.ram_budget.valueChanged.connect(self._ram_budget_moved)
        self.ram_budget.sliderReleased.connect(self._ram_budget_released)
        self._shown = str(self.policy_combo.currentData())
        self._show_values(self._preset(self._shown))
        self._quiet = False
        self._update_custom_enabled()
        self.set_model(None)
        self._fit_guard()

    # ------------------------------------------------------------------ building
    def _fit_guard(self) -> None:
        """The guard's target reads "guard ≤ 1.0%" where the audit row has room for it,
        "≤ 1.0%" where not (the row's name and the box's tooltip still say what it is); the
        row asks for no more width than the short form needs."""
        box, row = self.guard_target, self.audit_row
        layout = row.layout()
        spacing = layout.spacing() if layout is not None else 0
        metrics = box.fontMetrics()
        extra = metrics.horizontalAdvance(GUARD_PREFIX) - metrics.horizontalAdvance(
            GUARD_SHORT_PREFIX)
        long_now = box.prefix() == GUARD_PREFIX
        long_px = box.sizeHint().width() + (0 if long_now else extra)
        short_min = box.minimumSizeHint().width() - (extra if long_now else 0)
        row.setMinimumWidth(self.audit.minimumSizeHint().width() + spacing + short_min)
        room = row.width() >= self.audit.sizeHint().width() + spacing + long_px
        prefix = GUARD_PREFIX if room else GUARD_SHORT_PREFIX
        if box.prefix() != prefix:
            box.setPrefix(prefix)

    def event(self, event: QEvent) -> bool:
        done = super().event(event)
        if event.type() == QEvent.Type.LayoutRequest:
            self.laidOut.emit()
        return done

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.audit_row and event.type() in (
                QEvent.Type.Resize, QEvent.Type.LayoutRequest):  # a new width, a new font
            self._fit_guard()
        return super().eventFilter(watched, event)

    def _slider(self, lo: int, hi: int, value: int, name: str) -> QSlider:
        s = QSlider(Qt.Orientation.Horizontal)
        s.setRange(lo, hi)
        s.setValue(value)
        s.setAccessibleName(name)
        s.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        return s

    @staticmethod
    def _row(control: QWidget, *extras: QWidget) -> QWidget:
        w = QWidget()
        row = QHBoxLayout(w)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(control, 1)
        for extra in extras:
            if isinstance(extra, QLabel):
                extra.setMinimumWidth(36)
            row.addWidget(extra)
        return w

    # ------------------------------------------------------------------ state in
    def set_model(self, model: ModelSummary | None) -> None:
        """Configure the budget slider for ``model`` (disabled without an expert cache)."""
        self.model = model
        self.budget_note = ""
        enabled = bool(model and model.cache_enabled)
        self._quiet = True
        if model and enabled:
            self.budget.setRange(model.top_k, model.n_expert)
            self.budget.setValue(model.slots_per_layer)
            self.ram_budget.setRange(model.top_k, model.n_expert)
            self.ram_budget.setValue(model.ram_slots_per_layer or model.n_expert)
            self._ram_requested = self.ram_budget.value()
            self.prefetch_count.setRange(1, max(1, min(PREFETCH_MAX, model.n_expert)))
        self.budget.setEnabled(enabled)
        self.budget_entry.setEnabled(enabled)
        self.ram_budget.setEnabled(enabled)
        self.ram_budget_entry.setEnabled(enabled)
        self.ram_auto.setEnabled(enabled)
        self.policy_combo.setEnabled(enabled)
        self._quiet = False
        if model is not None:
            self.show_policy(model.policy)
        self._update_budget_label()
        self._update_custom_enabled()

    def show_applied(self, model: ModelSummary, *, policy: bool = True,
                     budget: bool = True) -> None:
        """The engine applied a change: reflect its slots and policy (``policy`` /
        ``budget`` False: a newer request of that kind is pending, leave its control)."""
        self.model = model
        self._quiet = True
        if budget and model.cache_enabled and not self.budget.isSliderDown():
            self.budget.setValue(model.slots_per_layer)
        if model.cache_enabled and not self.ram_budget.isSliderDown() and (
                self.ram_auto.isChecked() or self.ram_budget.value() == self._ram_requested):
            self.ram_budget.setValue(model.ram_slots_per_layer or model.n_expert)
            self._ram_requested = self.ram_budget.value()
        self._quiet = False
        if policy:
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
    def current_policy(self) -> Policy | GuardSpec:
        key = self.policy_combo.currentData()
        if key == GUARD:
            return GuardSpec(target=round(self.guard_target.value(), 1) / 100)
        return self._controls_policy() if key == CUSTOM else PRESETS[key]

    @staticmethod
    def _preset(key: str) -> Policy:
        """The parameters a menu entry shows in Custom's greyed controls (the guard: its
        base, where it starts)."""
        return GuardSpec().start_policy() if key == GUARD else PRESETS[key]

    def _guard_target_changed(self, _value: float) -> None:
        if not self._quiet and self.policy_combo.currentData() == GUARD:
            self.policyRequested.emit(self.current_policy())

    def custom_setting(self) -> Policy:
        """Custom's policy as the user set it, whichever entry is chosen now."""
        if self.policy_combo.currentData() == CUSTOM:
            return self._controls_policy()
        return self._custom_saved

    def _controls_policy(self) -> Policy:
        """Custom's policy from the controls as they stand."""
        disk = self.theta_disk.value()
        return custom_policy(self.theta.value() / 100, self.beta.value() / 100,
                             self.bonus.value() / BONUS_STEPS,
                             prefetch_value(self.prefetch_mode.currentData(),
                                            self.prefetch_count.value()),
                             THETA_DISK_AS_THETA if disk <= THETA_DISK_OFF else round(disk, 2))

    def _show_values(self, policy: Policy) -> None:
        """Set the controls to ``policy``'s parameters without requesting anything."""
        v = control_values(policy)
        quiet, self._quiet = self._quiet, True
        self.theta.setValue(round(v.theta * 100))
        self.beta.setValue(round(v.beta * 100))
        self.bonus.setValue(round(v.bonus * BONUS_STEPS))
        self.prefetch_mode.setCurrentIndex(self.prefetch_mode.findData(v.prefetch_mode))
        if v.prefetch_count is not None:
            self.prefetch_count.setValue(v.prefetch_count)
        self.theta_disk.setValue(THETA_DISK_OFF if v.theta_disk == THETA_DISK_AS_THETA
                                 else v.theta_disk)
        self._quiet = quiet
        self._update_custom_labels()

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
        """The shortcut: to Speed-first, and from it back to the policy in use before
        (Quality-first at first; Custom comes back with its settings). Returns the key."""
        current = self.policy_combo.currentData()
        key = self._last_other if current == SPEED_FIRST else SPEED_FIRST
        self.select_policy(key)
        return key

    def _policy_chosen(self, _index: int) -> None:
        """A preset shows its own parameters in Custom's (greyed) controls; Custom gets
        back the settings it had when the user left it."""
        key = str(self.policy_combo.currentData())
        if self._shown == CUSTOM and key != CUSTOM:
            self._custom_saved = self._controls_policy()
        if key != self._shown:
            self._shown = key
            self._show_values(self._custom_saved if key == CUSTOM else self._preset(key))
        self._update_custom_enabled()
        if key == GUARD and not self.audit.currentData():  # the guard turns audits on
            self.audit.setCurrentIndex(self.audit.findData(GuardSpec().every))
        if key != SPEED_FIRST:
            self._last_other = key
        if not self._quiet:
            self.policyRequested.emit(self.current_policy())

    def _custom_changed(self, _value: int) -> None:
        self._update_custom_labels()
        self._update_custom_enabled()
        dragging = any(s.isSliderDown() for s in (self.theta, self.beta, self.bonus))
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
        self.budget_note = ""
        self.budgetRequested.emit(self.budget.value())

    def _ram_budget_moved(self, _value: int) -> None:
        if not self._quiet and not self.ram_budget.isSliderDown():
            self._request_ram(self.ram_budget.value())
        self._update_ram_label()

    def _ram_budget_released(self) -> None:
        self._request_ram(self.ram_budget.value())
        self._update_ram_label()

    def _request_ram(self, experts: int) -> None:
        """A RAM budget the user set: Auto is no longer the choice."""
        self._show_ram_auto(False)
        self._ram_requested = experts
        self.ramBudgetRequested.emit(experts)

    def _ram_auto_toggled(self, on: bool) -> None:
        if not self._quiet:
            if on:
                self.ramAutoRequested.emit()
            else:  # the tier as it is now, the user's own from here on
                self._request_ram(self.ram_budget.value())
        self._update_ram_label()

    def _show_ram_auto(self, on: bool) -> None:
        quiet, self._quiet = self._quiet, True
        self.ram_auto.setChecked(on)
        self._quiet = quiet

    def set_ram_auto(self, on: bool) -> None:
        """Show whether Auto chose the RAM tier (a load's request), requesting nothing."""
        self._show_ram_auto(on and bool(self.model and self.model.cache_enabled))
        self._update_ram_label()

    def choose_ram_auto(self) -> bool:
        """Auto, as the user chooses it: ticked, or chosen again when it already is (the
        memory available may have changed). False without an expert cache."""
        m = self.model
        if m is None or not m.cache_enabled:
            return False
        if self.ram_auto.isChecked():
            self.ramAutoRequested.emit()
        else:
            self.ram_auto.setChecked(True)  # _ram_auto_toggled requests it
        return True

    def apply_typed_ram_budget(self) -> bool:
        """The typed RAM budget moves the RAM slider, which requests it; "auto" chooses
        Auto."""
        m = self.model
        if m is None or not m.cache_enabled:
            return False
        if is_auto(self.ram_budget_entry.text()):
            self.ram_budget_entry.clear()
            return self.choose_ram_auto()
        slots = self.ram_budget_entry.take_slots(m.n_expert, m.top_k, m.slot_row_bytes)
        if slots is None:
            return False
        if slots == self.ram_budget.value():
            self._request_ram(slots)
            self._update_ram_label()
        else:
            self.ram_budget.setValue(slots)
        return True

    def _update_ram_label(self) -> None:
        m = self.model
        if m is None or not m.cache_enabled:
            self.ram_budget.setAccessibleDescription("")
            self.ram_budget.setToolTip(RAM_TIP)
            self.ram_label.setText("–")
            self.ram_label.setToolTip("")
            return
        n = self.ram_budget.value()
        self.ram_label.setText(ram_short_text(n, m.n_expert, m.slot_row_bytes))
        if n >= m.n_expert:
            text = f"every expert in RAM ({format_bytes(m.n_expert * m.slot_row_bytes)})"
        else:
            text = (f"{format_bytes(n * m.slot_row_bytes)} · {n}/{m.n_expert} experts per "
                    f"layer in RAM · {format_bytes((m.n_expert - n) * m.slot_row_bytes)} "
                    "read from disk")
        applied = m.ram_slots_per_layer or m.n_expert
        if n != applied:
            text += f" (applied: {'all' if applied >= m.n_expert else applied})"
        if self.ram_auto.isChecked():
            text = f"Auto: {text}"
        self.ram_budget.setAccessibleDescription(text)
        self.ram_budget.setToolTip(f"{RAM_TIP}\n\nNow: {text}.")
        self.ram_label.setToolTip(f"{text[:1].upper()}{text[1:]}.")

    def apply_typed_budget(self) -> bool:
        """The typed budget (a size, a share of the experts, or a slot count) moves the
        slider, which requests it. A slider alone cannot hit "exactly 12 GiB" on a model
        with 512 experts; a typo is explained in place and changes nothing."""
        m = self.model
        if m is None or not m.cache_enabled:
            return False
        slots = self.budget_entry.take_slots(m.n_expert, m.top_k, m.slot_row_bytes)
        if slots is None:
            return False
        self.budget_note = self.budget_entry.note  # said under the slider, not only a tip
        if slots == self.budget.value():
            self._update_budget_label()
            self.budgetRequested.emit(slots)  # e.g. a pending request to undo
        else:
            self.budget.setValue(slots)  # _budget_moved requests it
        return True


    # ------------------------------------------------------------------ details
    def set_details_room(self, room: bool) -> None:
        """Whether the window has room for Custom's parameter rows under a preset (a short
        window: they fold away; under Custom they always show)."""
        if room != self._details_room:
            self._details_room = room
            self._update_details()

    def details_shown(self) -> bool:
        return self.policy_combo.currentData() == CUSTOM or self._details_room

    def details_height(self) -> int:
        """The height the parameter rows take, or would take, shown."""
        spacing = max(0, self.form.verticalSpacing())
        return sum(max(row.sizeHint().height(), row.minimumSizeHint().height()) + spacing
                   for row in self.detail_rows)

    def _update_details(self) -> None:
        shown = self.details_shown()
        for row in self.detail_rows:
            if self.form.isRowVisible(row) != shown:
                self.form.setRowVisible(row, shown)
        why = "" if shown else (
            f"{self.policy_combo.currentText()}'s parameters (θ, β, bonus, prefetch) are "
            "folded away while the window is short: choose Custom to set them, or make the "
            "window taller.")
        name = self.form.labelForField(self.policy_combo)
        if isinstance(name, QLabel):
            name.setToolTip(why)

    # ------------------------------------------------------------------ labels
    def _update_custom_enabled(self) -> None:
        """Custom's controls are live only under Custom; θ only while the 0.15 rule is
        the rule (bonus 0), the count only for a fixed prefetch."""
        custom = self.policy_combo.currentData() == CUSTOM and self.policy_combo.isEnabled()
        self._update_details()
        self.guard_target.setEnabled(self.policy_combo.currentData() == GUARD
                                     and self.policy_combo.isEnabled())
        self.theta.setEnabled(custom and self.bonus.value() == 0)
        self.theta_disk.setEnabled(self.theta.isEnabled())
        self.theta.setToolTip(
            "Fetch a missing expert when its gate weight is at least θ (or it is the "
            "first choice); substitute the rest." if self.bonus.value() == 0 else
            "Not used: with a routing bonus the Cache-Prior rule decides (set the bonus to "
            "0 for the 0.15 rule).")
        key = self.policy_combo.currentData()
        self.policy_combo.setToolTip(
            f"{POLICY_TIPS.get(str(key), '')}\n\nWhat to do with a routed expert that is not "
            "in VRAM: wait for it (fetch) or use a resident one (substitute). Applies from "
            "the next token.")
        for widget in (self.beta, self.bonus, self.prefetch_mode):
            widget.setEnabled(custom)
        self.prefetch_count.setEnabled(
            custom and self.prefetch_mode.currentData() == PREFETCH_FIXED)
        for slider, label in ((self.theta, self.theta_label), (self.beta, self.beta_label),
                              (self.bonus, self.bonus_label)):
            label.setEnabled(slider.isEnabled())  # greyed like what it labels
        # the row names too, and say why they are greyed: a preset fixes its settings
        why = "" if custom else CUSTOM_ONLY_TIP if self.policy_combo.isEnabled() else \
            NO_CACHE_TIP
        for widget in (self.theta, self.beta, self.bonus, self.prefetch_mode,
                       self.prefetch_count, self.theta_disk):
            tip = widget.toolTip() if widget is self.theta else \
                self._tips.setdefault(widget, widget.toolTip())
            widget.setToolTip(f"{tip}\n\n{why}" if why else tip)
        for widget in (self.theta, self.beta, self.bonus, self.prefetch_mode):
            name = self.form.labelForField(widget.parentWidget())
            if name is not None:
                name.setEnabled(widget.isEnabled())
                name.setToolTip(why)

    def _update_custom_labels(self) -> None:
        self.theta_label.setText(f"{self.theta.value() / 100:.2f}")
        self.beta_label.setText(f"{self.beta.value() / 100:.2f}")
        bonus = self.bonus.value() / BONUS_STEPS
        self.bonus_label.setText(f"{bonus:.2f}" if bonus > 0 else "off")
        for slider, label in ((self.theta, self.theta_label), (self.beta, self.beta_label),
                              (self.bonus, self.bonus_label)):
            # what a screen reader says: the value shown beside it, not the raw step (15)
            slider.setAccessibleDescription(label.text())

    def _update_budget_label(self) -> None:
        self._update_ram_label()
        m = self.model
        if m is None:
            self._set_budget_text("no model loaded")
            return
        if not m.cache_enabled:
            self._set_budget_text("expert cache off for this model")
            return
        slots = self.budget.value()
        n_bytes = slots * m.slot_row_bytes
        # in the unit that keeps its digits (10 MiB read "0.01 GiB" when GiB began at 1/100)
        text = f"{format_bytes(n_bytes)} · {slots} slots/layer · {slots / m.n_expert:.1%} resident"
        if slots != m.slots_per_layer:
            text += f" (applied: {m.slots_per_layer})"
        if self.budget_note:
            text += f"\n{self.budget_note[:1].upper()}{self.budget_note[1:]}."
        self._set_budget_text(text)

    def _set_budget_text(self, text: str) -> None:
        """The line under the budget slider, also the slider's spoken description (its
        value alone is a bare slot count)."""
        self.budget_label.setText(text)
        self.budget.setAccessibleDescription(text)
