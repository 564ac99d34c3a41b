"""Retries and the lane STOPPED rule, driven through the run queue on both stores.

The dispatcher has no embedded worker (``slots=0``): the test is the worker. A
dead worker is a claim under a worker name that then never heartbeats; the
injected clock is moved past its lease and the dispatcher's back-up poll settles
its runs, as it would for a worker killed with ``kill -9`` on another host.
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from jobcontrol import NewJob, events
from jobcontrol.errors import JobRunningError
from jobcontrol.model import RunRecord, RunState
from jobcontrol.service import audit
from jobcontrol.store import lanes as store_lanes
from jobcontrol.store import queries
from jobcontrol.store.runqueue import RunQueue, WorkerInfo
from jobcontrol.store.schema import run as run_table
from tests.integration.conftest import MakeJC
from tests.integration.helpers import JC, box, poll_until, task

pytestmark = pytest.mark.timeout(120)

LEASE = timedelta(seconds=2)
OPERATOR = "operator-1"


class Workers:
    """Workers of the test: each claims and finishes through the store's run queue."""

    def __init__(self, jc: JC) -> None:
        self.jc = jc
        self.rq = RunQueue(jc.store, LEASE)

    def join(self, name: str) -> None:
        now = self.jc.clock.now()
        info = WorkerInfo(name, "host-b", 4242, 4, "test", now)
        self.rq.register(info, now)

    def claim(self, name: str, *, queues: list[str] | None = None) -> list[RunRecord]:
        return self.rq.claim(name, "host-b", self.jc.clock.now(), queues=queues, limit=4)

    def claim_one(self, name: str, job: str) -> RunRecord:
        """Join as ``name`` and claim the queued run of ``job``."""
        self.join(name)
        queued = [r for r in self.jc.runs(job) if r.state is RunState.QUEUED]
        assert len(queued) == 1, self.jc.runs(job)
        (claimed,) = self.rq.claim(name, "host-b", self.jc.clock.now(), run_id=queued[0].id)
        return claimed

    def finish(
        self,
        name: str,
        run_id: int,
        status: int,
        state: RunState | None = None,
        reason: str | None = None,
    ) -> bool:
        now = self.jc.clock.now()
        if state is None:
            state = RunState.SUCCEEDED if status == 0 else RunState.FAILED
        values = {"state": state, "exit_status": status, "ended": now, "duration_ms": 5}
        if reason is not None:
            values["reason"] = reason  # a kill's, as a worker records it
        return self.rq.finish(run_id, name, values, 5).recorded

    def succeed_taking_next(self, name: str, run: RunRecord) -> RunRecord:
        """Record ``run``'s success and take the task queued ahead after it, in one
        transaction, as the embedded worker does in a sequence."""
        now = self.jc.clock.now()
        values = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": now, "duration_ms": 5}
        done = self.rq.finish(run.id, name, values, 5, take_next=("host-b", lambda: now))
        assert done.recorded
        assert done.next is not None, "nothing was queued ahead after the run"
        return done.next


def _taken_ahead(jc: JC, w: Workers, on_error: str, middle: NewJob) -> tuple[int, RunRecord]:
    """A box of ``first``, ``middle`` and ``next``, run now: ``first`` succeeds and its
    worker takes ``middle`` with that end, before the dispatcher heard of either. The
    recorder's mark from before the run, and the run of ``middle`` taken."""
    jc.create(
        box("Box", active=True, on_error=on_error),
        task("first", "true", "Box", active=True),
        middle,
        task("next", "true", "Box", active=True),
    )
    mark = jc.rec.mark()
    jc.run_now("Box")
    taken = w.succeed_taking_next("w1", w.claim_one("w1", "first"))
    assert taken.job_name == middle.name
    return mark, taken


