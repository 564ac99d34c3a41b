"""A capped lane under load, across three real ``jobcontrol worker`` processes.

Real PostgreSQL, the real daemon (``--slots 0``: it runs no tasks) and three workers
of 4 slots each started by the CLI, all competing for the lane ``burst``. What the
lane promised is checked afterwards from the run rows: each task run's claim interval
(``started`` .. ``ended``) and its worker.

The runs are queued the way a burst arrives in production: one ``load`` of many
top-level trees whose ``at`` time is already past, so each tree's timer fires as
soon as it is armed (``misfire: run-once``) and every run is queued by the
dispatcher in a few batched transactions, while the lane is drained; ``lane resume``
then lets them all be claimed at once.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from collections.abc import Iterator, Sequence
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import Row, func, select

from jobcontrol.store import Store
from jobcontrol.store.schema import run, worker_end
from tests.acceptance.harness import JobControl, wait_until, write
from tests.acceptance.hosts import Hosts
from tests.acceptance.test_acc_remote_worker import worker_pid

pytestmark = [pytest.mark.timeout(300), pytest.mark.postgres]

log = logging.getLogger(__name__)

LANE = "burst"
WORKERS = ("w1", "w2", "w3")
SLOTS = 4  # per worker: 12 slots compete for the lane's few
POLL = 0.5  # the lane's poll interval: how long a drained lane is watched for a claim
WAIT = 60.0


@pytest.fixture
def db(jcpg: JobControl) -> Iterator[Store]:
    """The test's own reader of the database (cheaper to poll than the CLI)."""
    store = Store(jcpg.url)
    yield store
    store.dispose()


def trees(names: Sequence[str], command: str, *, priorities: Sequence[int] = ()) -> str:
    """Top-level tasks of the lane (``run_all`` runs them, in this order)."""
    lines = ["jobs:"]
    for i, name in enumerate(names):
        lines += [
            f"  - name: {name}",
            f"    command: {command!r}",
            f"    queue: {LANE}",
            "    active: true",
        ]
        if priorities:
            lines.append(f"    priority: {priorities[i]}")
    return "\n".join(lines) + "\n"


def lane_runs(db: Store) -> list[Row[Any]]:
    """The lane's task runs, oldest first."""
    stmt = (
        select(
            run.c.id,
            run.c.job_name,
            run.c.state,
            run.c.exit_status,
            run.c.priority,
            run.c.started,
            run.c.ended,
            run.c.worker,
            run.c.attempt,
            run.c.reason,
            run.c.pid,
        )
        .where(run.c.kind == "task", run.c.queue == LANE)
        .order_by(run.c.id)
    )
    with db.read() as conn:
        return list(conn.execute(stmt))


def count(db: Store, *states: str) -> int:
    stmt = select(func.count()).where(
        run.c.kind == "task", run.c.queue == LANE, run.c.state.in_(states)
    )
    with db.read() as conn:
        return int(conn.execute(stmt).scalar_one())


def most_at_once(rows: Sequence[Row[Any]]) -> tuple[int, datetime | None]:
    """The most claim intervals (``started`` .. ``ended``) open at one instant, and when.

    An end and a start at the same instant are a hand-over, not an overlap."""
    edges = sorted([(r.started, 1) for r in rows] + [(r.ended, -1) for r in rows])
    most, when, now = 0, None, 0
    for at, step in edges:
        now += step
        if now > most:
            most, when = now, at
    return most, when


def start_workers(jc: JobControl, hosts: Hosts, slots: int = SLOTS) -> None:
    """The three workers, started side by side where the test places them."""
    hosts.start(*WORKERS, slots=slots)
    live = {w["name"]: w for w in jc.json("workers") if w["stopped"] is None}
    assert {n: (live[n]["slots"], live[n]["host"]) for n in WORKERS} == {
        n: (slots, hosts.host_of(n)) for n in WORKERS
    }, live


def lane(jc: JobControl) -> dict[str, Any]:
    [row] = [x for x in jc.json("lanes") if x["name"] == LANE]
    return dict(row)


