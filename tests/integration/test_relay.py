"""The relay (``store/relay.py``) across a PostgreSQL restart, on a server of its own.

Two relays stand for two processes on one database. A restart ends both of a
relay's connections; the listener reconnects on its own, but the sender only
finds out when it next sends. That send must go through on a new connection
at once, and the relay must not report the notifications down once both ways
work (in CI a daemon's /healthz stayed 503 after an outage: its sender's first
send after the restart failed on the old connection, after the listener had
already come back, and nothing ever cleared it).
"""

from __future__ import annotations

import logging
import queue
from typing import Any

import pytest
import sqlalchemy as sa

from jobcontrol import events
from jobcontrol.store import Store
from jobcontrol.store.relay import Relay
from tests.acceptance.harness import wait_until
from tests.pgserver import PostgresServer

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(120)]


def test_the_first_send_after_a_server_restart_reopens_and_reports_no_outage(
    own_server: PostgresServer,
) -> None:
    own_server.create_database("relay")
    sending, hearing = Store(own_server.url("relay")), Store(own_server.url("relay"))
    a, b = Relay(sending, name="a"), Relay(hearing, name="b")
    heard: queue.SimpleQueue[list[int]] = queue.SimpleQueue()

    def hear(_sender: object, *, run_ids: list[int], **_: Any) -> None:
        if run_ids:  # not the wake-everyone after a gap in listening
            heard.put(list(run_ids))

    events.runs_queued.connect(hear, sender=hearing, weak=False)
    try:
        a.start()
        b.start()
        assert a.listening, a.health()
        assert b.listening, b.health()
        events.runs_queued.send(sending, run_ids=[1])
        assert heard.get(timeout=10) == [1]

        own_server.halt()
        own_server.resume()
        # Both listeners come back on their own; a's sender still holds its old connection.
        assert wait_until(lambda: a.listening and b.listening, 30), (a.health(), b.health())
        assert wait_until(lambda: not a.outage.down, 10), a.health()

        events.runs_queued.send(sending, run_ids=[2])
        assert heard.get(timeout=10) == [2], "the hint was sent on a new connection"
        assert wait_until(lambda: a.sent == 2, 10), a.health()
        health = a.health()
        assert (health["down"], health["dropped"]) == (False, 0), health
    finally:
        events.runs_queued.disconnect(hear, sender=hearing)
        a.stop()
        b.stop()
        sending.dispose()
        hearing.dispose()
        if not own_server.running:
            own_server.resume()
        own_server.drop_database("relay")


def test_a_send_while_the_server_is_down_is_dropped_and_reported_until_it_is_back(
    own_server: PostgresServer,
) -> None:
    own_server.create_database("relay_down")
    store = Store(own_server.url("relay_down"))
    relay = Relay(store, name="down")
    try:
        relay.start()
        events.runs_queued.send(store, run_ids=[1])
        assert wait_until(lambda: relay.sent == 1, 10), relay.health()
        own_server.halt()
        try:
            events.runs_queued.send(store, run_ids=[2])
            assert wait_until(lambda: relay.dropped == 1, 10), relay.health()
            assert relay.outage.down, relay.health()
        finally:
            own_server.resume()
        assert wait_until(lambda: relay.listening and not relay.outage.down, 30), relay.health()
        events.runs_queued.send(store, run_ids=[3])
        assert wait_until(lambda: relay.sent == 2, 10), relay.health()
        assert not relay.outage.down, relay.health()
    finally:
        relay.stop()
        store.dispose()
        if not own_server.running:
            own_server.resume()
        own_server.drop_database("relay_down")


