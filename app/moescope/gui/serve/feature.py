"""Serving the window's model over the OpenAI API, and watching what that does.

The server (``moescope.server``) runs on its own threads and generates on the window's
engine through the same turn queue as the window's chat (``EngineWorker.turns``): one
answer at a time, the chat waiting while a request generates (the status bar says so).
Each token the server decodes goes through the worker's :meth:`EngineWorker.follow`, as
the chat's do, so the cache panel and the session trace see every token, whoever asked.

The one part of the window that reaches past ``EngineClient`` to the worker: the server
is a second front end on the worker's engine, generating on its own threads, so it needs
the engine, the turn queue and the worker's per-token bookkeeping (step counter, change
cursor, recording), each used only while the server holds the engine's turn.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QEvent, QObject, Signal, Slot

from moescope.gui.serve.panel import ServePanel
from moescope.server.params import Limits
from moescope.server.service import Job, RequestRecord, Service
from moescope.session.snapshots import TokenSnapshot
from moescope.session.turns import EngineQueue
from moescope.util.errors import MoEScopeError

if TYPE_CHECKING:
    from moescope.server.run import ServerThread

log = logging.getLogger("moescope.gui.serve")

EMIT_INTERVAL_S = 0.015
"""Coalesce the server's token snapshots as the worker does its own."""
QUEUE_CAPACITY = 8


class _Bridge(QObject):
    """The server's listener (decode thread) turned into queued signals (GUI thread)."""

    tokens = Signal(object)  # list[TokenSnapshot]
    started = Signal(str, int)  # client, step of its first token
    finished = Signal(object)  # RequestRecord
    logLine = Signal(str)
    queueChanged = Signal()

    def __init__(self, worker: Any) -> None:
        super().__init__()
        self.worker = worker
        self._batch: list[TokenSnapshot] = []
        self._last_emit = 0.0

    def request_started(self, job: Job) -> None:
        self.started.emit(job.client, self.worker.step + 1)

    def token(self, stats: Any, job: Job) -> None:
        self._batch.append(self.worker.follow(stats))
        now = time.perf_counter()
        if now - self._last_emit >= EMIT_INTERVAL_S:
            self.tokens.emit(self._batch)
            self._batch, self._last_emit = [], now

    def cache_applied(self, changes: list[Any]) -> None:
        # the window's controls follow now, as after a change of its own while idle
        self.worker.report_applied(changes)

    def request_finished(self, record: RequestRecord) -> None:
        end = self.worker.follow_end()
        if end is not None:
            self._batch.append(end)
        if self._batch:
            self.tokens.emit(self._batch)
            self._batch = []
        self.finished.emit(record)


