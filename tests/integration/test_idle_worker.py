"""An idle worker beats once a minute, not every third of a lease, and says so in the
registry; a claim brings its next beat forward, so the leases of the runs it takes are
renewed as before. Where it hears of what others do (a watched SQLite database,
``ChangeWatch``; on PostgreSQL a relay that listens) its groups look for work only at
news: the database written by someone else, another process's notification, a run its
beat saw queued.

Nothing sleeps: a window of time is another worker's beats, on a database of its own.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from jobcontrol import events
from jobcontrol.clock import SystemClock
from jobcontrol.model import RunState
from jobcontrol.store import Store, queries
from jobcontrol.store.relay import Relay
from jobcontrol.store.runqueue import RunQueue, get_worker
from jobcontrol.worker import Worker
from jobcontrol.worker.local import NEWS_SETTLE_S
from tests.acceptance.harness import wait_until
from tests.integration.helpers import Gate
from tests.integration.test_lanes_runqueue import set_lane
from tests.integration.test_slot_groups import queue_run, state_of

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0
BEAT = 0.2  # its beat while it holds runs
IDLE = 600.0  # its beat while it holds none: never, within a test


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[list[Store]]:
    made: list[Store] = []
    yield made
    for s in made:
        s.dispose()


@pytest.fixture
def workers() -> Iterator[list[Worker]]:
    started: list[Worker] = []
    yield started
    for w in started:
        w.kill_all("test over")
        w.stop(10)


def a_store(url: str, stores: list[Store]) -> Store:
    store = Store(url)
    store.upgrade()
    stores.append(store)
    return store


@pytest.fixture
def relays() -> Iterator[list[Relay]]:
    started: list[Relay] = []
    yield started
    for r in started:
        r.stop()


def a_relay(store: Store, name: str, relays: list[Relay]) -> Relay:
    """What a process on PostgreSQL has (the daemon, a worker process): its relay."""
    relay = Relay(store, name=name)
    relays.append(relay)
    relay.start()
    assert relay.listening, relay.health()
    return relay


def a_worker(
    queue: RunQueue, tmp_path: Path, workers: list[Worker], name: str, **kw: Any
) -> Worker:
    worker = Worker(
        queue,
        clock=SystemClock(),
        log_root=tmp_path / name,
        instance_id="idle-test",
        name=name,
        slots=1,
        heartbeat_interval=BEAT,
        **kw,
    )
    worker.start()
    workers.append(worker)
    return worker


def relayed_worker(
    url: str,
    tmp_path: Path,
    stores: list[Store],
    workers: list[Worker],
    relays: list[Relay],
    idle: float,
) -> tuple[Store, Relay, Worker]:
    """A worker wired as the daemon's embedded one is on PostgreSQL (``Runtime.start``):
    its process's relay listens, and tells it whether it does."""
    store = a_store(url, stores)
    relay = a_relay(store, "daemon", relays)
    worker = a_worker(
        RunQueue(store),
        tmp_path,
        workers,
        "quiet",
        idle_heartbeat=idle,
        lane_pushes=lambda: relay.listening,
    )
    return store, relay, worker


def five_seconds_pass(tmp_path: Path, stores: list[Store], workers: list[Worker]) -> None:
    """A window of time with no sleep: twenty-five beats (5 s) of a worker on a database
    of its own, which nothing under test reads."""
    other = a_store(f"sqlite:///{tmp_path / 'other.db'}", stores)
    clock = a_worker(RunQueue(other), tmp_path, workers, "clock")
    clock.wait_for("twenty-five beats", lambda: clock.beats >= 25, WAIT)


def beat_s(store: Store, name: str) -> float | None:
    with store.read() as conn:
        row = get_worker(conn, name)
    assert row is not None
    return row["beat_s"]


def lease_until(store: Store, run_id: int) -> object:
    with store.read() as conn:
        return queries.get_run(conn, run_id).lease_until  # type: ignore[union-attr]


