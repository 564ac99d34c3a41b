"""The daemon's log says when the database hangs, and when it answers again.

A write that waits for the database fails nothing until the busy timeout (SQLite) or
for as long as a frozen server keeps it (PostgreSQL): the part that waits logs nothing
meanwhile. The hang watch says it once, and once more when it is over. The fault here
is real: another connection holds SQLite's write lock, as a backup or a long
maintenance transaction would.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from collections.abc import Iterator

import pytest
from sqlalchemy import text

from jobcontrol.errors import StoreUnavailable
from jobcontrol.hangwatch import HangWatch
from jobcontrol.store import Store
from tests.pgserver import PostgresServer

pytestmark = pytest.mark.timeout(60)
WAIT = 20.0


class _Lines(logging.Handler):
    """The hang watch's lines, each also set as an event a test can wait on."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.lines: list[str] = []
        self._changed = threading.Condition()

    def emit(self, record: logging.LogRecord) -> None:
        with self._changed:
            self.lines.append(record.getMessage())
            self._changed.notify_all()

    def wait_for(self, words: str) -> str:
        with self._changed:
            found = self._changed.wait_for(
                lambda: next((line for line in self.lines if words in line), None), WAIT
            )
        assert found, f"no line with {words!r} within {WAIT}s: {self.lines}"
        return found


@pytest.fixture
def lines() -> Iterator[_Lines]:
    handler = _Lines()
    logger = logging.getLogger("jobcontrol.hangwatch")
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)


def test_a_write_held_up_by_another_process_lock_is_said_once_and_its_end_too(
    sqlite_url: str, lines: _Lines
) -> None:
    store = Store(sqlite_url, busy_timeout=WAIT)
    store.upgrade()
    watch = HangWatch(store.longest_write, lambda: 0.0, lambda: False, hang_s=0.3, check_s=0.05)
    watch.start()
    blocker = sqlite3.connect(sqlite_url.split("///", 1)[1], timeout=10)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock, held
    wrote = threading.Event()

    def write() -> None:
        with store.write() as conn:
            conn.execute(text("INSERT INTO jc_meta (key, value) VALUES ('hang', 'x')"))
        wrote.set()

    writer = threading.Thread(target=write, name="the-writer", daemon=True)
    try:
        writer.start()
        said = lines.wait_for("has not answered")
        assert "a write of thread the-writer waits for it" in said, said
        assert not wrote.is_set()
    finally:
        blocker.rollback()
        blocker.close()
    back = lines.wait_for("answers again")
    assert back.startswith("the database answers again, after "), back
    assert wrote.wait(WAIT)
    watch.stop()
    # Once each, however many looks the hang lasted.
    assert [line.split(" ")[3] for line in lines.lines] == ["not", "again,"], lines.lines
    with store.read() as conn:
        value = conn.execute(text("SELECT value FROM jc_meta WHERE key = 'hang'")).scalar()
    assert value == "x"  # the write that waited went through
    store.dispose()


def test_a_hang_already_said_as_an_outage_is_not_said_again(lines: _Lines) -> None:
    """A database that fails its statements is said by the outage's own line."""
    waited = [("jc-dispatcher", 12.0)]
    down = [True]
    watch = HangWatch(lambda: waited[0], lambda: 12.0, lambda: down[0])
    watch.look()
    assert lines.lines == []
    down[0] = False  # the outage over, the write still waits: a hang now
    watch.look()
    assert len(lines.lines) == 1, lines.lines
    assert (
        "a write of thread jc-dispatcher waits for it; the dispatcher waits on one event"
        in (lines.lines[0])
    )
    watch.look()  # still hanging: not said again
    waited[0] = ("jc-dispatcher", 0.5)
    watch.look()  # the dispatcher's event still waits
    assert len(lines.lines) == 1, lines.lines


@pytest.mark.postgres
def test_a_frozen_postgresql_is_said_for_a_claim_or_finish_too(
    own_server: PostgresServer, lines: _Lines
) -> None:
    """A worker's claims and finishes on PostgreSQL are single statements in autocommit,
    not write transactions: they waited for a frozen server, and the watch did not see
    them (a worker process logged nothing)."""
    own_server.create_database("hang")
    store = Store(own_server.url("hang"))
    store.upgrade()
    watch = HangWatch(store.longest_write, lambda: 0.0, lambda: False, hang_s=0.3, check_s=0.05)
    watch.start()
    wrote = threading.Event()

    def finish() -> None:
        with store.single() as conn:
            conn.execute(text("INSERT INTO jc_meta (key, value) VALUES ('hang', 'x')"))
        wrote.set()

    pids = own_server.freeze()
    try:
        threading.Thread(target=finish, name="jc-slot-0-0", daemon=True).start()
        said = lines.wait_for("has not answered")
        assert "a write of thread jc-slot-0-0 waits for it" in said, said
    finally:
        own_server.thaw(pids)
    lines.wait_for("answers again")
    assert wrote.wait(WAIT)
    watch.stop()
    store.dispose()


def test_a_hang_that_ends_in_a_failure_is_not_said_to_answer_again(
    sqlite_url: str, lines: _Lines
) -> None:
    """A write that waited out SQLite's busy timeout fails: the part that met it says the
    database is away (its outage). The watch said "answers again" all the same, while
    the lock was still held."""
    store = Store(sqlite_url, busy_timeout=1.0)
    store.upgrade()
    failed = threading.Event()  # the outage the writer's part says
    watch = HangWatch(store.longest_write, lambda: 0.0, failed.is_set, hang_s=0.3, check_s=0.05)
    watch.start()
    blocker = sqlite3.connect(sqlite_url.split("///", 1)[1], timeout=10)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock, held past the busy timeout

    def write() -> None:
        try:
            with store.write() as conn:
                conn.execute(text("INSERT INTO jc_meta (key, value) VALUES ('hang', 'x')"))
        except StoreUnavailable:
            failed.set()

    writer = threading.Thread(target=write, name="the-writer", daemon=True)
    try:
        writer.start()
        lines.wait_for("has not answered")
        ended = lines.wait_for("hang ended")
        assert failed.is_set()
        assert ended.startswith("the database hang ended after "), ended
        assert ended.endswith("in a failure: it does not answer"), ended
        assert not any("answers again" in line for line in lines.lines), lines.lines
    finally:
        blocker.rollback()
        blocker.close()
        watch.stop()
        store.dispose()
