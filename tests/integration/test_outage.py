"""The engine rides out a database that stops answering (SQLite: another process's lock).

Another connection holds SQLite's write lock past the busy timeout, as a long
maintenance transaction or a backup would. Meanwhile a task ends and a timer
comes due. Nothing may be lost: the task's real outcome is recorded once the
lock is gone, its tree goes on, the timer's run happens (misfire rule), and
nothing stays running or queued that isn't.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import sql

from jobcontrol import RunState, events
from jobcontrol.errors import BusyError, StoreUnavailable
from jobcontrol.model import RunRecord
from jobcontrol.service.eventlog import EventLog
from jobcontrol.store import Store
from jobcontrol.store.runqueue import RunQueue, WorkerInfo
from tests.integration.conftest import MakeJC
from tests.integration.helpers import JC, USER, box, poll_until, task
from tests.pgserver import PostgresServer

pytestmark = pytest.mark.timeout(90)
# The test's lock waits for the engine's short write to end before it is held (with no
# wait, BEGIN IMMEDIATE fails whenever one is under way).
LOCK_WAIT = 10.0


@contextmanager
def _write_lock_held(sqlite_url: str) -> Iterator[None]:
    """Another process's write lock on the SQLite file (``BEGIN IMMEDIATE``), released
    (rolled back) when the block ends."""
    blocker = sqlite3.connect(sqlite_url.split("///", 1)[1], timeout=LOCK_WAIT)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        yield
    finally:
        blocker.rollback()
        blocker.close()


def _task_running(jc: JC, name: str, mark: int) -> int:
    """The run of task ``name`` started since ``mark``, once its process runs."""
    run_id: int = jc.rec.wait_for(
        lambda s: s.name == "run_started" and s.run["job_name"] == name, since=mark
    ).run["id"]
    jc.wait_task_process(run_id)
    return run_id


def test_a_held_sqlite_lock_loses_no_outcome_and_no_tick(sqlite_url: str, make_jc: MakeJC) -> None:
    jc = make_jc(sqlite_url, busy_timeout=0.3, poll_interval=0.2)
    gate = jc.gate()
    jc.create(
        box("Ticker", timer="every 1s", active=True),
        task("tick", "true", "Ticker", active=True),
        box("Long", active=True),
        task("through", gate.command, "Long", active=True),
        task("after", "echo after", "Long", active=True),
    )
    jc.advance(1)
    jc.wait_quiet()
    ticks_before = len(jc.runs("tick"))
    assert ticks_before == 1
    stream = EventLog(jc.dispatcher)  # the daemon's event stream, as its API serves it
    stream.start()
    first_seq = stream.last_seq

    mark = jc.rec.mark()
    root = jc.run_now("Long")
    through = _task_running(jc, "through", mark)

    with _write_lock_held(sqlite_url):  # the write lock, held past the busy timeout
        gate.open()  # the task ends during the outage
        worker = jc.runtime.worker
        assert worker is not None
        poll_until("the worker to meet the locked database", lambda: worker.outage.down)
        jc.timers.advance(timedelta(seconds=5))  # the ticker comes due during the outage
        poll_until("the dispatcher to meet it too", lambda: jc.dispatcher.outage.down)
        # ...and to try again to rebuild from it, more than once, in vain.
        poll_until("tries to rebuild", lambda: jc.dispatcher.outage.state().failures >= 3)
        assert jc.run(through).state is RunState.RUNNING  # its end is not written yet...
        # Status tells the truth all through: the ticker's timer fired and its run waits
        # for the database; it is not shown as armed with a time already past. The tree
        # run of ``Long`` is still in flight: its end waits for the database too.
        status = jc.dispatcher.status()
        assert (status["timers_armed"], status["timers_due"]) == (0, 1), status
        assert [t["job"] for t in status["due_timers"]] == ["Ticker"], status
        assert status["next_timers"] == [], status
        assert [r["job"] for r in status["runs_in_flight"]] == ["Long"], status
        down = [e.data for e in stream.since(first_seq) if e.type == "database.changed"]
        assert [(e["ok"], bool(e["since"]), "locked" in e["error"]) for e in down] == [
            (False, True, True)
        ], down
        # A client that connects now still gets the tree (``/tree``), as the database
        # last left it: ``through`` running, numbered with the events said so far.
        seq, views = stream.snapshot(timeout=5)
        assert seq == stream.last_seq
        states = {v["name"]: v["state"] for v in views}
        assert states.keys() == {"Ticker", "tick", "Long", "through", "after"}, states
        assert states["through"] == "running", states

    # ...and is written with its real outcome once the lock is gone.
    finished = jc.rec.run_finished("Long", since=mark, timeout=30)
    assert (finished["id"], finished["exit_status"]) == (root, 0)
    runs = jc.tree_run(root)
    assert {n: (r.state, r.exit_status) for n, r in runs.items()} == {
        "Long": (RunState.SUCCEEDED, 0),
        "through": (RunState.SUCCEEDED, 0),
        "after": (RunState.SUCCEEDED, 0),
    }
    # Each task's job has its run's result, and each end was announced, the one recorded
    # while the dispatcher was away (its successor taken with it, queued ahead) too.
    for name in ("through", "after"):
        job = jc.job(name)
        assert (job.last_ran, job.exit_status) == (runs[name].started, 0), (name, job)
    ended = {e.data["run"]["job_name"] for e in stream.since(first_seq) if e.type == "run.finished"}
    assert {"through", "after", "Long"} <= ended, ended
    poll_until("both parts to see the database again", lambda: not jc.dispatcher.outage.down)
    poll_until("the worker too", lambda: not worker.outage.down)
    state = jc.dispatcher.outage.state()
    assert state.outages == 1
    assert state.failures >= 1
    # Both parts met it: the daemon (/status, /metrics) counts one outage, not one a part.
    assert jc.runtime.database()["outages"] == 1
    # ...and the worker one, not one ended by a read that passed while writes could not.
    assert worker.outage.state().outages == 1

    # The tick that came due during the outage ran (misfire run-once), and ticks go on.
    poll_until("the missed tick", lambda: len(jc.runs("tick")) > ticks_before)
    jc.wait_quiet()
    mark = jc.rec.mark()
    jc.advance(2)
    assert jc.rec.run_finished("Ticker", since=mark)["exit_status"] == 0
    jc.wait_quiet()
    active = [r for r in jc.dump()["run"] if r["state"] in ("queued", "running", "waiting")]
    assert active == []
    assert jc.dispatcher.stats.failures == 0
    # One event when the outage began (whichever part met it first), one when it ended.
    seen = [e.data for e in stream.since(first_seq) if e.type == "database.changed"]
    assert [(e["ok"], e["since"], e["error"]) for e in seen[1:]] == [(True, None, None)], seen
    status = jc.dispatcher.status()
    assert (status["timers_armed"], status["timers_due"]) == (1, 0), status
    stream.stop()


# ------------------------------------------------------------ ends the dispatcher missed

LEASE = timedelta(seconds=30)


class _Worker:
    """The test as a worker on another host: it claims and records ends through the run
    queue itself, and announces an end only when the test says so."""

    def __init__(self, jc: JC) -> None:
        self.jc = jc
        self.rq = RunQueue(jc.store, LEASE)
        now = jc.clock.now()
        self.rq.register(WorkerInfo("w-test", "host-b", 4242, 1, "test", now), now)

    def claim(self, job: str) -> RunRecord:
        queued = [r for r in self.jc.runs(job) if r.state is RunState.QUEUED]
        assert len(queued) == 1, self.jc.runs(job)
        now = self.jc.clock.now()
        (claimed,) = self.rq.claim("w-test", "host-b", now, run_id=queued[0].id)
        return claimed

    def finish(self, run_id: int, status: int) -> None:
        state = RunState.SUCCEEDED if status == 0 else RunState.FAILED
        values = {
            "state": state,
            "exit_status": status,
            "ended": self.jc.clock.now(),
            "duration_ms": 5,
        }
        assert self.rq.finish(run_id, "w-test", values, 5).recorded

    def announce(self, run_id: int) -> None:
        events.task_finished.send(self.jc.store, run_id=run_id)


@pytest.mark.parametrize("shape", ["top-level task", "task in a box"])
def test_an_end_announced_while_the_dispatcher_waits_out_an_outage_is_reacted_to(
    sqlite_url: str, make_jc: MakeJC, shape: str
) -> None:
    """The order of a CI failure: a remote worker records a task's end; the dispatcher
    meets SQLite's lock before it reacts; the wake-up arrives while it waits the lock
    out; it rebuilds from the database, where the run has ended. The rebuild must not
    forget the tree run whose end it never reacted to."""
    # No embedded worker; the back-up poll runs only when the test posts it.
    jc = make_jc(sqlite_url, slots=0, busy_timeout=0.3, poll_interval=3600.0)
    boxed = shape == "task in a box"
    if boxed:
        jc.create(box("Outer", active=True), task("through", "true", "Outer", active=True))
    else:
        jc.create(task("through", "true", active=True))
    worker = _Worker(jc)
    mark = jc.rec.mark()
    jc.run_now("Outer" if boxed else "through")
    run = worker.claim("through")
    worker.finish(run.id, 0)  # committed; its wake-up not yet sent

    with _write_lock_held(sqlite_url):  # the write lock, held past the busy timeout
        d = jc.dispatcher
        d.post((d._poll, None))  # the back-up poll meets the lock
        poll_until("the dispatcher to meet the locked database", lambda: d.outage.down)
        worker.announce(run.id)  # handled only after the dispatcher has rebuilt itself

    finished = jc.rec.run_finished("through", since=mark, timeout=30)
    assert (finished["id"], finished["state"], finished["exit_status"]) == (
        run.id,
        "succeeded",
        0,
    )
    if boxed:
        assert jc.rec.run_finished("Outer", since=mark)["state"] == "succeeded"
    assert jc.job("through").last_ran is not None  # the job's result is written too
    poll_until("the dispatcher to see the database again", lambda: not d.outage.down)
    # Nothing is left in flight: the tree runs again at once (not "tree busy").
    mark = jc.rec.mark()
    again = jc.run_now("Outer" if boxed else "through")
    second = worker.claim("through")
    worker.finish(second.id, 0)
    worker.announce(second.id)
    assert jc.rec.run_finished("Outer" if boxed else "through", since=mark)["id"] == again
    assert jc.dispatcher.stats.failures == 0
    jc.errors.records.clear()  # the outage's warnings are the point


def test_an_end_whose_batch_is_rolled_back_is_still_reacted_to_and_retried(
    db_url: str, make_jc: MakeJC
) -> None:
    """A failed first attempt's end is reacted to in a batch that a bug rolls back; the
    rebuild, finding the run ended, must still retry it (``retries``) and announce it."""
    jc = make_jc(db_url, slots=0, poll_interval=3600.0)
    jc.create(task("flaky", "false", active=True, retries=1))
    worker = _Worker(jc)
    mark = jc.rec.mark()
    jc.run_now("flaky")
    first = worker.claim("flaky")
    worker.finish(first.id, 1)

    def bug() -> None:
        raise RuntimeError("a bug: the dispatcher rebuilds from the database")

    d = jc.dispatcher
    with d.protocol.user_edit():  # holds the dispatcher so the next two make one batch
        seen = d.stats.events
        d.post((lambda: None, None))
        poll_until("the dispatcher takes the event", lambda: d.stats.events > seen)
        worker.announce(first.id)
        d.post((bug, None))
    jc.sync()
    jc.errors.records.clear()  # that failure was the point

    ended = jc.rec.run_finished("flaky", since=mark)
    assert (ended["id"], ended["state"], ended["attempt"]) == (first.id, "failed", 1)
    retry = worker.claim("flaky")  # queued again by the rebuild's reaction
    assert retry.attempt == 2
    mark = jc.rec.mark()
    worker.finish(retry.id, 0)
    worker.announce(retry.id)
    done = jc.rec.run_finished("flaky", since=mark)
    assert (done["id"], done["state"], done["attempt"]) == (retry.id, "succeeded", 2)
    assert jc.dispatcher.stats.failures == 1  # the bug, and nothing else


def test_boxes_end_when_their_last_task_ended_not_when_the_dispatcher_heard_of_it(
    sqlite_url: str, make_jc: MakeJC
) -> None:
    """A task that ends during an outage is reacted to once the database is back, 20 s
    later here. Its boxes ended when it did: their run rows, and the jobs' last duration
    in the tree view, must not count the outage as time they ran."""
    jc = make_jc(sqlite_url, slots=0, poll_interval=3600.0)
    jc.create(
        box("Outer", active=True),
        box("Inner", "Outer", active=True),
        task("through", "true", "Inner", active=True),
    )
    worker = _Worker(jc)
    mark = jc.rec.mark()
    root = jc.run_now("Outer")
    started = jc.clock.now()
    run = worker.claim("through")
    jc.clock.set(started + timedelta(seconds=12))
    worker.finish(run.id, 0)  # its end, at 12 s
    jc.clock.set(started + timedelta(seconds=32))  # heard of 20 s later
    worker.announce(run.id)

    finished = jc.rec.run_finished("Outer", since=mark, timeout=30)
    assert (finished["id"], finished["duration_ms"]) == (root, 12_000)
    runs = jc.tree_run(root)
    ends = {n: (r.ended, r.duration_ms) for n, r in runs.items()}
    twelve = started + timedelta(seconds=12)
    assert ends == {
        "Outer": (twelve, 12_000),
        "Inner": (twelve, 12_000),
        "through": (twelve, 5),  # the worker's own figure (_Worker.finish)
    }
    assert jc.job("Outer").last_duration_ms == 12_000
    assert jc.job("through").last_duration_ms == 12_000


def _two_running(jc: JC) -> tuple[JC, _Worker, dict[str, int]]:
    """Tasks a and b, each running under the test's worker: their run ids by name."""
    jc.create(task("a", "true", active=True), task("b", "true", active=True))
    worker = _Worker(jc)
    runs = {}
    for name in ("a", "b"):
        jc.run_now(name)
        runs[name] = worker.claim(name).id
    return jc, worker, runs