def test_an_idle_worker_beats_at_its_idle_interval_and_hurries_when_it_takes_a_run(
    db_url: str, tmp_path: Path, stores: list[Store], workers: list[Worker]
) -> None:
    store = a_store(db_url, stores)
    queue = RunQueue(store, lease=timedelta(seconds=1))
    worker = a_worker(queue, tmp_path, workers, "idler", idle_heartbeat=IDLE)
    worker.wait_for("a first beat", lambda: worker.beats >= 1, WAIT)
    assert beat_s(store, "idler") == IDLE, "an idle worker says it beats once in IDLE"

    gate = Gate(tmp_path / "gate.fifo")
    try:
        run_id = queue_run(store, "held", gate.command, queue="default")
        worker.wake()
        worker.wait_for("the run claimed", lambda: run_id in worker.groups()[0].runs, WAIT)
        first = lease_until(store, run_id)
        # The claim's lease is 1 s: only a beat hurried by the claim renews it in time.
        worker.wait_for(
            "the lease renewed",
            lambda: lease_until(store, run_id) > first,  # type: ignore[operator]
            WAIT,
        )
        assert beat_s(store, "idler") == BEAT, "a worker with runs says its busy beat"
        gate.open(1)
        worker.wait_for("the run ended", lambda: not worker.groups()[0].runs, WAIT)
    finally:
        gate.close()
    assert state_of(store, run_id) is RunState.SUCCEEDED
    beats = worker.beats
    worker.wait_for("idle again", lambda: beat_s(store, "idler") == IDLE, WAIT)
    assert worker.beats <= beats + 1, "one beat to say it is idle again"


def test_an_idle_worker_on_a_watched_database_does_not_look_until_it_is_written(
    sqlite_url: str, tmp_path: Path, stores: list[Store], workers: list[Worker]
) -> None:
    store = a_store(sqlite_url, stores)
    worker = a_worker(RunQueue(store), tmp_path, workers, "quiet", idle_heartbeat=IDLE)
    assert worker.poll_interval <= 2.0  # unwatched, its group would look within 1 s, 2 s, 4 s
    # Its start: a look at once, and one more a back-off later if its first beat found
    # the database written after that look (its joining the registry).
    worker.wait_for("quiet", lambda: worker.beats >= 1 and worker.groups()[0].quiet, WAIT)
    looks, beats = worker.groups()[0].looks, worker.beats
    # A window of time in which an unwatched group would have looked again (4 s later).
    five_seconds_pass(tmp_path, stores, workers)
    assert worker.groups()[0].looks == looks, "nothing written: nothing to look for"
    assert worker.groups()[0].quiet
    assert worker.beats == beats == 1

    # A run queued by a write that announces nothing in this process (another process,
    # the CLI with no daemon): the watch's news makes the group look.
    run_id = queue_run(store, "quick", "true", queue="default")
    worker.wait_for("the run claimed", lambda: worker.groups()[0].looks > looks, WAIT)

    worker.wait_for("the run ended", lambda: state_of(store, run_id) is RunState.SUCCEEDED, WAIT)


class _WrittenWhileItLooks(RunQueue):
    """A run queue whose first look, once armed, reads before a run is queued and
    answers after: the run's write, and the watch's news of it, come while the worker's
    group looks (inotify tells of a journal written before its commit is visible)."""

    worker: Worker | None = None
    queued: int | None = None

    def any_queued(self, queues: Any = None) -> bool:
        found = super().any_queued(queues)
        worker, self.worker = self.worker, None
        if worker is not None:
            news = worker._news
            self.queued = queue_run(self.store, "late", "true", queue="default")
            # The watch's news of that write, all of it, before this look answers (nothing
            # found): read here as its heartbeat thread would while the look goes on.
            worker._written()
            assert worker._news > news, "the watch never told"
        return found