def _poll(jc: JC) -> None:
    """Run the dispatcher's back-up poll now (ends nobody announced, expired leases)."""
    d = jc.dispatcher

    def judged() -> bool:  # as the poll decides: not after a pause, nor a slow write
        lease = d.config.lease
        return time.monotonic() >= d._leases_judged_after and not jc.store.held_up_within(lease)

    poll_until("leases to be judged", judged)
    d.post((d._poll, None))
    jc.sync()


def _die(jc: JC, *runs: RunRecord) -> None:
    """The workers holding ``runs`` never heartbeat again: move past the leases, poll."""
    leases = [r.lease_until for r in runs if r.lease_until is not None]
    assert leases
    jc.clock.set(max(leases) + timedelta(seconds=1))
    _poll(jc)


def _runs(jc: JC, job: str) -> list[RunRecord]:
    """Every run of ``job``, oldest first."""
    return sorted(jc.runs(job), key=lambda r: r.id)


def _jc(make_jc: MakeJC, url: str) -> JC:
    # poll_interval: the back-up poll runs only when the test asks; lease: judged at once.
    return make_jc(url, slots=0, lease=0.05, poll_interval=3600.0)


# ---------------------------------------------------------------- retries


def test_a_lost_run_is_settled_once_retried_and_the_tree_goes_on_as_success(
    db_url: str, make_jc: MakeJC
) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(
        box("Box", active=True, on_error="abort"),
        task("flaky", "true", "Box", active=True, retries=1),
        task("next", "true", "Box", active=True),
    )
    mark = jc.rec.mark()
    root = jc.run_now("Box")
    first = w.claim_one("w-dead", "flaky")
    assert first.attempt == 1

    _die(jc, first)

    lost, retry = _runs(jc, "flaky")
    assert (lost.id, lost.state, lost.exit_status, lost.attempt) == (
        first.id,
        RunState.LOST,
        255,
        1,
    )
    assert "w-dead stopped renewing its lease" in (lost.reason or "")
    assert (retry.state, retry.attempt, retry.root_run_id) == (RunState.QUEUED, 2, root)
    assert retry.parent_run_id == lost.parent_run_id
    assert jc.runs("next") == []  # the box did not go on past the lost attempt
    assert jc.run(root).state is RunState.RUNNING

    # The dead worker comes back and reports its old run: refused, the row stays settled.
    assert not w.finish("w-dead", first.id, 0)
    assert jc.run(first.id).state is RunState.LOST
    # It cannot take the retry's row by finishing it either: it never claimed it.
    assert not w.finish("w-dead", retry.id, 0)

    second = w.claim_one("w-live", "flaky")
    assert second.id == retry.id
    assert w.finish("w-live", second.id, 0)
    _poll(jc)
    nxt = w.claim_one("w-live", "next")
    assert w.finish("w-live", nxt.id, 0)
    _poll(jc)

    done = jc.rec.run_finished("Box", since=mark)
    assert (done["state"], done["exit_status"]) == ("succeeded", 0)
    assert [(r.state, r.attempt) for r in _runs(jc, "flaky")] == [
        (RunState.LOST, 1),
        (RunState.SUCCEEDED, 2),
    ]
    assert jc.job("flaky").exit_status == 0
    # Never completed twice: one final row per attempt, the first still the settled one.
    assert jc.run(first.id).exit_status == 255
    assert jc.errors.messages() == []


def test_a_failed_run_is_retried_until_its_retries_are_used_then_the_tree_sees_the_failure(
    db_url: str, make_jc: MakeJC
) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(
        box("Box", active=True, on_error="abort"),
        task("flaky", "false", "Box", active=True, retries=2),
        task("next", "true", "Box", active=True),
    )
    mark = jc.rec.mark()
    jc.run_now("Box")
    one = w.claim_one("w1", "flaky")
    assert w.finish("w1", one.id, 1)
    _poll(jc)
    two = w.claim_one("w1", "flaky")
    assert w.finish("w1", two.id, 124)  # a timeout (124) is a failure: retried too
    _poll(jc)
    three = w.claim_one("w1", "flaky")
    assert w.finish("w1", three.id, 3)
    _poll(jc)

    done = jc.rec.run_finished("Box", since=mark)
    assert (done["state"], done["exit_status"]) == ("failed", 3)
    assert [(r.attempt, r.state, r.exit_status) for r in _runs(jc, "flaky")] == [
        (1, RunState.FAILED, 1),
        (2, RunState.FAILED, 124),
        (3, RunState.FAILED, 3),
    ]
    assert jc.runs("next") == []  # ABORT: the box stopped at the failure
    assert jc.job("flaky").exit_status == 3


