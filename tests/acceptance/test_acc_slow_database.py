"""A database slow to answer, short of an outage: another process holds SQLite's
write lock for less than the busy timeout (a backup, a maintenance transaction).

The daemon's writes wait for the lock, and no tree runs meanwhile. That is not an
outage yet (``/healthz`` stays 200: a restart would not help, and the lock may be
gone in a moment), but the operator who asks why nothing ran must see it:
``status`` says the database is slow, which thread's write waits and for how long,
and ``/metrics`` carries the wait. Once the lock is let go the ticks come back and
the slow write is no longer shown.
"""

from __future__ import annotations

import sqlite3
from typing import Any

import httpx
import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write
from tests.acceptance.test_acc_full_disk import api_base, health, metrics

pytestmark = pytest.mark.timeout(120)

TREES = """\
jobs:
  - name: tick
    timer: every 1s
    active: true
    children:
      - {name: beat, active: true, command: "echo beat"}
"""


def status(jc: JobControl) -> dict[str, Any]:
    token = jc.token_file.read_text().strip()
    answer = httpx.get(
        f"{api_base(jc)}/api/v1/status", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    database: dict[str, Any] = answer.json()["database"]
    return database


def test_a_write_lock_held_short_of_the_busy_timeout_shows_as_a_slow_database(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite
    jc.upgraded().load(write(jc.base / "trees.yaml", TREES))
    jc.ok("daemon", "start")
    assert wait_until(lambda: len(jc.history("beat")) >= 2, 15), jc.daemon_log()
    assert status(jc)["slow_write"] is None
    assert metrics(jc)["jobcontrol_database_write_seconds"] < 1.0

    blocker = sqlite3.connect(jc.url.split("///", 1)[1], timeout=10)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock, for less than the busy timeout (30 s)
    try:
        slow: dict[str, Any] = {}

        def seen_slow() -> bool:
            slow.update(status(jc))
            return bool(slow["slow_write"]) and slow["slow_write"]["seconds"] >= 2.0

        assert wait_until(seen_slow, 20), slow
        assert slow["ok"] is True, "a wait short of the busy timeout is not an outage"
        assert slow["slow_write"]["thread"].startswith("jc-"), slow
        assert metrics(jc)["jobcontrol_database_write_seconds"] >= 2.0
        code, body = health(jc)
        assert code == 200, body
        shown = jc.ok("status")
        assert "database: SLOW to answer: a write of jc-" in shown.stdout, describe(shown)
        assert "UNAVAILABLE" not in shown.stdout
        beats = len(jc.history("beat"))
        assert len(jc.history("beat")) == beats, "a tick ran while the lock was held"
    finally:
        blocker.rollback()
        blocker.close()

    assert wait_until(lambda: len(jc.history("beat")) >= beats + 2, 15), jc.daemon_log()
    assert wait_until(lambda: status(jc)["slow_write"] is None, 10), status(jc)
    assert "SLOW" not in jc.ok("status").stdout
