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

import inspect
import weakref
from collections.abc import Callable
from typing import Any

from blinker import ANY, NamedSignal


class _Signal(NamedSignal):
    """blinker's signal, with each sender's receivers looked up once, not on every send.

    A daemon that runs 500 trees sends some ten signals per tree run; blinker's ``send``
    works out each sender's receivers again every time and checks each receiver for a
    coroutine. That was 6.5 % of the time the daemon held the interpreter lock
    (bench/README.md, twenty-ninth round). Here a sender's receivers are kept until any
    receiver connects or disconnects. Signals with weakly held receivers, a sender that
    cannot be weakly referenced, a muted signal or an ``_async_wrapper`` take blinker's
    own path, so its contract holds unchanged.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name)
        # id(sender) -> (a weak reference to it, its receivers). Replaced whole on a
        # connect or disconnect: a send that read the old map stores into that one.
        self._routes: dict[int, tuple[weakref.ref[Any], tuple[Callable[..., Any], ...]]] = {}

    def connect(self, receiver: Any, sender: Any = ANY, weak: bool = True) -> Any:
        try:
            return super().connect(receiver, sender, weak)
        finally:
            self._routes = {}

    def disconnect(self, receiver: Callable[..., Any], sender: Any = ANY) -> None:
        try:
            super().disconnect(receiver, sender)
        finally:
            self._routes = {}

    def send(
        self, sender: Any | None = None, /, *, _async_wrapper: Any = None, **kwargs: Any
    ) -> list[tuple[Callable[..., Any], Any]]:
        if self.is_muted or _async_wrapper is not None:
            return super().send(sender, _async_wrapper=_async_wrapper, **kwargs)
        routes = self._routes
        route = routes.get(id(sender))
        if route is None or route[0]() is not sender:
            route = self._route(sender, routes)
            if route is None:
                return super().send(sender, **kwargs)
        return [(receiver, receiver(sender, **kwargs)) for receiver in route[1]]

    def _route(
        self,
        sender: Any,
        routes: dict[int, tuple[weakref.ref[Any], tuple[Callable[..., Any], ...]]],
    ) -> tuple[weakref.ref[Any], tuple[Callable[..., Any], ...]] | None:
        if any(isinstance(r, weakref.ref) for r in self.receivers.values()):
            return None  # a receiver that may go away: blinker tracks it
        receivers = tuple(self.receivers_for(sender))
        if any(inspect.iscoroutinefunction(r) for r in receivers):
            return None  # blinker refuses these without an ``_async_wrapper``
        try:
            ref = weakref.ref(sender)
        except TypeError:  # None, or an object without weak references
            return None
        route = (ref, receivers)
        routes[id(sender)] = route
        return route


job_created = _Signal("job-created")
jobs_modified = _Signal("jobs-modified")
jobs_evaluated = _Signal("jobs-evaluated")
jobs_deleted = _Signal("jobs-deleted")
state_changed = _Signal("state-changed")
run_started = _Signal("run-started")
run_finished = _Signal("run-finished")
schedule_changed = _Signal("schedule-changed")
database_changed = _Signal("database-changed")

# Wake-ups across the run queue, within one process. Their sender is the ``Store``
# both sides share, so a dispatcher and a worker of another database never hear
# each other. They are hints: the back-up polls find the same work without them.
runs_queued = _Signal("runs-queued")  # run_ids: task runs now claimable
kill_requested = _Signal("kill-requested")  # run_id, reason
task_finished = _Signal("task-finished")  # run_id: its end is committed
lanes_changed = _Signal("lanes-changed")  # names: lanes edited, resumed or drained
# The lane table was written, by anyone (PostgreSQL's trigger ``lane_notify``, heard by a
# ``Relay``): workers re-read it. Not an edit of ours to log: no arguments.
lane_rows_written = _Signal("lane-rows-written")
# Timers queue runs within ``seconds``: workers keep their cgroup joins warm until then
# (``cgroups.JoinWarmer``; the daemon's relay carries it to worker processes).
timers_due = _Signal("timers-due")
# Not a hint: task runs of this host the dispatcher settled on an expired lease (run_ids),
# committed. What they left running here is killed by the host's side of the daemon
# (``Runtime``, by ``worker.recovery.collect``): the dispatcher controls no process.
runs_lost = _Signal("runs-lost")
