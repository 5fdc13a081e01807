"""The typed VRAM budget next to a budget slider (main window and open-model dialog).

A slider alone cannot hit "exactly 12 GiB" on a model with 512 experts, so a box beside
it takes a size, a share of the experts, or slots per layer (``cache.budget``'s grammar,
the same as ``--budget``). Enter reads it: a typo is marked, explained at once under the
box (and in its tooltip), and changes nothing. Enter is the box's own: in a dialog it
would otherwise also press the default button (the open-model dialog's *Open*, loading a
budget not yet seen).
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import QLineEdit, QToolTip, QWidget

from moescope.cache.budget import plan_slots
from moescope.util.errors import MoEScopeError

BUDGET_ENTRY_TIP = ("Type a VRAM budget for expert slots and press Enter: a size (12GiB, "
                    "512MiB), a share of the experts (25%), or slots per layer (16).")


class BudgetEntry(QLineEdit):
    """Emits ``submitted`` on Enter; :meth:`take_slots` turns the text into slots."""

    submitted = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setAccessibleName("VRAM budget, typed")
        self.setPlaceholderText("e.g. 12GiB")
        self.setToolTip(BUDGET_ENTRY_TIP)
        self.setMaximumWidth(96)
        self.note = ""
        """Why the last typed budget became another slot count ("" when it did not)."""

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Return, Qt.Key.Key_Enter):
            event.accept()  # not passed on to a dialog's default button
            self.submitted.emit()
            return
        super().keyPressEvent(event)

    def take_slots(self, n_expert: int, top_k: int, row_bytes: int) -> int | None:
        """Slots per layer for the typed text (``row_bytes``: one slot in every MoE
        layer), clearing the box; None, with the box marked and the reason in its
        tooltip, if it does not read as a budget (or is empty)."""
        text = self.text().strip()
        if not text:
            return None
        try:
            plan = plan_slots(text, n_expert=n_expert, top_k=top_k,
                              bytes_per_expert=[row_bytes])
        except MoEScopeError as err:
            self._mark(str(err), invalid=True)
            return None
        self.note = plan.message if plan.clamped else ""
        self._mark(self.note, invalid=False)
        self.clear()
        return plan.slots_per_layer

    def _mark(self, note: str, *, invalid: bool) -> None:
        self.setToolTip(f"{note}\n\n{BUDGET_ENTRY_TIP}" if note else BUDGET_ENTRY_TIP)
        self.setAccessibleDescription(note)
        self.setProperty("invalid", invalid)
        self.style().unpolish(self)  # the style sheet's [invalid="true"] border
        self.style().polish(self)
        if invalid:  # said at once, under the box: a red border alone did not say why
            QToolTip.showText(self.mapToGlobal(QPoint(0, self.height())), note, self)
