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
HEADERS = ["NAME", "HOST", "PID", "SLOTS", "GROUPS", "HEARTBEAT", "RUNS"]


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
    assert w["groups"] == [{"queues": ["*"], "slots": 8, "used": 1, "runs": [run_id]}]
    assert datetime.fromisoformat(w["heartbeat"]).tzinfo is not None
    assert [(r["run_id"], r["job"]) for r in w["runs"]] == [(run_id, "sleeper")]
    table = jc.ok("workers")
    header, row = table.stdout.splitlines()
    assert header.split() == HEADERS, describe(table)
    assert row.split()[:5] == [name, socket.gethostname(), str(pid), "1/8", "*:1/8"], describe(
        table
    )
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


GROUPED = """\
jobs:
  - name: quick
    command: sleep 1000
    queue: fast_lane
  - name: other
    command: sleep 1000
"""


def test_the_daemon_worker_takes_slot_groups_and_workers_shows_their_use(
    jc: JobControl,
) -> None:
    jc.upgraded().load(write(jc.base / "tree.yaml", GROUPED))
    # Filter groups both: a preference group (manual,*) would race the pinned one for
    # the fast lane's run, as it may.
    pid = pid_from(jc.ok("daemon", "start", "--queues", "fast_lane:1 default:2").stdout)
    name = f"{socket.gethostname()}:{pid}:embedded"
    jc.ok("run", "quick")
    jc.ok("run", "other")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="quick"), WAIT), "quick never started"
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="other"), WAIT), "other never started"

    def groups() -> list[tuple[list[str], int, int]]:
        [w] = jc.json("workers")
        assert (w["name"], w["slots"], w["used"]) == (name, 3, 2)
        assert w["queues"] == ["fast_lane", "default"]
        return [(g["queues"], g["slots"], g["used"]) for g in w["groups"]]

    # The fast lane's run in the pinned group, the other in the default one: as the
    # worker reports them (each heartbeat and lane re-read).
    want = [(["fast_lane"], 1, 1), (["default"], 2, 1)]
    assert wait_until(lambda: groups() == want, WAIT), groups()
    table = jc.ok("workers")
    assert " fast_lane:1/1 default:1/2 " in table.stdout, describe(table)
    jc.ok("daemon", "stop", "--kill")
    jc.assert_no_task_processes()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--queues", "fast_lane"], "--queues: 'fast_lane' has no slot count"),
        (["--queues", "fast:1 manual,*:x"], "'manual,*:x': the slot count must be a whole"),
        (["--queues", "*,fast:2"], "'*,fast:2': '*' must come last in its group"),
        (["--queues", "a b:1"], "'a' has no slot count"),
        (["--slots", "3", "--queues", "*:3"], "--slots and --queues: give one, not both"),
    ],
)
def test_a_bad_queues_spec_is_refused_naming_the_part_and_nothing_starts(
    jc_sqlite: JobControl, args: list[str], message: str
) -> None:
    jc = jc_sqlite
    jc.upgraded()
    for command in ("run", "start"):
        result = jc.fails("daemon", command, *args)
        assert message in result.stderr, describe(result)
        assert jc.live_daemons() == []
        assert not list(jc.state_dir.glob("*.pid")), "nothing was started"
    assert jc.json("workers") == [], "no worker joined"


ODD_QUEUE = """\
jobs:
  - name: rendering
    command: echo rendered
    queue: gpu+x
"""


def test_a_worker_serves_by_name_a_lane_whose_name_lane_add_took(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    jc.upgraded().load(write(jc.base / "tree.yaml", ODD_QUEUE))
    jc.ok("lane", "add", "gpu+x", "max_slots=1")
    # The lane's own group, and no other: the run is claimed by that name or never.
    jc.ok("daemon", "start", "--queues", "gpu+x:1")
    jc.ok("run", "rendering")
    assert wait_until(
        lambda: [r["state"] for r in jc.history("rendering")] == ["succeeded"], WAIT
    ), jc.history("rendering")
    [w] = jc.json("workers")
    assert [g["queues"] for g in w["groups"]] == [["gpu+x"]]
    jc.ok("daemon", "stop")