def run_all(jc: JobControl, names: Sequence[str]) -> None:
    """Run each job now, in this order, through the daemon's API (one client: a CLI
    process per run would take minutes for a burst)."""
    import httpx

    base = next(jc.state_dir.glob("daemon-*.url")).read_text().strip()
    headers = {"Authorization": f"Bearer {jc.token_file.read_text().strip()}"}
    with httpx.Client(base_url=f"{base}/api/v1", headers=headers, timeout=30) as client:
        for name in names:
            reply = client.post(f"/jobs/{name}/run")
            assert reply.status_code == 202, reply.text


def queue_drained(jc: JobControl, db: Store, yaml: str, names: Sequence[str]) -> list[Row[Any]]:
    """Load the trees into the drained lane and run them; wait until their runs are all
    queued."""
    jc.load(write(jc.base / "burst.yaml", yaml))
    run_all(jc, names)
    expected = len(names)
    assert wait_until(
        lambda: count(db, "queued") == expected, WAIT
    ), f"{count(db, 'queued')} of {expected} runs queued"
    # Drained: the workers were told of the runs and claim none.
    assert not wait_until(lambda: count(db, "running", "succeeded") > 0, 3 * POLL)
    return lane_runs(db)


def test_a_burst_of_500_runs_never_exceeds_the_lane_cap_across_three_workers(
    jcpg: JobControl, db: Store, hosts: Hosts
) -> None:
    jc, cap, runs = jcpg, 3, 500
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("lane", "add", LANE, f"max_slots={cap}", f"poll={POLL:g}s")
    jc.ok("lane", "drain", LANE)
    start_workers(jc, hosts)
    names = [f"b{i:03}" for i in range(runs)]
    queue_drained(jc, db, trees(names, "true"), names)

    began = time.monotonic()
    jc.ok("lane", "resume", LANE)
    assert wait_until(
        lambda: count(db, "queued", "running") == 0, 120.0, interval=0.2
    ), f"{count(db, 'queued', 'running')} runs not done"
    took = time.monotonic() - began
    log.info("%d runs through a lane of %d slots on 3 workers: %.1fs", runs, cap, took)

    rows = lane_runs(db)
    # Every run succeeded exactly once: one row per job, no retry, no second completion.
    assert sorted(r.job_name for r in rows) == names
    bad = [r for r in rows if (r.state, r.exit_status, r.attempt) != ("succeeded", 0, 1)]
    assert not bad, bad[:5]
    assert all(r.started is not None and r.ended is not None for r in rows)
    # The cap held at every instant, and was used: 12 slots wanted more.
    most, when = most_at_once(rows)
    assert most == cap, f"{most} runs of the lane at once at {when} (max_slots={cap})"
    # Only the three workers ran them. How they shared the lane is not promised: a
    # freed slot goes first to the worker whose run ended (README "Lanes").
    per_worker = {w: sum(r.worker == w for r in rows) for w in WORKERS}
    assert sum(per_worker.values()) == runs, per_worker
    log.info("runs per worker: %s", per_worker)
    now = lane(jc)
    assert (now["state"], now["running"], now["queued"]) == ("open", 0, 0), now


def test_claims_follow_priority_then_age_when_a_drained_lane_resumes(
    jcpg: JobControl, db: Store, hosts: Hosts
) -> None:
    jc = jcpg
    order_file = jc.base / "order.txt"
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("lane", "add", LANE, "max_slots=1", f"poll={POLL:g}s")
    jc.ok("lane", "drain", LANE)
    start_workers(jc, hosts)
    priorities = {"low1": 0, "high1": 5, "mid": 2, "high2": 5, "low2": 0, "top": 9, "low3": 0}
    yaml = trees(
        list(priorities),
        f'echo "$JOBCONTROL_JOB" >> {order_file}',
        priorities=list(priorities.values()),
    )
    queued = queue_drained(jc, db, yaml, list(priorities))
    assert {r.job_name: r.priority for r in queued} == priorities
    # An operator moves one queued run up, between top and the fives.
    [low3] = [r for r in queued if r.job_name == "low3"]
    jc.ok("reprioritize", str(low3.id), "7")
    by_name = {r.job_name: r for r in lane_runs(db)}
    expected = sorted(by_name, key=lambda n: (-by_name[n].priority, by_name[n].id))
    assert expected[:2] == ["top", "low3"], expected

    jc.ok("lane", "resume", LANE)
    assert wait_until(lambda: count(db, "succeeded") == len(priorities), WAIT), lane_runs(db)
    # One slot: each task ran alone, in claim order (what the tasks themselves wrote).
    assert order_file.read_text().split() == expected
    rows = lane_runs(db)
    assert most_at_once(rows)[0] == 1
    assert [r.job_name for r in sorted(rows, key=lambda r: r.started)] == expected


