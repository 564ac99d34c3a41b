"""A worker: claims task runs from the run queue, runs their processes, records their ends.

It talks to nothing but the store's run-queue interface (``RunQueue``): claim
(compare-and-set, one run per free slot), record the pid, heartbeat (renews the
lease of every run it holds and hears of kill requests), finish (compare-and-set
from running under this worker, in its own transaction). The outcome is never
held only in memory for longer than the database is away: a finish that meets
an outage is retried until the database answers.

Wake-ups are hints, never the only way work is found: ``runs_queued`` and
``kill_requested`` signals from the same process (the embedded worker of the
daemon), and the back-up poll and heartbeat for everything else.
"""

from __future__ import annotations

import logging
import os
import signal as signals
import socket
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, replace
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
)
from jobcontrol.outage import Outage
from jobcontrol.store.lanes import DEFAULT_POLL_S, Lanes
from jobcontrol.store.runqueue import DEFAULT_LEASE, Finished, RunQueue, WorkerInfo
from jobcontrol.taskenv import PassEnv
from jobcontrol.worker import dblog
from jobcontrol.worker.dblog import DatabaseLog, StoredLog

log = logging.getLogger(__name__)

# A task still running after this long gets its pid recorded at once; a shorter
# one records it with its outcome, saving a write on the path between tasks.
PID_RECORD_DELAY = 0.05
# The back-up poll backs off on empty polls, doubling up to this many poll intervals.
POLL_BACKOFF = 5
RETRY_FIRST, RETRY_MAX = 0.05, 2.0
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


@dataclass
class _Active:
    run: RunRecord
    proc: subprocess.Popen[bytes] | None = None
    kill_reason: str | None = None
    pid: int | None = None
    finishing: bool = False
    cgroup: RunCgroup | None = None


