"""The properties panel: one job's fields in a form, edits kept pending until Apply.

An edit sends nothing: it becomes a pending change of the job shown, with the
version the panel showed, and pending changes of several jobs accumulate
(their rows are shown in italics). **Apply** sends them all as one batch,
all or nothing; a job someone else changed meanwhile is refused (409) and the
changes stay, with the conflict named in the panel until the operator reverts
them or reloads that job from the daemon.
"""

from __future__ import annotations

import builtins
import functools
import re
import zoneinfo
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QObject, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
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

from jobcontrol.client import ApiError
from jobcontrol.definitions.durations import format_duration, parse_duration
from jobcontrol_admin.formats import format_time, parse_time
from jobcontrol_admin.model import JobTreeModel
from jobcontrol_admin.session import Session

PENDING_STYLE = "background-color: #fff3b0;"
ERROR_STYLE = "color: #b00020;"
# The schedule language's zone suffix: ``tz=Area/City`` (last, after a space).
_ZONE = re.compile(r"(?<!\S)tz\s*=\s*(\S*)", re.IGNORECASE)


@functools.cache
def time_zones() -> list[str]:
    """The zone names the time-zone combo offers, sorted."""
    return sorted(zoneinfo.available_timezones())


def timer_zone(timer: str) -> str:
    """The zone of a timer's ``tz=`` suffix ("" when it has none)."""
    match = _ZONE.search(timer)
    return match.group(1) if match else ""


def with_zone(timer: str, zone: str) -> str:
    """``timer`` with its ``tz=`` suffix set to ``zone`` (removed when ``zone`` is empty)."""
    match = _ZONE.search(timer)
    head, tail = (timer, "") if match is None else (timer[: match.start()], timer[match.end() :])
    zone = zone.strip()
    return " ".join(
        part for part in (head.strip(), f"tz={zone}" if zone else "", tail.strip()) if part
    )


# ---------------------------------------------------------------- pending changes


@dataclass
class _JobEdit:
    version: int
    name: str = ""
    fields: dict[str, Any] = field(default_factory=dict)
    originals: dict[str, Any] = field(default_factory=dict)


class PendingChanges(QObject):
    """Field changes per job not sent yet, each job with the version the user saw."""

    changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._jobs: dict[int, _JobEdit] = {}

    def set(
        self, job_id: int, version: int, key: str, value: Any, *, original: Any, name: str = ""
    ) -> None:
        """Record ``key = value`` (``original``: the stored value); back to the original drops it.

        The version and original kept are those of the first edit of the job (of the field);
        ``name`` is the job's, to name it when its changes are dropped.
        """
        edit = self._jobs.get(job_id)
        if edit is None:
            if value == original:
                return
            edit = self._jobs[job_id] = _JobEdit(version, name)
        original = edit.originals.setdefault(key, original)
        if value == original:
            edit.fields.pop(key, None)
            edit.originals.pop(key, None)
            if not edit.fields:
                del self._jobs[job_id]
        else:
            edit.fields[key] = value
        self.changed.emit()

    def drop(self, job_id: int | None = None) -> None:
        """Forget the changes of one job, or of all."""
        if job_id is None:
            if not self._jobs:
                return
            self._jobs.clear()
        elif self._jobs.pop(job_id, None) is None:
            return
        self.changed.emit()

    def forget_gone(self, present: Container[int]) -> list[str]:
        """Drop the changes of jobs not ``present`` (deleted on the daemon); their names."""
        gone = [job_id for job_id in self._jobs if job_id not in present]
        names = [self._jobs.pop(job_id).name or f"#{job_id}" for job_id in gone]
        if gone:
            self.changed.emit()
        return names

    def rebase(self, seen: Mapping[int, Any], now: Mapping[int, Any]) -> list[int]:
        """This client's own change (a rename, a move, an activation) took jobs from the
        versions ``seen`` to those ``now``: pending changes made at the version seen count
        from the new one when that change was the only one (one step). A job changed by
        others meanwhile stays a conflict. The jobs rebased."""
        moved = []
        for job_id, before in seen.items():
            edit = self._jobs.get(job_id)
            after = now.get(job_id)
            if edit is None or before is None or after is None:
                continue
            if edit.version == int(before) and int(after) == int(before) + 1:
                edit.version = int(after)
                moved.append(job_id)
        return moved

    def fields(self, job_id: int) -> dict[str, Any]:
        """The job's pending fields and their new values."""
        edit = self._jobs.get(job_id)
        return dict(edit.fields) if edit is not None else {}

    def batch(self) -> list[dict[str, Any]]:
        """Every pending change, in the shape ``Client.modify`` takes."""
        return [
            {"job": job_id, "version": edit.version, "fields": dict(edit.fields)}
            for job_id, edit in self._jobs.items()
        ]

    def jobs(self) -> builtins.set[int]:  # builtins: ``set`` here is the method
        return set(self._jobs)

    def count(self) -> int:
        """How many fields are pending, over all jobs."""
        return sum(len(edit.fields) for edit in self._jobs.values())


