"""Queued runs that no live worker serves are said (health, status, metrics read this):
a dispatcher that runs no tasks (``slots=0``) queues runs whatever workers there are."""

from __future__ import annotations

from datetime import timedelta

import pytest

from jobcontrol.store import lanes
from jobcontrol.store.runqueue import RunQueue, WorkerInfo
from tests.conftest import MakeJC
from tests.integration.helpers import JC, task

pytestmark = pytest.mark.timeout(60)


def _said(jc: JC) -> list[tuple[str, int, object]]:
    unserved = jc.engine.unserved_queues()
    return [(u["queue"], u["runs"], u["last_worker"]) for u in unserved]


def test_queues_no_worker_serves_are_said_except_a_stopped_lanes(
    db_url: str, make_jc: MakeJC
) -> None:
    jc = make_jc(db_url, slots=0)
    assert jc.engine.unserved_queues() == []  # nothing queued: nothing to say
    jc.engine.lanes.add_lane("q2", {}, user="admin")
    jc.create(
        task("a", "true", active=True, queue="q1"),
        task("b", "true", active=True, queue="q1"),
        task("c", "true", active=True, queue="q2"),
    )
    for name in ("a", "b", "c"):
        jc.run_now(name)
    assert _said(jc) == [("q1", 2, None), ("q2", 1, None)]
    oldest = jc.engine.unserved_queues()[0]["oldest"]
    assert oldest == min(jc.runs("a")[0].created, jc.runs("b")[0].created)

    # A STOPPED lane's runs wait for the lane (health says that), not for a worker.
    now = jc.clock.now()
    with jc.store.write() as conn:
        assert lanes.change(conn, "q2", {"stopped_at": now, "stopped_reason": "t"}, now, "t")
    assert _said(jc) == [("q1", 2, None)]


def test_a_daemon_with_its_own_worker_never_says_so(db_url: str, make_jc: MakeJC) -> None:
    jc = make_jc(db_url, slots=1)
    gate = jc.gate()
    jc.create(
        task("hold", f"read line < {gate.path}", active=True),
        task("next", "true", active=True),
    )
    mark = jc.rec.mark()
    jc.run_now("hold")
    jc.run_now("next")  # queued behind the one slot, which its worker serves
    assert jc.engine.count_queued() == 1
    assert jc.engine.unserved_queues() == []
    gate.open(1)
    assert jc.rec.run_finished("next", since=mark)["exit_status"] == 0


def test_a_remote_worker_is_judged_by_the_beat_it_said_it_would_make(
    db_url: str, make_jc: MakeJC
) -> None:
    """An idle worker beats once a minute (``IDLE_BEAT_S``) and says so: it serves its
    queue until twice that has passed unheard of, one that said nothing until the lease."""
    jc = make_jc(db_url, slots=0)
    jc.create(task("a", "true", active=True, queue="q1"))
    jc.run_now("a")
    queue = RunQueue(jc.store)
    now = jc.clock.now()
    queue.register(WorkerInfo("far", "elsewhere", 4242, 1, "t", now, ["q1"]), now)
    queue.heartbeat("far", now, every=60.0)
    far = {"name": "far", "heartbeat": now}
    for after, every, serves in [(45, 60.0, True), (119, 60.0, True), (121, 60.0, False)]:
        jc.clock.set(now + timedelta(seconds=after))
        assert _said(jc) == ([] if serves else [("q1", 1, far)]), (after, every)

    # Said nothing of its beat (a worker of an earlier version): the lease, 30 s.
    queue.heartbeat("far", now, every=None)
    jc.clock.set(now + timedelta(seconds=29))
    assert _said(jc) == []
    jc.clock.set(now + timedelta(seconds=31))
    assert _said(jc) == [("q1", 1, far)]