def test_ends_kept_on_disk_are_recorded_once_and_only_on_their_database(
    sqlite_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    """What a worker stopped during an outage keeps (``keptends``): recorded by the next
    start compare-and-set, a settled run left as settled, another database's ends left
    in the file for its own daemon, and a line no version wrote skipped."""
    from jobcontrol.worker import keptends

    jc, worker, runs = _two_running(make_jc(sqlite_url, slots=0, poll_interval=3600.0))
    spool = tmp_path / "spool"
    ended = jc.clock.now() + timedelta(seconds=7)
    values = {"state": RunState.KILLED, "exit_status": 255, "ended": ended, "duration_ms": 7000}
    for run_id in runs.values():
        keptends.keep(spool, worker.rq, run_id, "w-test", dict(values), 5)
    path = spool / keptends.FILE
    assert path.stat().st_mode & 0o777 == 0o600
    elsewhere = Store("postgresql+psycopg://jc:hunter2@db.example/jc")
    keptends.keep(spool, RunQueue(elsewhere), 4242, "w-other", dict(values), 5)
    assert "hunter2" not in path.read_text()
    with path.open("a") as f:
        f.write("{not json\n")
    # b was settled meanwhile (its lease ran out): its kept end must not overwrite that.
    worker.finish(runs["b"], 3)

    assert keptends.record(worker.rq, spool) == [runs["a"]]
    a, b = jc.run(runs["a"]), jc.run(runs["b"])
    assert (a.state, a.exit_status, a.ended) == (RunState.KILLED, 255, ended)
    assert (b.state, b.exit_status) == (RunState.FAILED, 3)
    (left,) = path.read_text().splitlines()  # the other database's, for its daemon
    assert '"run_id": 4242' in left
    assert keptends.record(worker.rq, spool) == []  # nothing of this database's is left
    assert path.exists()
    mark = jc.rec.mark()
    for run_id in runs.values():
        worker.announce(run_id)
    assert jc.rec.run_finished("a", since=mark)["state"] == "killed"
    jc.errors.records.clear()  # the unreadable line's error is the point


def test_an_end_kept_while_another_process_records_the_file_is_not_lost(
    sqlite_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    """A worker that keeps an end while a new start records the file (two processes on
    one spool: a stop that overlaps the next start) must lose it neither way: the
    recorder must not read a file created and not yet written, and a writer must not
    append to a file the recorder has read and removed. Both take the file's lock."""
    from jobcontrol.worker import keptends

    jc, worker, runs = _two_running(make_jc(sqlite_url, slots=0, poll_interval=3600.0))
    spool = tmp_path / "spool"
    spool.mkdir(mode=0o700)
    path = spool / keptends.FILE
    values = {"state": RunState.SUCCEEDED, "exit_status": 0, "ended": jc.clock.now()}
    values["duration_ms"] = 5

    # A writer has made the file and holds it, its line not yet written.
    writer = keptends._locked(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    recorded: list[list[int]] = []
    recorder = threading.Thread(target=lambda: recorded.append(keptends.record(worker.rq, spool)))
    recorder.start()
    recorder.join(0.5)
    assert recorder.is_alive(), "the recorder waits for the writer"
    other = spool / "other"
    keptends.keep(other, worker.rq, runs["a"], "w-test", dict(values), 5)
    os.write(writer, (other / keptends.FILE).read_bytes())
    os.close(writer)
    recorder.join(10)
    assert recorded == [[runs["a"]]]
    assert jc.run(runs["a"]).state is RunState.SUCCEEDED

    # A recorder holds the file; a writer waits, then finds it removed: a new file.
    keptends.keep(spool, worker.rq, runs["a"], "w-test", dict(values), 5)  # recorded already
    holder = keptends._locked(path, os.O_RDWR)
    keeper = threading.Thread(
        target=keptends.keep, args=(spool, worker.rq, runs["b"], "w-test", dict(values), 5)
    )
    keeper.start()
    keeper.join(0.5)
    assert keeper.is_alive(), "the writer waits for the recorder"
    path.unlink()
    os.close(holder)
    keeper.join(10)
    assert keptends.record(worker.rq, spool) == [runs["b"]]
    assert jc.run(runs["b"]).state is RunState.SUCCEEDED
    for run_id in runs.values():  # heard, so the tree runs end before the teardown's stop
        worker.announce(run_id)


@pytest.mark.postgres
def test_a_timer_run_cut_off_by_an_outage_shows_as_due_not_as_a_run_in_flight(
    postgres_server: PostgresServer, postgres_url: str, make_jc: MakeJC
) -> None:
    """PostgreSQL goes away while the dispatcher starts a timer's tree run, between the
    timer leaving the armed ones and the run's first row: the transaction is lost, and
    until the database answers again ``/status`` says what the database says (the timer
    came due, its run waits for the database), not a run in flight with no run id."""
    jc = make_jc(postgres_url, poll_interval=0.2)
    jc.create(
        box("Ticker", timer="every 1s", active=True),
        task("tick", "true", "Ticker", active=True),
    )
    jc.advance(1)
    jc.wait_quiet()
    assert len(jc.runs("tick")) == 1
    dbname = postgres_url.rsplit("/", 1)[1]
    d = jc.dispatcher
    with (
        postgres_server.connect(dbname) as locker,
        postgres_server.connect("postgres", autocommit=True) as admin,
    ):
        # The run table held, so the tree run's first insert waits: the timer has fired
        # and the tree run is in the dispatcher's memory, its row not written yet.
        locker.execute("LOCK TABLE run IN ACCESS EXCLUSIVE MODE")
        mine = locker.info.backend_pid
        jc.timers.advance(timedelta(seconds=5))
        _wait_for_the_run_insert_to_wait(admin, dbname)
        admin.execute(
            sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(dbname))
        )
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> %s",
                (dbname, mine),
            )
            poll_until("the dispatcher to meet the outage", lambda: d.outage.down)
            poll_until("tries to rebuild", lambda: d.outage.state().failures >= 2)
            status = d.status()
            assert (status["timers_armed"], status["timers_due"]) == (0, 1), status
            assert [t["job"] for t in status["due_timers"]] == ["Ticker"], status
            assert status["runs_in_flight"] == [], status
            assert d.busy_jobs() == []
        finally:
            admin.execute(
                sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(
                    sql.Identifier(dbname)
                )
            )
            locker.rollback()
    poll_until("the database to answer the dispatcher", lambda: not d.outage.down)
    jc.wait_quiet(fire_due_timers=True)  # the manual timers fire what came due
    ticks = jc.runs("tick")
    assert len(ticks) == 2, ticks  # the timer's run, once (misfire rule: run once)
    assert ticks[0].state is RunState.SUCCEEDED
    status = d.status()
    assert (status["timers_armed"], status["timers_due"], status["runs_in_flight"]) == (1, 0, [])


def _wait_for_the_run_insert_to_wait(admin: psycopg.Connection[Any], dbname: str) -> None:
    """Until a tree run's insert waits for the lock on the run table (PostgreSQL)."""

    def insert_waiting() -> bool:
        rows = admin.execute(
            "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND wait_event_type = "
            "'Lock' AND query ILIKE 'INSERT INTO run %%'",
            (dbname,),
        ).fetchall()
        return bool(rows)

    poll_until("the tree run's insert to wait for the table", insert_waiting)


@pytest.mark.postgres
def test_a_read_the_dispatcher_cannot_take_names_the_database_that_holds_it_up(
    postgres_server: PostgresServer, postgres_url: str, make_jc: MakeJC
) -> None:
    """A PostgreSQL statement of the dispatcher waits (a table lock here; a server
    stopped by SIGSTOP alike), its transaction begun, so the tree cannot be read: a
    request that names a job (``history``, ``show``) is refused after the edit timeout.
    The refusal says why, the database, not only that the dispatcher did not answer
    (which reads as a daemon gone wrong)."""
    jc = make_jc(postgres_url, poll_interval=0.2, edit_timeout=1.0)
    jc.create(
        box("Ticker", timer="every 1s", active=True),
        task("tick", "true", "Ticker", active=True),
    )
    dbname = postgres_url.rsplit("/", 1)[1]
    with (
        postgres_server.connect(dbname) as locker,
        postgres_server.connect("postgres", autocommit=True) as admin,
    ):
        locker.execute("LOCK TABLE run IN ACCESS EXCLUSIVE MODE")
        try:
            jc.timers.advance(timedelta(seconds=5))  # the tree run's first insert waits
            _wait_for_the_run_insert_to_wait(admin, dbname)
            with pytest.raises(BusyError) as refused:
                jc.engine.job_id("tick")
        finally:
            locker.rollback()
    message = str(refused.value)
    assert message.startswith("the dispatcher did not answer within 1s: "), message
    assert "the database has not answered a write of jc-dispatcher for " in message, message
    jc.wait_quiet(fire_due_timers=True)
    assert jc.engine.job_id("tick") > 0  # the lock gone, the tree reads again


def test_a_lock_held_short_of_the_busy_timeout_settles_no_healthy_run(
    sqlite_url: str, make_jc: MakeJC
) -> None:
    """Another process holds SQLite's write lock for less than the busy timeout: a slow
    database, not an outage. The worker's heartbeats wait for it, so the run's lease runs
    out meanwhile; the dispatcher, whose poll waited for the same lock, must not settle
    the healthy run as lost: it judges leases again only once heartbeats had a lease's
    time to renew them. The task then ends with its real outcome."""
    jc = make_jc(sqlite_url, busy_timeout=5.0, poll_interval=0.2, lease=3.0)
    # Its lane's leases: 3 s, renewed by a heartbeat every second.
    jc.engine.lanes.set_lane("default", {"stale_timeout_s": 3.0}, user=USER)
    gate = jc.gate()
    jc.create(box("Long", active=True), task("held", gate.command, "Long", active=True))
    mark = jc.rec.mark()
    root = jc.run_now("Long")
    held = _task_running(jc, "held", mark)
    d = jc.dispatcher
    # Leases are judged from a lease after the start on: wait until they are.
    poll_until("leases to be judged", lambda: time.monotonic() > d._leases_judged_after)

    with _write_lock_held(sqlite_url):  # released before the busy timeout: nothing fails
        jc.clock.set(jc.clock.now() + timedelta(seconds=10))  # its lease runs out, unrenewed
        # The heartbeat (every second) and the dispatcher's poll (every 0.2 s) wait for the
        # lock; so does a write of the test's own, which says when the wait is long.
        waiter = threading.Thread(target=_one_write, args=(jc.store,), daemon=True)
        waiter.start()

        def held_long() -> bool:
            longest = jc.store.longest_write()
            return longest is not None and longest[1] > 2.0

        poll_until("the writes to wait past a hold-up", held_long)
    waiter.join(LOCK_WAIT)
    assert not d.outage.down
    # Past the lease after the hold, leases are judged again: the heartbeat renewed it.
    ended_hold = time.monotonic()
    poll_until("leases judged again", lambda: not jc.store.held_up_within(3.0))
    seen = d.stats.events
    poll_until(
        "a few more polls, or the run settled",
        lambda: d.stats.events > seen + 3 or jc.run(held).state is not RunState.RUNNING,
    )
    assert time.monotonic() - ended_hold > 3.0
    assert jc.run(held).state is RunState.RUNNING, jc.run(held)
    gate.open()
    finished = jc.rec.run_finished("Long", since=mark, timeout=30)
    assert (finished["id"], finished["state"], finished["exit_status"]) == (root, "succeeded", 0)
    assert jc.run(held).exit_status == 0


def _one_write(store: Store) -> None:
    with store.write():
        pass


@pytest.mark.postgres
def test_a_tree_runs_end_cut_off_by_an_outage_leaves_the_run_in_flight(
    postgres_server: PostgresServer, postgres_url: str, make_jc: MakeJC
) -> None:
    """PostgreSQL goes away while the dispatcher reacts to a tree run's end, after the run
    left the runs in flight and before its next timer was armed: until the database
    answers again ``/status`` shows the run still in flight (its end is not committed),
    not a tree with neither a run nor a timer."""
    jc = make_jc(postgres_url, poll_interval=0.2)
    gate = jc.gate()
    jc.create(
        box("Ticker", timer="every 1s", active=True),
        task("tick", gate.command, "Ticker", active=True),
    )
    mark = jc.rec.mark()
    jc.advance(1)
    _task_running(jc, "tick", mark)
    dbname = postgres_url.rsplit("/", 1)[1]
    d = jc.dispatcher
    with (
        postgres_server.connect(dbname, autocommit=True) as inside,
        postgres_server.connect("postgres", autocommit=True) as admin,
    ):
        # The write of the tree's next run (its evaluation, after the run left the runs in
        # flight) waits in a trigger, until the test ends the connection that made it.
        inside.execute(
            "CREATE FUNCTION test_hold() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN PERFORM pg_sleep(60); RETURN NEW; END $$"
        )
        inside.execute(
            "CREATE TRIGGER test_hold BEFORE UPDATE ON job FOR EACH ROW WHEN "
            "(OLD.next_runs IS DISTINCT FROM NEW.next_runs) EXECUTE FUNCTION test_hold()"
        )
        gate.open()

        def held() -> bool:
            rows = admin.execute(
                "SELECT 1 FROM pg_stat_activity WHERE datname = %s AND wait_event = 'PgSleep'",
                (dbname,),
            ).fetchall()
            return bool(rows)

        poll_until("the evaluation's write to wait in the trigger", held)
        allow = sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS {}")
        admin.execute(allow.format(sql.Identifier(dbname), sql.SQL("false")))
        try:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE datname = %s AND pid <> %s",
                (dbname, inside.info.backend_pid),
            )
            poll_until("the dispatcher to meet the outage", lambda: d.outage.down)
            poll_until("tries to rebuild", lambda: d.outage.state().failures >= 2)
            status = d.status()
            assert [r["job"] for r in status["runs_in_flight"]] == ["Ticker"], status
            assert (status["timers_armed"], status["timers_due"]) == (0, 0), status
            assert d.busy_jobs() == ["Ticker"]
        finally:
            inside.execute("DROP TRIGGER test_hold ON job")
            admin.execute(allow.format(sql.Identifier(dbname), sql.SQL("true")))
    poll_until("the database to answer the dispatcher", lambda: not d.outage.down)
    finished = jc.rec.run_finished("Ticker", since=mark, timeout=30)
    assert (finished["state"], finished["exit_status"]) == ("succeeded", 0)
    jc.wait_quiet()
    status = d.status()
    assert (status["timers_armed"], status["runs_in_flight"]) == (1, []), status


