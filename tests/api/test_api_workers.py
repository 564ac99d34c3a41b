"""The worker registry route: ``GET /api/v1/workers`` over a real dispatcher and its embedded worker."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from datetime import datetime, timedelta
from typing import Any

import pytest

from jobcontrol import RunState
from jobcontrol.cli.output import table_workers
from jobcontrol.store import lanes
from jobcontrol.store.runqueue import DEFAULT_LEASE, RunQueue, WorkerInfo
from tests.api.conftest import Api
from tests.conftest import MakeJC
from tests.integration.helpers import T0, box, poll_until, task

pytestmark = pytest.mark.timeout(60)

WORKERS = "/api/v1/workers"
EMBEDDED = f"{socket.gethostname()}:{os.getpid()}:embedded"


def workers(api: Api) -> list[dict[str, Any]]:
    response = api.client.get(WORKERS, headers=api.headers("viewer"))
    assert response.status_code == 200, response.text
    found: list[dict[str, Any]] = response.json()["workers"]
    return found


def test_a_viewer_lists_the_embedded_worker_and_no_token_is_401(api: Api) -> None:
    response = api.client.get(WORKERS)
    assert response.status_code == 401
    assert response.json()["error"] == "Unauthorized"
    bad = api.client.get(WORKERS, headers={"Authorization": "Bearer jc_not-a-token"})
    assert bad.status_code == 401

    [w] = workers(api)
    slots = api.jc.config.slots
    assert (w["name"], w["host"], w["pid"]) == (EMBEDDED, socket.gethostname(), os.getpid())
    assert (w["slots"], w["used"], w["free"]) == (slots, 0, slots)
    assert w["queues"] is None
    assert w["groups"] == [{"queues": ["*"], "slots": slots, "used": 0, "runs": []}]
    assert (w["stopped"], w["runs"]) == (None, [])
    # Times are ISO text, on the daemon's clock (here the manual one).
    assert datetime.fromisoformat(w["started"]) == T0
    assert datetime.fromisoformat(w["heartbeat"]) == T0
    assert w["heartbeat_age_s"] == 0


def test_a_running_task_is_held_by_the_embedded_worker(api_any: Api) -> None:
    api = api_any
    gate = api.jc.gate()
    api.jc.create(task("slow", gate.command))
    mark = api.jc.rec.mark()
    run_id = api.jc.run_now("slow")
    api.jc.wait_task_process(run_id)  # claimed, spawned, its pid recorded

    # The age is measured on the dispatcher's clock, not the wall clock.
    api.jc.advance(5)
    [w] = workers(api)
    run = api.jc.run(run_id)
    assert run.lease_until is not None
    assert run.started is not None
    assert (w["name"], w["used"], w["free"]) == (EMBEDDED, 1, api.jc.config.slots - 1)
    assert w["runs"] == [
        {
            "run_id": run_id,
            "job": "slow",
            "since": run.started.isoformat(),
            "pid": run.pid,
            "lease_until": run.lease_until.isoformat(),
        }
    ]
    beat = datetime.fromisoformat(w["heartbeat"])
    assert w["heartbeat_age_s"] == round((T0 + timedelta(seconds=5) - beat).total_seconds(), 3)
    assert w["heartbeat_age_s"] in (5.0, 0.0)  # 0 only if the worker beat since the clock moved

    gate.open()
    api.jc.rec.run_finished("slow", since=mark)
    # The worker records the end before the dispatcher announces it; the slot is free again.
    [w] = poll_until("the slot to be free", lambda: [w for w in workers(api) if w["used"] == 0])
    assert (w["free"], w["runs"]) == (api.jc.config.slots, [])


def test_stopped_workers_come_after_live_ones_with_their_stop_time(api_any: Api) -> None:
    api = api_any
    queue = RunQueue(api.jc.store)
    info = WorkerInfo(
        name="0-remote",  # sorts before the embedded worker's name: only the stop puts it last
        host="elsewhere",
        pid=4242,
        slots=2,
        version="9.9",
        started=T0,
        queues=["gpu", "io"],
    )
    queue.register(info, T0)
    queue.deregister("0-remote", T0 + timedelta(minutes=1))

    live, stopped = workers(api)
    assert (live["name"], live["stopped"]) == (EMBEDDED, None)
    assert stopped["name"] == "0-remote"
    assert (stopped["host"], stopped["pid"], stopped["version"]) == ("elsewhere", 4242, "9.9")
    assert (stopped["slots"], stopped["used"], stopped["free"]) == (2, 0, 2)
    assert stopped["queues"] == ["gpu", "io"]
    assert stopped["groups"] == [{"queues": ["gpu", "io"], "slots": 2, "used": 0, "runs": []}]
    assert datetime.fromisoformat(stopped["stopped"]) == T0 + timedelta(minutes=1)
    assert stopped["runs"] == []


def test_each_worker_says_whether_it_is_online_late_gone_or_stopped(api_any: Api) -> None:
    """What an operator reads first: which workers take runs. One on another host that
    stopped beating (SIGSTOP, cut off) is late once a lease passed; one on this host whose
    process is not running, and that never said it stopped, is gone."""
    api = api_any
    queue = RunQueue(api.jc.store)
    dead = subprocess.Popen(["true"])
    dead.wait()  # a pid that is not running (reaped)

    def info(name: str, host: str, pid: int) -> WorkerInfo:
        return WorkerInfo(name=name, host=host, pid=pid, slots=1, version="1", started=T0)

    queue.register(info("w-remote", "elsewhere", 4242), T0)
    queue.register(info("w-killed", socket.gethostname(), dead.pid), T0)
    queue.register(info("w-done", "elsewhere", 4343), T0)
    queue.deregister("w-done", T0)

    def states() -> dict[str, str]:
        return {w["name"]: w["state"] for w in workers(api)}

    assert states() == {
        EMBEDDED: "online",
        "w-remote": "online",  # heard of within its lease
        "w-killed": "gone",
        "w-done": "stopped",
    }
    api.jc.advance(DEFAULT_LEASE.total_seconds() + 1)
    assert states() == {
        EMBEDDED: "online",  # the daemon's own: its process, not its beat
        "w-remote": "late",
        "w-killed": "gone",
        "w-done": "stopped",
    }
    # `jobcontrol workers` says so in its HEARTBEAT column.
    text = table_workers(workers(api))
    beat = {row.split()[0]: re.split(r"\s{2,}", row)[-2] for row in text.splitlines()[1:]}
    assert beat["w-remote"] == "31s ago (late)", text
    assert beat["w-killed"] == "31s ago (process gone)", text
    assert beat[EMBEDDED] == "31s ago", text
    assert beat["w-done"].startswith("stopped "), text


def test_a_worker_whose_runs_lease_ran_out_reads_late_at_once(db_url: str, make_jc: MakeJC) -> None:
    """It stated an idle beat (a minute: judged alive for two) and then claimed a run: a
    SIGSTOP then leaves its run to be settled when the lease runs out, and from then on
    it is late, not online for up to two minutes more."""
    # The dispatcher judges leases half a second after its start, every 0.2 s.
    jc = make_jc(db_url, slots=0, lease=0.5, poll_interval=0.2)
    jc.create(box("Box", active=True), task("t", "true", "Box", active=True))
    queue = RunQueue(jc.store, timedelta(seconds=30))
    queue.register(
        WorkerInfo(name="w-idle", host="elsewhere", pid=4242, slots=1, version="1", started=T0),
        T0,
    )
    queue.heartbeat("w-idle", T0, every=60.0)  # idle: its next beat within a minute
    jc.run_now("Box")
    [claimed] = poll_until(
        "a run to claim", lambda: queue.claim("w-idle", "elsewhere", jc.clock.now())
    )

    def state() -> str:
        [w] = [w for w in jc.engine.workers() if w["name"] == "w-idle"]
        return str(w["state"])

    jc.clock.set(T0 + timedelta(seconds=29))
    assert state() == "online"
    jc.clock.set(T0 + timedelta(seconds=31))  # its lease ran out; two idle beats have not
    poll_until("its run to be settled", lambda: jc.run(claimed.id).state is RunState.LOST)
    assert state() == "late"
    # Its next beat (it was only stopped) states its interval again: online.
    queue.heartbeat("w-idle", jc.clock.now(), every=10.0)
    assert state() == "online"


def test_a_worker_of_a_short_lease_lane_reads_late_when_its_lease_would_run_out(
    db_url: str, make_jc: MakeJC
) -> None:
    """A worker serving a lane whose stale timeout is 5 s renews its runs' leases every
    third of that: silent for 6 s (a SIGSTOP), its runs are being settled, so it reads
    late, not online for the default lease's 30 s. One serving a 30 s lane is online."""
    jc = make_jc(db_url, slots=0)
    with jc.store.write() as conn:
        lanes.insert(conn, "quick", {"stale_timeout_s": 5.0}, T0, "tester")
    queue = RunQueue(jc.store, None)
    for name, queues in (("w-quick", ["quick"]), ("w-default", ["default"])):
        info = WorkerInfo(
            name=name, host="elsewhere", pid=4242, slots=1, version="1", started=T0, queues=queues
        )
        queue.register(info, T0)
        queue.heartbeat(name, T0, every=5.0 / 3)  # its busy beat

    def state(name: str) -> str:
        [w] = [w for w in jc.engine.workers() if w["name"] == name]
        return str(w["state"])

    jc.clock.set(T0 + timedelta(seconds=4))
    assert (state("w-quick"), state("w-default")) == ("online", "online")
    jc.clock.set(T0 + timedelta(seconds=6))
    assert (state("w-quick"), state("w-default")) == ("late", "online")
