"""The dispatcher: the one writer of tree state and timers, and of the runs it queues and
settles (DESIGN "Dispatcher"). Workers write their own claims and ends, and take the
next task queued ahead of them, through the run queue.

One thread reads one event queue. Each event is handled inside the tree-state
protocol's dispatcher section and inside one database transaction; whatever
must wait for the commit (announcing queued runs to workers, signals) runs after it.
Requests from other threads (run now, kill, restart) are events carrying a
``Future`` for the answer.

It never calls a worker: it queues task runs and reads the ends workers record
(woken by ``events.task_finished`` within the process, and by a back-up poll
while runs are in flight). A transient database error inside a handler rolls
the transaction back; the dispatcher then waits for the database with capped
back-off and rebuilds what it holds in memory from the database, so no event's
effect is lost and nothing half-applied stays in memory.
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection, Iterator
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, tzinfo
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection

from jobcontrol import events, gcpause, logbatch
from jobcontrol.clock import APSchedulerTimers, Clock, SystemClock, TimerService
from jobcontrol.dispatch.recovery import Recovery, recover_lost_runs
from jobcontrol.dispatch.runs import Held, TreeRun, TreeRuns, Tx
from jobcontrol.dispatch.timers import TreeTimers
from jobcontrol.dispatch.tree import JobTree, Node
from jobcontrol.dispatch.treestate import TreeStateProtocol
from jobcontrol.errors import (
    BusyError,
    JobControlError,
    JobError,
    JobRunningError,
    NotRunningError,
    StoreUnavailable,
)
from jobcontrol.model import (
    DISPATCHER_USER,
    RESCHEDULING_FIELDS,
    RESTARTING_FIELDS,
    JobRef,
    JobState,
    Kind,
    Restarted,
    RunState,
    Trigger,
    left_by_a_stop,
)
from jobcontrol.outage import Backoff, Outage
from jobcontrol.slotgroups import SlotGroup
from jobcontrol.store import Store, queries

log = logging.getLogger(__name__)

T = TypeVar("T")
# How long ``read`` waits at a time for a handler's answer, or for the dispatcher to be
# parked waiting out an outage, before it looks again at which of the two it is doing.
LOOK_S = 0.1
# How long a status or metrics read waits for the dispatcher's turn before it reads the
# tree and timers as they stand (a dispatcher held on one event by a database that hangs):
# status and metrics must answer (``look``'s ``as_it_stands``).
AS_IT_STANDS_S = 1.0
# A write under way this long names the database as what a refused read waited for.
SLOW_WRITE_S = 1.0


@dataclass
class DispatcherConfig:
    log_root: Path
    slots: int = 8
    slot_groups: list[SlotGroup] | None = None  # the embedded worker's (None: one of ``slots``)
    default_max_log_files: int = 5
    kill_grace: float = 5.0
    edit_timeout: float = 30.0
    default_tz: tzinfo | None = None
    # The back-up poll while runs are in flight: ends nobody announced, expired leases.
    poll_interval: float = 2.0
    # How long a worker's claim or heartbeat vouches for its runs.
    lease: float = 30.0


@dataclass
class EditChange:
    """What one edit transaction committed, handed to the dispatcher at ``USER_END``."""

    created: list[int] = field(default_factory=list)
    modified: dict[int, set[str]] = field(default_factory=dict)
    deleted: list[int] = field(default_factory=list)
    done: Future[None] = field(default_factory=Future)

    def __bool__(self) -> bool:
        return bool(self.created or self.modified or self.deleted)


@dataclass
class Stats:
    events: int = 0
    reactions: int = 0
    reevaluations: int = 0
    failures: int = 0  # handlers that raised something other than a database outage


_STOP = object()
# Events (timer fires, task ends) handled in one transaction at most: a burst of due
# trees costs one commit per batch, not one per tree.
MAX_BATCH = 200
# How long a stop waits for a database that does not answer, to record what it does
# (the kills of ``--kill``, tree runs ending): what it could not record, the next start
# settles (and the worker keeps its runs' ends on disk, ``worker/keptends.py``).
STOP_PATIENCE_S = 10.0
# What a run killed by the daemon's stop records (``stop``).
STOP_KILL_REASON = "killed: the daemon stopped"
# A back-up poll this much later than due (and twice the poll interval) means the
# dispatcher itself did not run: leases are not judged on that gap (``_was_paused``).
PAUSE_S = 5.0


class Dispatcher:
    """The thread, its event queue and the requests other threads make, composed of two
    parts that share its tree and transaction: ``tree_timers`` (the timers of top-level
    trees) and ``runs`` (tree runs in flight)."""

    def __init__(
        self,
        store: Store,
        config: DispatcherConfig,
        *,
        clock: Clock | None = None,
        timers: TimerService | None = None,
    ) -> None:
        self.store = store
        self.config = config
        self.clock: Clock = clock or SystemClock()
        self.timers: TimerService = timers or APSchedulerTimers()
        self.default_tz: tzinfo = config.default_tz or _local_tz()
        self.default_max_log_files = config.default_max_log_files
        self.protocol = TreeStateProtocol(config.edit_timeout)
        self.tree = JobTree()
        self.tree_timers = TreeTimers(self)
        self.runs = TreeRuns(self)
        self.stats = Stats()
        self.instance_id = ""
        self.host = socket.gethostname()
        # What start-up recovery settled: the embedded worker kills what lost runs left.
        self.recovery = Recovery()
        self.outage = Outage("dispatcher")
        # Leases are judged only once workers have had a lease's time to renew them.
        self._leases_judged_after = time.monotonic() + config.lease
        self._rode_out_s = 0.0  # how long outages were ridden out, in all (``_was_paused``)
        self._leases_held_off = False  # the last poll did not judge leases (``_poll``)
        self._receivers: list[tuple[Any, Any]] = []
        self._queue: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._idle_runs = threading.Condition()
        self._tx: Tx | None = None
        self._stopping = threading.Event()  # a stop ends a wait for the database
        # Another daemon took the database (``depose``): what it holds now is not this
        # one's to rebuild from, nor to kill.
        self._deposed = threading.Event()
        self._handling_since: float | None = None  # when the handler under way began
        # Held by the dispatcher thread, but while it waits out an outage between tries,
        # and while a handler waits for its write transaction to begin (``_beginning``):
        # then the tree stays as it is, and readers may look (``parked``).
        self._owner = threading.Lock()
        self._beginning = False

    # ------------------------------------------------------------ life cycle

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def tx(self) -> Tx:
        assert self._tx is not None, "dispatcher state touched outside a handler"
        return self._tx

    def start(self) -> None:
        """Spec 4.2: STARTUP -> DISPATCHER, recover, build, evaluate, arm, IDLE."""
        log.info("Dispatcher initialising...")
        self.protocol.begin_startup()
        try:
            self.instance_id = self.store.instance_id()
            self.recovery = recover_lost_runs(self.store, self.clock, self.host)
            self._build()
            events.task_finished.connect(self._on_task_finished, sender=self.store, weak=False)
            self._receivers.append((events.task_finished, self._on_task_finished))
            self.timers.start()
            self._thread = threading.Thread(target=self._loop, name="jc-dispatcher", daemon=True)
            self._thread.start()
        finally:
            log.info("Job tree state going to idle")
            self.protocol.startup_done()
        log.info("...JobControl startup complete")

    def _build(self) -> None:
        # The tree and its timers live on: no collector walks over them as they are made.
        with self.store.write() as conn, gcpause.held():
            self._tx = tx = Tx(conn)
            try:
                self.tree = JobTree.build(queries.load_all_jobs(conn))
                log.info("Job tree created")
                # Recovery left the task runs of live workers active: each is its tree's
                # run in flight still (run again only after it, its end reacted to). One
                # that ended while no dispatcher ran is reacted to now.
                paused_at = queries.get_meta(conn, queries.TIMERS_PAUSED)
                if paused_at is not None:
                    self.tree_timers.hold_at_start()
                    log.warning(
                        "timers are paused, as since %s: nothing fires until `jobcontrol "
                        "resume` (a time missed meanwhile follows its tree's misfire)",
                        paused_at,
                    )
                steps = self.runs.resume_tree_runs()
                steps += self.runs.resume_unreacted()
                self._arm_idle_trees(*self._ended_by_recovery())
                for step in steps:
                    step()
                tx.log(log, "Root timers started")  # after the timers' lines
            finally:
                self._tx = None
        self.runs.reacted.clear()  # committed
        self._announce(tx)

    def _announce(self, tx: Tx) -> None:
        """What a committed rebuild did: its runs queued, then its after-commit actions."""
        if tx.offers:
            events.runs_queued.send(self.store, run_ids=tx.offers)
        for after in tx.after_commit:
            after()

    def _ended_by_recovery(self) -> tuple[set[int], set[int]]:
        """The top-level trees a run of which start-up recovery ended (lost), and the jobs
        that ran in those runs, by id."""
        tops: set[int] = set()
        ran: set[int] = set()
        for run in self.recovery.lost:
            node = self.tree.get(run.job_id) if run.job_id is not None else None
            if run.parent_run_id is None and node is not None:
                tops.add(node.top().id)
                ran.update(
                    r.job_id
                    for r in queries.runs_of_tree_run(self.tx.conn, run.id)
                    if r.job_id is not None and r.state is not RunState.SKIPPED
                )
        return tops, ran

    def _arm_idle_trees(self, ended: Collection[int] = (), ran: Collection[int] = ()) -> None:
        """Evaluate every tree and arm the timer of each active one not running on a timer.
        ``ended``: the trees whose run start-up recovery ended, ``ran``: the jobs that ran
        in those runs (``Evaluator.keep_armed``, ``Evaluator.start_due``)."""
        ev = self.tree_timers.evaluator()
        # As stored: what the daemon before armed. An inactive tree's was never armed: it
        # shows its schedule evaluated now (spec 4.2, 4.5), in this daemon's zone.
        armed = {top.id: top.job.next_runs if top.job.active else None for top in self.tree.roots}
        ev.keep_armed(self.tree.roots, ran)
        ev.evaluate_level(self.tree.roots)  # also sorts the top level, once
        dues = {
            top.id: ev.start_due(top, armed[top.id], ended=top.id in ended)
            for top in self.tree.roots
        }
        self.tree_timers.write_evaluation(ev)
        timer_runs = {tr.top.id for tr in self.runs.tree_runs.values() if not tr.immediate}
        for top in self.tree.roots:
            due = dues[top.id]
            if top.job.active and due is not None and top.id not in timer_runs:
                self.tree_timers.arm(top, due, Trigger.TIMER)

    def stop(
        self,
        *,
        kill_running: bool = False,
        timeout: float = 60.0,
        remote_too: bool = True,
    ) -> None:
        """Stop timers, optionally kill what runs, wait for runs to end, stop the thread.

        ``remote_too`` False (a service manager's stop or restart): a tree run whose task
        runs on a worker of its own (another process, another host) is left running
        there, and not waited for: its worker records its end, which the next start
        reacts to. A run killed records ``STOP_KILL_REASON``."""
        if not self.running:
            return
        log.info("JobControl is shutting down...")
        self.timers.shutdown()
        deadline = time.monotonic() + timeout
        left: set[int] = set()  # tree runs (by root run id) left running on their workers
        unkilled: str | None = None  # why the kills were not recorded, if they were not

        def kill() -> None:
            found = self._kill_all(remote_too)
            left.clear()  # a try rolled back by an outage is not what the next one found
            left.update(found)

        while kill_running:
            # Not refused for an outage another part of the process met (a worker whose
            # connection was cut at the same moment, still backing off): the runs would
            # then be waited for, never asked to end, until the stop's time is up.
            killing = self._post(kill)
            if not self._until(killing.done, deadline):
                unkilled = self._late()
                break
            error = killing.exception()
            if error is None:
                unkilled = None
                break
            if not isinstance(error, StoreUnavailable):
                raise error
            # Refused, as any request met by an outage is: asked again, after the
            # dispatcher has ridden it out (it rebuilds before it takes the next request),
            # as long as the stop's time and the patience last. Not once deposed: the
            # database's runs in flight are then the other daemon's.
            unkilled = str(error)
            if time.monotonic() >= deadline or self._deposed.is_set():
                break
        if unkilled is not None:
            # Their worker kills them all the same, on its way out: not waited for here
            # (nothing would end them before the stop's time is up).
            log.warning("the kills of the runs in flight are not recorded: %s", unkilled)
        if left:
            log.info(
                "leaving %d tree run(s) running on other workers or queued (%s): their "
                "workers record their ends, and the next start reacts to them",
                len(left),
                ", ".join(sorted(tr.root.job.name for tr in self._in_flight(left))),
            )
        # While the database does not answer no tree run can end here: not waited for
        # (their worker kills them with ``--kill``, and keeps what it could not record).
        if unkilled is None and not self._until(
            lambda: not self._in_flight(left, besides=True) or self.outage.down, deadline
        ):
            log.warning(
                "stopping with %d tree run(s) in flight (%s): the next start settles them",
                len(self.runs.tree_runs),
                self._late(),
            )
        self._stopping.set()
        self._queue.put(_STOP)
        assert self._thread is not None
        # Held up by the database past the patience, it may be inside a statement that
        # waits for it: not waited for (the next start rebuilds from the database).
        held_up = self._held_up(time.monotonic()) >= STOP_PATIENCE_S
        self._thread.join(0.5 if held_up else timeout)
        for signal, receiver in self._receivers:
            signal.disconnect(receiver)
        self._receivers.clear()
        self.protocol.stop()
        log.info("JobControl terminated.")

    def depose(self) -> None:
        """Another daemon took the database while this one's connection was lost: this
        one stops. It no longer rebuilds from the database after an outage, and a stop
        kills only the tree runs it held (those of the database are the other's)."""
        self._deposed.set()

    def _until(self, ready: Callable[[], bool], deadline: float) -> bool:
        """Wait until ``ready()`` (checked at each tree run's end, else twice a second),
        up to ``deadline``, or until the dispatcher has been held up by the database for
        ``STOP_PATIENCE_S`` (``_held_up``); whether it is."""
        with self._idle_runs:
            while not ready():
                now = time.monotonic()
                if now >= deadline or self._held_up(now) >= STOP_PATIENCE_S:
                    return False
                self._idle_runs.wait(min(0.5, deadline - now))
        return True

    def _held_up(self, now: float) -> float:
        """How long the dispatcher has been on one handler: a handler takes milliseconds,
        unless the database does not answer (an outage ridden out, or a SQLite statement
        waiting out its busy timeout, 30 s, before it calls it one)."""
        since = self._handling_since
        return 0.0 if since is None else now - since

    def liveness(self) -> dict[str, float]:
        """Whether the dispatcher keeps up, for any thread without a turn of its own:
        ``handler_s``, how long it has been on the event in hand (0 between events);
        ``timer_late_s``, the most a timer fired after its time within the last minute
        (its fire waited in the queue behind other work)."""
        return {
            "handler_s": round(self._held_up(time.monotonic()), 3),
            "timer_late_s": round(self.tree_timers.lateness.worst(), 3),
        }

    def _late(self) -> str:
        state = self.outage.state()
        if state.down:
            return f"the database does not answer: {state.error}"
        held_up = self._held_up(time.monotonic())
        if held_up >= STOP_PATIENCE_S:
            return f"the database has held the dispatcher up for {held_up:.0f}s"
        return "the stop's time is up"

    def look(self, fn: Callable[[], T], *, as_it_stands: bool = False) -> T:
        """``fn()`` on the tree and timers as they stand between handlers, for another
        thread: through ``read`` while the dispatcher runs; directly while it waits out an
        outage (it changes nothing meanwhile: what it held before is the best answer there
        is) or once its thread has ended. ``fn`` only reads.

        With ``as_it_stands``: a dispatcher held on one event longer than
        ``AS_IT_STANDS_S`` (a database that hangs without failing, which no outage says)
        is read as it stands, mid-event, rather than not at all (status must answer)."""
        if not self.running or self.outage.down:
            return fn()
        if not as_it_stands:
            return self.read(fn, self.config.edit_timeout)
        try:
            return self.read(fn, AS_IT_STANDS_S)
        except BusyError:
            return fn()

    def busy_jobs(self) -> list[str]:
        """The top-level trees with a run in flight."""
        return self.look(lambda: [tr.root.job.name for tr in self.runs.tree_runs.values()])

    def gauges(self) -> dict[str, int]:
        """Timers armed, timers come due and not yet run, paused (0/1), edits that waited
        for the tree, handler failures."""

        def read() -> dict[str, int]:
            now = self.clock.now()
            scheduled = [a.when for a in self.tree_timers.armed.values()]
            return {
                "timers_armed": len(scheduled),
                "timers_due": sum(1 for when in scheduled if when <= now),
                "paused": 1 if self.paused else 0,
                "tree_state_waits": self.protocol.waits,
                "failures": self.stats.failures,
            }

        return self.look(read, as_it_stands=True)

    # ------------------------------------------------------------ the loop

    def post(self, event: Any) -> None:
        self._queue.put(event)

    def call(self, fn: Callable[[], Any]) -> Future[Any]:
        """Run ``fn`` on the dispatcher thread inside a handler; its result or error via the future."""
        if not self.running:
            raise NotRunningError("Job Control is not running")
        error = self.unavailable()
        if error is not None:
            raise StoreUnavailable(f"the database does not answer: {error}")
        return self._post(fn)

    def _post(self, fn: Callable[[], Any]) -> Future[Any]:
        """``fn`` queued for the dispatcher thread, whatever another part of the process
        last met of the database: its handler rides an outage out like any other."""
        fut: Future[Any] = Future()
        self._queue.put((fn, fut))
        return fut

    def unavailable(self) -> str | None:
        """Why a request is refused now for the database, if it is: the dispatcher rides
        an outage out, or another part of the process met one its writes still meet."""
        state = self.outage.state()
        return state.error if state.down else self.store.unavailable()

    def ask(self, fn: Callable[[], T]) -> T:
        """``fn()`` on the dispatcher thread (``call``), its result within the edit
        timeout. A request still queued then is withdrawn, never carried out later:
        ``BusyError`` says nothing was done. One under way (its handler waits for the
        database) is waited for once more; past that, whether it took effect is unknown."""
        fut = self.call(fn)
        timeout = self.config.edit_timeout
        try:
            return fut.result(timeout)
        except FutureTimeout:
            if fut.cancel():
                raise BusyError(
                    f"the dispatcher did not take the request within {timeout:g}s (the "
                    "database holding it up): nothing was done; try again"
                ) from None
        try:
            return fut.result(timeout)
        except FutureTimeout:
            raise BusyError(
                f"the dispatcher did not answer within {2 * timeout:g}s (the database holding "
                "it up): whether the request took effect is not known"
            ) from None

    def read(self, fn: Callable[[], T], timeout: float, *, after_signals: bool = False) -> T:
        """``fn()`` where the tree is consistent: on the dispatcher thread between handlers
        (with ``after_signals``, last among a handler's after-commit actions, after its
        signals). While the database does not answer, here, while the dispatcher waits
        for it (``parked``): the tree as the database last left it. ``fn`` only reads.
        ``BusyError`` when neither comes within ``timeout``."""
        taken: list[T] = []

        def read() -> None:
            taken.append(fn())

        deadline = time.monotonic() + timeout
        asked: Future[Any] | None = None
        while True:
            if asked is None and not self.outage.down:
                try:
                    asked = self.call((lambda: self.tx.after(read)) if after_signals else read)
                except StoreUnavailable:
                    pass
            if asked is not None:
                try:
                    asked.result(max(0.0, min(LOOK_S, deadline - time.monotonic())))
                    break
                except FutureTimeout:
                    pass
                except StoreUnavailable:  # its handler met the outage
                    asked = None
            with self.parked(LOOK_S) as parked:
                if parked:
                    read()
                    break
            if time.monotonic() >= deadline:
                raise BusyError(self._not_read(timeout))
        if not taken:  # an after-commit action failed: logged there
            raise JobControlError("the tree could not be read (see the dispatcher's log)")
        return taken[0]

    def _not_read(self, timeout: float) -> str:
        """Why a read of the tree did not come within ``timeout``: said by what holds the
        dispatcher up, the database as a rule (a statement that waits once its
        transaction has begun), so that the refusal does not read as a daemon gone wrong."""
        text = f"the dispatcher did not answer within {timeout:g}s"
        longest = self.store.longest_write()
        if longest is not None and longest[1] >= SLOW_WRITE_S:
            thread, seconds = longest
            return (
                f"{text}: the database has not answered a write of {thread} for "
                f"{seconds:.0f}s (a stopped or overloaded server, a storage that does not "
                "answer, a lock another process holds)"
            )
        return text

    @contextmanager
    def parked(self, timeout: float) -> Iterator[bool]:
        """While the dispatcher waits out an outage, or waits for a handler's write
        transaction to begin (a database slow to answer: another process holds SQLite's
        write lock), hold it there (True) so another thread may read the tree as the
        database last left it; False when it is not parked within ``timeout`` (it runs
        handlers: read through ``call``). Nothing read here may be changed."""
        if not self._waiting() or not self._owner.acquire(timeout=timeout):
            yield False
            return
        try:
            yield self._waiting()
        finally:
            self._owner.release()

    def _waiting(self) -> bool:
        return self.outage.down or self._beginning

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A handler's write transaction. Until it has begun nothing in memory has
        changed, so while it waits for the database (up to the busy timeout on SQLite,
        the connect timeout on PostgreSQL) the dispatcher is parked: reads of the tree
        and ``/status`` answer meanwhile instead of waiting behind it."""
        with ExitStack() as stack:
            self._beginning = True
            self._owner.release()
            try:
                conn = stack.enter_context(self.store.write())
            finally:
                self._owner.acquire()
                self._beginning = False
            yield conn

    def post_wait_elapsed(self, run_id: int) -> None:
        self._queue.put((lambda: self.runs.wait_elapsed(run_id), None))

    def _on_task_finished(self, _sender: object, run_id: int, **_: Any) -> None:
        self._queue.put((lambda: self.runs.task_done(run_id), None))

    def _loop(self) -> None:
        with self._owner, self.store.pinned():
            self._run_loop()

    def _run_loop(self) -> None:
        next_poll = time.monotonic() + self.config.poll_interval
        steady = False  # runs in flight at every turn since ``next_poll`` was set
        rode = self._rode_out_s  # how long outages had been ridden out when it was set
        while True:
            if not self.runs.tree_runs:
                steady = False
            timeout = max(0.0, next_poll - time.monotonic()) if self.runs.tree_runs else None
            try:
                # Only while runs are in flight is there anything to poll for.
                item = self._queue.get(timeout=timeout)
            except queue.Empty:
                item = None
            if item is _STOP:
                return
            events_, after = self._take_batch(item) if item is not None else ([], None)
            if item is None or (time.monotonic() >= next_poll and self.runs.tree_runs):
                # A busy queue must not starve the back-up poll (ends and leases).
                now = time.monotonic()
                if steady and now - next_poll > max(PAUSE_S, 2 * self.config.poll_interval):
                    self._was_paused(now - next_poll, self._rode_out_s - rode)
                events_.append(self._poll)
                next_poll = now + self.config.poll_interval
                steady = bool(self.runs.tree_runs)
                rode = self._rode_out_s
            if events_:
                self._handle_safely(events_, None)
            if after is _STOP:
                return
            if after is not None and after[1].set_running_or_notify_cancel():
                self._handle_safely([after[0]], after[1])  # not withdrawn (``ask``)
            with self._idle_runs:
                if not self.runs.tree_runs:
                    self._idle_runs.notify_all()

    def _take_batch(self, item: Any) -> tuple[list[Callable[[], Any]], Any]:
        """The events queued behind ``item`` (timer fires, task ends), to handle in one
        transaction; and the request or stop that ended the batch, if one did."""
        fn, fut = item
        if fut is not None:
            return [], item
        batch = [fn]
        while len(batch) < MAX_BATCH:
            try:
                nxt = self._queue.get_nowait()
            except queue.Empty:
                return batch, None
            if nxt is _STOP or nxt[1] is not None:
                return batch, nxt
            batch.append(nxt[0])
        return batch, None

    def _handle_safely(self, fns: list[Callable[[], Any]], fut: Future[Any] | None) -> None:
        self.stats.events += len(fns)
        self._handling_since = time.monotonic()
        try:
            self._handle(fns, fut)
        except Exception:
            # A bug, not the database: logged with its trace, counted for health.
            self.stats.failures += 1
            log.exception("dispatcher handler failed")
            if len(fns) > 1:
                # The batch was rolled back: the events of the others are re-derived
                # from the database, as after an outage (ends, timers by their misfire).
                self._ride_out(None, None)
        finally:
            self._handling_since = None

    def _was_paused(self, late: float, outage: float) -> None:
        """The back-up poll came ``late`` seconds after it was due, ``outage`` of them spent
        riding out a database that did not answer (``_ride_out``). The rest, the
        dispatcher did not run (the process stopped, SIGSTOP, or its host paused or
        starved) or waited for a database slow to answer. Its workers may have been held
        up as long (the embedded one is the same process, on the same database): a lease
        that ran out meanwhile says nothing of them. Leases are judged again once they
        have had a lease's time to renew them, as after an outage (which says so
        itself, when it begins and when it ends: no second line for it here)."""
        self._leases_judged_after = max(
            self._leases_judged_after, time.monotonic() + self.config.lease
        )
        if late - outage <= PAUSE_S:
            return
        log.warning(
            "the dispatcher did not run for %.1fs (a stopped process, a paused host, or a "
            "database slow to answer): leases are judged again in %gs, once workers have "
            "renewed them",
            late - outage,
            self.config.lease,
        )

    def _poll(self) -> None:
        """The back-up poll: ends that were not announced, and leases that ran out.

        Leases are not judged within a lease of the database holding up a write of this
        process (this handler's own wait for its transaction included): the heartbeats
        that would have renewed them waited for the same database. A lock held by
        another process just short of the busy timeout is a slow database, not an
        outage, and must not have healthy runs settled as lost."""
        self.runs.reconcile()
        if time.monotonic() < self._leases_judged_after:
            return
        if self.store.held_up_within(self.config.lease):
            if not self._leases_held_off:
                log.info(
                    "leases not judged for now: the database held up writes within the "
                    "last %gs (heartbeats may have waited for it too)",
                    self.config.lease,
                )
            self._leases_held_off = True
            return
        self._leases_held_off = False
        self.runs.settle_expired(self.host)

    # ------------------------------------------------------------ outages

    def _ride_out(self, exc: StoreUnavailable | None, pending: EditChange | None) -> None:
        """The database went away mid-handler: wait for it, then rebuild from it.

        Without ``exc``: a batch of events failed on a bug and was rolled back; the
        rebuild re-derives what those events would have done.
        """
        held = self.runs.held()  # before any rebuild attempt clears the memory
        # The outage began with the handler that met it: its own wait for the database
        # (up to SQLite's busy timeout) is ridden out too, not a pause of the dispatcher.
        began = time.monotonic()
        if exc is not None and self._handling_since is not None:
            began = min(began, self._handling_since)
        failed = exc is not None
        if exc is not None:
            self.outage.failed(exc)
        edits = [pending] if pending is not None else []
        backoff = Backoff()
        delay = backoff.next() if exc is not None else 0.0  # after a bug: at once
        while True:
            self._owner.release()  # parked: readers may look at the tree meanwhile
            try:
                stopped = self._stopping.wait(delay)
            finally:
                self._owner.acquire()
            if stopped or self._deposed.is_set():
                return  # stopped first: the next start rebuilds from the database
            delay = backoff.next()
            try:
                with self.protocol.dispatcher_section() as another:
                    if another is not None:
                        edits.append(another)
                    self._rebuild(held)
                for edit in edits:
                    if not edit.done.done():
                        edit.done.set_result(None)  # committed before: the rebuild has it
            except StoreUnavailable as again:
                failed = True
                self.outage.failed(again)
                continue
            break
        if failed:
            self.outage.recovered()
            self._leases_judged_after = time.monotonic() + self.config.lease
            self._rode_out_s += time.monotonic() - began

    def _rebuild(self, held: list[Held]) -> None:
        """Everything held in memory, re-derived from the database (as after an outage).

        A tree run is in flight by the database while its root run is active. One whose
        root is a task that ended meanwhile is not, yet nothing reacted to its end (its
        wake-up found the dispatcher away, or the batch that reacted was rolled back):
        it is brought back from ``held`` and its end reacted to now.
        """
        before = {n.id: n.state for n in self.tree.nodes.values()}
        for top_id in list(self.tree_timers.armed):
            self.timers.cancel(("tree", top_id))
        for run_id in list(self.runs.frames):
            self.timers.cancel(("wait", run_id))
        with self.store.write() as conn, gcpause.held():  # see _build
            self._tx = tx = Tx(conn)
            try:
                records = queries.load_all_jobs(conn)
                # The database answers: what memory held goes now, not before. Until then
                # it stays as the database last left it, for status and the tree's readers
                # (timers come due wait there, runs in flight are still in flight).
                self.tree_timers.armed.clear()
                self.runs.tree_runs.clear()
                self.runs.frames.clear()
                self.tree = JobTree.build(records)
                queries.drop_pending(conn)  # queued ahead: queued again as the runs go on
                steps = self.runs.resume_tree_runs()
                steps += self.runs.resume_ended(held)
                self._arm_idle_trees()
                for step in steps:
                    step()
            finally:
                self._tx = None
        self._announce(tx)
        jobs = [n.job for n in self.tree.nodes.values()]
        events.jobs_evaluated.send(self, jobs=jobs)
        for node in self.tree.nodes.values():
            if before.get(node.id, JobState.IDLE) is not node.state and node.state is JobState.IDLE:
                events.state_changed.send(
                    self,
                    job_id=node.id,
                    name=node.job.name,
                    state=node.state,
                    started=None,
                    run_id=None,
                )
        log.warning(
            "dispatcher rebuilt from the database: %d jobs, %d tree runs in flight",
            len(self.tree.nodes),
            len(self.runs.tree_runs),
        )

    def _handle(self, fns: list[Callable[[], Any]], fut: Future[Any] | None) -> None:
        pending: EditChange | None = None
        try:
            with self.protocol.dispatcher_section() as pending:
                result, error, tx = self._handle_in_tx(pending, fns)
                self.runs.reacted.clear()  # committed: what it did stands, whatever fails after
        except StoreUnavailable as exc:
            # Rolled back. A request is refused now (its caller can try again); an
            # edit is committed already, and the rebuild below reflects it.
            if fut is not None and not fut.done():
                fut.set_exception(exc)
            self._ride_out(exc, pending)
            return
        except BaseException as exc:
            # Whoever waits must hear about it rather than time out.
            for waiter in (fut, pending.done if pending is not None else None):
                if waiter is not None and not waiter.done():
                    waiter.set_exception(exc)
            raise
        if tx.offers:
            events.runs_queued.send(self.store, run_ids=tx.offers)
        with logbatch.held():  # the lines they log, written at once
            for after in tx.after_commit:
                try:
                    after()
                except Exception:
                    log.exception("after-commit action failed")
        if pending is not None and not pending.done.done():
            pending.done.set_result(None)
        if fut is not None:
            fut.set_exception(error) if error is not None else fut.set_result(result)

    def _handle_in_tx(
        self, pending: EditChange | None, fns: list[Callable[[], Any]]
    ) -> tuple[Any, Exception | None, Tx]:
        """The reaction to a pending edit and to a request or a batch of events, in one
        transaction. A request comes alone: its result (or refusal) is returned."""
        result, error = None, None
        self.runs.reacted.clear()
        tx: Tx | None = None
        try:
            with self._write() as conn:
                self._tx = tx = Tx(conn)
                try:
                    if pending is not None:
                        self._react(pending)
                    for fn in fns:
                        try:
                            result = fn()
                        except JobError as exc:  # a refusal: nothing was changed
                            error = exc
                finally:
                    self._tx = None
        except StoreUnavailable:
            if tx is not None:
                tx.rolled_back()  # what memory can take back; the rebuild does the rest
            raise
        return result, error, tx

    # ------------------------------------------------------------ edits (spec 5.5)

    def _react(self, change: EditChange) -> None:
        """One reaction to one edit transaction, re-evaluating each affected tree once."""
        self.stats.reactions += 1
        self.runs.drop_aheads(pending_only=True)  # queued with what the edit may have changed
        affected: set[int] = set()
        restarted: set[int] = set()  # trees whose timer or activity an edit changed
        fresh: set[int] = set()  # trees given a job with a timer
        for job_id in change.deleted:
            node = self.tree.get(job_id)
            if node is None:
                continue
            top = node.top()
            if top is node:
                self.tree_timers.disarm(node)
            else:
                affected.add(top.id)
            self.tree.remove(job_id)
        records = queries.load_jobs(self.tx.conn, [*change.created, *change.modified])
        by_id = {r.id: r for r in records}
        for job_id in sorted(change.created):
            node = self.tree.add(by_id[job_id])
            affected.add(node.top().id)
            if node.job.timer is not None:
                # A new job's time was never missed: one already past (`at` a year
                # gone by, a cron's minute) is not run at once, as after any edit.
                fresh.add(node.top().id)
        for job_id, fields in change.modified.items():
            if job_id not in by_id or self.tree.get(job_id) is None:
                continue
            old_top = self.tree.nodes[job_id].top()
            moved = self.tree.update(by_id[job_id])
            if fields & RESCHEDULING_FIELDS:
                affected.update({old_top.id, moved.top().id})
            if fields & RESTARTING_FIELDS:
                restarted.add(moved.top().id)
            if old_top is moved and moved.parent is not None:
                self.tree_timers.disarm(moved)  # no longer top-level
        for top_id in affected:
            root = self.tree.get(top_id)
            if root is not None and root.parent is None:
                self.tree_timers.restart_subtree_timer(
                    root, edited=top_id in restarted, created=top_id in fresh
                )
        self.runs.rewait(affected)  # a TIMED box waiting in them: for the times as they are
        created = [self.tree.nodes[i].job for i in change.created if i in self.tree.nodes]
        modified = [self.tree.nodes[i].job for i in change.modified if i in self.tree.nodes]
        deleted = list(change.deleted)
        if created:
            self.tx.after(lambda: events.job_created.send(self, jobs=created))
        if modified:
            self.tx.after(lambda: events.jobs_modified.send(self, jobs=modified))
        if deleted:
            self.tx.after(lambda: events.jobs_deleted.send(self, job_ids=deleted))

    # ------------------------------------------------------------ requests

    def busy_job(self, node: Node) -> Node | None:
        """The job at, above or below ``node`` that is not idle (spec 7.2), or None."""
        for n in (node, *node.ancestors()):
            if n.state is not JobState.IDLE:
                return n
        for n in node.walk():
            if n.state is not JobState.IDLE:
                return n
        return None

    def busy_reason(self, busy: Node) -> str:
        """Why a tree is busy (``busy_job``), for a refusal or a skipped run: a task whose
        run waits in the queue (a drained or full lane) says so, not "running", and so
        does a TIMED box that waits for a child's time. In a handler's transaction."""
        name = busy.job.name
        if busy.state is JobState.WAITING:
            # A TIMED box waiting for a child's time (``ls`` shows it waiting): nothing runs.
            frame = self.runs.frames.get(busy.run_id) if busy.run_id is not None else None
            if frame is not None and frame.index < len(frame.children):
                child = frame.children[frame.index].job.name
                return f"tree busy: {name!r} is waiting for the time of {child!r}"
            return f"tree busy: {name!r} is waiting"
        if busy.run_id is not None and busy.job.kind is Kind.TASK:
            run = queries.get_run(self.tx.conn, busy.run_id)
            if run is not None and run.state is RunState.QUEUED:
                return f"tree busy: {name!r} waits in the queue ({run.queue!r})"
        return f"tree busy: {name!r} is running"

    def run_now(self, job: JobRef, user: str) -> int:
        """Run a job and its sub-tree now (spec 7.4, DESIGN decision 2); returns the run id."""

        def handler() -> int:
            node = self.tree.find(job)
            busy = self.busy_job(node)
            if busy is not None:
                raise JobRunningError(node.job.name, self.busy_reason(busy))
            log.info("Manual execution of Job %s by %s", node.job.name, user)
            return self.runs.start_run(node, Trigger.MANUAL, immediate=True, user=user)

        return int(self.ask(handler))

    def kill(self, job: JobRef, user: str) -> int:
        """Kill the run of the nearest sub-tree root at or above the job (spec 8.1); its run id."""

        def handler() -> int:
            node = self.tree.find(job)
            for n in (node, *node.ancestors()):
                tr = self.runs.tree_runs.get(n.id)
                if tr is not None:
                    task = tr.current_task
                    self.runs.kill_tree_run(tr, user)
                    if task is not None and task.node is tr.root:
                        # A top-level task: the run killed is its attempt now, which is
                        # not the tree run's first once a retry followed (README Retries).
                        return task.run_id
                    assert tr.root_run_id is not None
                    return tr.root_run_id
            raise JobError(node.job.name, "not running")

        return int(self.ask(handler))

    @property
    def paused(self) -> bool:
        """Whether timers are paused (trees stay scheduled, nothing fires)."""
        return self.tree_timers.paused

    def pause_timers(self) -> int:
        """Stop every timer from firing; runs in flight go on. Returns how many were armed."""
        return self.tree_timers.pause_timers()

    def resume_timers(self) -> int:
        """Re-arm every scheduled tree (a time missed follows its misfire); how many are armed."""
        return self.tree_timers.resume_timers()

    def status(self, next_timers: int = 5) -> dict[str, Any]:
        """Timers armed (count and the earliest few) and root runs in flight, read consistently."""
        return self.tree_timers.status(next_timers)

    def restart(self, job: JobRef, user: str) -> Restarted:
        """Re-arm a top-level tree (spec 8.2); when it will next run, or why it will not."""

        def handler() -> Restarted:
            node = self.tree.find(job)
            if node.parent is not None:
                raise JobError(node.job.name, "not a top-level job")
            busy = self.busy_job(node)
            if busy is not None:
                raise JobRunningError(node.job.name, self.busy_reason(busy))
            log.info("Restart of job %s by %s", node.job.name, user)
            return self.tree_timers.restart(node, by=user)

        result: Restarted = self.ask(handler)
        return result

    def _kill_all(self, remote_too: bool = True, reason: str = STOP_KILL_REASON) -> set[int]:
        """Kill every tree run in flight; unless ``remote_too``, but those whose task runs
        on a worker of its own (not this daemon's embedded one), whose root run ids are
        returned."""
        left: set[int] = set()
        for tr in list(self.runs.tree_runs.values()):
            if not remote_too and tr.root_run_id is not None and self._runs_elsewhere(tr):
                left.add(tr.root_run_id)
                continue
            self.runs.kill_tree_run(tr, DISPATCHER_USER, reason)
        return left

    def _runs_elsewhere(self, tr: TreeRun) -> bool:
        """Whether the tree run's task is left to the workers by a stop that leaves them
        their work: it runs on a worker other than the embedded one, or it waits in the
        queue (a capped or drained lane, no free slot), where nothing of it runs to kill
        and a worker may take it. The next start goes on from its row."""
        task = tr.current_task
        if task is None:
            return False
        run = queries.get_run(self.tx.conn, task.run_id)
        return run is not None and left_by_a_stop(run)

    def _in_flight(self, roots: set[int], *, besides: bool = False) -> list[TreeRun]:
        """The tree runs in flight whose root run is one of ``roots`` (``besides``: not)."""
        return [
            tr for tr in list(self.runs.tree_runs.values()) if (tr.root_run_id in roots) != besides
        ]

    def set_job_state(
        self, node: Node, state: JobState, started: datetime | None, run_id: int | None
    ) -> None:
        node.state, node.started, node.run_id = state, started, run_id
        job_id, name = node.id, node.job.name
        self.tx.after(
            lambda: events.state_changed.send(
                self, job_id=job_id, name=name, state=state, started=started, run_id=run_id
            )
        )

    # ------------------------------------------------------------ views

    def snapshot(self) -> list[tuple[Node, int]]:
        """Every node with its depth, parents before children, siblings in order."""

        return self.read(lambda: self.tree.in_order(), self.config.edit_timeout)


def _local_tz() -> tzinfo:
    from datetime import datetime as dt

    tz = dt.now().astimezone().tzinfo
    assert tz is not None
    return tz
