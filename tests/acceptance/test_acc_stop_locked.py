"""``daemon stop`` while another process holds the SQLite file's write lock.

A long maintenance transaction or a backup holds the lock when the operator
stops the daemon; a task of a sequence has just ended. The stop must end well
within the CLI's own 60 s (a statement waits out SQLite's busy timeout, 30 s,
then the daemon waits no longer), and nothing may be lost: the task's end,
which the worker could not record, is kept on disk and recorded by the next
start, whose recovery then lets the box go on to its next task.
"""

from __future__ import annotations

import json
import os
import sqlite3

import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write

pytestmark = pytest.mark.timeout(180)

TREES = """\
jobs:
  - name: Long
    active: true
    children:
      - {name: first, active: true, command: "read line < GATE; echo one"}
      - {name: second, active: true, command: "echo two"}
"""


def test_a_stop_while_the_sqlite_file_is_locked_keeps_the_end_and_the_box_goes_on(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite
    gate = jc.base / "gate.fifo"
    os.mkfifo(gate)
    jc.upgraded().load(write(jc.base / "trees.yaml", TREES.replace("GATE", str(gate))))
    jc.ok("daemon", "start")
    jc.ok("run", "Long")
    assert wait_until(lambda: [r["state"] for r in jc.history("first")] == ["running"], 10)
    assert jc.marked(), "the task runs"  # (also learns the marker while the database answers)
    kept = jc.state_dir / "spool" / "ends.jsonl"

    blocker = sqlite3.connect(jc.url.split("///", 1)[1], timeout=10)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock, past the busy timeout
    try:
        fd = os.open(gate, os.O_RDWR | os.O_NONBLOCK)
        os.write(fd, b"go\n")
        os.close(fd)
        assert wait_until(lambda: not jc.marked(), 15), "the task never ended"
        stopped = jc.run("daemon", "stop", "--kill")
        assert stopped.returncode == 0, describe(stopped) + jc.daemon_log()
        assert jc.live_daemons() == []
        (entry,) = [json.loads(line) for line in kept.read_text().splitlines()]
        assert (entry["values"]["state"], entry["values"]["exit_status"]) == ("succeeded", 0)
    finally:
        blocker.rollback()
        blocker.close()

    jc.ok("daemon", "start")
    assert not kept.exists()
    done = wait_until(lambda: [r["state"] for r in jc.history("Long")] == ["succeeded"], 15)
    assert done, (jc.history("Long"), jc.history("first"), jc.history("second"))
    assert [(r["state"], r["exit_status"]) for r in jc.history("first")] == [("succeeded", 0)]
    assert [(r["state"], r["exit_status"]) for r in jc.history("second")] == [("succeeded", 0)]
    log = jc.daemon_log(200)
    assert "is kept in" in log, log
    assert "is recorded" in log, log
    jc.ok("daemon", "stop")
