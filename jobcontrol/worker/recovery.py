"""Local recovery: what lost runs left running on this host is killed.

The dispatcher's start-up recovery (``jobcontrol.dispatch.recovery``) settles the
rows of runs nobody can finish any more; ``kill_leftovers`` is the host's half, run
by the daemon before its embedded worker takes any work. While the daemon runs, the
dispatcher settles the runs of a worker that stopped renewing their leases, and
``collect`` kills what those of this host left (``events.runs_lost``). Processes
are found by the environment marker every task carries and, where runs are contained, by the
cgroups an earlier daemon of this database left (which escapees that dropped the
marker cannot leave).
"""

from __future__ import annotations

import logging
from collections.abc import Collection, Iterable

from jobcontrol import cgroups, procs
from jobcontrol.cgroups import Containment

log = logging.getLogger(__name__)


def kill_leftovers(
    instance_id: str,
    lost: Iterable[int],
    kept: Collection[int],
    *,
    kill_grace: float,
    containment: Containment | None = None,
    marker: dict[str, str] | None = None,
) -> int:
    """Kill what the task runs ``lost`` (ids) left on this host; how many processes.

    ``marker``: more variables a process must carry (a remote worker's name); none for
    the daemon's embedded worker.
    ``kept``: the runs live workers still hold. When there are none, nothing of this
    worker may run here any more, and one scan for its marker kills all (the processes
    of runs an earlier daemon never got to record included). The daemon's scan passes
    over what carries a worker's name: a ``jobcontrol worker`` process on this host is
    not the daemon's, and may by then run a task the starting dispatcher queued (its
    own restart recovers what it left; the lease rule settles its runs).
    """
    markers: list[procs.Marker]
    if not kept:
        # The embedded worker's tasks carry no JOBCONTROL_WORKER; a remote worker's its own.
        own: procs.Marker = marker or {"JOBCONTROL_WORKER": None}
        markers = [{"JOBCONTROL_INSTANCE": instance_id, **own}]
    else:
        markers = [
            {"JOBCONTROL_RUN_ID": str(i), "JOBCONTROL_INSTANCE": instance_id, **(marker or {})}
            for i in lost
        ]
    killed = _kill_marked(markers, kill_grace)
    if killed:
        log.warning("killed %d leftover process(es) of lost runs", len(killed))
    if containment is not None and containment.enabled:
        stale = [i for i in containment.run_ids() if i not in kept]
        escaped = containment.kill_leftovers(stale)
        if escaped:
            log.warning("killed %d leftover process(es) in the cgroups of lost runs", len(escaped))
        killed |= set(escaped)
    return len(killed)


def collect(instance_id: str, run_ids: Collection[int], *, kill_grace: float) -> int:
    """Kill what the task runs ``run_ids``, settled on an expired lease while the daemon
    runs, left on this host (found by the marker every task carries, whichever worker of
    this host ran it); how many processes. The worker that stopped renewing the lease
    may come back: its end then finds the run settled and changes nothing."""
    markers: list[procs.Marker] = [
        {"JOBCONTROL_RUN_ID": str(i), "JOBCONTROL_INSTANCE": instance_id} for i in run_ids
    ]
    killed = _kill_marked(markers, kill_grace)
    # What dropped the marker (``env -i``, a daemon of its own) is still in its cgroup.
    killed |= set(cgroups.kill_run_cgroups(instance_id, run_ids))
    if killed:
        log.warning(
            "killed %d process(es) left by task run(s) %s, settled on an expired lease",
            len(killed),
            ", ".join(m["JOBCONTROL_RUN_ID"] or "" for m in markers),
        )
    return len(killed)


def _kill_marked(markers: Iterable[procs.Marker], kill_grace: float) -> set[int]:
    killed: set[int] = set()
    for each in markers:
        report = procs.kill_tree(None, marker=each, grace=kill_grace)
        killed |= set(report.termed) | set(report.killed)
    return killed
