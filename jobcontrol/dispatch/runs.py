"""Tree runs as state machines inside the dispatcher (spec 7.6, 8.1).

A run of a job sub-tree is a chain of frames, one per job being executed: a
box frame walks its children one after another; a task frame waits for its
worker to record the end in the run queue. Nothing here blocks: waiting for a TIMED
child arms a timer, a task is a queued run row. Every function runs on the
dispatcher thread inside its current transaction (``d.tx``).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection

from jobcontrol import events, procs
from jobcontrol.dispatch.tree import Node, sort_key
from jobcontrol.model import (
    ACTIVE_RUN_STATES,
    DISPATCHER_USER,
    KILLED_STATUS,
    BoxType,
    JobState,
    Kind,
    OnError,
    RunRecord,
    RunState,
    Trigger,
)
from jobcontrol.store import lanes, queries, runqueue

if TYPE_CHECKING:
    from jobcontrol.dispatch.dispatcher import Dispatcher

log = logging.getLogger("jobcontrol.dispatch.dispatcher")

# How many of a SEQUENCE box's next tasks are queued ahead of its running task. One lets
# the worker that records a task's end start the next at once; the second keeps that
# chain whole when this dispatcher's reaction to an end comes after the next task's end
# too (a short task, a busy host, PostgreSQL's round trips: one task in five broke it).
AHEAD = 2


@dataclass(eq=False)
class TreeRun:
    """One execution of a sub-tree, timer-fired or manual."""

    root: Node
    top: Node
    trigger: Trigger
    immediate: bool
    requested_by: str
    root_run_id: int | None = None
    fired_at: datetime | None = None  # the time of the timer that started it
    killed: bool = False
    kill_reason: str | None = None  # what its killed task runs record
    current_task: Frame | None = None
    waiting_frame: Frame | None = None


@dataclass(eq=False)
class Frame:
    node: Node
    run_id: int
    parent: Frame | None
    tree_run: TreeRun
    started: datetime
    children: list[Node] = field(default_factory=list)
    index: int = 0
    exit_status: int = 0
    prev: Node | None = None
    waiting: bool = False
    waited_index: int = -1
    # The next tasks of this box queued ahead, in order: (job id, run id), each claimable
    # once the one before it (the first: the box's running task) ends as the box goes on.
    ahead: list[tuple[int, int]] = field(default_factory=list)
    attempt: int = 1  # a task's: which attempt of its job this run is (``retries``)


def final_state(status: int, killed: bool) -> RunState:
    if status == 0:
        return RunState.SUCCEEDED
    if status == KILLED_STATUS and killed:
        return RunState.KILLED
    return RunState.FAILED


def run_info(run_id: int, node: Node, tr: TreeRun, state: RunState, **extra: Any) -> dict[str, Any]:
    return {
        "id": run_id,
        "job_id": node.id,
        "job_name": node.job.name,
        "kind": str(node.job.kind),
        "trigger": str(tr.trigger),
        "state": str(state),
        "root_run_id": tr.root_run_id,
        "requested_by": tr.requested_by,
        **extra,
    }


class Tx:
    """The dispatcher's current transaction and what must wait for its commit."""

    def __init__(self, conn: Connection) -> None:
        self.conn = conn
        self.offers: list[int] = []  # task runs queued, announced to workers after commit
        self.after_commit: list[Callable[[], object]] = []
        # Memory changes to take back should the transaction not commit (the database
        # went away): run newest first, before the dispatcher waits the outage out.
        self.undo: list[Callable[[], object]] = []

    def after(self, fn: Callable[[], object]) -> None:
        self.after_commit.append(fn)

    def on_rollback(self, fn: Callable[[], object]) -> None:
        self.undo.append(fn)

    def rolled_back(self) -> None:
        while self.undo:
            self.undo.pop()()

    def log(self, logger: logging.Logger, msg: str, *args: object) -> None:
        """An INFO line about what this transaction does, written once it is committed.

        The dispatcher holds the database's write lock while it handles; with many trees,
        formatting and writing these lines was a tenth of that time, which every worker's
        claim and finish waited behind. A transaction rolled back leaves no line: its
        events are handled again, and logged then."""
        if logger.isEnabledFor(logging.INFO):
            self.after_commit.append(functools.partial(logger.info, msg, *args))


