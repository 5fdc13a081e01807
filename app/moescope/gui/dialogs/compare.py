"""Compare policies on the last message: would speed-first have said the same thing?

Perplexity on held-out text says how much a policy costs on average; this dialog answers
for the user's own conversation. It asks the worker (``engine.compare``) for greedy answers
to the chat's last user message under each chosen policy, each from an empty expert cache
at the current budget, the first (Exact: every miss fetched, bitwise the answer without
the cache) as the reference.
The table gives speed, how long each answer stays identical to the reference, the share
of positions that agree, and what the cache did; below it, the chosen answer with the
part that differs from the reference marked. With *Score the whole chat*, each policy also
reads the conversation teacher-forced, and the table adds its perplexity change against
Exact on the user's own text, with a 95% interval (one short answer says little about
quality on average; a few hundred tokens of the chat say more).

Modal while it runs: the engine answers one thing at a time, and the chat's next message
must not interleave with the comparison's.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer
from PySide6.QtGui import QBrush, QColor, QResizeEvent, QTextCharFormat, QTextCursor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QTextBrowser,
    QVBoxLayout,
    QWidget,
)

from moescope.cache.policy import PRESETS, THETA_DISK_AS_THETA, Policy
from moescope.display.policy_choices import (
    CUSTOM,
    POLICY_CHOICES,
    POLICY_NAMES,
    POLICY_TIPS,
    PREFETCH_OFF,
    control_values,
)
from moescope.engine.compare import Comparison, PolicyAnswer, same_start_text
from moescope.gui import theme
from moescope.gui.widgets.note_area import NoteArea
from moescope.gui.widgets.screen_fit import WINDOW_FRAME, resize_within_screen
from moescope.gui.worker import CompareRequest, EngineClient
from moescope.model.reasoning import split_reasoning
from moescope.session.snapshots import ModelSummary

REFERENCE = "exact"
DEFAULT_CHOSEN = ("quality-first", "speed-first", "psr")
COLUMNS = ("Policy", "tok/s", "vs Exact", "Same start", "Agreement", "Tokens", "Hit rate",
           "Substituted", "Mass/token", "Fetched MB/token", "Expected cost", "Chat perplexity")
TIMED_NOTE = (
    "tok/s here times the decode alone (greedy, nothing streamed to the window, no trace, "
    "no Markdown), so it is higher than the chat's, which includes sampling, streaming "
    "and drawing every token.")
MEASURED_NOTE = (
    "tok/s is measured on this machine, each policy timing its own answer (answers that "
    "part can differ in length). A trace's What-if instead models a GPU and its copy link "
    "(pcie4 by default) over one recorded routing, so the two can rank policies "
    "differently: PSR's prefetches, hidden under compute there, take this machine's CPU "
    "time here, and the decode waits for any still in flight.")
"""The tok/s header's tip (the notes above the table were cut at 12 pt on 1366x768)."""
PREFETCH_NOTE = ("A prefetching policy's tok/s counts its prefetches on this machine's CPU "
                 "(a trace's What-if models a GPU instead: see the tok/s header).")
"""Said under a run where a prefetching policy answered."""
LENGTH_NOTE = (
    "* Different lengths (Tokens column): each tok/s is over its own answer, whose first "
    "tokens, from an empty cache, cost the most: not like for like. For equal lengths, "
    "set Tokens per answer below the shortest.")
"""Said above the table, on the line after the answers' count, where a speed-up compares
answers of different lengths (Exact gave 9 tokens, Quality-first 64: "2.60×", with the only
caveat cut off)."""
COLUMN_TIPS = {
    "tok/s": f"{TIMED_NOTE}\n\n{MEASURED_NOTE}",
    "vs Exact": "This policy's tok/s over Exact's, each over its own answer; * where the "
                "two answers differ in length (not like for like).",
    "Tokens": "The answer's length in tokens (it ends at the model's end of answer, or at "
              "Tokens per answer).",
    "Expected cost": "The answer's audited quality cost (audits on): exp(mean KL(exact || "
                     "policy)) - 1 over its audited tokens, the perplexity cost expected on "
                     "the model's own text (its answer). Chat perplexity measures the "
                     "conversation's given tokens instead.",
}
OPTIONAL_COLUMNS = ("Expected cost", "Chat perplexity")
"""Shown only where a row has a value (audits on; the chat scored): eleven columns needed
a sideways scroll at 12 pt on 1366x768, and these were "–" down to the last row."""