def pending_text(count: int, jobs: int) -> str:
    """``3 pending changes in 2 jobs``."""
    if not count:
        return "No pending changes"
    changes = "change" if count == 1 else "changes"
    return f"{count} pending {changes} in {jobs} job{'' if jobs == 1 else 's'}"


# ---------------------------------------------------------------- the form's editors


@dataclass
class _Editor:
    """One field's widget: how to read the API value from it and write one into it."""

    widget: QWidget
    read: Callable[[], Any]
    write: Callable[[Any], None]


def _text_or_none(text: str) -> str | None:
    return text if text.strip() else None


def _timeout_value(text: str) -> float | str | None:
    """Seconds when the text reads as a duration; else the text, for the daemon to refuse."""
    if not text.strip():
        return None
    try:
        return parse_duration(text)
    except ValueError:
        return text.strip()


def _env_value(text: str) -> dict[str, str]:
    """``NAME=value`` lines as a mapping; a line without ``=`` is refused (ValueError),
    not taken as a variable set to nothing."""
    env: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip():
            name, equals, value = line.partition("=")
            if not equals:
                raise ValueError(
                    f"line {number} ({line.strip()[:40]!r}) has no '=': write NAME=value, "
                    "one a line"
                )
            env[name.strip()] = value
    return env


def _env_text(env: Any) -> str:
    return "\n".join(f"{k}={v}" for k, v in (env or {}).items())


def _line(optional: bool = False) -> _Editor:
    edit = QLineEdit()
    return _Editor(
        edit,
        (lambda: _text_or_none(edit.text())) if optional else edit.text,
        lambda v: edit.setText("" if v is None else str(v)),
    )


def _lines(lines: int = 3) -> _Editor:
    edit = QPlainTextEdit()
    edit.setFixedHeight(edit.fontMetrics().lineSpacing() * lines + 12)
    return _Editor(
        edit,
        lambda: _text_or_none(edit.toPlainText()),
        lambda v: edit.setPlainText(v or ""),
    )


def _choice(values: tuple[str, ...]) -> _Editor:
    combo = QComboBox()
    combo.addItems(list(values))

    def write(value: Any) -> None:
        combo.setCurrentIndex(combo.findText(str(value)) if value is not None else -1)

    return _Editor(combo, lambda: combo.currentText() or None, write)


def _check() -> _Editor:
    box = QCheckBox()
    return _Editor(box, box.isChecked, lambda v: box.setChecked(bool(v)))


def _spin(low: int, high: int, special: str = "") -> _Editor:
    """A whole number; with ``special``, the lowest value shows it and means None."""
    spin = QSpinBox()
    spin.setRange(low - 1 if special else low, high)
    spin.setSpecialValueText(special)

    def read() -> int | None:
        value = spin.value()
        return None if special and value == spin.minimum() else value

    def write(value: Any) -> None:
        spin.setValue(spin.minimum() if value is None else int(value))

    return _Editor(spin, read, write)


