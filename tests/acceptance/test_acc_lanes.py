"""Lanes with the real daemon and CLI: a change reaches the running worker, no restart.

Drain a lane, run a job of its queue: the run stays queued (``jobcontrol
queue`` shows it). Resume it: the run runs. Then the same resume made behind
the daemon's back (another process writes the lane row, as an admin on another
host would): the worker sees it at its next back-up poll, within the lane's
poll interval.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import UTC, datetime

import pytest
from sqlalchemy import update

from jobcontrol.store import Store
from jobcontrol.store.schema import lane
from tests.acceptance.harness import JobControl, describe, wait_until, write

pytestmark = pytest.mark.timeout(180)

TREE = """\
jobs:
  - name: batchjob
    command: "true"
    queue: batch
"""
WAIT = 30.0
POLL = 0.5  # the lane's poll interval, set through the CLI


def run_state(jc: JobControl, run_id: int) -> str:
    runs = jc.json("history", "batchjob")
    return str(next(r["state"] for r in runs if r["id"] == run_id))


def start_run(jc: JobControl) -> int:
    started = jc.ok("run", "batchjob")
    return int(re.search(r"started run (\d+)", started.stdout).group(1))  # type: ignore[union-attr]


def test_a_lane_change_reaches_the_running_worker_without_a_restart(jc: JobControl) -> None:
    jc.upgraded().load(write(jc.base / "tree.yaml", TREE))
    jc.ok("daemon", "start")
    added = jc.ok("lane", "add", "batch", f"poll={POLL:g}s")
    assert "added lane batch" in added.stdout, describe(added)
    jc.ok("lane", "drain", "batch")

    run_id = start_run(jc)
    # The embedded worker was offered the run at once and turned it down: it stays queued.
    [batch] = [x for x in jc.json("queue") if x["lane"] == "batch"]
    assert [r["run_id"] for r in batch["runs"]] == [run_id]
    assert batch["state"] == "draining"
    assert not wait_until(lambda: run_state(jc, run_id) != "queued", 3 * POLL), "drained"
    table = jc.ok("queue", "--lane", "batch")
    assert re.search(rf"^batch +1 +{run_id} +batchjob +batch +0 ", table.stdout, re.M), describe(
        table
    )
    # Nothing of it runs: drained, as the admin client says it, not still "draining".
    lanes = jc.ok("lanes")
    assert re.search(r"^batch +drained +- +0 +1 ", lanes.stdout, re.M), describe(lanes)
    # history's STARTED says it has not started: when it was queued, marked as such.
    listed = jc.ok("history", "batchjob").stdout
    row = next(line for line in listed.splitlines() if line.startswith(f"{run_id} "))
    assert re.search(r" queued +queued \d\d [A-Z][a-z]{2} \d{4} [\d:]{8} ", row), listed

    jc.ok("lane", "resume", "batch")
    assert wait_until(lambda: run_state(jc, run_id) == "succeeded", WAIT), "resumed: it runs"

    # Behind the daemon's back: only the back-up poll can see this. Each time the run has
    # waited long enough for an idle worker's back-off to reach 5 poll intervals; the lane's
    # change must reach it within one, every time.
    for _ in range(3):
        jc.ok("lane", "drain", "batch")
        queued = start_run(jc)
        assert not wait_until(lambda r=queued: run_state(jc, r) != "queued", 6 * POLL)
        store = Store(jc.url)
        try:
            with store.write() as conn:
                conn.execute(update(lane).where(lane.c.name == "batch").values(enabled=True))
            resumed = datetime.now(UTC)
        finally:
            store.dispose()
        assert wait_until(lambda r=queued: run_state(jc, r) == "succeeded", WAIT)
        started = next(r["started"] for r in jc.json("history", "batchjob") if r["id"] == queued)
        took = (datetime.fromisoformat(started) - resumed).total_seconds()
        assert took < POLL + 0.5, f"the worker saw the resumed lane after {took:.2f}s"
    [lanes] = [x for x in jc.json("lanes") if x["name"] == "batch"]
    assert (lanes["state"], lanes["poll_interval_s"]) == ("open", POLL)
    jc.ok("daemon", "stop")


@pytest.mark.postgres
def test_on_postgresql_a_lane_written_by_anyone_reaches_the_worker_at_once(
    postgres_url: str, make_jc: Callable[[str], JobControl]
) -> None:
    """The worker does not read the lane table every poll interval on PostgreSQL: a
    trigger announces each write to it, whoever made it. With every lane's poll interval
    a minute, a resume made in an SQL session must still start the queued run at once."""
    jc = make_jc(postgres_url)
    jc.upgraded().load(write(jc.base / "tree.yaml", TREE))
    jc.ok("daemon", "start")
    jc.ok("lane", "add", "batch", "poll=60s")
    jc.ok("lane", "set", "default", "poll=60s")  # the worker's claims back off to a minute
    store = Store(jc.url)
    try:
        with store.write() as conn:
            conn.execute(update(lane).where(lane.c.name == "batch").values(enabled=False))
        queued = start_run(jc)
        assert not wait_until(lambda: run_state(jc, queued) != "queued", 2.0), "drained"
        with store.write() as conn:
            conn.execute(update(lane).where(lane.c.name == "batch").values(enabled=True))
        resumed = datetime.now(UTC)
    finally:
        store.dispose()
    assert wait_until(lambda: run_state(jc, queued) == "succeeded", WAIT)
    started = next(r["started"] for r in jc.json("history", "batchjob") if r["id"] == queued)
    took = (datetime.fromisoformat(started) - resumed).total_seconds()
    assert took < 3.0, f"the worker saw the resumed lane after {took:.2f}s (its poll: 60 s)"
    jc.ok("daemon", "stop")


PARKED = """\
jobs:
  - name: parked
    active: true
    command: "echo parked"
    queue: slow
  - name: Busy
    active: true
    children:
      - {name: busy-task, active: true, command: "sleep 1000"}
