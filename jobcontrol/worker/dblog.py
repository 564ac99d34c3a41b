"""A task's output streamed into the database (``log_store="database"``): for a worker
that shares no filesystem with the daemon and the readers of logs (a remote one).

The task writes to a pipe. A reader thread takes everything from the pipe at once and
appends it to a spool file of the run, private (0600) in the worker's spool
directory, so the task never waits for the database and nothing is held in memory. An
uploader thread sends the spool to ``run_log`` in chunks of up to ``CHUNK`` bytes, as
soon as a chunk is full or its oldest byte is ``FLUSH_AGE`` old, so ``logs -f`` shows
the output while the task runs. While the database is away the spool grows and the
upload is retried; the worker records the run's end only once all of it is stored.

A spool that cannot be written (a full disk) is reported: a warning in the worker's
log, ``Worker.log_problems`` (its health) and the run's reason. The output then goes
on in memory, up to ``MEMORY_LIMIT`` bytes not yet stored; beyond that, bytes are
dropped (counted, and a line in the log says how many where they were), never
blocking the task.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO

from jobcontrol import filemodes
from jobcontrol.errors import StoreUnavailable
from jobcontrol.outage import Backoff, Outage
from jobcontrol.store import Store, runlogs

log = logging.getLogger(__name__)

CHUNK = 64 * 1024  # the most one run_log row holds
FLUSH_AGE = 0.5  # seconds the oldest byte not yet stored may wait while the task runs
MEMORY_LIMIT = 4 * 1024 * 1024  # bytes held in memory once the spool cannot be written
# How long the output of what a task left running is still taken once the task ended
# (its pipe stays open while they live); later writes of theirs fail (EPIPE).
LEFTOVER_GRACE = 1.0
_POLL_MS = 100


@dataclass(frozen=True)
class StoredLog:
    """What became of a run's output: its size, how much is in the database, what went wrong."""

    size: int
    stored: int
    problem: str | None  # None: every byte is in the database, the spool is gone