DIALOG_SIZE = QSize(980, 760)
NOTE_LINES = 3
"""The notes' lines where the dialog is short (the rest scrolls)."""
RESULTS_ROOM_LINES = 10
"""Lines of room the table and the answer keep beyond their least before the notes grow
past :data:`NOTE_LINES`."""
"""The dialog's first size, where the screen has room (less the frame where it has not)."""


class CompareDialog(QDialog):
    """Choose policies, run, read the table; the worker does the decoding."""

    def __init__(self, client: EngineClient, model: ModelSummary,
                 messages: list[dict[str, str]], thinking: str = "default",
                 parent: QWidget | None = None,
                 transcript: list[dict[str, str]] | None = None,
                 custom: Policy | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Compare policies on the last message")
        self.setModal(True)
        self.client, self.model, self.messages, self.thinking = client, model, messages, thinking
        self.transcript = transcript or []
        self.custom = custom
        """Custom's settings (θ, β, bonus, prefetch), offered as one more policy."""
        self.result: Comparison | None = None
        self.running = False
        layout = QVBoxLayout(self)
        intro = QLabel(
            f"Greedy answers to your last message under each policy, each from an empty "
            f"expert cache at the current budget ({model.slots_per_layer}/{model.n_expert} "
            f"experts per layer); Exact (every miss fetched: llama.cpp's answer without the "
            f"cache) is the reference. tok/s times the decode alone: hover a column's "
            f"header for what it measures.")
        # the notes ask for three lines (the rest scrolls) where the dialog is short, and
        # the table and the answer share the rest by a splitter: at 12 pt on a 1024x700
        # screen the notes' 5 + 5 lines took that height and left the table one row and a
        # half; where the dialog has room they show whole (_fit_notes)
        self.intro_area = NoteArea(intro, lines=2, most=NOTE_LINES)
        layout.addWidget(self.intro_area)

        row = QHBoxLayout()
        self.policies = QListWidget()
        self.policies.setAccessibleName("Policies to compare")
        for key, label in POLICY_CHOICES:
            if key == REFERENCE or (key == CUSTOM and custom is None):
                continue
            tip = POLICY_TIPS.get(key, "")
            if key == CUSTOM and custom is not None:
                label = f"Custom: {custom_text(custom)}"
                tip = "Your Custom settings, as set in the cache controls."
            item = QListWidgetItem(label)
            item.setData(Qt.ItemDataRole.UserRole, key)
            item.setToolTip(tip)
            item.setFlags(item.flags() | Qt.ItemFlag.ItemIsUserCheckable)
            item.setCheckState(Qt.CheckState.Checked if key in DEFAULT_CHOSEN
                               else Qt.CheckState.Unchecked)
            self.policies.addItem(item)
        # every policy where there is room, four at least (it scrolls), in the font of the
        # moment: a fixed 150 px showed seven and a half at 12 pt
        rows = self.policies.sizeHintForRow(0) if self.policies.count() else 0
        frame = 2 * self.policies.frameWidth()
        self.policies.setMinimumHeight(rows * min(4, self.policies.count()) + frame)
        self.policies.setMaximumHeight(rows * self.policies.count() + frame)
        row.addWidget(self.policies, 1)
        side = QVBoxLayout()
        tokens_label = QLabel("&Tokens per answer")
        side.addWidget(tokens_label)
        self.max_tokens = QSpinBox()
        tokens_label.setBuddy(self.max_tokens)
        self.max_tokens.setAccessibleName("Tokens per answer")
        self.max_tokens.setRange(4, 4096)
        self.max_tokens.setValue(64)
        side.addWidget(self.max_tokens)
        self.score = QCheckBox("&Score the whole chat")
        self.score.setToolTip(
            "Also read the whole conversation, teacher-forced, under each policy from an "
            "empty cache: its perplexity change against Exact on your own text, with a 95% "
            "interval. Takes about as long as answering once per token of the chat.")
        self.score.setEnabled(len(self.transcript) > 1)
        side.addWidget(self.score)
        self.run_button = QPushButton("&Run")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(self.run)
        self.stop_button = QPushButton("Sto&p")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(self.stop)
        side.addWidget(self.run_button)
        side.addWidget(self.stop_button)
        side.addStretch(1)
        row.addLayout(side)
        layout.addLayout(row)

        self.progress = QProgressBar()
        self.progress.setAccessibleName("Policies answered")
        self.progress.setVisible(False)
        layout.addWidget(self.progress)
        self.status = QLabel("")
        self.status_area = NoteArea(self.status, lines=2, most=NOTE_LINES)
        layout.addWidget(self.status_area)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setAccessibleName("Comparison")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        for col, name in enumerate(COLUMNS):
            header = self.table.horizontalHeaderItem(col)
            if header is not None and name in COLUMN_TIPS:
                header.setToolTip(COLUMN_TIPS[name])
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().setVisible(False)
        self.table.resizeColumnsToContents()  # whole headers before the first run too
        self.table.itemSelectionChanged.connect(self._show_selected)
        # the header, two rows and the sideways scroll bar at least
        self.table.setMinimumHeight(self.table.horizontalHeader().sizeHint().height()
                                    + 2 * self.table.verticalHeader().defaultSectionSize()
                                    + self.table.horizontalScrollBar().sizeHint().height()
                                    + 2 * self.table.frameWidth() + 2)
        self.answer = QTextBrowser()
        self.answer.setAccessibleName("Answer of the selected policy")
        self.answer.setOpenLinks(False)
        self.answer.setMinimumHeight(3 * self.answer.fontMetrics().lineSpacing()
                                     + 2 * self.answer.frameWidth()
                                     + 2 * int(self.answer.document().documentMargin()))
        self.results = QSplitter(Qt.Orientation.Vertical)
        self.results.setAccessibleName("Comparison and answer")
        self.results.addWidget(self.table)
        self.results.addWidget(self.answer)
        self.results.setChildrenCollapsible(False)
        self.results.setStretchFactor(0, 1)
        self.results.setStretchFactor(1, 1)
        self._sized_by_user = False
        """The user moved the table's border: the table is no longer fitted to its rows."""
        self.results.splitterMoved.connect(lambda *_: setattr(self, "_sized_by_user", True))
        # rows out of view (new rows, a sideways scroll bar, a shorter dialog, longer notes
        # above): fit again, once the splitter has laid the table out
        self.table.verticalScrollBar().rangeChanged.connect(lambda *_: self._fit_table())
        self.results.installEventFilter(self)
        self.status_area.viewport().installEventFilter(self)  # a new status: fit the notes
        layout.addWidget(self.results, 1)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        layout.addWidget(buttons)
        resize_within_screen(self, DIALOG_SIZE)

        w = client
        w.compareProgress.connect(self._on_progress)
        w.compareFinished.connect(self._on_finished)
        w.compareFailed.connect(self._on_failed)

    # ------------------------------------------------------------------ running
    def chosen(self) -> tuple[Policy | str, ...]:
        """The reference first, then the checked policies in menu order (Custom as the
        policy its settings make)."""
        keys = [self.policies.item(i).data(Qt.ItemDataRole.UserRole)
                for i in range(self.policies.count())
                if self.policies.item(i).checkState() == Qt.CheckState.Checked]
        return (REFERENCE, *(self.custom if k == CUSTOM and self.custom is not None else k
                             for k in keys))

    def run(self) -> bool:
        if self.running:
            return False
        policies = self.chosen()
        if len(policies) < 2:
            self.status.setText("Check at least one policy to compare with Exact.")
            return False
        self.running = True
        self.result = None
        self.table.setRowCount(0)
        self.answer.clear()
        pressed = self.run_button.hasFocus()
        self.stop_button.setEnabled(True)
        if pressed:  # not the table's empty rows: Space again stops it (then the results)
            self.stop_button.setFocus()
        self.run_button.setEnabled(False)
        self.policies.setEnabled(False)
        self.progress.setRange(0, len(policies))
        self.progress.setValue(0)
        self.progress.setVisible(True)
        self.status.setText("Answering…")
        transcript = tuple(self.transcript) if self.score.isChecked() else ()
        self.client.compare(CompareRequest(messages=tuple(self.messages), policies=policies,
                                           max_tokens=self.max_tokens.value(),
                                           thinking=self.thinking, transcript=transcript))
        return True

    def stop(self) -> None:
        if self.running:
            self.status.setText("Stopping after the current token…")
            self.client.cancel_compare()

    def _on_progress(self, done: int, total: int, policy: str) -> None:
        if not self.running:
            return
        self.progress.setValue(done)
        if policy.startswith("scoring "):
            self.status.setText(f"{policy[0].upper()}{policy[1:]} ({done + 1} of {total})…")
        elif policy:
            self.status.setText(f"Answering under {policy} ({done + 1} of {total})…")

    def _on_failed(self, message: str) -> None:
        if not self.running:
            return
        self._done()
        self.status.setText(f"The comparison failed: {message}")

    def _on_finished(self, result: Comparison, summary: ModelSummary) -> None:
        if not self.running:
            return
        self._done()
        self.result = result
        self.model = summary
        self._fill(result)
        ref = result.reference
        n = len(ref.token_ids) if ref else 0
        text = f"{len(result.answers)} answers of up to {result.max_tokens} tokens"
        if ref is not None:
            text += f" (Exact gave {n})"
        if result.scored_tokens:
            text += f"; {result.scored_note()}"
        if result.stopped:
            text += "; stopped before every policy answered"
        text += ". Select a row to read its answer."
        if any(unequal_length(result, a) for a in result.answers):
            text += f"\n{LENGTH_NOTE}"  # before the prefetch note: in the first three lines
        if any(self._prefetches(a.policy) for a in result.answers):
            text += f"\n{PREFETCH_NOTE}"
        self.status.setText(text)
        if self.table.rowCount():
            self.table.selectRow(min(1, self.table.rowCount() - 1))

    def _prefetches(self, name: str) -> bool:
        """Whether the policy an answer names prefetches (PSR, or Custom with prefetch)."""
        preset = PRESETS.get(name)
        if preset is not None:
            return bool(preset.prefetch)
        return self.custom is not None and bool(self.custom.prefetch)

    def _done(self) -> None:
        self.running = False
        self.run_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        self.policies.setEnabled(True)
        self.progress.setVisible(False)

    # ------------------------------------------------------------------ results
    def _fill(self, result: Comparison) -> None:
        self.table.setRowCount(len(result.answers))
        for r, a in enumerate(result.answers):
            c = a.cache
            reference = r == 0
            cells = (
                POLICY_NAMES.get(a.policy, a.policy), f"{a.tokens_per_second:.1f}",
                "reference" if reference else
                f"{result.speedup(a):.2f}×{'*' if unequal_length(result, a) else ''}",
                "reference" if reference else same_start_text(a),
                "reference" if reference else f"{a.agreement:.0%}",
                str(len(a.token_ids)),
                f"{c.hit_rate:.1%}", f"{c.substituted_fraction:.1%}",
                f"{c.mass_per_token:.3f}", f"{c.fetched_mb_per_token:.2f}",
                a.audit.cost_text() if a.audit is not None else "–",
                "reference" if reference and a.nll is not None
                else result.perplexity_text(a))
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if COLUMNS[col] == "Expected cost" and a.audit is not None:
                    item.setToolTip(a.audit.describe())
                if col:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight
                                          | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, col, item)
        for name in OPTIONAL_COLUMNS:
            col = COLUMNS.index(name)
            self.table.setColumnHidden(col, all(
                (self.table.item(r, col) is None or self.table.item(r, col).text() == "–")
                for r in range(self.table.rowCount())))
        self.table.resizeColumnsToContents()
        self._fit_width()
        self._fit_table()

    def _fit_width(self) -> None:
        """Wide enough for every column where the screen is (it stays if wider): at 12 pt
        the table needed a sideways scroll in the dialog's first 980 px."""
        short = self.table.horizontalHeader().length() - self.table.viewport().width()
        if short <= 0:
            return
        screen = self.screen().availableGeometry() if self.screen() else None
        width = self.width() + short + 2
        if screen is not None:
            width = min(width, screen.width() - WINDOW_FRAME.width())
        if width > self.width():
            self.resize(width, self.height())
            if screen is not None and self.frameGeometry().right() > screen.right():
                self.move(max(screen.left(), screen.right() + 1
                              - self.frameGeometry().width()), self.y())

    def _fit_table(self) -> None:
        """Give the table the height of all its rows where the answer below keeps its
        least height: the splitter's even halves left the fourth row of the usual four
        (Exact and three policies) out of view at 12 pt on a 1024x700 screen, under an
        answer box with room to spare. Again whenever rows go out of view (the sideways
        scroll bar comes with the columns' widths, a smaller dialog), until the user sets
        the border."""
        sizes = self.results.sizes()
        total = sum(sizes)
        if total <= 0 or self._sized_by_user:
            return
        t = self.table
        short = sum(t.rowHeight(r) for r in range(t.rowCount())) - t.viewport().height()
        want = min(sizes[0] + short, total - self.answer.minimumHeight())
        if want > sizes[0]:
            self.results.setSizes([want, total - want])

    def _fit_notes(self) -> None:
        """The notes whole where the table and the answer keep room enough below them
        (:data:`RESULTS_ROOM_LINES` lines beyond their least), else :data:`NOTE_LINES`
        lines each (the rest scrolls). Measured with the notes held short, so a dialog
        at the edge does not flip between the two."""
        areas = (self.intro_area, self.status_area)
        short = [min(a.whole_px(), a.lines_px(NOTE_LINES)) for a in areas]
        extra = sum(a.whole_px() - s for a, s in zip(areas, short, strict=True))
        results = self.results.height() + sum(a.height() for a in areas) - sum(short)
        need = (self.results.minimumSizeHint().height()
                + RESULTS_ROOM_LINES * self.fontMetrics().lineSpacing())
        most = None if results - extra >= need else NOTE_LINES
        for area in areas:
            area.set_most(most)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        QTimer.singleShot(0, self, self._fit_notes)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.results and event.type() == QEvent.Type.Resize:
            QTimer.singleShot(0, self, self._fit_table)
        elif watched is self.status_area.viewport() and event.type() in (
                QEvent.Type.LayoutRequest, QEvent.Type.Resize):
            QTimer.singleShot(0, self, self._fit_notes)
        return super().eventFilter(watched, event)

    def _show_selected(self) -> None:
        rows = self.table.selectionModel().selectedRows()
        if not rows or self.result is None:
            return
        show_answer(self.answer, self.result, self.result.answers[rows[0].row()])

    # ------------------------------------------------------------------ closing
    def reject(self) -> None:
        """Close; a running comparison is stopped (the worker finishes the token)."""
        self.stop()
        self.running = False
        w = self.client
        for signal, slot in ((w.compareProgress, self._on_progress),
                             (w.compareFinished, self._on_finished),
                             (w.compareFailed, self._on_failed)):
            signal.disconnect(slot)
        super().reject()