"""


def test_a_stop_keeps_the_work_parked_in_a_drained_lane(jc_sqlite: JobControl) -> None:
    """An operator restarts the daemon (an upgrade) with work parked in a drained lane:
    ``daemon stop`` stops it and says the parked run is left for the next start, which
    runs it once the lane is resumed. It refused, calling the run that never started
    running, and ``--kill`` then killed it (found by an outside trial). A tree whose task
    runs on the daemon's own worker still stops the stop, and only it is named."""
    jc = jc_sqlite.upgraded()
    jc.ok("lane", "add", "slow")
    jc.ok("lane", "drain", "slow")
    jc.load(write(jc.base / "parked.yaml", PARKED))
    jc.ok("daemon", "start")
    queued = int(re.search(r"run (\d+)", jc.ok("run", "parked").stdout).group(1))  # type: ignore[union-attr]
    jc.ok("run", "Busy")
    assert wait_until(lambda: [r["state"] for r in jc.history("busy-task")] == ["running"], WAIT)

    refused = jc.fails("daemon", "stop")
    assert "jobs are running (Busy)" in refused.stderr, describe(refused)
    jc.ok("kill", "Busy")

    stopped = jc.ok("daemon", "stop")
    assert "left in flight" in stopped.stdout, describe(stopped)
    assert "parked" in stopped.stdout
    assert jc.live_daemons() == []
    assert [(r["id"], r["state"]) for r in jc.history("parked")] == [(queued, "queued")]

    jc.ok("daemon", "start")
    jc.ok("lane", "resume", "slow")
    assert wait_until(
        lambda: [(r["id"], r["state"]) for r in jc.history("parked")] == [(queued, "succeeded")],
        WAIT,
    ), jc.history("parked")
    jc.ok("daemon", "stop")


@pytest.mark.parametrize("online", [False, True])
@pytest.mark.parametrize(
    ("pairs", "says"),
    [
        (["max_slots=2", "max_slots=3"], "lane 'batch': max_slots given twice"),
        (["poll=1s", "poll_interval_s=2s"], "lane 'batch': poll_interval_s given twice"),
    ],
)
def test_a_setting_given_twice_is_refused_and_the_lane_stays_as_it_was(
    jc_sqlite: JobControl, online: bool, pairs: list[str], says: str
) -> None:
    jc = jc_sqlite
    jc.upgraded()
    jc.ok("lane", "add", "batch", "max_slots=1", "poll=5s")
    if online:
        jc.ok("daemon", "start")
    for command in (["lane", "set", "batch"], ["lane", "add", "other"]):
        refused = jc.fails(*command, *pairs)
        assert says.replace("'batch'", repr(command[2])) in refused.stderr, describe(refused)
    lanes = {row["name"]: row for row in jc.json("lanes")}
    assert (lanes["batch"]["max_slots"], lanes["batch"]["poll_interval_s"]) == (1, 5.0)
    assert "other" not in lanes
    if online:
        jc.ok("daemon", "stop")
