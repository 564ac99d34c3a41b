"""A worker: claims task runs from the run queue, runs their processes, records their ends.

It talks to nothing but the store's run-queue interface (``RunQueue``): claim
(compare-and-set, one run per free slot), record the pid, heartbeat (renews the
lease of every run it holds and hears of kill requests), finish (compare-and-set
from running under this worker, in its own transaction). The outcome is never
held only in memory for longer than the database is away: a finish that meets
an outage is retried until the database answers.

Its slots are split into slot groups (``slotgroups``; no groups: one group
``*`` of all its slots). Each group has a workloop of its own: it claims with
the group's queue list and never more runs than the group has free slots, hands
them to the group's slot threads, and, when a claim finds nothing, backs off on
its own (``BACKOFF_MIN`` doubling to ``BACKOFF_MAX``; while pushes cannot
reach it, it polls at its lanes' poll interval instead). A run stays with the
group that claimed it; its end resumes that group alone.

Wake-ups are hints, never the only way work is found: ``runs_queued`` and
``kill_requested`` signals from the same process (the embedded worker of the
daemon), ``wake()`` for any other news of work (every group with free slots
claims at once, whatever its back-off), and each group's back-off poll and the
heartbeat for everything else.

It follows the lane table (the poll interval, the lease and the caps of the lanes
it serves) without a restart: it re-reads it when told that it changed
(``lanes_changed`` from its own process, ``lane_rows_written`` from the database
on PostgreSQL, where a trigger announces every write to the table, whoever made
it) and, as a back-up, every poll interval, or only every heartbeat while such
announcements reach it (``lane_pushes``: its relay listens). On SQLite, where a
change made by another process is announced by no one, the kernel says when a file of
the database was written (``ChangeWatch``): an idle worker then sleeps from one
heartbeat to the next instead of waking every poll interval to find nothing new.
Where it hears of what others do (that watch; on PostgreSQL a relay that listens) its
idle groups, too, look for work only at news (``_quiet``), not at every back-off.
"""

from __future__ import annotations

import contextlib
import logging
import os
import select
import signal as signals
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO

from jobcontrol import cgroups, events, filemodes, procs
from jobcontrol.cgroups import Containment, RunCgroup
from jobcontrol.clock import Clock
from jobcontrol.errors import StoreUnavailable
from jobcontrol.filemodes import LogAccess
from jobcontrol.model import (
    DB_LOG,
    KILLED_STATUS,
    LOG_STORES,
    TIMEOUT_STATUS,
    RunRecord,
    RunState,
    embedded_worker_name,
)
from jobcontrol.outage import Backoff, Outage
from jobcontrol.slotgroups import WILDCARD, SlotGroup, every_queue
from jobcontrol.store.changewatch import ChangeWatch
from jobcontrol.store.lanes import DEFAULT_POLL_S, Lanes
from jobcontrol.store.runqueue import (
    DEFAULT_LEASE,
    Finished,
    RunQueue,
    ThenClaim,
    WorkerInfo,
    groups_json,
)
from jobcontrol.taskenv import PassEnv
from jobcontrol.worker import dblog, keptends
from jobcontrol.worker.dblog import DatabaseLog, StoredLog

log = logging.getLogger(__name__)

# A claim waits for a beat once none went through for this many beats (half a lease)
# while the worker holds a run claimed before then (``Worker._unvouched``).
VOUCH_BEATS = 1.5

# A task still running after this long gets its pid recorded at once; a shorter
# one records it with its outcome, saving a write on the path between tasks.
PID_RECORD_DELAY = 0.05
STOP_PATIENCE_S = 10.0  # a stop's wait for a database that does not answer (keptends)
# A group's back-off on empty claims (the slot-group design): from BACKOFF_MIN doubling
# to BACKOFF_MAX seconds; the poll interval of the lanes it serves, when larger, is the
# least. While work-available pushes cannot reach the worker (its relay does not listen),
# it polls at its lanes' poll interval (the smallest) without backing off: a push lost
# then costs at most one poll interval. A worker given a fixed poll_interval (tests,
# benchmarks) backs off from that, doubling up to POLL_BACKOFF of them (at most BACKOFF_MAX).
BACKOFF_MIN, BACKOFF_MAX = 1.0, 10.0
POLL_BACKOFF = 5
# A worker with no run in hand renews no lease: it beats only to say it lives, every
# IDLE_BEAT_S (stated in its registry row, ``beat_s``, and judged by it). Where it hears
# of what others do (a watched SQLite database, ``ChangeWatch``; on PostgreSQL a relay
# that listens) its groups then look for work only at news (the database written by
# someone else, a notification from another process, a task's end, a run its beat saw
# queued), or at the latest every QUIET_LOOK_S: an idle daemon wakes once a minute
# instead of six times (bench/README.md, fifteenth and sixteenth rounds).
IDLE_BEAT_S = 60.0
QUIET_LOOK_S = 600.0
NEWS_SETTLE_S = 0.05  # news this young is not answered by a look (``_news_answered``)
# The exit status of a task that could not be started (its log, its command, its cwd).
NOT_STARTED = 127


@dataclass(frozen=True)
class TaskOutcome:
    """How a task run ended, as its run row will say."""

    exit_status: int
    state: RunState
    signal: int | None
    reason: str | None
    cpu_us: int | None = None  # from the run's cgroup, when it had one
    mem_peak_bytes: int | None = None


@dataclass(eq=False)
class _Group:
    """One slot group's state; guarded by the worker's condition."""

    spec: SlotGroup
    index: int
    runs: set[int] = field(default_factory=set)  # the runs it holds, claimed to recorded
    reserved: int = 0  # slots a claim in flight may fill
    ready: deque[RunRecord] = field(default_factory=deque)  # claimed, for its slot threads
    offers: deque[int] | None = None  # announced run ids: only a group of every queue
    kicked: bool = False  # work may be available: claim now, whatever the back-off
    low: float = BACKOFF_MIN
    high: float = BACKOFF_MAX
    delay: float = BACKOFF_MIN  # the wait after the next empty claim
    next_poll: float = 0.0  # when the back-off lets it look again (the worker's monotonic)
    poll: float = BACKOFF_MIN  # its lanes' poll interval: its wait while pushes are cut
    looked: float = 0.0  # when it last looked (the worker's monotonic)
    news_seen: int = 0  # the worker's news count at that look (``Worker._quiet``)
    waits_quiet: bool = False  # its workloop waits past its back-off for news
    looks: int = 0  # claims and polls so far (what the tests watch)
    empty: int = 0  # of which found nothing
    # Its slot threads wait on this one, on the worker's lock: a claim wakes as many as
    # it made ready, not every thread of the worker (``Worker._cond``).
    work: threading.Condition = field(default_factory=threading.Condition)

    @property
    def free(self) -> int:
        return self.spec.slots - len(self.runs) - self.reserved

    @property
    def claim_queues(self) -> list[str] | None:
        """What its claims say: None for ``*`` alone (every queue, as before groups)."""
        return None if self.spec.queues == (WILDCARD,) else list(self.spec.queues)


@dataclass(frozen=True)
class GroupView:
    """A slot group as the worker sees it now (``Worker.groups``)."""

    key: str
    slots: int
    used: int
    looks: int
    empty: int
    delay: float
    runs: tuple[int, ...]
    next_poll: float = 0.0  # when its back-off lets it look again (the worker's monotonic)
    quiet: bool = False  # it looks again only at news (``Worker._quiet``)


class _Bell:
    """A ``threading.Event`` whose one waiter can wait for a file descriptor as well."""

    def __init__(self) -> None:
        self._set = False
        self._fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)

    def set(self) -> None:
        self._set = True
        os.eventfd_write(self._fd, 1)

    def is_set(self) -> bool:
        return self._set

    def clear(self) -> None:
        self._set = False

    def wait(self, timeout: float, also: int | None = None) -> bool:
        """Until set or ``timeout``; or until ``also`` is readable: whether it is."""
        if self._set:
            return False
        fds = [self._fd] if also is None else [self._fd, also]
        ready = select.select(fds, [], [], timeout)[0]
        if self._fd in ready:
            try:
                os.eventfd_read(self._fd)
            except BlockingIOError:
                pass
        return also is not None and also in ready

    def __del__(self) -> None:
        os.close(self._fd)


