"""Lanes in the run queue, on both stores: what a claim takes, and what it must leave.

A run's lane is the lane row named by its queue, else ``default``. A claim
never takes a run of a drained or stopped lane, never starts more runs of a
lane than its ``max_slots`` across every claimer (counted inside the claim,
after the lane's row is locked on PostgreSQL), takes priority first then the
oldest, and the one-statement paths (claim by id, the next task of a sequence
taken with its predecessor's end) leave a run of a capped, drained or stopped
lane to the claim that counts. Leases are the lane's ``stale_timeout_s``.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import update

from jobcontrol.model import Kind, RunState, Trigger
from jobcontrol.store import Store, lanes, queries
from jobcontrol.store.runqueue import RunQueue
from jobcontrol.store.schema import lane, run

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)


@pytest.fixture
def rq(db_url: str) -> Any:
    store = Store(db_url)
    store.upgrade()
    yield RunQueue(store)  # leases from the lanes, as the daemon's worker has them
    store.dispose()


def queue_runs(
    store: Store,
    n: int,
    *,
    priority: int = 0,
    queue: str = "default",
    state: RunState = RunState.QUEUED,
) -> list[int]:
    with store.write() as conn:
        return [
            queries.insert_run(
                conn,
                {
                    "job_id": None,
                    "job_name": f"{queue}-{i}",
                    "kind": Kind.TASK,
                    "trigger": Trigger.MANUAL,
                    "state": state,
                    "queue": queue,
                    "priority": priority,
                    "created": NOW,
                    "command": "true",
                },
            )
            for i in range(n)
        ]


def add_lane(store: Store, name: str, **values: Any) -> None:
    with store.write() as conn:
        lanes.insert(conn, name, values, NOW, "tester")


def set_lane(store: Store, name: str, **values: Any) -> None:
    with store.write() as conn:
        assert lanes.change(conn, name, values, NOW, "tester")


def ids(runs: list[Any]) -> list[int]:
    return [r.id for r in runs]


def state_of(store: Store, run_id: int) -> RunState:
    with store.read() as conn:
        row = queries.get_run(conn, run_id)
    assert row is not None
    return row.state


def test_a_new_database_has_the_default_lane_with_the_old_rules(rq: RunQueue) -> None:
    known = rq.lanes()
    assert list(known.by_name) == ["default"]
    d = known.default
    assert (d.max_slots, d.poll_interval_s, d.stale_timeout_s, d.enabled, d.stopped_at) == (
        None,
        2.0,
        30.0,
        True,
        None,
    )


def test_claims_take_priority_first_then_the_oldest_across_lanes(rq: RunQueue) -> None:
    add_lane(rq.store, "gpu", max_slots=5)
    low = queue_runs(rq.store, 2)
    high_gpu = queue_runs(rq.store, 2, priority=5, queue="gpu")
    mid = queue_runs(rq.store, 1, priority=3, queue="other")  # no lane row: in default
    got = rq.claim("w", "h", NOW, limit=4)
    assert ids(got) == high_gpu + mid + low[:1]
    assert ids(rq.claim("w", "h", NOW, limit=4)) == low[1:]


def test_drain_stops_new_claims_running_runs_go_on_and_resume_restarts_them(
    rq: RunQueue,
) -> None:
    add_lane(rq.store, "batch")
    (running,) = queue_runs(rq.store, 1, queue="batch")
    assert ids(rq.claim("w", "h", NOW, run_id=running)) == [running]
    waiting = queue_runs(rq.store, 2, queue="batch")
    other = queue_runs(rq.store, 1)
    set_lane(rq.store, "batch", enabled=False)

    assert rq.any_queued(["batch"]) is False, "a drained lane has nothing to claim"
    assert ids(rq.claim("w", "h", NOW, limit=5)) == other, "only the other lane's run"
    assert rq.claim("w", "h", NOW, run_id=waiting[0]) == [], "not even by its id"
    assert state_of(rq.store, waiting[0]) is RunState.QUEUED
    end = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": NOW, "lease_until": None}
    assert rq.finish(running, "w", end, 5).recorded, "the running one finishes"

    set_lane(rq.store, "batch", enabled=True)
    assert rq.any_queued(["batch"]) is True
    assert ids(rq.claim("w", "h", NOW, limit=5)) == waiting


def test_a_stopped_lane_is_not_claimed_until_it_is_resumed(rq: RunQueue) -> None:
    add_lane(rq.store, "flaky")
    (run_id,) = queue_runs(rq.store, 1, queue="flaky")
    set_lane(rq.store, "flaky", stopped_at=NOW, stopped_reason="5 worker deaths")
    assert rq.claim("w", "h", NOW, limit=3) == []
    assert rq.claim("w", "h", NOW, run_id=run_id) == []
    set_lane(rq.store, "flaky", stopped_at=None, stopped_reason=None)
    assert ids(rq.claim("w", "h", NOW, run_id=run_id)) == [run_id]


def test_a_queue_without_a_lane_row_follows_defaults_drain_and_cap(rq: RunQueue) -> None:
    add_lane(rq.store, "named")
    plain = queue_runs(rq.store, 2, queue="default")
    adhoc = queue_runs(rq.store, 2, queue="adhoc")  # no lane row
    named = queue_runs(rq.store, 1, queue="named")
    set_lane(rq.store, "default", max_slots=3)
    got = rq.claim("w", "h", NOW, limit=10)
    # default's three slots are shared by 'default' and 'adhoc'; 'named' is its own lane.
    assert ids(got) == plain + adhoc[:1] + named
    assert rq.claim("w", "h", NOW, run_id=adhoc[1]) == [], "default is full"
    assert rq.any_queued() is False

    set_lane(rq.store, "default", max_slots=None, enabled=False)
    assert rq.claim("w", "h", NOW, run_id=adhoc[1]) == [], "default is drained"
    assert rq.any_queued(["adhoc"]) is False
    set_lane(rq.store, "default", enabled=True)
    assert ids(rq.claim("w", "h", NOW, queues=["adhoc"])) == adhoc[1:]


def test_a_capped_lane_never_gets_more_than_its_room_in_one_claim(rq: RunQueue) -> None:
    add_lane(rq.store, "cap", max_slots=2)
    capped = queue_runs(rq.store, 4, priority=9, queue="cap")
    plain = queue_runs(rq.store, 3)
    got = rq.claim("w", "h", NOW, limit=5)
    assert ids(got) == capped[:2] + plain, "two of the lane, then the rest by priority"
    assert rq.claim("w2", "h", NOW, limit=5) == []
    end = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": NOW, "lease_until": None}
    assert rq.finish(capped[0], "w", end, 5).recorded
    assert ids(rq.claim("w2", "h", NOW, limit=5)) == capped[2:3], "one slot freed: one run"


def test_the_next_task_of_a_sequence_waits_for_a_claim_that_counts(rq: RunQueue) -> None:
    add_lane(rq.store, "cap", max_slots=1)
    add_lane(rq.store, "open")
    end = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": NOW, "lease_until": None}

    def chain(queue: str) -> tuple[int, int]:
        (first,) = queue_runs(rq.store, 1)
        (nxt,) = queue_runs(rq.store, 1, queue=queue, state=RunState.PENDING)
        with rq.store.write() as conn:
            conn.execute(
                update(run).where(run.c.id == nxt).values(after_run_id=first, after_ok_only=False)
            )
        assert ids(rq.claim("w", "h", NOW, run_id=first)) == [first]
        return first, nxt

    first, nxt = chain("open")
    result = rq.finish(first, "w", end, 5, take_next=("h", lambda: NOW))
    assert result.next is not None, "an open lane: taken at once"
    assert result.next.id == nxt

    (holder,) = queue_runs(rq.store, 1, queue="cap")
    assert ids(rq.claim("w", "h", NOW, run_id=holder)) == [holder]
    first, nxt = chain("cap")
    result = rq.finish(first, "w", end, 5, take_next=("h", lambda: NOW))
    assert result.recorded
    assert result.next is None, "its capped lane is full"
    assert state_of(rq.store, nxt) is RunState.QUEUED, "released, not taken"
    assert rq.claim("w", "h", NOW, run_id=nxt) == []
    assert rq.finish(holder, "w", end, 5).recorded
    assert ids(rq.claim("w", "h", NOW, run_id=nxt)) == [nxt], "claimed once there is room"

    first, nxt = chain("open")
    set_lane(rq.store, "open", enabled=False)
    result = rq.finish(first, "w", end, 5, take_next=("h", lambda: NOW))
    assert result.next is None, "drained"
    assert state_of(rq.store, nxt) is RunState.QUEUED


def test_a_lane_capped_or_drained_since_the_last_read_loses_nothing_to_the_fast_claim(
    rq: RunQueue,
) -> None:
    """A claimer trusts its read of the lanes for a second to claim in one statement;
    a lane capped or drained meanwhile still gets its rules, from the run's own lane row."""
    add_lane(rq.store, "burst")
    add_lane(rq.store, "batch")
    burst = queue_runs(rq.store, 6, priority=9, queue="burst")
    batch = queue_runs(rq.store, 2, priority=5, queue="batch")
    plain = queue_runs(rq.store, 2)
    assert ids(rq.claim("w", "h", NOW, limit=1)) == burst[:1]  # lanes read: none capped
    # Another process caps one lane and drains the other, within the same second.
    set_lane(rq.store, "burst", max_slots=2)
    set_lane(rq.store, "batch", enabled=False)
    got = rq.claim("w2", "h", NOW, limit=5)
    assert ids(got) == burst[1:2] + plain, "one more of the capped lane, none of the drained"
    assert rq.claim("w3", "h", NOW, limit=5) == []
    with rq.store.read() as conn:
        running = conn.execute(
            run.select().where(run.c.state == str(RunState.RUNNING), run.c.queue == "burst")
        ).fetchall()
    assert len(running) == 2, "the cap holds"
    assert {state_of(rq.store, i) for i in batch} == {RunState.QUEUED}


