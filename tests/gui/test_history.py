"""The history panel against a real daemon: runs newest first, paging, live rows, logs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from jobcontrol.client import Client
from jobcontrol_admin.feed import EventFeed
from jobcontrol_admin.history import COLUMNS, NO_OUTPUT, HistoryPanel, RunTableModel
from jobcontrol_admin.session import Session
from tests.gui.conftest import WAIT_MS, AdminDaemon

THREE_LINES = "for i in 1 2 3; do echo line$i; done"


@pytest.fixture
def client(admin_daemon: AdminDaemon) -> Iterator[Client]:
    with Client(admin_daemon.url, admin_daemon.token) as c:
        yield c


@pytest.fixture
def session(admin_daemon: AdminDaemon) -> Iterator[Session]:
    s = Session(admin_daemon.url, admin_daemon.token)
    errors: list[tuple[str, str]] = []
    s.error.connect(lambda title, message: errors.append((title, message)))
    try:
        yield s
    finally:
        s.close()
    assert not errors, errors


def make_panel(qtbot: QtBot, session: Session, page_size: int = 50) -> HistoryPanel:
    panel = HistoryPanel(session, page_size=page_size)
    qtbot.addWidget(panel)  # closed (so shut down) after the test, before the session
    panel.resize(900, 600)
    panel.show()
    return panel


def cell(panel: HistoryPanel, row: int, column: str) -> str:
    return str(panel.model.index(row, COLUMNS.index(column)).data())


def column(panel: HistoryPanel, name: str) -> list[str]:
    return [cell(panel, row, name) for row in range(panel.model.rowCount())]


def run_ids(panel: HistoryPanel) -> list[int]:
    return [int(v) for v in column(panel, "Run")]


def wait_ended(qtbot: QtBot, client: Client, run_id: int) -> dict[str, Any]:
    final: dict[str, Any] = {}

    def ended() -> bool:
        run = client.get_run(run_id)["run"]
        final.update(run)
        return run["state"] not in ("queued", "running", "waiting")

    qtbot.waitUntil(ended, timeout=WAIT_MS)
    return final


def gated(gate: Path, before: str = "", after: str = "") -> str:
    """A command that waits (bounded) for the test to create ``gate``."""
    return (
        f"{before} for i in $(seq 600); do [ -e {gate} ] && break; sleep 0.05; done; {after} true"
    )


def select(qtbot: QtBot, panel: HistoryPanel, run_id: int) -> None:
    qtbot.waitUntil(lambda: run_id in run_ids(panel), timeout=WAIT_MS)
    panel.table.selectRow(run_ids(panel).index(run_id))


def log_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("jc-admin-log")]


def test_rows_keep_newest_first_and_never_go_back_a_state(qtmodeltester: Any) -> None:
    model = RunTableModel()
    qtmodeltester.check(model, force_py=True)  # stays connected: checks every change below
    base = {"job_id": 1, "trigger": "timer", "requested_by": "timer", "exit_status": None}
    model.add([{**base, "id": 7, "state": "succeeded", "exit_status": 0}, {**base, "id": 3}])
    model.upsert({**base, "id": 9, "state": "running"})
    model.upsert({**base, "id": 5, "state": "failed", "exit_status": 2})
    assert [model.run(r)["id"] for r in range(model.rowCount())] == [9, 7, 5, 3]
    model.upsert({"id": 9, "state": "succeeded", "exit_status": 0, "duration_ms": 1500})
    model.upsert({"id": 9, "state": "running"})  # an answer read before the end
    row = [model.index(0, c).data() for c in range(len(COLUMNS))]
    # Who: "timer" for a timer's run (the user for a manual run or a restart)
    assert row == ["9", "timer", "timer", "", "00:00:01.500", "", "", "succeeded (exit 0)"]
    # CPU time and peak memory come with the run's end (from its cgroup)
    model.upsert(
        {"id": 9, "state": "succeeded", "exit_status": 0, "cpu_us": 1_234_000}
        | {"mem_peak_bytes": 50 * 1024 * 1024 + 512 * 1024}
    )
    cpu, mem = (model.index(0, COLUMNS.index(c)).data() for c in ("CPU", "Mem peak"))
    assert (cpu, mem) == ("1.234 s", "50.5 MiB")
    right = int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
    assert model.index(0, COLUMNS.index("Mem peak")).data(Qt.ItemDataRole.TextAlignmentRole) == (
        right
    )
    model.clear()
    assert model.rowCount() == 0


def test_runs_are_shown_newest_first_with_trigger_who_and_status(
    qtbot: QtBot, client: Client, session: Session
) -> None:
    job = client.create_job("echoer", "task", command=THREE_LINES)
    failing = client.create_job("failer", "task", command="exit 3")
    first = client.run_now("echoer")
    wait_ended(qtbot, client, first)
    second = client.run_now("echoer")
    wait_ended(qtbot, client, second)
    wait_ended(qtbot, client, client.run_now("failer"))

    panel = make_panel(qtbot, session)
    panel.show_job(job["id"], "echoer")
    qtbot.waitUntil(lambda: panel.count_label.text() == "2 runs shown", timeout=WAIT_MS)

    assert run_ids(panel) == [second, first]
    assert column(panel, "Trigger") == ["manual", "manual"]
    assert column(panel, "Who") == ["admin", "admin"]
    assert column(panel, "Status") == ["succeeded (exit 0)", "succeeded (exit 0)"]
    assert all(column(panel, "Started"))
    assert not panel.older_button.isEnabled()
    assert panel.title.text() == "Runs of echoer"

    panel.show_job(failing["id"], "failer")
    qtbot.waitUntil(lambda: panel.count_label.text() == "1 run shown", timeout=WAIT_MS)
    assert column(panel, "Status") == ["failed (exit 3)"]

    panel.show_job(None)
    assert panel.model.rowCount() == 0
    assert panel.count_label.text() == ""


def test_older_runs_reads_the_next_page_until_there_is_none(
    qtbot: QtBot, client: Client, session: Session
) -> None:
    job = client.create_job("quick", "task", command="echo hi")
    runs = []
    for _ in range(5):
        runs.append(client.run_now("quick"))
        wait_ended(qtbot, client, runs[-1])
    newest_first = runs[::-1]

    panel = make_panel(qtbot, session, page_size=2)
    panel.show_job(job["id"], "quick")
    qtbot.waitUntil(lambda: panel.count_label.text() == "2 runs shown", timeout=WAIT_MS)
    assert run_ids(panel) == newest_first[:2]
    assert panel.older_button.isEnabled()

    qtbot.mouseClick(panel.older_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.count_label.text() == "4 runs shown", timeout=WAIT_MS)
    assert run_ids(panel) == newest_first[:4]

    qtbot.mouseClick(panel.older_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: panel.count_label.text() == "5 runs shown", timeout=WAIT_MS)
    assert run_ids(panel) == newest_first
    assert not panel.older_button.isEnabled()  # a short page: there is nothing older


def test_live_events_insert_a_started_run_and_change_it_in_place_when_it_ends(
    qtbot: QtBot, client: Client, session: Session, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    job = client.create_job("slow", "task", command=gated(gate, "echo go;"))
    client.create_job("other", "task", command="echo other")
    panel = make_panel(qtbot, session)
    panel.show_job(job["id"], "slow")
    qtbot.waitUntil(lambda: panel.count_label.text() == "no runs yet", timeout=WAIT_MS)

    feed = EventFeed(session.new_client)
    feed.events.connect(panel.on_events)
    resets: list[int] = []
    panel.model.modelReset.connect(lambda: resets.append(1))
    try:
        with qtbot.waitSignal(feed.snapshot, timeout=WAIT_MS):
            feed.start()  # events after the snapshot all reach the panel
        wait_ended(qtbot, client, client.run_now("other"))
        run_id = client.run_now("slow")
        qtbot.waitUntil(lambda: run_ids(panel) == [run_id], timeout=WAIT_MS)
        qtbot.waitUntil(lambda: cell(panel, 0, "Started") != "", timeout=WAIT_MS)
        assert cell(panel, 0, "Status") == "running"
        assert cell(panel, 0, "Who") == "admin"
        assert panel.count_label.text() == "1 run shown"

        gate.touch()
        qtbot.waitUntil(lambda: cell(panel, 0, "Status") == "succeeded (exit 0)", timeout=WAIT_MS)
        assert cell(panel, 0, "Duration") != ""
        assert run_ids(panel) == [run_id]  # the other job's run is not shown
        assert not resets  # changed in place, not reloaded
    finally:
        feed.stop()


def test_the_log_of_a_finished_run_is_shown(qtbot: QtBot, client: Client, session: Session) -> None:
    job = client.create_job("echoer", "task", command=THREE_LINES)
    run_id = client.run_now("echoer")
    wait_ended(qtbot, client, run_id)

    panel = make_panel(qtbot, session)
    panel.show_job(job["id"], "echoer")
    select(qtbot, panel, run_id)
    qtbot.waitUntil(
        lambda: panel.log_label.text() == f"Run {run_id}: ended (succeeded, exit 0)",
        timeout=WAIT_MS,
    )
    assert panel.log_view.toPlainText() == "line1\nline2\nline3\n"
    assert panel.log_view.isReadOnly()
    assert not panel.following
    assert not log_threads()


def test_a_run_without_a_log_says_why_in_the_label(
    qtbot: QtBot, client: Client, session: Session
) -> None:
    job = client.create_job("silent", "task", command="true")
    run_id = client.run_now("silent")
    wait_ended(qtbot, client, run_id)

    panel = make_panel(qtbot, session)
    panel.show_job(job["id"], "silent")
    select(qtbot, panel, run_id)
    qtbot.waitUntil(
        lambda: panel.log_label.text().startswith(f"Run {run_id} has no log"), timeout=WAIT_MS
    )
    assert panel.log_view.toPlainText() == ""
    # The session fixture checks no error dialog was asked for.


def test_a_running_task_is_followed_live_until_it_ends(
    qtbot: QtBot, client: Client, session: Session, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    job = client.create_job("talker", "task", command=gated(gate, "echo first;", "echo second;"))
    run_id = client.run_now("talker")

    panel = make_panel(qtbot, session)
    panel.show_job(job["id"], "talker")
    select(qtbot, panel, run_id)
    qtbot.waitUntil(lambda: "first" in panel.log_view.toPlainText(), timeout=WAIT_MS)
    qtbot.waitUntil(lambda: panel.log_label.text() == f"Run {run_id}: following…", timeout=WAIT_MS)
    assert "second" not in panel.log_view.toPlainText()
    assert panel.following

    gate.touch()  # the task goes on: what it writes now arrives through the follow
    qtbot.waitUntil(lambda: panel.log_view.toPlainText() == "first\nsecond\n", timeout=WAIT_MS)
    qtbot.waitUntil(
        lambda: panel.log_label.text() == f"Run {run_id}: ended (succeeded, exit 0)",
        timeout=WAIT_MS,
    )
    assert not panel.following
    assert cell(panel, 0, "Status") == "succeeded (exit 0)"  # the row learnt the end too
    assert not log_threads()


def test_closing_the_panel_while_following_stops_the_thread(
    qtbot: QtBot, client: Client, session: Session, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    job = client.create_job("quiet", "task", command=gated(gate))
    run_id = client.run_now("quiet")
    try:
        panel = make_panel(qtbot, session)
        panel.show_job(job["id"], "quiet")
        select(qtbot, panel, run_id)
        qtbot.waitUntil(lambda: panel.following, timeout=WAIT_MS)
        assert panel.log_label.text() == f"Run {run_id}: following…"
        assert panel.log_view.placeholderText() == NO_OUTPUT
        assert log_threads()

        panel.close()
        assert not log_threads()
        assert not panel.following
        panel.close()  # a second close does nothing
    finally:
        gate.touch()
    wait_ended(qtbot, client, run_id)


def test_selecting_another_run_or_job_stops_following(
    qtbot: QtBot, client: Client, session: Session, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    job = client.create_job("echoer", "task", command=THREE_LINES)
    done_id = client.run_now("echoer")
    wait_ended(qtbot, client, done_id)
    client.modify(
        [{"job": "echoer", "version": job["version"], "fields": {"command": gated(gate)}}]
    )
    live_id = client.run_now("echoer")
    try:
        panel = make_panel(qtbot, session)
        panel.show_job(job["id"], "echoer")
        select(qtbot, panel, live_id)
        qtbot.waitUntil(lambda: panel.following, timeout=WAIT_MS)

        select(qtbot, panel, done_id)
        assert not panel.following
        assert not log_threads()
        qtbot.waitUntil(
            lambda: panel.log_view.toPlainText() == "line1\nline2\nline3\n", timeout=WAIT_MS
        )

        select(qtbot, panel, live_id)
        qtbot.waitUntil(lambda: panel.following, timeout=WAIT_MS)
        panel.show_job(None)
        assert not panel.following
        assert not log_threads()
        assert panel.log_label.text() == ""
    finally:
        gate.touch()
    wait_ended(qtbot, client, live_id)