def _timeout() -> _Editor:
    edit = QLineEdit()
    edit.setPlaceholderText("none (90s, 5m, 1h30m or seconds)")
    return _Editor(
        edit,
        lambda: _timeout_value(edit.text()),
        lambda v: edit.setText(format_duration(float(v)) if isinstance(v, int | float) else ""),
    )


def _env() -> _Editor:
    edit = QPlainTextEdit()
    edit.setPlaceholderText("NAME=value, one a line")
    edit.setFixedHeight(edit.fontMetrics().lineSpacing() * 4 + 12)
    return _Editor(
        edit, lambda: _env_value(edit.toPlainText()), lambda v: edit.setPlainText(_env_text(v))
    )


# (key, label) of the editable fields, in the form's order; "tz" is placed after "timer".
FIELDS: tuple[tuple[str, str], ...] = (
    ("name", "Name"),
    ("description", "Description"),
    ("command", "Command"),
    ("timer", "Timer"),
    ("active", "Active"),
    ("on_error", "On error"),
    ("box_type", "Box type"),
    ("queue", "Queue"),
    ("priority", "Priority"),
    ("timeout", "Timeout"),
    ("max_log_files", "Max log files"),
    ("retries", "Retries"),
    ("misfire", "Misfire"),
    ("cwd", "Working directory"),
    ("env", "Environment"),
)


