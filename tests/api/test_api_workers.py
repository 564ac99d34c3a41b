"""The worker registry route: ``GET /api/v1/workers`` over a real dispatcher and its embedded worker."""

from __future__ import annotations

import os
import socket
from datetime import datetime, timedelta
from typing import Any

import pytest

from jobcontrol.store.runqueue import RunQueue, WorkerInfo
from tests.api.conftest import Api
from tests.integration.helpers import T0, poll_until, task

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
