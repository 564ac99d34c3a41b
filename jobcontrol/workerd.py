"""A remote worker process: ``jobcontrol worker --db postgresql+psycopg://… --name build-1``.

It runs the same ``Worker`` as the daemon's embedded one, on any host that reaches
the database: it claims task runs of the lanes it serves from the run queue,
runs them, and records their ends, all through the store's run-queue interface
(``RunQueue``). The dispatcher and it meet only in the database; the wake-ups
between them travel by PostgreSQL's LISTEN/NOTIFY (``store.relay``), with the
back-up polls of both sides for what a lost notification leaves behind.

Rules, and why:

* PostgreSQL only. A SQLite file is one host's: a worker on another host cannot
  share it safely (file locks over network filesystems), and on the same host the
  daemon's embedded worker already serves it. Refused with a message saying so.
* A worker never migrates the schema: the daemon does. A worker whose code is for
  another revision is refused (it would read columns that are not there).
* Names are unique. A name that a live worker holds (heartbeat within its lease,
  or a live process on this host) is refused. A worker restarting under its old
  name on the same host first kills what its previous process left running and
  records those runs ``lost`` (their outcome died with it): their trees go on at
  once instead of after the lease.
* ``SIGTERM`` (``worker stop``) stops claiming and lets the runs in hand end and be
  recorded (a warm stop); a second ``SIGTERM`` or ``SIGINT``, or ``worker stop
  --kill``, kills them (recorded killed, 255) and exits. With ``--drain-timeout``
  the runs still in hand that long after the SIGTERM are killed the same way, so a
  stop (systemd's ``TimeoutStopSec``, a host's shutdown) never ends in a SIGKILL
  that leaves their outcomes to the leases. A ``kill -9`` leaves its runs to their
  leases: the dispatcher settles them when the leases expire.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jobcontrol import events, filemodes, places, slotgroups
from jobcontrol.cgroups import Containment, JoinWarmer
from jobcontrol.clock import Clock, SystemClock
from jobcontrol.daemon import PidFile, StopSignals, serve
from jobcontrol.dispatch.recovery import worker_alive
from jobcontrol.errors import JobControlError
from jobcontrol.filemodes import LogAccess
from jobcontrol.hangwatch import HangWatch
from jobcontrol.slotgroups import SlotGroup
from jobcontrol.store import Store, driver_message, pool_size_for, queries, redact
from jobcontrol.store.relay import Relay
from jobcontrol.store.runqueue import (
    RunQueue,
    get_worker,
    heard_of_lately,
    lost_end,
    queues_of,
)
from jobcontrol.taskenv import PassEnv
from jobcontrol.worker import keptends
from jobcontrol.worker import recovery as local_recovery
from jobcontrol.worker.local import Worker

log = logging.getLogger(__name__)

_SAFE = re.compile(r"[^A-Za-z0-9_.-]")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.:@-]{0,127}")


def check_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise JobControlError(
            f"worker name {name!r}: use 1 to 128 letters, digits and _ . : @ -, "
            "starting with a letter or digit"
        )
    return name


@dataclass
class WorkerOptions:
    db_url: str
    name: str
    state_dir: Path
    groups: list[SlotGroup] = field(default_factory=lambda: slotgroups.every_queue(8))
    log_root: Path | None = None
    pass_env: PassEnv = field(default_factory=PassEnv)
    log_access: LogAccess = field(default_factory=LogAccess)
    cgroups: str = "auto"
    cpu_pin: str = "auto"  # $JOBCONTROL_CPU_PIN (``cpupin``)
    kill_grace: float = 5.0
    drain_timeout: float | None = None  # after SIGTERM, then the runs in hand are killed

    @property
    def file_tag(self) -> str:
        return f"{_SAFE.sub('_', self.name)}-{places.daemon_tag(self.db_url)}"

    @property
    def pid_file(self) -> Path:
        return self.state_dir / f"worker-{self.file_tag}.pid"

    @property
    def log_file(self) -> Path:
        return self.state_dir / f"worker-{self.file_tag}.log"

    @property
    def task_logs(self) -> Path:
        return self.log_root or self.state_dir / "worker-logs" / _SAFE.sub("_", self.name)

    @property
    def slots(self) -> int:
        return sum(g.slots for g in self.groups)

    def make_state_dir(self) -> None:
        filemodes.make_dir(self.state_dir, filemodes.PRIVATE_DIR)


def needs_postgres(url: str) -> None:
    """A worker's database is PostgreSQL: refused here, by its URL alone, otherwise."""
    from sqlalchemy.engine import make_url

    url = places.normalise_url(url)
    if make_url(url).get_backend_name() != "postgresql":
        raise JobControlError(
            f"a worker process needs a PostgreSQL database, not {redact(url)}: a SQLite "
            "file belongs to one host, where the daemon's embedded worker runs its tasks "
            "(jobcontrol daemon run --slots N)"
        )


