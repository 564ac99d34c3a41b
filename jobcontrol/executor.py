"""The local executor: slots that claim task runs from the run queue and run them.

The dispatcher never starts a process itself: it queues a task run row and
wakes the executor. Each slot claims one run at a time (never more than it has
room for), runs the command in its own session with output to the run's log
file, records the pid, and writes the final state compare-and-set. Polling is
only a back-up for a missed wake-up.
"""

from __future__ import annotations

import logging
import os
import signal as signals
import socket
import subprocess
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy import Connection

from jobcontrol import procs
from jobcontrol.model import KILLED_STATUS, TIMEOUT_STATUS, RunRecord, RunState
from jobcontrol.store import Store, queries
from jobcontrol.timers import Clock

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
# A task still running after this long gets its pid recorded at once; a shorter
# one records it with its outcome, saving a write on the path between tasks.
PID_RECORD_DELAY = 0.05


@dataclass(frozen=True)
class TaskOutcome:
    """How a task run ended. ``record`` holds the run row's final values for the
    dispatcher to write (compare-and-set from running) in the same transaction as
    its reaction; None when the executor already recorded the end itself."""

    run_id: int
    exit_status: int
    state: RunState
    signal: int | None
    reason: str | None
    record: dict[str, Any] | None = None
    job_id: int | None = None
    max_log_files: int | None = None


def record_outcome(conn: Connection, outcome: TaskOutcome, default_max_log_files: int) -> list[str]:
    """Write a task's end; returns log files past the job's ``max_log_files`` to delete after commit."""
    if outcome.record is None:
        return []
    if not queries.transition_run(conn, outcome.run_id, [RunState.RUNNING], outcome.record):
        log.warning("task run %s was no longer running when it ended", outcome.run_id)
        return []
    if outcome.record.get("log_path") is None or outcome.job_id is None:
        return []
    keep = outcome.max_log_files or default_max_log_files
    stale = queries.log_paths_to_prune(conn, outcome.job_id, keep)
    queries.forget_log(conn, [rid for rid, _ in stale])
    return [path for _, path in stale]


def delete_logs(paths: list[str]) -> None:
    for path in paths:
        try:
            os.unlink(path)
            log.debug("Deleting %s", path)
        except FileNotFoundError:
            pass
        except OSError:
            log.exception("could not prune log file %s", path)


@dataclass
class _Active:
    run: RunRecord
    proc: subprocess.Popen[bytes] | None = None
    kill_reason: str | None = None
    pid: int | None = None


