"""The Workers & Lanes panel against a real daemon: its embedded worker, lanes, the queue.

Each test drives the panel as an operator does (select a row, press its button,
fill the lane dialog) and checks both what the panel shows and what the daemon
then holds, read back over the API with a separate client. Waits are bounded
(``WAIT_MS``); the panel's periodic refresh is stopped where a test must prove
that an event, not the clock, brought the change.
"""

from __future__ import annotations

import re
import socket
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from jobcontrol.client import Client
from jobcontrol.store import Store
from jobcontrol.store.runqueue import RunQueue, WorkerInfo
from jobcontrol_admin.window import MainWindow
from jobcontrol_admin.workers import (
    LANE_COLUMNS,
    QUEUE_COLUMNS,
    WORKER_COLUMNS,
    SlotsRole,
    WorkersPanel,
    duration_text,
    lane_state_text,
    seconds_text,
)
from tests.acceptance.harness import JobControl, describe
from tests.gui.conftest import WAIT_MS, AdminDaemon
from tests.gui.test_window import error_texts, open_window

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


def panel_of(qtbot: Any, window: MainWindow) -> WorkersPanel:
    panel = window.workers
    assert panel is not None
    window.workers_dock.show()
    window.workers_dock.raise_()
    qtbot.waitUntil(lambda: panel.refreshes > 0 and panel.permissions is not None, timeout=WAIT_MS)
    return panel


def lane_cell(panel: WorkersPanel, lane: str, column: str) -> str:
    table = panel.lane_table
    for row in range(table.rowCount()):
        item = table.item(row, 0)
        if item is not None and item.text() == lane:
            cell = table.item(row, LANE_COLUMNS.index(column))
            return cell.text() if cell is not None else ""
    raise AssertionError(f"lane {lane} is not in the panel: {list(panel.lanes)}")


def server_lane(client: Client, name: str) -> dict[str, Any]:
    return {x["name"]: x for x in client.lanes()}[name]


