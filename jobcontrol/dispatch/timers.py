"""Timers of top-level trees (spec 6, 7.9): arm, cancel, fire, re-arm after a run.

One part of ``Dispatcher`` (composed, not mixed in): it calls the run part
(``d.runs``) to start a tree's run, and the run part calls ``tree_done`` back.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jobcontrol.dispatch.dispatcher import Dispatcher

from jobcontrol import events
from jobcontrol.dispatch.runs import TreeRun
from jobcontrol.dispatch.tree import Evaluator, Node
from jobcontrol.model import (
    TIMER_USER,
    OnError,
    Restarted,
    RunState,
    Trigger,
)
from jobcontrol.store import queries

log = logging.getLogger("jobcontrol.dispatch.dispatcher")


@dataclass
class Armed:
    """A top-level tree's armed timer: when, and what the run it starts is recorded as."""

    when: datetime
    trigger: Trigger
    by: str = TIMER_USER  # who the run is recorded as requested by (the restarting user)
    # When it was armed: a time already past then (a misfire's catch-up after a pause,
    # a stop or an outage) is due at once, not late (``Lateness``).
    armed_at: datetime | None = None


class Lateness:
    """How late timers fired: the most a fire was handled after its time (or after it was
    armed, for a time already past then), within the last ``window`` to twice that (two
    buckets: the last minute), for health and metrics. Written by the dispatcher thread
    at each fire, read by any thread."""

    def __init__(self, window: float = 30.0) -> None:
        self.window = window
        self._lock = threading.Lock()
        self._began = time.monotonic()
        self._now = 0.0  # the worst of the bucket that began at ``_began``
        self._before = 0.0  # the worst of the bucket before it

    def record(self, late: float) -> None:
        with self._lock:
            self._roll(time.monotonic())
            self._now = max(self._now, late)

    def worst(self) -> float:
        """Seconds: the most a timer fired after its time in the last minute."""
        with self._lock:
            self._roll(time.monotonic())
            return max(self._now, self._before)

    def _roll(self, now: float) -> None:
        age = now - self._began
        if age < self.window:
            return
        self._before = self._now if age < 2 * self.window else 0.0
        self._now = 0.0
        self._began = now