def test_without_retries_a_lost_run_fails_the_tree_at_once(db_url: str, make_jc: MakeJC) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(task("once", "true", active=True))
    mark = jc.rec.mark()
    jc.run_now("once")
    first = w.claim_one("w-dead", "once")
    _die(jc, first)
    done = jc.rec.run_finished("once", since=mark)
    assert (done["state"], done["exit_status"]) == ("lost", 255)
    assert [r.state for r in jc.runs("once")] == [RunState.LOST]


def _solo_retried(jc: JC, w: Workers, command: str) -> tuple[RunRecord, RunRecord]:
    """A top-level task with one retry, run now: its first attempt failed, and the retry
    claimed by worker w1. The two runs."""
    jc.create(task("solo", command, active=True, retries=1))
    root = jc.run_now("solo")
    first = w.claim_one("w1", "solo")
    assert w.finish("w1", first.id, 2)
    _poll(jc)
    retry = w.claim_one("w1", "solo")
    assert (retry.attempt, retry.root_run_id) == (2, root)
    return first, retry


def test_a_top_level_task_is_retried_in_its_tree_run(db_url: str, make_jc: MakeJC) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    mark = jc.rec.mark()
    first, retry = _solo_retried(jc, w, "true")
    assert w.finish("w1", retry.id, 0)
    _poll(jc)
    poll_until("the tree run to end", lambda: not jc.dispatcher.busy_jobs())
    ends = [s.run for s in jc.rec.signals("run_finished", since=mark)]
    assert [(e["id"], e["state"], e.get("attempt")) for e in ends] == [
        (first.id, "failed", 1),
        (retry.id, "succeeded", 2),
    ]


def test_a_kill_of_a_retried_top_level_task_names_the_attempt_it_killed(
    db_url: str, make_jc: MakeJC
) -> None:
    """The kill answered the tree run's first attempt, long ended, not the run it killed."""
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    first, retry = _solo_retried(jc, w, "sleep 60")

    killed = jc.engine.kill("solo", user=OPERATOR)
    assert killed == retry.id
    assert jc.run(retry.id).kill_requested
    assert not jc.run(first.id).kill_requested
    assert w.finish("w1", retry.id, 255, RunState.KILLED)
    _poll(jc)


def test_an_operators_kill_is_never_retried(db_url: str, make_jc: MakeJC) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(box("Box", active=True), task("victim", "sleep 60", "Box", active=True, retries=3))
    mark = jc.rec.mark()
    jc.run_now("Box")
    first = w.claim_one("w1", "victim")
    jc.engine.kill("victim", user=OPERATOR)
    assert jc.run(first.id).kill_requested
    # The worker kills the task and records it, as a worker does on a kill request.
    assert w.finish("w1", first.id, 255, RunState.KILLED)
    _poll(jc)
    done = jc.rec.run_finished("Box", since=mark)
    assert (done["state"], done["exit_status"]) == ("killed", 255)
    assert [(r.state, r.attempt) for r in jc.runs("victim")] == [(RunState.KILLED, 1)]


def test_a_killed_tree_whose_worker_then_dies_is_not_retried(db_url: str, make_jc: MakeJC) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(box("Box", active=True), task("victim", "sleep 60", "Box", active=True, retries=3))
    mark = jc.rec.mark()
    jc.run_now("Box")
    first = w.claim_one("w-dead", "victim")
    jc.engine.kill("Box", user=OPERATOR)
    _die(jc, first)  # the worker never saw the request: the lease runs out
    done = jc.rec.run_finished("Box", since=mark)
    assert done["exit_status"] == 255
    assert [(r.state, r.attempt) for r in jc.runs("victim")] == [(RunState.LOST, 1)]


