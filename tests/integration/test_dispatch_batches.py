"""Events handled together: one transaction per batch, and nothing lost when one fails.

The dispatcher takes the events queued behind the one it dequeues (timer fires,
task ends) into the same transaction (README "Events that arrive together").
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from jobcontrol import events
from tests.integration.helpers import JC, WAIT, box, poll_until, task

pytestmark = pytest.mark.timeout(60)


@contextmanager
def _dispatcher_held(jc: JC) -> Iterator[None]:
    """The dispatcher stuck in front of its next handler (an edit holds the job tree), with
    no transaction open, so workers can record ends meanwhile; events queue up behind."""
    with jc.dispatcher.protocol.user_edit():
        seen = jc.dispatcher.stats.events
        jc.dispatcher.post((lambda: None, None))
        poll_until("the dispatcher takes the event", lambda: jc.dispatcher.stats.events > seen)
        yield


def test_a_bug_in_a_batch_loses_not_the_task_end_that_shared_its_transaction(
    jc: JC, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    os.mkfifo(gate)
    jc.create(box("Top", active=True), task("t", f"read x < {gate}", "Top", active=True))
    ended = threading.Event()

    def on_end(_sender: Any, run_id: int, **_: Any) -> None:
        ended.set()

    events.task_finished.connect(on_end, weak=False)
    try:
        mark = jc.rec.mark()
        jc.run_now("Top")
        jc.rec.wait_for(lambda s: s.name == "run_started" and s.run["job_name"] == "t", since=mark)
        failures = jc.dispatcher.stats.failures
        with _dispatcher_held(jc):
            with open(gate, "w") as fifo:  # the task reads its line and ends
                fifo.write("go\n")
            assert ended.wait(WAIT)  # recorded by the worker; its wake-up is queued

            def bug() -> None:
                raise RuntimeError("a bug in one event of the batch")

            jc.dispatcher.post((bug, None))  # queued behind the task's end: one batch
        done = jc.rec.run_finished("Top", since=mark)
    finally:
        events.task_finished.disconnect(on_end)
    assert done["exit_status"] == 0
    assert jc.view("t")["exit_status"] == 0
    assert jc.view("Top")["state"] == "idle"
    assert jc.dispatcher.stats.failures == failures + 1
    assert any("dispatcher handler failed" in m for m in jc.errors.messages())
    jc.errors.records.clear()  # that failure was the point of the test