def test_a_drain_stops_new_claims_while_running_runs_finish_and_resume_restarts_them(
    jcpg: JobControl, db: Store, hosts: Hosts
) -> None:
    jc, cap = jcpg, 3
    go = jc.base / "go"
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("lane", "add", LANE, f"max_slots={cap}", f"poll={POLL:g}s")
    start_workers(jc, hosts)
    names = [f"d{i}" for i in range(2 * cap)]
    jc.load(write(jc.base / "d.yaml", trees(names, f"while [ ! -e {go} ]; do sleep 0.05; done")))
    run_all(jc, names)
    assert wait_until(
        lambda: count(db, "running") == cap and count(db, "queued") == cap, WAIT
    ), lane_runs(db)
    holding = {r.id for r in lane_runs(db) if r.state == "running"}

    jc.ok("lane", "drain", LANE)
    assert lane(jc)["state"] == "draining"
    go.touch()  # the running ones end on their own ...
    assert wait_until(lambda: count(db, "succeeded") == cap, WAIT), lane_runs(db)
    # ... and nothing new is claimed while the lane is drained, with 12 idle slots.
    assert not wait_until(lambda: count(db, "queued") < cap, 3 * POLL), lane_runs(db)
    finished = {r.id for r in lane_runs(db) if r.state == "succeeded"}
    assert finished == holding
    now = lane(jc)
    assert (now["state"], now["running"], now["queued"]) == ("draining", 0, cap), now

    jc.ok("lane", "resume", LANE)
    assert wait_until(lambda: count(db, "succeeded") == 2 * cap, WAIT), lane_runs(db)
    assert lane(jc)["state"] == "open"


def test_five_kill_9s_of_workers_holding_lane_runs_stop_the_lane_until_resumed(
    jcpg: JobControl, db: Store, hosts: Hosts
) -> None:
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    # A 3 s lease: a worker killed with -9 loses its run within seconds.
    jc.ok("lane", "add", LANE, "stale=3s", f"poll={POLL:g}s")
    start_workers(jc, hosts, slots=1)
    jc.load(
        write(
            jc.base / "hang.yaml",
            f"jobs:\n  - name: hang\n    command: sleep 1000\n    queue: {LANE}\n",
        )
    )

    killed: list[str] = []
    for kill in range(1, 6):
        before = {r.id for r in lane_runs(db)}
        jc.ok("run", "hang")
        assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="hang"), WAIT), lane_runs(db)
        [held] = [r for r in lane_runs(db) if r.id not in before]
        assert (held.state, held.worker in WORKERS) == ("running", True), held
        pid = worker_pid(jc, held.worker)
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        killed.append(held.worker)
        assert wait_until(lambda r=held.id: _state(db, r) == "lost", WAIT), lane_runs(db)
        [lost] = [r for r in lane_runs(db) if r.id == held.id]
        assert f"worker {held.worker} stopped renewing its lease" in lost.reason, lost
        if kill < 5:
            assert lane(jc)["state"] == "open", f"stopped after {kill} worker ends"
        hosts.start(held.worker, slots=1)
        # What it left is killed with the run: by the dispatcher on its own host, by
        # the restarted worker on another.
        jc.assert_no_task_processes()

    now = lane(jc)
    assert now["state"] == "stopped", now
    reason = now["stopped_reason"]
    assert "5 unexpected worker ends within 10 minutes" in reason, reason
    assert all(w in reason for w in set(killed)), (killed, reason)
    assert f"lane {LANE} STOPPED" in jc.ok("status").stdout
    # `lanes` says why on a line under its table, not in the STATE column of every row.
    shown = jc.ok("lanes").stdout.splitlines()
    assert shown[-1] == f"lane {LANE} STOPPED: {reason}", shown
    assert all(reason not in line for line in shown[:-1]), shown
    [row] = [line.split() for line in shown if line.startswith(f"{LANE} ")]
    assert row[1] == "stopped", shown
    trail = [(e["user"], e["operation"]) for e in jc.json("audit")]
    assert ("dispatcher", "lane.stop") in trail, trail

    # STOPPED: three live workers with free slots claim nothing of it.
    before = {r.id for r in lane_runs(db)}
    jc.ok("run", "hang")
    assert not wait_until(lambda: count(db, "running") > 0, 3 * POLL), lane_runs(db)
    [waiting] = [r for r in lane_runs(db) if r.id not in before]
    assert waiting.state == "queued", waiting

    jc.ok("lane", "resume", LANE)
    assert wait_until(lambda: _state(db, waiting.id) == "running", WAIT), lane_runs(db)
    assert lane(jc)["state"] == "open"
    jc.ok("kill", "hang")
    assert wait_until(lambda: _state(db, waiting.id) == "killed", WAIT), lane_runs(db)


