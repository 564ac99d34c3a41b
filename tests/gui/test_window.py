"""The main window against a real daemon: build trees with the actions, run, kill, restart.

Every test drives the window the way an operator does (its actions, their
shortcuts, the tree's cells) and checks both what the window shows and what the
daemon then holds, read back over the API with a separate client.
"""

from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QModelIndex, QPoint, Qt

from jobcontrol.client import Client, Event
from jobcontrol_admin.expression import ExpressionEditor
from jobcontrol_admin.model import COL
from jobcontrol_admin.window import MainWindow
from tests.acceptance.harness import JobControl, describe, write
from tests.gui.conftest import WAIT_MS, AdminDaemon, open_window

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def client(admin_daemon: AdminDaemon) -> Iterator[Client]:
    with Client(admin_daemon.url, admin_daemon.token) as c:
        yield c


@pytest.fixture
def window(qtbot: Any, admin_daemon: AdminDaemon) -> Iterator[MainWindow]:
    w = open_window(qtbot, admin_daemon.url, admin_daemon.token)
    yield w
    w.close()


def shown(window: MainWindow, name: str) -> dict[str, Any] | None:
    node = window.model.find(name)
    return node.view if node is not None else None


def wait_shown(qtbot: Any, window: MainWindow, name: str, **fields: Any) -> dict[str, Any]:
    def ok() -> bool:
        view = shown(window, name)
        return view is not None and all(view.get(k) == v for k, v in fields.items())

    qtbot.waitUntil(ok, timeout=WAIT_MS)
    view = shown(window, name)
    assert view is not None
    return view


def select(window: MainWindow, *names: str) -> None:
    ids = []
    for name in names:
        node = window.model.find(name)
        assert node is not None, name
        ids.append(node.id)
    window.select_ids(ids, ids[0])
    window.view.setCurrentIndex(window.view_index(ids[0]))
    window.select_ids(ids, ids[0])


def cell(window: MainWindow, name: str, column: str) -> str:
    node = window.model.find(name)
    assert node is not None, name
    return str(window.model.index_of(node.id, COL[column]).data())


def by_name(client: Client) -> dict[str, dict[str, Any]]:
    return {j["name"]: j for j in client.tree()["jobs"]}


def answer(window: MainWindow, monkeypatch: pytest.MonkeyPatch, reply: bool) -> list[str]:
    asked: list[str] = []

    def confirm(text: str) -> bool:
        asked.append(text)
        return reply

    monkeypatch.setattr(window, "confirm", confirm)
    return asked


def error_texts(window: MainWindow) -> list[str]:
    return [f"{b.windowTitle()}: {b.text()}" for b in window.errors if b.isVisible()]


# ---------------------------------------------------------------- building trees


def test_new_boxes_and_tasks_from_the_actions_follow_inqs_templates(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    assert window.act_new_top_box.shortcut().toString() == "Ctrl+X"
    assert window.act_new_box.shortcut().toString() == "Ctrl+B"
    assert not window.act_new_box.isEnabled()  # nothing selected: no box to put it under
    window.act_new_top_box.trigger()
    box = wait_shown(qtbot, window, "New Box")
    # The new row is selected and its name open for editing in place.
    qtbot.waitUntil(lambda: window.current_id() == box["id"], timeout=WAIT_MS)
    assert window.view.state() == window.view.State.EditingState
    window.view.closePersistentEditor(window.view.currentIndex())

    # Renaming in place: the model asks, the daemon renames, the event renames the row.
    window.model.setData(window.model.index_of(box["id"]), "Nightly")
    wait_shown(qtbot, window, "Nightly")
    select(window, "Nightly")
    assert window.act_new_task.isEnabled()
    assert window.act_new_box.isEnabled()
    window.act_new_task.trigger()
    wait_shown(qtbot, window, "New Task")
    select(window, "Nightly")
    window.act_new_task.trigger()
    wait_shown(qtbot, window, "New Task 2")
    window.act_new_top_task.trigger()
    wait_shown(qtbot, window, "New Task 3", parent=None)

    jobs = by_name(client)
    assert jobs["Nightly"]["kind"] == "box"
    assert (
        jobs["Nightly"]["active"],
        jobs["Nightly"]["on_error"],
        jobs["Nightly"]["box_type"],
    ) == (
        False,
        "continue",
        "sequence",  # DESIGN decision 9: SEQUENCE everywhere, the GUI's new box too
    )
    assert jobs["New Task"]["parent"] == jobs["Nightly"]["id"]
    assert jobs["New Task 2"]["parent"] == jobs["Nightly"]["id"]
    assert jobs["New Task"]["active"] is False
    assert jobs["New Task 3"]["parent"] is None
    # The window shows the same tree: each task under the box, in the daemon's order.
    nightly = window.model.find("Nightly")
    assert nightly is not None
    assert [c.name for c in nightly.children] == ["New Task", "New Task 2"]


def test_a_shortcut_creates_a_top_level_task(qtbot: Any, window: MainWindow) -> None:
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=WAIT_MS)
    qtbot.keyClick(window.view, Qt.Key.Key_L, Qt.KeyboardModifier.ControlModifier)
    wait_shown(qtbot, window, "New Task", parent=None)