class ServeFeature(QObject):
    """Start and stop serving the window's model; the panel shows URL, state and log."""

    servingChanged = Signal(bool)
    requestFinished = Signal(object)  # RequestRecord (GUI thread)

    def __init__(self, window: Any) -> None:
        super().__init__(window)
        self.window = window
        self.worker = window.client.worker
        self.queue = EngineQueue(QUEUE_CAPACITY)
        self.worker.turns = self.queue
        self.bridge = _Bridge(self.worker)
        self.queue.on_change = self.bridge.queueChanged.emit
        self.service: Service | None = None
        self.server: ServerThread | None = None
        self.records: list[RequestRecord] = []
        self._address: tuple[str, int, str | None] | None = None
        self.panel: ServePanel | None = None
        self.bridge.tokens.connect(self._on_tokens)
        self.bridge.started.connect(self._on_started)
        self.bridge.finished.connect(self._on_finished)
        self.bridge.logLine.connect(self._on_log)
        self.bridge.queueChanged.connect(self._on_queue)
        window.modelLoaded.connect(self._on_model_loaded)
        window.installEventFilter(self)

    # ------------------------------------------------------------------ actions
    def show_panel(self) -> None:
        """The *Serve API* action: the panel (non-modal) with its start button."""
        if self.panel is None:
            self.panel = ServePanel(self, self.window)
        self.panel.refresh()
        self.panel.show()
        self.panel.raise_()

    @property
    def serving(self) -> bool:
        return self.server is not None and self.server.running

    @property
    def url(self) -> str:
        return self.server.url if self.server is not None else ""

    def start(self, host: str = "127.0.0.1", port: int = 8080,
              api_key: str | None = None) -> str:
        """Serve the loaded model; returns the base URL. Raises ``MoEScopeError`` with
        the reason (no model, a busy port, another machine's address without a key)."""
        from moescope.server.run import (  # HTTP stack
            ExposureRefused,
            ServerThread,
            check_api_key,
            check_exposure,
            host_resolves,
            port_free,
        )

        if self.serving:
            return self.url
        engine = self.worker.engine
        if engine.model is None or self.window.loading:
            raise MoEScopeError("load a model first: the server serves the window's model")
        if not host_resolves(host):  # else named below as reachable from other machines
            raise MoEScopeError(f"{host} is not an address of this machine: keep 127.0.0.1 "
                                f"(this machine only), or give one of its addresses "
                                f"(0.0.0.0: all of them) with an API key")
        if api_key:  # as `serve --api-key`: a key no client could send serves nobody
            check_api_key("The API key", api_key)
        try:
            check_exposure(host, api_key or None, insecure=False)
        except ExposureRefused as refused:  # in the panel's words, not the CLI's flags
            raise MoEScopeError(f"{refused.host} lets other machines reach the model: type "
                                f"an API key to serve it beyond this machine, or keep the "
                                f"address 127.0.0.1 (this machine only)") from None
        if not port_free(host, port):
            raise MoEScopeError(f"cannot listen on {host}:{port}: the port is in use or the "
                                "address is not this machine's")
        self.service = Service(engine, self.queue, limits=Limits(),
                               log=self.bridge.logLine.emit)
        self.service.listeners.append(self.bridge)
        self.server = ServerThread(self.service, host, port, api_key or None)
        try:
            self.server.start()
        except MoEScopeError:
            self.server = self.service = None
            raise
        self._address = (host, port, api_key or None)
        log.info("serving %s at %s", self.service.model_id, self.server.url)
        self.servingChanged.emit(True)
        self._status()
        return self.server.url

    def stop(self) -> None:
        """Stop serving: a running answer stops after its current token."""
        server, self.server = self.server, None
        if server is None:
            return
        if self.queue.running is not None and self.queue.running.who != "window":
            self.worker.engine.stop()
        server.stop()
        deadline = time.monotonic() + 10
        while self.queue.running is not None and self.queue.running.who != "window" \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        self.service = None
        log.info("stopped serving")
        self.servingChanged.emit(False)
        self._status()

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        """The window is closing: stop serving before its engine is freed."""
        if watched is self.window and event.type() == QEvent.Type.Close:
            self.stop()
            self._address = None
        return False

    # ------------------------------------------------------------------ traffic
    @Slot(object)
    def _on_tokens(self, snaps: list[TokenSnapshot]) -> None:
        # the window's own token handler: panel, recent tokens, applied policy/budget
        self.window._on_tokens(snaps)

    @Slot(str, int)
    def _on_started(self, client: str, step: int) -> None:
        self.window.cache_panel.add_marker(step, "API")
        self._status(f"generating for {client}")

    @Slot(object)
    def _on_finished(self, record: RequestRecord) -> None:
        self.records.append(record)
        del self.records[:-1000]
        self.requestFinished.emit(record)
        self._status()

    @Slot(str)
    def _on_log(self, line: str) -> None:
        log.info("API %s", line)
        if self.panel is not None:
            self.panel.add_log(line)

    @Slot()
    def _on_queue(self) -> None:
        self._status()

    @Slot(object)
    def _on_model_loaded(self, _summary: Any) -> None:
        """A new model: serve it in the old one's place, at the same address."""
        if self._address is not None and self.server is not None:
            host, port, key = self._address
            self.stop()
            try:
                self.start(host, port, key)
            except MoEScopeError as err:
                self._on_log(f"stopped serving: {err}")

    def _status(self, doing: str = "") -> None:
        running = self.queue.running
        waiting = self.queue.waiting()
        window_waits = any(t.who == "window" for t in waiting)
        if not self.serving:
            text = "Not serving"
        else:
            busy = doing or (f"generating for {running.who}" if running is not None
                             and running.who != "window" else "idle")
            others = sum(1 for t in waiting if t.who != "window")
            text = f"Serving {self.url} · {busy}" + (f" · {others} waiting" if others else "")
        if window_waits:
            text += " · your message waits for the API request to finish"
            self.window.statusBar().showMessage(
                "Waiting for a request of the API server to finish…", 5000)
        if self.panel is not None:
            self.panel.set_status(text)