class TreeRuns:
    """The run part of the dispatcher: tree runs in flight and the frames of their boxes.

    Owned by one ``Dispatcher`` (``d``); run only on its thread, inside a
    handler's transaction (``d.tx``). A finished tree run is handed to the timer
    part (``d.tree_timers.tree_done``) to re-arm its tree.
    """

    def __init__(self, d: Dispatcher) -> None:
        self.d = d
        self.tree_runs: dict[int, TreeRun] = {}  # by the id of the tree's root job
        self.frames: dict[int, Frame] = {}  # by run id: every box or task run in flight
        # The tree runs rooted at a task whose end the current handler reacted to: should
        # it roll back, the rebuild must react to that end again (``held``).
        self.reacted: list[Held] = []
        # While ``task_done`` reacts: the row of the run queued after the task, read with
        # the task's end (``_adopt_ahead`` takes it instead of reading it again).
        self._read_ahead: tuple[int, queries.RunEnd] | None = None
        # While ``_task_ended`` reacts: when the task ended, as its worker recorded it. The
        # boxes that end with it end then too, not when the reaction comes (after an
        # outage, or a dispatcher away, that is later by as long).
        self._ended_at: datetime | None = None

    def start_run(
        self,
        node: Node,
        trigger: Trigger,
        immediate: bool,
        user: str,
        fired_at: datetime | None = None,
    ) -> int:
        tr = TreeRun(
            root=node,
            top=node.top(),
            trigger=trigger,
            immediate=immediate,
            requested_by=user,
            fired_at=fired_at,
        )
        self.tree_runs[node.id] = tr
        self.d.tx.on_rollback(lambda: self._unstart(tr))
        result = self._enter(node, None, tr)
        assert tr.root_run_id is not None
        if result is not None:
            self.d.tree_timers.tree_done(tr, result)
        return tr.root_run_id

    def _unstart(self, tr: TreeRun) -> None:
        """A tree run whose start was never committed: gone from memory, its jobs idle
        again (it started because none of them ran), so that ``/status`` and the tree say
        what the database says while it does not answer."""
        if self.tree_runs.get(tr.root.id) is tr:
            del self.tree_runs[tr.root.id]
        for run_id, frame in list(self.frames.items()):
            if frame.tree_run is tr:
                del self.frames[run_id]
                frame.node.state, frame.node.started, frame.node.run_id = JobState.IDLE, None, None

    def _enter(self, node: Node, parent: Frame | None, tr: TreeRun) -> int | None:
        """Start one job of a run; its status if it finished at once, None if it is under way."""
        now = self.d.clock.now()
        job = node.job
        if parent is not None and not job.active:
            if tr.immediate:  # a manual run records what it skipped (DESIGN decision 2)
                self.insert_run(node, parent, tr, RunState.SKIPPED, now, reason="inactive")
            return 0
        is_task = job.kind is Kind.TASK
        adopted = self._adopt_ahead(node, parent) if is_task else None
        if adopted is not None:
            run_id, end = adopted
            state = end.state
            if end.started is not None:  # it ran from then: the job's last run, duration
                now = min(end.started, now)
        else:
            state = RunState.QUEUED if is_task else RunState.RUNNING
            run_id = self.insert_run(node, parent, tr, state, now)
        if parent is None:
            tr.root_run_id = run_id
        frame = Frame(node=node, run_id=run_id, parent=parent, tree_run=tr, started=now)
        self.frames[run_id] = frame
        self.d.set_job_state(node, JobState.RUNNING, now, run_id)
        shown = RunState.QUEUED if state.is_final else state
        self.d.tx.after(
            lambda: events.run_started.send(self.d, run=run_info(run_id, node, tr, shown))
        )
        if is_task:
            self.d.tx.log(log, "Running Task %s", job.name)
            tr.current_task = frame
            if adopted is not None and state.is_final:
                # It ran and ended before we got here: settled as any task's end is
                # (retried, a worker's kill or loss counted), at the time it ended,
                # which the boxes that end with it take too.
                outer = self._ended_at
                self._ended_at = end.ended or outer
                try:
                    return self._settle(frame, end)
                finally:
                    if outer is None:
                        self._ended_at = None
            if tr.killed:
                # Taken ahead by a worker as the kill came (``_after_child``): killed now,
                # and the tree run ends with its end.
                self._kill_task(frame, tr.kill_reason or "killed")
                return None
            if state is RunState.QUEUED:
                self.d.tx.offers.append(run_id)
            self._queue_ahead(frame)
            return None
        log.debug("Entering Box %s", job.name)
        frame.children = sorted(node.children, key=sort_key)
        log.debug("Child jobs are: %s", [c.job.name for c in frame.children])
        return self._advance(frame)

    def insert_run(
        self,
        node: Node,
        parent: Frame | None,
        tr: TreeRun,
        state: RunState,
        now: datetime,
        reason: str | None = None,
        after: tuple[int, bool] | None = None,
        attempt: int = 1,
    ) -> int:
        job = node.job
        values: dict[str, Any] = {
            "job_id": job.id,
            "job_name": job.name,
            "kind": job.kind,
            "trigger": tr.trigger,
            "state": state,
            "parent_run_id": parent.run_id if parent else None,
            "root_run_id": tr.root_run_id,
            "queue": job.queue,
            "priority": job.priority,
            "created": now,
            "requested_by": tr.requested_by,
            "reason": reason,
        }
        if state is RunState.SKIPPED:
            values.update(ended=now, started=now, duration_ms=0, exit_status=0)
        elif job.kind is Kind.TASK:
            values.update(
                command=job.command,
                cwd=job.cwd,
                env=job.env,
                timeout_s=job.timeout_s,
                max_log_files=job.max_log_files,
            )
            values["attempt"] = attempt
            if after is not None:
                values.update(after_run_id=after[0], after_ok_only=after[1])
        else:
            values["started"] = now
        return queries.insert_run(self.d.tx.conn, values)

    # ------------------------------------------------------------ queued ahead

    def _queue_ahead(self, task: Frame) -> None:
        """Queue the box's next tasks now (up to ``AHEAD``), each claimable once the one
        before it ends as the box goes on.

        The worker that records a task's end claims the next in the same transaction
        and starts it at once; this dispatcher adopts that run when it reacts, so the
        tree's semantics stay here (DESIGN "Components"). Two deep, the worker's chain
        holds while this reaction comes after the next task's end too.
        """
        box, tr = task.parent, task.tree_run
        if box is None or tr.killed:
            return
        if box.node.job.box_type is BoxType.TIMED and not tr.immediate:
            return  # its children may have to wait for their times
        now = self.d.clock.now()
        while len(box.ahead) < AHEAD:
            at = box.index + 1 + len(box.ahead)
            if at >= len(box.children):
                return
            nxt = box.children[at]
            if nxt.parent is not box.node or nxt.job.kind is not Kind.TASK or not nxt.job.active:
                return
            if box.ahead:  # after a task queued ahead itself: its first attempt
                before, attempt, after_run = box.children[at - 1], 1, box.ahead[-1][1]
            else:
                before, attempt, after_run = task.node, task.attempt, task.run_id
            # A task that may be retried releases its next only by succeeding: a failure
            # it has retries left for is not the end its box goes on after.
            ok_only = box.node.job.on_error is OnError.ABORT or attempt <= before.job.retries
            run_id = self.insert_run(
                nxt, box, tr, RunState.PENDING, now, after=(after_run, ok_only)
            )
            box.ahead.append((nxt.id, run_id))

    def _adopt_ahead(self, node: Node, box: Frame | None) -> tuple[int, queries.RunEnd] | None:
        """The run queued ahead for ``node``, released by its predecessor's end; else None."""
        if box is None or not box.ahead:
            return None
        job_id, run_id = box.ahead.pop(0)
        if job_id == node.id:
            seen, self._read_ahead = self._read_ahead, None
            if seen is not None and seen[0] == run_id:
                row: queries.RunEnd | None = seen[1]
            else:
                row = queries.run_end(self.d.tx.conn, run_id)
            if row is not None and row.state is not RunState.PENDING:
                return run_id, row
        # Not released (its predecessor was settled, not finished) or not the one due:
        # neither are those queued after it.
        self._cancel_ahead(run_id)
        self._cancel_aheads(box)
        return None

    def _cancel_aheads(self, box: Frame) -> None:
        """Every run queued ahead in ``box``: none of them must run."""
        aheads, box.ahead = box.ahead, []
        for _, run_id in aheads:
            self._cancel_ahead(run_id)

    def _cancel_ahead(self, run_id: int) -> None:
        """A run queued ahead must not run: forget it while no worker has it (pending, or
        released by its predecessor's end but not claimed: it never was a run of its
        own, and never shows in history), or stop it if a worker has it."""
        conn = self.d.tx.conn
        if not queries.drop_pending(conn, run_id) and not queries.drop_released_aheads(
            conn, run_id
        ):
            self._stop_task_run(run_id, "cancelled: its box stopped before it")

    def drop_aheads(
        self, tr: TreeRun | None = None, *, pending_only: bool = False, keep_taken: bool = False
    ) -> None:
        """Forget the runs queued ahead (of one tree run, or every one). ``pending_only``:
        those not yet released; ``keep_taken``: all but those a worker claimed."""
        conn = self.d.tx.conn
        for frame in list(self.frames.values()):
            if not frame.ahead or (tr is not None and frame.tree_run is not tr):
                continue
            kept = []
            for job_id, run_id in frame.ahead:
                if queries.drop_pending(conn, run_id):
                    continue
                if keep_taken and queries.drop_released_aheads(conn, run_id):
                    continue
                if queries.run_end(conn, run_id) is None:
                    # Gone already: an edit takes every pending run away in its own
                    # commit, before this reaction (``service/engine.py``). Forgotten
                    # now, before SQLite gives its id to the next run inserted (it
                    # reuses the largest).
                    continue
                if pending_only or keep_taken:
                    kept.append((job_id, run_id))  # claimed already: it runs
                else:
                    self._cancel_ahead(run_id)
            frame.ahead = kept

    def _advance(self, frame: Frame) -> int | None:
        """Run a box's children in order from ``frame.index``; its status when it is done."""
        tr = frame.tree_run
        while frame.index < len(frame.children):
            child = frame.children[frame.index]
            if child.parent is not frame.node:
                # Deleted or moved away since the box started: no longer this box's to run.
                frame.index += 1
                continue
            if self._must_wait(frame, child):
                self._wait(frame, child)
                return None
            status = self._enter(child, frame, tr)
            if status is None:
                return None
            if self._after_child(frame, child, status):
                break
        return self._finish(frame)

    def _must_wait(self, frame: Frame, child: Node) -> bool:
        box = frame.node.job
        if frame.tree_run.immediate or box.box_type is not BoxType.TIMED:
            return False
        if frame.waited_index == frame.index:
            return False  # an inactive child too is waited for, then skipped (spec 7.6)
        due = child.job.next_runs
        ref = (
            box.next_runs
            if frame.index == 0
            else (frame.prev.job.next_runs if frame.prev else None)
        )
        # Spec 7.6: a comparison with a null NextRuns is false, so no wait.
        return due is not None and ref is not None and due > ref and due > self.d.clock.now()

    def _wait(self, frame: Frame, child: Node) -> None:
        due = child.job.next_runs
        assert due is not None
        log.debug("Waiting to run %s", child.job.name)
        frame.waiting = True
        frame.tree_run.waiting_frame = frame
        queries.transition_run(
            self.d.tx.conn, frame.run_id, [RunState.RUNNING], {"state": RunState.WAITING}
        )
        self.d.set_job_state(frame.node, JobState.WAITING, frame.started, frame.run_id)
        self.d.timers.arm(
            ("wait", frame.run_id), due, lambda: self.d.post_wait_elapsed(frame.run_id)
        )

    def rewait(self, tops: set[int]) -> None:
        """An edit re-evaluated the trees of ``tops``: a TIMED box of a run of theirs in
        flight that waits for a child waits for that child's time as it is now (its timer
        edited, as ``ls`` shows it), or no more if the child left the box or has no time."""
        for tr in list(self.tree_runs.values()):
            frame = tr.waiting_frame
            if tr.top.id not in tops or frame is None or not frame.waiting:
                continue
            child = frame.children[frame.index]
            due = child.job.next_runs if child.parent is frame.node else None
            key = ("wait", frame.run_id)
            self.d.timers.cancel(key)
            elapsed = functools.partial(self.d.post_wait_elapsed, frame.run_id)
            if due is None or due <= self.d.clock.now():
                self.d.tx.after(elapsed)
            else:
                self.d.timers.arm(key, due, elapsed)

    def wait_elapsed(self, run_id: int) -> None:
        frame = self.frames.get(run_id)
        if frame is None or not frame.waiting:
            return
        frame.waiting = False
        frame.waited_index = frame.index
        frame.tree_run.waiting_frame = None
        queries.transition_run(
            self.d.tx.conn, run_id, [RunState.WAITING], {"state": RunState.RUNNING}
        )
        self.d.set_job_state(frame.node, JobState.RUNNING, frame.started, run_id)
        result = self._advance(frame)
        if result is not None:
            self._propagate(frame, result)

    def _after_child(self, frame: Frame, child: Node, status: int) -> bool:
        """Fold a child's status into its box; True when the box must stop here."""
        if status and not frame.exit_status:
            frame.exit_status = status  # the first non-zero status is the box's
        if frame.tree_run.killed:
            frame.exit_status = KILLED_STATUS
            if self._next_taken(frame):
                # The task after this one was taken with its end before the kill reached
                # it: it runs, and is the tree run's to kill and wait for (``_enter``),
                # not the box's to forget while it runs.
                frame.prev = child
                frame.index += 1
                return False
            log.debug("Stopping at %s because process has been killed", child.job.name)
            return True
        if status and frame.node.job.on_error is OnError.ABORT:
            log.debug(
                "Box %s will not continue past child %s whose exit status was %s",
                frame.node.job.name,
                child.job.name,
                status,
            )
            return True
        frame.prev = child
        frame.index += 1
        return False

    def _next_taken(self, box: Frame) -> bool:
        """Whether the run queued ahead as the box's next task was claimed by a worker
        (running, or ended already), not merely released or still pending."""
        if not box.ahead:
            return False
        row = queries.run_end(self.d.tx.conn, box.ahead[0][1])
        return row is not None and row.state not in (RunState.PENDING, RunState.QUEUED)

    def _finish(
        self,
        frame: Frame,
        status: int | None = None,
        recorded: RunState | None = None,
        row: RunRecord | queries.RunEnd | None = None,
        *,
        ran: bool = True,
    ) -> int:
        """Record a job's end (spec 7.6 ``finally``); returns its status.

        ``recorded``: the state a task's run row already says (its worker wrote it);
        ``row``: that row, whose CPU time and peak memory the finished event carries.
        ``ran``: False for a task cancelled while queued: its duration is 0, as its run
        row's (the time it waited for a slot is no run of it).
        """
        node, tr = frame.node, frame.tree_run
        self._cancel_aheads(frame)
        status = frame.exit_status if status is None else status
        if tr.killed and node.job.kind is Kind.BOX:
            status = KILLED_STATUS
        now = self.d.clock.now()
        if self._ended_at is not None:  # never before it started, nor after now (a clock
            now = max(frame.started, min(now, self._ended_at))  # skewed elsewhere)
        duration = max(0, int((now - frame.started).total_seconds() * 1000)) if ran else 0
        job = node.job
        job.last_ran, job.exit_status, job.last_duration_ms = frame.started, status, duration
        conn = self.d.tx.conn
        queries.write_job_result(conn, job.id, frame.started, status, duration)
        state = recorded or final_state(status, tr.killed)
        if job.kind is Kind.BOX:
            values: dict[str, Any] = {
                "state": state,
                "exit_status": status,
                "ended": now,
                "duration_ms": duration,
            }
            if tr.killed and tr.kill_reason is not None:
                values["reason"] = tr.kill_reason  # who killed it, as its task's row says
            queries.transition_run(conn, frame.run_id, [RunState.RUNNING, RunState.WAITING], values)
        self.frames.pop(frame.run_id, None)
        self.d.set_job_state(node, JobState.IDLE, None, None)
        info = run_info(frame.run_id, node, tr, state, exit_status=status, duration_ms=duration)
        if job.kind is Kind.TASK:
            info["attempt"] = frame.attempt
        if row is not None:
            info.update(cpu_us=row.cpu_us, mem_peak_bytes=row.mem_peak_bytes)
        self.d.tx.after(lambda: events.run_finished.send(self.d, run=info))
        self.d.tx.log(log, "Job %s completed exit status %s", job.name, status)
        return status

    def _propagate(self, frame: Frame, result: int) -> None:
        """A job finished out of line: let its boxes go on, up to the end of the run."""
        while frame.parent is not None:
            parent = frame.parent
            stop = self._after_child(parent, frame.node, result)
            outcome = self._finish(parent) if stop else self._advance(parent)
            if outcome is None:
                return
            frame, result = parent, outcome
        self.d.tree_timers.tree_done(frame.tree_run, result)

    def task_done(self, run_id: int) -> None:
        """A worker recorded a task's end (or a wake-up says so): react to what the row says."""
        frame = self.frames.get(run_id)
        if frame is None:
            return  # handled already (a wake-up and the back-up poll can both report it)
        box = frame.parent
        ahead = box.ahead[0][1] if box is not None and box.ahead else None
        conn = self.d.tx.conn
        if ahead is None:
            row = queries.run_end(conn, run_id)
        else:
            # The run queued after this task too: its end released it in the same commit,
            # so one read sees both, and the box's advance adopts it without another.
            ends = queries.two_run_ends(conn, run_id, ahead)
            row = ends.get(run_id)
            if ahead in ends:
                self._read_ahead = (ahead, ends[ahead])
        try:
            if row is None or row.state in ACTIVE_RUN_STATES:
                return  # not ended yet
            self._task_ended(frame, row)
        finally:
            self._read_ahead = None

    def _task_ended(self, frame: Frame, row: RunRecord | queries.RunEnd) -> None:
        if frame.parent is None:
            self.reacted.append((frame.tree_run, frame))
        # The boxes that end with it end when it ended, as its worker recorded it, not
        # when the reaction comes (after an outage, or a dispatcher away, that is later).
        self._ended_at = row.ended
        try:
            status = self._settle(frame, row)
            if status is not None:
                self._propagate(frame, status)
        finally:
            self._ended_at = None

    def _settle(self, frame: Frame, row: RunRecord | queries.RunEnd) -> int | None:
        """A task run's recorded end: its status, or None when it is retried (its box
        waits for the retry's end)."""
        if row.state is RunState.LOST:
            # Recorded lost by its worker: one restarted under its name settles what its
            # killed process held, before the lease would have. An unexpected worker
            # end all the same (the WLM rule), or a worker crashing under a supervisor
            # that restarts it at once would never stop its lane.
            full = queries.get_run(self.d.tx.conn, frame.run_id)
            if full is not None:
                self.stop_lanes_after_worker_ends([full])
        if self._retry(frame, row.state, row.exit_status):
            return None
        tr = frame.tree_run
        if row.state is RunState.KILLED and not tr.killed:
            # Killed on purpose by its worker (a stop with --kill, of the daemon or of a
            # worker process): the tree run is killed, as ``kill`` would have it, and its
            # boxes record the kill, whether the dispatcher heard of it now or at its
            # next start (an end kept on disk through an outage, ``worker/keptends.py``).
            tr.killed = True
            tr.kill_reason = self._reason_of(frame, row)  # its boxes say why, as it does
            self.drop_aheads(tr)
        tr.current_task = None
        # The task's own outcome stands: the worker records 255 when it killed the
        # task; one that ended just before a kill keeps its status (its run row says
        # so too), while its boxes still record the kill (_after_child, _finish).
        status = KILLED_STATUS if row.exit_status is None else row.exit_status
        self._ran_from(frame, row.started)
        return self._finish(frame, status, row.state, row)

    def _reason_of(self, frame: Frame, row: RunRecord | queries.RunEnd) -> str | None:
        """The reason a task run's row gives (a kill's: who or what killed it). An end
        read on the hot path (``RunEnd``) leaves it out: read here, only for a kill."""
        if isinstance(row, RunRecord):
            return row.reason
        full = queries.get_run(self.d.tx.conn, frame.run_id)
        return None if full is None else full.reason

    def _ran_from(self, frame: Frame, started: datetime | None) -> None:
        """The job ran from its worker's start, not from its queueing: a task run that
        waited for a slot or a lane counts only its run in the job's duration. Never
        after now (a worker's clock ahead of ours): the job's ``last_ran`` marks the
        reaction for start-up recovery (README, "Crash recovery")."""
        if started is not None:
            frame.started = max(frame.started, min(started, self.d.clock.now()))

    def reconcile(self) -> None:
        """The back-up poll: task runs that ended without a wake-up reaching us."""
        run_ids = [tr.current_task.run_id for tr in self.tree_runs.values() if tr.current_task]
        if not run_ids:
            return
        for run_id, end in queries.ended_runs(self.d.tx.conn, run_ids).items():
            frame = self.frames.get(run_id)
            if frame is not None:
                log.debug("task run %s ended without a wake-up; reacting now", run_id)
                self._task_ended(frame, end)

    def kill_tree_run(self, tr: TreeRun, user: str, reason: str | None = None) -> None:
        """Kill the tree run: its task asked of its worker, or its wait cut short.
        ``reason``: what its run records (default: killed by ``user``)."""
        if tr.killed:
            return
        tr.killed = True
        tr.kill_reason = reason or f"killed by {user}"
        log.debug("Killing run %s for %s", tr.root_run_id, tr.root.job.name)
        # Before the kill: the killed task's end must release nothing. A run a worker
        # already took ahead stays known: the tree run kills it and waits for its end.
        self.drop_aheads(tr, keep_taken=True)
        task = tr.current_task
        if task is not None:
            self._kill_task(task, tr.kill_reason)
            return
        frame = tr.waiting_frame
        if frame is not None:
            self.d.timers.cancel(("wait", frame.run_id))
            frame.waiting = False
            tr.waiting_frame = None
            self._propagate(frame, self._finish(frame, KILLED_STATUS))

    def _kill_task(self, task: Frame, reason: str) -> None:
        """A queued task run is cancelled here; a running one is asked of its worker."""
        if self._stop_task_run(task.run_id, reason):
            task.tree_run.current_task = None
            self._propagate(task, self._finish(task, KILLED_STATUS, ran=False))
        # Otherwise its end is on its way (wake-up or back-up poll).

    def _stop_task_run(self, run_id: int, reason: str) -> bool:
        """Cancel a queued task run (True), or ask its worker to kill a running one."""
        conn, now = self.d.tx.conn, self.d.clock.now()
        killed = {
            "state": RunState.KILLED,
            "exit_status": KILLED_STATUS,
            "ended": now,
            "duration_ms": 0,
            "reason": reason,
        }
        if queries.transition_run(conn, run_id, [RunState.QUEUED], killed):
            return True
        if runqueue.request_kill(conn, run_id):
            store = self.d.store
            self.d.tx.after(lambda: events.kill_requested.send(store, run_id=run_id, reason=reason))
        return False

    # ------------------------------------------------------------ retries

    def _retry(self, frame: Frame, state: RunState, status: int | None) -> bool:
        """Run a failed or lost task again, as a new run of the same tree run, when its
        job's ``retries`` allow it (README "Retries"); False: the end stands."""
        node, tr = frame.node, frame.tree_run
        why_not = self._no_retry(frame, state)
        if why_not is not None:
            if why_not and state in (RunState.FAILED, RunState.LOST):
                log.info("Task %s not retried: %s", node.job.name, why_not)
            return False
        now = self.d.clock.now()
        box = frame.parent
        if box is not None:
            # Queued ahead after this attempt: the next one releases them instead.
            self._cancel_aheads(box)
        attempt = frame.attempt + 1
        run_id = self.insert_run(node, box, tr, RunState.QUEUED, now, attempt=attempt)
        ended = run_info(frame.run_id, node, tr, state, exit_status=status, attempt=frame.attempt)
        self.frames.pop(frame.run_id, None)
        retry = Frame(node=node, run_id=run_id, parent=box, tree_run=tr, started=now)
        retry.attempt = attempt
        self.frames[run_id] = retry
        tr.current_task = retry
        self.d.set_job_state(node, JobState.RUNNING, now, run_id)
        self.d.tx.offers.append(run_id)
        started = run_info(run_id, node, tr, RunState.QUEUED, attempt=attempt)
        self.d.tx.after(lambda: events.run_finished.send(self.d, run=ended))
        self.d.tx.after(lambda: events.run_started.send(self.d, run=started))
        log.warning(
            "Task %s %s (attempt %d of %d): queued again as run %d",
            node.job.name,
            "lost" if state is RunState.LOST else f"failed with exit status {status}",
            frame.attempt,
            node.job.retries + 1,
            run_id,
        )
        self._queue_ahead(retry)
        return True

    def _no_retry(self, frame: Frame, state: RunState) -> str | None:
        """Why this end is not retried ('' when there is nothing to retry); None: retry it."""
        node, tr = frame.node, frame.tree_run
        if state not in (RunState.FAILED, RunState.LOST):
            return ""  # succeeded, or killed by an operator: never retried
        if frame.attempt > node.job.retries:
            return "" if not node.job.retries else f"its {node.job.retries} retries are used"
        if tr.killed:
            return "its tree run was killed"
        if self.d.tree_timers.paused:
            return "timers are paused (held)"
        for n in (node, *node.ancestors()):
            if n is tr.root and tr.immediate:
                break  # a manual run may be of an inactive job: what it ran was active
            if not n.job.active:
                return f"{n.job.name} is inactive"
            if n is tr.root:
                break
        return None

    # ------------------------------------------------------------ leases

    def settle_expired(self, local_host: str) -> None:
        """Runs whose worker stopped renewing its lease are lost; their trees go on. Once
        committed, ``events.runs_lost`` names those of this host, to be collected."""
        conn, now = self.d.tx.conn, self.d.clock.now()
        settled: list[RunRecord] = []
        gone: dict[str | None, str] = {}  # what is known of a worker of this host
        for row in runqueue.expired_leases(conn, now):
            local = row.host == local_host
            if local and row.worker not in gone:
                gone[row.worker] = _process_gone(conn, row.worker)
            expired = (
                f"worker {row.worker} stopped renewing its lease "
                f"(expired {row.lease_until:%Y-%m-%d %H:%M:%S} UTC{gone.get(row.worker, '')})"
            )
            state = RunState.LOST
            if not row.kill_requested:
                reason = f"lost: {expired}"
            elif local:
                # A kill was asked of its worker, which never carried it out: it is killed
                # all the same, by the collection after commit, and recorded as the kill
                # it was.
                state = RunState.KILLED
                reason = f"killed: {expired} before it carried out the kill; killed on {row.host}"
            else:
                reason = f"lost: {expired} before it carried out the kill requested"
            if not self._settle_lost(row, reason, now, state):
                continue
            settled.append(row)
            log.warning("task run %s (%s) %s", row.id, row.job_name, reason)
            frame = self.frames.get(row.id)
            if frame is not None and not self._retry(frame, state, KILLED_STATUS):
                frame.tree_run.current_task = None
                self._ran_from(frame, row.started)
                self._propagate(frame, self._finish(frame, KILLED_STATUS, state))
        if settled:
            runqueue.lease_lapsed(conn, [r.worker for r in settled if r.worker is not None])
            self.stop_lanes_after_worker_ends(settled)
        # Provably this host's: nothing of them may keep running.
        collect = [r.id for r in settled if r.host == local_host]
        if collect:
            store = self.d.store
            self.d.tx.after(lambda: events.runs_lost.send(store, run_ids=collect))

    def stop_lanes_after_worker_ends(self, lost: list[RunRecord]) -> None:
        """Count the workers these lost runs say died; STOP a lane that saw too many (the
        WLM rule, README "Lanes"), announced once committed."""
        conn, now = self.d.tx.conn, self.d.clock.now()
        stopped = lanes.stop_after_worker_ends(conn, lanes.record_worker_ends(conn, lost, now), now)
        for name in stopped:
            log.warning("lane %s STOPPED after repeated unexpected worker ends", name)
        if stopped:
            store = self.d.store
            self.d.tx.after(lambda: events.lanes_changed.send(store, names=stopped))

    def _settle_lost(
        self, row: RunRecord, reason: str, now: datetime, state: RunState = RunState.LOST
    ) -> bool:
        values = runqueue.lost_end(row, reason, now, state)
        return queries.transition_run(self.d.tx.conn, row.id, [row.state], values)

    # ------------------------------------------------------------ resuming from the database

    def resume_tree_runs(self) -> list[Callable[[], None]]:
        """Rebuild every tree run in flight from its run rows (after an outage).

        Returns the steps still to take (a child that ended meanwhile, a box to go
        on with), to be run once every tree run is back in memory.
        """
        rows = queries.unfinished_tree_runs(self.d.tx.conn)
        kids: dict[int, list[RunRecord]] = {}
        for row in rows:
            if row.parent_run_id is not None:
                kids.setdefault(row.parent_run_id, []).append(row)
        steps: list[Callable[[], None]] = []
        for root in (r for r in rows if r.parent_run_id is None):
            node = self.d.tree.get(root.job_id) if root.job_id is not None else None
            if node is None:
                self._settle_lost(root, "lost: its job no longer exists", self.d.clock.now())
                continue
            killed = any(r.kill_requested for r in rows if r.root_run_id == root.id)
            tr = self.tree_runs[node.id] = _tree_run_of(root, node, killed)
            self._resume_frame(root, node, None, tr, kids, steps)
        return steps

    def _resume_frame(
        self,
        row: RunRecord,
        node: Node,
        parent: Frame | None,
        tr: TreeRun,
        kids: dict[int, list[RunRecord]],
        steps: list[Callable[[], None]],
    ) -> None:
        frame = Frame(
            node, row.id, parent, tr, started=row.started or row.created or self.d.clock.now()
        )
        self.frames[row.id] = frame
        waiting = row.state is RunState.WAITING
        self.d.set_job_state(
            node, JobState.WAITING if waiting else JobState.RUNNING, frame.started, row.id
        )
        if node.job.kind is Kind.TASK:
            frame.attempt = row.attempt
            tr.current_task = frame
            if row.state is RunState.QUEUED:
                self.d.tx.offers.append(row.id)  # announced again: the wake-up may be gone
            elif row.state not in ACTIVE_RUN_STATES:
                steps.append(lambda: self._task_ended(frame, row))
            return
        frame.children = sorted(node.children, key=sort_key)
        # This box's child runs so far, oldest first; of a retried task, its last attempt.
        done = _last_attempts(kids.get(row.id, []))
        last = done[-1] if done else None
        at = _child_index(frame, last.job_id) if last is not None else None
        if last is not None and at is None:
            # Its last child moved away since: nothing of this box is left to run.
            self._fold_resumed(frame, done)
            frame.index = len(frame.children)
            steps.append(lambda: self._go_on(frame, self._advance(frame)))
            return
        if waiting:
            # The box waits for a child after the last one it ran (an inactive one
            # leaves no run row): wait again from there; a time passed goes on at once.
            self._fold_resumed(frame, done)
            frame.prev = frame.children[at] if at is not None else None
            frame.index = 0 if at is None else at + 1
            self._resume_wait(frame)
            return
        if last is None or at is None:
            steps.append(lambda: self._go_on(frame, self._advance(frame)))
            return
        self._fold_resumed(frame, done[:-1])
        frame.index = at
        last_node = frame.children[at]
        if len(done) > 1:
            before = _child_index(frame, done[-2].job_id)
            frame.prev = frame.children[before] if before is not None else None
        if last.state in ACTIVE_RUN_STATES or last_node.job.kind is Kind.TASK:
            # A task that ended under a box still running is an end not yet reacted
            # to (the reaction would have gone on past it): react to it as to any end,
            # so it is retried, recorded and announced, not only folded into its box.
            self._resume_frame(last, last_node, frame, tr, kids, steps)
            return
        status = last.exit_status or 0

        def child_ended() -> None:
            stop = self._after_child(frame, last_node, status)
            self._go_on(frame, self._finish(frame) if stop else self._advance(frame))

        steps.append(child_ended)

    def held(self) -> list[Held]:
        """Each tree run rooted at a task, with the task run it waits on: those in memory,
        and those whose end a handler that then rolled back reacted to. Read before a
        rebuild (``resume_ended``); what a rolled-back handler started cannot pass its
        checks, as its rows do not exist."""
        in_memory = [
            (tr, task)
            for tr in self.tree_runs.values()
            if (task := tr.current_task) is not None and task.parent is None
        ]
        return self.reacted + in_memory

    def resume_ended(self, held: list[Held]) -> list[Callable[[], None]]:
        """Tree runs whose root task ended while the dispatcher was away (after an outage).

        Their end is recorded on the run row, so the database no longer shows them in
        flight; but nothing reacted to it: no outcome announced, no job result, no retry,
        no re-arming. Brought back from what was ``held`` before the rebuild; returns
        the reactions to take once every tree run is back in memory.
        """
        steps: list[Callable[[], None]] = []
        for old, task in held:
            node = self.d.tree.get(old.root.id)
            if node is None or node.id in self.tree_runs:
                continue  # its job is gone, or it is in flight again (resumed)
            row = queries.get_run(self.d.tx.conn, task.run_id)
            if row is None or row.job_id != node.id or row.state in ACTIVE_RUN_STATES:
                continue
            tr = TreeRun(
                root=node,
                top=node.top(),
                trigger=old.trigger,
                immediate=old.immediate,
                requested_by=old.requested_by,
                root_run_id=old.root_run_id,
                fired_at=old.fired_at,
                killed=row.kill_requested,
            )
            self.tree_runs[node.id] = tr
            log.info("task run %s (%s) ended while the database was away", row.id, row.job_name)
            self._resume_frame(row, node, None, tr, {}, steps)
        return steps

    def resume_unreacted(self) -> list[Callable[[], None]]:
        """Tree runs rooted at a task that ended while no dispatcher ran (at start-up).

        Its worker recorded the end, but no dispatcher was there to react: no job result,
        no retry, no outcome announced. The job's result is the mark of a reaction: its
        ``last_ran`` is the start of the run last reacted to as the dispatcher saw it
        (when it queued the run, or the run's own start when it took the run up after an
        outage), never before that run was created. A newest root run created after it
        has not been reacted to: it is brought back and its end reacted to now.
        """
        steps: list[Callable[[], None]] = []
        for row in queries.newest_ended_task_roots(self.d.tx.conn):
            node = self.d.tree.get(row.job_id) if row.job_id is not None else None
            if node is None or node.job.kind is not Kind.TASK:
                continue  # its job is gone, or is a box now
            if any(tr.top is node.top() for tr in self.tree_runs.values()):
                continue  # its tree is in flight again (a newer run, resumed)
            last = node.job.last_ran
            if last is not None and (row.created is None or row.created <= last):
                continue  # reacted to
            tr = self.tree_runs[node.id] = _tree_run_of(row, node, row.kill_requested)
            log.warning(
                "task run %s (%s) ended while no dispatcher ran: reacting to its end now",
                row.id,
                row.job_name,
            )
            self._resume_frame(row, node, None, tr, {}, steps)
        return steps

    def _fold_resumed(self, frame: Frame, ended: list[RunRecord]) -> None:
        """Fold a resumed box's ended children into its status, and record the job result
        of each task among them that nothing reacted to: a sequence's tasks queued ahead
        ran one after another while no dispatcher was there (an outage, a crash), each
        end recorded by its worker, and the box goes on from the last. The job's result
        is the mark of a reaction (``last_ran`` not before the run was created)."""
        self._fold(frame, ended)
        conn, tr = self.d.tx.conn, frame.tree_run
        for kid in ended:
            node = self.d.tree.get(kid.job_id) if kid.job_id is not None else None
            if node is None or node.job.kind is not Kind.TASK or kid.kind is not Kind.TASK:
                continue
            if kid.state in ACTIVE_RUN_STATES or kid.state is RunState.SKIPPED:
                continue
            job, started = node.job, kid.started or kid.created
            if started is None or (
                job.last_ran is not None and kid.created is not None and kid.created <= job.last_ran
            ):
                continue  # reacted to
            status = KILLED_STATUS if kid.exit_status is None else kid.exit_status
            duration = kid.duration_ms or 0
            job.last_ran, job.exit_status, job.last_duration_ms = started, status, duration
            queries.write_job_result(conn, job.id, started, status, duration)
            info = run_info(kid.id, node, tr, kid.state, exit_status=status, duration_ms=duration)
            info.update(attempt=kid.attempt, cpu_us=kid.cpu_us, mem_peak_bytes=kid.mem_peak_bytes)
            self.d.tx.after(lambda info=info: events.run_finished.send(self.d, run=info))  # type: ignore[misc]
            self.d.tx.log(
                log,
                "Job %s completed exit status %s (ended while the dispatcher was away)",
                job.name,
                status,
            )

    @staticmethod
    def _fold(frame: Frame, ended: list[RunRecord]) -> None:
        """A box's status so far: the first non-zero status of the children that ended."""
        for kid in ended:
            if kid.exit_status and not frame.exit_status:
                frame.exit_status = kid.exit_status

    def _resume_wait(self, frame: Frame) -> None:
        frame.waiting = True
        frame.tree_run.waiting_frame = frame
        child = frame.children[frame.index] if frame.index < len(frame.children) else None
        due = child.job.next_runs if child is not None else None
        run_id = frame.run_id
        self.d.timers.arm(
            ("wait", run_id), due or self.d.clock.now(), lambda: self.d.post_wait_elapsed(run_id)
        )

    def _go_on(self, frame: Frame, result: int | None) -> None:
        if result is not None:
            self._propagate(frame, result)


