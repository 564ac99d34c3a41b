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
