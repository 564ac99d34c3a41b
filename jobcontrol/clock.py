"""Clocks and one-shot timers.

The dispatcher only ever asks for "call this at that instant" and reads the
time through a clock, so tests drive both by hand (``ManualClock`` and
``ManualTimers``) while the daemon uses the wall clock and APScheduler 3's
in-memory ``DateTrigger`` jobs. Timer callbacks only post an event.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import logging
import threading
import time
from collections.abc import Callable, Hashable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

log = logging.getLogger(__name__)


class Clock(Protocol):
    def now(self) -> datetime: ...


class SystemClock:
    def now(self) -> datetime:
        return datetime.now(UTC)


class ManualClock:
    """A clock that moves only when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
        self._lock = threading.Lock()

    def now(self) -> datetime:
        with self._lock:
            return self._now

    def set(self, when: datetime) -> None:
        with self._lock:
            self._now = when


# Told of every timer armed (its key and instant) or cancelled (None).
TimerListener = Callable[[Hashable, "datetime | None"], None]


class TimerService(Protocol):
    def watch(self, listener: TimerListener) -> None: ...
    def start(self) -> None: ...
    def shutdown(self) -> None: ...
    def arm(self, key: Hashable, when: datetime, callback: Callable[[], None]) -> None: ...
    def cancel(self, key: Hashable) -> None: ...
    def armed(self) -> dict[Hashable, datetime]: ...


def _scheduler_class() -> type:
    """APScheduler's ``BackgroundScheduler``, woken only when a new job is due sooner.

    As shipped, adding a job always wakes the scheduler's thread, which then looks
    through its jobs and goes back to sleep until the earliest. A daemon re-arms a
    tree's timer at the end of each of its runs, nearly always later than the earliest
    due instant: with 500 trees every second those wake-ups were half the passes of
    the scheduler's loop, each taking the interpreter lock from the dispatcher
    (bench/README.md). Here a job whose first run is no sooner than the instant the
    loop already sleeps until does not wake it; the loop finds it when it wakes.

    ``_asleep_until`` is "wake for anything" (-inf) from the start of a pass until the
    pass has chosen its next wake-up: a job added during a pass always wakes the loop,
    and one added after it is compared with the instant the loop will wake at. The
    scheduler holds its job stores' lock both while a pass reads the earliest job and
    while a job is added, so no job falls between the two.
    """
    from apscheduler.schedulers.background import BackgroundScheduler

    class LazyWakeScheduler(BackgroundScheduler):
        _asleep_until = float("-inf")
        _adding: tuple[int, object] | None = None  # (thread, job) while a job is added

        def _process_jobs(self) -> float | None:
            self._asleep_until = float("-inf")
            wait: float | None = super()._process_jobs()
            self._asleep_until = float("inf") if wait is None else time.time() + wait
            return wait

        def _real_add_job(self, job: object, jobstore_alias: str, replace: bool) -> None:
            # Called with the job stores' lock held (``add_job``); it works out the
            # job's first run, then wakes the loop.
            self._adding = (threading.get_ident(), job)
            try:
                super()._real_add_job(job, jobstore_alias, replace)
            finally:
                self._adding = None

        def wakeup(self) -> None:
            adding = self._adding
            if adding is not None and adding[0] == threading.get_ident():
                due = getattr(adding[1], "next_run_time", None)
                if due is not None and due.timestamp() >= self._asleep_until:
                    return  # the loop wakes no later than this job is due
            super().wakeup()

    return LazyWakeScheduler


# Our own misfire policy decides before arming: a timer that is due must fire,
# however late, and each key fires once.
_JOB_DEFAULTS: dict[str, Any] = {"misfire_grace_time": None, "coalesce": True, "max_instances": 1}
_NO_ARGUMENTS = inspect.Signature()