def refuse_unusable(store: Store) -> None:
    """A worker needs PostgreSQL, and a schema of its own version (the daemon migrates)."""
    needs_postgres(store.url)
    from sqlalchemy.exc import SQLAlchemyError

    from jobcontrol.service.dbcopy import head_revision

    try:
        revision = store.current_revision()
    except SQLAlchemyError as exc:
        # One line, as the daemon says it (a service manager restarts the worker).
        raise JobControlError(
            f"cannot reach the database {redact(store.url)}: {driver_message(exc)}"
        ) from None
    head = head_revision()
    if revision is None:
        raise JobControlError(
            f"{redact(store.url)} has no Job Control schema: start the daemon on it first "
            "(or run jobcontrol db upgrade)"
        )
    if revision != head:
        raise JobControlError(
            f"{redact(store.url)}'s schema is at revision {revision} and this worker's is {head}:"
            " run the same version of Job Control as the daemon"
        )


class RemoteWorker:
    """Everything one worker process holds: its pid file, the relay, the worker."""

    def __init__(
        self, opts: WorkerOptions, store: Store | None = None, clock: Clock | None = None
    ) -> None:
        check_name(opts.name)
        self.opts = opts
        self.store = store or Store(
            opts.db_url, pool_size=pool_size_for(opts.slots, len(opts.groups))
        )
        self.clock = clock or SystemClock()
        self.host = socket.gethostname()
        self.runqueue = RunQueue(self.store)
        self.pid_file = PidFile(opts.pid_file, what="worker of this name and database")
        self.hang_watch: HangWatch | None = None
        self.relay: Relay | None = None
        self.worker: Worker | None = None
        self.containment: Containment | None = None
        self._on_timers_due: Any = None  # the receiver of ``timers_due``, while connected
        self.stop_requested = threading.Event()
        self.kill_requested = threading.Event()
        self._serving = threading.Event()  # set once start() is through
        self._drain: threading.Timer | None = None

    def start(self) -> Worker:
        refuse_unusable(self.store)
        self.opts.make_state_dir()
        self.pid_file.acquire()
        try:
            worker = self._start()
            self._serving.set()
            return worker
        except BaseException:
            self.stop()
            raise

    def _start(self) -> Worker:
        from jobcontrol import __version__

        previous = self._refuse_live_namesake()
        instance = self.store.instance_id()
        marker = {"JOBCONTROL_WORKER": self.opts.name}
        # Its own cgroup subtree, apart from the daemon's and other workers' on this host.
        self.containment = Containment.setup(f"{instance}:{self.opts.name}", self.opts.cgroups)
        log.info("task runs are contained by %s", self.containment.describe())
        if self.containment.advice:
            log.warning("%s", self.containment.advice)
        self._warm_joins(self.containment)
        spool_dir = self.opts.state_dir / "spool" / _SAFE.sub("_", self.opts.name)
        # Ends an earlier life kept on disk (stopped during an outage): recorded before
        # recovery, which would settle those runs as lost (as the daemon does).
        keptends.record(self.runqueue, spool_dir)
        self._recover(instance, marker, previous)
        self.relay = relay = Relay(self.store, name=f"worker {self.opts.name}")
        relay.start()
        self.worker = Worker(
            self.runqueue,
            clock=self.clock,
            log_root=self.opts.task_logs,
            instance_id=instance,
            name=self.opts.name,
            groups=self.opts.groups,
            # No shared filesystem with the daemon: task output goes to the database.
            log_store="database",
            spool_dir=spool_dir,
            kill_grace=self.opts.kill_grace,
            version=__version__,
            pass_env=self.opts.pass_env,
            log_access=self.opts.log_access,
            containment=self.containment,
            marker=marker,
            # While its listener is cut, a lost push costs at most one poll interval.
            pushes=lambda: relay.listening,
            lane_pushes=lambda: relay.listening,  # every lane-table write is announced
        )
        self.worker.start()
        self.worker.wake()  # runs queued before it listened
        worker = self.worker
        self.hang_watch = HangWatch(
            self.store.longest_write, lambda: 0.0, lambda: worker.outage.state().down
        )
        self.hang_watch.start()
        log.info(
            "worker %s (pid %s on %s) serving %s with %s on %s",
            self.opts.name,
            os.getpid(),
            self.host,
            slotgroups.format_groups(self.opts.groups),
            f"{self.opts.slots} slot(s)",
            redact(self.store.url),
        )
        self.opts.pass_env.say(log, "worker")
        return self.worker

    def _warm_joins(self, containment: Containment) -> None:
        """Where a run's join may wait for the kernel, keep it cheap whenever the daemon
        says its timers are about to queue runs (``timers_due``, through the relay)."""
        if containment.base is None or not containment.joins_wait():
            return
        containment.warmer = warmer = JoinWarmer(containment.base).start()

        def on_timers_due(_sender: object, *, seconds: float, **_: Any) -> None:
            warmer.keep_warm_for(seconds)

        events.timers_due.connect(on_timers_due, sender=self.store, weak=False)
        self._on_timers_due = on_timers_due
        log.info("cgroup joins are kept warm whenever the daemon's timers come due")

    def _refuse_live_namesake(self) -> dict[str, Any] | None:
        """The registry row of an earlier worker of this name, refused if it still lives."""
        with self.store.read() as conn:
            row = get_worker(conn, self.opts.name)
        if row is None or row["stopped"] is not None:
            return row
        if row["host"] == self.host:
            if worker_alive(row, self.host) and row["pid"] != os.getpid():
                raise JobControlError(
                    f"worker {self.opts.name} is already running on this host (pid {row['pid']})"
                )
            return row
        lease = self.runqueue.lanes().lease_of(queues_of(row))
        now = self.clock.now()
        age = (now - row["heartbeat"]).total_seconds()
        if heard_of_lately(row, now, lease):
            raise JobControlError(
                f"worker {self.opts.name} is running on host {row['host']} (pid {row['pid']}, "
                f"last heartbeat {age:.0f}s ago): give this one another --name, or stop that one"
            )
        return row

    def _recover(
        self, instance: str, marker: dict[str, str], previous: dict[str, Any] | None
    ) -> None:
        """Kill what this worker's earlier process left on this host; record its runs lost."""
        assert self.containment is not None
        if previous is not None and previous["host"] != self.host:
            return  # another host's: their leases settle them
        with self.store.read() as conn:
            held = [r for r in queries.active_runs(conn) if r.worker == self.opts.name]
        local_recovery.kill_leftovers(
            instance,
            [r.id for r in held],
            [],
            kill_grace=self.opts.kill_grace,
            containment=self.containment,
            marker=marker,
        )
        now = self.clock.now()
        for run in held:
            reason = f"lost: its worker {self.opts.name} restarted; what it ran was killed"
            values = lost_end(run, reason, now)
            if self.runqueue.finish(run.id, self.opts.name, values, 5).recorded:
                log.warning("task run %s (%s) %s", run.id, run.job_name, values["reason"])
                events.task_finished.send(self.store, run_id=run.id)

    def stop(self, *, kill_running: bool = False, timeout: float = 3600.0) -> None:
        if self.hang_watch is not None:
            self.hang_watch.stop()
        try:
            if self.worker is not None:
                if kill_running:
                    self.worker.kill_all("killed: its worker was stopped")
                self.worker.stop(timeout)
            if self.relay is not None:
                self.relay.stop()  # after the worker: its last ends are announced
            if self._on_timers_due is not None:
                events.timers_due.disconnect(self._on_timers_due, sender=self.store)
            if self.containment is not None:
                self.containment.close()  # its warmer too
        finally:
            if self._drain is not None:
                self._drain.cancel()
            self.pid_file.release()
            self.store.dispose()

    def on_signal(self, signum: int) -> None:
        """SIGTERM: a warm stop; SIGINT, or a second signal: kill the runs in hand too.
        Called in the ``jc-signals`` thread (``StopSignals``), never in signal context."""
        if self.stop_requested.is_set() or signum == signal.SIGINT:
            self.kill_requested.set()
            if self.worker is not None:
                self.worker.kill_all("killed: its worker was stopped")
        elif self.opts.drain_timeout is not None and self._drain is None:
            self._drain = threading.Timer(self.opts.drain_timeout, self._drain_over)
            self._drain.name, self._drain.daemon = "jc-drain", True
            self._drain.start()
        if not self._serving.is_set() and self.worker is not None:
            # Still starting, waiting out a database outage to join the registry: a stop
            # ends that wait (nothing claimed yet), instead of waiting for the database.
            self.worker.give_up_retrying()
        self.stop_requested.set()

    def _drain_over(self) -> None:
        """The drain timeout ran out: the runs still in hand are killed and recorded."""
        self.kill_requested.set()
        if self.worker is None:
            return
        why = f"killed: its worker's stop outlasted --drain-timeout {self.opts.drain_timeout:g}s"
        killed = self.worker.kill_all(why)
        if killed:
            log.warning("worker %s: %s run(s) still in hand: %s", self.opts.name, killed, why)

    def run_forever(self) -> None:
        """Foreground: start, tell systemd (or ``worker start``), serve until SIGTERM."""
        StopSignals(self.on_signal).install()
        serve(
            self.start,
            lambda: self.stop(kill_running=self.kill_requested.is_set()),
            self.stop_requested,
            f"worker {self.opts.name} stopping: no new claims; the runs in hand end first",
            cpu_pin=self.opts.cpu_pin,
        )
