"""The connection dialog: the daemon's URL and a token, found by themselves when they can be.

``locate`` finds them as the online CLI does: ``--url`` / ``$JOBCONTROL_URL``,
else the URL file of the local daemon of ``--db`` / ``$JOBCONTROL_DB``; the
token from ``--token`` / ``$JOBCONTROL_TOKEN``, else the token file the daemon
wrote on first start. **Connect** checks both with ``GET /status`` on a worker
thread; a refusal or an unreachable daemon is shown in the dialog, which stays
open.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from jobcontrol.client.locate import locate
from jobcontrol.errors import JobControlError
from jobcontrol_admin.session import Session


@dataclass
class Found:
    url: str | None
    url_source: str
    token: str | None
    token_source: str


def find(
    url: str | None = None,
    token: str | None = None,
    db: str | None = None,
    state_dir: Path | None = None,
) -> Found:
    try:
        target, found_token = locate(url, token, db, state_dir)
    except JobControlError as exc:  # an unreadable token file
        return Found(url, "--url" if url else "not found", None, str(exc))
    return Found(
        target.url if target else None,
        target.source if target else "no local daemon is running; enter its URL",
        found_token.value,
        found_token.source,
    )


class ConnectionDialog(QDialog):
    """Asks for a URL and a token; ``session`` is the checked connection once accepted."""

    def __init__(self, found: Found, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("jc-connect")
        self.setWindowTitle("Connect to a Job Control daemon")
        self.session: Session | None = None
        self._trying: Session | None = None
        self.daemon_status: dict[str, Any] = {}

        self.url = QLineEdit(found.url or "")
        self.url.setObjectName("url")
        self.url.setPlaceholderText("http://127.0.0.1:8640")
        self.token = QLineEdit(found.token or "")
        self.token.setObjectName("token")
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        self.token.setPlaceholderText("jc_…")
        show = QCheckBox("Show token")
        show.toggled.connect(
            lambda on: self.token.setEchoMode(
                QLineEdit.EchoMode.Normal if on else QLineEdit.EchoMode.Password
            )
        )
        self.message = QLabel()
        self.message.setObjectName("message")
        self.message.setWordWrap(True)
        self.message.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)

        form = QFormLayout()
        form.addRow("Daemon URL", self.url)
        form.addRow("", _hint(f"found: {found.url_source}" if found.url else found.url_source))
        form.addRow("Token", self.token)
        form.addRow("", _hint(f"from {found.token_source}" if found.token else found.token_source))
        form.addRow("", show)
        self.buttons = QDialogButtonBox(
            QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel
        )
        self.connect_button = self.buttons.button(QDialogButtonBox.StandardButton.Ok)
        self.connect_button.setText("&Connect")
        self.buttons.accepted.connect(self.try_connect)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.message)
        layout.addWidget(self.buttons)
        self.resize(520, 220)

    def try_connect(self) -> None:
        url, token = self.url.text().strip(), self.token.text().strip()
        if not url:
            self.message.setText("Enter the daemon's URL (jobcontrol daemon status prints it).")
            return
        if "://" not in url:  # host:port as typed: the daemon speaks http unless told https
            url = f"http://{url}"
            self.url.setText(url)
        if self._trying is not None:
            return
        self.message.setText(f"Connecting to {url}…")
        self.connect_button.setEnabled(False)
        self._trying = Session(url, token or None)
        self._trying.read("Connect", lambda client: client.status(), self._connected, self._failed)

    def _connected(self, status: dict[str, Any]) -> None:
        self.session, self._trying = self._trying, None
        self.daemon_status = status
        self.connect_button.setEnabled(True)
        super().accept()

    def _failed(self, exc: Exception) -> None:
        trying, self._trying = self._trying, None
        if trying is not None:
            trying.close()
        self.connect_button.setEnabled(True)
        self.message.setText(f"Cannot connect: {exc}")

    def done(self, result: int) -> None:
        if result != QDialog.DialogCode.Accepted and self._trying is not None:
            self._trying.close()
            self._trying = None
        super().done(result)


def _hint(text: str) -> QLabel:
    label = QLabel(text)
    label.setWordWrap(True)
    label.setStyleSheet("color: gray")
    return label
