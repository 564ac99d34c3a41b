"""Queued runs that no live worker serves are said (health, status, metrics read this):
a dispatcher that runs no tasks (``slots=0``) queues runs whatever workers there are."""

from __future__ import annotations

import pytest

from jobcontrol.store import lanes
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