def test_a_task_deactivated_meanwhile_is_not_retried(db_url: str, make_jc: MakeJC) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(box("Box", active=True), task("flaky", "false", "Box", active=True, retries=3))
    mark = jc.rec.mark()
    jc.run_now("Box")
    first = w.claim_one("w1", "flaky")
    jc.modify("flaky", active=False)  # disabled while it ran
    assert w.finish("w1", first.id, 1)
    _poll(jc)
    done = jc.rec.run_finished("Box", since=mark)
    assert done["exit_status"] == 1
    assert [(r.state, r.attempt) for r in jc.runs("flaky")] == [(RunState.FAILED, 1)]


def test_a_retry_while_timers_are_paused_is_not_made(db_url: str, make_jc: MakeJC) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(box("Box", active=True), task("flaky", "false", "Box", active=True, retries=3))
    mark = jc.rec.mark()
    jc.run_now("Box")
    first = w.claim_one("w1", "flaky")
    jc.engine.pause_timers(user=OPERATOR)  # held
    assert w.finish("w1", first.id, 1)
    _poll(jc)
    done = jc.rec.run_finished("Box", since=mark)
    assert done["exit_status"] == 1
    assert [r.attempt for r in jc.runs("flaky")] == [1]


# ---------------------------------------------------------------- the STOPPED rule


def _fast_lane(jc: JC, count: int) -> list[str]:
    jc.engine.lanes.add_lane("fast", {}, user=OPERATOR)
    names = [f"t{i}" for i in range(count)]
    jc.create(*(task(n, "true", active=True, queue="fast") for n in names))
    return names


def _kill_workers_at(
    jc: JC, w: Workers, jobs: list[str], times: list[datetime], first: int = 0
) -> None:
    """At each time, a new worker claims the next job's run and then dies (lease expiry)."""
    for i, (job, at) in enumerate(zip(jobs, times, strict=True), start=first):
        jc.clock.set(at)
        jc.run_now(job)
        claimed = w.claim_one(f"w{i}", job)
        _die(jc, claimed)


def test_five_worker_deaths_in_ten_minutes_stop_the_lane_until_resumed(
    db_url: str, make_jc: MakeJC
) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jobs = _fast_lane(jc, 6)
    changes: list[list[str]] = []

    def receive(sender: object, names: list[str], **_: Any) -> None:
        if sender is jc.store:
            changes.append(list(names))

    start = jc.clock.now()
    times = [start + timedelta(minutes=2 * i) for i in range(5)]  # the fifth at 8 min
    with events.lanes_changed.connected_to(receive):
        _kill_workers_at(jc, w, jobs[:4], times[:4])
        assert jc.engine.lanes.get_lane("fast")["state"] == "open"  # four are not enough
        _kill_workers_at(jc, w, jobs[4:5], times[4:5], first=4)

    lane = jc.engine.lanes.get_lane("fast")
    assert lane["state"] == "stopped"
    reason = lane["stopped_reason"]
    assert "5 unexpected worker ends within 10 minutes" in reason
    assert all(f"w{i}" in reason for i in range(5))
    assert changes == [["fast"]]
    assert jc.engine.lanes.stopped()[0]["name"] == "fast"
    entry = audit.list_entries(jc.store)[0]
    assert (entry.user, entry.operation, entry.jobs) == ("dispatcher", "lane.stop", ["fast"])
    assert entry.detail == reason

    # No new claims in a STOPPED lane: by priority, or by the run's id.
    jc.run_now(jobs[5])
    w.join("w-new")
    assert w.claim("w-new") == []
    (queued,) = [r for r in jc.runs(jobs[5]) if r.state is RunState.QUEUED]
    assert w.rq.claim("w-new", "host-b", jc.clock.now(), run_id=queued.id) == []
    assert not w.rq.any_queued()

    jc.engine.lanes.resume("fast", user=OPERATOR)
    assert jc.engine.lanes.get_lane("fast")["state"] == "open"
    (taken,) = w.claim("w-new")
    assert taken.id == queued.id
    assert w.finish("w-new", taken.id, 0)
    _poll(jc)  # its end heard, so no tree run is left for the teardown's stop


