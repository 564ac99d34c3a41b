"""Crash recovery at start-up: settle what a dead dispatcher and its dead workers left.

The rule is the lease rule: a task run held by a worker that provably still
lives (its process, by pid and start time, on this host; or a lease still
running for another host) is left to it, a task run still waiting in the queue
(claimed by no worker: nothing of it started) is left there, and so are the box
runs above either: its
tree run goes on (the dispatcher rebuilds it from its rows). A box run whose
newest child is a task run that ended with nothing after it (its worker
recorded the end, no dispatcher reacted) goes on too, from that end. Every
other active run is lost (255): the box runs above it end with it.

The dispatcher only settles rows. What a lost run left running on a host is the
business of that host's worker: the embedded one kills it before it takes any
work (``jobcontrol.worker.recovery``), told which runs were lost here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from jobcontrol import events, procs
from jobcontrol.clock import Clock
from jobcontrol.model import ACTIVE_RUN_STATES, KILLED_STATUS, Kind, RunRecord, RunState
from jobcontrol.store import Store, lanes, queries, runqueue

log = logging.getLogger("jobcontrol.dispatch.dispatcher")


def worker_alive(worker: dict[str, Any] | None, host: str) -> bool:
    """Whether the worker can still vouch for its runs."""
    if worker is None or worker.get("stopped") is not None:
        return False
    if worker["host"] == host:
        pid = int(worker["pid"])
        if not procs.pid_alive(pid):  # a zombie (killed, not yet reaped) is dead too
            return False
        start = procs.start_time(pid)
        return start is not None and (
            worker.get("proc_start") is None or start == worker["proc_start"]
        )
    return False  # another host's worker: judged by its runs' leases instead


@dataclass(frozen=True)
class Recovery:
    """What start-up recovery did: the runs it settled as lost, the task runs it left to
    live workers."""

    lost: list[RunRecord] = field(default_factory=list)
    kept: set[int] = field(default_factory=set)


def recover_lost_runs(store: Store, clock: Clock, host: str) -> Recovery:
    """Mark the runs nobody can finish any more as lost (255).

    Called before the dispatcher starts anything, while it holds the database's
    lease. Their leftover processes are the worker's to kill (see the module text).
    """
    now = clock.now()
    with store.write() as conn:
        queries.drop_pending(conn)  # runs queued ahead by the previous dispatcher
        # ...and those a worker's end released that were not claimed yet: their box goes
        # on from that end, which nothing reacted to (a daemon killed just after it, or
        # an end kept on disk through an outage and recorded at this start).
        queries.drop_released_aheads(conn)
        _mark_gone_workers(conn, host)
    with store.read() as conn:
        active = queries.active_runs(conn)
        workers = {r.worker for r in active if r.worker}
        registry = {name: runqueue.get_worker(conn, name) for name in workers}
    keep = {
        r.id
        for r in active
        if r.kind is Kind.TASK
        and (
            # Waiting in the queue, nothing of it started: a worker takes it as before
            # (a stop that left the workers their work, a capped or drained lane).
            (r.state is RunState.QUEUED and r.worker is None)
            or (
                r.state is RunState.RUNNING
                and (
                    worker_alive(registry.get(r.worker or ""), host)
                    or (r.host != host and r.lease_until is not None and r.lease_until > now)
                )
            )
        )
    }
    retried = _retriable(store, [r for r in active if r.id not in keep])
    boxes = _boxes_that_go_on(store, active, keep | retried)
    stale = [r for r in active if r.id not in keep and r.id not in boxes]
    if not stale:
        return Recovery(kept=keep)
    with store.write() as conn:
        for run in stale:
            _settle(conn, run, now, host, reacted=run.id not in retried)
        # A worker found gone is an unexpected end, as one whose lease ran out.
        gone = [
            r for r in stale if r.worker and r.kind is Kind.TASK and r.state is RunState.RUNNING
        ]
        stopped = lanes.stop_after_worker_ends(conn, lanes.record_worker_ends(conn, gone, now), now)
    for name in stopped:
        log.warning("lane %s STOPPED after repeated unexpected worker ends", name)
    if stopped:
        events.lanes_changed.send(store, names=stopped)
    log.warning("marked %d run(s) left active by a previous daemon as lost", len(stale))
    if keep:
        log.warning("left %d task run(s) to the live workers holding them or the queue", len(keep))
    return Recovery(lost=stale, kept=keep)


def _mark_gone_workers(conn: Any, host: str) -> None:
    """Workers of this host whose process is gone without saying so (``kill -9``, a stop
    during an outage) are marked stopped as of their last heartbeat: ``workers`` and
    health no longer count them as live."""
    gone = [w for w in runqueue.unstopped_workers_of(conn, host) if not worker_alive(w, host)]
    for w in gone:
        runqueue.mark_stopped(conn, w["name"], w["heartbeat"])
    if gone:
        names = ", ".join(w["name"] for w in gone)
        log.warning("worker(s) %s of this host are gone: marked stopped", names)


def _boxes_that_go_on(store: Store, active: list[RunRecord], keep: set[int]) -> set[int]:
    """The box runs whose tree run goes on: those above a task run left to its live
    worker, and those whose newest child is a task run that ended and was not reacted
    to (a reaction goes on past it in the same transaction: to the next child, a wait
    or the box's end)."""
    by_id = {r.id: r for r in active}
    with_active_child = {r.parent_run_id for r in active if r.parent_run_id is not None}
    idle = [
        r.id
        for r in active
        if r.kind is Kind.BOX and r.state is RunState.RUNNING and r.id not in with_active_child
    ]
    with store.read() as conn:
        newest = queries.newest_children(conn, idle)
    ended = [
        kid.parent_run_id
        for kid in newest.values()
        if kid.kind is Kind.TASK
        and kid.state not in ACTIVE_RUN_STATES
        and kid.state is not RunState.SKIPPED
    ]
    going_on: set[int] = set()
    for parent in [by_id[k].parent_run_id for k in keep] + ended:
        while parent is not None and parent in by_id and parent not in going_on:
            going_on.add(parent)
            parent = by_id[parent].parent_run_id
    return going_on


def _retriable(store: Store, runs: list[RunRecord]) -> set[int]:
    """The task runs about to be lost whose job's ``retries`` allow another attempt, and
    no kill was asked of: they end lost, their boxes go on, and the dispatcher's reaction
    to that end runs them again (README "Retries": a lost run is retried, whoever finds
    it lost: a lease that ran out, or this start after a ``kill -9`` of the daemon)."""
    tasks = [r for r in runs if r.kind is Kind.TASK and r.job_id and not r.kill_requested]
    if not tasks:
        return set()
    with store.read() as conn:
        ids = sorted({r.job_id for r in tasks if r.job_id is not None})
        jobs = {j.id: j for j in queries.load_jobs(conn, ids)}
    return {
        r.id
        for r in tasks
        if (job := jobs.get(r.job_id or 0)) is not None and r.attempt <= job.retries
    }


def _settle(conn: Any, run: RunRecord, now: datetime, host: str, *, reacted: bool) -> None:
    """End ``run`` lost (killed, when a kill had been asked of it). ``reacted``: record its
    job's result now; otherwise the dispatcher's reaction to the end does (a retry)."""
    state = RunState.LOST
    reason = "lost: the daemon stopped while this run was active"
    if run.worker and run.kind is Kind.TASK and run.state is RunState.RUNNING:
        reason = f"lost: its worker {run.worker} is gone"
    if run.kill_requested:
        if run.host in (None, host):
            # Its leftovers are killed here before any work is taken (worker recovery).
            state = RunState.KILLED
            reason = "killed: the daemon stopped before the kill asked of it was done"
        else:
            reason += ", before it carried out the kill requested"
    values = runqueue.lost_end(run, reason, now, state)
    changed = queries.transition_run(conn, run.id, ACTIVE_RUN_STATES, values)
    if changed and run.job_id and reacted:
        started = run.started or run.created or now
        queries.write_job_result(
            conn, run.job_id, started, KILLED_STATUS, values.get("duration_ms", 0)
        )