def test_a_run_queued_while_a_quiet_group_looks_is_claimed(
    sqlite_url: str, tmp_path: Path, stores: list[Store], workers: list[Worker]
) -> None:
    """News that comes while a group looks is not answered by that look: the group looks
    again rather than wait, quiet, for news that already came (an idle minute-beat
    worker left such a run queued ten minutes)."""
    store = a_store(sqlite_url, stores)
    queue = _WrittenWhileItLooks(store)
    worker = a_worker(queue, tmp_path, workers, "quiet", idle_heartbeat=IDLE)
    worker.wait_for("quiet", lambda: worker.beats >= 1 and worker.groups()[0].quiet, WAIT)
    looks = worker.groups()[0].looks
    queue.worker = worker
    with store.write() as conn:  # news, and nothing to claim: the quiet group looks
        conn.execute(text("CREATE TABLE IF NOT EXISTS scratch (x INTEGER)"))
    worker.wait_for("a look", lambda: queue.queued is not None, WAIT)
    assert queue.queued is not None
    late = queue.queued
    # Looked for again after its back-off (at most 8 s after four empty looks).
    worker.wait_for(
        "the late run ended", lambda: state_of(store, late) is RunState.SUCCEEDED, 2 * WAIT
    )
    assert worker.groups()[0].looks >= looks + 2, "a second look found it"


def test_an_idle_worker_that_met_an_outage_tries_again_at_the_busy_beat(
    sqlite_url: str, tmp_path: Path, stores: list[Store], workers: list[Worker]
) -> None:
    """Health says the database is down while the worker has not heard it answer again:
    an idle worker that met a locked database must not wait a whole idle beat to retry."""
    store = Store(sqlite_url, busy_timeout=0.2)
    store.upgrade()
    stores.append(store)
    worker = a_worker(RunQueue(store), tmp_path, workers, "retrier", idle_heartbeat=IDLE)
    worker.wait_for("a first beat", lambda: worker.beats >= 1, WAIT)
    blocker = sqlite3.connect(sqlite_url.split("///", 1)[1], timeout=WAIT)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock, held past the busy timeout
    try:
        worker.wake()  # its claim meets the lock, and the beat it hurries meets it too
        worker.wait_for("two failures", lambda: worker.outage.state().failures >= 2, WAIT)
        assert worker.outage.down
    finally:
        blocker.rollback()
        blocker.close()
    worker.wait_for("the database again", lambda: not worker.outage.down, WAIT)
    assert worker.beats >= 2


def test_a_lease_shortened_while_a_run_is_held_brings_the_next_beat_forward(
    db_url: str, tmp_path: Path, stores: list[Store], workers: list[Worker]
) -> None:
    """The beat follows the lane's lease as it is now: a worker that planned its next
    beat a third of a 60-s lease on must not keep that plan once the lease is 1.5 s,
    or the runs it holds are settled lost while they run."""
    store = a_store(db_url, stores)
    set_lane(store, "default", stale_timeout_s=60.0)
    worker = Worker(  # its beat from the lanes, as the daemon's embedded worker's is
        RunQueue(store),
        clock=SystemClock(),
        log_root=tmp_path / "follower",
        instance_id="idle-test",
        name="follower",
        slots=1,
        idle_heartbeat=IDLE,
    )
    worker.start()
    workers.append(worker)
    worker.wait_for("a first beat", lambda: worker.beats >= 1, WAIT)
    gate = Gate(tmp_path / "gate.fifo")
    try:
        run_id = queue_run(store, "held", gate.command, queue="default")
        worker.wake()
        worker.wait_for("the run claimed", lambda: run_id in worker.groups()[0].runs, WAIT)
        first = lease_until(store, run_id)  # 60 s on: the next beat was planned 20 s on
        beats = worker.beats
        set_lane(store, "default", stale_timeout_s=1.5)
        worker.wait_for(
            "the lease renewed at the new length",
            # and that beat counted: the beat commits the lease before it counts itself
            lambda: lease_until(store, run_id) != first and worker.beats > beats,
            WAIT / 2,  # well short of the 20 s planned under the old lease
        )
        assert worker.heartbeat_interval == 0.5
        assert worker.beats > beats
    finally:
        worker.kill_all("test over")
        gate.close()