def test_five_deaths_spread_over_eleven_minutes_do_not_stop_the_lane(
    db_url: str, make_jc: MakeJC
) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jobs = _fast_lane(jc, 5)
    start = jc.clock.now()
    times = [start + timedelta(minutes=11 * i / 4) for i in range(5)]
    _kill_workers_at(jc, w, jobs, times)
    lane = jc.engine.lanes.get_lane("fast")
    assert (lane["state"], lane["stopped_reason"]) == ("open", None)
    with jc.store.read() as conn:
        assert len(store_lanes.recent_worker_ends(conn, "fast", jc.clock.now())) == 4


def test_one_worker_with_several_runs_is_one_end(db_url: str, make_jc: MakeJC) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jobs = _fast_lane(jc, 5)
    for job in jobs:
        jc.run_now(job)
    w.join("w-big")
    held = w.claim("w-big") + w.claim("w-big")
    assert len(held) == 5
    _die(jc, *held)
    assert jc.engine.lanes.get_lane("fast")["state"] == "open"
    with jc.store.read() as conn:
        assert len(store_lanes.recent_worker_ends(conn, "fast", jc.clock.now())) == 1


def test_a_worker_that_rejoins_and_dies_again_counts_each_time(
    db_url: str, make_jc: MakeJC
) -> None:
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jobs = _fast_lane(jc, 5)
    start = jc.clock.now()
    for i, job in enumerate(jobs):
        jc.clock.set(start + timedelta(minutes=i))
        jc.run_now(job)
        claimed = w.claim_one("build-1", job)  # the same name, a new life each time
        _die(jc, claimed)
    lane = jc.engine.lanes.get_lane("fast")
    assert lane["state"] == "stopped"
    assert "workers build-1;" in lane["stopped_reason"]


def test_workers_found_dead_at_start_up_recovery_count(sqlite_url: str, make_jc: MakeJC) -> None:
    jc = _jc(make_jc, sqlite_url)
    w = Workers(jc)
    jobs = _fast_lane(jc, 5)
    jc.clock.set(jc.clock.now() - timedelta(hours=1))  # their leases ran out long ago
    for i, job in enumerate(jobs):
        jc.run_now(job)
        w.claim_one(f"gone-{i}", job)
        w.rq.deregister(f"gone-{i}", jc.clock.now())  # stopped, its runs still running
    jc.close(timeout=0.5)  # a stop with its tree runs in flight: nobody will end them
    again = _jc(make_jc, sqlite_url)  # start-up recovery: their workers are gone
    lane = again.engine.lanes.get_lane("fast")
    assert lane["state"] == "stopped", lane
    assert "gone-0" in lane["stopped_reason"]
    with again.store.read() as conn:
        states = {r.state for r in conn.execute(sa.select(run_table.c.state))}
    assert states == {"lost"}


def test_bad_retries_are_refused_naming_the_field_and_nothing_changes(
    db_url: str, make_jc: MakeJC
) -> None:
    from jobcontrol.errors import JobError

    jc = _jc(make_jc, db_url)
    jc.create(task("t", "true", retries=2))
    before = jc.dump()
    for bad in (-1, "two", 1.5, True, 101):
        with pytest.raises(JobError, match="retries") as exc:
            jc.modify("t", retries=bad)
        assert "retries" in str(exc.value)
    with pytest.raises(JobError, match="retries"):
        jc.create(task("u", "true", retries=-3))
    assert jc.dump() == before
    assert jc.job("t").retries == 2


