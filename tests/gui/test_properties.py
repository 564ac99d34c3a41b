"""The properties panel against a real daemon: edits stay pending until Apply sends one batch."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import QCheckBox, QComboBox, QLineEdit, QPlainTextEdit, QSpinBox, QWidget
from pytestqt.qtbot import QtBot

from jobcontrol.client import Client
from jobcontrol_admin.feed import EventFeed
from jobcontrol_admin.model import JobTreeModel, PendingRole
from jobcontrol_admin.properties import PendingChanges, PropertiesPanel, with_zone
from jobcontrol_admin.session import Session
from tests.gui.conftest import WAIT_MS, AdminDaemon


@dataclass
class Ui:
    qtbot: QtBot
    daemon: AdminDaemon
    client: Client
    model: JobTreeModel
    panel: PropertiesPanel
    errors: list[str] = field(default_factory=list)

    def create(self, name: str, kind: str = "task", **fields: Any) -> int:
        """A job made by the daemon, once the model has it."""
        if kind == "task":
            fields.setdefault("command", "true")
        job_id = int(self.client.create_job(name, kind, **fields)["id"])
        self.qtbot.waitUntil(lambda: self.model.view(job_id) is not None, timeout=WAIT_MS)
        return job_id

    def show(self, job_id: int) -> None:
        """Select the job and wait until the form shows it."""
        self.panel.show_job(job_id)
        self.wait_shown(job_id)

    def wait_shown(self, job_id: int, version: int | None = None) -> None:
        def shown() -> bool:
            detail = self.panel.detail
            if detail is None or detail["id"] != job_id or self.panel.fetching:
                return False
            return version is None or detail["version"] == version

        self.qtbot.waitUntil(shown, timeout=WAIT_MS)

    def apply(self) -> None:
        """Click Apply and wait for the daemon's answer."""
        self.qtbot.mouseClick(self.panel.apply_button, Qt.MouseButton.LeftButton)
        self.qtbot.waitUntil(lambda: not self.panel.applying, timeout=WAIT_MS)

    def italic(self, job_id: int) -> bool:
        index = self.model.index_of(job_id)
        font = index.data(Qt.ItemDataRole.FontRole)
        assert isinstance(font, QFont)
        assert index.data(PendingRole) == font.italic()
        return font.italic()


@pytest.fixture
def ui(qtbot: QtBot, admin_daemon: AdminDaemon) -> Iterator[Ui]:
    session = Session(admin_daemon.url, admin_daemon.token)
    client = Client(admin_daemon.url, admin_daemon.token)
    model = JobTreeModel()
    feed = EventFeed(session.new_client)
    feed.snapshot.connect(model.load)
    feed.events.connect(model.apply)
    panel = PropertiesPanel(session, model)
    qtbot.addWidget(panel)
    panel.show()
    result = Ui(qtbot, admin_daemon, client, model, panel)
    session.error.connect(lambda title, message: result.errors.append(f"{title}: {message}"))
    feed.start()
    try:
        qtbot.waitUntil(lambda: model.seq is not None, timeout=WAIT_MS)
        yield result
    finally:
        panel.shutdown()
        feed.stop()
        session.close()
        client.close()
    assert not result.errors


def widget(panel: PropertiesPanel, key: str) -> QWidget:
    return panel.zone if key == "tz" else panel.editors[key].widget


def shown(panel: PropertiesPanel, key: str) -> str:
    """What the user reads in a field."""
    w = widget(panel, key)
    if isinstance(w, QLineEdit | QSpinBox):
        return w.text()
    if isinstance(w, QPlainTextEdit):
        return w.toPlainText()
    if isinstance(w, QComboBox):
        return w.currentText()
    assert isinstance(w, QCheckBox)
    return "yes" if w.isChecked() else "no"


def edit(qtbot: QtBot, panel: PropertiesPanel, key: str, value: Any) -> None:
    """Change a field as the user does."""
    w = widget(panel, key)
    if isinstance(w, QLineEdit):
        w.clear()
        qtbot.keyClicks(w, str(value))
    elif isinstance(w, QPlainTextEdit):
        w.setPlainText(str(value))
    elif isinstance(w, QComboBox):
        w.setCurrentText(str(value))
    elif isinstance(w, QSpinBox):
        w.setValue(int(value))
    else:
        assert isinstance(w, QCheckBox)
        w.setChecked(bool(value))


def highlighted(panel: PropertiesPanel, key: str) -> bool:
    label = panel.labels[key].font().bold()
    background = "background" in widget(panel, key).styleSheet()
    assert label == background
    return label


# ---------------------------------------------------------------- pending changes alone


