"""The store: one SQLAlchemy engine over SQLite (default) or PostgreSQL.

SQLite is opened in WAL mode with foreign keys on; a new database file is
created mode 0600 in a directory created 0700 (SQLite gives its -wal and -shm
files the database's mode), since it holds the jobs' ``env`` values and the
token hashes; write transactions start
with ``BEGIN IMMEDIATE`` so two writers queue on the busy timeout instead of
failing at commit time. Within one process, SQLite write transactions also
queue on a lock: SQLite's busy handler polls by sleeping (1, 2, 5, 10, ... ms),
so two threads of the daemon colliding would otherwise cost the second one
milliseconds on the path from a timer to its task (bench/README.md).
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import re
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, Engine, create_engine, event, select
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, SQLAlchemyError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from sqlalchemy.pool import NullPool

from jobcontrol import filemodes
from jobcontrol.errors import StoreError, StoreUnavailable, one_line
from jobcontrol.places import normalise_url
from jobcontrol.store import schema
from jobcontrol.store.checkpoint import SAFETY_PAGES, SQLITE_DEFAULT_PAGES, WalCheckpointer

log = logging.getLogger(__name__)

SQLITE_BUSY_MS = 30_000
# A pinned PostgreSQL connection idle longer than this is pinged before it is used again.
PING_IDLE = 1.0
# A write of this process that took longer than this, its wait for a lock included, or
# that failed on a transient error, was held up by the database (``held_up_within``).
HELD_UP_S = 1.0
# How long a write that failed as an outage says the database is away, unless writes
# still wait for it (``Store.unavailable``): longer than the parts' retries (2 s at most).
UNAVAILABLE_S = 5.0
# Seconds a PostgreSQL connection attempt may take before it fails (and is retried).
PG_CONNECT_TIMEOUT = 10
# A connection whose path to the server died silently (a link down, a firewall's or NAT's
# idle drop, a server that failed over during a partition) otherwise looks alive for as
# long as TCP says (hours idle, minutes waiting for an answer): a listener that hears
# nothing, a query or a stop that waits as long as the partition lasts. TCP keepalives
# from 5 s idle, every 2 s, 3 unanswered: about 11 s; data unacknowledged for 15 s fails.
# Each is kept where the URL sets it itself.
PG_TCP = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 15_000,
}

# SQLite errors that pass: another process holds the lock, the disk is full or failing.
_SQLITE_TRANSIENT = ("locked", "busy", "disk i/o", "disk is full", "unable to open")


def _pg_connect_params(url: str) -> dict[str, int]:
    """The libpq parameters a PostgreSQL connection gets unless ``url`` gives them: a
    bounded connection attempt, and a dead path to the server noticed (``PG_TCP``)."""
    wanted = {"connect_timeout": PG_CONNECT_TIMEOUT, **PG_TCP}
    return {k: v for k, v in wanted.items() if f"{k}=" not in url}


def pool_size_for(slots: int, groups: int = 1) -> int:
    """The connections a process with ``slots`` task slots in ``groups`` slot groups may
    hold at once: each slot's thread keeps one once it has written, and so does each
    running task's output uploader (the database log store); each group's claimer
    keeps one; the dispatcher, the heartbeat, the relay and API requests a few more.

    Too few, and a writer that holds the process's turn to write waits for a
    connection that threads waiting for that turn hold: everything stalls.
    """
    return 2 * slots + groups + 10


def wrap_error(exc: Exception) -> StoreError:
    """A driver error as ``StoreUnavailable`` when retrying can succeed, else ``StoreError``.

    Its message is the driver's own, on one line: not SQLAlchemy's wrapping of it, whose
    statement and parameters would reach logs and API answers, and whose link to its
    documentation tells an operator nothing."""
    message = f"database error: {driver_message(exc)}"
    if isinstance(exc, PoolTimeout):  # every connection of this process is in use, for now
        return StoreUnavailable(f"database error: no free connection in this process: {exc}")
    if isinstance(exc, sqlite3.Error) or "sqlite" in type(getattr(exc, "orig", None)).__module__:
        text_ = str(exc).lower()
        if any(word in text_ for word in _SQLITE_TRANSIENT):
            return StoreUnavailable(message)
        return StoreError(message)
    if type(exc).__module__.split(".")[0] == "psycopg":  # raised on the driver (prepared.py)
        import psycopg

        if isinstance(exc, psycopg.OperationalError | psycopg.InterfaceError):
            return StoreUnavailable(message)
        return StoreError(message)
    if isinstance(exc, OperationalError | InterfaceError) or (
        isinstance(exc, DBAPIError) and exc.connection_invalidated
    ):
        return StoreUnavailable(message)
    return StoreError(message)


def driver_message(exc: Exception) -> str:
    """A driver's error in one line (its messages have several)."""
    cause = getattr(exc, "orig", None) or exc
    return one_line(str(cause))