def test_a_worker_counts_a_held_sqlite_write_lock_as_one_outage(
    sqlite_url: str, tmp_path: Path
) -> None:
    """In WAL mode reads pass while another process holds the write lock: the worker's
    looks for work go through between its failed heartbeats. They must not end its
    outage (one outage, said once, down all through), only a write that begins does."""
    from jobcontrol.clock import SystemClock
    from jobcontrol.worker import Worker

    store = Store(sqlite_url, busy_timeout=0.3)
    store.upgrade()
    worker = Worker(
        RunQueue(store, timedelta(seconds=2)),
        clock=SystemClock(),
        log_root=tmp_path / "logs",
        instance_id=store.instance_id(),
        name="w",
        slots=1,
        poll_interval=0.1,
        heartbeat_interval=0.3,
    )
    worker.start()
    try:
        with _write_lock_held(sqlite_url):
            poll_until("a beat to fail", lambda: worker.outage.down)
            # Several beats fail, with looks (reads that pass) between them.
            poll_until("beats to fail again", lambda: worker.outage.state().failures >= 4)
            state = worker.outage.state()
            assert (state.down, state.outages) == (True, 1), state
        poll_until("the worker to write again", lambda: not worker.outage.down)
        assert worker.outage.state().outages == 1
    finally:
        worker.stop(10)
        store.dispose()


