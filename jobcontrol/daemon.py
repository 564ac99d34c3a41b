"""The daemon process: one per database, found through its pid file.

Exclusion is per database, not per pid file: a SQLite database is locked with
``flock`` on ``<db>.daemon.lock``, a PostgreSQL one with a session advisory
lock, so a second daemon on the same database is refused whatever its state
directory. The pid file (also ``flock``-ed) is how ``stop`` and ``status`` find
the daemon.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import resource
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from sqlalchemy import text

from jobcontrol import cpupin, filemodes, gcpause, places, procs, slotgroups
from jobcontrol.diskspace import DEFAULT_LOW, LOG_ROOM, DiskSpace, LowMark, available, disk_space
from jobcontrol.dispatch.dispatcher import Dispatcher, DispatcherConfig
from jobcontrol.errors import AlreadyRunningError, JobControlError, StoreUnavailable
from jobcontrol.filemodes import LogAccess
from jobcontrol.hangwatch import HangWatch
from jobcontrol.logbatch import HoldingStreamHandler
from jobcontrol.model import MAX_PORT, trees_a_stop_ends
from jobcontrol.runtime import Runtime
from jobcontrol.store import Store, driver_message, pool_size_for, queries, redact
from jobcontrol.taskenv import PassEnv

if TYPE_CHECKING:
    from jobcontrol.api.server import ApiServer
    from jobcontrol.service.eventlog import EventLog
    from jobcontrol.service.metrics import RunMetrics

log = logging.getLogger(__name__)

ADVISORY_KEY = 0x4A6F62436F6E  # "JobCon"
# How long `daemon stop --kill` waits for its audit entry's read, then its write.
STOP_AUDIT_WAIT = 5.0
# How often a daemon on PostgreSQL checks that the connection holding its lock lives.
LEASE_CHECK_EVERY = 2.0
DEFAULT_PORT = 8640
MIN_API_CONNECTIONS = 8
# Where ``daemon start`` waits for its detached child's READY=1. Not $NOTIFY_SOCKET:
# that one is systemd's, which also hears STOPPING=1 at the end, long after ``start``
# has returned and removed its socket.
READY_SOCKET = "JOBCONTROL_READY_SOCKET"


def raise_open_files_limit() -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit, as a server should (systemd leaves
    services at 1024 soft); returns (before, after). Tasks get the limit from before back
    (the worker lowers it in each task's shell): programs that use ``select()`` break on
    descriptors past 1024, which is why systemd leaves the soft limit there."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft == resource.RLIM_INFINITY or soft >= target:
        return soft, soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError) as exc:
        log.warning("could not raise the open-files limit from %d to %d: %s", soft, target, exc)
        return soft, soft
    log.info("open-files limit raised from %d to %d (the hard limit)", soft, target)
    return soft, target


@dataclass
class DaemonOptions:
    db_url: str
    state_dir: Path
    log_root: Path | None = None
    slots: int = 8
    queues: str | None = None  # --queues: the embedded worker's slot groups (slots: their sum)
    log_level: str = "INFO"
    api: bool = True
    host: str = "127.0.0.1"
    # None: $JOBCONTROL_PORT, else DEFAULT_PORT when it is free, else any free port
    # (see ``api_port``).
    port: int | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    config_dir: Path | None = None
    pass_env: PassEnv = field(default_factory=PassEnv)
    log_access: LogAccess = field(default_factory=LogAccess)
    cgroups: str = "auto"  # $JOBCONTROL_CGROUPS: a cgroup per task run where possible, or off
    cpu_pin: str = "auto"  # $JOBCONTROL_CPU_PIN: a busy daemon's threads on one CPU (cpupin)
    task_log_store: str = "file"  # $JOBCONTROL_TASK_LOGS: log files, or the database (run_log)
    disk_low: LowMark = field(default_factory=lambda: LowMark.parse(DEFAULT_LOW))
    # The admin API's bounds (``api.server``): None is what the open-files limit allows.
    api_max_connections: int | None = None
    api_header_timeout: float = 10.0

    @property
    def tag(self) -> str:
        return places.daemon_tag(self.db_url)

    @property
    def pid_file(self) -> Path:
        return places.pid_file(self.state_dir, self.db_url)

    @property
    def log_file(self) -> Path:
        return self.state_dir / f"daemon-{self.tag}.log"

    @property
    def url_file(self) -> Path:
        """Where a running daemon leaves its admin API's URL for clients to find."""
        return places.url_file(self.state_dir, self.db_url)

    @property
    def task_logs(self) -> Path:
        return self.log_root or self.state_dir / "logs"

    def disk_space(self) -> dict[str, DiskSpace]:
        """Free space where the daemon writes, for /healthz, /status and /metrics. The log
        root only with an embedded worker: a dispatcher that only coordinates
        (``--slots 0``) writes no task log, and makes no log root to watch."""
        spaces = {"state_dir": disk_space("state directory", self.state_dir, self.disk_low)}
        if self.slots > 0 or self.queues:
            spaces["log_root"] = disk_space(
                "log root", self.task_logs, self.disk_low, made_when_needed=True
            )
        return spaces

    @property
    def logs_inside_state_dir(self) -> bool:
        return self.task_logs.resolve().is_relative_to(self.state_dir.resolve())

    def make_state_dir(self) -> None:
        """Create the state directory private; with ``--log-group`` and the task logs
        inside it, the group may pass through it to them (0710), not list it."""
        gid = self.log_access.gid if self.logs_inside_state_dir else None
        mode = filemodes.PRIVATE_DIR if gid is None else filemodes.GROUP_PASS_DIR
        filemodes.make_dir(self.state_dir, mode, gid)

    def api_port(self) -> int:
        """The port the admin API will listen on, checked before anything is touched.

        A port that was asked for (``--port``, ``$JOBCONTROL_PORT``) and is taken is
        refused; without one, DEFAULT_PORT when free, else 0 (any free port), so the
        daemons of several databases run side by side (clients find each by its URL file).
        """
        asked = self.asked_port()
        if asked is not None:
            # Port 0 too: an address this host cannot listen on is refused here, in one line.
            if _port_taken(self.host, asked):
                running = places.live_pid(self.pid_file)
                if running is not None:  # most likely this database's own daemon
                    raise JobControlError(
                        f"a daemon is already running for {redact(self.db_url)} (pid "
                        f"{running}); `jobcontrol daemon status` says where it listens"
                    )
                raise JobControlError(
                    f"the admin API cannot listen on {self.host} port {asked}: it is in use "
                    "(by the daemon of another database?); give another --port, or --port 0 "
                    "for any free one"
                )
            return asked
        return 0 if _port_taken(self.host, DEFAULT_PORT) else DEFAULT_PORT

    def check_tls(self) -> None:
        """A certificate without its key (or the other way round), or a pair that cannot be
        read or is not PEM, refused before anything is made (the API loads them again)."""
        if (self.tls_cert is None) != (self.tls_key is None):
            given, missing = (
                ("--tls-cert", "--tls-key") if self.tls_key is None else ("--tls-key", "--tls-cert")
            )
            raise JobControlError(
                f"{given} without {missing}: TLS needs both the certificate and its key "
                "(nothing was started)"
            )
        if self.tls_cert is not None and self.tls_key is not None:
            from jobcontrol.api.server import tls_context

            tls_context(self.tls_cert, self.tls_key)

    def asked_port(self) -> int | None:
        """``--port``, else ``$JOBCONTROL_PORT``, else None."""
        return self.port if self.port is not None else _port_from_env()

    def file_warnings(self) -> list[str]:
        """What lets others in that the daemon did not create and so does not change."""
        from sqlalchemy.engine import make_url

        found = []
        url = make_url(self.db_url)
        if url.get_backend_name() == "sqlite" and url.database and url.database != ":memory:":
            found.append(filemodes.looser_than(Path(url.database), filemodes.PRIVATE_FILE))
        gid = self.log_access.gid
        inside = self.logs_inside_state_dir
        state_mode = filemodes.GROUP_PASS_DIR if gid is not None and inside else 0o700
        found.append(filemodes.looser_than(self.state_dir, state_mode))
        found.append(filemodes.looser_than(self.task_logs, self.log_access.dir_mode))
        if gid is not None:
            reach = "reach the task logs"
            # Every directory on the way must let the group pass: the state directory
            # (the logs' default home) or whatever holds a --log-root elsewhere.
            for above in reversed(self.task_logs.absolute().parents):
                found.append(filemodes.group_cannot(above, gid, 0o010, reach))
            found.append(filemodes.group_cannot(self.task_logs, gid, 0o050, reach))
        return [w for w in found if w]