def test_attempt_is_kept_when_the_run_queue_reads_a_row(db_url: str, make_jc: MakeJC) -> None:
    jc = _jc(make_jc, db_url)
    with jc.store.write() as conn:
        run_id = queries.insert_run(
            conn,
            {
                "job_id": None,
                "job_name": "x",
                "kind": "task",
                "trigger": "manual",
                "state": RunState.QUEUED,
                "created": jc.clock.now(),
                "attempt": 3,
            },
        )
    assert jc.run(run_id).attempt == 3


def test_a_rebuild_from_the_database_goes_on_from_the_last_attempt(
    db_url: str, make_jc: MakeJC
) -> None:
    """After a rebuild (an outage, a failed batch) a box counts only its task's last attempt."""
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(
        box("Box", active=True),
        task("flaky", "true", "Box", active=True, retries=1),
        task("next", "true", "Box", active=True),
    )
    mark = jc.rec.mark()
    jc.run_now("Box")
    first = w.claim_one("w1", "flaky")
    assert w.finish("w1", first.id, 1)
    _poll(jc)
    retry = w.claim_one("w1", "flaky")
    assert retry.attempt == 2

    def bug() -> None:
        raise RuntimeError("a bug: the dispatcher rebuilds from the database")

    # A failed batch of two events is rolled back and rebuilt from the database.
    d = jc.dispatcher
    with d.protocol.user_edit():
        seen = d.stats.events
        d.post((lambda: None, None))
        poll_until("the dispatcher takes the event", lambda: d.stats.events > seen)
        d.post((bug, None))
        d.post((lambda: None, None))
    jc.sync()
    jc.errors.records.clear()  # that failure was the point

    assert w.finish("w1", retry.id, 0)
    _poll(jc)
    nxt = w.claim_one("w1", "next")
    assert w.finish("w1", nxt.id, 0)
    _poll(jc)
    done = jc.rec.run_finished("Box", since=mark)
    assert (done["state"], done["exit_status"]) == ("succeeded", 0)


def test_a_task_taken_ahead_that_fails_before_the_dispatcher_hears_is_retried(
    db_url: str, make_jc: MakeJC
) -> None:
    """A worker that runs a sequence faster than the dispatcher reacts: it takes the next
    task with its predecessor's end and records that task's failure before the
    dispatcher heard of either. The failure is retried all the same."""
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    flaky = task("flaky", "false", "Box", active=True, retries=1)
    mark, taken = _taken_ahead(jc, w, "abort", flaky)
    assert w.finish("w1", taken.id, 1)  # before the dispatcher reacted to "first"
    _poll(jc)

    retry = w.claim_one("w1", "flaky")
    assert retry.attempt == 2
    assert w.finish("w1", retry.id, 0)
    _poll(jc)
    nxt = w.claim_one("w1", "next")
    assert w.finish("w1", nxt.id, 0)
    _poll(jc)
    finished = jc.rec.run_finished("Box", since=mark)
    assert (finished["state"], finished["exit_status"]) == ("succeeded", 0)
    assert [(r.attempt, r.state) for r in _runs(jc, "flaky")] == [
        (1, RunState.FAILED),
        (2, RunState.SUCCEEDED),
    ]


def test_a_task_taken_ahead_that_its_worker_killed_before_the_dispatcher_hears_kills_the_tree(
    db_url: str, make_jc: MakeJC
) -> None:
    """The same race with a worker stopping with --kill: the task it took ahead and killed
    kills its tree run, as it does when the dispatcher hears of the kill in time. The
    box records the kill, not a failure, and the box's next task never runs."""
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    victim = task("victim", "sleep 100", "Box", active=True, retries=3)
    mark, taken = _taken_ahead(jc, w, "continue", victim)
    assert w.finish("w1", taken.id, 255, RunState.KILLED, "killed: worker w1 stopped")
    _poll(jc)

    finished = jc.rec.run_finished("Box", since=mark)
    assert (finished["state"], finished["exit_status"]) == ("killed", 255)
    assert [(r.state, r.attempt) for r in _runs(jc, "victim")] == [(RunState.KILLED, 1)]
    assert jc.runs("next") == []
    # The box says why, as its task does (it said nothing when its worker killed it).
    assert [r.reason for r in jc.runs("Box")] == ["killed: worker w1 stopped"]


