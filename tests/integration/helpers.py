"""A small harness for driving the real engine in integration tests.

``JC`` opens a fresh store, builds a ``Dispatcher`` with a ``ManualClock`` and
``ManualTimers`` (nothing fires until a test moves the clock) and a tmp log
root, and an ``Engine`` on top. A ``Recorder`` keeps every signal that
dispatcher sends, so a test waits on what the engine announces instead of
sleeping. Every wait is bounded.

Two kinds of wait:

* engine events: ``Recorder.wait_for`` (blinker signals) and ``JC.sync``, a
  barrier that returns once the dispatcher has handled everything posted before
  it (timer fires go through the same queue, so ``JC.advance`` syncs);
* operating-system state (a process exists, a process is gone): there is no
  event to wait on, so ``poll_until`` re-checks on a short interval until a
  deadline.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from jobcontrol import (
    Batch,
    DispatcherConfig,
    Engine,
    JobChange,
    JobRecord,
    Kind,
    NewJob,
    RunRecord,
    Store,
)
from jobcontrol import events as jc_events
from jobcontrol.clock import ManualClock, ManualTimers
from jobcontrol.dispatch.tree import Node
from jobcontrol.model import TreeState
from jobcontrol.procs import find_marked, kill_tree
from jobcontrol.runtime import Runtime
from jobcontrol.store import queries, schema

WAIT = 10.0
USER = "tester"
# The manual clock's start: 12:00 UTC, so "daily 22:56" (UTC) is later the same day.
T0 = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)

_SIGNALS = {
    "job_created": jc_events.job_created,
    "jobs_modified": jc_events.jobs_modified,
    "jobs_deleted": jc_events.jobs_deleted,
    "state_changed": jc_events.state_changed,
    "run_started": jc_events.run_started,
    "run_finished": jc_events.run_finished,
    "schedule_changed": jc_events.schedule_changed,
}


class WaitTimeout(AssertionError):
    """A bounded wait ran out."""


def poll_until(what: str, predicate: Callable[[], Any], timeout: float = WAIT) -> Any:
    """Re-check ``predicate`` until it is truthy (returned) or ``timeout`` passes (fails).

    Only for operating-system state (/proc), which announces nothing.
    """
    deadline = time.monotonic() + timeout
    pause = threading.Event()
    delay = 0.005
    while True:
        result = predicate()
        if result:
            return result
        if time.monotonic() > deadline:
            raise WaitTimeout(f"gave up after {timeout:g}s waiting for {what}")
        pause.wait(delay)
        delay = min(delay * 2, 0.05)


@dataclass(frozen=True)
class Signal:
    name: str
    data: dict[str, Any]

    @property
    def run(self) -> dict[str, Any]:
        run: dict[str, Any] = self.data["run"]
        return run


class Recorder:
    """Every signal one dispatcher sends, in order; thread-safe."""

    def __init__(self, sender: object) -> None:
        self.sender = sender
        self._cond = threading.Condition()
        self._seen: list[Signal] = []
        self._receivers: list[tuple[Any, Callable[..., None]]] = []

    def connect(self) -> None:
        for name, signal in _SIGNALS.items():
            receiver = self._receiver(name)
            signal.connect(receiver, weak=False)
            self._receivers.append((signal, receiver))

    def disconnect(self) -> None:
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()

    def _receiver(self, name: str) -> Callable[..., None]:
        def receive(sender: object, **data: Any) -> None:
            if sender is not self.sender:
                return  # another test's dispatcher
            with self._cond:
                self._seen.append(Signal(name, data))
                self._cond.notify_all()

        return receive

    def mark(self) -> int:
        """A position: ``since=mark`` looks only at signals sent after it."""
        with self._cond:
            return len(self._seen)

    def signals(self, name: str | None = None, *, since: int = 0) -> list[Signal]:
        with self._cond:
            return [s for s in self._seen[since:] if name is None or s.name == name]

    def wait_for(
        self, predicate: Callable[[Signal], bool], *, since: int = 0, timeout: float = WAIT
    ) -> Signal:
        """The first signal after ``since`` that satisfies ``predicate``, waiting for it if need be."""
        deadline = time.monotonic() + timeout
        with self._cond:
            index = since
            while True:
                while index < len(self._seen):
                    sig = self._seen[index]
                    index += 1
                    if predicate(sig):
                        return sig
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = [(s.name, _brief(s)) for s in self._seen[since:]]
                    raise WaitTimeout(f"no matching signal within {timeout:g}s; saw {seen}")
                self._cond.wait(remaining)

    def run_finished(self, job: str, *, since: int = 0, timeout: float = WAIT) -> dict[str, Any]:
        """The ``run`` of the first run of ``job`` that finished after ``since``."""
        sig = self.wait_for(
            lambda s: s.name == "run_finished" and s.run["job_name"] == job,
            since=since,
            timeout=timeout,
        )
        return sig.run

    def finished_jobs(self, *, since: int = 0) -> list[str]:
        return [s.run["job_name"] for s in self.signals("run_finished", since=since)]

    def started_jobs(self, *, since: int = 0) -> list[str]:
        return [s.run["job_name"] for s in self.signals("run_started", since=since)]


def _brief(sig: Signal) -> Any:
    if "run" in sig.data:
        return (sig.run["job_name"], sig.run["state"])
    return sig.data.get("name") or sig.data.get("job_ids") or len(sig.data.get("jobs", []))


def box(name: str, parent: str | None = None, **fields: Any) -> NewJob:
    return NewJob(name, Kind.BOX, parent, fields)


def task(name: str, command: str, parent: str | None = None, **fields: Any) -> NewJob:
    return NewJob(name, Kind.TASK, parent, {"command": command, **fields})


class Gate:
    """A FIFO a task blocks on (``read line < FIFO``) until the test opens the gate.

    ``open(n)`` lets ``n`` readers through. The write end stays open until
    ``close`` so a line written before a reader arrives is not lost.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        os.mkfifo(path)
        self._fd: int | None = None

    @property
    def command(self) -> str:
        return f'read line < "{self.path}"'

    def open(self, readers: int = 1) -> None:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_NONBLOCK)  # never blocks
        os.write(self._fd, b"go\n" * readers)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class ErrorLog(logging.Handler):
    """Keeps what Job Control logs at ERROR and above: a swallowed handler failure is a bug."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def messages(self) -> list[str]:
        return [self.format(r) if r.exc_info else r.getMessage() for r in list(self.records)]


class JC:
    """One store + dispatcher + engine on a manual clock, for one test."""

    def __init__(
        self,
        url: str,
        tmp_path: Path,
        *,
        slots: int = 4,
        kill_grace: float = 2.0,
        edit_timeout: float = 30.0,
        poll_interval: float = 2.0,
        lease: float = 30.0,
        busy_timeout: float = 30.0,
    ) -> None:
        self.url = url
        self.tmp_path = tmp_path
        self.store = Store(url, busy_timeout=busy_timeout)
        self.store.upgrade()
        self.instance_id = self.store.instance_id()
        self.clock = ManualClock(T0)
        self.timers = ManualTimers(self.clock)
        self.log_root = tmp_path / "logs"
        self.config = DispatcherConfig(
            log_root=self.log_root,
            slots=slots,
            kill_grace=kill_grace,
            edit_timeout=edit_timeout,
            default_tz=UTC,
            poll_interval=poll_interval,
            lease=lease,
        )
        # Wired as the daemon wires them: the dispatcher and its embedded worker.
        self.runtime = Runtime(self.store, self.config, clock=self.clock, timers=self.timers)
        self.dispatcher = self.runtime.dispatcher
        self.engine = Engine(self.store, self.dispatcher)
        self.rec = Recorder(self.dispatcher)
        self._gates: list[Gate] = []
        self.errors = ErrorLog()

    # ------------------------------------------------------------ life cycle

    def start(self) -> JC:
        logging.getLogger("jobcontrol").addHandler(self.errors)
        self.rec.connect()
        self.runtime.start()
        return self

    def close(self, *, timeout: float = WAIT * 3) -> list[int]:
        """Stop everything; returns pids of this store's task processes that had to be killed.
        ``timeout``: how long the stop waits for the tree runs in flight to end."""
        try:
            self.runtime.stop(kill_running=True, timeout=timeout)
        finally:
            self.rec.disconnect()
            logging.getLogger("jobcontrol").removeHandler(self.errors)
            for gate in self._gates:
                gate.close()
        marker = {"JOBCONTROL_INSTANCE": self.instance_id}
        leftovers: list[int] = []
        try:
            poll_until("task processes to end", lambda: not find_marked(marker))
        except WaitTimeout:
            leftovers = find_marked(marker)
            kill_tree(None, marker=marker, grace=0.0)
        self.store.dispose()
        return leftovers

    def diagnosis(self) -> str:
        """For a failed test: the run and worker rows, and every thread's stack."""
        lines = [f"=== diagnosis of {self.url.split('@')[-1]}"]
        try:
            with self.store.engine.connect() as conn:
                for table in ("run", "worker"):
                    lines.append(f"--- {table} rows")
                    rows = conn.execute(sa.text(f"SELECT * FROM {table} ORDER BY 1"))  # noqa: S608
                    lines += [repr(dict(r._mapping)) for r in rows]
                if conn.dialect.name == "postgresql":
                    # Who waits on whom: a transaction left open holds its row locks.
                    lines.append("--- sessions (pg_stat_activity)")
                    rows = conn.execute(
                        sa.text(
                            "SELECT pid, state, wait_event_type, wait_event, xact_start,"
                            " pg_blocking_pids(pid) AS blocked_by, left(query, 200) AS query"
                            " FROM pg_stat_activity WHERE datname = current_database()"
                        )
                    )
                    lines += [repr(dict(r._mapping)) for r in rows]
        except sa.exc.SQLAlchemyError as exc:
            lines.append(f"--- the database could not be read: {exc}")
        worker = self.runtime.worker
        if worker is not None:
            now = time.monotonic()
            lines.append(f"--- worker: in hand {sorted(worker._active)}")
            for g in worker._groups:
                lines.append(
                    f"group {g.spec.key}: offers {list(g.offers or ())} kicked {g.kicked} "
                    f"free {g.free} runs {sorted(g.runs)} ready {[r.id for r in g.ready]} "
                    f"looks {g.looks} next look in {g.next_poll - now:.2f}s delay {g.delay}"
                )
        names = {t.ident: t.name for t in threading.enumerate()}
        for ident, frame in sys._current_frames().items():
            lines.append(f"--- thread {names.get(ident, ident)}")
            lines += [line.rstrip() for line in traceback.format_stack(frame)[-8:]]
        return "\n".join(lines)

    def gate(self, name: str = "gate") -> Gate:
        gate = Gate(self.tmp_path / f"{name}.fifo")
        self._gates.append(gate)
        return gate

    # ------------------------------------------------------------ driving

    def sync(self) -> None:
        """Return once the dispatcher has handled every event posted before this call."""
        self.dispatcher.call(lambda: None).result(WAIT)

    def advance(self, seconds: float = 0, *, to: datetime | None = None) -> int:
        """Move the manual clock, fire the timers now due, and let the dispatcher handle them."""
        fired = self.timers.advance(timedelta(seconds=seconds), to=to)
        self.sync()
        return fired

    def create(self, *jobs: NewJob) -> dict[str, int]:
        return self.engine.apply_batch(Batch(creates=list(jobs)), user=USER).created

    def modify(self, job: str | int, **fields: Any) -> list[int]:
        return self.engine.modify_jobs([JobChange(job, fields)], user=USER)

    def run_now(self, job: str | int) -> int:
        return self.engine.run_now(job, user=USER)

    # ------------------------------------------------------------ looking

    def job(self, job: str | int) -> JobRecord:
        return self.engine.get_job(job)

    def view(self, name: str) -> dict[str, Any]:
        """The job's row of ``list_jobs`` (live state included)."""
        rows = [j for j in self.engine.list_jobs() if j["name"] == name]
        assert len(rows) == 1, rows
        return rows[0]

    def runs(self, job: str | int, **kw: Any) -> list[RunRecord]:
        return self.engine.history(job, **kw)

    def run(self, run_id: int) -> RunRecord:
        with self.store.read() as conn:
            found = queries.get_run(conn, run_id)
        assert found is not None, run_id
        return found

    def tree_run(self, root_run_id: int) -> dict[str, RunRecord]:
        """Every run of one tree run, by job name."""
        with self.store.read() as conn:
            runs = queries.runs_of_tree_run(conn, root_run_id)
        by_name = {r.job_name: r for r in runs}
        assert len(by_name) == len(runs), runs
        return by_name

    def armed_at(self, job: str | int) -> datetime | None:
        """When the tree timer of a top-level job is armed, or None."""
        return self.timers.armed().get(("tree", self.job(job).id))

    def tree_state(self) -> TreeState:
        return self.dispatcher.protocol.state

    def task_pids(self, run_id: int) -> list[int]:
        return find_marked(
            {"JOBCONTROL_RUN_ID": str(run_id), "JOBCONTROL_INSTANCE": self.instance_id}
        )

    def wait_task_process(self, run_id: int) -> list[int]:
        """Wait until the task run's process exists and its run row has the pid."""
        pids: list[int] = poll_until(
            f"a process of task run {run_id}", lambda: self.task_pids(run_id)
        )
        poll_until(f"the pid of task run {run_id}", lambda: self.run(run_id).pid is not None)
        return pids

    def dump(self) -> dict[str, list[dict[str, Any]]]:
        """The whole job and run tables, row by row."""
        with self.store.read() as conn:
            return {
                table.name: [
                    dict(r._mapping) for r in conn.execute(sa.select(table).order_by(table.c.id))
                ]
                for table in (schema.job, schema.run)
            }

    def memory_tree(self) -> dict[int, tuple[JobRecord, int | None, list[int]]]:
        """The dispatcher's tree, read on its own thread: id -> (record, parent id, child ids)."""

        def read() -> dict[int, tuple[JobRecord, int | None, list[int]]]:
            d = self.dispatcher
            assert all(d.tree.by_name[n.job.name] is n for n in d.tree.nodes.values())
            assert len(d.tree.by_name) == len(d.tree.nodes)
            assert {n.id for n in d.tree.roots} == {
                n.id for n in d.tree.nodes.values() if n.parent is None
            }
            return {
                n.id: (_copy(n.job), _parent_id(n), [c.id for c in n.children])
                for n in d.tree.nodes.values()
            }

        result: dict[int, tuple[JobRecord, int | None, list[int]]] = self.dispatcher.call(
            read
        ).result(WAIT)
        return result

    def assert_tree_matches_db(self) -> None:
        memory = self.memory_tree()
        with self.store.read() as conn:
            stored = {r.id: r for r in queries.load_all_jobs(conn)}
        assert {i: m[0] for i, m in memory.items()} == stored
        for job_id, (rec, parent_id, child_ids) in memory.items():
            assert parent_id == rec.parent_id, rec.name
            assert sorted(child_ids) == sorted(
                r.id for r in stored.values() if r.parent_id == job_id
            ), rec.name

    def wait_quiet(self, *, fire_due_timers: bool = False) -> None:
        """Wait until no tree run is under way (firing timers already due, if asked)."""

        def idle() -> bool:
            if fire_due_timers:
                self.timers.advance(timedelta(0))
            busy: int = self.dispatcher.call(lambda: len(self.dispatcher.runs.tree_runs)).result(
                WAIT
            )
            return busy == 0

        try:
            poll_until("every run to end", idle)
        except WaitTimeout as exc:
            raise WaitTimeout(
                f"{exc}; still under way at {self.clock.now():%H:%M:%S}: "
                f"{self.dispatcher.call(self._in_flight).result(WAIT)}"
            ) from None

    def _in_flight(self) -> list[str]:
        """The tree runs under way, each with what it is at (dispatcher thread)."""
        said = []
        for tr in self.dispatcher.runs.tree_runs.values():
            at = tr.current_task or tr.waiting_frame
            what = "nothing" if at is None else f"{at.node.job.name!r} (run {at.run_id})"
            waiting = " waiting for its time" if tr.waiting_frame is not None else ""
            said.append(f"{tr.root.job.name!r} at {what}{waiting}")
        return said


def _parent_id(node: Node) -> int | None:
    return node.parent.id if node.parent is not None else None


def _copy(rec: JobRecord) -> JobRecord:
    from dataclasses import replace

    return replace(rec, env=dict(rec.env))