class DatabaseLease:
    """Held for the daemon's whole life; refuses a second daemon on the same database.

    ``load`` holds it shared while it writes, so no daemon starts in the middle.
    """

    def __init__(self, store: Store) -> None:
        self.store = store
        self._fd: int | None = None
        self._conn: Any = None
        self._shared = False

    def acquire(self, *, shared: bool = False) -> None:
        """Exclusive for a daemon; ``shared`` for an offline edit (``load``), which only
        needs to keep a daemon out, not other offline edits."""
        self._shared = shared
        if self.store.is_sqlite:
            self._acquire_file()
        else:
            self._acquire_advisory()

    def _acquire_file(self) -> None:
        path = f"{self.store.sqlite_path}.daemon.lock"
        fd = filemodes.open_private(path, os.O_RDWR | os.O_CREAT)
        try:
            fcntl.flock(fd, (fcntl.LOCK_SH if self._shared else fcntl.LOCK_EX) | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 200, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise AlreadyRunningError(
                f"another Job Control daemon ({holder}) is running on {redact(self.store.url)}"
            ) from None
        if not self._shared:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
        self._fd = fd

    def _acquire_advisory(self) -> None:
        conn = self.store.engine.connect()
        lock = (
            "SELECT pg_try_advisory_lock_shared(:k)"
            if self._shared
            else "SELECT pg_try_advisory_lock(:k)"
        )
        got = conn.execute(text(lock), {"k": ADVISORY_KEY}).scalar()
        conn.commit()
        if not got:
            conn.close()
            raise AlreadyRunningError(
                f"another Job Control daemon is running on {redact(self.store.url)}"
            )
        self._conn = conn

    def check(self) -> str:
        """Whether a daemon's PostgreSQL lease still holds: ``held``; ``retaken`` after
        the connection that held it was lost (a server restart, a failover, a cut link
        drop a session's advisory lock) and the lock was taken again; ``unreachable``
        while the database does not answer (asked again at the next check); ``taken``
        when another daemon took the lock meanwhile. SQLite's lock is a file's: held."""
        if self.store.is_sqlite or self._shared or self._fd is not None:
            return "held"
        if self._conn is not None:
            try:
                self._conn.execute(text("SELECT 1"))
                self._conn.commit()
                return "held"
            except Exception as exc:
                log.warning(
                    "the connection holding the daemon's database lock was lost: %s",
                    driver_message(exc),
                )
                with contextlib.suppress(Exception):
                    self._conn.invalidate()
                with contextlib.suppress(Exception):
                    self._conn.close()
                self._conn = None
        try:
            self._acquire_advisory()
        except AlreadyRunningError:
            return "taken"
        except Exception:
            return "unreachable"
        return "retaken"

    def available(self) -> bool:
        """True if no daemon holds the database (checked without keeping the lease)."""
        try:
            self.acquire()
        except AlreadyRunningError:
            return False
        self.release()
        return True

    def holder(self) -> str | None:
        """Who holds the database as its daemon (``pid 31584 on vm`` from the lock file
        beside a SQLite file; on PostgreSQL, whose lock does not say, a pid not known), or
        None when no daemon does (or the database cannot say). Takes nothing and creates
        nothing: a shared hold (an offline ``load``) is no daemon."""
        try:
            return self.holder_or_raise()
        except Exception:  # the database does not answer: it cannot say
            return None

    def holder_or_raise(self) -> str | None:
        """``holder``, raising the driver's error when the database cannot say."""
        if self.store.is_sqlite:
            return self._file_holder()
        with self.store.engine.connect() as conn:
            got = conn.execute(
                text("SELECT pg_try_advisory_lock_shared(:k)"), {"k": ADVISORY_KEY}
            ).scalar()
            if got:
                conn.execute(text("SELECT pg_advisory_unlock_shared(:k)"), {"k": ADVISORY_KEY})
            conn.commit()
        return None if got else "pid not known: PostgreSQL's advisory lock does not say"

    def _file_holder(self) -> str | None:
        try:
            fd = os.open(f"{self.store.sqlite_path}.daemon.lock", os.O_RDONLY)
        except OSError:
            return None  # no lock file: no daemon ever ran here
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 200, 0).decode(errors="replace").strip() or "pid not known"
        finally:
            os.close(fd)
        return None

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._conn is not None:
            with contextlib.suppress(Exception):
                unlock = (
                    "SELECT pg_advisory_unlock_shared(:k)"
                    if self._shared
                    else "SELECT pg_advisory_unlock(:k)"
                )
                self._conn.execute(text(unlock), {"k": ADVISORY_KEY})
                self._conn.commit()
            self._conn.close()
            self._conn = None