def _write_then_fail(store: Store, run_id: int) -> None:
    with store.write() as conn:
        conn.execute(update(run).where(run.c.id == run_id).values(priority=8))
        raise RuntimeError("the caller fails mid-transaction")


def test_a_one_statement_transaction_leaves_the_next_one_atomic(rq: RunQueue) -> None:
    """``Store.single`` (autocommit on PostgreSQL) must not leak into the transactions a
    thread's pinned connection runs after it: a failed write still changes nothing."""
    (first,) = queue_runs(rq.store, 1)
    with rq.store.pinned():
        with rq.store.single() as conn:
            conn.execute(update(run).where(run.c.id == first).values(priority=7))
        with pytest.raises(RuntimeError):
            _write_then_fail(rq.store, first)
        with rq.store.read() as conn:
            assert queries.get_run(conn, first).priority == 7  # type: ignore[union-attr]


def test_leases_are_the_lanes_stale_timeout_at_claim_and_heartbeat(rq: RunQueue) -> None:
    add_lane(rq.store, "long", stale_timeout_s=1800.0)
    (short,) = queue_runs(rq.store, 1)
    (long_,) = queue_runs(rq.store, 1, queue="long")
    got = {r.id: r for r in rq.claim("w", "h", NOW, limit=2)}
    assert got[short].lease_until == NOW + timedelta(seconds=30)
    assert got[long_].lease_until == NOW + timedelta(minutes=30)
    later = NOW + timedelta(seconds=10)
    set_lane(rq.store, "default", stale_timeout_s=45.5)
    rq.heartbeat("w", later, [short, long_])
    with rq.store.read() as conn:
        leases = {i: queries.get_run(conn, i).lease_until for i in (short, long_)}  # type: ignore[union-attr]
    assert leases == {
        short: later + timedelta(seconds=45.5),
        long_: later + timedelta(minutes=30),
    }, "each run renewed for its own lane's length, in one statement"


