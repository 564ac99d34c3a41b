"""The event log behind the live event stream: every change, numbered, replayable.

``EventLog`` listens to the dispatcher's signals (``jobcontrol.events``) and
turns each into an ``Event`` with the next sequence number, kept in a bounded
ring so a client that reconnects with the last number it saw gets what it
missed (``since``), or ``EventGap`` when that is no longer kept and it must
take a fresh ``snapshot``. ``subscribe`` streams events live through a bounded
per-subscriber queue: a subscriber that falls behind is cut off (its next
``get`` raises ``EventGap``) instead of slowing the dispatcher or growing
without bound.

Receivers run on the dispatcher thread in the after-commit actions of a
handler, in order, before the next handler starts; so reading the tree there
gives the state the change left, and the sequence numbers follow the order of
the changes. They build the event's data, then only append and hand it to the
subscribers' queues under a lock: nothing here blocks the dispatcher.

Event data (JSON-ready; job views are ``engine.job_view`` dicts, as in ``snapshot``):

* ``job.created`` / ``job.modified``: ``jobs`` (the views of those jobs)
* ``job.deleted``: ``ids`` (roots of the deleted sub-trees: their descendants went too)
* ``state.changed``: ``id``, ``name``, ``state``, ``started``, ``run_id``
* ``run.started`` / ``run.finished``: ``run`` (the run dict of ``events``), ``job`` (its view)
* ``schedule.changed``: ``id``, ``name``, ``next_runs``, ``jobs`` (the views of the
  whole top-level tree, whose evaluation may have moved any child's next run or order)
* ``lane.changed``: ``names`` (lanes added, set, drained, resumed or removed; read
  ``/lanes`` for what they are now). Claims and heartbeats have no event: a client
  that shows them polls ``/workers`` and ``/queue``.
* ``database.changed``: ``ok``, ``since`` (when the outage began, or None), ``error``:
  the database stopped answering the daemon (any of its parts), or answers again.
  Nothing in the job tree changes with it.

``jobcontrol.client.events.apply_event`` is the client side of that contract: it
updates a tree of views in place, so ``snapshot`` + ``since(seq)`` replayed equals a
later snapshot.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from blinker import Signal

from jobcontrol import events
from jobcontrol.dispatch.dispatcher import Dispatcher
from jobcontrol.dispatch.tree import Node
from jobcontrol.errors import JobControlError
from jobcontrol.views import VIEW_FIELDS, ViewFields, job_view, jsonable, view_of

log = logging.getLogger(__name__)

JobView = dict[str, Any]


class EventGap(JobControlError):
    """Events after ``after`` are not available: the client must take a fresh snapshot."""

    def __init__(self, after: int, oldest_available: int, reason: str | None = None) -> None:
        self.after = after
        self.oldest_available = oldest_available
        super().__init__(
            reason
            or f"events after {after} are no longer kept (the oldest kept is "
            f"{oldest_available}); take a fresh snapshot"
        )


class SequenceAhead(EventGap):
    """A sequence number not reached yet, as after a daemon restart: take a fresh snapshot."""

    def __init__(self, after: int, last_seq: int) -> None:
        super().__init__(
            after,
            last_seq + 1,
            f"event {after} has not happened yet (the last is {last_seq}): the number "
            "comes from another run of the daemon; take a fresh snapshot",
        )


class Event:
    """One numbered change. Its ``data`` is built from what was captured when the change
    happened, the first time a reader asks for it: most events of a busy daemon are
    never read, and building their job views cost the dispatcher more than the rest of
    its reaction to a run's end (bench/README.md, twenty-ninth round)."""

    __slots__ = ("seq", "type", "at", "_data", "_build")

    def __init__(
        self,
        seq: int,
        type: str,
        data: dict[str, Any] | None,
        at: datetime,
        build: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.seq = seq
        self.type = type
        self.at = at
        self._data = data
        self._build = build

    @property
    def data(self) -> dict[str, Any]:
        data = self._data
        if data is None:
            build = self._build
            if build is None:  # another reader built it meanwhile (it set ``_data`` first)
                data = self._data
                assert data is not None
                return data
            try:
                data = build()
            except Exception:
                log.exception(
                    "event %s (%s) could not be built; clients should re-snapshot",
                    self.seq,
                    self.type,
                )
                data = {"error": "event data unavailable"}
            self._data = data
            self._build = None  # what it captured can go
        return data

    def __repr__(self) -> str:
        return f"Event(seq={self.seq}, type={self.type!r}, at={self.at.isoformat()})"


class Subscription:
    """One live reader of the log: a bounded queue filled by the dispatcher thread."""

    def __init__(self, log_: EventLog, maxsize: int, backlog: list[Event], last_seq: int) -> None:
        self._log = log_
        self.maxsize = maxsize
        self._backlog = deque(backlog)  # the missed events asked for at subscribe time
        self._queue: deque[Event] = deque()
        self._cond = threading.Condition()
        self._last_seq = last_seq
        self._oldest_at_overflow = 0
        self.overflowed = False
        self.closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wakeup: asyncio.Event | None = None

    def _offer(self, event: Event, oldest: int) -> None:
        """Called on the dispatcher thread, under the log's lock; never blocks on the reader."""
        with self._cond:
            if self.closed or self.overflowed:
                return
            if len(self._queue) >= self.maxsize:
                self.overflowed = True
                self._oldest_at_overflow = oldest
                self._queue.clear()  # the reader must start over: free the memory now
            else:
                self._queue.append(event)
            self._cond.notify_all()
            loop, wakeup = self._loop, self._wakeup
        if loop is not None and wakeup is not None:
            try:
                loop.call_soon_threadsafe(wakeup.set)
            except RuntimeError:  # the reader's loop is closed: nobody to wake
                pass

    def _poll(self) -> Event | None:
        """The next event if one is ready; the caller holds ``_cond``."""
        if self._backlog:
            event = self._backlog.popleft()
        elif self._queue:
            event = self._queue.popleft()
        elif self.overflowed:
            raise EventGap(
                self._last_seq,
                self._oldest_at_overflow,
                f"this reader fell more than {self.maxsize} events behind after event "
                f"{self._last_seq}; resume with since({self._last_seq}) or take a fresh snapshot",
            )
        else:
            return None
        self._last_seq = event.seq
        return event

    def get(self, timeout: float | None = None) -> Event | None:
        """The next event, waiting up to ``timeout`` seconds; None on timeout or when closed.

        Raises ``EventGap`` once the reader has fallen more than ``maxsize`` events behind.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                event = self._poll()
                if event is not None or self.closed:
                    return event
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return None
                self._cond.wait(remaining)

    async def get_async(self, timeout: float | None = None) -> Event | None:
        """``get`` for an asyncio reader: waits without blocking the loop (one loop per subscription)."""
        loop = asyncio.get_running_loop()
        with self._cond:
            if self._wakeup is None:
                self._loop, self._wakeup = loop, asyncio.Event()
            wakeup = self._wakeup
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            wakeup.clear()  # before polling, so an offer after the poll still wakes us
            with self._cond:
                event = self._poll()
                if event is not None or self.closed:
                    return event
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return None
            try:
                await asyncio.wait_for(wakeup.wait(), remaining)
            except TimeoutError:
                return None

    @property
    def last_seq(self) -> int:
        """The sequence number of the last event this reader was given."""
        with self._cond:
            return self._last_seq

    def close(self) -> None:
        self._log._unsubscribe(self)
        self._shut()

    def _shut(self) -> None:
        with self._cond:
            self.closed = True
            self._queue.clear()
            self._cond.notify_all()
            loop, wakeup = self._loop, self._wakeup
        if loop is not None and wakeup is not None:
            try:
                loop.call_soon_threadsafe(wakeup.set)
            except RuntimeError:
                pass

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class EventLog:
    """The numbered events of one dispatcher, the last ``capacity`` of them kept."""

    def __init__(
        self, dispatcher: Dispatcher, capacity: int = 10_000, *, start_after: int = 0
    ) -> None:
        if capacity < 1:
            raise ValueError("capacity must be at least 1")
        self.dispatcher = dispatcher
        self.capacity = capacity
        self._lock = threading.Lock()
        self._events: deque[Event] = deque(maxlen=capacity)
        self._last_seq = start_after
        self._first_after = start_after  # what ``0`` stands for: this log's first event on
        self._subscribers: set[Subscription] = set()
        self._receivers: list[tuple[Signal, Callable[..., None]]] = []

    # ------------------------------------------------------------ life cycle

    def start(self) -> None:
        """Listen to the dispatcher's signals (its own only)."""
        if self._receivers:
            return
        builders: list[tuple[str, Signal, Callable[..., Captured]]] = [
            ("job.created", events.job_created, self._jobs_data),
            ("job.modified", events.jobs_modified, self._jobs_data),
            # The dispatcher's own re-evaluations (next runs, renumbered order) too.
            ("job.modified", events.jobs_evaluated, self._jobs_data),
            ("job.deleted", events.jobs_deleted, _deleted_data),
            ("state.changed", events.state_changed, _state_data),
            ("run.started", events.run_started, self._run_data),
            ("run.finished", events.run_finished, self._run_data),
            ("schedule.changed", events.schedule_changed, self._schedule_data),
            # Sent by the daemon's runtime from the thread that met the outage's start or end.
            ("database.changed", events.database_changed, _database_data),
        ]
        for type_, signal, build in builders:
            receiver = self._receiver(type_, build)
            signal.connect(receiver, sender=self.dispatcher, weak=False)
            self._receivers.append((signal, receiver))
        # Lane edits come from the lane service (an API thread), sent by the store.
        receiver = self._receiver("lane.changed", _lanes_data)
        events.lanes_changed.connect(receiver, sender=self.dispatcher.store, weak=False)
        self._receivers.append((events.lanes_changed, receiver))

    def stop(self) -> None:
        """Stop listening and end every subscription (their ``get`` returns None)."""
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()
        with self._lock:
            subscribers, self._subscribers = self._subscribers, set()
        for sub in subscribers:
            sub._shut()

    def _receiver(self, type_: str, capture: Callable[..., Captured]) -> Callable[..., None]:
        def receive(sender: object, **kwargs: Any) -> None:
            try:
                captured = capture(**kwargs)
            except Exception:
                log.exception("event %s could not be built; clients should re-snapshot", type_)
                captured = {"error": "event data unavailable"}
            self._append(type_, captured)

        return receive

    def _append(self, type_: str, captured: Captured) -> None:
        at = self.dispatcher.clock.now()
        data, build = (captured, None) if isinstance(captured, dict) else (None, captured)
        with self._lock:
            self._last_seq += 1
            event = Event(self._last_seq, type_, data, at, build)
            self._events.append(event)
            if self._subscribers:
                oldest = self._oldest()
                for sub in self._subscribers:
                    sub._offer(event, oldest)

    # ------------------------------------------------------------ reading

    @property
    def last_seq(self) -> int:
        with self._lock:
            return self._last_seq

    @property
    def oldest_available(self) -> int:
        """The sequence number of the oldest event kept (the next one when none is)."""
        with self._lock:
            return self._oldest()

    def _oldest(self) -> int:
        return self._events[0].seq if self._events else self._last_seq + 1

    def since(self, seq: int) -> list[Event]:
        """Every event after ``seq``, oldest first; ``EventGap`` when some are no longer kept."""
        with self._lock:
            return self._since(seq)

    def _since(self, seq: int) -> list[Event]:
        seq = seq or self._first_after  # 0: from the first event this daemon gave
        if seq > self._last_seq:
            raise SequenceAhead(seq, self._last_seq)
        oldest = self._oldest()
        if seq + 1 < oldest:
            raise EventGap(seq, oldest)
        return list(itertools.islice(self._events, seq + 1 - oldest, None))

    def subscribe(self, after: int | None = None, *, maxsize: int = 1000) -> Subscription:
        """A live reader; with ``after``, the events since then come first, with none lost between.

        Raises ``EventGap`` when the events after ``after`` are no longer kept.
        """
        with self._lock:
            backlog = self._since(after) if after is not None else []
            given = (after or self._first_after) if after is not None else self._last_seq
            sub = Subscription(self, maxsize, backlog, given)
            self._subscribers.add(sub)
        return sub

    def _unsubscribe(self, sub: Subscription) -> None:
        with self._lock:
            self._subscribers.discard(sub)

    def snapshot(self, timeout: float | None = None) -> tuple[int, list[JobView]]:
        """The whole tree (job views with live state, tree order) and the seq it is consistent with.

        Read on the dispatcher thread after the after-commit actions of the handler
        it runs in (which may also react to a pending edit), so every event of
        every change it shows is numbered at most ``seq`` and none after it is.
        While the database does not answer, it is the tree as the database last left
        it, read while the dispatcher waits for it (``Dispatcher.parked``): a client
        opened during an outage shows the jobs, and their changes follow when it answers.
        """
        d = self.dispatcher

        def read() -> tuple[int, list[JobView]]:
            return self.last_seq, [_view(node, depth) for node, depth in d.tree.in_order()]

        limit = timeout if timeout is not None else d.config.edit_timeout
        return d.read(read, limit, after_signals=True)

    # ------------------------------------------------------------ event data

    # What a change's event shows is captured when the change happens (the jobs' fields
    # are copied: the tree's records change in place) and built into views when read.

    def _node_fields(self, job_id: int) -> _NodeFields | None:
        node = self.dispatcher.tree.get(job_id)
        return _fields(node) if node is not None else None

    def _jobs_data(self, jobs: list[Any]) -> Captured:
        captured = [f for j in jobs if (f := self._node_fields(j.id)) is not None]
        return lambda: {"jobs": [_view_from(f) for f in captured]}

    def _run_data(self, run: Mapping[str, Any]) -> Captured:
        # ``run`` is made for this signal and not changed after it (``runs.run_info``).
        job = self._node_fields(run["job_id"])
        return lambda: {"run": jsonable(run), "job": None if job is None else _view_from(job)}

    def _schedule_data(self, job_id: int, name: str, next_runs: datetime | None) -> Captured:
        top = self.dispatcher.tree.get(job_id)
        jobs = [_fields(n) for n in top.walk()] if top is not None else []
        return lambda: {
            "id": job_id,
            "name": name,
            "next_runs": jsonable(next_runs),
            "jobs": [_view_from(f) for f in jobs],
        }


# An event's data as its receiver leaves it: built already, or a function that builds it.
Captured = dict[str, Any] | Callable[[], dict[str, Any]]
# A job as its view will show it: its fields, depth, state and start, read at the change.
_NodeFields = tuple[ViewFields, int, Any, datetime | None]


def _fields(node: Node) -> _NodeFields:
    return VIEW_FIELDS(node.job), node.depth(), node.state, node.started


def _view_from(f: _NodeFields) -> JobView:
    fields, depth, state, started = f
    return view_of(fields, depth, str(state), started)


def _lanes_data(names: list[str], **_: Any) -> dict[str, Any]:
    """Lane changes made here, and (``relayed``) another process's: a STOPPED lane."""
    return {"names": list(names)}


def _database_data(ok: bool, since: float | None, error: str | None) -> dict[str, Any]:
    """The database stopped or started answering (``since``: when the outage began)."""
    began = None if since is None else datetime.fromtimestamp(since, UTC).isoformat()
    return {"ok": ok, "since": began, "error": error}


def _deleted_data(job_ids: list[int]) -> dict[str, Any]:
    return {"ids": list(job_ids)}


def _state_data(
    job_id: int, name: str, state: Any, started: datetime | None, run_id: int | None
) -> dict[str, Any]:
    return {
        "id": job_id,
        "name": name,
        "state": str(state),
        "started": jsonable(started),
        "run_id": run_id,
    }


def _view(node: Node, depth: int) -> JobView:
    return job_view(node.job, depth, str(node.state), node.started)