def _slot_waits_to_write(store: Store, longer_than: float) -> bool:
    """Whether a slot thread's write has waited ``longer_than`` seconds so far."""
    names = {t.ident: t.name for t in threading.enumerate()}
    now = time.monotonic()
    return any(
        names.get(ident, "").startswith("jc-slot") and now - began > longer_than
        for ident, began in store._writes.copy().items()
    )


def test_a_task_taken_with_its_predecessors_end_starts_when_the_lock_is_had(
    sqlite_url: str, make_jc: MakeJC
) -> None:
    """Another process holds SQLite's write lock as a sequence's task ends; the worker's
    write of that end waits for it, and takes the next task in the same transaction.
    That task starts at the time the lock was had, not at the time the write began: its
    duration and its job's last run would otherwise count the wait (20 s here, on the
    test's clock)."""
    jc = make_jc(sqlite_url, busy_timeout=5.0, poll_interval=0.2)
    gate = jc.gate()
    jc.create(
        box("Seq", active=True),
        task("first", gate.command, "Seq", active=True),
        task("second", "true", "Seq", active=True),
    )
    mark = jc.rec.mark()
    jc.run_now("Seq")
    first = _task_running(jc, "first", mark)
    with _write_lock_held(sqlite_url):
        gate.open()
        poll_until("first's process to end", lambda: not jc.task_pids(first))
        poll_until(
            "a slot's write to wait for the lock", lambda: _slot_waits_to_write(jc.store, 0.3)
        )
        before = jc.clock.now()
        jc.clock.set(before + timedelta(seconds=20))  # the wait, as the clock sees it
    done = jc.rec.run_finished("second", since=mark, timeout=30)
    second = jc.run(done["id"])
    assert second.id == first + 1, "taken with the end: queued ahead"
    assert second.started is not None
    assert second.started >= before + timedelta(seconds=20), (second.started, before)
    assert second.duration_ms is not None
    assert second.duration_ms < 10_000, second
    jc.rec.run_finished("Seq", since=mark, timeout=30)


