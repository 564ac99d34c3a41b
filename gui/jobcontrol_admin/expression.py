"""The expression editor of a job's timer or command (spec 10.3).

Titled ``<name> Edit Timer`` (or ``Edit Command``), 500×285: a read-only text
area captioned "Expression Editor" that **Edit** makes editable, a "Status"
line, **OK** and **Cancel**. OK with the text unchanged just closes; otherwise
it sends the change (with the version the editor opened with) and closes when
the daemon accepts it. A refusal (an invalid schedule with its position, a
command the shell rejects, someone else's change) is shown in Status and the
window stays open with the text as typed. After someone else's change, Status
says what the daemon has now, and OK again saves the text over it (Cancel keeps
theirs); a job deleted meanwhile is said, and OK can no longer save.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtGui import QFont, QFontDatabase
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from jobcontrol.client import ApiError
from jobcontrol_admin.session import Session

LABELS = {"timer": "Timer", "command": "Command"}


class ExpressionEditor(QDialog):
    def __init__(
        self,
        session: Session,
        view: dict[str, Any],
        field: str,
        parent: QWidget | None = None,
        *,
        refused: str | None = None,
    ) -> None:
        """``refused``: why the token's role may not change it; the editor only shows."""
        super().__init__(parent)
        if field not in LABELS:
            raise ValueError(f"no expression editor for field {field!r}")
        self.setObjectName("jc-expression-editor")
        self.session = session
        self.job_id = int(view["id"])
        self.version = view.get("version")
        self.field = field
        self.original = view.get(field) or ""
        self.sending = False
        self.gone = False  # the job was deleted on the daemon
        self.latest: dict[str, Any] | None = view  # the job's view as last heard of
        self.setWindowTitle(f"{view['name']} Edit {LABELS[field]}")
        self.resize(500, 285)

        self.text = QPlainTextEdit(self.original)
        self.text.setObjectName("expression")
        self.text.setReadOnly(True)
        mono: QFont = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        self.text.setFont(mono)
        self.status = QLineEdit()
        self.status.setObjectName("status")
        self.status.setReadOnly(True)
        buttons = QDialogButtonBox()
        self.edit_button = QPushButton("&Edit")
        self.ok_button = buttons.addButton(QDialogButtonBox.StandardButton.Ok)
        self.cancel_button = buttons.addButton(QDialogButtonBox.StandardButton.Cancel)
        buttons.addButton(self.edit_button, QDialogButtonBox.ButtonRole.ActionRole)
        self.edit_button.clicked.connect(self.start_editing)
        self.ok_button.clicked.connect(self.accept)
        self.cancel_button.clicked.connect(self.reject)

        if refused is not None:  # a viewer reads the expression; nothing to edit nor save
            self.edit_button.setEnabled(False)
            self.edit_button.setToolTip(refused)
            self.ok_button.setEnabled(False)
            self.status.setText(refused)

        layout = QVBoxLayout(self)
        layout.addWidget(QLabel("Expression Editor"))
        layout.addWidget(self.text, 1)
        layout.addWidget(QLabel("Status"))
        layout.addWidget(self.status)
        layout.addWidget(buttons)

    def start_editing(self) -> None:
        self.text.setReadOnly(False)
        self.text.setFocus()

    def accept(self) -> None:
        text = self.text.toPlainText()
        if text == self.original:
            super().accept()
            return
        if self.sending or self.gone:
            return
        value: str | None = text if text.strip() else None
        if self.field == "command" and value is None:
            self.status.setText("a task needs a command")
            return
        change = {"job": self.job_id, "version": self.version, "fields": {self.field: value}}
        self.sending = True
        self.ok_button.setEnabled(False)
        self.status.setText("saving…")
        self.session.act(
            f"Edit {LABELS[self.field]}",
            lambda client: client.modify([change]),
            done=self._saved,
            failed=self._refused,
        )

    def _saved(self, _result: object) -> None:
        self.sending = False
        self.status.setText("saved")
        super().accept()

    def _refused(self, exc: Exception) -> None:
        self.sending = False
        self.ok_button.setEnabled(not self.gone)
        text = str(exc)
        if (
            isinstance(exc, ApiError)
            and exc.status == 409
            and exc.body.get("error") == "ConflictError"
            and self.latest is not None
        ):
            # Someone else's change: the next OK is over what the daemon has now.
            self.version = self.latest.get("version")
            now = self.latest.get(self.field) or ""
            text = (
                f"{text}; the daemon's {self.field} is now {now!r}: "
                "OK saves your text over it, Cancel keeps it"
            )
        self._say(text)

    def job_changed(self, view: dict[str, Any] | None) -> None:
        """The job as the daemon has it now (None: deleted), from the window's tree."""
        if view is None:
            if not self.gone:
                self.gone = True
                self.ok_button.setEnabled(False)
                self.edit_button.setEnabled(False)
                self._say("the job was deleted on the daemon: nothing to save")
            return
        self.latest = view

    def _say(self, text: str) -> None:
        self.status.setText(text)
        self.status.setCursorPosition(0)
        self.status.setToolTip(text)
