"""The *Serve API* panel: address, key, start/stop, the URL to paste, the request log."""

from __future__ import annotations

from typing import TYPE_CHECKING

from PySide6.QtWidgets import (
    QDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from moescope.util.errors import MoEScopeError

if TYPE_CHECKING:
    from moescope.gui.serve.feature import ServeFeature

LOG_LINES = 1000
MAX_HOST = 255
"""The longest address kept in the settings (a DNS name's limit)."""


class ServePanel(QDialog):
    """Non-modal: it stays open beside the window while clients talk to the model."""

    def __init__(self, feature: ServeFeature, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.feature = feature
        self.setWindowTitle("Serve API")
        self.setModal(False)
        self.host = QLineEdit("127.0.0.1")
        self.host.setAccessibleName("Address to listen on")
        self.host.setToolTip("127.0.0.1: this machine only. Any other address needs an "
                             "API key.")
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(8080)
        self.port.setAccessibleName("Port")
        self.key = QLineEdit()
        self.key.setEchoMode(QLineEdit.EchoMode.Password)
        self.key.setPlaceholderText("none (this machine only)")
        self.key.setAccessibleName("API key")
        self.button = QPushButton("&Start serving")
        self.button.clicked.connect(self._toggle)
        self.url = QLabel()
        self.url.setTextInteractionFlags(self.url.textInteractionFlags()
                                         | self.url.textInteractionFlags().TextSelectableByMouse)
        self.status = QLabel("Not serving")
        self.status.setWordWrap(True)
        self.error = QLabel()
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #d9534f")
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(LOG_LINES)
        self.log.setAccessibleName("Server log")
        self.log.setPlaceholderText("One line per request: client, tokens in and out, "
                                    "tok/s, hit rate, substituted mass, policy")
        form = QFormLayout()
        form.addRow("&Address", self.host)
        form.addRow("&Port", self.port)
        form.addRow("API &key", self.key)
        row = QHBoxLayout()
        row.addWidget(self.button)
        row.addWidget(self.url, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addLayout(row)
        layout.addWidget(self.status)
        layout.addWidget(self.error)
        layout.addWidget(self.log, 1)
        self.resize(640, 420)
        feature.servingChanged.connect(lambda _on: self.refresh())
        self._restore()

    def _restore(self) -> None:
        """The address and port the server last started on (the key is not kept: a
        secret in a settings file is no secret), each checked before it is shown."""
        settings = self.feature.window.settings
        host = settings.value("serve/host", "", type=str)
        if isinstance(host, str) and 0 < len(host) <= MAX_HOST and host.isprintable() \
                and " " not in host:
            self.host.setText(host)
        try:
            port = int(settings.value("serve/port", 0))
        except (TypeError, ValueError):
            port = 0
        if 1 <= port <= 65535:
            self.port.setValue(port)

    def refresh(self) -> None:
        serving = self.feature.serving
        self.button.setText("&Stop serving" if serving else "&Start serving")
        for w in (self.host, self.port, self.key):
            w.setEnabled(not serving)
        self.url.setText(self.feature.url if serving else "")

    def set_status(self, text: str) -> None:
        self.status.setText(text)

    def add_log(self, line: str) -> None:
        self.log.appendPlainText(line)

    def _toggle(self) -> None:
        self.error.clear()
        if self.feature.serving:
            self.feature.stop()
            return
        host = self.host.text().strip()
        try:
            self.feature.start(host, self.port.value(), self.key.text().strip() or None)
        except MoEScopeError as err:
            self.error.setText(str(err))
        else:  # started: offered again next time
            settings = self.feature.window.settings
            settings.setValue("serve/host", host)
            settings.setValue("serve/port", self.port.value())
        self.refresh()
