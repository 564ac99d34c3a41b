"""An idle worker on SQLite sleeps from one heartbeat to the next, and still sees at once
a lane that another process changed behind the daemon's back.

The kernel says when a file of the database is written (``ChangeWatch``, inotify): the
worker looks at the lane table then (at most once a poll interval), at each beat, and
when a change is announced in its own process, not every poll interval. A watch whose
directory goes away is dropped, with a warning, and the worker polls as before.
"""

from __future__ import annotations

import logging
import os
import select
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from jobcontrol.clock import SystemClock
from jobcontrol.store import Store
from jobcontrol.store.changewatch import ChangeWatch
from jobcontrol.store.runqueue import RunQueue
from jobcontrol.worker import Worker

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0


def readable(watch: ChangeWatch, timeout: float = 0.0) -> bool:
    return bool(select.select([watch.fileno()], [], [], timeout)[0])


def wal_database(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("CREATE TABLE t (a INTEGER)")
    return conn


def test_a_commit_by_anyone_is_seen_and_other_files_beside_it_are_not(tmp_path: Path) -> None:
    db = tmp_path / "jobcontrol.db"
    mine = wal_database(db)
    watch = ChangeWatch(db)
    try:
        assert not readable(watch)
        (tmp_path / "daemon.log").write_text("a line of the daemon's log\n")
        (tmp_path / "job-1").mkdir()
        assert not watch.changed(), "a write beside the database is not a write to it"
        # Another process commits.
        subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sqlite3; c = sqlite3.connect({str(db)!r}); "
                "c.execute('INSERT INTO t VALUES (1)'); c.commit()",
            ],
            check=True,
        )
        assert readable(watch, WAIT)
        assert watch.changed()
        assert not watch.changed(), "each write is told once"
        assert not readable(watch)
    finally:
        watch.close()
        mine.close()


def test_the_watch_follows_a_wal_removed_and_made_again(tmp_path: Path) -> None:
    db = tmp_path / "jobcontrol.db"
    wal_database(db).close()  # the last connection gone: SQLite removes the WAL
    assert not (tmp_path / "jobcontrol.db-wal").exists()
    watch = ChangeWatch(db)
    try:
        conn = sqlite3.connect(db, isolation_level=None)
        conn.execute("INSERT INTO t VALUES (1)")  # a new WAL
        assert watch.changed()
        conn.execute("INSERT INTO t VALUES (2)")  # written to the WAL made meanwhile
        assert readable(watch, WAIT)
        assert watch.changed()
        conn.close()
        assert watch.changed(), "the WAL removed"
        assert not watch.lost
    finally:
        watch.close()


def test_a_watch_whose_directory_moves_says_it_is_lost(tmp_path: Path) -> None:
    place = tmp_path / "state"
    place.mkdir()
    conn = wal_database(place / "jobcontrol.db")
    watch = ChangeWatch(place / "jobcontrol.db")
    try:
        place.rename(tmp_path / "elsewhere")
        assert watch.changed()
        assert watch.lost
    finally:
        watch.close()
        conn.close()


def test_no_database_file_no_watch(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "gone")):
        ChangeWatch(tmp_path / "gone" / "jobcontrol.db")


def make_worker(store: Store, tmp_path: Path, beat: float) -> Worker:
    return Worker(
        RunQueue(store),
        clock=SystemClock(),
        log_root=tmp_path / "logs",
        instance_id="watch-test",
        name="watcher",
        slots=1,
        heartbeat_interval=beat,
    )


def set_default_poll(url: str, seconds: float) -> None:
    """The default lane's poll interval, written by another process, the CLI with no
    daemon running (straight to the database)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCONTROL_")}
    env["JOBCONTROL_DB"] = url
    done = subprocess.run(
        [sys.executable, "-m", "jobcontrol", "lane", "set", "default", f"poll={seconds:g}s"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_an_idle_worker_looks_at_the_lanes_once_a_beat_not_every_poll_interval(
    sqlite_url: str, tmp_path: Path
) -> None:
    store = Store(sqlite_url)
    store.upgrade()
    set_default_poll(sqlite_url, 0.1)  # polling would look 10 times a second
    worker = make_worker(store, tmp_path, beat=0.5)
    worker.start()
    try:
        assert worker.poll_interval == 0.1
        worker.wait_for("a first beat", lambda: worker.beats >= 1, WAIT)
        looks, beats = worker.lane_looks, worker.beats
        worker.wait_for("four beats more", lambda: worker.beats >= beats + 4, WAIT)
        assert (
            worker.lane_looks - looks <= worker.beats - beats + 1
        ), f"{worker.lane_looks - looks} looks at the lanes in {worker.beats - beats} beats"
    finally:
        worker.stop()
        store.dispose()


def test_a_lane_changed_by_another_process_is_seen_long_before_the_next_beat(
    sqlite_url: str, tmp_path: Path
) -> None:
    store = Store(sqlite_url)
    store.upgrade()
    set_default_poll(sqlite_url, 0.1)
    worker = make_worker(store, tmp_path, beat=600.0)  # no beat during the test
    worker.start()
    try:
        assert worker.poll_interval == 0.1
        set_default_poll(sqlite_url, 0.25)
        worker.wait_for("the new poll interval", lambda: worker.poll_interval == 0.25, WAIT)
    finally:
        worker.stop()
        store.dispose()


def test_a_worker_whose_watch_is_lost_polls_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    place = tmp_path / "state"
    place.mkdir()
    url = f"sqlite:///{place}/jobcontrol.db"
    store = Store(url)
    store.upgrade()
    set_default_poll(url, 0.1)
    worker = make_worker(store, tmp_path, beat=600.0)
    worker.start()
    moved = tmp_path / "moved"
    try:
        worker.wait_for("a first beat", lambda: worker.beats >= 1, WAIT)
        looks = worker.lane_looks
        with caplog.at_level(logging.WARNING, logger="jobcontrol.worker.local"):
            # The directory moves; a link in its place keeps the database where it was
            # for the connections still to be opened.
            place.rename(moved)
            place.symlink_to(moved)
            worker.wait_for("polls again", lambda: worker.lane_looks >= looks + 10, WAIT)
        assert "is no longer watched" in caplog.text
        assert str(place) in caplog.text
    finally:
        worker.stop()
        store.dispose()
