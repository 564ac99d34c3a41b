"""WAL checkpoints on a thread of their own (``store/checkpoint.py``), on real SQLite files.

Every wait is bounded; the figures asserted are ones a user would see: the size of the
``-wal`` file beside the database, the writers' own checkpoint setting, the counters
``/metrics`` shows and the lines logged.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from jobcontrol.store import Store
from jobcontrol.store.checkpoint import EVERY, SAFETY_PAGES, WalCheckpointer
from tests.acceptance.harness import wait_until

WAIT = 20.0
ROW = "x" * 3000  # about a page of the WAL per write


def _writes(store: Store, n: int) -> None:
    for _ in range(n):
        with store.write() as conn:
            conn.exec_driver_sql("INSERT INTO t (v) VALUES (?)", (ROW,))


def _store(tmp_path: Path) -> Store:
    store = Store(f"sqlite:///{tmp_path}/db.sqlite")
    with store.write() as conn:
        conn.exec_driver_sql("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)")
    return store


def test_the_thread_checkpoints_and_keeps_the_wal_small(tmp_path: Path) -> None:
    """3,000 writes of a page each: without checkpoints the WAL would hold them all
    (about 12 MB: the writers' own checkpoint is moved out to 10,000 pages); the thread
    keeps restarting it, so the file stays a few hundred pages long."""
    store = _store(tmp_path)
    try:
        cp = store.checkpoint_in_background()
        assert cp is not None
        with store.write() as conn:
            # A connection opened from now on leaves checkpoints to the thread.
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == SAFETY_PAGES
        for _ in range(30):
            _writes(store, 100)
            # Paced like a daemon's writes, which leave the thread time to catch up.
            assert wait_until(lambda: cp._writes < EVERY and not cp.behind, WAIT), "it fell behind"
        # At least one turn for each 100 writes (more when writers overtook one).
        assert cp.checkpoints >= 30, cp.checkpoints
        assert cp.failures == 0
        wal = tmp_path / "db.sqlite-wal"
        # Half of what it would hold without (a busy host may leave a turn or two late).
        assert wal.stat().st_size < 6 * 1024 * 1024, wal.stat().st_size
        with store.read() as conn:
            assert conn.exec_driver_sql("SELECT count(*) FROM t").scalar() == 3000
    finally:
        store.dispose()
    assert store.checkpointer is None
    assert not cp._thread.is_alive(), "dispose ends the checkpoint thread"


def test_without_the_thread_commits_checkpoint_at_sqlites_default(tmp_path: Path) -> None:
    store = _store(tmp_path)
    try:
        assert store.checkpointer is None
        with store.write() as conn:
            assert conn.exec_driver_sql("PRAGMA wal_autocheckpoint").scalar() == 1000
    finally:
        store.dispose()


def test_a_failing_checkpoint_is_counted_logged_once_and_retried(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The checkpointer's database cannot be opened (it is not there): every turn fails
    and is counted, the warning is logged once; once it can be opened, the next turn
    works and says so."""
    caplog.set_level(logging.INFO, logger="jobcontrol.store.checkpoint")
    path = tmp_path / "later.sqlite"
    cp = WalCheckpointer(str(path), busy_ms=1000, every=2).start()
    try:
        for expected in (1, 2, 3):
            cp.wrote()
            cp.wrote()
            assert wait_until(lambda e=expected: cp.failures == e, WAIT), cp.failures  # type: ignore[misc]
        assert cp.checkpoints == 0
        assert cp.problem is not None
        assert "unable to open" in cp.problem
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert str(path) in warnings[0].getMessage()
        assert not path.exists(), "the checkpointer never creates the database"

        _store(tmp_path).dispose()  # db.sqlite, a database with a WAL
        Path(tmp_path / "db.sqlite").rename(path)
        cp.wrote()
        cp.wrote()
        assert wait_until(lambda: cp.checkpoints == 1, WAIT, 0.01), (cp.checkpoints, cp.failures)
        assert cp.failures == 3
        assert cp.problem is None
        assert any("works again" in r.getMessage() for r in caplog.records)
    finally:
        cp.stop()