def test_requests_during_a_sqlite_outage_are_refused_at_once_and_change_nothing(
    sqlite_url: str, make_jc: MakeJC
) -> None:
    """Another process holds SQLite's write lock past the busy timeout: the dispatcher
    rides the outage out. A run, a kill or an edit asked meanwhile is refused at once
    with the outage (503 over the API), not after waiting behind the dispatcher's tries
    for another busy timeout; nothing of it is done once the database is back."""
    busy = 4.0
    jc = make_jc(sqlite_url, busy_timeout=busy, poll_interval=0.2)
    jc.create(
        box("Ticker", timer="every 1s", active=True),
        task("tick", "true", "Ticker", active=True),
        box("Other", active=True),
        task("other", "true", "Other", active=True),
    )
    jc.advance(1)
    jc.wait_quiet()
    description = jc.job("other").description
    with _write_lock_held(sqlite_url):
        jc.timers.advance(timedelta(seconds=5))  # the ticker's handler meets the lock
        poll_until("the dispatcher to meet the outage", lambda: jc.dispatcher.outage.down)
        for name, ask in (
            ("run", lambda: jc.engine.run_now("Other", user=USER)),
            ("kill", lambda: jc.engine.kill("Ticker", user=USER)),
            ("edit", lambda: jc.modify("other", description="changed")),
        ):
            began = time.monotonic()
            with pytest.raises(StoreUnavailable, match="does not answer"):
                ask()
            took = time.monotonic() - began
            assert took < busy / 2, f"{name} refused after {took:.1f}s, not at once"
    poll_until("the database to answer the dispatcher", lambda: not jc.dispatcher.outage.down)
    jc.wait_quiet()
    assert jc.runs("other") == [], "the refused run was not made"
    assert jc.job("other").description == description, "the refused edit was not made"