def redact(url: str) -> str:
    """The URL with any password hidden, for logs and messages: the one before the
    host's ``@`` and a ``password=`` in its query (libpq takes either)."""
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if "password" not in parsed.query:
        return parsed.render_as_string(hide_password=True)
    hidden = parsed.set(query={**parsed.query, "password": "HIDDEN"})
    return hidden.render_as_string(hide_password=True).replace("password=HIDDEN", "password=***")


def url_password(url: str) -> str | None:
    """The password a database URL carries (before the ``@`` or as ``password=``), or
    None; None too for a path or text that is no URL (``check_url`` refuses that)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if "://" not in url:
        return None
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None
    given = parsed.query.get("password")
    if isinstance(given, tuple):
        given = given[0] if given else None
    return parsed.password or given or None


POSTGRESQL_EXTRA = "pip install 'jobcontrol[postgresql]'"


URL_FORMS = "a SQLite file's path, sqlite:///PATH, or postgresql+psycopg://USER@HOST:PORT/NAME"


def check_url(url: str) -> None:
    """Refuse, in one line naming it (its password hidden), what is no database URL."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    if "://" not in url:
        return  # a path: a SQLite file
    try:
        make_url(url)
    except (ArgumentError, ValueError) as exc:
        shown = re.sub(r"(://[^/@:]*:)[^/@]*@", r"\1***@", url)
        shown = re.sub(r"([?&]password=)[^&]*", r"\1***", shown)
        raise StoreError(f"{shown} is not a database URL ({exc}): give {URL_FORMS}") from None


def _engine(url: str, **options: Any) -> Engine:
    """``create_engine``, with a driver that is not installed or a kind of database that
    is not known refused in one line."""
    from sqlalchemy.exc import NoSuchModuleError

    try:
        return create_engine(url, **options)
    except NoSuchModuleError:
        raise StoreError(
            f"{redact(url)} names no kind of database Job Control knows: give {URL_FORMS}"
        ) from None
    except ImportError as exc:
        missing = exc.name or str(exc)
        if missing.split(".")[0] == "psycopg":
            raise StoreError(
                f"{redact(url)} needs the PostgreSQL driver psycopg, which is not installed: "
                f"{POSTGRESQL_EXTRA}"
            ) from None
        raise StoreError(
            f"{redact(url)} needs the database driver {missing}, which is not installed "
            f"(for PostgreSQL write postgresql+psycopg:// and {POSTGRESQL_EXTRA})"
        ) from None


def _create_private(engine: Engine, path: str, created: threading.Event | None = None) -> None:
    """Before SQLite first opens ``path`` (which would create it under the umask, 0644
    under the usual 022), create it empty, mode 0600: SQLite then makes its -wal and
    -shm files with the same mode. ``created`` is set when this made the file."""

    def before_connect(*_: Any) -> None:
        try:
            made = not os.path.exists(path) and filemodes.create_file(path)
        except OSError as exc:
            # Its directory gone (moved, unmounted): as SQLite's own "unable to open", an
            # outage to ride out until it is back, not a crash of the thread that met it.
            raise StoreUnavailable(
                f"database error: cannot open {path}: {exc.strerror or exc}"
            ) from exc
        if made and created is not None:
            created.set()

    event.listen(engine, "do_connect", before_connect)