class Worker:
    """A pool of ``slots`` threads, each running one task run at a time."""

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
        default_max_log_files: int = 5,
        kill_grace: float = 5.0,
        poll_interval: float | None = None,
        heartbeat_interval: float | None = None,
        version: str = "",
        pass_env: PassEnv | None = None,
        log_access: LogAccess | None = None,
        containment: Containment | None = None,
        task_open_files: int | None = None,
        log_store: str = "file",
        spool_dir: Path | None = None,
    ) -> None:
        """``log_store``: ``file`` (a log file per run under ``log_root``) or ``database``
        (streamed into ``run_log`` by way of a private spool file per run in ``spool_dir``,
        default ``log_root/spool``, kept only until it is stored)."""
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
        self.instance_id = instance_id
        self.host = socket.gethostname()
        self.name = name or f"{self.host}:{os.getpid()}:embedded"
        self.slots = slots
        self.queues = queues
        self.default_max_log_files = default_max_log_files
        self.kill_grace = kill_grace
        # None: the lanes it serves decide (their smallest poll_interval_s, their leases'
        # third), re-read at each back-up poll, so a lane change needs no restart.
        self._fixed_poll = poll_interval
        self._fixed_beat = heartbeat_interval
        self._lanes_seen: tuple[Any, ...] | None = None
        self._capped = False  # whether a lane it serves has max_slots (a count may free up)
        self._follow_lanes(None)
        self.version = version
        self.outage = Outage(f"worker {self.name}")
        self._cond = threading.Condition()
        self._offers: deque[int] = deque()
        self._poll_hint = 0
        self._stopping = False
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._active: dict[int, _Active] = {}
        self._kill_first: dict[int, str] = {}
        self._log_dirs: set[Path] = set()
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
        )

    def _follow_lanes(self, lanes: Lanes | None) -> bool:
        """Take the poll interval, heartbeat and caps from ``lanes``; whether they changed."""
        served = lanes.served(self.queues) if lanes is not None else []
        self.poll_interval = self._fixed_poll or min(
            (x.poll_interval_s for x in served), default=DEFAULT_POLL_S
        )
        # An empty back-up poll doubles the wait for the next one up to this: an idle worker
        # looks for work nobody announced a few times a minute, not every poll_interval.
        self.max_poll_interval = self.poll_interval * POLL_BACKOFF
        lease = (self.runqueue.lease or DEFAULT_LEASE).total_seconds()
        if self.runqueue.lease is None:
            lease = min([lease] + [x.stale_timeout_s for x in served])
        self.heartbeat_interval = self._fixed_beat or lease / 3
        self._capped = any(x.max_slots is not None for x in served)
        seen = lanes.signature() if lanes is not None else None
        changed = seen != self._lanes_seen
        self._lanes_seen = seen
        return changed

    def _reread_lanes(self) -> bool:
        """The lane table again (each back-up poll); whether a rule it follows changed."""
        try:
            lanes = self.runqueue.lanes()
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            return False
        return self._follow_lanes(lanes)

    def start(self) -> None:
        self.log_access.make_root(self.log_root)
        if self.log_store == "database":
            filemodes.make_dir(self.spool_dir)  # 0700: the spool is the worker's alone
        self._reread_lanes()
        self._retry(
            "join the worker registry",
            lambda: self.runqueue.register(self.info(), self.clock.now()),
        )
        if self.log_store == "database":
            self._store_leftovers()
        for signal, receiver in (
            (events.runs_queued, self._on_queued),
            (events.kill_requested, self._on_kill_requested),
            (events.lanes_changed, self._on_lanes_changed),
        ):
            signal.connect(receiver, sender=self.store, weak=False)
            self._receivers.append((signal, receiver))
        for i in range(self.slots):
            self._spawn_thread(self._slot_loop, f"jc-slot-{i}")
        self._spawn_thread(self._heartbeat_loop, "jc-heartbeat")

    def _store_leftovers(self) -> None:
        """Output an earlier life of this worker spooled but could not store (it stopped
        during an outage): stored now, before new work, and its spool deleted."""
        for path in sorted(self.spool_dir.iterdir()):
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

    def stop(self, timeout: float = 30.0) -> None:
        """Stop claiming, let the runs in hand end (the caller kills them first if it must)."""
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        # An outcome is worth waiting for through an outage, but not past the stop's timeout.
        self._give_up_at = time.monotonic() + timeout
        for t in self._threads:
            if t.name != "jc-heartbeat":
                t.join(timeout)
        self._stop.set()  # the heartbeat renews leases until the last run is recorded
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()
        self.containment.close()
        try:
            self.runqueue.deregister(self.name, self.clock.now())
        except StoreUnavailable as exc:
            log.warning("worker %s could not record that it stopped: %s", self.name, exc)

    def kill_all(self, reason: str) -> None:
        """Kill every run in hand (daemon shutdown with --kill)."""
        with self._cond:
            run_ids = list(self._active)
        for run_id in run_ids:
            self.kill(run_id, reason)

    # ---------------------------------------------------------- wake-ups

    def _on_queued(self, _sender: object, run_ids: list[int], **_: Any) -> None:
        with self._cond:
            self._offers.extend(run_ids)
            self._cond.notify(len(run_ids))

    def _on_kill_requested(self, _sender: object, run_id: int, reason: str, **_: Any) -> None:
        self.kill(run_id, reason)

    def _on_lanes_changed(self, _sender: object, **_: Any) -> None:
        self.wake()  # a lane resumed or got room: its queued runs may be claimable now

    def wake(self) -> None:
        """Work may be available: let a slot look (used when the runs are not known)."""
        with self._cond:
            self._poll_hint += 1
            self._cond.notify()

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

        threading.Thread(
            target=self._kill_processes,
            args=(active, proc),
            name=f"jc-kill-{active.run.id}",
            daemon=True,
        ).start()

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
        return {"JOBCONTROL_RUN_ID": str(run_id), "JOBCONTROL_INSTANCE": self.instance_id}

    # ---------------------------------------------------------- heartbeat and back-up poll

    def _heartbeat_loop(self) -> None:
        next_beat = next_poll = next_lanes = time.monotonic()
        poll_every = self.poll_interval
        while True:
            if time.monotonic() >= next_lanes and not self._stop.is_set():
                # The lanes every poll interval, even while the poll for work backs off.
                if self._reread_lanes():
                    next_poll, poll_every = time.monotonic(), self.poll_interval
                next_lanes = time.monotonic() + self.poll_interval
            if time.monotonic() >= next_beat:
                self._beat()
                next_beat = time.monotonic() + self.heartbeat_interval
            if self._stop.is_set():
                # Stopping: keep the leases of the runs still in hand until they are recorded.
                with self._cond:
                    if not self._active:
                        return
                    self._cond.wait(min(self.poll_interval, max(0.0, next_beat - time.monotonic())))
                continue
            if time.monotonic() >= next_poll:
                found = self._poll_for_work()
                # Back off while there is nothing to find; announced work never waits for this.
                poll_every = (
                    self.poll_interval if found else min(poll_every * 2, self.max_poll_interval)
                )
                next_poll = time.monotonic() + poll_every
            self._stop.wait(max(0.0, min(next_poll, next_beat, next_lanes) - time.monotonic()))

    def _beat(self) -> None:
        self.containment.sweep()  # cgroups of ended runs, once what they left behind ended
        with self._cond:
            mine = [rid for rid, a in self._active.items() if not a.finishing]
        try:
            problems = (self.log_problems, self.log_problem) if self.log_problems else None
            beat = self.runqueue.heartbeat(self.name, self.clock.now(), mine, log_problems=problems)
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            return
        self.outage.recovered()
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

    def _poll_for_work(self) -> bool:
        """The back-up poll: work nobody announced (another process queued it). Whether
        there was work to find, or the worker was busy (so the poll stays frequent)."""
        with self._cond:
            free = self.slots - len(self._active)
        if free <= 0 or self._stopping:
            return True
        try:
            found = self.runqueue.any_queued(self.queues)
        except StoreUnavailable as exc:
            self.outage.failed(exc)
            return True
        if found:
            self.wake()
        return found

    # ---------------------------------------------------------- slots

    def _next_work(self) -> tuple[int | None] | None:
        """The next announced run id, ``(None,)`` to claim by priority, or None to stop."""
        with self._cond:
            while not self._stopping:
                if self._offers:
                    return (self._offers.popleft(),)
                if self._poll_hint:
                    self._poll_hint -= 1
                    return (None,)
                self._cond.wait()
            return None

    def _slot_loop(self) -> None:
        while (work := self._next_work()) is not None:
            (run_id,) = work
            try:
                claimed = self.runqueue.claim(
                    self.name, self.host, self.clock.now(), run_id=run_id, queues=self.queues
                )
            except StoreUnavailable as exc:
                self.outage.failed(exc)
                continue  # the back-up poll finds it again once the database is back
            except Exception:
                log.exception("claiming a task run failed")
                continue
            self.outage.recovered()
            if not claimed:
                continue
            if run_id is None:
                self.wake()  # found by polling: there may be more
            run: RunRecord | None = claimed[0]
            while run is not None:  # the next task of a sequence comes with this one's end
                run = self._execute(run)
            if self._capped:
                self.wake()  # a capped lane may have room again for a run it turned down

    def _execute(self, run: RunRecord) -> RunRecord | None:
        """Run one task run to its recorded end; the run claimed with that end, if any."""
        active = _Active(run)
        with self._cond:
            self._active[run.id] = active
            active.kill_reason = self._kill_first.pop(run.id, None)
        outcome: TaskOutcome | None = None
        log_path: Path | None = None
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
                    outcome = self._spawn_and_wait(active, sink.spool_path, sink)
            else:
                log_path = self._log_path(run, started)
                outcome = self._spawn_and_wait(active, log_path)
        except Exception as exc:
            log.exception("task run %s (%s) failed to run", run.id, run.job_name)
            outcome = TaskOutcome(1, RunState.FAILED, None, f"could not run: {exc}")
        finally:
            # Always record the outcome, whatever happened above.
            if outcome is None:
                outcome = TaskOutcome(1, RunState.FAILED, None, "worker error")
            try:
                if sink is not None:  # all of the output stored before the end is recorded
                    stored = sink.close()
            finally:
                following = self._finish(active, outcome, started, log_path, stored)
        return following

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
        self, active: _Active, log_path: Path, sink: DatabaseLog | None = None
    ) -> TaskOutcome:
        """Run the task with its output to ``log_path``, or to ``sink`` (then ``log_path``
        is the sink's spool, which only the worker writes)."""
        run = active.run
        env = self._base_env.copy()
        env.update(run.env)
        env.update(self._marker(run.id))
        env["JOBCONTROL_JOB"] = run.job_name
        env["JOBCONTROL_JOB_ID"] = str(run.job_id)
        env["JOBCONTROL_LOG"] = DB_LOG if sink is not None else str(log_path)
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
                    self.containment.release(cg)
                out.write(f"jobcontrol: cannot start {run.command!r}: {exc}\n".encode())
                return TaskOutcome(NOT_STARTED, RunState.FAILED, None, f"cannot start: {exc}")
            if sink is not None:
                sink.started()  # the task holds the pipe now: its end is seen when it ends
            with self._cond:
                active.proc = proc
                if active.kill_reason is not None:
                    self._start_killer(active)
            active.pid = proc.pid
            timed_out = False
            try:
                rc = self._wait_recording_pid(
                    proc, run, DB_LOG if sink is not None else str(log_path)
                )
            except subprocess.TimeoutExpired:
                timed_out = True
                with self._cond:
                    if active.kill_reason is None:
                        active.kill_reason = "timeout"
                self._kill_processes(active, proc)
                rc = proc.wait()
        if sink is not None:
            sink.task_ended()  # the spool has all of it (a failed cgroup join reads it)
        outcome = _outcome(run, rc, active.kill_reason, timed_out)
        return self._contained(active, outcome, log_path) if cg is not None else outcome

    def _contained(self, active: _Active, outcome: TaskOutcome, log_path: Path) -> TaskOutcome:
        """What the run's cgroup says: its usage, or that the task never joined it."""
        cg = active.cgroup
        assert cg is not None
        refused = None
        if outcome.exit_status == cgroups.JOIN_FAILED_STATUS:
            refused = cgroups.join_failure(log_path)
        usage = cg.usage() if refused is None else None
        self.containment.release(cg)
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

    def _log_path(self, run: RunRecord, started: datetime) -> Path:
        return self.log_root / f"job-{run.job_id}" / f"{started:%Y%m%d-%H%M%S}-run{run.id}.log"

    def _open_log(self, log_path: Path) -> BinaryIO:
        job_dir = log_path.parent
        if job_dir not in self._log_dirs:
            self.log_access.make_job_dir(job_dir)
            self._log_dirs.add(job_dir)
        return self.log_access.open_log(log_path)

    def _finish(
        self,
        active: _Active,
        outcome: TaskOutcome,
        started: datetime,
        log_path: Path | None,
        stored: StoredLog | None = None,
    ) -> RunRecord | None:
        """Record the outcome in the worker's own transaction, retried through outages.

        Returns the next task of the sequence, claimed in the same transaction.
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
                if log_path.stat().st_size == 0:
                    log_path.unlink()  # empty output leaves no file (spec 7.8)
                else:
                    kept = str(log_path)
            except FileNotFoundError:
                pass
        ended = self.clock.now()
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
        # Take the next task along unless stopping, or it may be for a queue not served here.
        take = self.queues is None and not self._stopping

        def finish() -> Finished:
            now = self.clock.now()
            return self.runqueue.finish(
                run_id,
                self.name,
                values,
                self.default_max_log_files,
                take_next=(self.host, now) if take else None,
            )

        try:
            result = self._retry(f"record the end of task run {run_id}", finish)
        finally:
            with self._cond:
                self._active.pop(run_id, None)
                if self._stopping:  # the heartbeat waits for the last run to be recorded
                    self._cond.notify_all()
        if result is None:
            return None
        if not result.recorded:
            log.warning(
                "task run %s ended (%s %s) after it had been settled: its end is not recorded",
                run_id,
                outcome.state,
                outcome.exit_status,
            )
        _delete_logs(result.stale_logs)
        events.task_finished.send(self.store, run_id=run_id)
        following: RunRecord | None = result.next
        return following

    def _retry(self, what: str, fn: Any) -> Any:
        """``fn()`` until the database answers; None if the worker is stopping past hope."""
        delay = RETRY_FIRST
        while True:
            try:
                result = fn()
            except StoreUnavailable as exc:
                self.outage.failed(exc)
                give_up = self._give_up_at
                if give_up is not None and time.monotonic() > give_up:
                    log.error("worker %s stopped before it could %s: %s", self.name, what, exc)
                    return None
                time.sleep(delay)
                delay = min(delay * 2, RETRY_MAX)
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
