"""The *Get models* window: search the Hub, see each file's fit, download, open.

Every network step runs on a plain thread (:class:`_Job`) and reports back through Qt
signals, so the window never blocks on the Hub. What is computed comes from
:mod:`moescope.hub`; this module only lays it out and words failures as one line in the
window's status line.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QHideEvent, QKeyEvent, QKeySequence, QShowEvent
from PySide6.QtWidgets import (
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QProgressBar,
    QPushButton,
    QSplitter,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from moescope.cache.budget import format_bytes, parse_budget
from moescope.gui.widgets.screen_fit import resize_within_screen
from moescope.hub.download import (
    Progress,
    download_holder,
    download_model,
    is_downloaded,
    model_paths,
)
from moescope.hub.fit import remote_fit
from moescope.hub.remote import HubClient, RemoteModel, RepoHit
from moescope.model.ram_fit import DEFAULT_CONTEXT
from moescope.util import paths
from moescope.util.errors import MoEScopeError

log = logging.getLogger(__name__)

FIT_COLUMN = 3
LOCK_POLL_MS = 1000
"""How often the window looks whether another MoEScope downloads the chosen model."""


class _Job(QObject):
    """``fn(job)`` on a thread; ``done``/``failed`` on the GUI thread (queued signals)."""

    done = Signal(object)
    failed = Signal(str, str)
    """One line for the status, and the cause in the system's words (or "")."""
    progress = Signal(object)

    def __init__(self, fn: Callable[[_Job], Any]) -> None:
        super().__init__()  # no parent: it outlives a closed window until its thread ends
        self.fn = fn
        self.cancel = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True, name="moescope-hub")

    def start(self) -> _Job:
        self.thread.start()
        return self

    def _run(self) -> None:
        try:
            result = self.fn(self)
        except MoEScopeError as err:
            self.failed.emit(str(err), str(getattr(err, "detail", "")))
        except Exception as err:  # a bug, but the window must say something
            log.exception("Get models: unexpected error")
            self.failed.emit(f"unexpected error: {type(err).__name__}: {err}", "")
        else:
            self.done.emit(result)


