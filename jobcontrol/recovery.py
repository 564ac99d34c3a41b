"""Crash recovery at start-up: what a dead daemon left running is lost, and nothing of it survives."""

from __future__ import annotations

import logging
from typing import Any

from jobcontrol import procs
from jobcontrol.model import ACTIVE_RUN_STATES, KILLED_STATUS, RunState
from jobcontrol.store import Store, queries
from jobcontrol.timers import Clock

log = logging.getLogger("jobcontrol.dispatcher")


def recover_lost_runs(store: Store, instance_id: str, clock: Clock, kill_grace: float) -> int:
    """Mark every run left queued, running or waiting as lost (255) and kill its processes.

    Called before the dispatcher starts anything, while it holds the database's
    lease, so every process still carrying this database's marker belongs to a
    previous daemon. Returns how many runs were lost.
    """
    with store.read() as conn:
        stale = queries.active_runs(conn)
    if not stale:
        return 0
    report = procs.kill_tree(None, marker={"JOBCONTROL_INSTANCE": instance_id}, grace=kill_grace)
    if report.termed or report.killed:
        log.warning(
            "killed %d leftover process(es) of lost runs",
            len(set(report.termed) | set(report.killed)),
        )
    now = clock.now()
    with store.write() as conn:
        for run in stale:
            values: dict[str, Any] = {
                "state": RunState.LOST,
                "exit_status": KILLED_STATUS,
                "ended": now,
                "reason": "lost: the daemon stopped while this run was active",
            }
            if run.started is not None:
                values["duration_ms"] = int((now - run.started).total_seconds() * 1000)
            if queries.transition_run(conn, run.id, ACTIVE_RUN_STATES, values) and run.job_id:
                started = run.started or run.created or now
                queries.write_job_result(
                    conn, run.job_id, started, KILLED_STATUS, values.get("duration_ms", 0)
                )
    log.warning("marked %d run(s) left active by a previous daemon as lost", len(stale))
    return len(stale)