def test_an_outage_met_by_a_handler_is_not_taken_for_a_pause_of_the_dispatcher(
    sqlite_url: str, make_jc: MakeJC, caplog: pytest.LogCaptureFixture
) -> None:
    """The handler that meets a held SQLite lock waits the busy timeout (past the 5 s a
    late back-up poll calls a pause) before the outage is known. That wait is the
    outage's, ridden out: the log says the outage, not "the dispatcher did not run"."""
    jc = make_jc(sqlite_url, busy_timeout=6.0, poll_interval=0.2)
    gate = jc.gate()
    jc.create(
        box("Ticker", timer="every 1s", active=True),
        task("tick", "true", "Ticker", active=True),
        box("Long", active=True),
        task("through", gate.command, "Long", active=True),
    )
    jc.advance(1)
    jc.wait_quiet()
    mark = jc.rec.mark()
    jc.run_now("Long")
    _task_running(jc, "through", mark)  # a run in flight: the back-up poll is due
    with _write_lock_held(sqlite_url):
        jc.timers.advance(timedelta(seconds=5))  # the ticker's handler meets the lock
        poll_until("the dispatcher to meet the outage", lambda: jc.dispatcher.outage.down)
    poll_until("the database to answer the dispatcher", lambda: not jc.dispatcher.outage.down)
    seen = jc.dispatcher.stats.events
    poll_until("a few back-up polls", lambda: jc.dispatcher.stats.events > seen + 3)
    said = caplog.text
    assert "the database does not answer" in said
    assert "did not run for" not in said, said
    gate.open()
    jc.rec.run_finished("Long", since=mark, timeout=30)