def test_multi_selection_actions_are_one_batch_and_one_reaction(
    qtbot: Any,
    window: MainWindow,
    client: Client,
    admin_daemon: AdminDaemon,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    lines = ["jobs:", "  - name: Fleet", "    children:"]
    lines += [f"      - name: t{i:03d}\n        command: 'true'" for i in range(200)]
    admin_daemon.load(write(admin_daemon.jc.base / "fleet.yaml", "\n".join(lines) + "\n"))
    qtbot.waitUntil(lambda: len(window.model.nodes) == 201, timeout=WAIT_MS)
    batches: list[list[Event]] = []
    assert window.feed is not None
    window.feed.events.connect(batches.append)

    window.view.expandAll()
    select(window, *[f"t{i:03d}" for i in range(200)])
    assert len(window.selected_ids()) == 200
    assert window.act_active.isEnabled()
    assert not window.act_inactive.isEnabled()
    window.act_active.trigger()
    qtbot.waitUntil(
        lambda: all(window.model.find(f"t{i:03d}").view["active"] for i in range(200)),  # type: ignore[union-attr]
        timeout=WAIT_MS,
    )
    modified = [e for b in batches for e in b if e.type == "job.modified"]
    # One batch: a single event carries all 200 (one transaction, one dispatcher reaction).
    assert [len(e.data["jobs"]) for e in modified] == [200]
    assert all(j["active"] for j in client.tree()["jobs"] if j["name"] != "Fleet")
    assert window.act_inactive.isEnabled()
    assert not window.act_active.isEnabled()
    audit = admin_daemon.jc.json("audit", "--json", "--limit", "5")
    assert [a["operation"] for a in audit][:1] == ["jobs.modify"]
    assert len(audit[0]["jobs"]) == 200

    # Inactive asks first; saying no changes nothing.
    asked = answer(window, monkeypatch, False)
    window.act_inactive.trigger()
    assert asked == ["Deactivate Selected Jobs?"]
    assert all(j["active"] for j in client.tree()["jobs"] if j["name"] != "Fleet")

    # On-error and box type act on the selected boxes only, again as one batch.
    select(window, "Fleet", "t000")
    window.act_abort.trigger()
    wait_shown(qtbot, window, "Fleet", on_error="abort")
    window.act_consecutive.trigger()
    wait_shown(qtbot, window, "Fleet", box_type="sequence")
    assert by_name(client)["t000"]["on_error"] == "continue"


# ---------------------------------------------------------------- running, killing, restarting


def test_run_now_kill_and_restart_show_in_place(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    box = client.create_job("Batch", "box", active=True, timer="every 1h", box_type="sequence")
    client.create_job("sleeper", "task", parent=box["id"], active=True, command="sleep 60")
    wait_shown(qtbot, window, "sleeper")
    select(window, "Batch")
    assert window.act_restart.isEnabled()
    assert window.act_run.isEnabled()
    assert not window.act_kill.isEnabled()
    assert window.act_run.toolTip() == "Run Batch"

    window.act_run.trigger()
    wait_shown(qtbot, window, "sleeper", state="running")
    assert cell(window, "sleeper", "state") == "Running"
    assert cell(window, "sleeper", "started") != ""
    qtbot.waitUntil(window.act_kill.isEnabled, timeout=WAIT_MS)  # Kill follows the live state

    select(window, "sleeper")
    window.act_kill.trigger()
    # Asked of the worker: the row says when it is done.
    qtbot.waitUntil(
        lambda: window.statusBar().currentMessage().startswith("Asked to kill run "),
        timeout=WAIT_MS,
    )
    assert window.statusBar().currentMessage().endswith(" of Batch")
    wait_shown(qtbot, window, "sleeper", state="idle", exit_status=255)
    assert cell(window, "sleeper", "exit_status") == "255"
    assert cell(window, "sleeper", "last_ran") != ""
    runs = client.runs("sleeper")["runs"]
    assert runs[0]["exit_status"] == 255

    select(window, "sleeper")
    assert not window.act_restart.isEnabled()  # top-level jobs only
    select(window, "Batch")
    window.act_restart.trigger()
    qtbot.waitUntil(
        lambda: "Restarted Batch" in window.statusBar().currentMessage(), timeout=WAIT_MS
    )
    assert cell(window, "Batch", "next_runs") != ""
    # The time as the tree shows it, not the API's ISO text.
    said = window.statusBar().currentMessage()
    assert re.search(r"next runs \d\d [A-Z][a-z]{2} \d{4} \d\d:\d\d:\d\d", said), said
    assert not error_texts(window)


def test_restart_of_an_inactive_job_says_nothing_was_armed(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    client.create_job("Dormant", "box", timer="every 1h")
    wait_shown(qtbot, window, "Dormant")
    # Shown, as in Inq, though nothing is armed for an inactive job.
    qtbot.waitUntil(lambda: cell(window, "Dormant", "next_runs") != "", timeout=WAIT_MS)
    select(window, "Dormant")
    qtbot.waitUntil(window.act_restart.isEnabled, timeout=WAIT_MS)
    window.act_restart.trigger()
    qtbot.waitUntil(
        lambda: "Dormant not armed: it is inactive; activate it to schedule it"
        in window.statusBar().currentMessage(),
        timeout=WAIT_MS,
    )
    # The cleared next runs come by the event stream, after the reply.
    qtbot.waitUntil(lambda: cell(window, "Dormant", "next_runs") == "", timeout=WAIT_MS)
    assert not error_texts(window)


def test_delete_is_confirmed_and_takes_the_sub_tree(
    qtbot: Any, window: MainWindow, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    box = client.create_job("Old", "box")
    client.create_job("old task", "task", parent=box["id"], command="true")
    client.create_job("keep", "task", command="true")
    wait_shown(qtbot, window, "old task")
    select(window, "Old")
    asked = answer(window, monkeypatch, False)
    window.act_delete.trigger()
    assert asked == ["Delete Old?"]
    assert set(by_name(client)) == {"Old", "old task", "keep"}

    answer(window, monkeypatch, True)
    select(window, "Old", "old task")  # the child goes with its box: asked once, one request
    window.act_delete.trigger()
    qtbot.waitUntil(lambda: window.model.find("Old") is None, timeout=WAIT_MS)
    assert window.model.find("old task") is None
    assert set(by_name(client)) == {"keep"}
    # Every job that went is counted, not the one sub-tree named.
    qtbot.waitUntil(
        lambda: window.statusBar().currentMessage() == "Deleted 2 jobs", timeout=WAIT_MS
    )
    assert not error_texts(window)


# ---------------------------------------------------------------- editing


def test_the_expression_editor_refuses_bad_text_with_the_daemons_message(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    client.create_job("report", "task", command="echo hi", timer="every 1h")
    view = wait_shown(qtbot, window, "report")
    window.edit_expression(view["id"], "timer")
    editor = window.findChild(ExpressionEditor, "jc-expression-editor")
    assert editor is not None
    assert editor.isVisible()
    assert editor.windowTitle() == "report Edit Timer"
    assert editor.text.isReadOnly()
    editor.edit_button.click()
    assert not editor.text.isReadOnly()
    editor.text.setPlainText("evry 10s")
    editor.ok_button.click()
    qtbot.waitUntil(lambda: "invalid schedule" in editor.status.text(), timeout=WAIT_MS)
    assert "position 0" in editor.status.text()
    assert editor.status.text().startswith("job 'report': ")  # named, though sent by id
    assert editor.isVisible()
    assert client.job("report")["timer"] == "every 1h"

    editor.text.setPlainText("daily 22:56")
    editor.ok_button.click()
    qtbot.waitUntil(lambda: not window.editors, timeout=WAIT_MS)  # closed (and deleted)
    wait_shown(qtbot, window, "report", timer="daily 22:56")
    assert client.job("report")["timer"] == "daily 22:56"


def editing_command(
    qtbot: Any, window: MainWindow, client: Client, name: str
) -> tuple[dict[str, Any], ExpressionEditor]:
    """A new task ``name`` (``echo hi``) and its command's editor, open and editable."""
    client.create_job(name, "task", command="echo hi")
    view = wait_shown(qtbot, window, name)
    window.edit_expression(view["id"], "command")
    editor = window.editors[0]
    editor.edit_button.click()
    return view, editor


def test_the_expression_editor_after_someone_elses_change_saves_over_it_on_a_second_ok(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    view, editor = editing_command(qtbot, window, client, "report")
    client.modify([{"job": view["id"], "version": 1, "fields": {"command": "echo theirs"}}])
    wait_shown(qtbot, window, "report", version=2)
    editor.text.setPlainText("echo mine")
    editor.ok_button.click()
    qtbot.waitUntil(lambda: "changed by someone else" in editor.status.text(), timeout=WAIT_MS)
    # It says what the daemon has now and what OK does; theirs is kept until then.
    assert "now 'echo theirs'" in editor.status.text(), editor.status.text()
    assert "OK saves your text over it" in editor.status.text()
    assert client.job("report")["command"] == "echo theirs"
    editor.ok_button.click()
    qtbot.waitUntil(lambda: not window.editors, timeout=WAIT_MS)
    assert client.job("report")["command"] == "echo mine"


def test_the_expression_editor_of_a_job_deleted_meanwhile_cannot_save(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    view, editor = editing_command(qtbot, window, client, "doomed")
    editor.text.setPlainText("echo meant for doomed")
    client.delete([view["id"]])
    client.create_job("innocent", "task", command="echo innocent")
    wait_shown(qtbot, window, "innocent")
    qtbot.waitUntil(lambda: "deleted on the daemon" in editor.status.text(), timeout=WAIT_MS)
    assert not editor.ok_button.isEnabled()
    editor.accept()  # even pressed by the keyboard: nothing is sent
    assert editor.isVisible()
    assert client.job("innocent")["command"] == "echo innocent"
    editor.reject()


def test_a_rename_in_place_leaves_the_jobs_pending_changes_to_apply(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    client.create_job("render", "task", command="true")
    view = wait_shown(qtbot, window, "render")
    select(window, "render")
    panel = window.properties
    assert panel is not None
    qtbot.waitUntil(lambda: (panel.detail or {}).get("id") == view["id"], timeout=WAIT_MS)
    panel.editors["description"].widget.setPlainText("pending text")
    assert panel.pending.count() == 1
    window.rename(view["id"], "render2")
    qtbot.waitUntil(lambda: (panel.detail or {}).get("name") == "render2", timeout=WAIT_MS)
    assert panel.title.text() == "render2"
    assert panel.editors["description"].widget.toPlainText() == "pending text"
    panel.apply()
    qtbot.waitUntil(lambda: not panel.applying, timeout=WAIT_MS)
    assert not panel.message.isVisible(), panel.message.text()
    stored = client.job("render2")
    assert (stored["description"], stored["version"]) == ("pending text", 3)


def test_pending_changes_of_a_job_deleted_on_the_daemon_are_dropped_and_said(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    client.create_job("DoomA", "task", command="true")
    client.create_job("KeepB", "task", command="true")
    doom = wait_shown(qtbot, window, "DoomA")
    keep = wait_shown(qtbot, window, "KeepB")
    panel = window.properties
    assert panel is not None
    for job in (doom, keep):
        select(window, job["name"])
        qtbot.waitUntil(lambda j=job: (panel.detail or {}).get("id") == j["id"], timeout=WAIT_MS)
        panel.editors["description"].widget.setPlainText(f"edit of {job['name']}")
    assert panel.pending.jobs() == {doom["id"], keep["id"]}
    client.delete([doom["id"]])
    qtbot.waitUntil(lambda: panel.pending.jobs() == {keep["id"]}, timeout=WAIT_MS)
    assert panel.message.text() == "Changes dropped: 'DoomA' deleted on the daemon"
    panel.apply()
    qtbot.waitUntil(lambda: not panel.applying, timeout=WAIT_MS)
    assert client.job("KeepB")["description"] == "edit of KeepB"
    assert panel.pending.count() == 0


def test_the_magnifier_of_a_timer_cell_opens_the_editor(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    client.create_job("report", "task", command="echo hi", timer="every 1h")
    view = wait_shown(qtbot, window, "report")
    index = window.view_index(view["id"]).siblingAtColumn(COL["timer"])
    window.view.scrollTo(index)
    rect = window.view.visualRect(index)
    # The magnifier is the rightmost icon-width of the cell.
    qtbot.mouseClick(
        window.view.viewport(),
        Qt.MouseButton.LeftButton,
        pos=QPoint(rect.right() - 5, rect.center().y()),
    )
    qtbot.waitUntil(lambda: bool(window.editors), timeout=WAIT_MS)
    assert window.editors[0].field == "timer"
    window.editors[0].reject()


def test_errors_from_the_daemon_are_dialogs_with_its_message(
    qtbot: Any, admin_daemon: AdminDaemon, client: Client
) -> None:
    client.create_job("report", "task", command="echo hi")
    window = open_window(qtbot, admin_daemon.url, admin_daemon.token)
    try:
        wait_shown(qtbot, window, "report")
        node = window.model.find("report")
        assert node is not None
        window.rename(node.id, "..")  # what the tree's name cell sends
        qtbot.waitUntil(lambda: bool(error_texts(window)), timeout=WAIT_MS)
        assert "Rename" in error_texts(window)[0], error_texts(window)
        assert "must not be '.' or '..'" in error_texts(window)[0], error_texts(window)
        assert client.job("report")["name"] == "report"
        assert shown(window, "report") is not None
    finally:
        window.close()


# ---------------------------------------------------------------- moving, filtering


def test_drag_and_drop_moves_and_reorders_and_running_jobs_stay(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    a = client.create_job("A", "box", box_type="sequence")
    b = client.create_job("B", "box", box_type="sequence")
    for name in ("a1", "a2", "a3"):
        client.create_job(name, "task", parent=a["id"], command="true")
    busy = client.create_job("busy", "task", parent=b["id"], command="sleep 60")
    wait_shown(qtbot, window, "busy")
    src = window.model

    def drop(names: list[str], target: str | None, row: int) -> None:
        ids = [src.find(n).id for n in names]  # type: ignore[union-attr]
        data = src.mimeData([src.index_of(i) for i in ids])
        parent = (
            QModelIndex() if target is None else window.view_index(src.find(target).id)  # type: ignore[union-attr]
        )
        assert (
            window.view.model().dropMimeData(data, Qt.DropAction.MoveAction, row, 0, parent)
            is False
        )

    drop(["a3"], "A", 0)  # reorder: a3 first
    qtbot.waitUntil(
        lambda: [c.name for c in src.find("A").children] == ["a3", "a1", "a2"], timeout=WAIT_MS
    )  # type: ignore[union-attr]
    drop(["a1"], "B", 0)  # move into another box
    wait_shown(qtbot, window, "a1", parent=b["id"])
    assert client.job("a1")["parent"] == b["id"]

    client.run_now("busy")
    wait_shown(qtbot, window, "busy", state="running")
    drop(["busy"], "A", 0)
    qtbot.waitUntil(lambda: bool(error_texts(window)), timeout=WAIT_MS)
    assert "running" in error_texts(window)[0]
    assert client.job("busy")["parent"] == busy["parent"]
    # The top level is ordered by next run: a drop there renumbers nothing, so the tree
    # running there (B) does not refuse it.
    shown = len(error_texts(window))
    drop(["a2"], None, 0)
    qtbot.waitUntil(lambda: client.job("a2")["parent"] is None, timeout=WAIT_MS)
    assert len(error_texts(window)) == shown
    client.kill("busy")


def test_the_filter_keeps_ancestors_and_finds_failures(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    top = client.create_job("Top", "box", box_type="sequence", active=True)
    mid = client.create_job("Mid", "box", parent=top["id"], box_type="sequence", active=True)
    client.create_job("needle", "task", parent=mid["id"], command="exit 3", active=True)
    client.create_job("hay", "task", command="true")
    wait_shown(qtbot, window, "needle")

    def visible() -> set[str]:
        names, stack = set(), [QModelIndex()]
        while stack:
            parent = stack.pop()
            for row in range(window.view.model().rowCount(parent)):
                index = window.view.model().index(row, 0, parent)
                names.add(index.data())
                stack.append(index)
        return names

    window.filter_text.setText("NEED")
    assert visible() == {"Top", "Mid", "needle"}
    window.filter_text.clear()
    window.filter_failed.setChecked(True)
    assert visible() == set()
    client.run_now("Top")
    wait_shown(qtbot, window, "needle", exit_status=3)
    qtbot.waitUntil(lambda: visible() == {"Top", "Mid", "needle"}, timeout=WAIT_MS)
    window.filter_failed.setChecked(False)
    assert visible() == {"Top", "Mid", "needle", "hay"}


# ---------------------------------------------------------------- the dispatcher and the connection


def test_pause_resume_and_log_level(qtbot: Any, window: MainWindow, client: Client) -> None:
    assert window.act_pause.isEnabled()
    assert not window.act_resume.isEnabled()
    window.act_pause.trigger()
    qtbot.waitUntil(lambda: window.paused_label.text() == "Timers paused", timeout=WAIT_MS)
    assert client.status()["paused"] is True
    assert window.act_resume.isEnabled()
    window.act_resume.trigger()
    qtbot.waitUntil(lambda: window.paused_label.text() == "", timeout=WAIT_MS)
    assert client.status()["paused"] is False
    window.level_actions["DEBUG"].trigger()
    qtbot.waitUntil(lambda: client.log_level() == "DEBUG", timeout=WAIT_MS)


AWAY = Event(
    None,
    "database.changed",
    {"ok": False, "since": "2026-11-28T10:00:00+00:00", "error": "connection refused"},
)


def test_a_status_asked_before_an_outage_event_does_not_hide_it(
    qtbot: Any, window: MainWindow
) -> None:
    """The event stream and status replies race: a status the daemon answered before the
    database went away, delivered after the stream said so, leaves the outage shown."""
    assert window.session is not None
    window._read_status(failed=None)  # the daemon answers: the database is fine
    window._events([AWAY])  # and the stream's news comes first
    assert window.database_label.text().startswith("Database unavailable since ")
    session = window.session
    qtbot.waitUntil(lambda: not session._pending, timeout=WAIT_MS)  # the reply came
    assert window.database_label.text().startswith("Database unavailable since ")
    # A status asked for after the event is current: it shows the database back.
    window._read_status(failed=None)
    qtbot.waitUntil(lambda: window.database_label.text() == "", timeout=WAIT_MS)


def test_a_status_asked_before_a_pause_does_not_undo_it(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    """The status the window asks for as it goes live may answer after a pause the
    operator asked for meanwhile: it does not show the timers running again."""
    asked_before = client.status()  # what that status says: timers running
    assert asked_before["paused"] is False
    sent = (window._database_events, window._pauses_asked)
    window.act_pause.trigger()
    qtbot.waitUntil(lambda: window.paused_label.text() == "Timers paused", timeout=WAIT_MS)
    window._show_status(asked_before, sent=sent)  # its answer comes now
    assert window.paused_label.text() == "Timers paused"
    assert window.act_resume.isEnabled()
    assert not window.act_pause.isEnabled()
    # One asked for after the pause is current.
    window._read_status(failed=None)
    session = window.session
    assert session is not None
    qtbot.waitUntil(lambda: not session._pending, timeout=WAIT_MS)
    assert window.paused_label.text() == "Timers paused"
    window.act_resume.trigger()
    qtbot.waitUntil(lambda: window.paused_label.text() == "", timeout=WAIT_MS)
    assert client.status()["paused"] is False


def test_a_fresh_snapshot_keeps_the_outage_its_queued_events_said(
    qtbot: Any, window: MainWindow
) -> None:
    """Events queued while the window paces them, then a fresh snapshot (the stream
    resynced): the snapshot replaces the jobs but not what the database did."""
    window._event_timer.start()  # events that come now wait for the next round
    window._events([AWAY])
    assert window.database_label.text() == "", "queued, not shown yet"
    seq = window.model.seq
    assert seq is not None
    window._snapshot(seq, [node.view for node in window.model.nodes.values()])
    assert window.database_label.text().startswith("Database unavailable since ")
    assert "connection refused" in window.database_label.toolTip()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_it_reconnects_after_the_daemon_restarts_and_catches_up(
    qtbot: Any, sqlite_url: str, tmp_path: Path
) -> None:
    jc = JobControl(sqlite_url, tmp_path / "user")
    port = str(_free_port())
    try:
        jc.upgraded()
        jc.ok("daemon", "start", "--port", port)
        token = jc.token_file.read_text().strip()
        url = f"http://127.0.0.1:{port}"
        with Client(url, token) as c:
            c.create_job("before", "task", command="true")
        window = open_window(qtbot, url, token)
        try:
            wait_shown(qtbot, window, "before")
            jc.ok("daemon", "stop")
            qtbot.waitUntil(lambda: window.connection_state == "lost", timeout=WAIT_MS)
            assert "lost" in window.connection_label.text()
            # While the window is cut off, the tree changes (offline, straight on the database).
            jc.ok(
                "load",
                str(write(jc.base / "more.yaml", "jobs:\n  - name: after\n    command: 'true'\n")),
            )
            jc.ok("daemon", "start", "--port", port)
            qtbot.waitUntil(lambda: window.connection_state == "live", timeout=WAIT_MS)
            wait_shown(qtbot, window, "after")
            assert "reconnected and caught up" in window.connection_label.text()
            assert window.model.find("before") is not None
        finally:
            window.close()
    finally:
        problems = jc.cleanup()
    assert not problems, problems


def test_the_entry_point_is_installed() -> None:
    import shutil
    import subprocess
    import sys

    exe = Path(sys.executable).parent / "jobcontrol-admin"
    assert exe.exists() or shutil.which("jobcontrol-admin"), "jobcontrol-admin is not installed"
    done = subprocess.run(
        [str(exe), "--help"], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "--url" in done.stdout
    assert "--token" in done.stdout


def _user_window(qtbot: Any, admin_daemon: AdminDaemon, name: str, role: str) -> MainWindow:
    made = admin_daemon.jc.ok("user", "add", name, "--role", role)
    token = re.search(r"jc_\S+", made.stdout)
    assert token, describe(made)
    window = open_window(qtbot, admin_daemon.url, token.group(0))
    qtbot.waitUntil(lambda: window.permissions is not None, timeout=WAIT_MS)
    return window


def test_a_viewer_sees_every_change_disabled_with_the_reason(
    qtbot: Any, admin_daemon: AdminDaemon, client: Client
) -> None:
    """A viewer may look, not act: every action that changes something is disabled and
    says why, names cannot be edited or dragged, and the properties form only shows."""
    client.create_job("Nightly", "box", active=True, timer="daily 02:00")
    client.create_job("hello", "task", parent="Nightly", command="echo hi")
    window = _user_window(qtbot, admin_daemon, "watcher", "viewer")
    try:
        wait_shown(qtbot, window, "hello")
        select(window, "Nightly")
        assert window.properties is not None
        qtbot.waitUntil(lambda: window.properties.detail is not None, timeout=WAIT_MS)
        for action, what in (
            (window.act_run, "may not run jobs"),
            (window.act_restart, "may not restart jobs"),
            (window.act_delete, "may not delete jobs"),
            (window.act_new_task, "may not create jobs"),
            (window.act_inactive, "may not activate or deactivate jobs"),
            (window.act_rename, "may not change jobs"),
            (window.act_edit_timer, "may not change jobs"),
            (window.act_pause, "may not pause or resume the timers"),
            (window.act_shutdown, "may not change jobs or the daemon"),
        ):
            assert not action.isEnabled(), action.text()
            assert "Your role (viewer)" in action.toolTip(), action.toolTip()
            assert what in action.toolTip(), action.toolTip()
        index = window.view_index(window.model.find("hello").id)  # type: ignore[union-attr]
        flags = window.model.flags(window.model.index(index.row(), 0, index.parent()))
        assert not flags & Qt.ItemFlag.ItemIsEditable
        assert not flags & Qt.ItemFlag.ItemIsDragEnabled
        assert not window.properties.form.isEnabled()
        assert "Your role (viewer) may not change jobs" in window.properties.message.text()
        # What it may do, it may: reload, expand, find.
        assert window.act_refresh.isEnabled()
        assert window.act_find.isEnabled()
        # F4 and the magnifier open the expression editor past the disabled action: it
        # shows the expression, and neither edits nor saves it.
        nightly = window.model.find("Nightly").id  # type: ignore[union-attr]
        window.edit_expression(nightly, "timer")
        (editor,) = window.editors
        assert editor.text.toPlainText() == "daily 02:00"
        assert not editor.edit_button.isEnabled()
        assert not editor.ok_button.isEnabled()
        assert "Your role (viewer) may not change jobs" in editor.status.text()
        editor.reject()
    finally:
        window.close()


def test_an_operator_runs_and_kills_but_cannot_edit(
    qtbot: Any, admin_daemon: AdminDaemon, client: Client
) -> None:
    client.create_job("lone", "task", command="true")
    window = _user_window(qtbot, admin_daemon, "oper", "operator")
    try:
        wait_shown(qtbot, window, "lone")
        select(window, "lone")
        assert window.act_run.isEnabled()
        assert window.act_restart.isEnabled()
        assert window.act_inactive.isEnabled() is False  # inactive already
        assert window.act_active.isEnabled()
        assert window.act_pause.isEnabled()
        for action in (window.act_delete, window.act_rename, window.act_edit_command):
            assert not action.isEnabled(), action.text()
            assert "Your role (operator) may not" in action.toolTip(), action.toolTip()
        window.act_run.trigger()
        qtbot.waitUntil(lambda: bool(client.runs("lone")["runs"]), timeout=WAIT_MS)
        assert not error_texts(window)
    finally:
        window.close()


def test_a_job_selected_while_the_daemon_is_down_says_its_runs_were_not_read(
    qtbot: Any, admin_daemon: AdminDaemon, window: MainWindow, client: Client
) -> None:
    """With the daemon stopped, each job clicked opened a "History of ..." dialog and the
    runs panel said "no runs yet" of a job with runs. It says they were not read, and
    why, in place (the status bar says the connection is lost)."""
    client.create_job("ran", "task", command="true")
    client.run_now("ran")
    wait_shown(qtbot, window, "ran", exit_status=0)
    admin_daemon.jc.ok("daemon", "stop")
    qtbot.waitUntil(lambda: window.connection_state == "lost", timeout=WAIT_MS)
    select(window, "ran")
    history = window.history
    assert history is not None
    qtbot.waitUntil(
        lambda: history.count_label.text().startswith("runs not read: "), timeout=WAIT_MS
    )
    assert "no runs yet" not in history.count_label.text()
    assert error_texts(window) == []


def test_a_daemon_found_by_its_url_file_is_followed_to_its_new_port(
    qtbot: Any, admin_daemon: AdminDaemon, window: MainWindow
) -> None:
    """A daemon started without --port takes a free port when 8640 is taken: the client
    that found it through its URL file showed "reconnecting…" for good, with stale data,
    after a restart on another port. It reads the file again and follows it."""
    from jobcontrol.client.locate import daemon_url

    jc = admin_daemon.jc
    window.rediscover = lambda: daemon_url(jc.url, jc.state_dir)
    assert window.rediscover() == admin_daemon.url
    jc.ok("daemon", "stop")
    qtbot.waitUntil(lambda: window.connection_state == "lost", timeout=WAIT_MS)
    jc.ok("daemon", "start", "--port", "0")  # any free port: not the one it had
    moved = window.rediscover()
    assert moved is not None
    assert moved != admin_daemon.url
    qtbot.waitUntil(
        lambda: window.session is not None
        and window.session.url == moved
        and window.connection_state == "live",
        timeout=WAIT_MS * 2,
    )
    assert window.connection_label.text().startswith(f"Live: {moved}")