class TreeTimers:
    """The timer part of the dispatcher: the armed timers of top-level trees, pause and resume.

    Owned by one ``Dispatcher`` (``d``) and, like the rest of it, run only on the
    dispatcher thread inside a handler's transaction (``d.tx``); the public
    requests (``pause_timers``, ``resume_timers``, ``status``) hop onto that thread
    themselves; ``Dispatcher`` offers them to other threads.
    """

    def __init__(self, d: Dispatcher) -> None:
        self.d = d
        self.armed: dict[int, Armed] = {}
        # While paused, ``armed`` still records every tree's due time but no timer is set.
        self._timers_paused = False
        self.lateness = Lateness()

    def evaluator(self, *, from_now: bool = False) -> Evaluator:
        return Evaluator(now=self.d.clock.now(), default_tz=self.d.default_tz, from_now=from_now)

    def write_evaluation(self, ev: Evaluator) -> None:
        if not ev.changed:
            return
        rows = [(n.id, n.job.next_runs, n.job.job_order) for n in ev.changed.values()]
        queries.write_schedule(self.d.tx.conn, rows)
        jobs = [n.job for n in ev.changed.values()]
        self.d.tx.after(lambda: events.jobs_evaluated.send(self.d, jobs=jobs))

    def arm(self, top: Node, due: datetime, trigger: Trigger, by: str = TIMER_USER) -> None:
        self.armed[top.id] = Armed(due, trigger, by, self.d.clock.now())
        self._schedule_event(top, due)
        if self._timers_paused:
            self.d.tx.log(log, "Timers paused: job %s recorded to run at %s", top.job.name, due)
            return
        top_id = top.id
        self.d.tx.log(log, "Starting timer for job %s : runs at %s", top.job.name, due)
        self.d.timers.arm(
            ("tree", top_id),
            due,
            lambda: self.d.post((lambda: self._timer_fired(top_id, due), None)),
        )

    # ------------------------------------------------------------ pause / resume

    @property
    def paused(self) -> bool:
        """Whether timers are paused (trees stay scheduled, nothing fires)."""
        return self._timers_paused

    def pause_timers(self) -> int:
        """Stop every timer from firing; runs in flight go on. Returns how many were armed."""

        def handler() -> int:
            if not self._timers_paused:
                # Kept in the database: a daemon restarted meanwhile (a crash, an upgrade)
                # keeps the trees held, as the operator left them.
                queries.set_meta(
                    self.d.tx.conn, queries.TIMERS_PAUSED, self.d.clock.now().isoformat()
                )
                self._timers_paused = True
                for top_id in self.armed:
                    self.d.timers.cancel(("tree", top_id))
                log.info("Timers paused (%d armed)", len(self.armed))
            return len(self.armed)

        return int(self.d.ask(handler))

    def hold_at_start(self) -> None:
        """Timers paused before this daemon started stay paused (``pause_timers``)."""
        self._timers_paused = True

    def resume_timers(self) -> int:
        """Re-evaluate and re-arm every scheduled tree; a time missed follows its misfire policy.

        Returns how many timers are armed afterwards.
        """

        def handler() -> int:
            if not self._timers_paused:
                return len(self.armed)
            queries.set_meta(self.d.tx.conn, queries.TIMERS_PAUSED, None)
            self._timers_paused = False
            # As at a daemon's start (``Evaluator.start_due``): a time still ahead was not
            # missed and is kept, a child's too (a never-run ``every`` evaluated from now
            # moved); one past was missed while paused, and the tree's ``misfire`` decides.
            held = [
                (top, armed)
                for top_id, armed in list(self.armed.items())
                if (top := self.d.tree.get(top_id)) is not None
            ]
            self.d.stats.reevaluations += len(held)
            ev = self.evaluator()
            ev.keep_armed([top for top, _ in held])
            dues = []
            for top, armed in held:
                self.disarm(top)
                ev.evaluate_level([top], sort=False)
                dues.append((top, armed, ev.start_due(top, armed.when)))
            self.write_evaluation(ev)
            for top, armed, due in dues:
                if top.job.active and due is not None:
                    # A restart-armed timer keeps its trigger (and its user) until it fires.
                    self.arm(top, due, armed.trigger, armed.by)
            self.d.tx.log(log, "Timers resumed (%d armed)", len(self.armed))  # after the arms
            return len(self.armed)

        return int(self.d.ask(handler))

    def status(self, next_timers: int = 5) -> dict[str, Any]:
        """Timers armed (count and the earliest few), timers come due whose tree run has not
        started yet (count and the oldest few), and root runs in flight, read consistently."""

        def handler() -> dict[str, Any]:
            nodes = self.d.tree.nodes
            now = self.d.clock.now()
            scheduled = sorted(
                (a.when, nodes[i].job.name) for i, a in list(self.armed.items()) if i in nodes
            )
            # A timer whose time has passed has fired (or is held by a pause): its tree run
            # waits to be started, for the dispatcher's turn or for the database. It is not
            # shown as armed.
            due = [(when, name) for when, name in scheduled if when <= now]
            armed = [(when, name) for when, name in scheduled if when > now]
            runs = []
            for tr in list(self.d.runs.tree_runs.values()):
                if tr.root_run_id is None:
                    # Read mid-event (a handler held by a database that hangs): its first
                    # row is not written. A timer's is due, as when an outage cut it off.
                    if tr.fired_at is not None:
                        due.append((tr.fired_at, tr.root.job.name))
                    continue
                frame = self.d.runs.frames.get(tr.root_run_id)
                runs.append(
                    {
                        "job": tr.root.job.name,
                        "run_id": tr.root_run_id,
                        "trigger": str(tr.trigger),
                        "started": frame.started if frame is not None else None,
                    }
                )
            return {
                "paused": self._timers_paused,
                "timers_armed": len(armed),
                "next_timers": [{"job": name, "at": when} for when, name in armed[:next_timers]],
                "timers_due": len(due),
                "due_timers": [{"job": name, "at": when} for when, name in due[:next_timers]],
                "runs_in_flight": sorted(runs, key=lambda r: r["run_id"] or 0),
            }

        return self.d.look(handler, as_it_stands=True)

    def disarm(self, top: Node) -> None:
        if self.armed.pop(top.id, None) is not None:
            log.debug("Canceling timer: %s", top.job.name)
            self.d.timers.cancel(("tree", top.id))
            self._schedule_event(top, None)

    def _schedule_event(self, top: Node, when: datetime | None) -> None:
        job_id, name = top.id, top.job.name
        self.d.tx.after(
            lambda: events.schedule_changed.send(self.d, job_id=job_id, name=name, next_runs=when)
        )

    def restart_subtree_timer(
        self, top: Node, *, completed: bool = False, edited: bool = False, created: bool = False
    ) -> datetime | None:
        """Spec 6.2: cancel, re-evaluate the one tree, start the timer if the top job is active.

        ``completed``: the tree's run has just completed (its ``every`` count from now).
        ``edited``: an edit changed a timer or an ``active`` in the tree (spec 5.5,
        Inq's restartSubtreeTimer): evaluated from now, as a restart is (``every 10s``
        10 s after the edit), and a time already past is not run at once but skipped
        to the next one after now (a tree activated after an idle spell, an ``every``
        made shorter). What ``misfire`` catches up is a time missed while the daemon
        was down. ``created``: a job with a timer was created in the tree: a time of it
        already past is skipped too, never missed (the others' times are kept).
        """
        self.d.stats.reevaluations += 1
        previous = self.armed.get(top.id)
        self.disarm(top)
        ev = self.evaluator(from_now=completed or edited)
        due = ev.evaluate_tree(top)
        if (edited or created) and due is not None and due <= ev.now:
            due = ev.skip_missed(top, due)
        self.write_evaluation(ev)
        if top.job.active and due is not None:
            # A restart-armed timer keeps its trigger (and its user) until it fires.
            if previous is not None:
                self.arm(top, due, previous.trigger, previous.by)
            else:
                self.arm(top, due, Trigger.TIMER, TIMER_USER)
        return due

    def restart(self, top: Node, by: str) -> Restarted:
        """Spec 8.2: re-arm a top-level tree from now, whatever its last run did.

        Its expressions are evaluated as Inq's are then ("now + 10s", "the next
        22:56"): a time already past is not run at once, the next occurrence after
        now is armed. An inactive tree is not armed and its next runs are cleared
        (Inq's jobComplete sets NextRuns to null).
        """
        self.d.stats.reevaluations += 1
        self.disarm(top)
        ev = self.evaluator(from_now=True)
        ev.evaluate_level([top], sort=False)
        due = top.timer_due
        if due is not None and due <= ev.now:
            due = ev.skip_missed(top, due)
        self.write_evaluation(ev)
        if not top.job.active:
            self._unschedule(top)
            return Restarted(None, "it is inactive; activate it to schedule it")
        if due is None:
            self._unschedule(top)
            return Restarted(None, "no schedule in its tree gives a time after now")
        self.arm(top, due, Trigger.RESTART, by)
        return Restarted(due, held=self.paused)

    def _timer_fired(self, top_id: int, when: datetime) -> None:
        armed = self.armed.get(top_id)
        top = self.d.tree.get(top_id)
        if armed is None or armed.when != when or top is None or self._timers_paused:
            return  # cancelled or re-armed since, or fired just before a pause
        del self.armed[top_id]
        # Late by the dispatcher's turn: a fire waits in its queue behind other work. A
        # time already past when it was armed (a misfire's catch-up) was due from then.
        since = max(when, armed.armed_at or when)
        self.lateness.record(max(0.0, (self.d.clock.now() - since).total_seconds()))
        # Not committed, the timer came due and its run waits for the database (the
        # rebuild after the outage applies the tree's misfire rule to it).
        self.d.tx.on_rollback(lambda: self.armed.setdefault(top_id, armed))
        log.debug("Timer has fired for job %s", top.job.name)
        busy = self.d.busy_job(top)
        if busy is None:
            self.d.runs.start_run(top, armed.trigger, immediate=False, user=armed.by, fired_at=when)
            return
        # DESIGN decision 3: the occurrence is recorded as skipped and the tree re-armed.
        now = self.d.clock.now()
        tr = TreeRun(
            root=top, top=top, trigger=armed.trigger, immediate=False, requested_by=armed.by
        )
        self.d.runs.insert_run(
            top, None, tr, RunState.SKIPPED, now, reason=self.d.busy_reason(busy)
        )
        ev = self.evaluator()
        due = ev.evaluate_tree(top)
        if due is not None and due <= now:
            due = ev.skip_missed(top, due)
        self.write_evaluation(ev)
        if top.job.active and due is not None:
            self.arm(top, due, Trigger.TIMER)

    def tree_done(self, tr: TreeRun, status: int) -> None:
        """Spec 7.9: re-evaluate and re-arm after a run, unless an ABORT tree failed."""
        self.d.runs.tree_runs.pop(tr.root.id, None)
        top = tr.top
        before = self.armed.get(top.id)
        self.d.tx.on_rollback(lambda: self._undone(tr, before))
        if self.d.tree.get(top.id) is None:
            return
        if tr.immediate:
            if top.id in self.armed:  # a manual run leaves the schedule as it was, refreshed
                self.restart_subtree_timer(top, completed=True)
            return
        self.d.stats.reevaluations += 1
        ev = self.evaluator(from_now=True)
        due = ev.evaluate_tree(top)
        if due is not None and tr.fired_at is not None and due <= tr.fired_at:
            # The schedule did not move on: the job that supplies it did not run (an
            # inactive box's child, spec 4.5). Its next occurrence, not at once again.
            due = ev.skip_missed(top, due)
        self.write_evaluation(ev)
        if (
            top.job.active
            and due is not None
            and (status == 0 or top.job.on_error is OnError.CONTINUE)
        ):
            self.d.tx.log(log, "Restarting timer for job %s : runs %s", top.job.name, due)
            self.arm(top, due, Trigger.TIMER)
        else:
            # An edit during the run may have armed a timer: it must not fire now.
            self._unschedule(top)

    def _undone(self, tr: TreeRun, before: Armed | None) -> None:
        """The end of a tree run that was never committed: in flight again, its timer as it
        was (the one armed for its next run cancelled), until the rebuild after the
        outage re-derives both from the database."""
        top_id = tr.top.id
        self.d.runs.tree_runs.setdefault(tr.root.id, tr)
        if self.armed.get(top_id) is not before:
            self.d.timers.cancel(("tree", top_id))
            if before is None:
                self.armed.pop(top_id, None)
            else:
                self.armed[top_id] = before

    def _unschedule(self, top: Node) -> None:
        """Nothing armed and no next runs: the tree will not run again until restarted."""
        self.armed.pop(top.id, None)
        self.d.timers.cancel(("tree", top.id))
        top.job.next_runs = None
        queries.write_next_runs(self.d.tx.conn, top.id, None)
        self._schedule_event(top, None)