class PropertiesPanel(QWidget):
    """Every field of one job; edits are pending until Apply sends them as one batch."""

    def __init__(
        self, session: Session, model: JobTreeModel, parent: QWidget | None = None
    ) -> None:
        super().__init__(parent)
        self.session = session
        self.model = model
        self.pending = PendingChanges(self)
        self.job_id: int | None = None
        self.detail: dict[str, Any] | None = None  # the stored fields the form shows
        self.conflicts: set[int] = set()  # jobs whose pending changes the daemon refused as stale
        # Fields of the shown job whose text cannot be read (a line of env without "="),
        # with why: nothing is applied while there are any.
        self.invalid: dict[str, str] = {}
        self.applying = False
        self.fetching = False
        self._request = 0  # the number of the latest fetch; older answers are stale
        self._loading = False  # the form is being filled: its change signals are no edits
        self._zoning = False  # the zone combo is rewriting the timer: leave the combo alone
        self._closed = False
        self._read_failed = False  # the message is a failed read (a later read clears it)
        self.refused: str | None = None  # why the token's role may not modify jobs, if so

        self.editors: dict[str, _Editor] = {
            "name": _line(),
            "description": _lines(),
            "command": _lines(4),
            "timer": _line(optional=True),
            "active": _check(),
            "on_error": _choice(("abort", "continue")),
            "box_type": _choice(("sequence", "timed")),
            "queue": _line(),
            "priority": _spin(-1_000_000, 1_000_000),
            "timeout": _timeout(),
            "max_log_files": _spin(1, 100_000, special="default"),
            "retries": _spin(0, 100),
            "misfire": _choice(("run-once", "skip")),
            "cwd": _line(optional=True),
            "env": _env(),
        }
        self.zone = QComboBox()
        self.zone.setEditable(True)
        # Not as wide as the longest zone name: the form fits the dock without scrolling.
        self.zone.setSizeAdjustPolicy(
            QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon
        )
        self.zone.setMinimumContentsLength(14)
        self.zone.addItems(["", *time_zones()])
        self.zone.setPlaceholderText("the daemon's zone")
        line = self.zone.lineEdit()
        if line is not None:
            line.setPlaceholderText("the daemon's zone")
        self.kind = QLabel()
        self.last_updated = QLabel()
        self.updated_by = QLabel()
        self.version = QLabel()

        self.title = QLabel("No job selected")
        font = self.title.font()
        font.setBold(True)
        self.title.setFont(font)
        self.form = QWidget()
        form = QFormLayout(self.form)
        self.labels: dict[str, QLabel] = {}
        for key, text in FIELDS:
            self.labels[key] = QLabel(text)
            form.addRow(self.labels[key], self.editors[key].widget)
            if key == "name":
                form.addRow("Kind", self.kind)
            elif key == "timer":
                self.labels["tz"] = QLabel("Time zone")
                form.addRow(self.labels["tz"], self.zone)
        form.addRow("Last updated", self.last_updated)
        form.addRow("Updated by", self.updated_by)
        form.addRow("Version", self.version)

        self.pending_label = QLabel(pending_text(0, 0))
        self.message = QLabel()
        self.message.setStyleSheet(ERROR_STYLE)
        self.message.setWordWrap(True)
        self.message.hide()
        self.apply_button = QPushButton("&Apply")
        self.apply_button.setToolTip("Send every pending change to the daemon, as one batch")
        self.revert_button = QPushButton("&Revert")
        self.revert_button.setToolTip("Drop every pending change")
        self.reload_button = QPushButton("Reload from daemon")
        self.reload_button.setToolTip(
            "Drop this job's pending changes and show what the daemon holds"
        )
        buttons = QHBoxLayout()
        buttons.addWidget(self.apply_button)
        buttons.addWidget(self.revert_button)
        buttons.addWidget(self.reload_button)
        buttons.addStretch(1)

        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.form)
        layout.addWidget(self.pending_label)
        layout.addWidget(self.message)
        layout.addLayout(buttons)
        layout.addStretch(1)

        for key, editor in self.editors.items():
            self._connect(key, editor.widget)
        self.zone.currentTextChanged.connect(self._zone_edited)
        self.apply_button.clicked.connect(self.apply)
        self.revert_button.clicked.connect(self.revert)
        self.reload_button.clicked.connect(lambda: self.reload_job())
        self.pending.changed.connect(self._pending_changed)
        self.model.changed.connect(self._model_changed)
        self._fill(None)

    def _connect(self, key: str, widget: QWidget) -> None:
        def edited() -> None:
            self._edited(key)

        if isinstance(widget, QLineEdit | QPlainTextEdit):
            widget.textChanged.connect(edited)
        elif isinstance(widget, QComboBox):
            widget.currentTextChanged.connect(edited)
        elif isinstance(widget, QCheckBox):
            widget.toggled.connect(edited)
        elif isinstance(widget, QSpinBox):
            widget.valueChanged.connect(edited)

    # ------------------------------------------------------------ showing a job

    def show_job(self, job_id: int | None) -> None:
        """Show this job (None: none); its stored fields are fetched, its pending ones kept."""
        if self._closed:
            return
        if (
            job_id is not None
            and job_id == self.job_id
            and (self.fetching or self.detail is not None)
        ):
            self._model_changed()  # shown already: fetched again only if the daemon changed it
            return
        self.job_id = job_id
        self._fill(None)
        if job_id is None:
            self._request += 1
            self.fetching = False
            return
        self._fetch(job_id)

    def _fetch(self, job_id: int) -> None:
        self._request += 1
        request = self._request
        self.fetching = True
        self.session.read(
            "Read job",
            lambda client: client.job(job_id),
            lambda detail: self._fetched(request, detail),
            lambda exc: self._fetch_failed(request, exc),
        )

    def _fetched(self, request: int, detail: dict[str, Any]) -> None:
        if self._closed or request != self._request:
            return
        self.fetching = False
        if self._read_failed:
            self._say("")
        self._fill(detail)
        self._model_changed()  # changed again while it was fetched

    def _fetch_failed(self, request: int, exc: Exception) -> None:
        if self._closed or request != self._request:
            return
        self.fetching = False
        if self.detail is None:  # nothing of it shown: show nothing
            self.job_id = None
            self._fill(None)
        self._say(f"Cannot read the job: {exc}")
        self._read_failed = True

    def _fill(self, detail: dict[str, Any] | None) -> None:
        """Show the stored fields of ``detail`` with the job's pending values over them."""
        self.detail = detail
        self.invalid.clear()  # the text that could not be read goes with the form's
        self._loading = True
        try:
            stored = detail or {}
            for key, editor in self.editors.items():
                editor.write(stored.get(key))
            if detail is not None:
                for key, value in self.pending.fields(int(detail["id"])).items():
                    self.editors[key].write(value)
            self.zone.setCurrentText(timer_zone(self.editors["timer"].read() or ""))
        finally:
            self._loading = False
        self.form.setEnabled(detail is not None and not self.applying and self.refused is None)
        is_box = stored.get("kind") == "box"
        self.editors["command"].widget.setEnabled(not is_box)
        self.editors["box_type"].widget.setEnabled(is_box)
        # Only a box's on-error setting matters (spec 2.1), and only a top-level job misfires.
        self.editors["on_error"].widget.setEnabled(is_box)
        self.editors["misfire"].widget.setEnabled(stored.get("parent") is None)
        self.zone.setEnabled(bool(self.editors["timer"].read()))
        self.kind.setText(str(stored.get("kind") or ""))
        self.last_updated.setText(format_time(parse_time(stored.get("last_updated"))))
        self.updated_by.setText(str(stored.get("updated_by") or ""))
        self.version.setText(str(stored.get("version") or ""))
        self._show_pending()

    def _model_changed(self) -> None:
        """Drop the changes of jobs deleted on the daemon (said); re-fetch the shown job
        when the daemon changed it and it has nothing pending."""
        if self._closed:
            return
        if not self.applying:
            gone = self.pending.forget_gone(self.model.nodes)
            if gone:
                names = ", ".join(repr(name) for name in gone)
                self._say(f"Changes dropped: {names} deleted on the daemon")
        if self.detail is None or self.fetching or self.job_id is None:
            return
        if self.job_id in self.pending.jobs():
            return
        view = self.model.view(self.job_id)
        if view is not None and int(view.get("version") or 0) > int(self.detail["version"]):
            self._fetch(self.job_id)

    # ------------------------------------------------------------ editing

    def _edited(self, key: str) -> None:
        if self._loading or self.detail is None:
            return
        if key == "timer" and not self._zoning:
            timer = self.editors["timer"].read() or ""
            self._loading = True
            try:
                self.zone.setCurrentText(timer_zone(timer))
            finally:
                self._loading = False
            self.zone.setEnabled(bool(timer))
        detail = self.detail
        try:
            value = self.editors[key].read()
        except ValueError as exc:
            self.invalid[key] = f"{self.labels[key].text()}: {exc}"
            self._say(self.invalid[key])
            self._show_pending()
            return
        if self.invalid.pop(key, None) is not None:
            self._say(next(iter(self.invalid.values()), ""))
        self.pending.set(
            int(detail["id"]),
            int(detail["version"]),
            key,
            value,
            original=detail.get(key),
            name=str(detail.get("name") or ""),
        )

    def _zone_edited(self, zone: str) -> None:
        if self._loading or self.detail is None:
            return
        timer = self.editors["timer"].read() or ""
        if timer:
            self._zoning = True
            try:
                self.editors["timer"].write(with_zone(timer, zone))
            finally:
                self._zoning = False

    def _pending_changed(self) -> None:
        self.model.set_pending(self.pending.jobs())
        self.conflicts &= self.pending.jobs()
        self._show_pending()

    def _show_pending(self) -> None:
        """Highlight the shown job's pending fields; count them all; enable the buttons."""
        job_id = int(self.detail["id"]) if self.detail is not None else None
        fields = self.pending.fields(job_id) if job_id is not None else {}
        for key, editor in self.editors.items():
            self._highlight(self.labels[key], editor.widget, key in fields)
        self._highlight(self.labels["tz"], self.zone, "timer" in fields)
        if self.detail is None:
            self.title.setText("No job selected" if self.job_id is None else "Loading…")
        else:
            conflict = " (conflict: changed on the daemon)" if job_id in self.conflicts else ""
            self.title.setText(f"{self.detail.get('name', '')}{conflict}")
        count, jobs = self.pending.count(), len(self.pending.jobs())
        self.pending_label.setText(pending_text(count, jobs))
        self.apply_button.setEnabled(bool(count) and not self.applying and not self.invalid)
        self.revert_button.setEnabled(bool(count) and not self.applying)
        self.reload_button.setEnabled(bool(fields) and not self.applying)

    @staticmethod
    def _highlight(label: QLabel, widget: QWidget, pending: bool) -> None:
        font = label.font()
        font.setBold(pending)
        label.setFont(font)
        widget.setStyleSheet(PENDING_STYLE if pending else "")

    def set_refused(self, why: str | None) -> None:
        """``why`` the token's role may not modify jobs (None: it may): the form only shows."""
        self.refused = why
        self.form.setEnabled(self.detail is not None and not self.applying and why is None)
        self.form.setToolTip(why or "")
        if why is not None:
            self._say(why)

    def _say(self, text: str) -> None:
        text = text or (self.refused or "")  # with nothing else to say, why it only shows
        self._read_failed = False
        self.message.setText(text)
        self.message.setVisible(bool(text))

    # ------------------------------------------------------------ apply, revert, reload

    def apply(self) -> None:
        """Send every pending change as one batch; on success drop them and re-fetch."""
        batch = self.pending.batch()
        if self._closed or not batch or self.applying:
            return
        if self.invalid:
            self._say(next(iter(self.invalid.values())))
            return
        self.applying = True
        self.form.setEnabled(False)  # nothing changes under the batch in flight
        self._say("")
        self._show_pending()
        self.session.act(
            "Apply changes", lambda client: client.modify(batch), self._applied, self._refused
        )

    def _applied(self, _result: Any) -> None:
        if self._closed:
            return
        self._done_applying()
        self.conflicts.clear()
        self.pending.drop()
        if self.job_id is not None:
            self._fetch(self.job_id)

    def _refused(self, exc: Exception) -> None:
        if self._closed:
            return
        self._done_applying()
        if (
            isinstance(exc, ApiError)
            and exc.status == 409
            and exc.body.get("error") == "ConflictError"
        ):
            self.conflicts = self._jobs_named(str(exc.body.get("job", "")))
            self._say(f"Conflict: {exc}")
        else:
            self._say(f"Not applied: {exc}")
        self._show_pending()

    def own_change_applied(self, seen: Mapping[int, Any], now: Mapping[int, Any]) -> None:
        """The window's own change (rename, move, activation...) took jobs from versions
        ``seen`` to ``now``: their pending changes count from it, not as a conflict with it,
        and the job shown is read again (its pending values stay over it)."""
        if self._closed:
            return
        rebased = self.pending.rebase(seen, now)
        self.conflicts -= set(rebased)
        if self.job_id is not None and self.job_id in now and not self.applying:
            self._fetch(self.job_id)
        else:
            self._show_pending()

    def _done_applying(self) -> None:
        self.applying = False
        self.form.setEnabled(self.detail is not None and self.refused is None)

    def _jobs_named(self, name: str) -> set[int]:
        """The pending jobs called ``name`` (the daemon names the job of a conflict)."""
        found: set[int] = set()
        for job_id in self.pending.jobs():
            view = self.model.view(job_id) or {}
            shown = self.detail if self.detail is not None and self.detail["id"] == job_id else {}
            if name in (view.get("name"), shown.get("name")):
                found.add(job_id)
        return found

    def revert(self) -> None:
        """Drop every pending change; the form shows the stored values again."""
        if self.applying:
            return
        self.pending.drop()
        self._say("")
        self._fill(self.detail)

    def reload_job(self, job_id: int | None = None) -> None:
        """Drop the pending changes of one job (default: the one shown) and fetch it afresh."""
        job_id = self.job_id if job_id is None else job_id
        if job_id is None or self.applying:
            return
        self.pending.drop(job_id)
        if not self.conflicts:
            self._say("")
        if job_id == self.job_id:
            self._fill(self.detail)
            self._fetch(job_id)

    def shutdown(self) -> None:
        """Stop reacting to the model and to answers still on their way; pending changes go."""
        if self._closed:
            return
        self._closed = True
        self._request += 1
        self.model.changed.disconnect(self._model_changed)
        self.model.set_pending(())