@dataclass
class _Active:
    run: RunRecord
    proc: subprocess.Popen[bytes] | None = None
    kill_reason: str | None = None
    pid: int | None = None
    finishing: bool = False
    cgroup: RunCgroup | None = None
    # The run before this one in its sequence, whose end (committed with this run's
    # claim) is announced once this run's process started: see ``_announce``.
    announce: int | None = None
    # That run's cgroup, removed then too: off the path from one task to the next.
    spent: RunCgroup | None = None
    # When its process ended (or it was given up unstarted): the run's recorded end,
    # stamped before its output is stored, so an outage that holds the upload back does
    # not lengthen the run's duration.
    ended: datetime | None = None
    # The thread killing its processes (a kill asked while it ran): the end is recorded
    # once it is done, not when the task's shell died of the first signal.
    killer: threading.Thread | None = None
    # When it was claimed (the worker's monotonic): its lease was renewed then, and at
    # each beat since (``_unvouched``).
    since: float = 0.0


class Worker:
    """Slot groups of threads, each thread running one task run at a time.

    ``groups``: the slot groups (``slotgroups.parse``); without them, one group of
    ``slots`` serving ``queues`` (None: every queue), which is the single pool of old.
    ``monotonic``: the clock of the groups' back-off (tests inject one).
    """

    def __init__(
        self,
        runqueue: RunQueue,
        *,
        clock: Clock,
        log_root: Path,
        instance_id: str,
        name: str | None = None,
        slots: int = 8,
        queues: list[str] | None = None,
        groups: list[SlotGroup] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        default_max_log_files: int = 5,
        kill_grace: float = 5.0,
        poll_interval: float | None = None,
        heartbeat_interval: float | None = None,
        idle_heartbeat: float | None = None,
        version: str = "",
        pass_env: PassEnv | None = None,
        log_access: LogAccess | None = None,
        containment: Containment | None = None,
        task_open_files: int | None = None,
        marker: dict[str, str] | None = None,
        log_store: str = "file",
        spool_dir: Path | None = None,
        pushes: Callable[[], bool] | None = None,
        lane_pushes: Callable[[], bool] | None = None,
        watch: bool = True,
    ) -> None:
        """``marker``: variables each task gets besides the database's instance marker,
        so that what one worker left is told from another's on the same host (a remote
        worker's ``JOBCONTROL_WORKER``).
        ``log_store``: ``file`` (a log file per run under ``log_root``) or ``database``
        (streamed into ``run_log`` by way of a private spool file per run in ``spool_dir``,
        default ``log_root/spool``, kept only until it is stored).
        ``pushes``: whether work-available pushes from other processes reach it now (its
        relay listens); while they do not, its groups poll without backing off. None: no
        relay (SQLite: every push is in-process).
        ``idle_heartbeat``: its beat while it holds no run (default ``IDLE_BEAT_S``, or the
        ``heartbeat_interval`` given; never less than the busy beat).
        ``lane_pushes``: whether every write to the lane table is announced to it now (a
        relay that listens, on PostgreSQL); while it is, the table is re-read when
        announced and only every heartbeat besides, not every poll interval. None: never
        (SQLite: a change made outside this process is found by the database's
        ``ChangeWatch``, or, where there is none, by polling).
        ``watch``: False: no ``ChangeWatch`` even on SQLite (its groups back off and its
        lanes are polled, as where inotify cannot be had)."""
        if log_store not in LOG_STORES:
            raise ValueError(f"log_store {log_store!r}: not one of {', '.join(LOG_STORES)}")
        self.log_store = log_store
        self.spool_dir = spool_dir or log_root / "spool"
        # The last problem with a task's output (a spool that could not be written, bytes
        # lost, an upload that gave up) and how many runs had one: part of the worker's health.
        self.log_problem: str | None = None
        self.log_problems = 0
        self.runqueue = runqueue
        self.store = runqueue.store
        self.clock = clock
        self.log_root = log_root
        self._log_root = str(log_root)
        self.instance_id = instance_id
        self._marker_extra = dict(marker or {})
        self.host = socket.gethostname()
        self.name = name or embedded_worker_name(self.host, os.getpid())
        if groups is None:
            groups = [SlotGroup(tuple(queues), slots)] if queues else every_queue(slots)
        # One lock guards the worker's state. Its workloops, its heartbeat when stopping
        # and ``wait_for`` wait on ``_cond``; each group's slot threads on the group's
        # ``work``.
        lock = threading.RLock()
        self._cond = threading.Condition(lock)
        self._groups = [
            _Group(
                g,
                i,
                offers=deque() if g.queues == (WILDCARD,) else None,
                work=threading.Condition(lock),
            )
            for i, g in enumerate(groups)
        ]
        self.slot_groups = list(groups)
        self.slots = sum(g.slots for g in groups)
        # The queues it serves, for the lanes it follows: None once a group takes any.
        self.queues: list[str] | None = (
            None
            if any(g.preference for g in groups)
            else list(dict.fromkeys(q for g in groups for q in g.queues))
        )
        self._mono = monotonic
        self._pushes = pushes
        self._lane_pushes = lane_pushes
        self._may_watch = watch
        self.default_max_log_files = default_max_log_files
        self.kill_grace = kill_grace
        # None: the lanes it serves decide (their smallest poll_interval_s, their leases'
        # third), re-read at each back-up poll, so a lane change needs no restart.
        self._fixed_poll = poll_interval
        self._fixed_beat = heartbeat_interval
        self._fixed_idle = idle_heartbeat
        self._lanes_seen: tuple[Any, ...] | None = None
        self._lanes_mark: Hashable | None = None  # the database when the lanes were read
        self._capped = False  # whether a lane it serves has max_slots (a count may free up)
        self._announced = 0  # news of work so far: runs queued, wakes (``_taken_with_end``)
        self._follow_lanes(None)
        self._stated_beat = self.heartbeat_interval  # what its last beat said (``beat_s``)
        self._beating_idle = False  # its last beat was an idle one: a claim hurries the next
        self._busy_news = False  # runs claimed since: the heartbeat thread beats sooner
        self._lanes_told = False  # a lane change announced: the heartbeat thread re-reads
        # News that work may be waiting (the database written by someone else, another
        # process's notification, a task's end, a run seen queued), counted: a group that
        # saw every news at its last look is quiet.
        self._news = 1
        self._news_at = 0.0  # when the last news came (``_news_answered``)
        self._hearing = False  # whether it heard others at its last beat (``_hears_others``)
        self.version = version
        self.outage = Outage(f"worker {self.name}")
        self.outage.watch(self._on_outage_changed)
        self._follow_groups(None)
        self._reported: str | None = None
        self._stopping = False
        self._watching = 0  # threads in ``wait_for``, which re-read at every change
        self._stop = threading.Event()
        # Set when the heartbeat thread has news (a lane change announced, runs claimed
        # while it beat as idle, a stop): what it sleeps on, with the database's watch.
        self._bell = _Bell()
        self._watch: ChangeWatch | None = None
        self.lane_looks = 0  # looks at the lane table so far (what the tests watch)
        self.beats = 0  # heartbeats recorded so far
        self._beat_tries = 0  # heartbeats tried so far, recorded or not
        self._beat_asked = False  # a beat wanted now, before any claim (``_vouch``)
        # When a beat last went through (the worker's monotonic): the leases of the runs
        # it held then were renewed.
        self._vouched_at = monotonic()
        self._heartbeat_ident: int | None = None
        self._threads: list[threading.Thread] = []
        self._active: dict[int, _Active] = {}
        self._kill_first: dict[int, str] = {}
        self._strays: set[int] = set()  # runs held in the database, unknown here (a beat)
        self._log_dirs: set[str] = set()
        self._log_root_shared = False
        # Read once: os.environ decodes every variable on each read. Only the pass-through
        # list reaches a task, never the daemon's own secrets (taskenv).
        self._base_env = (pass_env or PassEnv()).select(os.environ)
        self.log_access = log_access or LogAccess()
        # Each run in a cgroup of its own where the daemon set that up (cgroups.py).
        self.containment = containment or Containment.fallback("not set up for this worker")
        # The soft open-files limit each task's shell sets first (a builtin: no extra exec):
        # the one the daemon had before it raised its own for the API (None: leave it).
        self._limits = "" if task_open_files is None else f"ulimit -S -n {int(task_open_files)}; "
        self._receivers: list[tuple[Any, Any]] = []
        self._give_up_at: float | None = None

    # ---------------------------------------------------------- control

    def info(self) -> WorkerInfo:
        pid = os.getpid()
        return WorkerInfo(
            name=self.name,
            host=self.host,
            pid=pid,
            slots=self.slots,
            version=self.version,
            started=self.clock.now(),
            queues=self.queues,
            proc_start=procs.start_time(pid),
            containment=self.containment.describe(),
            groups=self.slot_groups,
        )

    def groups(self) -> list[GroupView]:
        """Each slot group now: its slots in use, its looks for work, its back-off."""
        with self._cond:
            return [
                GroupView(
                    g.spec.key,
                    g.spec.slots,
                    len(g.runs),
                    g.looks,
                    g.empty,
                    g.delay,
                    tuple(sorted(g.runs)),
                    g.next_poll,
                    self._quiet(g),
                )
                for g in self._groups
            ]

    def wait_for(self, what: str, predicate: Callable[[], bool], timeout: float = 10.0) -> None:
        """Wait until ``predicate()`` (read under the worker's lock, re-read whenever a
        group's state changes) holds, or fail naming ``what`` after ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            self._watching += 1
            try:
                while not predicate():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"worker {self.name}: waited {timeout:g}s for {what}")
                    self._cond.wait(left)
            finally:
                self._watching -= 1

    def poke(self) -> None:
        """Let every workloop look at its clock again (after a test moved it)."""
        with self._cond:
            self._cond.notify_all()

    def _follow_lanes(self, lanes: Lanes | None) -> bool:
        """Take the poll interval, heartbeat and caps from ``lanes``; whether they changed."""
        served = lanes.served(self.queues) if lanes is not None else []
        self.poll_interval = self._fixed_poll or min(
            (x.poll_interval_s for x in served), default=DEFAULT_POLL_S
        )
        lease = (self.runqueue.lease or DEFAULT_LEASE).total_seconds()
        if self.runqueue.lease is None and lanes is not None:
            lease = min(lease, lanes.lease_of(self.queues))
        self.heartbeat_interval = self._fixed_beat or lease / 3
        self._capped = any(x.max_slots is not None for x in served)
        seen = lanes.signature() if lanes is not None else None
        changed = seen != self._lanes_seen
        self._lanes_seen = seen
        if changed and lanes is not None:
            self._follow_groups(lanes)
        return changed

    def _follow_groups(self, lanes: Lanes | None) -> None:
        """Each group's back-off bounds from the lanes it serves; a change (a lane
        resumed, given room or a new poll) lets every group look again at once."""
        with self._cond:
            for g in self._groups:
                if self._fixed_poll is not None:
                    low = poll = self._fixed_poll
                    high = max(low, min(BACKOFF_MAX, low * POLL_BACKOFF))
                else:
                    served = (
                        lanes.served(g.claim_queues if not g.spec.preference else None)
                        if lanes
                        else []
                    )
                    poll = min((x.poll_interval_s for x in served), default=DEFAULT_POLL_S)
                    low = max(BACKOFF_MIN, poll)
                    high = max(BACKOFF_MAX, low)
                g.low, g.high, g.delay, g.poll = low, high, low, poll
                g.next_poll = self._mono()
            self._news += 1  # quiet groups too
            self._cond.notify_all()

    def _reread_lanes(self, *, unless_unwritten: bool = False) -> bool:
        """The lane table again; whether a rule it follows changed. ``unless_unwritten``
        (a back-up poll): not when nothing was written to the database since the last
        read (SQLite: an idle daemon compares two integers instead of reading a table)."""
        mark = self._lanes_mark if unless_unwritten else None  # None: read whatever
        try:
            lanes, self._lanes_mark = self.runqueue.lanes_if_written(mark)
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            return False
        changed = lanes is not None and self._follow_lanes(lanes)
        with self._cond:
            self.lane_looks += 1
            if self._watching:
                self._cond.notify_all()
        return changed

    def start(self) -> None:
        for problem in self.log_access.make_root(self.log_root):
            log.warning("a job log directory is not the worker's, and not used: %s", problem)
        # Where other users may write to the log root, a job's directory is checked again
        # before each log is opened in it, not once (``_open_log``).
        self._log_root_shared = _open_to_others(self.log_root)
        if self.log_store == "database":
            filemodes.make_dir(self.spool_dir)  # 0700: the spool is the worker's alone
        self._reread_lanes()
        self._watch = self._watch_database()
        self._hearing = self._hears_others()
        # Ends an earlier life of it kept on disk (a stop during an outage), before it
        # joins: recorded by the daemon already, before its recovery (``Runtime.start``).
        kept = self._retry("record the ends kept on disk", self.record_kept_ends)
        if kept is None:
            return
        joined = self._retry("join the worker registry", self._join)
        if joined is None:
            return  # stopped while it waited for the database: nothing claimed, nothing to run
        if self.log_store == "database":
            self._store_leftovers()
        self._warn_of_unknown_queues()
        for signal, receiver in (
            (events.runs_queued, self._on_queued),
            (events.kill_requested, self._on_kill_requested),
            (events.lanes_changed, self._on_lanes_changed),
            (events.lane_rows_written, self._on_lanes_changed),
            (events.task_finished, self._on_task_finished),
        ):
            signal.connect(receiver, sender=self.store, weak=False)
            self._receivers.append((signal, receiver))
        for g in self._groups:
            self._spawn_thread(lambda g=g: self._workloop(g), f"jc-group-{g.index}")
            for i in range(g.spec.slots):
                self._spawn_thread(lambda g=g: self._slot_loop(g), f"jc-slot-{g.index}-{i}")
        self._spawn_thread(self._heartbeat_loop, "jc-heartbeat")

    def _warn_of_unknown_queues(self) -> None:
        """Said once, at the start: a queue of its slot groups that no lane is named after
        and no job runs in. Not refused: its jobs may be loaded later."""
        named = [q for g in self._groups for q in g.spec.queues]
        try:
            unknown = self.runqueue.unknown_queues(named)
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            return
        for queue in unknown:
            log.warning(
                "worker %s: no lane is named %r and no job runs in that queue (mistyped?): "
                "its slots take nothing until a job of queue %r runs",
                self.name,
                queue,
                queue,
            )

    def record_kept_ends(self) -> list[int]:
        """Record the ends kept in the spool directory (``keptends``), and announce them
        to the dispatcher as any end; the runs recorded."""
        recorded = keptends.record(self.runqueue, self.spool_dir)
        for run_id in recorded:
            events.task_finished.send(self.store, run_id=run_id)
        return recorded

    def _join(self) -> bool:
        self.runqueue.register(self.info(), self.clock.now())
        return True

    def _store_leftovers(self) -> None:
        """Output an earlier life of this worker spooled but could not store (it stopped
        during an outage): stored now, before new work, and its spool deleted."""
        for path in sorted(self.spool_dir.iterdir()):
            if path.name == keptends.FILE:
                continue  # ends of another database's daemon (``record_kept_ends``)
            if dblog.spool_run_id(path) is None:
                log.warning(
                    "worker %s: %s is not a spool file of a run: left as it is", self.name, path
                )
                continue
            added = self._retry(
                f"store the output kept in {path}",
                lambda p=path: dblog.store_leftover(self.store, p, self.clock.now),
            )
            log.info("worker %s: stored %s bytes of output kept in %s", self.name, added, path)

    def _spawn_thread(self, target: Any, name: str) -> None:
        def run() -> None:
            with self.store.pinned():
                target()

        t = threading.Thread(target=run, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def stop_claiming(self) -> None:
        """Claim nothing more (not even a sequence's next task with an end): the runs in
        hand go on, and can be killed; ``stop`` follows."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            for g in self._groups:
                g.work.notify_all()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop claiming, let the runs in hand end (the caller kills them first if it must)."""
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()
        self.stop_claiming()
        # An outcome is worth waiting for through an outage, but not for long: one the
        # database did not take by then is kept on disk, recorded at the next start.
        self._give_up_at = time.monotonic() + min(timeout, STOP_PATIENCE_S)
        for t in self._threads:
            if t.name != "jc-heartbeat":
                t.join(timeout)
        self._stop.set()  # the heartbeat renews leases until the last run is recorded
        self._bell.set()
        down = self.outage.down  # its heartbeat may be inside a statement waiting for it
        for t in self._threads:
            t.join(min(timeout, 0.5) if down else timeout)
        if self._watch is not None and not any(t.is_alive() for t in self._threads):
            self._watch.close()  # (a heartbeat thread still waiting on it keeps it)
        self._threads.clear()
        self.containment.close()
        if down:
            log.warning(
                "worker %s could not record that it stopped (the database does not answer): "
                "its registry row keeps its last heartbeat, and a daemon's start on its host "
                "marks it stopped",
                self.name,
            )
            return
        try:
            self.runqueue.deregister(self.name, self.clock.now())
        except StoreUnavailable as exc:
            log.warning("worker %s could not record that it stopped: %s", self.name, exc)

    def give_up_retrying(self) -> None:
        """Stop waiting for the database in ``start`` (a stop came while it waited)."""
        self._give_up_at = time.monotonic()

    def kill_all(self, reason: str) -> int:
        """Kill every run in hand (daemon shutdown with --kill); how many there were."""
        with self._cond:
            run_ids = list(self._active)
        for run_id in run_ids:
            self.kill(run_id, reason)
        return len(run_ids)

    # ---------------------------------------------------------- wake-ups

    def _on_queued(self, _sender: object, run_ids: list[int], **_: Any) -> None:
        if not run_ids:  # announced without ids (another process, after a gap): look
            self.wake()
            return
        with self._cond:
            self._announced += 1  # an end's claim under way may have missed them
            offered = False
            for g in self._groups:
                if g.offers is not None and not offered:
                    g.offers.extend(run_ids)  # claimed by id: the one-statement path
                    offered = True
                elif g.free > 0:
                    g.kicked = True
            self._cond.notify_all()

    def _on_kill_requested(
        self, _sender: object, run_id: int, reason: str, relayed: bool = False, **_: Any
    ) -> None:
        if relayed:
            # Another process's request reaches every worker: only the holder acts on it
            # (a run claimed but not yet in hand hears of it at its next heartbeat).
            with self._cond:
                if run_id not in self._active:
                    return
        self.kill(run_id, reason)

    def _on_task_finished(self, _sender: object, **_: Any) -> None:
        # A run ended, its own or (relayed) another process's: room in a capped lane, a
        # sequence's next task left queued for another group.
        self._tell_groups(quiet_only=True)

    def _on_lanes_changed(self, _sender: object, **_: Any) -> None:
        self._lanes_told = True
        self._bell.set()  # its rules may have changed: the heartbeat thread re-reads them
        self.wake()  # a lane resumed or got room: its queued runs may be claimable now

    def wake(self) -> None:
        """Work may be available (runs not known, a lane changed, a NOTIFY): every group
        with free slots claims at once, whatever its back-off."""
        with self._cond:
            self._announced += 1  # an end's claim under way may have missed it
            for g in self._groups:
                if g.free > 0:
                    g.kicked = True
            self._cond.notify_all()

    def kill(self, run_id: int, reason: str = "killed") -> None:
        """Kill a run this worker holds (or is about to hold)."""
        with self._cond:
            active = self._active.get(run_id)
            if active is None:
                self._kill_first[run_id] = reason  # claimed but not yet in hand
                return
            if active.kill_reason is not None:
                return
            active.kill_reason = reason
            if active.proc is not None:
                self._start_killer(active)

    def _start_killer(self, active: _Active) -> None:
        proc = active.proc
        assert proc is not None

        active.killer = threading.Thread(
            target=self._kill_processes,
            args=(active, proc),
            name=f"jc-kill-{active.run.id}",
            daemon=True,
        )
        active.killer.start()

    def _kill_processes(self, active: _Active, proc: subprocess.Popen[bytes]) -> None:
        """TERM, grace, KILL: the process group, the marked processes and the run's cgroup;
        then ``cgroup.kill`` for whatever forked meanwhile."""
        cg = active.cgroup
        procs.kill_tree(
            proc.pid,
            marker=self._marker(active.run.id),
            grace=self.kill_grace,
            wait_exit=lambda t: _wait(proc, t),
            members=cg.pids if cg is not None else None,
        )
        if cg is not None:
            cg.kill()

    def _marker(self, run_id: int) -> dict[str, str]:
        return {
            "JOBCONTROL_RUN_ID": str(run_id),
            "JOBCONTROL_INSTANCE": self.instance_id,
            **self._marker_extra,
        }

    # ---------------------------------------------------------- heartbeat and back-up poll

    def _watch_database(self) -> ChangeWatch | None:
        """SQLite, with no announcements of lane writes: the kernel's word that the
        database was written, so that the lane table is looked at when it may have
        changed rather than every poll interval. None: poll (said once, with why)."""
        path = self.store.sqlite_file
        if path is None or self._lane_pushes is not None or not self._may_watch:
            return None
        try:
            return ChangeWatch(path)
        except OSError as exc:
            log.warning(
                "worker %s: cannot watch %s for changes (%s): the lane table is read "
                "every poll interval instead",
                self.name,
                path,
                exc,
            )
            return None

    def _lanes_every(self) -> float:
        """How often the lane table is re-read unasked: every poll interval, or only every
        heartbeat while each write to it is announced (``lane_pushes``) or the database
        is watched for writes (``ChangeWatch``)."""
        if self._watch is not None or (self._lane_pushes is not None and self._lane_pushes()):
            return max(self.poll_interval, self._stated_beat)
        return self.poll_interval

    def _idle_beat(self) -> float:
        """Its beat while it holds no run: no lease to renew, only its registry row."""
        idle = self._fixed_idle if self._fixed_idle is not None else self._fixed_beat
        return max(idle or IDLE_BEAT_S, self.heartbeat_interval)

    def _next_beat_in(self) -> float:
        """How long until the beat after the one about to be made: every third of a lease
        while it holds runs, ``_idle_beat`` while it holds none (a claim meanwhile brings
        the next beat forward: ``_busy_news``). Said in the beat (``beat_s``)."""
        with self._cond:
            # Strays (runs held in the database, unknown here) go back at the next beat.
            busy = bool(self._active or self._strays) or any(
                g.runs or g.reserved or g.ready for g in self._groups
            )
            self._beating_idle = not busy
        self._stated_beat = self.heartbeat_interval if busy else self._idle_beat()
        return self._stated_beat

    def _hurry_beat(self) -> None:
        """Runs were (or may have been) claimed since an idle beat: the next comes a busy
        beat after the last, to renew their leases. With the lock held."""
        if self._beating_idle:
            self._beating_idle = False
            self._busy_news = True
            self._bell.set()

    def _on_outage_changed(self) -> None:
        """An outage ended, met again by a claim, a finish or a read: a beat now, which
        learns of the runs settled meanwhile and kills them before any claim
        (``_vouch``). The beat's own end of an outage asks for none."""
        if self.outage.down or threading.get_ident() == self._heartbeat_ident:
            return
        with self._cond:
            self._ask_beat()

    def _ask_beat(self) -> None:
        """A beat now from the heartbeat thread, whatever its plan. With the lock held."""
        self._beat_asked = True
        self._bell.set()

    def _unvouched(self) -> bool:
        """Whether it holds a run whose lease may have run out: no beat went through for
        more than half a lease since it claimed that run (a cut link, an outage, a
        SIGSTOP). The dispatcher may have settled it meanwhile and run its tree on: its
        process is to be killed (``_beat``) before this worker claims more. With the
        lock held."""
        now = self._mono()
        if self._beat_lately(now):
            return False
        limit = VOUCH_BEATS * self.heartbeat_interval
        return any(now - a.since > limit for a in self._active.values() if not a.finishing)

    def _beat_lately(self, now: float) -> bool:
        """Whether a beat went through within half a lease (a lease is three beats)."""
        return now - self._vouched_at <= VOUCH_BEATS * self.heartbeat_interval

    def _vouch(self) -> bool:
        """A beat before a claim, while ``_unvouched``: asked of the heartbeat thread now
        and waited for (at most a beat). Whether claims may go on."""
        if self._beat_lately(self._mono()):
            return True  # the usual answer, without the lock
        with self._cond:
            if not self._unvouched():
                return True
            tries = self._beat_tries
            self._ask_beat()
            self._cond.wait_for(
                lambda: self._beat_tries > tries or self._stopping, self.heartbeat_interval
            )
            return not self._unvouched()

    def _heartbeat_loop(self) -> None:
        self._heartbeat_ident = threading.get_ident()
        next_beat = next_lanes = time.monotonic()
        beaten = looked = float("-inf")  # when it last beat, last looked at the lane table
        while True:
            stopping = self._stop.is_set()
            if self._bell.is_set():
                self._bell.clear()
            with self._cond:
                announced, self._lanes_told = self._lanes_told and not stopping, False
                hurried, self._busy_news = self._busy_news, False
                busy = not self._beating_idle
                asked, self._beat_asked = self._beat_asked, False
            if asked:
                next_beat = time.monotonic()  # a claim waits for it (``_vouch``)
            if hurried or busy:
                # Runs claimed since an idle beat, or runs held: their leases want the
                # busy beat, as the lanes say now (a lease shortened since the last beat,
                # a run claimed under it: the next beat comes sooner than was planned).
                next_beat = min(next_beat, beaten + self.heartbeat_interval)
            if time.monotonic() >= next_beat:
                if self._watch is not None:
                    self._written()  # what others wrote until now: news for quiet groups
                every = self._next_beat_in()
                self._beat(every)
                self._report_groups()
                beaten = time.monotonic()
                if self.outage.down:
                    # The database did not answer: try again a busy beat on, idle or not,
                    # so health says it answers again soon after it does.
                    every = min(every, self.heartbeat_interval)
                next_beat = beaten + every
                if self._watch is not None:
                    # Awake anyway: what was written until now (this beat's own write
                    # among it) is covered by a look at the lanes now.
                    self._written(own=True)
                    next_lanes = 0.0
                hearing = self._hears_others()
                if hearing != self._hearing:
                    # Its relay stopped listening (or listens again): quiet groups back
                    # off as they would unannounced, a beat at most after it happened.
                    self._hearing = hearing
                    self._tell_groups()
                if hearing:
                    next_lanes = 0.0  # due within a beat anyway: now, in the same wake-up
            if not stopping and (announced or time.monotonic() >= next_lanes):
                # The lanes when told, and as a back-up whatever the groups' back-off: a
                # change lets every group look again at once (``_follow_groups``).
                changed = self._reread_lanes(unless_unwritten=not announced)
                self._report_groups()
                looked = time.monotonic()
                next_lanes = looked + self._lanes_every()
                if changed:
                    continue  # its beat may be due sooner now: planned again at the top
            if self._stop.is_set():
                # Stopping: keep the leases of the runs still in hand until they are recorded.
                with self._cond:
                    if not self._active:
                        return
                    self._cond.wait(min(self.poll_interval, max(0.0, next_beat - time.monotonic())))
                continue
            next_lanes = self._sleep(next_beat, next_lanes, looked + self.poll_interval)

    def _sleep(self, next_beat: float, next_lanes: float, soonest: float) -> float:
        """Until the next beat or look at the lanes, news of a lane, or (``ChangeWatch``)
        a write to the database by anyone, which brings the look forward to ``soonest``
        (a busy daemon writes all the time: a look a poll interval at most). The time
        of the next look."""
        watch = self._watch
        timeout = max(0.0, min(next_beat, next_lanes) - time.monotonic())
        if watch is None or next_lanes <= soonest:
            self._bell.wait(timeout)  # a look comes as soon as one may anyway
            return next_lanes
        if not self._bell.wait(timeout, watch.fileno()) or not self._written():
            return next_lanes
        return max(time.monotonic(), soonest)

    def _written(self, *, own: bool = False) -> bool:
        """What the database's watch queued: whether it was written since the last call,
        news for quiet groups (``_quiet``) unless ``own`` (its beat's own write). A watch
        whose directory went is dropped, and the lanes are polled again."""
        watch = self._watch
        if watch is None:
            return False
        written = watch.changed()
        if written and not own:
            self._tell_groups()
        if watch.lost:
            log.warning(
                "worker %s: %s is no longer watched (the directory went): the lane table "
                "is read every poll interval instead",
                self.name,
                watch.directory,
            )
            watch.close()
            self._watch = None
            self._tell_groups()  # its groups back-off as they would unwatched
        return written

    def _tell_groups(self, *, quiet_only: bool = False) -> None:
        """The database was written, or a run is queued: quiet groups look again.
        ``quiet_only``: wake no workloop but those waiting past their back-off (a task's
        end, on the path from one task to the next)."""
        with self._cond:
            self._news += 1
            self._news_at = self._mono()
            if not quiet_only or any(g.waits_quiet for g in self._groups):
                self._cond.notify_all()

    def _hears_others(self) -> bool:
        """Whether what other processes do reaches it: the database is watched (SQLite),
        or its relay listens (PostgreSQL: every run queued, run ended and lane written
        elsewhere is a notification)."""
        if self._watch is not None:
            return True
        listens = self._pushes or self._lane_pushes
        return listens is not None and listens()

    def _quiet(self, g: _Group) -> bool:
        """Whether a look by ``g`` would find what its last found: it hears of what others
        do (``_hears_others``) and has heard nothing since that look: no write by anyone
        but this worker's beats (SQLite), no notification from another process
        (PostgreSQL), no task's end, no queued run seen by a beat. Then it looks only at
        news, or every QUIET_LOOK_S. With the lock held."""
        return self._fixed_poll is None and g.news_seen == self._news and self._hears_others()

    def _report_groups(self) -> None:
        """Which runs each group holds, in the registry, when that changed (``workers``)."""
        with self._cond:
            text = groups_json(self.slot_groups, [list(g.runs) for g in self._groups])
        if text == self._reported:
            return
        try:
            self.runqueue.report_groups(self.name, text)
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            return
        self._reported = text

    def _beat(self, every: float | None = None) -> None:
        self.containment.sweep()  # cgroups of ended runs, once what they left behind ended
        with self._cond:
            mine = [rid for rid, a in self._active.items() if not a.finishing]
        try:
            problems = (self.log_problems, self.log_problem) if self.log_problems else None
            beat = self.runqueue.heartbeat(
                self.name, self.clock.now(), mine, log_problems=problems, every=every
            )
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            with self._cond:
                self._beat_tries += 1
                self._cond.notify_all()  # a claim waiting for it (``_vouch``) gives up
            return
        self.outage.recovered()
        with self._cond:
            self.beats += 1
            if self._watching:
                self._cond.notify_all()
        if beat.queued:
            self._tell_groups()
        self._release_strays(beat.held)
        for run_id in beat.kill:
            self.kill(run_id, "killed")
        for run_id in beat.settled:
            with self._cond:
                active = self._active.get(run_id)
                if active is None or active.finishing:
                    continue
            log.warning(
                "task run %s was settled while worker %s could not vouch for it: killing it",
                run_id,
                self.name,
            )
            self.kill(run_id, "settled while its worker was away")
        with self._cond:
            # Vouched for what it holds, its settled runs being killed: claims may go on.
            self._vouched_at = self._mono()
            self._beat_tries += 1
            self._cond.notify_all()

    def _release_strays(self, held: list[int]) -> None:
        """Runs the database says this worker holds that it does not know of: claimed in
        a transaction whose answer the connection lost (the COMMIT went through). Left
        alone they would hold their trees forever, their leases renewed by every beat.
        One seen at two beats in a row (a claim just made is known within moments) goes
        back to the queue."""
        with self._cond:
            known = set(self._active).union(*(g.runs for g in self._groups))
            strays = set(held) - known
            again, self._strays = strays & self._strays, strays
            if strays:
                self._hurry_beat()  # the second sight of them is a busy beat away
        if not again:
            return
        try:
            released = self.runqueue.release_strays(self.name, sorted(again))
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            return
        self._strays -= set(released)
        if released:
            log.warning(
                "worker %s: task run(s) %s were claimed for it by a transaction whose answer "
                "was lost with its connection: put back in the queue",
                self.name,
                ", ".join(map(str, released)),
            )
            events.runs_queued.send(self.store, run_ids=released)

    # ---------------------------------------------------------- slot groups

    def _turn(self, g: _Group) -> tuple[str, int | None, int] | None:
        """What the group's workloop does next, once it has free slots: ``("offer", id,
        1)``, ``("claim", None, free)`` (work announced), ``("poll", None, 0)`` (its
        back-off ran out); None once the worker stops. Called with the lock held."""
        while not self._stopping:
            free = g.free
            if free > 0:
                if g.offers is not None and len(g.offers) == 1:
                    g.reserved += 1
                    return ("offer", g.offers.popleft(), 1)
                if g.offers or g.kicked:
                    # Several announced (many trees due together) are one claim of up
                    # to its free slots, most urgent first: a claim per offer, a
                    # transaction each in the order announced, capped a worker at ~350
                    # runs a second. The claim answers for all of them: those it leaves
                    # were taken elsewhere, or are still queued when it fills the group,
                    # whose next free slot claims again (``_slot_loop``).
                    if g.offers:
                        g.offers.clear()
                    g.kicked = False
                    g.reserved += free
                    return ("claim", None, free)
                now = self._mono()
                due = g.next_poll
                if self._pushes is not None and not self._pushes():
                    due = min(due, g.looked + g.poll)  # no push can come: no back-off
                elif self._quiet(g):
                    due = max(due, g.looked + QUIET_LOOK_S)
                wait = due - now
                if wait <= 0:
                    return ("poll", None, 0)
                g.waits_quiet = due > g.next_poll  # told of news (``_tell_groups``)
                # While pushes may stop (a relay), look at them once a poll interval.
                self._cond.wait(wait if self._pushes is None else min(wait, g.poll))
                g.waits_quiet = False
            else:
                self._cond.wait()  # at capacity: the end of one of its runs resumes it
        return None

    def _workloop(self, g: _Group) -> None:
        """One group's claims: its own queue list, never more than its free slots."""
        while True:
            with self._cond:
                turn = self._turn(g)
                if turn is None:
                    g.work.notify_all()  # its slot threads may stop once nothing is due
                    return
                news = self._news_answered()
            how, run_id, limit = turn
            if how == "poll":
                # The back-off ran out: a read first, so an idle group takes no write lock.
                found = self._look(g)
                with self._cond:
                    if not found:
                        self._backed_off(g, news, empty=True)
                        self._cond.notify_all()  # for ``wait_for``
                        continue
                    limit = g.free
                    if limit <= 0:
                        continue
                    g.reserved += limit
            claimed = self._claim(g, run_id, limit)
            with self._cond:
                g.reserved -= limit
                for run in claimed:
                    g.runs.add(run.id)
                    g.ready.append(run)
                if claimed:
                    self._hurry_beat()
                if g.offers and claimed and how != "offer":
                    # Announced while it claimed, and taken by it: not to claim again.
                    taken = {run.id for run in claimed}
                    g.offers = deque(i for i in g.offers if i not in taken)
                if how != "offer":
                    g.looks += how == "claim"
                    self._backed_off(g, news, empty=not claimed)
                if self._stopping:
                    g.work.notify_all()  # nothing reserved now: they may stop
                elif claimed:
                    g.work.notify(len(claimed))
                if self._watching:
                    self._cond.notify_all()

    def _look(self, g: _Group) -> bool:
        with self._cond:
            g.looks += 1
        try:
            found = self.runqueue.any_queued(g.claim_queues)
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            return False  # backs off; the database answers again some time
        self._read_went_through()
        return found

    def _read_went_through(self) -> None:
        """A call that only read went through. On PostgreSQL the database answers again;
        on SQLite reads pass while another process holds the write lock, so the outage
        ends only once a write can begin (tried at once, without waiting: the next beat,
        claim or finish tries again)."""
        if not self.outage.down:
            return
        if self.store.is_sqlite:
            try:
                with self.store.write(wait=False):
                    pass
            except StoreUnavailable:
                return
        self.outage.recovered()

    def _claim(self, g: _Group, run_id: int | None, limit: int) -> list[RunRecord]:
        if not self._vouch():
            return []  # backs off: the next look tries again, and its beat with it
        try:
            claimed = self.runqueue.claim(
                self.name,
                self.host,
                self.clock.now(),
                run_id=run_id,
                queues=g.claim_queues,
                limit=limit,
                clock=self.clock.now,
            )
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            # Its answer may be what was lost: the beats find runs it took (strays).
            with self._cond:
                self._hurry_beat()
            return []  # its back-off poll finds the work again once the database is back
        except Exception:
            log.exception("slot group %s: claiming a task run failed", g.spec.key)
            return []
        if claimed:
            self.outage.recovered()  # it wrote
        else:
            self._read_went_through()  # nothing queued: it may only have read
        return claimed

    def _news_answered(self) -> int:
        """The news a look that begins now answers for: news since is looked at again.
        Not news younger than ``NEWS_SETTLE_S``: inotify tells of a SQLite write to the
        WAL before the commit is visible to readers (the ``-shm`` index, written through
        a mapping just after); a writer preempted in between would leave a quiet group
        waiting for news that already came. With the lock held."""
        if self._mono() - self._news_at < NEWS_SETTLE_S:
            return self._news - 1
        return self._news

    def _backed_off(self, g: _Group, news: int, *, empty: bool) -> None:
        """After a look: an empty one doubles the group's wait, up to its most; one that
        found work sets it back to the least. ``news``: the worker's news count before
        the look began. News that came while it looked (a write whose commit the look's
        read may have preceded: inotify tells of a journal before its commit) is not
        covered by it: the group does not count as quiet. Called with the lock held."""
        now = self._mono()
        g.looked = now
        g.news_seen = news
        if empty:
            g.empty += 1
            g.next_poll = now + g.delay
            g.delay = min(g.delay * 2, g.high)
        else:
            g.delay = g.low
            g.next_poll = now + g.low

    def _slot_loop(self, g: _Group) -> None:
        """One slot of the group: runs what the group's workloop claimed, one at a time."""
        while True:
            with self._cond:
                while not g.ready and not (self._stopping and g.reserved == 0):
                    g.work.wait()
                if not g.ready:
                    return
                run: RunRecord | None = g.ready.popleft()
            announce: int | None = None
            spent: RunCgroup | None = None
            # The next run comes with this one's end: a sequence's next task, or, while the
            # group has work waiting, the next run of its queues (``ThenClaim``).
            while run is not None:
                ended = run.id
                try:
                    run, spent, looked = self._execute(run, g, announce, spent)
                except Exception:
                    # A fault of the worker's own (``_execute`` records every outcome of
                    # the task's): the slot goes on, and the run, whose lease it no longer
                    # renews, is settled by the dispatcher with the reason.
                    log.exception("task run %s: its end could not be recorded", ended)
                    run, spent, looked = None, None, False
                announce = None
                # A sequence's end is announced once its next task started (``_announce``):
                # the dispatcher's reaction then runs while the child does, not against
                # the worker's own steps to start it. On SQLite that was 1.75 -> 1.55 ms
                # per task. On PostgreSQL, with one run queued ahead, a reaction started
                # that late missed queueing the task after next for half of the ends;
                # with two ahead (``AHEAD``) it missed 0-4 of 1,000, and the process spent
                # about 7 % less CPU per task (bench/README.md, twentieth round).
                if run is not None:
                    announce = ended
                else:
                    events.task_finished.send(self.store, run_id=ended)
                with self._cond:
                    full = g.free <= 0
                    g.runs.discard(ended)
                    if run is not None:
                        g.runs.add(run.id)  # taken with the end: the same group's
                    elif (full and not looked) or self._capped:
                        # Resumed: it stopped claiming at capacity (or a capped lane of
                        # it may have room again): it claims now, the others do not.
                        # Not when the end's own claim just found its queues empty
                        # (``_taken_with_end`` kicks it for runs announced since).
                        g.kicked = True
                    # Woken only for what they wait on: the workloop when resumed (or
                    # at capacity no more: its wait becomes its back-off's), the threads
                    # of a worker that stops, ``wait_for``. Waking every thread at each
                    # task's end (each slot thread, to find nothing ready) cost about a
                    # tenth of the worker's CPU per task of a sequence.
                    if g.kicked or full or self._stopping or self._watching:
                        self._cond.notify_all()

    def _execute(
        self, run: RunRecord, g: _Group, announce: int | None, spent: RunCgroup | None
    ) -> tuple[RunRecord | None, RunCgroup | None, bool]:
        """Run one task run to its recorded end; the run claimed with that end, if any,
        this run's cgroup for that run to remove once it started, and whether the end
        looked for the group's next run (found or not: ``Finished.looked``).

        ``announce``, ``spent``: the run before this one in its sequence, whose end is
        announced and whose cgroup is removed once this one started (``_announce``).
        """
        active = _Active(run, announce=announce, spent=spent, since=self._mono())
        with self._cond:
            self._active[run.id] = active
            active.kill_reason = self._kill_first.pop(run.id, None)
        outcome: TaskOutcome | None = None
        log_path: str | None = None
        sink: DatabaseLog | None = None
        stored: StoredLog | None = None
        started = run.started or self.clock.now()
        try:
            if active.kill_reason is not None:
                outcome = TaskOutcome(KILLED_STATUS, RunState.KILLED, None, active.kill_reason)
            elif self.log_store == "database":
                sink = self._open_spool(run)
                if sink is None:
                    outcome = TaskOutcome(
                        NOT_STARTED, RunState.FAILED, None, f"log spool: {self.log_problem}"
                    )
                else:
                    outcome = self._spawn_and_wait(active, str(sink.spool_path), sink)
            else:
                log_path = self._log_path(run, started)
                outcome = self._spawn_and_wait(active, log_path)
        except Exception as exc:
            log.exception("task run %s (%s) failed to run", run.id, run.job_name)
            outcome = TaskOutcome(1, RunState.FAILED, None, f"could not run: {exc}")
        finally:
            self._announce(active)  # not started (killed first, no log, an error)
            # Always record the outcome, whatever happened above.
            if outcome is None:
                outcome = TaskOutcome(1, RunState.FAILED, None, "worker error")
            if active.ended is None:  # not started: stamped now
                active.ended = self.clock.now()
            try:
                if sink is not None:  # all of the output stored before the end is recorded
                    stored = sink.close()
            finally:
                try:
                    following, looked = self._finish(active, outcome, started, log_path, g, stored)
                except BaseException:
                    if active.cgroup is not None:  # the end was not recorded: no next task
                        self.containment.release(active.cgroup)
                    with self._cond:  # its lease lapses: the dispatcher settles the run
                        self._active.pop(run.id, None)
                    raise
        cg, active.cgroup = active.cgroup, None
        if cg is not None and following is None:
            self.containment.release(cg)
            cg = None
        return following, cg, looked

    def _open_spool(self, run: RunRecord) -> DatabaseLog | None:
        """The run's output on its way to the database; None (and the problem noted)
        when its spool file cannot be made: a task never runs blind."""
        path = self.spool_dir / f"run{run.id}.out"
        try:
            return DatabaseLog(
                self.store,
                run.id,
                path,
                now=self.clock.now,
                outage=self.outage,
                give_up=self._past_hope,
            )
        except OSError as exc:
            log.warning(
                "task run %s (%s) not started: spool %s: %s", run.id, run.job_name, path, exc
            )
            self._log_trouble(f"{path}: {exc.strerror or exc}")
            return None

    def _past_hope(self) -> bool:
        give_up = self._give_up_at
        return give_up is not None and time.monotonic() > give_up

    def _log_trouble(self, problem: str) -> None:
        with self._cond:
            self.log_problem = problem
            self.log_problems += 1

    def _spawn_and_wait(
        self, active: _Active, log_path: str, sink: DatabaseLog | None = None
    ) -> TaskOutcome:
        """Run the task with its output to ``log_path``, or to ``sink`` (then ``log_path``
        is the sink's spool, which only the worker writes)."""
        run = active.run
        env = self._base_env.copy()
        env.update(run.env)
        env.pop("JOBCONTROL_WORKER", None)  # the marker's, or absent (the embedded worker)
        env.update(self._marker(run.id))
        env["JOBCONTROL_JOB"] = run.job_name
        env["JOBCONTROL_JOB_ID"] = str(run.job_id)
        env["JOBCONTROL_LOG"] = DB_LOG if sink is not None else log_path
        try:
            out = sink.out if sink is not None else self._open_log(log_path)
        except OSError as exc:  # no log, no run: a task never runs blind (full disk)
            log.warning(
                "task run %s (%s) not started: log %s: %s", run.id, run.job_name, log_path, exc
            )
            return TaskOutcome(
                NOT_STARTED, RunState.FAILED, None, f"log file: {exc.strerror or exc}"
            )
        with out:
            try:
                active.cgroup = cg = self.containment.create(run.id)
            except cgroups.ContainmentError as exc:  # refused, never run uncontained
                out.write(f"jobcontrol: not started: {exc}\n".encode())
                return TaskOutcome(cgroups.JOIN_FAILED_STATUS, RunState.FAILED, None, str(exc))
            prelude = self._limits + (cg.join_script() if cg is not None else "")
            try:
                proc = procs.spawn(
                    run.command or "", stdout=out, cwd=run.cwd, env=env, prelude=prelude
                )
            except OSError as exc:
                if cg is not None:
                    active.cgroup = None
                    self.containment.release(cg)
                out.write(f"jobcontrol: cannot start {run.command!r}: {exc}\n".encode())
                return TaskOutcome(NOT_STARTED, RunState.FAILED, None, f"cannot start: {exc}")
            self._announce(active)
            if sink is not None:
                sink.started()  # the task holds the pipe now: its end is seen when it ends
            with self._cond:
                active.proc = proc
                if active.kill_reason is not None:
                    self._start_killer(active)
            active.pid = proc.pid
            timed_out = False
            try:
                rc = self._wait_recording_pid(proc, run, DB_LOG if sink is not None else log_path)
            except subprocess.TimeoutExpired:
                timed_out = True
                with self._cond:
                    if active.kill_reason is None:
                        active.kill_reason = "timeout"
                self._kill_processes(active, proc)
                rc = proc.wait()
            except BaseException:
                # Never leave a started task unsupervised behind a recorded end: an
                # error while waiting kills it before the run is recorded failed.
                with self._cond:
                    if active.kill_reason is None:
                        active.kill_reason = "the worker could not wait for it"
                self._kill_processes(active, proc)
                proc.wait()
                raise
            with self._cond:
                killer = active.killer
            if killer is not None:
                # Its shell died of the TERM; what ignores it is killed after the grace.
                # The run's end (and its job's next run) waits for that, as a timeout's does.
                killer.join()
        # The run's end is its process's, not the end of the output a process it left in
        # the background still holds (``sink.task_ended`` waits a grace for that).
        active.ended = self.clock.now()
        if sink is not None:
            sink.task_ended()  # the spool has all of it (a failed cgroup join reads it)
        outcome = _outcome(run, rc, active.kill_reason, timed_out)
        return self._contained(active, outcome, log_path) if cg is not None else outcome

    def _contained(self, active: _Active, outcome: TaskOutcome, log_path: str) -> TaskOutcome:
        """What the run's cgroup says: its usage, or that the task never joined it. The
        cgroup is removed once the end is recorded (``_execute``)."""
        cg = active.cgroup
        assert cg is not None
        refused = None
        if outcome.exit_status == cgroups.JOIN_FAILED_STATUS:
            refused = cgroups.join_failure(log_path)
        usage = cg.usage() if refused is None else None
        if usage is None:
            return TaskOutcome(outcome.exit_status, RunState.FAILED, None, refused)
        return replace(outcome, cpu_us=usage.cpu_us, mem_peak_bytes=usage.mem_peak_bytes)

    def _wait_recording_pid(
        self, proc: subprocess.Popen[bytes], run: RunRecord, log_path: str
    ) -> int:
        """Wait for the task; record its pid once it has run ``PID_RECORD_DELAY``.

        Raises ``subprocess.TimeoutExpired`` when the run's timeout passes first.
        """
        timeout = run.timeout_s
        first = PID_RECORD_DELAY if timeout is None else min(timeout, PID_RECORD_DELAY)
        rc = procs.wait_child(proc, first)
        if rc is not None:
            return rc
        try:
            self.runqueue.record_pid(run.id, self.name, proc.pid, log_path)
        except StoreUnavailable as exc:
            self.outage.failed(exc)  # the pid comes with the outcome instead
        rest = None if timeout is None else max(0.0, timeout - first)
        rc = procs.wait_child(proc, rest)
        if rc is None:
            raise subprocess.TimeoutExpired(run.command or "", timeout or 0.0)
        return rc

    # ---------------------------------------------------------- logs and the record

    def _log_path(self, run: RunRecord, started: datetime) -> str:
        """Text, not a ``Path``: joined and parsed on every task's path (bench/README.md,
        twenty-third round)."""
        return f"{self._log_root}/job-{run.job_id}/{started:%Y%m%d-%H%M%S}-run{run.id}.log"

    def _open_log(self, log_path: str) -> BinaryIO:
        """The run's new log file, in its job's directory: made (or checked) once per
        worker, again after it went missing (removed, the log volume remounted), and each
        time where other users may write to the log root."""
        job_dir = log_path.rpartition("/")[0]
        checked = job_dir not in self._log_dirs or self._log_root_shared
        if checked:
            self.log_access.make_job_dir(Path(job_dir))
            self._log_dirs.add(job_dir)
        try:
            return self.log_access.open_log(log_path)
        except OSError:
            if checked:
                raise
        # Its directory changed since it was made: made again, or refused saying why.
        self._log_dirs.discard(job_dir)
        self.log_access.make_job_dir(Path(job_dir))
        self._log_dirs.add(job_dir)
        return self.log_access.open_log(log_path)

    def _finish(
        self,
        active: _Active,
        outcome: TaskOutcome,
        started: datetime,
        log_path: str | None,
        g: _Group,
        stored: StoredLog | None = None,
    ) -> tuple[RunRecord | None, bool]:
        """Record the outcome in the worker's own transaction, retried through outages.

        Returns the run claimed with it (the next task of the sequence, or the group's
        next run while it has work waiting) and whether that claim of the group's next
        was made (``Finished.looked``).
        """
        active.finishing = True
        kept: str | None = None
        if stored is not None:
            kept = DB_LOG if stored.size else None  # no output, no log (as with files)
            if stored.problem is not None:
                log.warning("task run %s: its output: %s", active.run.id, stored.problem)
                self._log_trouble(stored.problem)
                said = f"output: {stored.problem}"
                reason = f"{outcome.reason}; {said}" if outcome.reason else said
                outcome = replace(outcome, reason=reason)
        elif log_path is not None:
            try:
                if os.stat(log_path).st_size == 0:
                    os.unlink(log_path)  # empty output leaves no file (spec 7.8)
                else:
                    kept = log_path
            except FileNotFoundError:
                pass
            except OSError as exc:  # its directory replaced meanwhile: the end still counts
                log.warning("task run %s: its log %s: %s", active.run.id, log_path, exc)
                self._log_trouble(f"{log_path}: {exc.strerror or exc}")
        ended = active.ended
        assert ended is not None  # stamped by _execute when the process ended
        values = {
            "state": outcome.state,
            "exit_status": outcome.exit_status,
            "signal": outcome.signal,
            "reason": outcome.reason,
            "ended": ended,
            "duration_ms": max(0, int((ended - started).total_seconds() * 1000)),
            "log_path": kept,
            "pid": active.pid,
            "lease_until": None,
            "cpu_us": outcome.cpu_us,
            "mem_peak_bytes": outcome.mem_peak_bytes,
        }
        run_id = active.run.id
        # Take the next task along unless stopping, or it may be for a queue the group
        # does not serve (a group in filter mode).
        take = g.spec.preference and not self._stopping
        with self._cond:
            # Work waits for the group: runs announced and not yet claimed, or, with every
            # slot held, whatever its queues have (its workloop stopped claiming at
            # capacity). The slot that frees takes the next itself, with this end.
            waiting = (
                not self._stopping
                and (bool(g.offers) or g.free <= 0)
                and not self._unvouched()  # a beat first: its workloop's claim waits for it
            )
            announced, news = self._announced, self._news_answered()
        then = ThenClaim(self.host, self.clock.now, g.claim_queues) if waiting else None

        def finish() -> Finished:
            return self.runqueue.finish(
                run_id,
                self.name,
                values,
                self.default_max_log_files,
                take_next=(self.host, self.clock.now) if take else None,
                then_claim=then,
            )

        try:
            result = self._retry(f"record the end of task run {run_id}", finish)
        finally:
            with self._cond:
                self._active.pop(run_id, None)
                if self._stopping:  # the heartbeat waits for the last run to be recorded
                    self._cond.notify_all()
        if result is None:  # stopped while the database did not answer: on disk instead
            self._keep_end(run_id, values)
            return None, False
        if result.looked:
            self._taken_with_end(g, result.next, announced, news)
        if not result.recorded and self._recorded_already(run_id, values):
            log.info(
                "task run %s: its end was recorded by an earlier try whose answer was lost",
                run_id,
            )
        elif not result.recorded:
            log.warning(
                "task run %s ended (%s %s) after it had been settled: its end is not recorded",
                run_id,
                outcome.state,
                outcome.exit_status,
            )
        _delete_logs(result.stale_logs)
        return result.next, result.looked

    def _taken_with_end(self, g: _Group, run: RunRecord | None, announced: int, news: int) -> None:
        """The group after an end's claim of its next run. That claim counts as one of
        the group's, for its back-off as for its workloop's. The run it took is no
        longer one to claim. When it found none and no news came since that claim
        began (``announced``), neither is any run announced before it (taken by another
        worker): the group's workloop does not claim for them. News since is claimed by
        the workloop at once: the group was at capacity when it came, so it did not
        kick the group."""
        with self._cond:
            g.looks += 1
            self._backed_off(g, news, empty=run is None)
            if run is not None:
                if g.offers:
                    with contextlib.suppress(ValueError):
                        g.offers.remove(run.id)
                self._hurry_beat()
            elif self._announced == announced:
                if g.offers:
                    g.offers.clear()
            else:
                g.kicked = True

    def _keep_end(self, run_id: int, values: dict[str, Any]) -> None:
        """The end the database did not take before the stop: kept in the spool directory,
        recorded at the next start (``keptends``)."""
        try:
            keptends.keep(
                self.spool_dir,
                self.runqueue,
                run_id,
                self.name,
                values,
                self.default_max_log_files,
            )
        except OSError as exc:
            log.error(
                "worker %s: the end of task run %s (%s, exit status %s) could not be kept "
                "on disk either (%s): the run will be settled as lost",
                self.name,
                run_id,
                values["state"],
                values["exit_status"],
                exc,
            )
            return
        log.warning(
            "worker %s: the end of task run %s (%s, exit status %s) is kept in %s, to be "
            "recorded when it starts again",
            self.name,
            run_id,
            values["state"],
            values["exit_status"],
            self.spool_dir / keptends.FILE,
        )

    def _announce(self, active: _Active) -> None:
        """Wake the dispatcher for the end of the run before ``active`` in its sequence,
        and remove that run's cgroup.

        That end is committed already, with this run's claim; the wake-up waits until
        this run's process started, so that the dispatcher's reaction (reading the end,
        queueing the task after this one) runs while the task does, instead of taking
        the interpreter from the thread about to start it.
        """
        if active.spent is not None:
            cg, active.spent = active.spent, None
            self.containment.release(cg)
        if active.announce is not None:
            run_id, active.announce = active.announce, None
            events.task_finished.send(self.store, run_id=run_id)

    def _recorded_already(self, run_id: int, values: dict[str, Any]) -> bool:
        """Whether the run's row holds this very end (the same ``ended`` instant, from this
        worker): a try whose COMMIT went through while its answer was lost recorded it."""
        try:
            return self.runqueue.recorded_end(
                run_id, self.name, values["ended"], values["exit_status"]
            )
        except StoreUnavailable:
            return False

    def _retry(self, what: str, fn: Any) -> Any:
        """``fn()`` until the database answers; None if the worker is stopping past hope."""
        backoff = Backoff()
        while True:
            try:
                result = fn()
            except StoreUnavailable as exc:
                self.outage.failed(exc)
                give_up = self._give_up_at
                if give_up is not None and time.monotonic() > give_up:
                    log.error("worker %s stopped before it could %s: %s", self.name, what, exc)
                    return None
                time.sleep(backoff.next())
                continue
            self.outage.recovered()
            return result


def _delete_logs(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
            log.debug("Deleting %s", path)
        except FileNotFoundError:
            pass
        except OSError:
            log.exception("could not prune log file %s", path)


def _wait(proc: subprocess.Popen[bytes], timeout: float) -> bool:
    try:
        proc.wait(timeout)
        return True
    except subprocess.TimeoutExpired:
        return False


def _outcome(run: RunRecord, rc: int, kill_reason: str | None, timed_out: bool) -> TaskOutcome:
    sig = -rc if rc < 0 else None
    if timed_out:
        reason = f"timed out after {run.timeout_s:g}s"
        return TaskOutcome(TIMEOUT_STATUS, RunState.FAILED, sig, reason)
    if kill_reason is not None:
        return TaskOutcome(KILLED_STATUS, RunState.KILLED, sig, kill_reason)
    if sig is not None:
        name = signals.Signals(sig).name if sig in signals.Signals.__members__.values() else sig
        return TaskOutcome(128 + sig, RunState.FAILED, sig, f"terminated by {name}")
    state = RunState.SUCCEEDED if rc == 0 else RunState.FAILED
    return TaskOutcome(rc, state, None, None)


def _open_to_others(path: Path) -> bool:
    """Whether users other than the owner (and its group) may write to ``path``."""
    try:
        return bool(path.stat().st_mode & 0o002)
    except OSError:
        return False