def test_pending_changes_accumulate_and_an_edit_back_to_the_original_is_none() -> None:
    pending = PendingChanges()
    pending.set(1, 4, "description", "new", original=None)
    pending.set(1, 4, "priority", 5, original=0)
    pending.set(2, 9, "queue", "batch", original="default")
    assert (pending.count(), pending.jobs()) == (3, {1, 2})
    # The version kept is the one the job was first edited at.
    pending.set(2, 10, "queue", "night", original="batch")
    assert pending.batch() == [
        {"job": 1, "version": 4, "fields": {"description": "new", "priority": 5}},
        {"job": 2, "version": 9, "fields": {"queue": "night"}},
    ]
    # Back to the value stored when first edited: the field, then the job, is no longer pending.
    pending.set(2, 9, "queue", "default", original="whatever")
    pending.set(1, 4, "priority", 0, original=0)
    assert (pending.count(), pending.jobs()) == (1, {1})
    pending.drop(1)
    assert (pending.count(), pending.batch()) == (0, [])


def test_with_zone_rewrites_only_the_tz_suffix() -> None:
    assert with_zone("daily 22:56", "Europe/London") == "daily 22:56 tz=Europe/London"
    assert with_zone("daily 22:56 tz=Asia/Tokyo", "Europe/Paris") == "daily 22:56 tz=Europe/Paris"
    assert with_zone("cron 0 * * * *  TZ=Asia/Tokyo", "") == "cron 0 * * * *"


# ---------------------------------------------------------------- the panel and a daemon


def test_the_form_shows_every_field_of_a_job(ui: Ui) -> None:
    box = ui.create("Nightly", "box", box_type="timed", on_error="abort")
    task = ui.create(
        "extract",
        parent="Nightly",
        description="first line\nsecond line",
        command="echo one\necho two",
        timer="daily 22:56 tz=Europe/London",
        active=True,
        on_error="abort",
        queue="batch",
        priority=7,
        timeout=90,
        max_log_files=3,
        retries=2,
        misfire="skip",
        cwd="/tmp",
        env={"A": "1", "B": "x=y"},
    )
    panel = ui.panel
    ui.show(task)
    assert panel.title.text() == "extract"
    assert {key: shown(panel, key) for key in [*panel.editors, "tz"]} == {
        "name": "extract",
        "description": "first line\nsecond line",
        "command": "echo one\necho two",
        "timer": "daily 22:56 tz=Europe/London",
        "tz": "Europe/London",
        "active": "yes",
        "on_error": "abort",
        "box_type": "",
        "queue": "batch",
        "priority": "7",
        "timeout": "1m30s",
        "max_log_files": "3",
        "retries": "2",
        "misfire": "skip",
        "cwd": "/tmp",
        "env": "A=1\nB=x=y",
    }
    assert panel.kind.text() == "task"
    assert panel.version.text() == "1"
    assert panel.updated_by.text()
    assert panel.last_updated.text()
    assert widget(panel, "command").isEnabled()
    assert widget(panel, "tz").isEnabled()
    assert not widget(panel, "box_type").isEnabled()
    assert not widget(panel, "on_error").isEnabled()  # only a box's matters
    # Showing is not editing.
    assert panel.pending.count() == 0
    assert panel.pending_label.text() == "No pending changes"
    assert not panel.apply_button.isEnabled()

    ui.show(box)
    assert panel.title.text() == "Nightly"
    assert panel.kind.text() == "box"
    assert shown(panel, "box_type") == "timed"
    assert widget(panel, "box_type").isEnabled()
    assert shown(panel, "command") == ""
    assert not widget(panel, "command").isEnabled()
    assert shown(panel, "on_error") == "abort"
    assert widget(panel, "on_error").isEnabled()
    assert widget(panel, "misfire").isEnabled()  # top level
    assert shown(panel, "max_log_files") == "default"
    assert shown(panel, "timeout") == ""
    assert shown(panel, "timer") == ""
    assert not widget(panel, "tz").isEnabled()
    assert panel.pending.count() == 0