def test_a_request_the_dispatcher_cannot_take_in_time_is_withdrawn_not_done_later(
    sqlite_url: str, make_jc: MakeJC
) -> None:
    """The dispatcher's handler waits for a SQLite lock another process holds (a slow
    database, not yet an outage) when a run is asked: past the edit timeout the request
    is refused as busy, saying nothing was done, and it is not carried out once the
    lock goes (it used to answer 500 and run the tree anyway)."""
    jc = make_jc(sqlite_url, busy_timeout=8.0, poll_interval=0.2, edit_timeout=1.0)
    jc.create(
        box("Ticker", timer="every 1s", active=True),
        task("tick", "true", "Ticker", active=True),
        box("Asked", active=True),
        task("asked", "true", "Asked", active=True),
    )
    jc.advance(1)
    jc.wait_quiet()
    with _write_lock_held(sqlite_url):
        jc.timers.advance(timedelta(seconds=5))  # the ticker's handler waits for the lock
        poll_until("the dispatcher to wait for the lock", lambda: jc.dispatcher._beginning)
        began = time.monotonic()
        with pytest.raises(BusyError, match="nothing was done"):
            jc.engine.run_now("Asked", user=USER)
        # Refused within the edit timeout, its audit entry not waiting for the lock.
        assert time.monotonic() - began < 4.0
    jc.wait_quiet()  # through the dispatcher's queue: past where the request was
    assert jc.runs("asked") == [], "the withdrawn request was carried out after all"


def test_a_write_that_met_an_outage_says_so_until_one_commits(sqlite_url: str) -> None:
    """``Store.unavailable``: the error of a write that waited out the busy timeout, for
    any part of the process to refuse requests at once; gone once a write commits."""
    store = Store(sqlite_url, busy_timeout=0.3)
    store.upgrade()
    try:
        assert store.unavailable() is None
        with _write_lock_held(sqlite_url):
            with pytest.raises(StoreUnavailable), store.write():
                pass
            error = store.unavailable()
            assert error is not None
            assert "locked" in error
            # A write that does not wait does not say the database is away.
            with pytest.raises(StoreUnavailable), store.write(wait=False):
                pass
            assert store.unavailable() == error
        with store.write():
            pass
        assert store.unavailable() is None
    finally:
        store.dispose()