class APSchedulerTimers:
    """One APScheduler ``DateTrigger`` job per key; no job store, no cron triggers."""

    def __init__(self) -> None:
        from apscheduler.executors.debug import DebugExecutor

        self._scheduler = _scheduler_class()(
            timezone=UTC,
            # A timer's callback only posts an event to the dispatcher's queue, so it runs
            # on the scheduler's own thread: no pool thread and no future per firing.
            executors={"default": DebugExecutor()},
            job_defaults=_JOB_DEFAULTS,
        )
        self._armed: dict[Hashable, datetime] = {}
        self._lock = threading.Lock()
        self._listeners: list[TimerListener] = []

    def watch(self, listener: TimerListener) -> None:
        """Tell ``listener`` of every arm and cancel from now on (on the caller's thread)."""
        self._listeners.append(listener)

    def start(self) -> None:
        self._scheduler.start()

    def shutdown(self) -> None:
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        with self._lock:
            self._armed.clear()

    def arm(self, key: Hashable, when: datetime, callback: Callable[[], None]) -> None:
        from apscheduler.triggers.date import DateTrigger

        def fire() -> None:
            with self._lock:
                if self._armed.get(key) == when:
                    del self._armed[key]
            callback()

        # What APScheduler would otherwise work out per job (a daemon re-arms a tree at
        # each of its runs): the callable's signature, to check it takes no arguments;
        # its name; the defaults, one ``hasattr`` each; and the first run from the
        # trigger. 33 -> 23 us an arm (bench/README.md, twenty-fifth round).
        fire.__signature__ = _NO_ARGUMENTS  # type: ignore[attr-defined]
        with self._lock:
            self._armed[key] = when
        self._tell(key, when)
        self._scheduler.add_job(
            fire,
            DateTrigger(run_date=when, timezone=UTC),
            id=repr(key),
            name="timer",
            replace_existing=True,
            next_run_time=when,
            **_JOB_DEFAULTS,
        )

    def cancel(self, key: Hashable) -> None:
        with self._lock:
            if self._armed.pop(key, None) is None:
                return
        self._tell(key, None)
        try:
            self._scheduler.remove_job(repr(key))
        except Exception:  # already fired: nothing to cancel
            log.debug("timer %r had already fired", key)

    def armed(self) -> dict[Hashable, datetime]:
        with self._lock:
            return dict(self._armed)

    def _tell(self, key: Hashable, when: datetime | None) -> None:
        for listener in self._listeners:
            try:
                listener(key, when)
            except Exception:  # a watcher's fault must not stop the timer itself
                log.exception("timer listener %r failed on %r", listener, key)


class ManualTimers:
    """Timers for tests: nothing fires until ``advance`` moves the manual clock past it."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self._armed: dict[Hashable, tuple[datetime, int, Callable[[], None]]] = {}
        self._seq = itertools.count()
        self._lock = threading.Lock()
        self._listeners: list[TimerListener] = []

    def watch(self, listener: TimerListener) -> None:
        self._listeners.append(listener)

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        with self._lock:
            self._armed.clear()

    def arm(self, key: Hashable, when: datetime, callback: Callable[[], None]) -> None:
        with self._lock:
            self._armed[key] = (when, next(self._seq), callback)
        for listener in self._listeners:
            listener(key, when)

    def cancel(self, key: Hashable) -> None:
        with self._lock:
            if self._armed.pop(key, None) is None:
                return
        for listener in self._listeners:
            listener(key, None)

    def armed(self) -> dict[Hashable, datetime]:
        with self._lock:
            return {k: v[0] for k, v in self._armed.items()}

    def when(self, key: Hashable) -> datetime | None:
        with self._lock:
            entry = self._armed.get(key)
            return entry[0] if entry else None

    def advance(self, delta: timedelta | None = None, *, to: datetime | None = None) -> int:
        """Move the clock and fire every timer now due, earliest first; returns how many fired."""
        target = to if to is not None else self.clock.now() + (delta or timedelta())
        if target > self.clock.now():
            self.clock.set(target)
        fired = 0
        while True:
            with self._lock:
                due = [(w, s, k) for k, (w, s, _) in self._armed.items() if w <= target]
                if not due:
                    return fired
                _, _, key = heapq.nsmallest(1, due)[0]
                _, _, callback = self._armed.pop(key)
            callback()
            fired += 1