def test_edits_stay_pending_until_apply_sends_them_as_one_batch(ui: Ui) -> None:
    t1 = ui.create("t1", timer="every 1h")
    t2 = ui.create("t2", timer="every 1h")
    panel, qtbot = ui.panel, ui.qtbot

    ui.show(t1)
    edit(qtbot, panel, "description", "nightly extract")
    edit(qtbot, panel, "priority", 5)
    edit(qtbot, panel, "cwd", "/srv")
    edit(qtbot, panel, "cwd", "")  # back as it was: not a change
    assert highlighted(panel, "description")
    assert highlighted(panel, "priority")
    assert not highlighted(panel, "cwd")
    assert not highlighted(panel, "queue")
    ui.show(t2)
    assert not highlighted(panel, "description")  # t2's own fields
    edit(qtbot, panel, "queue", "batch")
    assert highlighted(panel, "queue")

    assert panel.pending_label.text() == "3 pending changes in 2 jobs"
    assert ui.italic(t1)
    assert ui.italic(t2)
    assert panel.apply_button.isEnabled()
    assert panel.revert_button.isEnabled()
    # Back on t1: its pending values, highlighted.
    ui.show(t1)
    assert shown(panel, "description") == "nightly extract"
    assert highlighted(panel, "description")
    assert shown(panel, "priority") == "5"
    assert highlighted(panel, "priority")
    # Nothing reached the daemon.
    for job_id in (t1, t2):
        stored = ui.client.job(job_id)
        assert stored["version"] == 1
        assert (stored["description"], stored["priority"], stored["queue"]) == (None, 0, "default")

    ui.apply()
    assert panel.message.isHidden(), panel.message.text()
    ui.wait_shown(t1, version=2)
    first, second = ui.client.job(t1), ui.client.job(t2)
    assert (first["description"], first["priority"], first["version"]) == ("nightly extract", 5, 2)
    assert (second["queue"], second["version"]) == ("batch", 2)
    # One batch: one audit entry names both jobs.
    latest = ui.daemon.jc.json("audit", "--limit", "1")[0]
    assert (latest["operation"], latest["result"]) == ("jobs.modify", "ok")
    assert sorted(latest["jobs"]) == ["t1", "t2"]
    # Nothing pending any more; the form shows what the daemon holds.
    assert panel.pending_label.text() == "No pending changes"
    assert not ui.italic(t1)
    assert not ui.italic(t2)
    assert panel.version.text() == "2"
    assert not highlighted(panel, "description")
    assert shown(panel, "description") == "nightly extract"
    assert not panel.apply_button.isEnabled()


def test_revert_drops_every_pending_change(ui: Ui) -> None:
    t1 = ui.create("t1", description="as stored")
    panel = ui.panel
    ui.show(t1)
    edit(ui.qtbot, panel, "description", "not wanted")
    edit(ui.qtbot, panel, "active", True)
    assert panel.pending_label.text() == "2 pending changes in 1 job"
    assert ui.italic(t1)

    ui.qtbot.mouseClick(panel.revert_button, Qt.MouseButton.LeftButton)
    assert panel.pending_label.text() == "No pending changes"
    assert not ui.italic(t1)
    assert shown(panel, "description") == "as stored"
    assert not highlighted(panel, "description")
    assert shown(panel, "active") == "no"
    assert not highlighted(panel, "active")
    stored = ui.client.job(t1)
    assert (stored["description"], stored["active"], stored["version"]) == ("as stored", False, 1)


def test_a_job_changed_by_someone_else_is_a_conflict_and_the_edit_is_kept(ui: Ui) -> None:
    t1 = ui.create("t1")
    panel = ui.panel
    ui.show(t1)
    edit(ui.qtbot, panel, "description", "mine")
    # Someone else changes the same job meanwhile; the panel leaves the pending edit alone.
    ui.client.modify([{"job": t1, "version": 1, "fields": {"description": "theirs"}}])
    ui.qtbot.waitUntil(lambda: (ui.model.view(t1) or {}).get("version") == 2, timeout=WAIT_MS)
    assert shown(panel, "description") == "mine"
    assert panel.version.text() == "1"

    ui.apply()
    assert panel.message.isVisible()
    assert panel.message.text().startswith("Conflict: ")
    assert "'t1'" in panel.message.text()
    assert "color" in panel.message.styleSheet()
    assert panel.conflicts == {t1}
    assert "conflict" in panel.title.text()
    assert panel.pending.fields(t1) == {"description": "mine"}
    assert ui.italic(t1)
    assert shown(panel, "description") == "mine"
    assert highlighted(panel, "description")
    stored = ui.client.job(t1)
    assert (stored["description"], stored["version"]) == ("theirs", 2)

    # Reload from daemon: the edit is dropped and the other user's value shown.
    assert panel.reload_button.isEnabled()
    ui.qtbot.mouseClick(panel.reload_button, Qt.MouseButton.LeftButton)
    ui.wait_shown(t1, version=2)
    assert shown(panel, "description") == "theirs"
    assert not highlighted(panel, "description")
    assert panel.message.isHidden()
    assert not panel.conflicts
    assert not ui.italic(t1)
    # Edited again on top of the current version, it goes through.
    edit(ui.qtbot, panel, "description", "mine after all")
    ui.apply()
    ui.wait_shown(t1, version=3)
    assert ui.client.job(t1)["description"] == "mine after all"