class PidFile:
    def __init__(self, path: Path, what: str = "daemon") -> None:
        self.path = path
        self.what = what
        self._fd: int | None = None

    def acquire(self) -> None:
        try:
            filemodes.make_dir(self.path.parent)
            fd = filemodes.open_private(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:  # a full disk, a directory it may not write
            raise JobControlError(
                f"cannot create the pid file {self.path}: {exc.strerror}"
            ) from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise AlreadyRunningError(
                f"pid file {self.path} is held by another {self.what}"
            ) from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:  # a full disk: the state directory cannot take it
            with contextlib.suppress(OSError):
                self.path.unlink()
            os.close(fd)
            raise JobControlError(
                f"cannot write the pid file {self.path}: {exc.strerror}"
            ) from None
        self._fd = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            os.close(self._fd)
            self._fd = None


LOG_FORMATS = ("text", "json")
# What every LogRecord has: anything else on a record came from ``extra=`` and is kept.
_RECORD_FIELDS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


class TextFormatter(logging.Formatter):
    """The default format, its time formatted once per second, not for every record."""

    _second: tuple[int, str] = (-1, "")

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802
        whole = int(record.created)
        second, text = self._second  # one read: another thread may replace it
        if second != whole:
            text = time.strftime(self.default_time_format, self.converter(whole))
            self._second = (whole, text)
        return f"{text},{int(record.msecs):03d}"


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time (UTC, ISO 8601), level, logger, message, the
    process and thread, a record's ``extra=`` fields, and any traceback as text."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            "thread": record.threadName,
        }
        for key, value in vars(record).items():
            if key not in _RECORD_FIELDS and not key.startswith("_") and key not in entry:
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, default=str, ensure_ascii=False)


