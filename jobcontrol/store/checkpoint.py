"""SQLite's WAL checkpoints on a thread of their own, off the writers' paths.

By default SQLite checkpoints in whichever COMMIT finds the WAL past 1,000 pages: that
commit copies the WAL's pages into the database and syncs it, several milliseconds on
the path of whatever wrote it (a timer's run, a task's end). Those were the timer
benchmark's worst starts (p99 9.0-11.6 ms against 6.0-6.8 ms with no checkpoint in the
commits; bench/README.md). A daemon hands them to this thread: its writers count their
commits, and every ``EVERY`` of them the thread runs a PASSIVE checkpoint on a
connection of its own, which never waits for a reader or a writer. The next writer
that finds the WAL wholly checkpointed starts it again from the top, so it stays small.
What writers added while it copied, a few frames, it then copies holding the
store's turn to write (a fraction of a millisecond: the copy and two syncs), so that
the WAL is copied to its end; if the turn does not come within ``LOCK_WAIT``, it
tries again ``AGAIN`` later.

The writers keep a checkpoint of their own far out (``SAFETY_PAGES``): should this
thread fall behind or fail (a full disk), the WAL is still bounded. A failure is logged
once, counted (``failures``, in ``/metrics``) and retried at the next turn.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
from pathlib import Path

log = logging.getLogger(__name__)

# Write transactions between two checkpoints: a few hundred WAL pages at most.
EVERY = 64
_PASSIVE = "PRAGMA wal_checkpoint(PASSIVE)"
# How long it waits for the store's turn to write (a writer of this process ends in
# well under that) before leaving the rest to its next turn (seconds).
LOCK_WAIT = 0.01
# After a checkpoint that writers overtook, the next one this much later (seconds).
AGAIN = 0.05
# The WAL size at which a COMMIT checkpoints: SQLite's own, and the writers' while this
# thread runs (pages).
SQLITE_DEFAULT_PAGES = 1000
SAFETY_PAGES = 10_000


class WalCheckpointer:
    """Checkpoints ``path``'s WAL every ``every`` commits told by ``wrote``."""

    def __init__(
        self, path: str, busy_ms: int, every: int = EVERY, lock: threading.RLock | None = None
    ) -> None:
        """``lock``: the store's turn to write in this process, taken (waiting at most
        ``LOCK_WAIT``) to copy the last few frames with no writer of ours adding more."""
        self.path = path
        self.lock = lock
        self.busy_ms = busy_ms
        self.every = every
        self.checkpoints = 0  # done
        self.failures = 0  # tried and failed
        self.problem: str | None = None  # the last failure, until a checkpoint succeeds
        self.behind = False  # the last checkpoint left frames written meanwhile
        self._writes = 0
        self._stop = False
        self._cond = threading.Condition()
        self._thread = threading.Thread(target=self._run, name="jc-checkpoint", daemon=True)

    def start(self) -> WalCheckpointer:
        self._thread.start()
        return self

    def wrote(self) -> None:
        """A write transaction committed (a writer's thread; no lock taken on most)."""
        self._writes += 1  # a count lost to a race only delays a checkpoint a little
        if self._writes >= self.every:
            with self._cond:
                self._cond.notify()

    def stop(self, timeout: float = 10.0) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        if self._thread.is_alive():
            self._thread.join(timeout)

    def _run(self) -> None:
        conn: sqlite3.Connection | None = None
        try:
            while True:
                with self._cond:
                    if self.behind:  # writes came in during the last one: go on shortly
                        self._cond.wait(AGAIN)
                    while not self.behind and not self._stop and self._writes < self.every:
                        self._cond.wait()
                    if self._stop:
                        return
                    self._writes = 0
                conn = self._checkpoint(conn)
        finally:
            if conn is not None:
                conn.close()

    def _checkpoint(self, conn: sqlite3.Connection | None) -> sqlite3.Connection | None:
        """One PASSIVE checkpoint: the connection to use next time (None after an
        error); ``behind`` says whether frames written meanwhile are left to copy."""
        try:
            if conn is None:
                # mode=rw: never create the file (it exists: the store made it).
                uri = Path(self.path).absolute().as_uri() + "?mode=rw"
                conn = sqlite3.connect(
                    uri,
                    uri=True,
                    timeout=self.busy_ms / 1000,
                    isolation_level=None,
                    check_same_thread=False,
                )
            conn.execute(_PASSIVE).fetchall()
            # It copied the frames there were when it began; writers may have added
            # more since. Those few are copied holding the store's turn to write, so
            # that none of ours adds any and the WAL is copied to its end, to start
            # again at the next write. If that takes too long, the next turn tries again.
            behind = True
            if self.lock is not None and self.lock.acquire(timeout=LOCK_WAIT):
                try:
                    _busy, frames, copied = conn.execute(_PASSIVE).fetchall()[0]
                finally:
                    self.lock.release()
                behind = copied < frames
        except sqlite3.Error as exc:
            self.failures += 1
            if self.problem is None:
                log.warning(
                    "background WAL checkpoint of %s failed: %s (retried after the next "
                    "%d writes; writers checkpoint themselves past %d pages meanwhile)",
                    self.path,
                    exc,
                    self.every,
                    SAFETY_PAGES,
                )
            self.problem = str(exc)
            if conn is not None:
                conn.close()
            self.behind = False  # retried after the next writes, not in a loop
            return None
        self.checkpoints += 1
        if self.problem is not None:
            log.info("background WAL checkpoint of %s works again", self.path)
            self.problem = None
        self.behind = behind
        return conn