# ---------------------------------------------------------------- the cap under a race

RUNS, CAP, CLAIMERS, EACH = 500, 3, 3, 3


def test_max_slots_holds_across_three_concurrent_claimers_under_a_burst(db_url: str) -> None:
    """Three claimers, each on its own Store (its own connections), each with room for
    three runs, race for 500 runs of a lane capped at 3. From the run rows: never more
    than 3 ran at once. Each claimer does real work between claim and finish (a pid
    write, as a worker does) so runs overlap."""
    setup = Store(db_url)
    setup.upgrade()
    add_lane(setup, "burst", max_slots=CAP)
    queued = queue_runs(setup, RUNS, queue="burst")
    stores = [Store(db_url) for _ in range(CLAIMERS)]
    claimed_at: dict[int, datetime] = {}  # when the claim came back (after its commit)
    errors: list[BaseException] = []
    start = threading.Barrier(CLAIMERS)

    def claimer(i: int) -> None:
        q = RunQueue(stores[i])
        name = f"w{i}"
        try:
            start.wait(10)
            while True:
                got = q.claim(name, "h", datetime.now(UTC), limit=EACH)
                back = datetime.now(UTC)
                if not got:
                    if _all_done(q.store):
                        return
                    continue  # the lane is full: the others hold its slots
                for r in got:
                    claimed_at[r.id] = back
                    q.record_pid(r.id, name, 1000 + r.id, None)
                for r in got:
                    end = {
                        "state": RunState.SUCCEEDED,
                        "exit_status": 0,
                        "ended": datetime.now(UTC),
                        "lease_until": None,
                    }
                    assert q.finish(r.id, name, end, 5).recorded
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=claimer, args=(i,)) for i in range(CLAIMERS)]
    deadline = time.monotonic() + 240
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(1.0, deadline - time.monotonic()))
    try:
        assert not any(t.is_alive() for t in threads), "claimers did not finish in time"
        assert not errors, errors
        with setup.read() as conn:
            rows = [queries.get_run(conn, i) for i in queued]
        assert all(r is not None and r.state is RunState.SUCCEEDED for r in rows), "all ran once"
        # An interval per run from its row: from its claim (the row's start, and no later
        # than the claim came back) to its recorded end.
        intervals = []
        for r in rows:
            assert r is not None
            assert r.started is not None
            assert r.ended is not None
            assert r.started <= claimed_at[r.id] <= r.ended
            intervals.append((claimed_at[r.id], r.ended))
        most = _most_overlapping(intervals)
        assert most <= CAP, f"{most} runs of a lane capped at {CAP} ran at once"
        assert most == CAP, "the race was real: the lane was full at some instant"
    finally:
        for s in [*stores, setup]:
            s.dispose()


