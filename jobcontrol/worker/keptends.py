"""Ends a worker could not record before it stopped, kept on its disk until recorded.

A worker stopped while the database does not answer (``daemon stop`` during an
outage) waits for it only so long (``Worker.stop``). The end of each task run it
then could not record is appended to ``ends.jsonl`` in its spool directory
(0700, the file 0600, synced) with the database it belongs to, and recorded at
its next start on that database: by the daemon before its dispatcher's recovery
settles the runs of workers gone, so that the run keeps its real outcome instead
of ``lost``; by a worker process before it joins the registry. Each is recorded compare-and-set from running under the
worker that ran it, like any end (``RunQueue.finish``): one settled meanwhile
(its lease ran out and another dispatcher recorded it lost) stays as settled.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
from datetime import datetime
from pathlib import Path
from typing import Any

from jobcontrol import filemodes
from jobcontrol.model import RunState
from jobcontrol.store import redact
from jobcontrol.store.runqueue import RunQueue

log = logging.getLogger(__name__)

FILE = "ends.jsonl"


def keep(
    directory: Path,
    runqueue: RunQueue,
    run_id: int,
    worker: str,
    values: dict[str, Any],
    max_log_files: int,
) -> None:
    """Append one end to the file, on disk before this returns (raises ``OSError``)."""
    filemodes.make_dir(directory)
    entry = {
        "database": _database(runqueue),
        "run_id": run_id,
        "worker": worker,
        "max_log_files": max_log_files,
        "values": {
            k: v.isoformat() if isinstance(v, datetime) else (str(v) if k == "state" else v)
            for k, v in values.items()
        },
    }
    fd = _locked(directory / FILE, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(fd, (json.dumps(entry) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)  # and its lock


def record(runqueue: RunQueue, directory: Path) -> list[int]:
    """Record every kept end, then remove the file; the runs whose end was recorded.

    ``StoreUnavailable`` leaves the file as it is, for the next try (an end recorded
    already is then refused by its compare-and-set, and said so). A line that cannot
    be read is logged and skipped."""
    path = directory / FILE
    try:
        fd = _locked(path, os.O_RDWR)
    except FileNotFoundError:
        return []
    try:
        return _record(runqueue, path, fd)
    finally:
        os.close(fd)  # and its lock


def _record(runqueue: RunQueue, path: Path, fd: int) -> list[int]:
    with os.fdopen(os.dup(fd), "rb") as kept:
        lines = kept.read().decode().splitlines()
    recorded: list[int] = []
    others: list[str] = []  # of another database whose daemon shares the state directory
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            entry = json.loads(line)
            if entry["database"] != _database(runqueue):
                others.append(line)
                continue
            values = dict(entry["values"])
            values["state"] = RunState(values["state"])
            values["ended"] = datetime.fromisoformat(values["ended"])
            run_id, worker = int(entry["run_id"]), str(entry["worker"])
            max_log_files = int(entry["max_log_files"])
        except (ValueError, KeyError, TypeError) as exc:
            log.error("%s:%d: not an end this version can record (%s): skipped", path, number, exc)
            continue
        result = runqueue.finish(run_id, worker, values, max_log_files)
        if result.recorded:
            recorded.append(run_id)
            log.warning(
                "task run %s: its end (%s, exit status %s), kept on disk by worker %s when "
                "the database did not answer, is recorded",
                run_id,
                values["state"],
                values.get("exit_status"),
                worker,
            )
            for stale in result.stale_logs:
                _unlink(stale)
        else:
            log.warning(
                "task run %s: the end worker %s kept on disk (%s, exit status %s) is not "
                "recorded: the run was no longer running under it (recorded already, or "
                "settled meanwhile)",
                run_id,
                worker,
                values["state"],
                values.get("exit_status"),
            )
    if others:
        os.ftruncate(fd, 0)
        os.pwrite(fd, "".join(f"{line}\n" for line in others).encode(), 0)
        os.fsync(fd)
    else:
        path.unlink(missing_ok=True)  # under the lock: a writer waiting makes a new file
    return recorded


def _locked(path: Path, flags: int) -> int:
    """``path`` opened and locked (``flock``, exclusive): the file it names once the lock
    is held. A worker that keeps an end while another process records the file must not
    append to one the recorder has just read and removed, nor the recorder read one
    created and not yet written. ``FileNotFoundError`` without ``O_CREAT``."""
    while True:
        fd = filemodes.open_private(path, flags)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if os.fstat(fd).st_ino == os.stat(path).st_ino:
                return fd
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                os.close(fd)
                raise
        except BaseException:
            os.close(fd)
            raise
        os.close(fd)  # removed (or replaced) while it waited for the lock: again


def _database(runqueue: RunQueue) -> str:
    return redact(runqueue.store.url)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("could not prune log file %s: %s", path, exc)