def test_a_refused_value_shows_the_daemons_reason_and_stays_pending(ui: Ui) -> None:
    t1 = ui.create("t1", timer="every 1h")
    panel = ui.panel
    ui.show(t1)
    edit(ui.qtbot, panel, "timer", "evry 10s")
    ui.apply()
    assert panel.message.isVisible()
    assert "invalid schedule" in panel.message.text()
    assert "color" in panel.message.styleSheet()
    assert not panel.conflicts
    assert panel.pending.fields(t1) == {"timer": "evry 10s"}
    assert highlighted(panel, "timer")
    assert panel.pending_label.text() == "1 pending change in 1 job"
    stored = ui.client.job(t1)
    assert (stored["timer"], stored["version"]) == ("every 1h", 1)
    # Corrected, it is applied and the message goes.
    edit(ui.qtbot, panel, "timer", "every 10m")
    ui.apply()
    ui.wait_shown(t1, version=2)
    assert panel.message.isHidden()
    assert ui.client.job(t1)["timer"] == "every 10m"


def test_an_env_line_without_equals_is_refused_in_the_form_and_nothing_is_sent(ui: Ui) -> None:
    t1 = ui.create("t1", command="true")
    panel = ui.panel
    ui.show(t1)
    edit(ui.qtbot, panel, "env", "A=1")
    assert panel.pending.fields(t1) == {"env": {"A": "1"}}
    assert panel.apply_button.isEnabled()
    # A line without "=" is not a variable set to nothing: it is refused, with its line.
    edit(ui.qtbot, panel, "env", "A=1\nFOO")
    assert panel.message.isVisible()
    assert "Environment: line 2 ('FOO') has no '='" in panel.message.text()
    assert not panel.apply_button.isEnabled()
    panel.apply()  # as a shortcut would: still nothing goes
    assert not panel.applying
    stored = ui.client.job(t1)
    assert (stored["env"], stored["version"]) == ({}, 1)
    # Corrected, it is applied and the message goes.
    edit(ui.qtbot, panel, "env", "A=1\nFOO=")
    assert panel.message.isHidden()
    assert panel.apply_button.isEnabled()
    ui.apply()
    ui.wait_shown(t1, version=2)
    assert ui.client.job(t1)["env"] == {"A": "1", "FOO": ""}


def test_the_time_zone_combo_rewrites_the_timers_tz_suffix(ui: Ui) -> None:
    t1 = ui.create("t1", timer="daily 22:56")
    t2 = ui.create("t2")
    panel, qtbot = ui.panel, ui.qtbot
    ui.show(t2)
    assert not widget(panel, "tz").isEnabled()  # no timer, no zone

    ui.show(t1)
    combo = panel.zone
    assert combo.isEnabled()
    assert combo.currentText() == ""
    assert combo.itemText(0) == ""
    assert combo.findText("Europe/London") > 0
    edit(qtbot, panel, "tz", "Europe/London")
    assert shown(panel, "timer") == "daily 22:56 tz=Europe/London"
    assert highlighted(panel, "timer")
    assert highlighted(panel, "tz")
    edit(qtbot, panel, "tz", "America/New_York")
    assert shown(panel, "timer") == "daily 22:56 tz=America/New_York"
    # Editing the timer text keeps the combo in step.
    edit(qtbot, panel, "timer", "daily 08:00 tz=Asia/Tokyo")
    assert combo.currentText() == "Asia/Tokyo"
    edit(qtbot, panel, "tz", "")  # the daemon's zone
    assert shown(panel, "timer") == "daily 08:00"
    edit(qtbot, panel, "tz", "Europe/Paris")
    assert panel.pending.fields(t1) == {"timer": "daily 08:00 tz=Europe/Paris"}

    ui.apply()
    ui.wait_shown(t1, version=2)
    assert ui.client.job(t1)["timer"] == "daily 08:00 tz=Europe/Paris"
    assert combo.currentText() == "Europe/Paris"
    assert not highlighted(panel, "tz")


def test_the_form_follows_the_daemon_while_the_job_has_nothing_pending(ui: Ui) -> None:
    t1 = ui.create("t1")
    panel = ui.panel
    ui.show(t1)
    ui.client.modify([{"job": t1, "version": 1, "fields": {"description": "from elsewhere"}}])
    ui.qtbot.waitUntil(lambda: shown(panel, "description") == "from elsewhere", timeout=WAIT_MS)
    assert panel.version.text() == "2"
    assert panel.pending.count() == 0


def test_a_job_that_cannot_be_read_is_said_so_in_the_panel(ui: Ui) -> None:
    t1 = ui.create("t1")
    panel = ui.panel
    panel.show_job(999_999)
    ui.qtbot.waitUntil(lambda: panel.message.isVisible(), timeout=WAIT_MS)
    assert panel.message.text().startswith("Cannot read the job: ")
    assert "no such job" in panel.message.text()
    assert panel.title.text() == "No job selected"
    assert not panel.form.isEnabled()
    # The next job shown clears it.
    ui.show(t1)
    assert panel.message.isHidden()
    assert panel.title.text() == "t1"
    assert not panel.reload_button.isEnabled()
