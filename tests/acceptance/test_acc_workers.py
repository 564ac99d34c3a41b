"""``jobcontrol workers``: the worker registry through the running daemon, then from the database."""

from __future__ import annotations

import re
import socket
from datetime import datetime

import pytest

from tests.acceptance.harness import JobControl, describe, pid_from, wait_until, write

pytestmark = pytest.mark.timeout(180)

TREE = """\
jobs:
  - name: sleeper
    command: sleep 1000
"""
WAIT = 30.0
HEADERS = ["NAME", "HOST", "PID", "SLOTS", "QUEUES", "HEARTBEAT", "RUNS"]


def test_workers_online_while_the_daemon_runs_and_offline_after_it_stopped(
    jc: JobControl,
) -> None:
    jc.upgraded().load(write(jc.base / "tree.yaml", TREE))
    pid = pid_from(jc.ok("daemon", "start").stdout)
    name = f"{socket.gethostname()}:{pid}:embedded"

    # Online: the daemon's embedded worker, 8 slots by default, holding the task it runs.
    started = jc.ok("run", "sleeper")
    run_id = int(re.search(r"started run (\d+)", started.stdout).group(1))  # type: ignore[union-attr]
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT), "sleeper never started"
    [w] = jc.json("workers")
    assert (w["name"], w["host"], w["pid"]) == (name, socket.gethostname(), pid)
    assert (w["slots"], w["used"], w["free"]) == (8, 1, 7)
    assert (w["queues"], w["stopped"]) == (None, None)
    assert datetime.fromisoformat(w["heartbeat"]).tzinfo is not None
    assert [(r["run_id"], r["job"]) for r in w["runs"]] == [(run_id, "sleeper")]
    table = jc.ok("workers")
    header, row = table.stdout.splitlines()
    assert header.split() == HEADERS, describe(table)
    assert row.split()[:5] == [name, socket.gethostname(), str(pid), "1/8", "*"], describe(table)
    assert re.search(r" \d+\w* ago ", row), describe(table)
    assert re.search(rf"{run_id}:sleeper\(since \d\d:\d\d:\d\d\)$", row), describe(table)

    jc.ok("daemon", "stop", "--kill")
    jc.assert_no_task_processes()
    assert jc.live_daemons() == []

    # Offline, straight from the database: the same worker, stopped, holding nothing.
    [w] = jc.json("workers")
    assert (w["name"], w["slots"], w["used"], w["runs"]) == (name, 8, 0, [])
    assert w["stopped"] is not None
    assert datetime.fromisoformat(w["stopped"]) >= datetime.fromisoformat(w["started"])
    table = jc.ok("workers")
    header, row = table.stdout.splitlines()
    assert header.split() == HEADERS, describe(table)
    assert re.search(r" stopped \d\d \w{3} \d{4} \d\d:\d\d:\d\d +-$", row), describe(table)