def configure_logging(level: str, stream: TextIO | None = None, fmt: str = "text") -> None:
    """The daemon's log on ``stream`` (stderr: the journal under systemd, the log file of
    ``daemon start``), as text or JSON lines; warnings and uncaught exceptions of any
    thread go through it too, so a JSON log holds nothing but JSON."""
    if fmt not in LOG_FORMATS:
        raise JobControlError(f"--log-format {fmt!r} is not one of {', '.join(LOG_FORMATS)}")
    root = logging.getLogger()
    root.handlers.clear()
    # Lines the dispatcher writes after a transaction go out together (logbatch).
    handler = HoldingStreamHandler(stream or sys.stderr)
    handler.setFormatter(
        JsonFormatter()
        if fmt == "json"
        else TextFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    )
    # Neither format shows where a call was made from, nor a multiprocessing name: a
    # record skips finding them (the logging HOWTO's "Optimization"). A busy daemon
    # logs a few lines per tree run.
    logging._srcfile = None
    logging.logMultiprocessing = False
    root.addHandler(handler)
    root.setLevel(level.upper())
    for noisy in ("apscheduler", "alembic"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    logging.captureWarnings(True)
    threading.excepthook = _log_thread_exception


def _log_thread_exception(args: threading.ExceptHookArgs) -> None:
    if args.exc_type is SystemExit or args.exc_value is None:
        return
    name = args.thread.name if args.thread is not None else "a thread"
    log.critical(
        "uncaught exception in thread %s",
        name,
        exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
    )


def refuse_unprepared_file(store: Store) -> None:
    """A SQLite file that exists without Job Control's schema is refused, as ``load`` does.

    The daemon creates the schema at start only in a file it creates itself: an empty
    file (or someone else's database) given by mistake would otherwise become a new
    Job Control database with no jobs and a newly minted admin token.
    """
    path = store.unprepared_file()
    if path is not None:
        raise JobControlError(
            f"{path} exists but has no Job Control schema: run `jobcontrol db upgrade` "
            "if it is meant to be a Job Control database (nothing was changed)"
        )


class Daemon:
    """Everything one daemon holds: the lease, the pid file, the dispatcher."""

    def __init__(self, opts: DaemonOptions, store: Store | None = None) -> None:
        self.opts = opts
        # The embedded worker's slot groups (--queues), parsed once: they size the pool.
        self.slot_groups = slotgroups.parse(opts.queues) if opts.queues else None
        groups = len(self.slot_groups) if self.slot_groups else 1
        self.store = store or Store(opts.db_url, pool_size=pool_size_for(opts.slots, groups))
        self.lease = DatabaseLease(self.store)
        self.pid_file = PidFile(opts.pid_file)
        self.runtime: Runtime | None = None
        self.dispatcher: Dispatcher | None = None
        self.api: ApiServer | None = None
        self.eventlog: EventLog | None = None
        self.metrics: RunMetrics | None = None
        self.stop_requested = threading.Event()
        self._forced = False  # stopped by `daemon stop --kill`: every run in flight killed
        # Set when another daemon took the database while this one's lock was lost.
        self.lease_lost = False
        self._lease_watch: threading.Thread | None = None
        self.hang_watch: HangWatch | None = None
        self._stopping = threading.Event()

    def _watch_lease(self) -> None:
        """Take the database's lock again whenever the connection holding it is lost; stop
        this daemon when another took it meanwhile, so that no tree runs twice."""
        while not self._stopping.wait(LEASE_CHECK_EVERY):
            state = self.lease.check()
            if state == "retaken":
                log.warning("the daemon's database lock is held again")
            elif state == "taken":
                self.lease_lost = True
                if self.dispatcher is not None:
                    self.dispatcher.depose()  # before any rebuild could take the other's runs
                log.error(
                    "another Job Control daemon took %s while this one's connection to it "
                    "was lost: this daemon stops (killing what it runs) so that no tree "
                    "runs twice",
                    redact(self.store.url),
                )
                self.stop_requested.set()
                return

    def start(self) -> Dispatcher:
        refuse_unprepared_file(self.store)  # before anything is created or written
        open_files_before, open_files = raise_open_files_limit()
        # Checked before anything is made: a bound that cannot hold changes nothing.
        api_connections = self._api_connections() if self.opts.api else 0
        # Before anything is created or changed: a port that is taken is refused here.
        port = self.opts.api_port() if self.opts.api else 0
        self.opts.make_state_dir()
        for warning in self.opts.file_warnings():
            log.warning("%s", warning)
        self.store.upgrade()
        self.lease.acquire()
        try:
            self.pid_file.acquire()
            from jobcontrol import __version__

            config = DispatcherConfig(log_root=self.opts.task_logs, slots=self.opts.slots)
            if self.slot_groups:
                config.slot_groups = self.slot_groups
            self.runtime = Runtime(
                self.store,
                config,
                version=__version__,
                pass_env=self.opts.pass_env,
                log_access=self.opts.log_access,
                cgroups=self.opts.cgroups,
                task_open_files=open_files_before if open_files != open_files_before else None,
                log_store=self.opts.task_log_store,
                spool_dir=self.opts.state_dir / "spool",
            )
            self.dispatcher = self.runtime.start()
            dispatcher = self.dispatcher
            runtime = self.runtime
            self.hang_watch = HangWatch(
                self.store.longest_write,
                lambda: dispatcher.liveness()["handler_s"],
                lambda: not runtime.database()["ok"],  # any part of the daemon's
            )
            self.hang_watch.start()
            if self.opts.api:
                self._start_api(self.runtime, port, api_connections)
        except BaseException:
            self.stop()
            raise
        if not self.store.is_sqlite:
            self._lease_watch = threading.Thread(
                target=self._watch_lease, name="jc-lease", daemon=True
            )
            self._lease_watch.start()
        self._warn_slash_names()
        log.info("daemon pid %s serving %s", os.getpid(), redact(self.store.url))
        self.opts.pass_env.say(log, "daemon")
        return self.dispatcher

    def _warn_slash_names(self) -> None:
        """Jobs named with '/' before it was refused keep working; say how to rename them."""
        with self.store.read() as conn:
            found = queries.jobs_named_with(conn, "/")
        for job_id, name in found:
            log.warning(
                "job %r (id %d) has '/' in its name, which new names may not (the API may take "
                "it for a path separator: name it by its id); rename it with "
                "`jobcontrol set %d name=NEW`",
                name,
                job_id,
                job_id,
            )

    def _start_api(self, runtime: Runtime, port: int, max_connections: int) -> None:
        from jobcontrol import __version__
        from jobcontrol.api.deps import ApiContext
        from jobcontrol.api.server import ApiServer
        from jobcontrol.service.engine import Engine
        from jobcontrol.service.eventlog import EventLog
        from jobcontrol.service.metrics import RunMetrics
        from jobcontrol.service.users import known_tokens

        dispatcher = runtime.dispatcher
        # Numbered on from the microseconds of this start: higher than any number a
        # daemon before gave (a few events a millisecond at most), so a client that
        # resumes with the last number it saw from that daemon is told to take a fresh
        # snapshot. Numbered from 0 again, once this daemon had given as many events it
        # was sent this one's from there on, applied to the tree it held from before.
        self.eventlog = EventLog(dispatcher, start_after=time.time_ns() // 1000)
        self.eventlog.start()
        self.metrics = RunMetrics(dispatcher)
        self.metrics.start()
        ctx = ApiContext(
            store=self.store,
            engine=Engine(self.store, dispatcher),
            eventlog=self.eventlog,
            version=__version__,
            started=dispatcher.clock.now(),
            request_shutdown=self._shutdown_requested,
            metrics=self.metrics,
            database=runtime.database,
            containment=runtime.containment_view,
            gauges=runtime.gauges,
            disk=self.opts.disk_space,
        )

        self.api = ApiServer(
            ctx,
            host=self.opts.host,
            port=port,
            certfile=self.opts.tls_cert,
            keyfile=self.opts.tls_key,
            max_connections=max_connections,
            header_timeout=self.opts.api_header_timeout,
        )
        url = self.api.start()
        if self.opts.asked_port() is None and port != DEFAULT_PORT:
            log.warning(
                "port %s is in use (the daemon of another database?): the admin API is at %s; "
                "local clients find it by themselves, give --port for a fixed one",
                DEFAULT_PORT,
                url,
            )
        # Only once it listens: a daemon that cannot serve leaves no token behind.
        self._token_file()
        try:
            # Tokens valid at the start read status and health through a later outage,
            # used before it or not (README "Database outages").
            ctx.known_users.update(known_tokens(self.store))
        except StoreUnavailable as exc:
            log.warning("the users' tokens were not read at the start: %s", exc)
        filemodes.write_private(self.opts.url_file, url + "\n")

    def _api_connections(self) -> int:
        """The API's connection limit: never so many that a task run could not get the
        files it needs (``server.fd_reserve``) however busy the API is."""
        from jobcontrol.api.server import connection_limit, fd_reserve, open_files_limit

        files, slots = open_files_limit(), self.opts.slots
        room = files - fd_reserve(slots)
        wanted = self.opts.api_max_connections
        if wanted is not None and wanted > room:
            raise JobControlError(
                f"--api-max-connections {wanted} is more than the open-files limit ({files}) "
                f"leaves once {fd_reserve(slots)} are kept for the daemon and its {slots} task "
                f"slots: at most {max(room, 0)} (raise the limit: ulimit -Hn, LimitNOFILE=)"
            )
        if room < MIN_API_CONNECTIONS:
            log.warning(
                "the open-files limit (%d) leaves room for only %d admin API connections "
                "with %d task slots; raise it (ulimit -Hn, systemd LimitNOFILE=)",
                files,
                max(room, 0),
                slots,
            )
        return wanted or connection_limit(files, slots)

    def _token_file(self) -> None:
        """This database's token file: made on first start, or adopted from the one
        token file of older versions when that token is one of this database's."""
        from jobcontrol.service.users import adopt_legacy_token, ensure_admin_token

        config_dir = self.opts.config_dir or places.default_config_dir()
        token_file = ensure_admin_token(self.store, config_dir)
        if token_file is not None:
            log.warning("first start: created user 'admin'; its token is in %s", token_file)
            return
        try:
            adopted = adopt_legacy_token(self.store, config_dir)
        except (OSError, JobControlError) as exc:
            log.warning("the token file of an older version was not adopted: %s", exc)
            return
        if adopted is not None:
            log.warning(
                "the token in %s (kept by older versions for every database) is this "
                "database's: copied to %s",
                config_dir / places.TOKEN_FILE,
                adopted,
            )

    def stop(self) -> None:
        self._stopping.set()
        if self._lease_watch is not None and self._lease_watch is not threading.current_thread():
            self._lease_watch.join(LEASE_CHECK_EVERY + 5)
        if self.hang_watch is not None:
            self.hang_watch.stop()
        try:
            if self.runtime is not None:
                # Nothing starts while the API closes: a stop that found no job running
                # (or the CLI's stop refuses) must not kill a run a timer started meanwhile.
                self.runtime.dispatcher.timers.shutdown()
            if self.eventlog is not None:
                self.eventlog.stop()  # ends the event streams: the API need not wait for them
            if self.api is not None:
                self.api.stop()
                self.opts.url_file.unlink(missing_ok=True)
            if self.metrics is not None:
                self.metrics.stop()
            if self.runtime is not None:
                # `daemon stop --kill` kills every run in flight, on any worker. A service
                # manager's stop or restart (SIGTERM), or a stop that found nothing
                # running, kills what runs in this process only: the runs of workers of
                # their own go on, and the next start reacts to their ends.
                self.runtime.stop(kill_running=True, remote_too=self._forced)
        finally:
            self.pid_file.release()
            self.lease.release()
            self.store.dispose()

    def _shutdown_requested(self, force: bool) -> None:
        """The API's shutdown (`daemon stop`): ``force`` (``--kill``) kills every run."""
        self._forced = force
        self.stop_requested.set()

    def run_forever(self) -> None:
        """Foreground: start, tell systemd, serve until SIGTERM/SIGINT, stop cleanly."""
        # SIGUSR1 is `daemon stop --kill`'s: every run in flight killed, on any worker.
        StopSignals(
            lambda signum: self._shutdown_requested(signum == KILL_ALL_SIGNAL),
            also=(KILL_ALL_SIGNAL,),
        ).install()
        serve(
            self.start,
            self.stop,
            self.stop_requested,
            "JobControl shutdown request",
            cpu_pin=self.opts.cpu_pin,
        )


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:  # a real-time signal between SIGRTMIN and SIGRTMAX
        return f"signal {signum}"


# The signal of `daemon stop --kill`: stop, killing every run in flight wherever it runs
# (SIGTERM and SIGINT kill only what runs in the daemon's own process).
KILL_ALL_SIGNAL = signal.SIGUSR1


def _acted_on_elsewhere(_signum: int, _frame: object) -> None:
    """The Python-level handler of a ``StopSignals`` signal: the work is the thread's."""


class StopSignals:
    """SIGTERM and SIGINT of a foreground process (the daemon, a worker), acted on by a
    thread of their own, ``jc-signals``, whichever thread the kernel hands them to.

    The kernel gives a process's signal to any of its threads that does not block it,
    and to another than the main one when the main thread already has one pending (the
    second of two sent back to back, as ``worker stop --kill`` does) or is busy. Python
    runs its handlers in the main thread only, the next time that thread runs Python
    code; a main thread asleep in a lock wait (``Event.wait``, ``Thread.join``) is not
    woken by a signal another thread took. A handler doing the work could so wait an
    hour to run. Here the C-level handler writes each signal's number to a pipe
    (``signal.set_wakeup_fd``) from whatever thread it ran in, and the ``jc-signals``
    thread reads it and calls ``act(signum)``: nothing runs in signal context, and no
    lock is ever taken there (a handler that sets an ``Event`` deadlocks when a second
    signal lands while the first one's ``set`` holds the event's lock).
    """

    SIGNALS: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)

    def __init__(self, act: Callable[[int], None], also: tuple[int, ...] = ()) -> None:
        self._act = act
        self.SIGNALS = (*self.SIGNALS, *also)

    def install(self) -> None:
        """From the main thread (``set_wakeup_fd`` is refused elsewhere), before any
        other thread is started."""
        blocked = signal.pthread_sigmask(signal.SIG_SETMASK, ())
        if blocked:
            log.info(
                "unblocked the signals this process inherited blocked: %s",
                ", ".join(_signal_name(int(s)) for s in sorted(blocked)),
            )
        read_fd, write_fd = os.pipe2(os.O_CLOEXEC)
        os.set_blocking(write_fd, False)  # the C handler must never block
        threading.Thread(target=self._loop, args=(read_fd,), name="jc-signals", daemon=True).start()
        signal.set_wakeup_fd(write_fd)
        for signum in self.SIGNALS:
            signal.signal(signum, _acted_on_elsewhere)

    def _loop(self, read_fd: int) -> None:
        while True:
            for signum in os.read(read_fd, 64):
                if signum not in self.SIGNALS:
                    continue
                try:
                    self._act(signum)
                except Exception:  # reported; the next signal is still acted on
                    log.exception("acting on signal %s failed", signal.Signals(signum).name)


def serve(
    start: Callable[[], object],
    stop: Callable[[], None],
    stop_requested: threading.Event,
    why: str,
    cpu_pin: str = "auto",
) -> None:
    """Start, say READY=1 (to systemd, and to ``daemon start`` or ``worker start``), wait
    for ``stop_requested``, say STOPPING=1, stop: the foreground life of the daemon and of
    a worker process. ``cpu_pin``: where its threads run while it is busy (``cpupin``)."""
    # `start`'s socket hears READY=1 once; systemd's hears every state change.
    started_by = os.environ.pop(READY_SOCKET, None)
    # What is alive now lives as long as the process (modules, the options, the store's
    # engine): kept out of the collector's full passes, which stop every thread.
    frozen = gcpause.freeze_startup()
    log.debug("%d start-up objects kept out of full garbage collections", frozen)
    pin = cpupin.CpuPin(cpu_pin)
    start()
    pin.start()
    try:
        procs.sd_notify("READY=1")
        if started_by:
            procs.sd_notify("READY=1", started_by)
        while not stop_requested.wait(3600):
            pass
        procs.sd_notify("STOPPING=1")
        log.info("%s", why)
    finally:
        pin.stop()
        stop()


def _port_from_env() -> int | None:
    value = os.environ.get("JOBCONTROL_PORT", "").strip()
    if not value:
        return None
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 <= port <= MAX_PORT:
        raise JobControlError(f"$JOBCONTROL_PORT={value!r} is not a port number (0 to {MAX_PORT})")
    return port


def _port_taken(host: str, port: int) -> bool:
    """True if something listens on ``host``:``port`` (bound as the server binds it)."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            return True
        raise JobControlError(
            f"the admin API cannot listen on {host} port {port}: {exc.strerror or exc}"
        ) from None
    return False


def start_detached(
    opts: DaemonOptions | Any, argv: list[str], timeout: float = 60.0, what: str = "daemon"
) -> int:
    """Start ``jobcontrol daemon run`` (or ``worker run``: ``what``) in the background;
    returns its pid once it is READY.

    ``argv`` must not hold the database URL: it goes in the child's environment
    (``JOBCONTROL_DB``, which the child drops as it reads it), since a command line
    is shown to every local user by ``ps`` and the URL may carry a password.
    """
    opts.make_state_dir()
    with tempfile.TemporaryDirectory(prefix="jc-notify-") as tmp:
        address = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(address)
        # A detached daemon is nobody's service: a $NOTIFY_SOCKET of ours is not for it.
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        env |= {READY_SOCKET: address, "JOBCONTROL_DB": opts.db_url}
        log_fd = filemodes.open_private(opts.log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        written_from = os.fstat(log_fd).st_size  # the log may be a running daemon's too
        with open(log_fd, "ab") as out:
            child = subprocess.Popen(
                [sys.executable, "-m", "jobcontrol", *argv],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                start_new_session=True,
                env=env,
                close_fds=True,
            )
        deadline = time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                sock.settimeout(0.2)
                try:
                    if b"READY=1" in sock.recv(4096):
                        return child.pid
                except TimeoutError:
                    pass
                if child.poll() is not None:
                    raise _start_failed(what, child.returncode, opts.log_file, written_from)
        finally:
            sock.close()
        child.terminate()
        raise JobControlError(
            f"the {what} did not get ready within {timeout:g}s; see {opts.log_file}"
        )


def lease_holder(db_url: str, *, strict: bool = False) -> str | None:
    """``DatabaseLease.holder`` of the database ``db_url``; with ``strict``, the driver's
    error when the database cannot say (``holder_or_raise``)."""
    store = Store(db_url)
    try:
        lease = DatabaseLease(store)
        return lease.holder_or_raise() if strict else lease.holder()
    finally:
        store.dispose()


def elsewhere(opts: DaemonOptions) -> str | None:
    """Said when this state directory has no daemon but one holds the database: its
    state directory is another, so neither its pid file nor its API URL is here."""
    holder = lease_holder(opts.db_url)
    if holder is None:
        return None
    return (
        f"no daemon of state directory {opts.state_dir} is running, but another holds "
        f"{redact(opts.db_url)} ({holder}): its state directory is not this one; give "
        "its --state-dir (or --url for its admin API)"
    )


def stop_daemon(
    opts: DaemonOptions, *, kill_jobs: bool, timeout: float = 60.0, by: str = "local"
) -> tuple[int, list[str]]:
    """Stop the daemon of this database; refuses while jobs run unless ``kill_jobs``. Its
    pid, and the top-level trees left in flight (``trees_a_stop_ends``): a task waiting
    in the queue, or running on a worker of its own, goes on. Audited as the API's
    shutdown is (``daemon.shutdown``, by ``by``), refused or not."""
    pid = places.live_pid(opts.pid_file)
    if pid is None:
        raise JobControlError(elsewhere(opts) or f"no daemon is running for {redact(opts.db_url)}")
    store = Store(opts.db_url)
    try:
        if not kill_jobs:
            left = _stop_allowed(store, by=by)
            return _signal_stop(pid, kill_jobs=False, timeout=timeout), left
        # --kill is not held up by a database that does not answer: its audit entry is
        # read and written beside the stop, waited for a little, and what an outage costs.
        read = threading.Event()
        audit_kill = threading.Thread(
            target=_audit_kill, args=(store, by, read), name="jc-stop-audit", daemon=True
        )
        audit_kill.start()
        read.wait(STOP_AUDIT_WAIT)  # the trees it ends, read before they are killed
        _signal_stop(pid, kill_jobs=True, timeout=timeout)
        audit_kill.join(STOP_AUDIT_WAIT)
        if audit_kill.is_alive():
            log.warning(
                "the stop's audit entry (daemon.shutdown by %s) not written: the database "
                "did not answer within %gs",
                by,
                STOP_AUDIT_WAIT,
            )
        return pid, []
    finally:
        if not kill_jobs or not audit_kill.is_alive():
            store.dispose()


def _signal_stop(pid: int, *, kill_jobs: bool, timeout: float) -> int:
    """Signal the daemon ``pid`` to stop and wait for it to exit."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return pid
    try:
        # SIGTERM stops it as a service manager does: the runs of workers of their own
        # go on. --kill asks for every run in flight to be killed, wherever it runs.
        # (A daemon of an earlier version, which does not catch it, gets SIGTERM: it
        # kills every run on it anyway.)
        kill_all = kill_jobs and _catches(pid, KILL_ALL_SIGNAL)
        os.kill(pid, KILL_ALL_SIGNAL if kill_all else signal.SIGTERM)
        # The pidfd becomes readable when the process exits: no polling.
        if select.select([pidfd], [], [], timeout)[0]:
            return pid
    finally:
        os.close(pidfd)
    raise JobControlError(f"the daemon (pid {pid}) did not stop within {timeout:g}s")


def _stop_allowed(store: Store, *, by: str) -> list[str]:
    """Whether a stop without --kill may go on, audited: the trees it leaves in flight;
    refused (and audited so) while jobs run."""
    from jobcontrol.service import audit

    try:
        with store.read() as conn:
            running, left = trees_a_stop_ends(queries.active_runs(conn))
    except StoreUnavailable as exc:
        raise JobControlError(
            f"stop refused: whether jobs are running cannot be read ({exc}); use --kill "
            "to stop anyway (the daemon kills its runs and keeps their ends on disk until "
            "the database answers)"
        ) from None
    if running:
        message = f"jobs are running ({', '.join(running)}); stop refused — use --kill to kill them"
        _audit_stop(store, by, running, audit.Result.REFUSED, message)
        raise JobControlError(message)
    _audit_stop(store, by, [], audit.Result.OK, "graceful (jobcontrol daemon stop)")
    return left


def _audit_kill(store: Store, by: str, read: threading.Event) -> None:
    """The audit entry of a ``daemon stop --kill``: the trees in flight it ends."""
    from jobcontrol.service import audit

    try:
        with store.read() as conn:
            running, left = trees_a_stop_ends(queries.active_runs(conn))
    except JobControlError as exc:
        log.warning("the stop's audit entry (daemon.shutdown by %s) not written: %s", by, exc)
        return
    finally:
        read.set()
    ended = running + left
    detail = "forced, killing running jobs" if ended else "graceful"
    _audit_stop(store, by, ended, audit.Result.OK, f"{detail} (jobcontrol daemon stop --kill)")


def _audit_stop(store: Store, by: str, jobs: list[str], result: Any, detail: str) -> None:
    from jobcontrol.service import audit

    try:
        audit.record(store, by, "daemon.shutdown", jobs, result, detail)
    except JobControlError as exc:  # the stop itself matters more than its trail
        log.warning("the stop's audit entry (daemon.shutdown by %s) not written: %s", by, exc)


def _catches(pid: int, signum: int) -> bool:
    """Whether process ``pid`` has a handler for ``signum`` (``SigCgt`` in its status)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    for line in status.splitlines():
        if line.startswith("SigCgt:"):
            return bool(int(line.split()[1], 16) & (1 << (signum - 1)))
    return False


def _start_failed(what: str, status: int, log_file: Path, offset: int) -> JobControlError:
    """Why a detached daemon or worker exited before it was ready: the error it gave
    (its ``jobcontrol: ...`` line), else the last lines it wrote. Only what this child
    wrote: the file may be the log of a daemon that runs (the usual reason to exit)."""
    try:
        with open(log_file, "rb") as log_in:
            log_in.seek(offset)
            lines = log_in.read().decode(errors="replace").splitlines()
    except OSError:
        lines = []
    reasons = [
        line.removeprefix("jobcontrol: ") for line in lines if line.startswith("jobcontrol: ")
    ]
    if reasons:
        return JobControlError(f"the {what} did not start: {reasons[-1]} (log {log_file})")
    if not lines:
        # Nothing written: its reason could not be either, most likely for want of room.
        try:
            free = available(os.statvfs(log_file.parent))
        except OSError:
            free = None
        if free is not None and free < LOG_ROOM:
            return JobControlError(
                f"the {what} exited at start (status {status}) without a word in {log_file}: "
                f"its disk is full ({free} bytes free)"
            )
    return JobControlError(
        f"the {what} exited at start (status {status}); see {log_file}:\n" + "\n".join(lines[-20:])
    )