def unequal_length(result: Comparison, answer: PolicyAnswer) -> bool:
    """Whether ``answer``'s speed-up over Exact compares answers of different lengths."""
    ref = result.reference
    return ref is not None and answer is not ref \
        and len(answer.token_ids) != len(ref.token_ids)


def custom_text(policy: Policy) -> str:
    """Custom's settings in one line: "θ 0.15 · disk 0.30 · β 0.50" or "bonus 0.10 · β 0.50
    · prefetch top-k" (the disk threshold only where it is not θ's)."""
    values = control_values(policy)
    parts = [f"bonus {values.bonus:.2f}" if values.bonus > 0 else f"θ {values.theta:.2f}",
             f"β {values.beta:.2f}"]
    if values.bonus == 0 and values.theta_disk != THETA_DISK_AS_THETA:
        parts.insert(1, f"disk {values.theta_disk:.2f}")
    if values.prefetch_mode != PREFETCH_OFF:
        parts.append(f"prefetch {values.prefetch_count or values.prefetch_mode}")
    return " · ".join(parts)


def common_start(a: str, b: str) -> int:
    """Characters at the start of ``a`` and ``b`` that are the same."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def shown_text(raw: str) -> str:
    """An answer as the dialog shows it: a thinking model's thoughts under "Thinking:",
    then its answer, never the raw markers (``model.reasoning``)."""
    split = split_reasoning(raw)
    if not split.has_reasoning:
        return raw
    return f"Thinking: {split.reasoning}" + (f"\n\n{split.answer}" if split.answer else "")


def show_answer(view: QTextBrowser, result: Comparison, answer: PolicyAnswer) -> None:
    """``answer`` as plain text (model text is never HTML), the part after the first
    character where it differs from the reference marked."""
    view.clear()
    ref = result.reference
    text = shown_text(answer.text)
    common = common_start(shown_text(ref.text), text) if ref else len(text)
    cursor = QTextCursor(view.document())
    plain = QTextCharFormat()
    plain.setForeground(QColor(theme.TEXT))
    cursor.insertText(text[:common], plain)
    if common < len(text):
        marked = QTextCharFormat(plain)
        marked.setBackground(QBrush(QColor(theme.DIVERGED_BACKGROUND)))
        cursor.insertText(text[common:], marked)
    view.setToolTip("" if answer is ref else
                    "Marked: where this answer stops matching Exact's")
