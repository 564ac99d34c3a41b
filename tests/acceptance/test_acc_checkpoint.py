"""The real daemon on SQLite checkpoints its WAL on a thread of its own (README "Behaviour").

A sequence of 60 tasks writes well over the 64 commits between two checkpoints; the
daemon's ``/metrics`` then counts the thread's checkpoints, and no failure.
"""

from __future__ import annotations

import pytest

from tests.acceptance.harness import JobControl, write
from tests.acceptance.test_acc_full_disk import metrics, run_and_wait

pytestmark = pytest.mark.timeout(180)

TASKS = 60


def test_the_daemon_checkpoints_the_wal_off_its_writers_paths(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite
    tasks = "\n".join(
        f"      - name: step-{i:02d}\n        active: true\n        command: 'true'"
        for i in range(TASKS)
    )
    jc.upgraded().load(
        write(jc.base / "jobs.yaml", f"jobs:\n  - name: Steps\n    children:\n{tasks}\n")
    )
    jc.ok("daemon", "start")
    before = metrics(jc)
    assert before["jobcontrol_sqlite_checkpoint_failures_total"] == 0
    run = run_and_wait(jc, "Steps")
    assert run["exit_status"] == 0, run
    after = metrics(jc)
    assert (
        after["jobcontrol_sqlite_checkpoints_total"] > before["jobcontrol_sqlite_checkpoints_total"]
    ), (before, after)
    assert after["jobcontrol_sqlite_checkpoint_failures_total"] == 0
