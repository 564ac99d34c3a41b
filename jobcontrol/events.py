"""blinker signals the dispatcher sends after each commit. Receivers only enqueue.

Every signal's sender is the ``Dispatcher``; keyword arguments:

* ``job_created`` / ``jobs_modified``: ``jobs`` (list of JobRecord)
* ``jobs_evaluated``: ``jobs`` (list of JobRecord) whose next runs or job order a
  timer evaluation changed (the dispatcher's own writes, not a user's edit)
* ``jobs_deleted``: ``job_ids`` (list of int)
* ``state_changed``: ``job_id``, ``name``, ``state`` (JobState), ``started``, ``run_id``
* ``run_started`` / ``run_finished``: ``run`` (dict: id, job_id, job_name, kind,
  trigger, state, exit_status, root_run_id, parent_run_id, reason, requested_by; a task's
  ``run_finished`` also ``cpu_us`` and ``mem_peak_bytes`` from its cgroup)
* ``schedule_changed``: ``job_id``, ``name``, ``next_runs`` (armed time or None)
* ``database_changed``: ``ok`` (bool), ``since`` (epoch seconds the outage began, or
  None), ``error``: the database stopped or started answering, as the daemon's parts
  see it together (sent by ``Runtime`` from the thread that met the change)
"""

from __future__ import annotations

from blinker import Namespace

_signals = Namespace()

job_created = _signals.signal("job-created")
jobs_modified = _signals.signal("jobs-modified")
jobs_evaluated = _signals.signal("jobs-evaluated")
jobs_deleted = _signals.signal("jobs-deleted")
state_changed = _signals.signal("state-changed")
run_started = _signals.signal("run-started")
run_finished = _signals.signal("run-finished")
schedule_changed = _signals.signal("schedule-changed")
database_changed = _signals.signal("database-changed")

# Wake-ups across the run queue, within one process. Their sender is the ``Store``
# both sides share, so a dispatcher and a worker of another database never hear
# each other. They are hints: the back-up polls find the same work without them.
runs_queued = _signals.signal("runs-queued")  # run_ids: task runs now claimable
kill_requested = _signals.signal("kill-requested")  # run_id, reason
task_finished = _signals.signal("task-finished")  # run_id: its end is committed
lanes_changed = _signals.signal("lanes-changed")  # names: lanes edited, resumed or drained
# The lane table was written, by anyone (PostgreSQL's trigger ``lane_notify``, heard by a
# ``Relay``): workers re-read it. Not an edit of ours to log: no arguments.
lane_rows_written = _signals.signal("lane-rows-written")
# Timers queue runs within ``seconds``: workers keep their cgroup joins warm until then
# (``cgroups.JoinWarmer``; the daemon's relay carries it to worker processes).
timers_due = _signals.signal("timers-due")
