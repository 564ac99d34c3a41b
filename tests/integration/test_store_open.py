"""Opening a SQLite database: several processes at once on a file that does not exist yet.

The first connection to a new file switches it to WAL, which needs the file to
itself; SQLite answers a second process doing the same with "database is
locked" at once, without waiting on the busy timeout. The CLI and a daemon
started together must both get on with their work.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from pathlib import Path

import pytest
from sqlalchemy import text

from jobcontrol.errors import StoreUnavailable
from jobcontrol.store import Store

PROCESSES = 12
ROUNDS = 25


def _open(
    url: str, barrier: multiprocessing.synchronize.Barrier, errors: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    barrier.wait(30)
    try:
        store = Store(url)
        try:
            # What `jobcontrol ls` does first: connect (the pragmas run) and read the schema.
            store.current_revision()
        finally:
            store.dispose()
    except Exception as exc:  # reported to the test, which fails with it
        errors.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_a_new_sqlite_file_together_all_get_in(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    errors: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    for round_ in range(ROUNDS):
        url = f"sqlite:///{tmp_path}/new-{round_}.db"
        barrier = ctx.Barrier(PROCESSES)
        procs = [ctx.Process(target=_open, args=(url, barrier, errors)) for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    mode = Store(f"sqlite:///{tmp_path}/new-0.db")
    try:
        with mode.read() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        mode.dispose()


def test_a_write_held_up_behind_another_of_its_process_says_so(tmp_path: Path) -> None:
    """One thread's write transaction is held up (here by its own work; in production by
    another process's lock on the file): another thread's write gives up after the busy
    timeout saying what it waited for, as /healthz then shows it, and writes nothing."""
    store = Store(f"sqlite:///{tmp_path}/jobcontrol.db", busy_timeout=0.5)
    store.upgrade()
    inside, release = threading.Event(), threading.Event()

    def held_up() -> None:
        with store.write() as conn:
            conn.execute(text("CREATE TABLE first_writer (x INTEGER)"))
            inside.set()
            release.wait(10)

    t = threading.Thread(target=held_up)
    t.start()
    try:
        assert inside.wait(10)
        with (
            pytest.raises(StoreUnavailable, match=r"waited 0.5s behind another write of this"),
            store.write() as conn,
        ):
            conn.execute(text("CREATE TABLE second_writer (x INTEGER)"))
    finally:
        release.set()
        t.join(10)
    with store.read() as conn:
        names = {r[0] for r in conn.execute(text("SELECT name FROM sqlite_master"))}
    store.dispose()
    assert "first_writer" in names
    assert "second_writer" not in names


def test_a_process_out_of_connections_is_an_outage_to_ride_out_not_a_crash() -> None:
    """SQLAlchemy's pool, every connection checked out past its wait: the threads that
    retry through outages retry this too (a connection frees up), instead of dying
    with the runs they hold."""
    from sqlalchemy.exc import TimeoutError as PoolTimeout

    from jobcontrol.store import wrap_error

    err = wrap_error(PoolTimeout("QueuePool limit of size 10 overflow 20 reached"))
    assert isinstance(err, StoreUnavailable)
    assert "no free connection in this process" in str(err)


def test_a_database_whose_directory_went_is_an_outage_until_it_is_back(tmp_path: Path) -> None:
    """The directory moved away (an unmount, an admin): a thread that opens a connection
    meets an outage it can ride out, named with the file, not an OSError that kills it;
    and nothing is created where the database was."""
    place = tmp_path / "state"
    place.mkdir()
    store = Store(f"sqlite:///{place}/jobcontrol.db")
    store.upgrade()
    try:
        store.engine.dispose()  # no connection kept: the next one is opened anew
        place.rename(tmp_path / "away")
        with pytest.raises(StoreUnavailable, match=f"cannot open {place}/jobcontrol.db"):
            with store.pinned(), store.write() as conn:  # a thread's first connection
                conn.execute(text("SELECT 1"))
        assert not place.exists()
        (tmp_path / "away").rename(place)
        with store.pinned(), store.write() as conn:
            assert conn.execute(text("SELECT count(*) FROM job")).scalar() == 0
    finally:
        store.dispose()


def test_a_refused_statement_says_the_drivers_words_not_its_sql_or_values(db_url: str) -> None:
    """A database error reaches logs and API answers: it says what the database said, on
    one line, never the statement with its values (a token's hash, a command's secret)."""
    from sqlalchemy.exc import DBAPIError

    from jobcontrol.errors import StoreError

    store = Store(db_url)
    store.upgrade()
    try:
        secret = "s3cret-value-0451"
        with store.write() as conn:
            conn.execute(text("CREATE TABLE probe (name VARCHAR(40) PRIMARY KEY)"))
            conn.execute(text("INSERT INTO probe VALUES (:v)"), {"v": secret})
        with pytest.raises(StoreError) as raised:
            with store.write() as conn:
                conn.execute(text("INSERT INTO probe VALUES (:v)"), {"v": secret})
        assert type(raised.value) is StoreError  # not transient: retrying cannot help
        assert isinstance(raised.value.__cause__, DBAPIError)
        message = str(raised.value)
        assert message.startswith("database error: ")
        assert "unique" in message.lower() or "duplicate" in message.lower(), message
        assert "\n" not in message
        for leaked in ("INSERT", "[SQL", "parameters", "sqlalche.me"):
            assert leaked not in message, message
        if store.is_sqlite:  # PostgreSQL's DETAIL names the key's value, as psql shows it
            assert secret not in message, message
    finally:
        store.engine.dispose()


def test_a_write_waiting_for_another_connections_lock_shows_as_under_way(db_url: str) -> None:
    """A write held up by another connection's lock (another process's, on either store)
    is shown as under way, with its thread and how long so far: what /status and
    /metrics say of a database slow to answer, before any timeout makes it an outage."""
    store = Store(db_url)
    store.upgrade()
    other = Store(db_url)  # its own write lock: as another process's
    with store.write() as conn:
        conn.execute(text("CREATE TABLE probe (n INTEGER)"))
    assert store.longest_write() is None
    done = threading.Event()

    def writer() -> None:
        with store.write() as conn:
            conn.execute(text("INSERT INTO probe VALUES (1)"))
        done.set()

    t = threading.Thread(target=writer, name="probe-writer")
    try:
        with other.write() as held:
            if not other.is_sqlite:  # (SQLite's BEGIN IMMEDIATE holds the file's lock)
                held.execute(text("LOCK TABLE probe IN ACCESS EXCLUSIVE MODE"))
            t.start()
            deadline = time.monotonic() + 10
            seen = store.longest_write()
            while (seen is None or seen[1] < 0.3) and time.monotonic() < deadline:
                done.wait(0.02)
                seen = store.longest_write()
            assert seen is not None, "no write shown as under way"
            assert seen[1] >= 0.3, seen
            assert seen[0] == "probe-writer"
            assert not done.is_set(), "the write did not wait for the lock"
        assert done.wait(10), "the write never went through once the lock was let go"
        t.join(10)
        assert store.longest_write() is None
        with store.read() as conn:
            assert conn.execute(text("SELECT count(*) FROM probe")).scalar() == 1
    finally:
        other.dispose()
        store.dispose()
