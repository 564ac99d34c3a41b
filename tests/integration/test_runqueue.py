"""The run queue's contract, on both stores: what every worker may rely on.

Claims never hand out more runs than the claimer's free slots and never the
same run twice, however many claimers race; finish, pid, lease renewal and
kill requests are compare-and-set, so a worker whose run was settled can
change nothing.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobcontrol.errors import StoreUnavailable
from jobcontrol.model import Kind, RunState, Trigger
from jobcontrol.store import Store, lanes, queries
from jobcontrol.store.runqueue import (
    RunQueue,
    ThenClaim,
    WorkerInfo,
    expired_leases,
    request_kill,
)
from tests.integration.helpers import poll_until

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
LEASE = timedelta(seconds=30)


@pytest.fixture
def rq(db_url: str) -> Any:
    store = Store(db_url)
    store.upgrade()
    yield RunQueue(store, LEASE)
    store.dispose()


def queue_runs(store: Store, n: int, *, priority: int = 0, queue: str = "default") -> list[int]:
    with store.write() as conn:
        return [
            queries.insert_run(
                conn,
                {
                    "job_id": None,
                    "job_name": f"t{i}",
                    "kind": Kind.TASK,
                    "trigger": Trigger.MANUAL,
                    "state": RunState.QUEUED,
                    "queue": queue,
                    "priority": priority,
                    "created": NOW,
                    "command": "true",
                },
            )
            for i in range(n)
        ]


def run_row(store: Store, run_id: int) -> Any:
    with store.read() as conn:
        return queries.get_run(conn, run_id)


def test_concurrent_claimers_never_exceed_their_free_slots_nor_share_a_run(rq: RunQueue) -> None:
    ids = queue_runs(rq.store, 120)
    claimed: dict[str, list[int]] = {}
    biggest: dict[str, int] = {}
    errors: list[BaseException] = []
    slots = {f"w{i}": 1 + i % 4 for i in range(6)}  # free slots 1..4 per claimer
    start = threading.Barrier(len(slots))

    def claimer(name: str) -> None:
        try:
            start.wait(10)
            mine: list[int] = []
            while True:
                got = rq.claim(name, "host", NOW, limit=slots[name])
                biggest[name] = max(biggest.get(name, 0), len(got))
                if not got:
                    break
                mine.extend(r.id for r in got)
            claimed[name] = mine
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(n,)) for n in slots]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    every = [run_id for runs in claimed.values() for run_id in runs]
    assert sorted(every) == sorted(ids), "each queued run is claimed exactly once"
    for name, most in biggest.items():
        assert most <= slots[name], f"{name} got {most} runs for {slots[name]} free slots"
    for name, runs in claimed.items():
        for run_id in runs[:3]:
            row = run_row(rq.store, run_id)
            assert (row.state, row.worker, row.host) == (RunState.RUNNING, name, "host")
            assert row.lease_until == NOW + LEASE


def test_claim_takes_priority_first_then_oldest_and_respects_queues(rq: RunQueue) -> None:
    low = queue_runs(rq.store, 2)
    high = queue_runs(rq.store, 2, priority=5)
    other = queue_runs(rq.store, 1, queue="gpu")
    got = rq.claim("w", "h", NOW, limit=3, queues=["default"])
    assert [r.id for r in got] == [high[0], high[1], low[0]]
    assert rq.claim("w", "h", NOW, limit=0) == []
    got = rq.claim("w", "h", NOW, limit=5, queues=["gpu"])
    assert [r.id for r in got] == other
    assert [r.id for r in rq.claim("w", "h", NOW, run_id=low[1])] == [low[1]]
    assert rq.claim("w2", "h", NOW, run_id=low[1]) == [], "a claimed run is nobody else's"


def test_an_end_claims_its_slots_next_run_with_it_most_urgent_first(rq: RunQueue) -> None:
    (first,) = queue_runs(rq.store, 1)
    assert [r.id for r in rq.claim("w", "h", NOW, limit=1)] == [first]  # lanes read
    low = queue_runs(rq.store, 1)
    high = queue_runs(rq.store, 1, priority=5)
    gpu = queue_runs(rq.store, 1, queue="gpu")
    end = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": NOW, "lease_until": None}
    later = NOW + timedelta(seconds=1)

    def then(*queues: str) -> ThenClaim:
        return ThenClaim("h2", lambda: later, list(queues))

    done = rq.finish(first, "w", end, 5, then_claim=then("default"))
    assert (done.recorded, done.looked) == (True, True)
    assert done.next is not None
    assert done.next.id == high[0], "priority first, its queues only"
    row = run_row(rq.store, high[0])
    assert (row.state, row.worker, row.host) == (RunState.RUNNING, "w", "h2")
    assert (row.started, row.lease_until) == (later, later + LEASE)
    assert run_row(rq.store, first).state is RunState.SUCCEEDED

    # An end not recorded (not this worker's run) claims nothing.
    refused = rq.finish(high[0], "intruder", end, 5, then_claim=then("default"))
    assert (refused.recorded, refused.next, refused.looked) == (False, None, False)
    assert run_row(rq.store, low[0]).state is RunState.QUEUED

    done = rq.finish(high[0], "w", end, 5, then_claim=then("gpu"))
    assert done.next is not None
    assert done.next.id == gpu[0]
    done = rq.finish(gpu[0], "w", end, 5, then_claim=then("gpu"))
    assert (done.recorded, done.next, done.looked) == (True, None, True), "none left: looked"
    assert run_row(rq.store, low[0]).state is RunState.QUEUED

    # A lane with a cap: on SQLite the end's claim counts its runs in the same write
    # transaction (the end just made room); on PostgreSQL the count locks the lane's row
    # in a transaction of its own, the group's claim: not looked.
    with rq.store.write() as conn:
        lanes.change(conn, "default", {"max_slots": 1}, NOW, "tester")
    (mine,) = [r.id for r in rq.claim("w", "h", NOW, run_id=low[0])]
    (other,) = queue_runs(rq.store, 1)
    capped = RunQueue(rq.store, LEASE).finish(mine, "w", end, 5, then_claim=then("default"))
    if rq.store.is_sqlite:
        assert (capped.looked, capped.next and capped.next.id) == (True, other)
    else:
        assert (capped.recorded, capped.next, capped.looked) == (True, None, False)
        assert run_row(rq.store, other).state is RunState.QUEUED


def test_an_ends_claim_reads_the_lanes_again_when_a_lane_drained_since_held_it_back(
    rq: RunQueue,
) -> None:
    """The lanes the run queue read last can be a second old. A lane drained since then
    has its run picked first and refused by the claim: the end's claim must read the
    lanes again and take the next run, as ``claim`` does, not come back empty (its group
    would then wait out a poll interval with work queued)."""
    with rq.store.write() as conn:
        lanes.insert(conn, "x", {}, NOW, "tester")
    (first,) = queue_runs(rq.store, 1)
    assert [r.id for r in rq.claim("w", "h", NOW, limit=1)] == [first]  # lanes read: x open
    (urgent,) = queue_runs(rq.store, 1, priority=10, queue="x")
    (other,) = queue_runs(rq.store, 1, queue="y")
    with rq.store.write() as conn:
        lanes.change(conn, "x", {"enabled": False}, NOW, "tester")  # drained meanwhile
    end = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": NOW, "lease_until": None}
    then = ThenClaim("h", lambda: NOW, None)
    done = rq.finish(first, "w", end, 5, then_claim=then)
    assert (done.recorded, done.looked) == (True, True)
    assert done.next is not None, "the drained lane's run refused, the next one taken"
    assert done.next.id == other
    assert run_row(rq.store, urgent).state is RunState.QUEUED


def test_finish_is_compare_and_set_under_the_worker_that_holds_the_run(rq: RunQueue) -> None:
    (run_id,) = queue_runs(rq.store, 1)
    end = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": NOW, "lease_until": None}
    assert not rq.finish(run_id, "w", end, 5).recorded, "a queued run cannot be finished"
    rq.claim("w", "h", NOW, run_id=run_id)
    assert not rq.finish(run_id, "intruder", end, 5).recorded
    assert run_row(rq.store, run_id).state is RunState.RUNNING
    assert rq.finish(run_id, "w", end, 5).recorded
    failed = {**end, "state": RunState.FAILED, "exit_status": 3}
    assert not rq.finish(run_id, "w", failed, 5).recorded, "never completed twice"
    row = run_row(rq.store, run_id)
    assert (row.state, row.exit_status) == (RunState.SUCCEEDED, 0)


def test_a_settled_run_stays_settled_when_its_worker_comes_back(rq: RunQueue) -> None:
    (run_id,) = queue_runs(rq.store, 1)
    rq.claim("w", "h", NOW, run_id=run_id)
    later = NOW + LEASE + timedelta(seconds=1)
    with rq.store.write() as conn:
        assert [r.id for r in expired_leases(conn, later)] == [run_id]
        lost = {"state": RunState.LOST, "exit_status": 255, "reason": "lost: lease"}
        assert queries.transition_run(conn, run_id, [RunState.RUNNING], lost)
    # The worker wakes up: its heartbeat, pid and finish all find nothing to change.
    beat = rq.heartbeat("w", later)
    assert beat.kill == []
    assert rq.holds("w", [run_id]) == []
    assert not rq.record_pid(run_id, "w", 4242, "/x.log")
    end = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": later}
    assert not rq.finish(run_id, "w", end, 5).recorded
    row = run_row(rq.store, run_id)
    assert (row.state, row.exit_status, row.pid, row.lease_until) == (
        RunState.LOST,
        255,
        None,
        NOW + LEASE,
    )


def test_heartbeat_renews_the_leases_it_holds_and_carries_kill_requests(rq: RunQueue) -> None:
    info = WorkerInfo("w", "h", 1, 4, "0.1", NOW)
    rq.register(info, NOW)
    a, b, c = queue_runs(rq.store, 3)
    rq.claim("w", "h", NOW, run_id=a)
    rq.claim("w", "h", NOW, run_id=b)
    with rq.store.write() as conn:
        assert not request_kill(conn, c), "a queued run has no worker to ask"
        assert request_kill(conn, b)
    later = NOW + timedelta(seconds=20)
    beat = rq.heartbeat("w", later)
    assert beat.kill == [b]
    assert run_row(rq.store, a).lease_until == later + LEASE
    with rq.store.write() as conn:
        assert expired_leases(conn, NOW + LEASE + timedelta(seconds=1)) == []
    assert run_row(rq.store, c).kill_requested is False


def test_the_registry_says_who_holds_what(rq: RunQueue) -> None:
    from jobcontrol.store.runqueue import list_workers

    rq.register(WorkerInfo("w1", "h1", 11, 2, "0.1", NOW, queues=["fast"]), NOW)
    rq.register(WorkerInfo("w2", "h2", 22, 8, "0.1", NOW), NOW)
    (run_id,) = queue_runs(rq.store, 1)
    rq.claim("w2", "h2", NOW, run_id=run_id)
    rq.deregister("w1", NOW + timedelta(seconds=5))
    with rq.store.read() as conn:
        listed = {w["name"]: w for w in list_workers(conn, NOW + timedelta(seconds=5))}
    assert (listed["w2"]["used"], listed["w2"]["free"]) == (1, 7)
    assert [r["run_id"] for r in listed["w2"]["runs"]] == [run_id]
    assert listed["w2"]["heartbeat_age_s"] == 5
    assert listed["w1"]["stopped"] is not None
    assert listed["w1"]["queues"] == ["fast"]
    # Re-joining under the same name starts a new life.
    rq.register(WorkerInfo("w1", "h1", 33, 2, "0.2", NOW), NOW + timedelta(seconds=9))
    with rq.store.read() as conn:
        again = {w["name"]: w for w in list_workers(conn, NOW)}["w1"]
    assert (again["pid"], again["stopped"], again["version"]) == (33, None, "0.2")


@pytest.mark.postgres
def test_a_connection_the_server_dropped_fails_one_call_as_unavailable_then_is_replaced(
    postgres_server: Any, postgres_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Claim and finish run on psycopg directly (store/prepared.py): a connection the
    server closed under a worker is reported as the database being unavailable (which
    callers retry), never handed out again, and the next call gets a new connection."""
    store = Store(postgres_url)
    store.upgrade()
    rq = RunQueue(store, LEASE)
    dbname = postgres_url.rsplit("/", 1)[1]
    first, second = queue_runs(store, 2)
    end = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": NOW, "lease_until": None}
    try:
        with store.pinned():  # as a worker's slot threads hold their connections
            assert [r.id for r in rq.claim("w", "h", NOW, limit=1)] == [first]
            postgres_server.terminate_connections(dbname)
            with pytest.raises(StoreUnavailable):
                rq.finish(first, "w", end, 5)
            assert rq.finish(first, "w", end, 5).recorded, "the retry is recorded"
            postgres_server.terminate_connections(dbname)
            with pytest.raises(StoreUnavailable):
                rq.claim("w", "h", NOW, limit=1)
            assert [r.id for r in rq.claim("w", "h", NOW, limit=1)] == [second]
        # Unpinned, each call checks a connection out of the pool, which pings it first.
        postgres_server.terminate_connections(dbname)
        assert rq.finish(second, "w", end, 5).recorded
        assert run_row(store, first).state == RunState.SUCCEEDED
        assert run_row(store, second).state == RunState.SUCCEEDED
        # The broken connection was discarded, not handed back to the pool to fail
        # its reset there (which the pool logs as an error with a traceback).
        assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    finally:
        store.dispose()