def _sqlite_pragmas(dbapi_conn: Any, _record: Any, busy_ms: int = SQLITE_BUSY_MS) -> None:
    cur = dbapi_conn.cursor()
    _use_wal(cur)
    cur.execute("PRAGMA synchronous=NORMAL")
    cur.execute("PRAGMA foreign_keys=ON")
    cur.execute(f"PRAGMA busy_timeout={int(busy_ms)}")
    cur.close()


def _use_wal(cur: sqlite3.Cursor) -> None:
    """Switch the file to WAL (it stays so); wait while another process does the same.

    Switching needs the file to itself, and SQLite answers a second process that
    tries meanwhile with "database is locked" at once, busy timeout or not.
    """
    deadline = time.monotonic() + SQLITE_BUSY_MS / 1000
    delay = 0.002
    while True:
        try:
            if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() != "wal":
                cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.1)


# ``_in``'s ``begin`` for no transaction at all (PostgreSQL autocommit): ``Store.single``.
_AUTOCOMMIT = "AUTOCOMMIT"


class Store:
    """Connections and transactions; the queries live in ``store.queries``."""

    def __init__(
        self, url: str, *, pool_size: int = 10, busy_timeout: float = SQLITE_BUSY_MS / 1000
    ) -> None:
        """``busy_timeout``: how long a SQLite statement waits for another process's lock
        before it fails as ``StoreUnavailable`` (and is retried by whoever runs it)."""
        check_url(url)
        self.url = normalise_url(url)
        self.busy_timeout = busy_timeout
        self.is_sqlite = self.url.startswith("sqlite")
        # Set once this store has created its SQLite file (see ``unprepared_file``).
        self.created_file = threading.Event()
        # Checkpoints of the WAL: by the COMMITs past 1,000 pages, or by a thread.
        self._wal_pages = SQLITE_DEFAULT_PAGES
        self._checkpointer: WalCheckpointer | None = None
        self.engine = self._make_engine(pool_size)
        # Taken before a connection is checked out, so a waiter holds no connection.
        self._write_lock = threading.RLock() if self.is_sqlite else None
        self._local = threading.local()  # a pinned thread's connection (``pinned``)
        # Writes under way: thread ident -> monotonic time the write began, its wait for
        # the write lock included. Read by ``longest_write``.
        self._writes: dict[int, float] = {}
        # Single statements under way on PostgreSQL (a claim, a finish), as for ``_writes``.
        self._singles: dict[int, float] = {}
        # time.monotonic() when a write of this process was last seen held up.
        self._held_up_at = float("-inf")
        # The error and time.monotonic() of the last write that waited and failed as an
        # outage (the database away, SQLite's lock held past the busy timeout), until a
        # write commits again (``unavailable``).
        self._unavailable: tuple[str, float] | None = None
        self._serials = itertools.count(1)  # tells a pinned thread's connections apart

    def _make_engine(self, pool_size: int) -> Engine:
        if self.is_sqlite:
            path = self.sqlite_file
            if path is not None:
                filemodes.make_dir(Path(path).parent)
            engine = _engine(
                self.url,
                connect_args={"check_same_thread": False, "timeout": self.busy_timeout},
                pool_size=pool_size,
                max_overflow=20,
            )
            if path is not None:
                _create_private(engine, path, self.created_file)
            busy_ms = int(self.busy_timeout * 1000)
            event.listen(engine, "connect", lambda c, r: _sqlite_pragmas(c, r, busy_ms))
            # Each connection as it is handed out: who checkpoints the WAL now.
            event.listen(engine, "checkout", lambda c, r, _: self._wal_setting(c, r))
            # We issue BEGIN ourselves (deferred or IMMEDIATE), so the driver must not.
            return engine.execution_options(isolation_level="AUTOCOMMIT")
        # libpq waits for a server that does not answer as long as TCP does (minutes):
        # bound it, unless the URL says otherwise (?connect_timeout=N).
        connect = _pg_connect_params(self.url)
        return _engine(
            self.url,
            pool_size=pool_size,
            max_overflow=20,
            pool_pre_ping=True,
            connect_args=connect,
        )

    @property
    def dialect(self) -> str:
        return "sqlite" if self.is_sqlite else "postgresql"

    def libpq_url(self) -> str:
        """The PostgreSQL URL for a plain psycopg connection (a listener of its own)."""
        from sqlalchemy.engine import make_url

        url = make_url(self.url).set(drivername="postgresql")
        conninfo = url.render_as_string(hide_password=False)
        for key, value in _pg_connect_params(self.url).items():
            conninfo += ("&" if "?" in conninfo else "?") + f"{key}={value}"
        return conninfo

    @property
    def sqlite_path(self) -> str | None:
        if not self.is_sqlite or "///" not in self.url:
            return None
        return self.url.split("///", 1)[1]

    @property
    def sqlite_file(self) -> str | None:
        """The SQLite database's file, None for an in-memory one (or PostgreSQL)."""
        if not self.is_sqlite:
            return None
        from sqlalchemy.engine import make_url

        database = make_url(self.url).database
        if not database or database == ":memory:" or database.startswith("file:"):
            return None
        return database

    @contextmanager
    def write(self, *, wait: bool = True) -> Iterator[Connection]:
        """One write transaction: committed on success, rolled back on error.

        ``wait=False``: on SQLite, ``StoreUnavailable`` at once while another transaction
        of this process or another holds the write lock (or the disk is full), instead of
        waiting out the busy timeout. For bookkeeping that must never hold up what it
        rides on, such as a request recording its token's last use."""
        me = threading.get_ident()
        writes = self._writes
        if me in writes:  # a write within a write (the lock is re-entrant): the outer counts
            yield from self._write(wait)
            return
        writes[me] = began = time.monotonic()
        try:
            yield from self._write(wait)
        except StoreUnavailable as exc:
            self._held_up_at = time.monotonic()
            if wait:
                self._unavailable = (str(exc), time.monotonic())
            raise
        else:
            self._unavailable = None
        finally:
            del writes[me]
            ended = time.monotonic()
            if ended - began > HELD_UP_S:
                self._held_up_at = ended

    def unavailable(self) -> str | None:
        """Why the database does not answer this process's writes, as the last write that
        waited for it found (whichever part of the process met it): while that failure
        is recent (``UNAVAILABLE_S``) or writes still wait for the database; None once a
        write commits again. A request is refused at once meanwhile, rather than wait a
        busy timeout behind the tries of the parts that ride the outage out. A failure
        nobody tries again (a request's own) is forgotten after ``UNAVAILABLE_S``."""
        failed = self._unavailable
        if failed is None:
            return None
        error, at = failed
        now = time.monotonic()
        return error if now - at <= UNAVAILABLE_S or self._held_up_now(now) else None

    def held_up_within(self, seconds: float) -> bool:
        """Whether the database held up a write of this process (for longer than
        ``HELD_UP_S``, or failing it as an outage) in the last ``seconds``, or holds one
        up now (the caller's own included). A lease that ran out meanwhile may have
        run out waiting for the database, not because its worker stopped."""
        now = time.monotonic()
        return now - self._held_up_at < seconds or self._held_up_now(now)

    def _held_up_now(self, now: float) -> bool:
        """Whether a write of this process has waited for the database over ``HELD_UP_S``
        so far."""
        under_way = list(self._writes.values())
        return bool(under_way) and now - min(under_way) > HELD_UP_S

    def longest_write(self) -> tuple[str, float] | None:
        """The write under way the longest (its wait for a lock included): the name of
        its thread and how many seconds so far; None when no write is under way.

        A write waits out the busy timeout (SQLite) or the connect timeout (PostgreSQL)
        before it fails as an outage: until then, this is what shows that the database
        is slow to answer (``/status``, ``/metrics``)."""
        writes = {**self._singles, **self._writes}
        if not writes:
            return None
        ident, began = min(writes.items(), key=lambda w: w[1])
        # The name looked up here, not on every write: only a status read needs it.
        name = next((t.name for t in threading.enumerate() if t.ident == ident), str(ident))
        return name, time.monotonic() - began

    def _write(self, wait: bool) -> Iterator[Connection]:
        lock = self._write_lock
        if lock is not None and not lock.acquire(timeout=self.busy_timeout if wait else 0):
            # Another thread of this process holds the turn to write, itself waiting for
            # the file's lock (another process's transaction) or writing for that long.
            raise StoreUnavailable(
                f"database error: database is locked (waited {self.busy_timeout:g}s behind "
                "another write of this process, itself held up)"
                if wait
                else "database error: database is locked (another write of this process "
                "is under way)"
            )
        try:
            if wait or not self.is_sqlite:
                yield from self._transaction("BEGIN IMMEDIATE")
            else:
                yield from self._write_at_once()
        finally:
            if lock is not None:
                lock.release()
        checkpointer = self._checkpointer
        if checkpointer is not None:  # committed
            checkpointer.wrote()

    def _write_at_once(self) -> Iterator[Connection]:
        """A SQLite write transaction on a connection of the pool whose busy timeout is 0
        for its length."""
        try:
            with self.engine.connect() as conn:
                raw = conn.connection.dbapi_connection
                assert raw is not None
                raw.execute("PRAGMA busy_timeout=0")
                try:
                    yield from _sqlite_txn(conn, "BEGIN IMMEDIATE")
                finally:
                    raw.execute(f"PRAGMA busy_timeout={int(self.busy_timeout * 1000)}")
        except SQLAlchemyError as exc:
            raise wrap_error(exc) from exc

    def _wal_setting(self, dbapi_conn: Any, record: Any) -> None:
        """The WAL size at which this connection's COMMITs checkpoint: SQLite's 1,000
        pages, or far out while a thread does it (``checkpoint_in_background``). Set
        when it changed since the connection last had it: a dict look-up otherwise."""
        pages = self._wal_pages
        if record.info.get("wal_pages", SQLITE_DEFAULT_PAGES) != pages:
            dbapi_conn.execute(f"PRAGMA wal_autocheckpoint={int(pages)}")
            record.info["wal_pages"] = pages

    def checkpoint_in_background(self) -> WalCheckpointer | None:
        """SQLite file: from now on its WAL is checkpointed by a thread of its own, not
        by the COMMIT that finds it past 1,000 pages (``store/checkpoint.py``). The
        daemon's; None where there is no WAL (PostgreSQL, in-memory)."""
        path = self.sqlite_file
        if path is None or self._checkpointer is not None:
            return self._checkpointer
        self._wal_pages = SAFETY_PAGES
        self._checkpointer = WalCheckpointer(
            path, int(self.busy_timeout * 1000), lock=self._write_lock
        ).start()
        return self._checkpointer

    @property
    def checkpointer(self) -> WalCheckpointer | None:
        return self._checkpointer

    def stop_checkpointing(self) -> None:
        """Back to checkpoints in the COMMITs (for connections opened from now on)."""
        checkpointer, self._checkpointer = self._checkpointer, None
        self._wal_pages = SQLITE_DEFAULT_PAGES
        if checkpointer is not None:
            checkpointer.stop()

    @contextmanager
    def single(self) -> Iterator[Connection]:
        """One statement, atomic alone, that needs no transaction around it. On
        PostgreSQL it runs in autocommit: no BEGIN and no COMMIT, two round trips of
        three spared on the claim and finish paths. On SQLite it is a write transaction."""
        if self.is_sqlite:
            with self.write() as conn:
                yield conn
            return
        # A write all the same (a claim, a finish): one that waits is said by the hang
        # watch (``longest_write``). Only there: whether requests are refused for the
        # database and when leases are judged go by the process's write transactions.
        me = threading.get_ident()
        singles = self._singles
        outer = me in singles
        if not outer:
            singles[me] = time.monotonic()
        try:
            yield from self._transaction(_AUTOCOMMIT)
        finally:
            if not outer:
                del singles[me]

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """A read transaction: one consistent snapshot."""
        yield from self._transaction("BEGIN")

    @contextmanager
    def read_one(self) -> Iterator[Connection]:
        """One read statement, a snapshot alone: on PostgreSQL in autocommit (no BEGIN
        and no COMMIT, one round trip of three), on SQLite a read transaction."""
        yield from self._transaction("BEGIN" if self.is_sqlite else _AUTOCOMMIT)

    @contextmanager
    def pinned(self) -> Iterator[None]:
        """Within the block, this thread's transactions share one connection.

        For the threads on every task's path (the dispatcher, a worker's slots):
        checking a connection out of the pool and back costs more than a short
        transaction does. A connection that failed is closed and replaced.
        """
        self._local.pinned = True
        try:
            yield
        finally:
            self._local.pinned = False
            self._unpin()

    def change_mark(self) -> tuple[int, int] | None:
        """On SQLite, in a ``pinned`` block between its transactions: a mark that changes
        whenever another connection (another thread's, another process's) committed a
        change to the database since this thread's connection was opened: ``PRAGMA
        data_version`` with that connection's serial (opened here if need be). None where
        no such mark can be had (PostgreSQL, not pinned): the caller reads what it wanted
        to know.

        For a poll that is only there to notice changes made elsewhere: an idle daemon
        compares two integers instead of reading a table, a few microseconds against
        a millisecond of SQLAlchemy."""
        if not self.is_sqlite or not getattr(self._local, "pinned", False):
            return None
        try:
            conn = self._pinned_conn()
        except SQLAlchemyError as exc:
            raise wrap_error(exc) from exc
        raw = conn.connection.driver_connection
        if raw is None:
            return None
        try:
            (version,) = raw.execute("PRAGMA data_version").fetchone()
        except sqlite3.Error as exc:
            raise wrap_error(exc) from exc
        return (self._local.serial, int(version))

    def _pinned_conn(self) -> Connection:
        """This pinned thread's connection, a new one if it has none or a dead one."""
        conn: Connection | None = getattr(self._local, "conn", None)
        if conn is None or conn.closed or conn.invalidated:
            conn = self._local.conn = self.engine.connect()
            self._local.serial = next(self._serials)
            self._local.used = time.monotonic()
        return conn

    def _unpin(self) -> None:
        conn: Connection | None = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                conn.close()

    def _transaction(self, begin: str) -> Iterator[Connection]:
        if getattr(self._local, "pinned", False):
            yield from self._pinned_transaction(begin)
            return
        try:
            with self.engine.connect() as conn:
                yield from self._in(conn, begin)
        except SQLAlchemyError as exc:
            raise wrap_error(exc) from exc

    def _pinned_transaction(self, begin: str) -> Iterator[Connection]:
        conn: Connection | None = getattr(self._local, "conn", None)
        now = time.monotonic()
        # What the pool's pre-ping does at checkout: a server that restarted while this
        # connection sat idle fails it here, not in the caller's first statement. In
        # autocommit, as the pool's: one round trip, where SQLAlchemy's would be three
        # (psycopg sends BEGIN alone, then the statement, then ROLLBACK).
        idle = conn is not None and now - self._local.used > PING_IDLE
        if conn is not None and idle and not self.is_sqlite and not _ping(conn):
            self._unpin()
            conn = None
        self._local.used = now
        try:
            yield from self._in(self._pinned_conn(), begin)
        except (SQLAlchemyError, StoreError) as exc:
            self._unpin()  # the database failed it: the next transaction starts afresh
            if isinstance(exc, StoreError):
                raise
            raise wrap_error(exc) from exc

    def _in(self, conn: Connection, begin: str) -> Iterator[Connection]:
        """A transaction on ``conn``: on SQLite opened with ``begin`` (deferred or
        ``BEGIN IMMEDIATE``); on PostgreSQL a plain one, or none with ``_AUTOCOMMIT``."""
        if self.is_sqlite:
            yield from _sqlite_txn(conn, begin)
        elif begin == _AUTOCOMMIT:
            # psycopg's own switch: SQLAlchemy's (``execution_options(isolation_level=)``)
            # cost a fifth of a worker's CPU per claim and finish. Core statements in the
            # block autobegin a transaction that the driver, in autocommit, never opens.
            raw = conn.connection.driver_connection
            assert raw is not None
            raw.autocommit = True
            try:
                yield conn
                conn.commit()  # ends SQLAlchemy's transaction, if a statement began one
            finally:
                if conn.in_transaction():
                    conn.rollback()
                if not (raw.closed or raw.broken):
                    raw.autocommit = False
        else:
            with conn.begin():
                yield conn

    def upgrade(self) -> None:
        """Create or migrate the schema to the newest revision (Alembic)."""
        from alembic import command

        engine = self._migration_engine()
        try:
            with engine.begin() as conn:
                cfg = alembic_config(self.url)
                cfg.attributes["connection"] = conn
                command.upgrade(cfg, "head")
        except SQLAlchemyError as exc:
            raise StoreError(f"cannot migrate {redact(self.url)}: {exc}") from exc
        finally:
            engine.dispose()
        self.instance_id()

    def _migration_engine(self) -> Engine:
        engine = _engine(self.url, poolclass=NullPool)
        if self.is_sqlite:
            if self.sqlite_file is not None:
                _create_private(engine, self.sqlite_file, self.created_file)
            event.listen(engine, "connect", _sqlite_pragmas)
        return engine

    def unprepared_file(self) -> str | None:
        """The SQLite file, if it exists without a Job Control schema and this store did
        not create it (an empty file, someone else's database): None otherwise.

        Read-only, so the file stays as it is (a connection of this store would turn it
        to WAL mode); a file that is not a SQLite database is a ``StoreError``.
        """
        path = self.sqlite_file
        if path is None or self.created_file.is_set() or not os.path.exists(path):
            return None
        if os.path.getsize(path) == 0:
            return path
        try:
            with contextlib.closing(
                sqlite3.connect(f"{Path(path).resolve().as_uri()}?mode=ro", uri=True)
            ) as conn:
                found = conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'alembic_version'"
                ).fetchone()
                if found is not None:
                    found = conn.execute("SELECT version_num FROM alembic_version").fetchone()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{path} is not a usable SQLite database: {exc}") from exc
        return path if found is None else None

    def current_revision(self) -> str | None:
        from alembic.runtime.migration import MigrationContext

        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def instance_id(self) -> str:
        """A uuid naming this database; it marks the processes of its runs."""
        with self.write() as conn:
            row = conn.execute(
                select(schema.meta.c.value).where(schema.meta.c.key == "instance")
            ).scalar_one_or_none()
            if row is not None:
                return str(row)
            value = uuid.uuid4().hex
            conn.execute(schema.meta.insert().values(key="instance", value=value))
            return value

    def dispose(self) -> None:
        self.stop_checkpointing()
        self.engine.dispose()