class DatabaseLog:
    """One run's output, from its pipe to ``run_log`` by way of its spool file."""

    def __init__(
        self,
        store: Store,
        run_id: int,
        spool_path: Path,
        *,
        now: Callable[[], datetime],
        outage: Outage,
        give_up: Callable[[], bool],
    ) -> None:
        self.store = store
        self.run_id = run_id
        self.spool_path = spool_path
        self._now = now
        self._outage = outage
        self._give_up = give_up
        self._cond = threading.Condition()
        self._spooled = 0  # bytes in the spool file
        self._taken = 0  # bytes of output taken: spooled, then in memory once the spool failed
        self._memory: deque[bytes] = deque()  # after the spool failed: bytes not yet stored
        self._in_memory = 0
        self._lost = 0  # bytes dropped since the last marker
        self._lost_total = 0
        self._uploaded = 0  # bytes stored in run_log (the log's size there)
        self._seq = 0
        self._oldest: float | None = None  # when the oldest byte not yet stored came
        self._eof = False
        self._exited_at: float | None = None
        self._spool_error: str | None = None
        self._upload_error: str | None = None
        self._spool_fd = filemodes.open_private(
            spool_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        )
        read_fd, write_fd = os.pipe()
        self._read_fd = read_fd
        self.out: BinaryIO = os.fdopen(write_fd, "wb", buffering=0)
        self._reader = threading.Thread(
            target=self._read_loop, name=f"jc-log-read-{run_id}", daemon=True
        )
        self._uploader = threading.Thread(
            target=self._upload_loop, name=f"jc-log-upload-{run_id}", daemon=True
        )
        self._reader.start()
        self._uploader.start()

    # ---------------------------------------------------------- the task's side

    def started(self) -> None:
        """The task has its copy of the pipe: the worker's goes, so the end is seen."""
        self.out.close()

    def task_ended(self) -> None:
        """The task's process ended: take what is left in the pipe (for up to
        ``LEFTOVER_GRACE`` while processes it left behind hold it open), then stop."""
        if not self.out.closed:
            self.out.close()
        with self._cond:
            if self._exited_at is None:
                self._exited_at = time.monotonic()
        self._reader.join()

    def _read_loop(self) -> None:
        poller = select.poll()
        poller.register(self._read_fd, select.POLLIN | select.POLLHUP)
        try:
            while True:
                exited = self._exited_at
                if exited is not None and time.monotonic() - exited > LEFTOVER_GRACE:
                    break
                if not poller.poll(_POLL_MS):
                    continue
                data = os.read(self._read_fd, CHUNK)
                if not data:
                    break  # every writer closed the pipe
                self._take(data)
        except OSError as exc:  # the pipe itself failed: say so, keep what was read
            log.exception("task run %s: reading its output failed", self.run_id)
            with self._cond:
                self._spool_error = self._spool_error or f"reading the output failed: {exc}"
        finally:
            os.close(self._read_fd)
            with self._cond:
                if self._lost:
                    self._keep_in_memory(self._lost_marker())
                self._eof = True
                self._cond.notify_all()

    def _take(self, data: bytes) -> None:
        if self._spool_error is None:
            try:
                _write_all(self._spool_fd, data)
            except OSError as exc:
                self._spool_failed(exc)
            else:
                with self._cond:
                    self._spooled += len(data)
                    self._taken += len(data)
                    self._arrived()
                return
        with self._cond:
            if self._in_memory + len(data) > MEMORY_LIMIT:
                self._lost += len(data)
                self._lost_total += len(data)
                return
            if self._lost:
                self._keep_in_memory(self._lost_marker())
            self._keep_in_memory(data)

    def _spool_failed(self, exc: OSError) -> None:
        # What of the failed write reached the file is not known: the spool ends at
        # what was counted, the rest of this write and all after it go to memory.
        problem = f"spool {self.spool_path}: {exc.strerror or exc}"
        log.error(
            "task run %s: its output cannot be spooled (%s): it is kept in memory up to "
            "%d bytes not yet in the database, and dropped beyond",
            self.run_id,
            problem,
            MEMORY_LIMIT,
        )
        with self._cond:
            self._spool_error = problem

    def _lost_marker(self) -> bytes:
        lost, self._lost = self._lost, 0
        return (
            f"\n[jobcontrol: {lost} bytes of output lost here: the spool could not be "
            f"written ({self._spool_error}) and the database did not take them in time]\n"
        ).encode()

    def _keep_in_memory(self, data: bytes) -> None:
        self._memory.append(data)
        self._in_memory += len(data)
        self._taken += len(data)
        self._arrived()

    def _arrived(self) -> None:
        if self._oldest is None:
            self._oldest = time.monotonic()
        self._cond.notify_all()

    # ---------------------------------------------------------- the database's side

    def _pending(self) -> int:
        return self._taken - self._uploaded

    def _upload_loop(self) -> None:
        backoff = Backoff()
        with self.store.pinned():
            while (data := self._next_chunk()) is not None:
                try:
                    runlogs.append(
                        self.store, self.run_id, self._seq, self._uploaded, data, self._now()
                    )
                except StoreUnavailable as exc:
                    self._outage.failed(exc)
                    if self._give_up():
                        self._stop_uploading(f"the worker stopped in a database outage: {exc}")
                        return
                    # Output arriving is no reason to try again sooner.
                    time.sleep(backoff.next())
                    continue
                except Exception as exc:  # not an outage: retrying would not help
                    log.exception("task run %s: storing its output failed", self.run_id)
                    self._stop_uploading(f"storing the output failed: {exc}")
                    return
                self._outage.recovered()
                backoff.reset()
                self._stored(len(data))

    def _next_chunk(self) -> bytes | None:
        """The next bytes to store, once a chunk is full, old enough, or the output
        ended; None when all is stored."""
        with self._cond:
            while True:
                pending = self._pending()
                if pending <= 0 and self._eof:
                    return None
                if pending >= CHUNK or (pending > 0 and self._eof):
                    break
                if pending > 0:
                    assert self._oldest is not None
                    wait = FLUSH_AGE - (time.monotonic() - self._oldest)
                    if wait <= 0:
                        break
                    self._cond.wait(wait)
                else:
                    self._cond.wait()
            if self._uploaded < self._spooled:
                size = min(CHUNK, self._spooled - self._uploaded)
                from_spool = True
            else:
                from_spool = False
        if from_spool:
            return os.pread(self._spool_fd, size, self._uploaded)
        with self._cond:
            out = bytearray()
            for piece in self._memory:
                if out and len(out) + len(piece) > CHUNK:
                    break
                out += piece
            return bytes(out)

    def _stored(self, n: int) -> None:
        with self._cond:
            if self._uploaded >= self._spooled:  # from memory: drop the pieces stored
                left = n
                while left > 0:
                    piece = self._memory.popleft()
                    self._in_memory -= len(piece)
                    left -= len(piece)
            self._uploaded += n
            self._seq += 1
            self._oldest = time.monotonic() if self._pending() > 0 else None
            self._cond.notify_all()

    def _stop_uploading(self, problem: str) -> None:
        with self._cond:
            self._upload_error = problem
            self._cond.notify_all()

    # ---------------------------------------------------------- the end

    def close(self) -> StoredLog:
        """Wait until the output is stored (or the upload gave up); what became of it.

        The spool file is deleted when every byte is in the database, else kept (its
        path is in the problem)."""
        self.task_ended()
        self._uploader.join()
        os.close(self._spool_fd)
        with self._cond:
            size = self._uploaded + self._pending()
            problems = [p for p in (self._spool_error, self._upload_error) if p]
            if self._lost_total:
                problems.append(f"{self._lost_total} bytes of output lost")
            complete = self._upload_error is None
            stored = self._uploaded
        if complete:
            self.spool_path.unlink(missing_ok=True)
        else:
            problems.append(_kept_in(self.spool_path))
        problem = "; ".join(problems) if problems else None
        return StoredLog(size, stored, problem)


def _kept_in(path: Path) -> str:
    """What a run's reason says of output its worker could not store yet."""
    return f"the output not yet stored is kept in {path}"


def spool_run_id(path: Path) -> int | None:
    """The run a spool file is of (``run<ID>.out``), or None for another file."""
    digits = path.name.removeprefix("run").removesuffix(".out")
    if not path.name.startswith("run") or path.suffix != ".out" or not digits.isdigit():
        return None
    return int(digits)


def store_leftover(store: Store, path: Path, now: Callable[[], datetime]) -> int:
    """Store what a spool file left by an earlier life of the worker holds beyond what is
    stored already (it stopped during an outage), then delete it; bytes stored.
    ``StoreUnavailable`` propagates (the caller retries)."""
    run_id = spool_run_id(path)
    assert run_id is not None
    done, seq = runlogs.stored(store, run_id)
    added = 0
    with open(path, "rb") as f:
        f.seek(done)
        while data := f.read(CHUNK):
            runlogs.append(store, run_id, seq, done, data, now())
            seq, done, added = seq + 1, done + len(data), added + len(data)
    if done:
        runlogs.took_log(store, run_id)
    # Its reason no longer sends anyone to a file about to go.
    when = now().strftime("%Y-%m-%d %H:%M:%S %Z").strip()
    runlogs.replace_in_reason(
        store, run_id, _kept_in(path), f"the output kept in {path} was stored at {when}"
    )
    path.unlink()
    return added


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