def test_the_panel_lists_the_embedded_worker_with_its_slots(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    panel = panel_of(qtbot, window)
    qtbot.waitUntil(lambda: panel.worker_table.rowCount() == 1, timeout=WAIT_MS)
    worker = client.workers()[0]
    table = panel.worker_table
    assert table.item(0, 0).text() == worker["name"]
    assert table.item(0, WORKER_COLUMNS.index("Host")).text() == worker["host"]
    slots = table.item(0, WORKER_COLUMNS.index("Slots"))
    assert slots.data(SlotsRole) == (0, worker["slots"])
    assert worker["slots"] == 8  # the daemon's default
    assert table.item(0, WORKER_COLUMNS.index("Heartbeat")).text().endswith("ago")

    # A running task takes a slot; the panel shows the run it holds.
    client.create_job("sleeper", "task", active=True, command="sleep 60")
    run_id = client.run_now("sleeper")
    qtbot.waitUntil(
        lambda: panel.worker_table.item(0, WORKER_COLUMNS.index("Slots")).data(SlotsRole) == (1, 8),
        timeout=WAIT_MS,
    )
    held = panel.worker_table.item(0, WORKER_COLUMNS.index("Runs held")).text()
    assert f"sleeper #{run_id}" in held, held
    assert lane_cell(panel, "default", "Running") == "1"
    client.kill("sleeper")
    qtbot.waitUntil(
        lambda: panel.worker_table.item(0, WORKER_COLUMNS.index("Slots")).data(SlotsRole) == (0, 8),
        timeout=WAIT_MS,
    )


def test_a_queued_run_shows_in_the_queue_and_is_reprioritized_from_the_panel(
    qtbot: Any, window: MainWindow, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    panel = panel_of(qtbot, window)
    client.add_lane("gpu", max_slots=1)
    client.drain_lane("gpu")  # nothing is claimed in it: its runs wait in the queue
    client.create_job("train", "task", active=True, command="true", queue="gpu")
    run_id = client.run_now("train")
    qtbot.waitUntil(lambda: any(r["run_id"] == run_id for r in panel.queue), timeout=WAIT_MS)
    table = panel.queue_table
    assert table.rowCount() == 1
    row = [table.item(0, c).text() for c in range(len(QUEUE_COLUMNS))]
    assert row[:4] == ["gpu", "1", str(run_id), "train"], row
    assert lane_cell(panel, "gpu", "Queued") == "1"
    assert lane_cell(panel, "gpu", "Oldest wait") not in ("", "—")
    assert lane_cell(panel, "gpu", "State") == "Drained"

    panel.select_queued_run(run_id)
    assert panel.reprioritize_button.isEnabled(), panel.reprioritize_button.toolTip()
    asked: list[int] = []

    def ask(run: dict[str, Any]) -> int:
        asked.append(run["run_id"])
        return 7

    monkeypatch.setattr(panel, "ask_priority", ask)
    panel.reprioritize_button.click()
    qtbot.waitUntil(lambda: [r["priority"] for r in panel.queue] == [7], timeout=WAIT_MS)
    assert asked == [run_id]
    assert client.queue("gpu")[0]["runs"][0]["priority"] == 7
    assert table.item(0, QUEUE_COLUMNS.index("Priority")).text() == "7"


def test_drain_and_resume_from_the_panel_reach_the_daemon(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    panel = panel_of(qtbot, window)
    client.add_lane("batch", max_slots=3)
    qtbot.waitUntil(lambda: "batch" in panel.lanes, timeout=WAIT_MS)
    panel.select_lane("batch")
    assert panel.drain_button.isEnabled(), panel.drain_button.toolTip()
    assert not panel.resume_button.isEnabled()  # open already
    assert "open already" in panel.resume_button.toolTip()
    panel.drain_button.click()
    qtbot.waitUntil(lambda: panel.lanes["batch"]["state"] == "draining", timeout=WAIT_MS)
    assert lane_cell(panel, "batch", "State") == "Drained"
    lane = server_lane(client, "batch")
    assert (lane["state"], lane["enabled"], lane["updated_by"]) == ("draining", False, "admin")
    # The selection stays on the lane across the refresh: resume is now the action.
    assert panel.selected_lane_name() == "batch"
    assert panel.resume_button.isEnabled()
    assert not panel.drain_button.isEnabled()
    panel.resume_button.click()
    qtbot.waitUntil(lambda: panel.lanes["batch"]["state"] == "open", timeout=WAIT_MS)
    assert server_lane(client, "batch")["enabled"] is True
    assert lane_cell(panel, "batch", "State") == "Open"


def test_editing_a_lane_with_a_bad_value_shows_the_daemons_error_and_changes_nothing(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    panel = panel_of(qtbot, window)
    client.add_lane("gpu", max_slots=2, poll_interval_s="2s")
    qtbot.waitUntil(lambda: "gpu" in panel.lanes, timeout=WAIT_MS)
    before = server_lane(client, "gpu")
    panel.select_lane("gpu")
    assert panel.edit_button.isEnabled(), panel.edit_button.toolTip()
    panel.edit_button.click()
    dialog = panel.lane_dialog
    assert dialog is not None
    assert (dialog.max_slots.text(), dialog.poll.text()) == ("2", "2s")

    # Out of the daemon's range: it refuses, the dialog shows its words and stays open.
    dialog.poll.setText("2h")
    dialog.max_slots.setText("5")
    dialog.submit()
    qtbot.waitUntil(lambda: dialog.message.text().startswith("Refused"), timeout=WAIT_MS)
    text = dialog.message.text()
    assert "poll_interval_s must be between" in text, text
    assert "gpu" in text, text
    assert dialog.isVisible()
    assert dialog.ok_button.isEnabled()
    after = server_lane(client, "gpu")
    assert {k: after[k] for k in ("max_slots", "poll_interval_s", "updated_at")} == {
        k: before[k] for k in ("max_slots", "poll_interval_s", "updated_at")
    }

    # Not a number at all: refused in the dialog before anything is sent.
    dialog.max_slots.setText("lots")
    dialog.poll.setText("2s")
    dialog.submit()
    assert "Max slots" in dialog.message.text()
    assert "'lots'" in dialog.message.text()
    assert server_lane(client, "gpu")["updated_at"] == before["updated_at"]

    # A good value: saved, the dialog closes, the panel shows it.
    dialog.max_slots.setText("4")
    dialog.submit()
    qtbot.waitUntil(lambda: panel.lane_dialog is None, timeout=WAIT_MS)
    qtbot.waitUntil(lambda: panel.lanes["gpu"]["max_slots"] == 4, timeout=WAIT_MS)
    assert server_lane(client, "gpu")["max_slots"] == 4
    assert server_lane(client, "gpu")["poll_interval_s"] == 2.0  # not sent: unchanged


def test_add_and_remove_a_lane_from_the_panel(
    qtbot: Any, window: MainWindow, client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    panel = panel_of(qtbot, window)
    panel.add_button.click()
    dialog = panel.lane_dialog
    assert dialog is not None
    dialog.name.setText("nightly")
    dialog.max_slots.setText("2")
    dialog.stale.setText("30m")
    dialog.submit()
    qtbot.waitUntil(lambda: "nightly" in panel.lanes, timeout=WAIT_MS)
    lane = server_lane(client, "nightly")
    assert (lane["max_slots"], lane["stale_timeout_s"]) == (2, 1800.0)
    assert lane_cell(panel, "nightly", "Stale") == "30m"

    panel.select_lane("default")
    assert not panel.remove_button.isEnabled()
    assert "default lane cannot be removed" in panel.remove_button.toolTip()
    panel.select_lane("nightly")
    monkeypatch.setattr(panel, "confirm", lambda _text: True)
    panel.remove_button.click()
    qtbot.waitUntil(lambda: "nightly" not in panel.lanes, timeout=WAIT_MS)
    assert "nightly" not in {x["name"] for x in client.lanes()}


def test_a_viewer_sees_the_actions_disabled_with_the_reason(
    qtbot: Any, admin_daemon: AdminDaemon, client: Client
) -> None:
    made = admin_daemon.jc.ok("user", "add", "watcher", "--role", "viewer")
    token = re.search(r"jc_\S+", made.stdout)
    assert token, describe(made)
    client.add_lane("gpu")
    client.drain_lane("gpu")
    client.create_job("train", "task", active=True, command="true", queue="gpu")
    run_id = client.run_now("train")
    window = open_window(qtbot, admin_daemon.url, token.group(0))
    try:
        panel = panel_of(qtbot, window)
        assert panel.role == "viewer"
        qtbot.waitUntil(lambda: any(r["run_id"] == run_id for r in panel.queue), timeout=WAIT_MS)
        panel.select_lane("gpu")
        panel.select_queued_run(run_id)
        for button, why in (
            (panel.resume_button, "may not resume lanes"),
            (panel.drain_button, "may not drain lanes"),
            (panel.edit_button, "may not change lane settings"),
            (panel.add_button, "may not add lanes"),
            (panel.remove_button, "may not remove lanes"),
            (panel.reprioritize_button, "may not reprioritize runs"),
        ):
            assert not button.isEnabled(), button.objectName()
            assert "Your role (viewer)" in button.toolTip(), button.toolTip()
            assert why in button.toolTip(), button.toolTip()
        # What it may see, it sees.
        assert panel.worker_table.rowCount() == 1
        assert lane_cell(panel, "gpu", "Queued") == "1"
        assert panel.refresh_button.isEnabled()
        assert not error_texts(window)
    finally:
        window.close()


def test_another_clients_drain_shows_without_a_manual_refresh(
    qtbot: Any, window: MainWindow, client: Client
) -> None:
    panel = panel_of(qtbot, window)
    client.add_lane("etl")
    qtbot.waitUntil(lambda: "etl" in panel.lanes, timeout=WAIT_MS)
    panel._periodic.stop()  # only the event stream can bring the change now
    client.drain_lane("etl")
    qtbot.waitUntil(lambda: panel.lanes["etl"]["state"] == "draining", timeout=WAIT_MS)
    assert lane_cell(panel, "etl", "State") == "Drained"


def test_the_view_menu_toggles_the_panel_and_its_layout_is_remembered(
    qtbot: Any, admin_daemon: AdminDaemon
) -> None:
    first = open_window(qtbot, admin_daemon.url, admin_daemon.token)
    qtbot.waitExposed(first)
    assert first.act_workers in first.view_menu.actions()
    assert first.act_workers.text().replace("&&", "&").replace("&W", "W") == "Workers & Lanes"
    first.workers_dock.raise_()
    first.act_workers.trigger()  # it was shown (tabbed behind the runs): now hidden
    assert not first.workers_dock.isVisible()
    first.act_workers.trigger()
    assert first.workers_dock.isVisible()
    panel = first.workers
    assert panel is not None
    panel.lane_table.setColumnWidth(0, 141)
    panel.queue_table.setColumnWidth(3, 97)
    QApplication.processEvents()
    first.workers_dock.hide()
    first.close()
    QApplication.processEvents()

    again = open_window(qtbot, admin_daemon.url, admin_daemon.token)
    try:
        qtbot.waitExposed(again)
        assert not again.workers_dock.isVisible()  # hidden when closed: hidden again
        assert not again.act_workers.isChecked()
        again.act_workers.trigger()
        assert again.workers_dock.isVisible()
        panel = again.workers
        assert panel is not None
        assert panel.lane_table.columnWidth(0) == 141
        assert panel.queue_table.columnWidth(3) == 97
    finally:
        again.close()


def test_texts_for_waits_settings_and_lane_states() -> None:
    assert [seconds_text(x) for x in (None, 0.25, 12, 245, 7380, 273600)] == [
        "",
        "0.2s",
        "12s",
        "4m 05s",
        "2h 03m",
        "3d 04h",
    ]
    assert [duration_text(x) for x in (2.0, 1800.0, 5400.0, 0.5, None)] == [
        "2s",
        "30m",
        "1h30m",
        "0.5s",
        "",
    ]
    assert lane_state_text({"state": "open"}) == "Open"
    assert lane_state_text({"state": "draining", "running": 2}) == "Draining"
    assert lane_state_text({"state": "draining", "running": 0}) == "Drained"
    stopped = {"state": "stopped", "stopped_reason": "5 worker ends in 10 minutes"}
    assert lane_state_text(stopped) == "STOPPED: 5 worker ends in 10 minutes"
    assert Qt.ItemDataRole.UserRole < SlotsRole


def test_a_stale_worker_is_greyed_and_a_stopped_one_hidden_until_asked(
    qtbot: Any, window: MainWindow, admin_daemon: AdminDaemon
) -> None:
    panel = panel_of(qtbot, window)
    store = Store(admin_daemon.jc.url)
    try:
        queue = RunQueue(store)
        long_ago = datetime.now(UTC) - timedelta(minutes=10)
        for name in ("ghost", "gone"):
            queue.register(
                WorkerInfo(name, "far-host", 4242, 4, "test", long_ago, ["gpu"]), long_ago
            )
        queue.deregister("gone", long_ago + timedelta(minutes=1))
        # Idle, heard of 90 s ago, having said it beats once a minute: not stale yet.
        queue.register(WorkerInfo("idler", "far-host", 4243, 1, "test", long_ago), long_ago)
        queue.heartbeat("idler", datetime.now(UTC) - timedelta(seconds=90), every=60.0)
        # On the daemon's host, heard of just now, but its process is not running: killed.
        dead = subprocess.Popen(["true"])
        dead.wait()
        now = datetime.now(UTC)
        queue.register(WorkerInfo("killed", socket.gethostname(), dead.pid, 1, "test", now), now)
    finally:
        store.dispose()
    # A read begun before 'gone' stopped (its registration's events start one) may show
    # it: wait for one begun after, which follows any such read.
    shown = panel.refreshes
    panel.refresh()

    def rows() -> dict[str, int]:
        table = panel.worker_table
        return {table.item(r, 0).text(): r for r in range(table.rowCount())}

    qtbot.waitUntil(lambda: panel.refreshes > shown and not panel.reading, timeout=WAIT_MS)
    assert "ghost" in rows()
    assert "gone" not in rows()  # stopped: hidden
    ghost = rows()["ghost"]
    heartbeat = panel.worker_table.item(ghost, WORKER_COLUMNS.index("Heartbeat")).text()
    assert heartbeat.startswith("STALE"), heartbeat
    assert panel.worker_table.item(ghost, 0).font().italic()
    # One filter group of 4 slots, in --queues form (a slot group names its slots).
    assert panel.worker_table.item(ghost, WORKER_COLUMNS.index("Groups")).text() == "gpu:4"
    idler = panel.worker_table.item(rows()["idler"], WORKER_COLUMNS.index("Heartbeat")).text()
    assert not idler.startswith("STALE"), idler
    assert not panel.worker_table.item(rows()["idler"], 0).font().italic()
    killed = rows()["killed"]
    heartbeat = panel.worker_table.item(killed, WORKER_COLUMNS.index("Heartbeat")).text()
    assert heartbeat.startswith("GONE — "), heartbeat
    assert "is not running" in panel.worker_table.item(killed, 0).toolTip()
    assert panel.worker_table.item(killed, 0).font().italic()
    live = next(name for name in rows() if name not in ("ghost", "idler", "killed"))
    assert not panel.worker_table.item(rows()[live], 0).font().italic()
    panel.show_stopped.setChecked(True)
    assert "gone" in rows()
    stopped = panel.worker_table.item(rows()["gone"], WORKER_COLUMNS.index("Heartbeat"))
    assert stopped.text().startswith("stopped")


@pytest.fixture
def pg_daemon(postgres_url: str, tmp_path: Path) -> Iterator[AdminDaemon]:
    """A daemon on PostgreSQL that runs no tasks itself, and worker build-1 (a process of
    its own, as on another host) with two slot groups."""
    jc = JobControl(postgres_url, tmp_path / "user")
    try:
        jc.upgraded()
        jc.ok("daemon", "start", "--slots", "0")
        status = jc.ok("daemon", "status")
        match = re.search(r"admin API: (\S+)/api/v1", status.stdout)
        assert match, describe(status)
        jc.ok("worker", "start", "--name", "build-1", "--queues", "fast:1 manual,*:2")
        yield AdminDaemon(jc, match.group(1), jc.token_file.read_text().strip())
    finally:
        problems = jc.cleanup()
    assert not problems, "\n".join(problems)


def worker_row(panel: WorkersPanel, name: str) -> int:
    table = panel.worker_table
    for row in range(table.rowCount()):
        item = table.item(row, 0)
        if item is not None and item.text() == name:
            return row
    raise AssertionError(f"worker {name} is not in the panel: {list(panel.workers)}")


@pytest.mark.postgres
def test_on_postgresql_the_panel_shows_a_remote_worker_and_steers_its_lane(
    qtbot: Any, pg_daemon: AdminDaemon
) -> None:
    window = open_window(qtbot, pg_daemon.url, pg_daemon.token)
    try:
        panel = panel_of(qtbot, window)
        with Client(pg_daemon.url, pg_daemon.token) as client:
            qtbot.waitUntil(lambda: panel.worker_table.rowCount() == 1, timeout=WAIT_MS)
            row = worker_row(panel, "build-1")  # the daemon's own worker: none (--slots 0)
            cell = panel.worker_table.item
            assert cell(row, WORKER_COLUMNS.index("Groups")).text() == "fast:1  manual,*:2"
            assert cell(row, WORKER_COLUMNS.index("Slots")).data(SlotsRole) == (0, 3)

            # A run on the remote worker: its slot and the run it holds, in the panel.
            client.create_job("sleeper", "task", active=True, command="sleep 60")
            first = client.run_now("sleeper")
            qtbot.waitUntil(
                lambda: cell(worker_row(panel, "build-1"), WORKER_COLUMNS.index("Slots")).data(
                    SlotsRole
                )
                == (1, 3),
                timeout=WAIT_MS,
            )
            held = cell(worker_row(panel, "build-1"), WORKER_COLUMNS.index("Runs held")).text()
            assert f"sleeper #{first}" in held, held

            # Drained from the panel: the remote worker claims nothing more in the lane.
            client.add_lane("nightly")
            client.create_job("report", "task", active=True, command="true", queue="nightly")
            qtbot.waitUntil(lambda: "nightly" in panel.lanes, timeout=WAIT_MS)
            panel.select_lane("nightly")
            panel.drain_button.click()
            qtbot.waitUntil(lambda: panel.lanes["nightly"]["state"] == "draining", timeout=WAIT_MS)
            waiting = client.run_now("report")
            qtbot.waitUntil(
                lambda: any(r["run_id"] == waiting for r in panel.queue), timeout=WAIT_MS
            )
            assert lane_cell(panel, "nightly", "Queued") == "1"
            # Resumed from the panel: the worker claims it (a NOTIFY, not a poll) and it ends.
            panel.select_lane("nightly")
            panel.resume_button.click()
            qtbot.waitUntil(lambda: not panel.queue, timeout=WAIT_MS)
            qtbot.waitUntil(
                lambda: client.runs("report")["runs"][0]["state"] == "succeeded", timeout=WAIT_MS
            )
            assert client.runs("report")["runs"][0]["worker"] == "build-1"
            client.kill("sleeper")
            qtbot.waitUntil(
                lambda: cell(worker_row(panel, "build-1"), WORKER_COLUMNS.index("Slots")).data(
                    SlotsRole
                )
                == (0, 3),
                timeout=WAIT_MS,
            )
    finally:
        window.close()