def test_an_outage_is_logged_once_however_often_the_listener_retries(
    own_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    own_server.create_database("relay_once")
    store = Store(own_server.url("relay_once"))
    relay = Relay(store, name="once")
    caplog.set_level(logging.DEBUG, logger="jobcontrol")
    try:
        relay.start()
        assert relay.listening, relay.health()
        own_server.halt()
        try:
            # The listener retries at 0.1, 0.2, 0.4, 0.8 s...: four failures or more.
            assert wait_until(lambda: relay.outage.state().failures >= 4, 30), relay.health()
        finally:
            own_server.resume()
        assert wait_until(lambda: relay.listening and not relay.outage.down, 30), relay.health()
    finally:
        relay.stop()
        store.dispose()
        if not own_server.running:
            own_server.resume()
        own_server.drop_database("relay_once")
    said = [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and ("once" in r.getMessage() or "listen" in r.getMessage())
    ]
    assert len(said) == 2, said
    assert "notifications (once): the database does not answer" in said[0], said
    assert "notifications (once): the database answers again" in said[1], said
    retries = [
        r
        for r in caplog.records
        if "listening for run-queue notifications failed" in r.getMessage()
    ]
    assert len(retries) >= 3, "each retry is still there at DEBUG"


def test_every_committed_write_to_the_lane_table_is_announced_whoever_made_it(
    postgres_url: str,
) -> None:
    """A worker follows the lane table through these announcements instead of reading it
    every poll interval: an SQL session's write must reach it like the service's."""
    store = Store(postgres_url)
    store.upgrade()
    relay = Relay(store, name="lanes")
    heard: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def hear(_sender: object, **_: Any) -> None:
        heard.put(True)

    events.lane_rows_written.connect(hear, sender=store, weak=False)
    other = sa.create_engine(postgres_url)  # not Job Control: a plain SQL session
    try:
        relay.start()
        assert relay.listening, relay.health()
        with other.begin() as conn:
            conn.execute(
                sa.text(
                    "INSERT INTO lane (name, updated_at, updated_by) VALUES ('batch', now(), 'sql')"
                )
            )
        assert heard.get(timeout=10)
        with other.begin() as conn:
            conn.execute(sa.text("UPDATE lane SET enabled = false WHERE name = 'batch'"))
        assert heard.get(timeout=10)
        with other.connect() as conn:  # rolled back: nothing changed, nothing to hear
            conn.execute(sa.text("UPDATE lane SET max_slots = 3 WHERE name = 'batch'"))
            conn.rollback()
        with other.begin() as conn:
            conn.execute(sa.text("DELETE FROM lane WHERE name = 'batch'"))
        assert heard.get(timeout=10)
        with pytest.raises(queue.Empty):
            heard.get(timeout=0.5)  # three commits, three announcements: the rollback none
        assert relay.heard == 3, relay.health()
        with store.read() as conn:
            names = [r.name for r in conn.execute(sa.text("SELECT name FROM lane"))]
        assert "batch" not in names
    finally:
        events.lane_rows_written.disconnect(hear, sender=store)
        relay.stop()
        other.dispose()
        store.dispose()


def test_a_burst_of_hints_is_heard_whole_and_in_order_and_never_by_its_sender(
    own_server: PostgresServer,
) -> None:
    """500 trees due together queue hundreds of hints at once: every one arrives at the
    other process, once and in the order sent, and none comes back to its sender."""
    own_server.create_database("relay_burst")
    sending, hearing = Store(own_server.url("relay_burst")), Store(own_server.url("relay_burst"))
    a, b = Relay(sending, name="a"), Relay(hearing, name="b")
    heard: queue.SimpleQueue[int] = queue.SimpleQueue()
    echoed: list[int] = []

    def hear(_sender: object, *, run_ids: list[int], **_: Any) -> None:
        if run_ids:
            heard.put(run_ids[0])

    def echo(_sender: object, *, run_ids: list[int], relayed: bool = False, **_: Any) -> None:
        if relayed and run_ids:
            echoed.append(run_ids[0])

    events.runs_queued.connect(hear, sender=hearing, weak=False)
    events.runs_queued.connect(echo, sender=sending, weak=False)
    try:
        a.start()
        b.start()
        assert a.listening, a.health()
        assert b.listening, b.health()
        for run_id in range(1, 301):
            events.runs_queued.send(sending, run_ids=[run_id])
        got = [heard.get(timeout=10) for _ in range(300)]
        assert got == list(range(1, 301))
        with pytest.raises(queue.Empty):
            heard.get(timeout=0.3)
        assert wait_until(lambda: a.sent == 300, 10), a.health()
        assert a.dropped == 0, a.health()
        assert b.heard == 300, b.health()
        assert (a.heard, echoed) == (0, []), "its own hints are not delivered to it again"
    finally:
        events.runs_queued.disconnect(hear, sender=hearing)
        events.runs_queued.disconnect(echo, sender=sending)
        a.stop()
        b.stop()
        sending.dispose()
        hearing.dispose()
        own_server.drop_database("relay_burst")


def test_the_daemons_relay_sends_only_while_a_worker_process_listens(
    postgres_url: str,
) -> None:
    """A daemon with no worker process sends its signals to nobody: no NOTIFY per task
    end. A worker's relay says hello when it listens, and bye when it stops; the
    daemon's sends to it in between, and only then."""
    daemon_side, worker_side = Store(postgres_url), Store(postgres_url)
    daemon = Relay(daemon_side, name="daemon", role="daemon")
    heard: queue.SimpleQueue[int] = queue.SimpleQueue()

    def hear(_sender: object, *, run_id: int, **_: Any) -> None:
        heard.put(run_id)

    events.task_finished.connect(hear, sender=worker_side, weak=False)
    worker = Relay(worker_side, name="worker w1")
    try:
        daemon.start()
        assert daemon.listening, daemon.health()
        events.task_finished.send(daemon_side, run_id=1)
        assert (daemon.skipped, daemon.sent, daemon.peers) == (1, 0, []), daemon.health()

        worker.start()
        assert wait_until(lambda: daemon.peers == ["worker w1"], 10), daemon.health()
        events.task_finished.send(daemon_side, run_id=2)
        assert heard.get(timeout=10) == 2
        # Counted once its sender's NOTIFY returned, which may be after the worker heard it.
        assert wait_until(lambda: daemon.sent == 1, 10), daemon.health()
        assert daemon.skipped == 1, daemon.health()

        worker.stop()
        assert wait_until(lambda: daemon.peers == [], 10), daemon.health()
        events.task_finished.send(daemon_side, run_id=3)
        assert daemon.skipped == 2, daemon.health()
        with pytest.raises(queue.Empty):
            heard.get(timeout=0.3)
        assert (worker.heard, worker.sent) == (1, 0), "hello and bye are not signals"
    finally:
        events.task_finished.disconnect(hear, sender=worker_side)
        worker.stop()
        daemon.stop()
        daemon_side.dispose()
        worker_side.dispose()


def test_a_daemon_started_after_its_workers_asks_who_listens_and_wakes_them(
    postgres_url: str,
) -> None:
    """Workers running before the daemon's relay starts answer its question, and wake
    their groups: what it queued before it heard of them was not sent to them."""
    daemon_side, worker_side = Store(postgres_url), Store(postgres_url)
    workers = [Relay(worker_side, name=f"worker w{i}") for i in (1, 2)]
    daemon = Relay(daemon_side, name="daemon", role="daemon")
    woken: queue.SimpleQueue[bool] = queue.SimpleQueue()

    def wake(_sender: object, *, run_ids: list[int], relayed: bool = False, **_: Any) -> None:
        if relayed and not run_ids:
            woken.put(True)

    events.runs_queued.connect(wake, sender=worker_side, weak=False)
    try:
        for w in workers:
            w.start()
        daemon.start()
        assert wait_until(lambda: daemon.peers == ["worker w1", "worker w2"], 10), daemon.health()
        woke = [woken.get(timeout=10) for _ in workers]
        assert woke == [True, True], "each worker woke its groups"
        events.runs_queued.send(daemon_side, run_ids=[7])
        assert wait_until(lambda: daemon.sent == 1, 10), daemon.health()
        assert daemon.skipped == 0, daemon.health()
    finally:
        events.runs_queued.disconnect(wake, sender=worker_side)
        daemon.stop()
        for w in workers:
            w.stop()
        daemon_side.dispose()
        worker_side.dispose()


def test_a_process_heard_from_that_never_said_hello_is_sent_to(postgres_url: str) -> None:
    """A worker process of an earlier version says no hello: its first hint makes it
    known, and from then on the daemon's relay sends to it."""
    store = Store(postgres_url)
    daemon = Relay(store, name="daemon", role="daemon")
    other = sa.create_engine(postgres_url)
    try:
        daemon.start()
        assert daemon.listening, daemon.health()
        payload = '{"o": "older", "s": "task_finished", "k": {"run_id": 5}}'
        with other.begin() as conn:
            conn.execute(sa.text("SELECT pg_notify('jobcontrol', :p)"), {"p": payload})
        assert wait_until(lambda: daemon.peers == ["a worker process"], 10), daemon.health()
        events.kill_requested.send(store, run_id=5, reason="test")
        assert wait_until(lambda: daemon.sent == 1, 10), daemon.health()
        assert daemon.skipped == 0, daemon.health()
    finally:
        daemon.stop()
        other.dispose()
        store.dispose()


def test_a_relay_role_that_does_not_exist_is_refused(postgres_url: str) -> None:
    store = Store(postgres_url)
    try:
        with pytest.raises(ValueError, match="relay role 'standby': must be one of worker, daemon"):
            Relay(store, name="x", role="standby")
    finally:
        store.dispose()
