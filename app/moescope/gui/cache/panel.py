"""The cache panel: heatmap, per-token and per-layer plots, memory, behind ONE timer.

Why one display timer: snapshots can arrive hundreds of times per second (a small model
decodes thousands of tokens/s); repainting per snapshot would starve the event loop, as
Jan's token-speed bug showed. Snapshots only update the model (:class:`CacheModel`);
the timer, at most :data:`FRAME_HZ` times per second, redraws what is dirty and visible.
Labels change at a few hertz so they stay readable.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

from PySide6.QtCore import QEvent, QObject, Qt, QTimer
from PySide6.QtGui import QResizeEvent, QTextLayout, QTextOption
from PySide6.QtWidgets import QSplitter, QTabWidget, QVBoxLayout, QWidget

from moescope.display.cache_model import (
    AUDIT_TIP,
    PREFETCH_TIP,
    SUMMARY_TIP,
    TRACE_SUMMARY_TIP,
    CacheModel,
    audit_text,
    prefetch_text,
)
from moescope.display.memory_model import MemoryModel
from moescope.gui.cache.heatmap_view import HeatmapView
from moescope.gui.cache.layer_bars_view import LayerBarsView
from moescope.gui.cache.memory_view import MemoryView
from moescope.gui.cache.time_plots_view import TimePlotsView
from moescope.gui.widgets.named_tabs import name_tabs
from moescope.gui.widgets.wrapped_label import WrappedLabel
from moescope.session.snapshots import ModelSummary, TokenSnapshot

FRAME_HZ = 30
FRAME_MS = 1000 // FRAME_HZ + 1  # 34 ms: never above 30 frames per second
LABEL_EVERY_FRAMES = 6  # labels at ~5 Hz
MEMORY_SAMPLE_MS = 1000


class StatsLabel(WrappedLabel):
    """The panel's stats: its lines ("now: …", then the last tokens' numbers) each start
    on a line of their own also where they do not all fit (the label's own shortening
    ran them together: "…TTFT 512 ms last 32 tokens (quality-first)…"), and the last
    one, the numbers, keeps its lines first: in a short window the numbers stay in view
    and the first line gives way (the policy and the slots are in the cache controls
    above; the whole text is in the tooltip)."""

    def shown_lines(self) -> list[str]:
        paragraphs = self.text().split("\n")
        if len(paragraphs) == 1 or not self.clipped():
            return super().shown_lines()
        rect = self.contentsRect().adjusted(self.margin(), self.margin(), -self.margin(),
                                            -self.margin())
        width = max(1, rect.width())
        left = max(1, rect.height() // max(1, self.fontMetrics().lineSpacing()))
        wrapped = [self._wrap(p, width) for p in paragraphs]
        given = [0] * len(paragraphs)
        for i in reversed(range(len(paragraphs))):  # the numbers first, then upwards
            given[i] = min(len(wrapped[i]), left)
            left -= given[i]
        lines: list[str] = []
        for text, spans, n in zip(paragraphs, wrapped, given, strict=True):
            if n == 0:
                continue
            if n == len(spans):
                lines.extend(text[a:a + k].rstrip() for a, k in spans)
                continue
            lines.extend(text[a:a + k].rstrip() for a, k in spans[:n - 1])
            lines.append(self._elided(text[spans[n - 1][0]:], width))
        return lines

    def _wrap(self, text: str, width: int) -> list[tuple[int, int]]:
        """Where ``text`` breaks into lines ``width`` wide: (start, length) each."""
        layout = QTextLayout(text, self.font())
        option = QTextOption()
        option.setWrapMode(QTextOption.WrapMode.WordWrap)
        layout.setTextOption(option)
        layout.beginLayout()
        spans = []
        while (line := layout.createLine()).isValid():
            line.setLineWidth(width)
            spans.append((line.textStart(), line.textLength()))
        layout.endLayout()
        return spans or [(0, 0)]

    def _elided(self, rest: str, width: int) -> str:
        """``rest`` cut to one line at a whole part (" · "), else a whole word, + " …"."""
        metrics = self.fontMetrics()
        for sep in (" · ", " "):
            parts = rest.split(sep)
            for n in range(len(parts) - 1, 0, -1):
                cut = sep.join(parts[:n]).rstrip(" ·")
                if metrics.horizontalAdvance(cut + " …") <= width:
                    return cut + " …"
        return metrics.elidedText(rest, Qt.TextElideMode.ElideRight, width)


class CachePanel(QWidget):
    """Shows a :class:`CacheModel`; ``live=False`` for a reopened trace (no memory
    sampling, no timer: it draws once when filled)."""

    def __init__(self, model: CacheModel | None = None, *, live: bool = True,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.model = model or CacheModel()
        self.memory = MemoryModel()
        self.live = live
        self.setAccessibleName("Expert cache panel")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        # two lines at least whatever it says: a plain wrapped label grew a line with each
        # part a chat added, and the window with it (past a 700-pixel screen's bottom)
        self.summary = StatsLabel("No model loaded", lines=2)
        self.summary.setObjectName("statsLabel")
        self.summary.setAccessibleName("Cache statistics")
        # selectable by keyboard too, so it is in the Tab chain: the hit rate and tokens/s
        # reach a screen reader, and the numbers can be copied without a mouse
        self.summary.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse
                                             | Qt.TextInteractionFlag.TextSelectableByKeyboard)
        self.summary.setFocusPolicy(Qt.FocusPolicy.StrongFocus)  # Qt gives it click focus only
        layout.addWidget(self.summary)
        self.heatmap = HeatmapView(self.model)
        self.time_plots = TimePlotsView(self.model)
        if not live:  # a reopened trace: audited when it was recorded, or not
            self.time_plots.set_audit_every(None)
        self.layer_bars = LayerBarsView(self.model)
        self.memory_view = MemoryView(self.memory, self.model, live=live)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.time_plots, "Per token")
        self.tabs.addTab(self.layer_bars, "Per layer")
        self.tabs.addTab(self.memory_view, "Memory")
        name_tabs(self.tabs, "Cache plots", [
            "Curves over the latest tokens: substituted mass, tokens/s, hit rate, "
            "fetched MB, audited KL",
            "Bars per layer: where the substituted mass, the hits and the copies happen",
            "RAM and VRAM over time, and where the experts live in host memory"])
        self.tabs.currentChanged.connect(lambda _i: self._mark_all_dirty())
        self.splitter = QSplitter(Qt.Orientation.Vertical)
        self.splitter.addWidget(self.heatmap)
        self.splitter.addWidget(self.tabs)
        self.splitter.setStretchFactor(0, 1)
        self.splitter.setStretchFactor(1, 1)
        layout.addWidget(self.splitter, 1)
        self._fit_on_layout = False
        """Fit the heatmap to its rows whenever it is laid out again (after a font change,
        until the user moves the splitter)."""
        self.heatmap.installEventFilter(self)
        self.splitter.splitterMoved.connect(self._split_by_user)
        self._user_split = False
        """The user moved the border under the heatmap: the panel's resizes keep it."""
        self.repaints = 0
        self.repaint_times: deque[float] = deque(maxlen=4096)
        self._frames = 0
        self._pending: set[str] = set()
        self.timer = QTimer(self)
        self.timer.setInterval(FRAME_MS)
        self.timer.timeout.connect(self._frame)
        self.memory_timer = QTimer(self)
        self.memory_timer.setInterval(MEMORY_SAMPLE_MS)
        self.memory_timer.timeout.connect(self.memory.sample)
        if live:
            self.timer.start()
            self.memory.sample()
            self.memory_timer.start()

    # ------------------------------------------------------------------ input
    def set_model(self, summary: ModelSummary | None) -> None:
        """A newly loaded model: start from empty plots sized for it."""
        self.model.reset(summary)
        self.show_numbers()

    def show_numbers(self) -> None:
        """Plots sized for the model's numbers as they stand (a reopened trace's, accounted
        before this panel was made: :func:`moescope.display.trace_io.account`)."""
        summary = self.model.model
        self.heatmap.reset()
        self.time_plots.reset()
        self.layer_bars.reset()
        self.memory_view.set_expert_buffer(summary.expert_buffer if summary else "",
                                           summary.slot_buffer if summary else "")
        self._mark_all_dirty()
        self.summary.setText(self._summary_text())
        self.heatmap.update_title()
        self.fit_heatmap()

    def fit_heatmap(self) -> None:
        """Give the heatmap the height its rows want (its size hint) and the plots below
        the rest: they scroll, the heatmap does not. On a small screen its rows were
        squeezed to a few pixels each while the plots kept more than they needed."""
        sizes = self.splitter.sizes()
        total = sum(sizes)
        if total <= 0:  # not laid out yet: the first layout uses the size hints
            return
        # the first per-token plots whole first (a 1366x768 screen cut the second one)
        plots = max(self.tabs.minimumSizeHint().height(),
                    self._key_plots_tab_height(self.time_plots.compact))
        want = min(self.heatmap.sizeHint().height(), total - plots)
        fitted = [max(want, self.heatmap.minimumSizeHint().height()), total - want]
        if fitted != sizes:  # after a font change this runs at each of the heatmap's layouts
            self.splitter.setSizes(fitted)

    def _key_plots_tab_height(self, compact: bool) -> int:
        """The plots' tabs with their tab bar and the first per-token plots whole."""
        return (self.tabs.tabBar().sizeHint().height()
                + self.time_plots.key_plots_px(compact=compact) + 4)

    def key_plots_height(self, *, compact: bool) -> int:
        """The panel's height with its stats line, the heatmap at its least and the first
        per-token plots (substituted mass, tokens/s) whole, ``compact`` or not (without
        or with the heatmap's title), whichever it is now: what a short window keeps for
        it before the cache controls' optional rows."""
        least = self.minimumSizeHint().height() - self.tabs.minimumSizeHint().height()
        title = self.heatmap.title
        title_px = title.minimumSizeHint().height() + self.heatmap.layout().spacing()
        if compact and not title.isHidden():
            least -= title_px
        elif not compact and title.isHidden():
            least += title_px
        return least + max(self.tabs.minimumSizeHint().height(),
                           self._key_plots_tab_height(compact))

    def set_compact(self, compact: bool) -> None:
        """A short window: the heatmap's title line (what the stats line above says too)
        folds away and the stats line keeps to its two lines (the rest in its tooltip),
        for the plots below; the title's text stays the heatmap's description."""
        self.summary.set_max_lines(self.summary.lines if compact else None)
        self.time_plots.set_compact(compact)
        if self.heatmap.title.isHidden() != compact:
            self.heatmap.title.setVisible(not compact)
            self.fit_heatmap()

    def _split_by_user(self, *_args: object) -> None:
        self._fit_on_layout = False
        self._user_split = True

    def resizeEvent(self, event: QResizeEvent) -> None:
        """A taller or shorter panel (a window resized, the cache controls' rows folded):
        the heatmap fitted again, the first plots whole first, until the user moves the
        border under it (the splitter shared a change evenly: a shorter window cut the
        tokens/s plot while the heatmap kept more than its rows want)."""
        super().resizeEvent(event)
        if not self._user_split and event.size().height() != event.oldSize().height():
            QTimer.singleShot(0, self, self.fit_heatmap)

    def changeEvent(self, event: QEvent) -> None:
        """A new font size: the heatmap's rows fitted again as it is laid out at it (its
        legend's lines grew with the small print and took the rows' height: six layers in
        50 px at 12 pt on a 1440x900 screen, fitted at the load's smaller font), until the
        user moves the border under it."""
        super().changeEvent(event)
        if event.type() == QEvent.Type.FontChange:
            self._fit_on_layout = True
            QTimer.singleShot(0, self, self.fit_heatmap)

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if (watched is self.heatmap and event.type() == QEvent.Type.LayoutRequest
                and self._fit_on_layout):  # its size hint may have changed: once settled
            QTimer.singleShot(0, self, self.fit_heatmap)
        return super().eventFilter(watched, event)

    def set_audit_every(self, every: int) -> None:
        """The engine audits every ``every`` tokens from now (0: off): the audited-KL plot
        says so while it has no point to show."""
        self.time_plots.set_audit_every(every)

    def update_model(self, summary: ModelSummary) -> None:
        """Same model, new budget or policy (history kept)."""
        self.model.set_model(summary)

    def add_marker(self, step: int, label: str) -> None:
        """Mark ``step`` on the time plots (drawn at the next frame)."""
        self.model.add_marker(step, label)

    def add_snapshots(self, snaps: Iterable[TokenSnapshot]) -> None:
        """Account tokens; drawing waits for the next frame."""
        self.model.add_many(snaps)

    # ------------------------------------------------------------------ drawing
    def _mark_all_dirty(self) -> None:
        self._pending.update(("heatmap", "time", "layers", "labels", "memory"))

    def _frame(self) -> None:
        """One display tick: redraw what changed since the last one, if visible."""
        self._frames += 1
        self._pending |= self.model.take_dirty()
        if self.memory.dirty:
            self._pending.add("memory")
            self.memory.dirty = False
        if not self._pending:
            return
        self.repaints += 1
        self.repaint_times.append(time.monotonic())
        self.draw()

    def draw(self, *, force: bool = False) -> None:
        """Redraw the dirty, visible views now (``force``: all of them, e.g. a trace)."""
        pending = self._pending | ({"heatmap", "time", "layers", "labels", "memory"}
                                   if force else set())
        visible = self.tabs.currentWidget()
        if "heatmap" in pending:
            self.heatmap.refresh()
            pending.discard("heatmap")
        for key, view in (("time", self.time_plots), ("layers", self.layer_bars),
                          ("memory", self.memory_view)):
            if key in pending and (force or view is visible):
                view.refresh()
                pending.discard(key)
        if "markers" in pending:
            pending.discard("markers")
            pending.add("time")
        if "labels" in pending and (force or self._frames % LABEL_EVERY_FRAMES == 0):
            self.summary.setText(self._summary_text())
            n = self.model.layer_window
            self.summary.setToolTip((SUMMARY_TIP if self.live else TRACE_SUMMARY_TIP).format(
                n=n, r=max(self.model.rolling_rate_tokens(), 1)) + (
                "\n" + PREFETCH_TIP.format(n=n) if self.model.prefetching else "") + (
                "\n" + AUDIT_TIP if self.model.audits else ""))
            self.heatmap.update_title()
            pending.discard("labels")
        self._pending = pending

    def _summary_text(self) -> str:
        """Two lines: what the cache does now (follows every policy or budget change, and
        the latest token; in a reopened trace, what it did at the trace's end), then the
        numbers of the last tokens, named with their span and the policies that produced
        them."""
        m = self.model.model
        if m is None:
            return "No model loaded"
        if not m.cache_enabled:
            return f"{m.name}: expert cache off ({m.notice or 'dense model'})"
        t = self.model.time
        latest = self.model.latest
        now = [f"{'now' if self.live else 'end of the trace'}: {self.model.policy}",
               f"{self.model.slots_per_layer}/{m.n_expert} slots per layer "
               f"({self.model.slots_per_layer / m.n_expert:.1%} resident)"]
        if self.model.ram_slots_per_layer:
            now.append(f"RAM tier {self.model.ram_slots_per_layer}/{m.n_expert}")
        if latest is not None:
            now.append(f"token {latest.step}")
        if not t.count:
            return " · ".join(now)
        n = self.model.recent_tokens()
        policies = "/".join(self.model.recent_policies())
        recent = [f"last {n} token{'s' if n != 1 else ''} ({policies})"]
        hit = self.model.recent_mean("hit_rate")
        recent.append(f"hit {hit:.0%}" if hit == hit else "hit –")
        recent.append(f"mass/token {self.model.recent_mean('mass'):.3f}")
        if self.model.ram_slots_per_layer or self.model.recent_sum("disk_mb") > 0:
            recent.append(f"disk {self.model.tiers().disk_mb_per_token:.2f} MB/token")
        audit = self.model.audit_estimate()
        if audit is not None:
            recent.append(audit_text(audit, self.model.audits[-1].kl))
        prefetch = self.model.prefetch_summary()
        if prefetch is not None:
            recent.append(prefetch_text(prefetch))
        tok_s = t.last("tokens_per_s")
        if tok_s == tok_s:
            r = self.model.rolling_rate_tokens()
            recent.append(f"{tok_s:.1f} tok/s (last {r} token{'s' if r != 1 else ''})")
        if self.model.ttft_s is not None:
            ttft = f"TTFT {self.model.ttft_s * 1000:.0f} ms"
            now.append(f"latest answer's {ttft}" if self.live
                       else f"last answer in the trace: {ttft}")
        # always in this order (a short window had put the numbers first, so the lines
        # changed places as the window was resized); where the label is short, the
        # numbers keep their lines and the first line gives way (StatsLabel)
        return " · ".join(now) + "\n" + " · ".join(recent)

    def stop(self) -> None:
        self.timer.stop()
        self.memory_timer.stop()
