"""Opening a SQLite database: several processes at once on a file that does not exist yet.

The first connection to a new file switches it to WAL, which needs the file to
itself; SQLite answers a second process doing the same with "database is
locked" at once, without waiting on the busy timeout. The CLI and a daemon
started together must both get on with their work.
"""

from __future__ import annotations

import multiprocessing
from pathlib import Path

from jobcontrol.store import Store

PROCESSES = 12
ROUNDS = 25


def _open(
    url: str, barrier: multiprocessing.synchronize.Barrier, errors: multiprocessing.Queue
) -> None:  # type: ignore[type-arg]
    barrier.wait(30)
    try:
        store = Store(url)
        try:
            # What `jobcontrol ls` does first: connect (the pragmas run) and read the schema.
            store.current_revision()
        finally:
            store.dispose()
    except Exception as exc:  # reported to the test, which fails with it
        errors.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_a_new_sqlite_file_together_all_get_in(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    errors: multiprocessing.Queue = ctx.Queue()  # type: ignore[type-arg]
    for round_ in range(ROUNDS):
        url = f"sqlite:///{tmp_path}/new-{round_}.db"
        barrier = ctx.Barrier(PROCESSES)
        procs = [ctx.Process(target=_open, args=(url, barrier, errors)) for _ in range(PROCESSES)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
        assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert found == []
    mode = Store(f"sqlite:///{tmp_path}/new-0.db")
    try:
        with mode.read() as conn:
            assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    finally:
        mode.dispose()