def _ping(conn: Connection) -> bool:
    """Whether a pinned PostgreSQL connection still answers; one that does not is
    invalidated (the pool drops it instead of resetting it)."""
    raw = conn.connection.driver_connection
    assert raw is not None
    try:
        raw.autocommit = True
        try:
            raw.execute("SELECT 1")
        finally:
            if not (raw.closed or raw.broken):
                raw.autocommit = False
    except Exception as exc:  # psycopg.Error, OSError: this connection is done for
        log.debug("a pinned connection failed its ping (%s): a new one replaces it", exc)
        with contextlib.suppress(SQLAlchemyError):
            conn.invalidate()
        return False
    return True


def _sqlite_txn(conn: Connection, begin: str) -> Iterator[Connection]:
    # Straight to the driver: the engine is in autocommit mode, so SQLAlchemy keeps
    # no transaction state to get out of step, and this is on every task's path.
    raw = conn.connection.dbapi_connection
    assert raw is not None
    try:
        raw.execute(begin)
    except sqlite3.Error as exc:
        raise wrap_error(exc) from exc
    try:
        yield conn
    except BaseException:
        raw.execute("ROLLBACK")
        raise
    try:
        raw.execute("COMMIT")
    except sqlite3.Error as exc:
        with contextlib.suppress(sqlite3.Error):  # a failed COMMIT may leave it open
            raw.execute("ROLLBACK")
        raise wrap_error(exc) from exc


def alembic_config(url: str) -> Any:
    from importlib.resources import files

    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(files("jobcontrol.migrations")))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


__all__ = ["Store", "alembic_config", "pool_size_for", "redact", "schema"]