def _all_done(store: Store) -> bool:
    with store.read() as conn:
        return queries.count_queued(conn) == 0


def _most_overlapping(intervals: list[tuple[datetime, datetime]]) -> int:
    # Ends sort before starts at the same instant: a slot freed and retaken is no overlap.
    points = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    most = current = 0
    for _, step in points:
        current += step
        most = max(most, current)
    return most


def test_a_lane_row_is_locked_while_a_capped_claim_counts(postgres_url: str) -> None:
    """PostgreSQL: a claim in a capped lane waits for another transaction that holds the
    lane's row (as a concurrent claimer does), then counts what that one committed."""
    store = Store(postgres_url)
    store.upgrade()
    add_lane(store, "one", max_slots=1)
    (waiting,) = queue_runs(store, 1, queue="one")
    other = Store(postgres_url)
    got: list[Any] = []
    try:
        with other.write() as conn:
            lanes.lock(conn, ["one"])  # held as a claimer in its count holds it
            t = threading.Thread(target=lambda: got.append(RunQueue(store).claim("w", "h", NOW)))
            t.start()
            t.join(0.5)
            assert t.is_alive(), "the claim waits for the lane's row"
            # What that claimer commits: a run of the lane now running.
            queries.insert_run(
                conn,
                {
                    "job_name": "elsewhere",
                    "kind": Kind.TASK,
                    "trigger": Trigger.MANUAL,
                    "state": RunState.RUNNING,
                    "queue": "one",
                    "created": NOW,
                    "started": NOW,
                    "worker": "x",
                },
            )
        t.join(10)
        assert got == [[]], "it counted the run committed meanwhile: the lane is full"
        assert state_of(store, waiting) is RunState.QUEUED
    finally:
        other.dispose()
        store.dispose()


