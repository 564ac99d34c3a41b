"""The engine rides out a database that stops answering (SQLite: another process's lock).

Another connection holds SQLite's write lock past the busy timeout, as a long
maintenance transaction or a backup would. Meanwhile a task ends and a timer
comes due. Nothing may be lost: the task's real outcome is recorded once the
lock is gone, its tree goes on, the timer's run happens (misfire rule), and
nothing stays running or queued that isn't.
"""

from __future__ import annotations

import sqlite3
from datetime import timedelta

import pytest

from jobcontrol import RunState
from tests.integration.conftest import MakeJC
from tests.integration.helpers import box, poll_until, task

pytestmark = pytest.mark.timeout(90)


def test_a_held_sqlite_lock_loses_no_outcome_and_no_tick(sqlite_url: str, make_jc: MakeJC) -> None:
    jc = make_jc(sqlite_url, busy_timeout=0.3, poll_interval=0.2)
    gate = jc.gate()
    jc.create(
        box("Ticker", timer="every 1s", active=True),
        task("tick", "true", "Ticker", active=True),
        box("Long", active=True),
        task("through", gate.command, "Long", active=True),
        task("after", "echo after", "Long", active=True),
    )
    jc.advance(1)
    jc.wait_quiet()
    ticks_before = len(jc.runs("tick"))
    assert ticks_before == 1

    mark = jc.rec.mark()
    root = jc.run_now("Long")
    through = jc.rec.wait_for(
        lambda s: s.name == "run_started" and s.run["job_name"] == "through", since=mark
    ).run["id"]
    jc.wait_task_process(through)

    path = sqlite_url.split("///", 1)[1]
    blocker = sqlite3.connect(path, timeout=0)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock, held past the busy timeout
    try:
        gate.open()  # the task ends during the outage
        worker = jc.runtime.worker
        assert worker is not None
        poll_until("the worker to meet the locked database", lambda: worker.outage.down)
        jc.timers.advance(timedelta(seconds=5))  # the ticker comes due during the outage
        poll_until("the dispatcher to meet it too", lambda: jc.dispatcher.outage.down)
        assert jc.run(through).state is RunState.RUNNING  # its end is not written yet...
    finally:
        blocker.rollback()
        blocker.close()

    # ...and is written with its real outcome once the lock is gone.
    finished = jc.rec.run_finished("Long", since=mark, timeout=30)
    assert (finished["id"], finished["exit_status"]) == (root, 0)
    runs = jc.tree_run(root)
    assert {n: (r.state, r.exit_status) for n, r in runs.items()} == {
        "Long": (RunState.SUCCEEDED, 0),
        "through": (RunState.SUCCEEDED, 0),
        "after": (RunState.SUCCEEDED, 0),
    }
    poll_until("both parts to see the database again", lambda: not jc.dispatcher.outage.down)
    poll_until("the worker too", lambda: not worker.outage.down)
    state = jc.dispatcher.outage.state()
    assert state.outages == 1
    assert state.failures >= 1

    # The tick that came due during the outage ran (misfire run-once), and ticks go on.
    poll_until("the missed tick", lambda: len(jc.runs("tick")) > ticks_before)
    jc.wait_quiet()
    mark = jc.rec.mark()
    jc.advance(2)
    assert jc.rec.run_finished("Ticker", since=mark)["exit_status"] == 0
    jc.wait_quiet()
    active = [r for r in jc.dump()["run"] if r["state"] in ("queued", "running", "waiting")]
    assert active == []
    assert jc.dispatcher.stats.failures == 0
