"""The whole daemon is stopped (SIGSTOP) past its runs' lease, then continued.

A paused VM, a suspended laptop or an operator's ``kill -STOP`` stops the
dispatcher and its embedded worker together. When it goes on, the leases of
the worker's runs have run out only because nothing ran: the dispatcher must
not settle them as lost (and kill their processes) before the worker has had
the time to renew them. A worker process stopped alone is another matter: its
runs are settled after the lease (``test_acc_remote_worker``, ``test_leases``).
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from tests.acceptance.harness import JobControl, pid_from, wait_until, write

pytestmark = pytest.mark.timeout(180)

TREES = """\
jobs:
  - name: Long
    active: true
    children:
      - {name: long, active: true, command: "sleep 15; echo done"}
"""
LEASES_JUDGED_AFTER = 30.0  # a starting dispatcher judges no lease before (DispatcherConfig)
PAUSE = 8.0  # past the lane's 3 s lease, and past what the dispatcher calls a pause (5 s)


def test_a_daemon_stopped_and_continued_keeps_its_runs(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    jc.upgraded().load(write(jc.base / "trees.yaml", TREES))
    started = time.monotonic()
    pid = pid_from(jc.ok("daemon", "start").stdout)
    jc.ok("lane", "set", "default", "stale=3s")  # the run's lease: 3 s, renewed each 1 s
    # Leases are judged only once the dispatcher has run a lease's time (30 s).
    threading.Event().wait(max(0.0, LEASES_JUDGED_AFTER + 1 - (time.monotonic() - started)))
    jc.ok("run", "Long")
    assert wait_until(lambda: [r["state"] for r in jc.history("long")] == ["running"], 10)

    os.kill(pid, signal.SIGSTOP)
    try:
        threading.Event().wait(PAUSE)  # the pause is the fault itself
    finally:
        os.kill(pid, signal.SIGCONT)

    ended = wait_until(lambda: jc.history("Long")[0]["state"] != "running", 40)
    assert ended, jc.history("long")
    (run,) = jc.history("long")
    assert (run["state"], run["exit_status"], run["reason"]) == ("succeeded", 0, None), run
    assert [r["state"] for r in jc.history("Long")] == ["succeeded"]
    assert "the dispatcher did not run for" in jc.daemon_log(200)
    jc.ok("daemon", "stop")


def test_daemon_status_says_a_daemon_stopped_by_a_signal_is_stopped(
    jc_sqlite: JobControl,
) -> None:
    """``kill -STOP`` of the daemon: every request to its API hangs, so an operator runs
    ``daemon status``, which reads the database without it. It must say the daemon is
    stopped, and how to continue it, rather than only that it runs."""
    jc = jc_sqlite
    jc.upgraded()
    pid = pid_from(jc.ok("daemon", "start").stdout)
    os.kill(pid, signal.SIGSTOP)
    try:
        text = jc.ok("daemon", "status").stdout
        reply = jc.json("daemon", "status")
    finally:
        os.kill(pid, signal.SIGCONT)
    assert f"daemon running: pid {pid}" in text, text
    assert "daemon STOPPED by a signal" in text, text
    assert f"`kill -CONT {pid}`" in text, text
    assert (reply["running"], reply["stopped"]) == (True, True), reply
    # Continued: said to run, and nothing more.
    assert wait_until(lambda: not jc.json("daemon", "status")["stopped"], 10)
    assert "STOPPED" not in jc.ok("daemon", "status").stdout
    jc.ok("daemon", "stop")
