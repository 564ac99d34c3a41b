"""The daemon's timer service (APScheduler) tells its watchers of every arm and cancel,
and a watcher that fails never keeps a timer from firing."""

from __future__ import annotations

import threading
from collections.abc import Hashable, Iterator
from datetime import UTC, datetime, timedelta

import pytest

from jobcontrol.clock import APSchedulerTimers

pytestmark = pytest.mark.timeout(30)

WAIT = 10.0


@pytest.fixture
def timers() -> Iterator[APSchedulerTimers]:
    made = APSchedulerTimers()
    made.start()
    yield made
    made.shutdown()


def test_watchers_hear_each_arm_and_each_cancel_of_an_armed_timer(
    timers: APSchedulerTimers,
) -> None:
    heard: list[tuple[Hashable, datetime | None]] = []
    timers.watch(lambda key, when: heard.append((key, when)))
    later = datetime.now(UTC) + timedelta(hours=1)
    timers.arm(("tree", 1), later, lambda: None)
    timers.arm(("tree", 1), later + timedelta(seconds=1), lambda: None)  # re-armed
    timers.cancel(("tree", 1))
    timers.cancel(("tree", 1))  # nothing armed any more: nothing to tell
    timers.cancel(("tree", 2))  # never armed
    assert heard == [
        (("tree", 1), later),
        (("tree", 1), later + timedelta(seconds=1)),
        (("tree", 1), None),
    ]
    assert timers.armed() == {}


def test_a_failing_watcher_is_logged_and_the_timer_still_fires(
    timers: APSchedulerTimers, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(key: Hashable, when: datetime | None) -> None:
        raise RuntimeError("watcher bug")

    timers.watch(broken)
    fired = threading.Event()
    timers.arm(("tree", 7), datetime.now(UTC) + timedelta(milliseconds=50), fired.set)
    assert fired.wait(WAIT), "the timer did not fire"
    failures = [r for r in caplog.records if "timer listener" in r.getMessage()]
    assert len(failures) == 1, caplog.text
    assert "('tree', 7)" in failures[0].getMessage()
    assert failures[0].exc_info is not None


def _count_passes(timers: APSchedulerTimers) -> tuple[list[int], threading.Event]:
    """Count the passes of the scheduler's loop (each one a wake-up of its thread)."""
    scheduler = timers._scheduler
    passes = [0]
    passed = threading.Event()
    real = scheduler._process_jobs

    def counted() -> float | None:
        wait: float | None = real()
        passes[0] += 1
        passed.set()
        return wait

    scheduler._process_jobs = counted
    return passes, passed


def test_a_timer_due_later_than_the_earliest_does_not_wake_the_scheduler() -> None:
    timers = APSchedulerTimers()
    passes, passed = _count_passes(timers)
    timers.start()
    try:
        now = datetime.now(UTC)
        passed.clear()
        timers.arm(("tree", 0), now + timedelta(hours=1), lambda: None)
        assert passed.wait(WAIT), "arming the first timer did not wake the scheduler"
        before = passes[0]
        for n in range(1, 11):  # re-armed trees, all after the one it sleeps until
            passed.clear()
            timers.arm(("tree", n), now + timedelta(hours=2, seconds=n), lambda: None)
            # As APScheduler ships, each arm wakes its thread for a pass at once.
            passed.wait(0.05)
        assert passes[0] == before, f"{passes[0] - before} passes for 10 later timers"
        fired = threading.Event()
        timers.arm(("tree", "soon"), datetime.now(UTC) + timedelta(milliseconds=50), fired.set)
        assert fired.wait(WAIT), "a timer due sooner than the earliest did not fire"
        assert passes[0] - before in (1, 2), passes[0] - before  # woken, then fired
        assert len(timers.armed()) == 11
    finally:
        timers.shutdown()


def test_timers_armed_from_many_threads_at_close_instants_all_fire(
    timers: APSchedulerTimers,
) -> None:
    """Arms racing the scheduler's passes: none is left asleep past its instant."""
    count = 4 * 150
    fired: list[Hashable] = []
    lock = threading.Lock()
    all_fired = threading.Event()

    def fire(key: Hashable) -> None:
        with lock:
            fired.append(key)
            if len(fired) == count:
                all_fired.set()

    def arm_many(t: int) -> None:
        for n in range(150):
            when = datetime.now(UTC) + timedelta(milliseconds=(n * 7 + t * 3) % 200)
            timers.arm((t, n), when, lambda key=(t, n): fire(key))

    threads = [threading.Thread(target=arm_many, args=(t,)) for t in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(WAIT)
    assert all_fired.wait(WAIT), f"{count - len(fired)} timers never fired"
    assert sorted(fired, key=repr) == sorted(
        ((t, n) for t in range(4) for n in range(150)), key=repr
    )
    assert timers.armed() == {}