def _long_tree_running(make_jc: MakeJC, sqlite_url: str) -> tuple[JC, int]:
    """A daemon whose tree ``Long`` runs its task ``through`` (a gate never opened), on a
    SQLite database with a short busy timeout; and that task's run."""
    jc = make_jc(sqlite_url, busy_timeout=0.5, poll_interval=0.2)
    gate = jc.gate()
    jc.create(box("Long", active=True), task("through", gate.command, "Long", active=True))
    mark = jc.rec.mark()
    jc.run_now("Long")
    return jc, _task_running(jc, "through", mark)


def test_a_stop_kills_the_runs_in_flight_though_a_worker_just_met_an_outage(
    sqlite_url: str, make_jc: MakeJC, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop that kills (``daemon stop --kill``, a daemon whose lock another took) asks
    the runs in flight to end even while another part of the process still reports the
    outage it met a moment ago (the embedded worker, backing off after its connection
    was cut). It used to be refused at once, the runs never asked to end, and the stop
    waited its whole time for them (found by CI: a daemon that had to stop ran on)."""
    jc, run_id = _long_tree_running(make_jc, sqlite_url)
    with _write_lock_held(sqlite_url):
        with pytest.raises(StoreUnavailable), jc.store.write():
            pass  # what the worker's write met
    assert jc.store.unavailable() is not None, "the outage met is still reported"
    jc.close(timeout=60)
    said = caplog.text
    assert "not recorded" not in said, said
    assert "stopping with" not in said, said
    run = jc.run(run_id)
    assert run.state is RunState.KILLED, run


def _stop_whose_kill_is_refused(jc: JC, sqlite_url: str) -> None:
    """``jc`` stopped with its kills while another process holds the write lock: the
    kill's transaction waits out the busy timeout, is refused, and the dispatcher rides
    the outage out once the lock is let go. The stop must end well within its time."""
    dispatcher = jc.runtime.dispatcher
    closing = threading.Thread(target=lambda: jc.close(timeout=60), name="closing")
    with _write_lock_held(sqlite_url):
        closing.start()
        poll_until("the kill refused", lambda: dispatcher.outage.down, LOCK_WAIT)
    closing.join(LOCK_WAIT * 2)
    assert not closing.is_alive(), "the stop waited for runs it had not asked to end"


def test_a_stop_asks_again_for_the_kills_an_outage_refused(
    sqlite_url: str, make_jc: MakeJC, caplog: pytest.LogCaptureFixture
) -> None:
    """A stop that kills, whose request to kill meets an outage of the dispatcher's own
    (refused, as every request an outage meets is), asks again once the dispatcher has
    ridden it out. It used to give up at once and then wait its whole time for the runs
    it never asked to end (found by CI: a daemon whose lock another took ran on)."""
    jc, run_id = _long_tree_running(make_jc, sqlite_url)
    _stop_whose_kill_is_refused(jc, sqlite_url)
    said = caplog.text
    assert "not recorded" not in said, said
    assert "stopping with" not in said, said
    run = jc.run(run_id)
    assert run.state is RunState.KILLED, run


def test_a_deposed_dispatcher_does_not_rebuild_nor_ask_again_for_its_kills(
    sqlite_url: str, make_jc: MakeJC, caplog: pytest.LogCaptureFixture
) -> None:
    """Another daemon took the database while this one's connection was lost (``depose``):
    the runs the database has in flight are the other's. A stop whose kills an outage
    refused must not rebuild from the database and ask again: that kill would end the
    other daemon's runs. Its own are killed by its worker on the way out."""
    jc, run_id = _long_tree_running(make_jc, sqlite_url)
    jc.runtime.dispatcher.depose()
    _stop_whose_kill_is_refused(jc, sqlite_url)
    said = caplog.text
    assert "the kills of the runs in flight are not recorded" in said, said
    assert "rebuilt from the database" not in said, said
    run = jc.run(run_id)
    assert (run.state, run.reason) == (RunState.KILLED, "killed: the daemon stopped"), run


def test_the_daemons_outage_began_when_its_first_part_lost_the_database(
    sqlite_url: str, make_jc: MakeJC
) -> None:
    """Health's ``since`` is when the daemon's outage began: it does not move on while the
    parts come back one by one, the first one down back first."""
    jc = make_jc(sqlite_url)
    worker = jc.runtime.worker
    assert worker is not None
    cut = StoreUnavailable("database is locked")
    jc.dispatcher.outage.failed(cut)
    began = jc.runtime.database()["since"]
    assert began is not None
    poll_until("the clock to move on", lambda: time.time() > began)
    worker.outage.failed(cut)
    assert worker.outage.state().since > began
    jc.dispatcher.outage.recovered()  # the first part down is back first
    state = jc.runtime.database()
    assert (state["ok"], state["since"], state["outages"]) == (False, began, 1), state
    worker.outage.recovered()
    assert jc.runtime.database()["since"] is None
    # The next outage has a beginning of its own.
    worker.outage.failed(cut)
    again = jc.runtime.database()
    assert (again["since"], again["outages"]) == (worker.outage.state().since, 2), again
    worker.outage.recovered()