# A tree run whose root is a task, with the task run it waits on.
Held = tuple[TreeRun, Frame]


def _last_attempts(rows: list[RunRecord]) -> list[RunRecord]:
    """``rows`` without the attempts a later attempt of the same job replaced (``retries``):
    a box goes on after the last attempt's outcome only."""
    last = {r.job_id: r.id for r in rows}  # oldest first: the last wins
    return [r for r in rows if last[r.job_id] == r.id]


def _child_index(frame: Frame, job_id: int | None) -> int | None:
    for i, child in enumerate(frame.children):
        if child.id == job_id:
            return i
    return None


def _tree_run_of(root: RunRecord, node: Node, killed: bool) -> TreeRun:
    """The tree run rooted at run row ``root`` of job ``node``, as its rows tell it."""
    return TreeRun(
        root=node,
        top=node.top(),
        trigger=root.trigger,
        immediate=root.trigger is Trigger.MANUAL,
        requested_by=root.requested_by or DISPATCHER_USER,
        root_run_id=root.id,
        fired_at=root.created,
        killed=killed,
    )


def _process_gone(conn: Connection, name: str | None) -> str:
    """``: its process N is gone`` for a worker of this host whose process no longer runs
    (killed with SIGKILL, crashed): what the operator wants to hear first, rather than
    the lease alone. '' when it runs (stopped by SIGSTOP, stuck) or is not known."""
    row = runqueue.get_worker(conn, name) if name is not None else None
    if row is None or row.get("pid") is None:
        return ""
    pid = int(row["pid"])
    if procs.pid_alive(pid):
        start = procs.start_time(pid)
        if start is None or row.get("proc_start") is None or start == row["proc_start"]:
            return ""
    return f"; its process {pid} is gone"
