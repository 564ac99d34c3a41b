"""A worker back from a silence beats before it claims again.

A worker that could not beat for longer than its runs' leases allow (a cut link, an
outage, a SIGSTOP) may have had those runs settled by the dispatcher, which then ran
their trees on: a retry of the same task, or its sequence's next, may be queued
already. Its beat learns which were settled and kills their processes. Before, the
worker could claim first, and so run a retry of a task beside the copy of it that had
been settled. Now a claim made while no beat has vouched for its runs waits for one.

The worker's idea of elapsed time (its monotonic clock) is the test's: a silence of
half an hour is a number moved, and its beats (every ten minutes here) never come by
themselves within the test.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
from sqlalchemy import text

from jobcontrol import events
from jobcontrol.clock import SystemClock
from jobcontrol.model import RunRecord, RunState
from jobcontrol.procs import pid_alive
from jobcontrol.store import Store, queries
from jobcontrol.store.runqueue import RunQueue, get_worker
from jobcontrol.worker import Worker
from tests.integration.helpers import Gate, poll_until
from tests.integration.test_slot_groups import ManualMonotonic, queue_run

pytestmark = pytest.mark.timeout(60)

BEAT = 600.0  # its beat while it holds runs: never, within the test, unless asked


@pytest.fixture
def store(db_url: str) -> Iterator[Store]:
    s = Store(db_url)
    s.upgrade()
    yield s
    s.dispose()


def _worker(store: Store, tmp_path: Path, mono: ManualMonotonic | None = None) -> Worker:
    """A started worker ``w1`` of two slots that beats only when asked (or idle)."""
    worker = Worker(
        RunQueue(store),
        clock=SystemClock(),
        log_root=tmp_path / "logs",
        instance_id="test",
        name="w1",
        slots=2,
        heartbeat_interval=BEAT,
        **({"monotonic": mono} if mono is not None else {}),
    )
    worker.start()
    return worker


def _run(store: Store, run_id: int) -> RunRecord:
    with store.read() as conn:
        row = queries.get_run(conn, run_id)
    assert row is not None
    return row


def test_a_worker_silent_past_its_leases_kills_its_settled_run_before_it_claims(
    store: Store, tmp_path: Path
) -> None:
    mono = ManualMonotonic()
    gate = Gate(tmp_path / "held.fifo")
    worker = _worker(store, tmp_path, mono)
    try:
        held = queue_run(store, "held", gate.command, queue="default")
        events.runs_queued.send(store, run_ids=[held])
        pid = poll_until("the held task to run", lambda: _run(store, held).pid)
        # The dispatcher settles it, as when its lease ran out while the worker was away
        # (its tree goes on: here, a retry of the same task is queued).
        with store.write() as conn:
            conn.execute(
                text(
                    "UPDATE run SET state = 'lost', exit_status = 255, lease_until = NULL, "
                    "reason = 'lost: its worker stopped renewing its lease' WHERE id = :id"
                ),
                {"id": held},
            )
        settled_at = datetime.now(UTC)
        mono.t = 3 * BEAT  # ...for it, half an hour went by without a beat
        retry = queue_run(store, "held", "true", queue="default")
        events.runs_queued.send(store, run_ids=[retry])

        poll_until("the retry to run", lambda: _run(store, retry).state is RunState.SUCCEEDED)
        # Its settled copy was killed, not left running beside the retry...
        poll_until("the settled run's process to end", lambda: not pid_alive(pid))
        # ...by a beat made before the retry was claimed.
        with store.read() as conn:
            beat = get_worker(conn, "w1")
        assert beat is not None
        started = _run(store, retry).started
        assert started is not None
        assert settled_at <= beat["heartbeat"] <= started, (settled_at, beat, started)
        after = _run(store, held)
        assert (after.state, after.exit_status) == (RunState.LOST, 255)  # not overwritten
    finally:
        worker.kill_all("test over")
        worker.stop(10)
        gate.close()


def test_a_worker_that_beat_lately_claims_without_a_beat_first(
    store: Store, tmp_path: Path
) -> None:
    """The beat before a claim is for a worker back from a silence only: one that holds
    runs it vouched for lately claims at once, and asks no beat."""
    mono = ManualMonotonic()
    gate = Gate(tmp_path / "held.fifo")
    worker = _worker(store, tmp_path, mono)
    try:
        held = queue_run(store, "held", gate.command, queue="default")
        events.runs_queued.send(store, run_ids=[held])
        poll_until("the held task to run", lambda: _run(store, held).pid)
        beats = worker.beats
        mono.t = BEAT  # a beat's time, within the half lease it may be late
        other = queue_run(store, "other", "true", queue="default")
        events.runs_queued.send(store, run_ids=[other])
        poll_until("the other to run", lambda: _run(store, other).state is RunState.SUCCEEDED)
        assert worker.beats == beats
        assert _run(store, held).state is RunState.RUNNING
    finally:
        worker.kill_all("test over")
        worker.stop(10)
        gate.close()


def test_the_end_of_an_outage_brings_a_beat_that_kills_what_was_settled_meanwhile(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Whichever call of the worker meets the database again first (here a task's end,
    recorded once another process's lock is gone), a beat follows at once, not a beat's
    interval later: a run settled during the outage is killed then."""
    store = Store(sqlite_url, busy_timeout=0.2)
    store.upgrade()
    gates = {name: Gate(tmp_path / f"{name}.fifo") for name in ("first", "second")}
    worker = _worker(store, tmp_path)
    blocker = sqlite3.connect(sqlite_url.split("///", 1)[1], timeout=10)
    try:
        runs = {n: queue_run(store, n, g.command, queue="default") for n, g in gates.items()}
        events.runs_queued.send(store, run_ids=list(runs.values()))
        pids = {
            n: poll_until(f"{n} to run", lambda r=r: _run(store, r).pid) for n, r in runs.items()
        }
        with store.write() as conn:  # settled by the dispatcher while the worker was away
            conn.execute(
                text("UPDATE run SET state = 'lost', exit_status = 255 WHERE id = :id"),
                {"id": runs["second"]},
            )
        beats = worker.beats
        blocker.execute("BEGIN IMMEDIATE")  # another process's lock: the outage
        gates["first"].open()  # its end waits for the database
        poll_until("the worker to meet the outage", lambda: worker.outage.down)
        blocker.rollback()
        poll_until("the first run's end to be recorded", lambda: _run(store, runs["first"]).ended)
        poll_until("the settled run's process to be killed", lambda: not pid_alive(pids["second"]))
        assert worker.beats > beats
        assert _run(store, runs["first"]).state is RunState.SUCCEEDED
    finally:
        blocker.close()
        worker.kill_all("test over")
        worker.stop(10)
        for g in gates.values():
            g.close()
        store.dispose()