def test_a_kill_as_a_task_taken_ahead_starts_kills_it_and_its_tree_waits_for_its_end(
    db_url: str, make_jc: MakeJC
) -> None:
    """A kill that came as ``first`` ended, after its worker took ``middle`` with that end
    but before the dispatcher heard: the box and the tree were recorded killed at once,
    while ``middle`` ran on, its job could be run again beside it, and its own end was
    lost. The tree run kills it, and ends with its end."""
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    mark, taken = _taken_ahead(jc, w, "continue", task("middle", "sleep 100", "Box", active=True))
    jc.engine.kill("Box", user=OPERATOR)
    _poll(jc)  # the dispatcher hears of first's end

    assert jc.run(taken.id).kill_requested
    assert jc.dispatcher.busy_jobs() == ["Box"]
    with pytest.raises(JobRunningError, match="tree busy"):
        jc.run_now("Box")
    assert "Box" not in jc.rec.finished_jobs(since=mark)

    assert w.finish("w1", taken.id, 255, RunState.KILLED)
    _poll(jc)
    finished = jc.rec.run_finished("Box", since=mark)
    assert (finished["state"], finished["exit_status"]) == ("killed", 255)
    assert [(r.state, r.exit_status) for r in _runs(jc, "middle")] == [(RunState.KILLED, 255)]
    assert jc.job("middle").exit_status == 255  # its end is the job's last result
    assert jc.runs("next") == []


def test_a_task_taken_ahead_that_ended_before_the_dispatcher_hears_keeps_its_times(
    db_url: str, make_jc: MakeJC
) -> None:
    """The job's last run and duration are the task's own, as its worker recorded them,
    not the moment the dispatcher adopted an end it heard of late; its box ends when
    the task did."""
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(
        box("Box", active=True),
        task("first", "true", "Box", active=True),
        task("second", "true", "Box", active=True),
    )
    mark = jc.rec.mark()
    t0 = jc.clock.now()
    root = jc.run_now("Box")
    first = w.claim_one("w1", "first")
    jc.clock.set(t0 + timedelta(seconds=1))
    second = w.succeed_taking_next("w1", first)
    jc.clock.set(t0 + timedelta(seconds=3))
    assert w.finish("w1", second.id, 0)
    jc.clock.set(t0 + timedelta(seconds=10))  # the dispatcher hears of both ends late
    _poll(jc)

    assert jc.rec.run_finished("Box", since=mark)["state"] == "succeeded"
    job = jc.job("second")
    assert (job.last_ran, job.last_duration_ms, job.exit_status) == (
        t0 + timedelta(seconds=1),
        2000,
        0,
    )
    assert jc.run(root).ended == t0 + timedelta(seconds=3)


def test_a_task_that_waited_in_the_queue_counts_only_its_run_in_the_job(
    db_url: str, make_jc: MakeJC
) -> None:
    """A task queued for a minute before a worker took it: the job's last run is when it
    started and its duration is the run's, as in its history; not from its queueing."""
    jc = _jc(make_jc, db_url)
    w = Workers(jc)
    jc.create(box("Box", active=True), task("slow", "true", "Box", active=True))
    t0 = jc.clock.now()
    jc.run_now("Box")
    jc.clock.set(t0 + timedelta(minutes=1))  # no slot free until now
    run = w.claim_one("w1", "slow")
    jc.clock.set(t0 + timedelta(minutes=1, seconds=4))
    assert w.finish("w1", run.id, 0)
    _poll(jc)

    job = jc.job("slow")
    assert (job.last_ran, job.last_duration_ms) == (t0 + timedelta(minutes=1), 4000)
    assert jc.run(run.id).started == job.last_ran