def _state(db: Store, run_id: int) -> str | None:
    with db.read() as conn:
        return conn.execute(select(run.c.state).where(run.c.id == run_id)).scalar()


def test_five_workers_restarted_at_once_after_kill_9_stop_the_lane_too(
    jcpg: JobControl, db: Store, hosts: Hosts
) -> None:
    """A supervisor (systemd ``Restart=``) restarts a crashed worker at once, long before
    its lease would run out: the new process settles what the killed one held. Those
    are unexpected worker ends as well, counted once per death, and the fifth STOPs
    the lane."""
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("lane", "add", LANE, "stale=30m", f"poll={POLL:g}s")  # no lease runs out here
    hosts.start("w1", slots=2)
    # Two runs held per death: each death still counts once.
    jc.load(
        write(
            jc.base / "hang.yaml",
            "jobs:\n"
            + "".join(
                f"  - name: hang{i}\n    command: sleep 1000\n    queue: {LANE}\n" for i in (1, 2)
            ),
        )
    )
    for death in range(1, 6):
        before = {r.id for r in lane_runs(db)}
        jc.ok("run", "hang1")
        jc.ok("run", "hang2")
        assert wait_until(
            lambda b=before: len([r for r in lane_runs(db) if r.id not in b and r.pid]) == 2,
            WAIT,
        ), lane_runs(db)
        pid = worker_pid(jc, "w1")
        assert pid is not None
        os.kill(pid, signal.SIGKILL)
        hosts.start("w1", slots=2)
        assert wait_until(
            lambda b=before: [r.state for r in lane_runs(db) if r.id not in b] == ["lost"] * 2,
            WAIT,
        ), lane_runs(db)
        assert all(
            "its worker w1 restarted" in r.reason for r in lane_runs(db) if r.id not in before
        )
        # The dispatcher hears of both ends (each on its own) and counts one death.
        assert wait_until(lambda d=death: ends(db) >= d, WAIT), ends(db)
        assert ends(db) == death, "one death, however many runs it held"
        # The dispatcher reacts to the two ends one by one: the death is counted at the
        # first, and the other tree is still busy until the second.
        assert wait_until(lambda: _idle(jc, "hang1", "hang2"), WAIT), jc.ok("ls").stdout
        if death < 5:
            assert lane(jc)["state"] == "open", f"stopped after {death} deaths"
    assert wait_until(lambda: lane(jc)["state"] == "stopped", WAIT), lane(jc)
    assert "5 unexpected worker ends within 10 minutes" in lane(jc)["stopped_reason"]
    trail = [(e["user"], e["operation"]) for e in jc.json("audit")]
    assert trail.count(("dispatcher", "lane.stop")) == 1, trail


def _idle(jc: JobControl, *names: str) -> bool:
    """Whether every named job is idle, as ``ls`` shows it."""
    states = {j["name"]: j["state"] for j in jc.json("ls")}
    return all(states.get(name) == "idle" for name in names)


def ends(db: Store) -> int:
    """Unexpected worker ends the dispatcher recorded for the lane."""
    with db.read() as conn:
        stmt = select(func.count()).select_from(worker_end).where(worker_end.c.lane == LANE)
        return int(conn.execute(stmt).scalar() or 0)