@pytest.mark.postgres
def test_an_idle_worker_whose_relay_listens_looks_only_at_news_from_other_processes(
    postgres_url: str,
    tmp_path: Path,
    stores: list[Store],
    workers: list[Worker],
    relays: list[Relay],
) -> None:
    store, _, worker = relayed_worker(postgres_url, tmp_path, stores, workers, relays, IDLE)
    worker.wait_for("quiet", lambda: worker.beats >= 1 and worker.groups()[0].quiet, WAIT)
    looks = worker.groups()[0].looks
    # A window of time in which a group that backs off (1 s, 2 s, 4 s) looks twice.
    five_seconds_pass(tmp_path, stores, workers)
    assert worker.groups()[0].looks == looks, "nothing heard: nothing to look for"
    assert worker.groups()[0].quiet
    assert worker.beats == 1

    # A run queued by a write that announces nothing; then another process's run ends
    # (capped lanes have room, a queued-ahead run may be released): its relay says so.
    run_id = queue_run(store, "quick", "true", queue="default")
    elsewhere = a_store(postgres_url, stores)
    a_relay(elsewhere, "elsewhere", relays)
    events.task_finished.send(elsewhere, run_id=run_id + 1000)
    worker.wait_for("the run ended", lambda: state_of(store, run_id) is RunState.SUCCEEDED, WAIT)
    assert worker.groups()[0].looks > looks


@pytest.mark.postgres
def test_a_quiet_group_backs_off_again_once_the_relay_stops_listening(
    postgres_url: str,
    tmp_path: Path,
    stores: list[Store],
    workers: list[Worker],
    relays: list[Relay],
) -> None:
    """Notifications are lost while the relay does not listen: the group must not wait
    for news it cannot hear. Its worker finds out at its next beat (here every second)
    and its group looks again as it would unannounced (nothing is queued: no beat says
    that there is something to look for)."""
    _, relay, worker = relayed_worker(postgres_url, tmp_path, stores, workers, relays, 1.0)
    worker.wait_for("quiet", lambda: worker.groups()[0].quiet, WAIT)
    looks, beats = worker.groups()[0].looks, worker.beats
    # Watched from outside: ``wait_for`` would wake the group at every beat.
    assert wait_until(lambda: worker.beats >= beats + 2, WAIT)
    assert worker.groups()[0].looks == looks, "quiet: no look at its beats"
    relay.stop()
    assert wait_until(lambda: worker.groups()[0].looks > looks, WAIT), worker.groups()
    assert not worker.groups()[0].quiet


def test_a_look_right_after_news_does_not_answer_it(
    sqlite_url: str, tmp_path: Path, stores: list[Store]
) -> None:
    """inotify tells of a SQLite write to the WAL just before its commit becomes visible
    to readers (the index in ``-shm``, written through a mapping): a look that begins
    within ``NEWS_SETTLE_S`` of the news may read the snapshot before it. Such a look
    leaves its group unquiet (it looks again after its back-off), not waiting quiet for
    news that already came."""
    now = [100.0]
    worker = Worker(
        RunQueue(a_store(sqlite_url, stores)),
        clock=SystemClock(),
        log_root=tmp_path / "settle",
        instance_id="idle-test",
        name="settle",
        slots=1,
        monotonic=lambda: now[0],
    )
    with worker._cond:
        worker._tell_groups()
        told = worker._news
        now[0] += NEWS_SETTLE_S / 2
        assert worker._news_answered() == told - 1, "too young to be answered by a look"
        now[0] += NEWS_SETTLE_S
        assert worker._news_answered() == told