def test_a_finish_whose_answer_was_lost_is_told_from_a_run_settled_meanwhile(
    rq: RunQueue,
) -> None:
    """A finish that committed while its answer was lost is refused when retried (the run
    is no longer running): ``recorded_end`` tells the worker that its own end is there,
    and says no for another worker's end or another instant."""
    (run_id,) = queue_runs(rq.store, 1)
    rq.register(WorkerInfo("w1", "h", 1, 1, "test", NOW), NOW)
    assert [r.id for r in rq.claim("w1", "h", NOW)] == [run_id]
    ended = NOW + timedelta(seconds=2)
    values = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": ended}
    assert rq.finish(run_id, "w1", values, 5).recorded
    assert not rq.finish(run_id, "w1", values, 5).recorded  # the retry: compare-and-set
    assert rq.recorded_end(run_id, "w1", ended, 0)
    assert not rq.recorded_end(run_id, "w2", ended, 0)
    assert not rq.recorded_end(run_id, "w1", ended + timedelta(milliseconds=1), 0)
    assert not rq.recorded_end(run_id, "w1", ended, 1)
    assert not rq.recorded_end(run_id + 1, "w1", ended, 0)


def test_a_claim_that_waited_for_another_processs_lock_starts_its_runs_once_it_had_it(
    sqlite_url: str,
) -> None:
    """SQLite: a claim's write waits (up to the busy timeout) for another process's
    lock. Its runs start at the clock's time once the lock is had, not at the time the
    claim began: a run would otherwise seem to have started before its process did."""
    store = Store(sqlite_url)
    store.upgrade()
    try:
        rq = RunQueue(store, LEASE)
        (run_id,) = queue_runs(store, 1)
        blocker = sqlite3.connect(sqlite_url.split("///", 1)[1], timeout=10)
        blocker.execute("BEGIN IMMEDIATE")
        later = NOW + timedelta(seconds=20)
        times = iter([later])
        claimed: list[Any] = []
        claimer = threading.Thread(
            target=lambda: claimed.extend(rq.claim("w1", "host-a", NOW, clock=lambda: next(times)))
        )
        claimer.start()
        try:

            def waits() -> bool:
                longest = store.longest_write()
                return longest is not None and longest[1] > 0.2

            poll_until("the claim to wait for the lock", waits)
        finally:
            blocker.rollback()
            blocker.close()
        claimer.join(10)
        assert [r.id for r in claimed] == [run_id]
        assert run_row(store, run_id).started == later
    finally:
        store.dispose()