class GetModelsWindow(QWidget):
    """Search box, results, the chosen repository's files with their fit at a budget,
    download with progress, speed and ETA, cancel, and Open."""

    openRequested = Signal(str, str)
    """(path of a downloaded model, VRAM budget the fit was shown for)."""

    def __init__(self, parent: QWidget | None = None, client: HubClient | None = None) -> None:
        super().__init__(parent, Qt.WindowType.Window)
        self.setWindowTitle("Get models")
        self.setAccessibleName("Get models")
        self.client = client or HubClient()
        self.models: list[RemoteModel] = []
        self._generation = 0  # results of an older search/listing are ignored
        self._jobs: set[_Job] = set()
        self.download_job: _Job | None = None
        self.downloading: RemoteModel | None = None  # what this window's download fetches

        self.search = QLineEdit()
        self.search.setPlaceholderText("Search GGUF models on the Hugging Face Hub "
                                       "(e.g. Qwen3 30B A3B)")
        self.search.setAccessibleName("Search the Hub")
        self.search.returnPressed.connect(self.run_search)
        self.search_button = QPushButton("&Search")
        self.search_button.clicked.connect(self.run_search)
        top = QHBoxLayout()
        top.addWidget(self.search, 1)
        top.addWidget(self.search_button)

        self.results = QListWidget()
        self.results.setAccessibleName("Repositories")
        self.results.currentItemChanged.connect(self._repo_chosen)

        self.files = QTreeWidget()
        self.files.setAccessibleName("Model files")
        self.files.setHeaderLabels(["File", "Quant", "Size", "Fit on this machine"])
        self.files.setRootIsDecorated(False)
        self.files.header().setSectionResizeMode(FIT_COLUMN, QHeaderView.ResizeMode.Stretch)
        self.files.currentItemChanged.connect(lambda *_: self._update_buttons())
        self.files.itemDoubleClicked.connect(lambda *_: self.open_selected())

        self.budget = QLineEdit("25%")
        self.budget.setAccessibleName("VRAM budget for the fit")
        self.budget.setToolTip("VRAM for expert slots: 12GiB, 25% of the experts, or slots")
        self.budget.setMaximumWidth(110)
        self.budget.returnPressed.connect(self.check_fits)
        self.fit_button = QPushButton("Check &fit")
        self.fit_button.clicked.connect(self.check_fits)
        self.download_button = QPushButton("&Download")
        self.download_button.clicked.connect(self.download_selected)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.cancel_download)
        self.open_button = QPushButton("&Open")
        self.open_button.clicked.connect(self.open_selected)
        actions = QHBoxLayout()
        budget_label = QLabel("VRAM &budget")
        budget_label.setBuddy(self.budget)
        for w in (budget_label, self.budget, self.fit_button):
            actions.addWidget(w)
        actions.addStretch(1)
        for w in (self.download_button, self.cancel_button, self.open_button):
            actions.addWidget(w)

        self.elsewhere = QLabel()
        """Says that another MoEScope downloads the chosen model (Download is off)."""
        self.elsewhere.setObjectName("hubElsewhere")
        self.elsewhere.setWordWrap(True)
        self.elsewhere.hide()
        # another MoEScope's download (a window, `moescope pull`) starts and ends on its
        # own: looked at while this window is shown, and whenever the choice changes
        self.lock_poll = QTimer(self)
        self.lock_poll.setInterval(LOCK_POLL_MS)
        self.lock_poll.timeout.connect(self._update_buttons)

        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setTextVisible(False)
        self.progress.hide()
        self.status = QLabel()
        self.status.setObjectName("hubStatus")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.folder = QLabel(f"Models folder: {paths.models_dir()}")
        self.folder.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        right = QWidget()
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.files, 1)
        rl.addWidget(self.elsewhere)
        rl.addLayout(actions)
        split = QSplitter(Qt.Orientation.Horizontal)
        split.addWidget(self.results)
        split.addWidget(right)
        split.setStretchFactor(1, 3)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(split, 1)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.folder)
        resize_within_screen(self, QSize(1100, 560))
        self._update_buttons()
        # closed from the keyboard as the trace window is: Ctrl+W (and the platform's
        # Close) always, Esc only while no download runs (closing cancels it)
        self.close_action = QAction("Close", self)
        keys = [*QKeySequence.keyBindings(QKeySequence.StandardKey.Close),
                QKeySequence("Ctrl+W")]
        self.close_action.setShortcuts(list({k.toString(): k for k in keys}.values()))
        self.close_action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
        self.close_action.triggered.connect(self.close)
        self.addAction(self.close_action)

    # ------------------------------------------------------------------ jobs
    def _start(self, fn: Callable[[_Job], Any], done: Callable[[Any], None],
               failed: Callable[[str, str], None] | None = None) -> _Job:
        job = _Job(fn)
        self._jobs.add(job)

        def finish(result: Any) -> None:
            self._jobs.discard(job)
            done(result)

        def fail(message: str, detail: str) -> None:
            self._jobs.discard(job)
            (failed or self.show_status)(message, detail)

        job.done.connect(finish)
        job.failed.connect(fail)
        return job.start()

    def busy(self) -> bool:
        """A search, listing, fit or download still running."""
        return bool(self._jobs)

    def show_status(self, text: str, detail: str = "") -> None:
        """``text`` in the status line; ``detail`` (a failure's cause in the system's
        words, e.g. "[Errno -2] Name or service not known") in its tooltip and the log."""
        self.status.setText(text)
        self.status.setToolTip(f"{text}\n\nCause: {detail}" if detail else "")
        if detail:
            log.warning("Get models: %s (%s)", text, detail)

    # ------------------------------------------------------------------ search
    def run_search(self) -> None:
        words = self.search.text().strip()
        if not words:
            self.show_status("Type a few words of a model's name.")
            return
        self._generation += 1
        gen = self._generation
        self.results.clear()
        self.files.clear()
        self.models = []
        self.show_status(f"Searching for {words!r}…")
        self._start(lambda _job: self.client.search(words),
                    lambda hits: self._show_hits(gen, words, hits))

    def _show_hits(self, gen: int, words: str, hits: list[RepoHit]) -> None:
        if gen != self._generation:
            return
        for h in hits:
            tags = " · ".join(t for t in ("MoE" if h.moe else None, h.architecture,
                                          "gated" if h.gated else None) if t)
            item = QListWidgetItem(f"{h.repo_id}\n{h.downloads:,} downloads"
                                   + (f" · {tags}" if tags else ""))
            item.setData(Qt.ItemDataRole.UserRole, h.repo_id)
            self.results.addItem(item)
        self.show_status(f"{len(hits)} repositories with GGUF files match {words!r}; "
                         f"choose one to see its files." if hits else
                         f"No GGUF repositories match {words!r}.")

    def _repo_chosen(self, item: QListWidgetItem | None, _old: object = None) -> None:
        if item is None:
            return
        repo = str(item.data(Qt.ItemDataRole.UserRole))
        self._generation += 1
        gen = self._generation
        self.files.clear()
        self.models = []
        self.show_status(f"Listing {repo}…")
        self._start(lambda _job: self.client.list_models(repo),
                    lambda models: self._show_models(gen, repo, models))

    def _show_models(self, gen: int, repo: str, models: list[RemoteModel]) -> None:
        if gen != self._generation:
            return
        self.models = models
        folder = paths.models_dir()
        for m in models:
            item = QTreeWidgetItem([m.name, m.quant or "", format_bytes(m.size),
                                    "downloaded" if is_downloaded(folder, m) else ""])
            item.setData(0, Qt.ItemDataRole.UserRole, m)
            self.files.addTopLevelItem(item)
        for col in range(FIT_COLUMN):
            self.files.resizeColumnToContents(col)
        if models:
            self.files.setCurrentItem(self.files.topLevelItem(0))
        self.show_status(f"{repo}: {len(models)} GGUF model(s); reading their headers "
                         f"for the fit…" if models else f"{repo} has no GGUF models.")
        self._update_buttons()
        if models:
            self.check_fits()

    # ------------------------------------------------------------------ fit
    def check_fits(self) -> None:
        """The fit of every listed file at the budget, each from its header (a few MB)."""
        budget = self.budget.text().strip() or "25%"
        try:
            parse_budget(budget)
        except MoEScopeError as err:
            self.show_status(str(err))
            return
        if not self.models:  # "Fit at … Choose a file" over an empty list (a failed search)
            self.show_status("No files to check yet: search the Hub and choose a "
                             "repository; the fit of each of its GGUF files shows here.")
            return
        gen = self._generation
        models = list(self.models)
        for i in range(self.files.topLevelItemCount()):
            self.files.topLevelItem(i).setText(FIT_COLUMN, "reading header…")

        def work(job: _Job) -> None:
            for index, m in enumerate(models):
                try:
                    fit = remote_fit(self.client, m, budget)
                    job.progress.emit((gen, index, fit.summary(), fit.fits))
                except MoEScopeError as err:
                    job.progress.emit((gen, index, f"✗ {err}", False))

        job = self._start(work, lambda _r: self._fits_done(gen, budget))
        job.progress.connect(self._fit_ready)

    def _fit_ready(self, report: tuple[int, int, str, bool]) -> None:
        gen, index, text, fits = report
        if gen != self._generation or index >= self.files.topLevelItemCount():
            return
        item = self.files.topLevelItem(index)
        item.setText(FIT_COLUMN, text)
        item.setToolTip(FIT_COLUMN, text)
        item.setData(FIT_COLUMN, Qt.ItemDataRole.UserRole, fits)

    def _fits_done(self, gen: int, budget: str) -> None:
        if gen == self._generation:
            self.show_status(f"Fit at a VRAM budget of {budget}, from each file's header "
                             f"alone. Choose a file and Download.")

    # ------------------------------------------------------------------ download
    def selected_model(self) -> RemoteModel | None:
        item = self.files.currentItem()
        return item.data(0, Qt.ItemDataRole.UserRole) if item is not None else None

    def _update_buttons(self) -> None:
        m = self.selected_model()
        folder = paths.models_dir()
        downloading = self.download_job is not None
        done = m is not None and is_downloaded(folder, m)
        holder = (download_holder(folder, m)
                  if m is not None and not done and m != self.downloading else None)
        self.download_button.setEnabled(m is not None and not downloading and not done
                                        and holder is None)
        self.cancel_button.setEnabled(downloading)
        self.open_button.setEnabled(done and not downloading)
        if m is not None and holder is not None:
            line = (f"{m.name} is being downloaded by {holder.who()}: Download is back "
                    f"if that download stops; Open, once it has finished.")
            self.elsewhere.setText(line)
            self.download_button.setToolTip(line)
        else:
            self.download_button.setToolTip("")
        self.elsewhere.setVisible(holder is not None)
        if done and m is not None:  # maybe by another MoEScope since it was listed
            item = self.files.currentItem()
            if not item.text(FIT_COLUMN).startswith("downloaded"):
                item.setText(FIT_COLUMN, f"downloaded · {item.text(FIT_COLUMN)}".rstrip(" ·"))

    def download_selected(self) -> None:
        m = self.selected_model()
        if m is None or self.download_job is not None:
            return
        folder = paths.models_dir()
        self.progress.setValue(0)
        self.progress.show()
        self.show_status(f"Downloading {m.name}…")
        self.downloading = m

        def work(job: _Job) -> str:
            return str(download_model(self.client, m, folder, cancel=job.cancel,
                                      on_progress=job.progress.emit))

        self.download_job = self._start(work, lambda path: self._downloaded(m, path),
                                        self._download_failed)
        self.download_job.progress.connect(self._download_progress)
        self._update_buttons()

    def _download_progress(self, p: Progress) -> None:
        self.progress.setValue(int(p.fraction * 1000))
        self.show_status(f"{p.file}: {p.line()}")

    def _downloaded(self, m: RemoteModel, path: str) -> None:
        self.download_job = None
        self.downloading = None
        self.progress.hide()
        for i in range(self.files.topLevelItemCount()):
            item = self.files.topLevelItem(i)
            if item.data(0, Qt.ItemDataRole.UserRole) == m:
                item.setText(FIT_COLUMN, f"downloaded · {item.text(FIT_COLUMN)}")
        self.show_status(f"Saved {m.name} ({format_bytes(m.size)}, sha256 checked): {path}. "
                         f"Open loads it.")
        self._update_buttons()

    def _download_failed(self, message: str, detail: str = "") -> None:
        self.download_job = None
        self.downloading = None
        self.progress.hide()
        self.show_status(message, detail)
        self._update_buttons()

    def cancel_download(self) -> None:
        if self.download_job is not None:
            self.download_job.cancel.set()
            self.show_status("Cancelling…")

    def open_selected(self) -> None:
        """One click: load the downloaded file at the budget its fit was shown for."""
        m = self.selected_model()
        if m is None or not is_downloaded(paths.models_dir(), m):
            return
        self.openRequested.emit(str(model_paths(paths.models_dir(), m)[0]),
                                self.budget.text().strip() or "25%")

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() == Qt.Key.Key_Escape and self.download_job is None:
            self.close()
            return
        super().keyPressEvent(event)

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.lock_poll.start()
        self._update_buttons()

    def hideEvent(self, event: QHideEvent) -> None:
        self.lock_poll.stop()
        super().hideEvent(event)

    def closeEvent(self, event: QCloseEvent) -> None:
        """Closing cancels a download (its partial file stays for resuming)."""
        if self.download_job is not None:
            self.download_job.cancel.set()
        super().closeEvent(event)


def show_get_models(main: Any) -> GetModelsWindow:
    """The main window's *Get models* window (one per main window), shown and raised;
    its Open loads through ``main.load_model``."""
    window: GetModelsWindow | None = getattr(main, "get_models_window", None)
    if window is None:
        window = GetModelsWindow(main)
        # the fit at the budget last used (the window's), not always 25%
        window.budget.setText(str(main.default_budget()))
        window.openRequested.connect(lambda path, budget: _open(main, path, budget))
        main.get_models_window = window
    window.show()
    window.raise_()
    window.activateWindow()
    window.search.setFocus()
    return window


def _open(main: Any, path: str, budget: str) -> None:
    from moescope.gui.worker import LoadRequest

    main.load_model(LoadRequest(
        path=path, budget=budget,
        policy=str(main.model_setting(path, "policy", "quality-first")),
        n_ctx=int(main.model_setting(path, "n_ctx", DEFAULT_CONTEXT))))