def test_a_one_slot_lane_starts_its_most_urgent_run_whoever_counts_first(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL: claimer A is held just before it locks the lane's row; claimer B then
    claims. B must get the most urgent run: A holds no run yet, since a claim locks its
    capped lanes before it picks (it used to pick first, so B skipped A's locked pick and
    won the only slot for a less urgent run; seen as a one-slot lane starting a priority
    2 run before the priority 9 one)."""
    store = Store(postgres_url)
    store.upgrade()
    add_lane(store, "one", max_slots=1)
    (mid,) = queue_runs(store, 1, queue="one", priority=2)
    (top,) = queue_runs(store, 1, queue="one", priority=9)
    at_lock, go = threading.Event(), threading.Event()
    real_lock = lanes.lock

    def held_lock(conn: Any, names: Any) -> Any:
        if threading.current_thread().name == "claimer-a":
            at_lock.set()
            assert go.wait(20), "claimer A was never let go"
        return real_lock(conn, names)

    monkeypatch.setattr(lanes, "lock", held_lock)
    got_a: list[Any] = []
    a = threading.Thread(
        target=lambda: got_a.append(RunQueue(store).claim("a", "h", NOW)), name="claimer-a"
    )
    try:
        a.start()
        assert at_lock.wait(20), "claimer A never reached the lane lock"
        got_b = RunQueue(store).claim("b", "h", NOW)
        go.set()
        a.join(20)
        assert not a.is_alive()
        assert ids(got_b) == [top], "the one slot went to the most urgent run"
        assert got_a == [[]], "the lane was full when A counted"
        assert state_of(store, mid) is RunState.QUEUED
    finally:
        go.set()
        store.dispose()


def test_a_back_up_read_of_the_lanes_sees_every_change_made_elsewhere(db_url: str) -> None:
    """A worker's back-up poll of the lane table (``lanes_if_written``) may skip the read
    only when nothing was written to the database since the last one (SQLite); a change
    committed by any other connection, this process's or another's, is always read."""
    store, other = Store(db_url), Store(db_url)
    store.upgrade()
    rq = RunQueue(store)
    try:
        with store.pinned():
            first, mark = rq.lanes_if_written(None)
            assert first is not None
            assert first.default.enabled
            again, mark = rq.lanes_if_written(mark)
            if store.is_sqlite:
                assert again is None, "nothing was written: nothing to read again"
            else:
                assert again is not None, "PostgreSQL has no such mark: it reads each time"
            rq.heartbeat("nobody", NOW)  # this thread's own writes tell it nothing new
            with other.write() as conn:
                conn.execute(update(lane).where(lane.c.name == "default").values(enabled=False))
            seen, mark = rq.lanes_if_written(mark)
            assert seen is not None, "another connection's commit is always read"
            assert not seen.default.enabled
            queue_runs(other, 1)  # any write elsewhere, not only to the lane table
            after, mark = rq.lanes_if_written(mark)
            assert after is not None
            assert not after.default.enabled
    finally:
        other.dispose()
        store.dispose()