class LocalExecutor:
    def __init__(
        self,
        store: Store,
        *,
        clock: Clock,
        log_root: Path,
        instance_id: str,
        on_finished: Callable[[TaskOutcome], None],
        slots: int = 8,
        queues: list[str] | None = None,
        default_max_log_files: int = 5,
        kill_grace: float = 5.0,
    ) -> None:
        self.store = store
        self.clock = clock
        self.log_root = log_root
        self.instance_id = instance_id
        self.on_finished = on_finished
        self.slots = slots
        self.queues = queues
        self.default_max_log_files = default_max_log_files
        self.kill_grace = kill_grace
        self.host = socket.gethostname()
        self.worker = f"{self.host}:{os.getpid()}:local"
        self._cond = threading.Condition()
        self._offers: deque[int] = deque()
        self._poll_hint = 0
        self._stopping = False
        self._threads: list[threading.Thread] = []
        self._active: dict[int, _Active] = {}
        self._kill_first: dict[int, str] = {}
        self._log_dirs: set[Path] = set()
        self._base_env = dict(os.environ)

    # ---------------------------------------------------------- control

    def start(self) -> None:
        self.log_root.mkdir(parents=True, exist_ok=True)
        for i in range(self.slots):
            t = threading.Thread(target=self._slot_loop, name=f"jc-slot-{i}", daemon=True)
            t.start()
            self._threads.append(t)

    def offer(self, run_ids: list[int]) -> None:
        """Runs were queued (the "work available" push, naming them)."""
        with self._cond:
            self._offers.extend(run_ids)
            self._cond.notify(len(run_ids))

    def wake(self) -> None:
        """Work may be available: let a slot look (used when the runs are not known)."""
        with self._cond:
            self._poll_hint += 1
            self._cond.notify()

    def running_count(self) -> int:
        with self._cond:
            return len(self._active)

    def stop(self, timeout: float = 30.0) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        for t in self._threads:
            t.join(timeout)
        self._threads.clear()

    def kill(self, run_id: int, reason: str = "killed") -> None:
        """Kill a task run wherever it is: queued (never started) or running."""
        with self._cond:
            active = self._active.get(run_id)
            if active is None:
                self._kill_first[run_id] = reason
            elif active.kill_reason is None:
                active.kill_reason = reason
                if active.proc is not None:
                    self._start_killer(active)
                return
            else:
                return
        self._cancel_queued(run_id, reason)

    def _cancel_queued(self, run_id: int, reason: str) -> None:
        now = self.clock.now()
        with self.store.write() as conn:
            cancelled = queries.transition_run(
                conn,
                run_id,
                [RunState.QUEUED],
                {
                    "state": RunState.KILLED,
                    "exit_status": KILLED_STATUS,
                    "ended": now,
                    "duration_ms": 0,
                    "reason": reason,
                },
            )
        if cancelled:
            with self._cond:
                self._kill_first.pop(run_id, None)
            self.on_finished(TaskOutcome(run_id, KILLED_STATUS, RunState.KILLED, None, reason))
        # Otherwise a slot claimed it meanwhile: _kill_first makes the slot kill it at once.

    def _start_killer(self, active: _Active) -> None:
        proc = active.proc
        assert proc is not None

        def wait_exit(timeout: float) -> bool:
            try:
                proc.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False

        def killer() -> None:
            procs.kill_tree(
                proc.pid,
                marker=self._marker(active.run.id),
                grace=self.kill_grace,
                wait_exit=wait_exit,
            )

        threading.Thread(target=killer, name=f"jc-kill-{active.run.id}", daemon=True).start()

    def _marker(self, run_id: int) -> dict[str, str]:
        return {"JOBCONTROL_RUN_ID": str(run_id), "JOBCONTROL_INSTANCE": self.instance_id}

    # ---------------------------------------------------------- slots

    def _next_work(self) -> tuple[int | None] | None:
        """The next announced run id, ``(None,)`` to poll the queue, or None to stop."""
        with self._cond:
            while not self._stopping:
                if self._offers:
                    return (self._offers.popleft(),)
                if self._poll_hint:
                    self._poll_hint -= 1
                    return (None,)
                if not self._cond.wait(POLL_SECONDS):
                    return (None,)  # the back-up poll, for work nobody announced
            return None

    def _slot_loop(self) -> None:
        while (work := self._next_work()) is not None:
            (run_id,) = work
            try:
                run = self._claim(run_id)
            except Exception:
                log.exception("claiming a task run failed")
                continue
            if run is None:
                continue
            if run_id is None:
                self.wake()  # found by polling: there may be more
            self._execute(run)

    def _claim(self, run_id: int | None) -> RunRecord | None:
        now = self.clock.now()
        if run_id is not None:
            with self.store.write() as conn:
                return queries.claim_run_by_id(
                    conn, run_id, worker=self.worker, host=self.host, now=now
                )
        # A poll: look first with a read, so idle slots take no write lock.
        with self.store.read() as conn:
            if not queries.any_queued(conn, self.queues):
                return None
        with self.store.write() as conn:
            return queries.claim_run(
                conn,
                queues=self.queues,
                worker=self.worker,
                host=self.host,
                now=now,
                skip_locked=not self.store.is_sqlite,
            )

    def _execute(self, run: RunRecord) -> None:
        active = _Active(run)
        with self._cond:
            self._active[run.id] = active
            active.kill_reason = self._kill_first.pop(run.id, None)
        outcome: TaskOutcome | None = None
        log_path: Path | None = None
        started = run.started or self.clock.now()
        try:
            if active.kill_reason is not None:
                outcome = TaskOutcome(
                    run.id, KILLED_STATUS, RunState.KILLED, None, active.kill_reason
                )
                return
            log_path = self._log_path(run, started)
            outcome = self._spawn_and_wait(active, log_path)
        except Exception as exc:
            log.exception("task run %s (%s) failed to run", run.id, run.job_name)
            outcome = TaskOutcome(run.id, 1, RunState.FAILED, None, f"could not run: {exc}")
        finally:
            # Always record the outcome, whatever happened above.
            if outcome is None:
                outcome = TaskOutcome(run.id, 1, RunState.FAILED, None, "executor error")
            with self._cond:
                self._active.pop(run.id, None)
            self._finish(active, outcome, started, log_path)

    def _spawn_and_wait(self, active: _Active, log_path: Path) -> TaskOutcome:
        run = active.run
        env = self._base_env.copy()  # os.environ decodes every variable on each read
        env.update(run.env)
        env.update(self._marker(run.id))
        env["JOBCONTROL_JOB"] = run.job_name
        env["JOBCONTROL_JOB_ID"] = str(run.job_id)
        env["JOBCONTROL_LOG"] = str(log_path)
        with open(log_path, "wb") as out:
            try:
                proc = procs.spawn(run.command or "", stdout=out, cwd=run.cwd, env=env)
            except OSError as exc:
                out.write(f"jobcontrol: cannot start {run.command!r}: {exc}\n".encode())
                return TaskOutcome(run.id, 127, RunState.FAILED, None, f"cannot start: {exc}")
            with self._cond:
                active.proc = proc
                if active.kill_reason is not None:
                    self._start_killer(active)
            active.pid = proc.pid
            timed_out = False
            try:
                rc = self._wait_recording_pid(proc, run, log_path)
            except subprocess.TimeoutExpired:
                timed_out = True
                with self._cond:
                    if active.kill_reason is None:
                        active.kill_reason = "timeout"
                procs.kill_tree(
                    proc.pid,
                    marker=self._marker(run.id),
                    grace=self.kill_grace,
                    wait_exit=lambda t: _wait(proc, t),
                )
                rc = proc.wait()
        return _outcome(run, rc, active.kill_reason, timed_out)

    def _wait_recording_pid(
        self, proc: subprocess.Popen[bytes], run: RunRecord, log_path: Path
    ) -> int:
        """Wait for the task; record its pid once it has run ``PID_RECORD_DELAY``.

        Raises ``subprocess.TimeoutExpired`` when the run's timeout passes first.
        """
        timeout = run.timeout_s
        first = PID_RECORD_DELAY if timeout is None else min(timeout, PID_RECORD_DELAY)
        rc = procs.wait_child(proc, first)
        if rc is not None:
            return rc
        with self.store.write() as conn:
            queries.set_run_pid(conn, run.id, proc.pid, str(log_path))
        rest = None if timeout is None else max(0.0, timeout - first)
        rc = procs.wait_child(proc, rest)
        if rc is None:
            raise subprocess.TimeoutExpired(run.command or "", timeout or 0.0)
        return rc

    # ---------------------------------------------------------- logs and the record

    def _log_path(self, run: RunRecord, started: datetime) -> Path:
        job_dir = self.log_root / f"job-{run.job_id}"
        if job_dir not in self._log_dirs:
            job_dir.mkdir(parents=True, exist_ok=True)
            self._log_dirs.add(job_dir)
        return job_dir / f"{started:%Y%m%d-%H%M%S}-run{run.id}.log"

    def _finish(
        self, active: _Active, outcome: TaskOutcome, started: datetime, log_path: Path | None
    ) -> None:
        kept: str | None = None
        if log_path is not None:
            try:
                if log_path.stat().st_size == 0:
                    log_path.unlink()  # empty output leaves no file (spec 7.8)
                else:
                    kept = str(log_path)
            except FileNotFoundError:
                pass
        ended = self.clock.now()
        record = {
            "state": outcome.state,
            "exit_status": outcome.exit_status,
            "signal": outcome.signal,
            "reason": outcome.reason,
            "ended": ended,
            "duration_ms": max(0, int((ended - started).total_seconds() * 1000)),
            "log_path": kept,
            "pid": active.pid,
        }
        run = active.run
        self.on_finished(
            TaskOutcome(
                outcome.run_id,
                outcome.exit_status,
                outcome.state,
                outcome.signal,
                outcome.reason,
                record=record,
                job_id=run.job_id,
                max_log_files=run.max_log_files,
            )
        )


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
        return TaskOutcome(run.id, TIMEOUT_STATUS, RunState.FAILED, sig, reason)
    if kill_reason is not None:
        return TaskOutcome(run.id, KILLED_STATUS, RunState.KILLED, sig, kill_reason)
    if sig is not None:
        name = signals.Signals(sig).name if sig in signals.Signals.__members__.values() else sig
        return TaskOutcome(run.id, 128 + sig, RunState.FAILED, sig, f"terminated by {name}")
    state = RunState.SUCCEEDED if rc == 0 else RunState.FAILED
    return TaskOutcome(run.id, rc, state, None, None)
