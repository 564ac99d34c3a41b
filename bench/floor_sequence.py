"""The floor of a sequence's task on this host, for ``bench_sequence``'s target: not the
engine, but the least any design does that keeps the engine's promises.

One thread, no engine, per task:
- one SQLite transaction recording task k's end and task k+1's start (two UPDATEs,
  WAL, synchronous=NORMAL), or on PostgreSQL one statement doing both (a CTE, autocommit);
- the log file created;
- the run's cgroups made: v2, and the v1 memory one where the layout is hybrid;
- ``Popen`` of ``/bin/sh -c`` with the join script;
- a pidfd wait;
- ``cpu.stat`` and the peak memory read;
- the cgroups removed, and the empty log removed.

The baseline is ``bench_sequence``'s: ``subprocess.run(["/bin/sh", "-c", "true"])``
in a loop, timed before and after. Also printed on SQLite: the floor without the
transaction, without the v1 memory cgroup, without cgroups, and with cgroups kept for
a slot instead of made per run (``CGROUPS``: the one pair reused, its CPU read as a
difference and its v1 peak reset; or only the v1 memory cgroup kept, renamed to the
run's name and back). It needs root (it makes cgroups). It is not part of
``run_all.py``: it measures no code of Job Control.

    .venv/bin/python bench/floor_sequence.py [--tasks N] [--pg]
"""

from __future__ import annotations

import argparse
import os
import select
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402

_SCHEMA = (
    "CREATE TABLE floor_run (id INTEGER PRIMARY KEY, state TEXT, started FLOAT, ended FLOAT,"
    " exit_status INTEGER, cpu BIGINT)"
)
_END = "UPDATE floor_run SET state = 'succeeded', ended = ?, exit_status = ?, cpu = ? WHERE id = ?"
_START = "UPDATE floor_run SET state = 'running', started = ? WHERE id = ? AND state = 'pending'"
_BOTH_PG = (
    "WITH fin AS (UPDATE floor_run SET state = 'succeeded', ended = %s, exit_status = %s, cpu = %s"
    " WHERE id = %s) UPDATE floor_run SET state = 'running', started = %s"
    " WHERE id = %s AND state = 'pending'"
)


def _mount(fstype: str, option: str | None = None) -> str | None:
    """Where a filesystem of ``fstype`` (with super option ``option``) is mounted."""
    with open("/proc/self/mountinfo") as f:
        for line in f:
            before, after = line.split(" - ")
            fields = after.split()
            if fields[0] == fstype and (option is None or option in fields[2].split(",")):
                return before.split()[4]
    return None


Bases = tuple[str, str | None]  # this benchmark's cgroup parents: v2, v1 memory (or None)

# How a task's cgroups come to be: made for the run and removed after it (as the
# worker does), v2 only, none, the slot's pair reused, or the v1 one renamed.
CGROUPS = ("per-run", "v2-only", "none", "slot", "v1-renamed")
_SLOT = "slot"  # the reused cgroups' name
_SPARE = "spare"  # the v1 memory cgroup between two runs, when it is renamed


@contextmanager
def cgroup_bases() -> Iterator[Bases]:
    """This benchmark's own cgroup parents, made for the run and removed after it with
    whatever a run left in them (empty by then)."""
    v2_root = _mount("cgroup2")
    if v2_root is None:
        raise SystemExit("no cgroup2 mount")
    memory_root = _mount("cgroup", "memory")
    bases = [os.path.join(v2_root, "jc-floor")]
    if memory_root is not None:
        bases.append(os.path.join(memory_root, "jc-floor"))
    for base in bases:
        os.makedirs(base, exist_ok=True)
    try:
        yield bases[0], (bases[1] if len(bases) > 1 else None)
    finally:
        for base in bases:
            with os.scandir(base) as entries:
                for entry in entries:
                    if entry.is_dir() and (
                        entry.name.startswith("run-") or entry.name in (_SLOT, _SPARE)
                    ):
                        os.rmdir(entry.path)
            os.rmdir(base)


def cgroups_possible() -> bool:
    """Whether this process can make the floor's cgroups: root, with a cgroup2 mount."""
    return os.geteuid() == 0 and _mount("cgroup2") is not None


def no_cgroups() -> Bases:
    """The bases ``floor`` takes when it makes no cgroups (``cgroups="none"``)."""
    return "", None


def bases_for(cgroups: str) -> AbstractContextManager[Bases]:
    """The bases a floor run with ``cgroups`` needs: none for ``"none"``, else this
    benchmark's own (``cgroup_bases``)."""
    return nullcontext(no_cgroups()) if cgroups == "none" else cgroup_bases()


def baseline(n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(["/bin/sh", "-c", "true"], check=False)
    return (time.perf_counter() - t0) / n


def _wait(proc: subprocess.Popen[bytes]) -> int:
    fd = os.pidfd_open(proc.pid)
    try:
        poller = select.poll()
        poller.register(fd, select.POLLIN)
        poller.poll()
    finally:
        os.close(fd)
    return proc.wait()


@contextmanager
def _database(pg: str | None, n: int, directory: str) -> Iterator[Any]:
    if pg is not None:
        import psycopg

        conn: Any = psycopg.connect(pg, autocommit=True)
        conn.execute("DROP TABLE IF EXISTS floor_run")
        conn.execute(_SCHEMA)
        with conn.cursor() as cur:
            cur.executemany(
                "INSERT INTO floor_run (id, state) VALUES (%s, 'pending')", [(i,) for i in range(n)]
            )
    else:
        conn = sqlite3.connect(os.path.join(directory, "floor.db"), isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(_SCHEMA)
        conn.executemany(
            "INSERT INTO floor_run (id, state) VALUES (?, 'pending')", [(i,) for i in range(n)]
        )
    try:
        yield conn
    finally:
        conn.close()


def _record(conn: Any, pg: bool, i: int, prev: tuple[int, int] | None) -> None:
    """Task ``i - 1``'s end and task ``i``'s start, committed together."""
    now = time.time()
    if pg:
        rc, cpu = prev if prev is not None else (0, 0)
        conn.execute(_BOTH_PG, (now, rc, cpu, i - 1, now, i))
        return
    conn.execute("BEGIN IMMEDIATE")
    if prev is not None:
        conn.execute(_END, (now, prev[0], prev[1], i - 1))
    conn.execute(_START, (now, i))
    conn.execute("COMMIT")


def floor(
    n: int,
    bases: Bases,
    *,
    pg: str | None = None,
    record: bool = True,
    cgroups: str = "per-run",
    command: str = "true",
) -> float:
    """Seconds per task of the floor loop, each task running ``command``."""
    assert cgroups in CGROUPS, cgroups
    v2, v1 = bases
    if cgroups in ("v2-only", "none"):
        v1 = None
    with tempfile.TemporaryDirectory() as directory, _database(pg, n, directory) as conn:
        prev: tuple[int, int] | None = None
        t0 = time.perf_counter()
        for i in range(n):
            if record:
                _record(conn, pg is not None, i, prev)
            groups, cpu_before = enter_cgroups(cgroups, v2, v1, i)
            log = os.path.join(directory, f"run{i}.log")
            proc = start_task(groups, command, open_log(log))
            rc = _wait(proc)
            cpu = leave_cgroups(cgroups, groups, v1) - cpu_before if groups else 0
            if os.stat(log).st_size == 0:
                os.unlink(log)
            prev = (rc, cpu)
        return (time.perf_counter() - t0) / n


def open_log(path: str) -> int:
    """A task's new log file, as the worker makes it (0600, never an old one)."""
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)


def start_task(groups: list[str], command: str, out: int) -> subprocess.Popen[bytes]:
    """The task's shell, started as the worker starts it: in a session of its own, its
    output to ``out`` (closed here), joining ``groups`` (125 if it cannot) before it
    runs ``command``."""
    join = " && ".join(f"echo $$ >{g}/cgroup.procs" for g in groups) or ":"
    try:
        return subprocess.Popen(
            ["/bin/sh", "-c", f"{{ {join}; }} || exit 125; {command}"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            env={"PATH": "/usr/bin:/bin"},
            start_new_session=True,
            close_fds=True,
        )
    finally:
        os.close(out)


def _cpu(group: str) -> int:
    with open(os.path.join(group, "cpu.stat")) as f:
        return int(f.readline().split()[1])


def enter_cgroups(how: str, v2: str, v1: str | None, i: int) -> tuple[list[str], int]:
    """Run ``i``'s cgroups (v2 first, then v1 memory), ready to join; the v2 one's CPU
    time so far (0 unless it is reused)."""
    if how == "none":
        return [], 0
    name = _SLOT if how == "slot" else f"run-{i}"
    groups = [os.path.join(v2, name)] + ([os.path.join(v1, name)] if v1 is not None else [])
    if how == "slot":
        for group in groups:
            if not os.path.isdir(group):
                os.mkdir(group)
        return groups, _cpu(groups[0])
    os.mkdir(groups[0])
    if v1 is not None:
        if how == "v1-renamed":
            spare = os.path.join(v1, _SPARE)
            if not os.path.isdir(spare):
                os.mkdir(spare)
            os.rename(spare, groups[1])
        else:
            os.mkdir(groups[1])
    return groups, 0


def leave_cgroups(how: str, groups: list[str], v1: str | None) -> int:
    """The run ended: its CPU time and peak read, its cgroups removed or kept for the
    next; the v2 cgroup's CPU time."""
    cpu = _cpu(groups[0])
    if len(groups) > 1:
        peak = os.path.join(groups[1], "memory.max_usage_in_bytes")
        with open(peak) as f:
            f.read()
        if how in ("slot", "v1-renamed"):
            with open(peak, "w") as f:
                f.write("0")  # the next run's peak starts from what is charged now
    if how != "slot":
        os.rmdir(groups[0])
    if len(groups) > 1 and how == "v1-renamed":
        assert v1 is not None
        os.rename(groups[1], os.path.join(v1, _SPARE))
    elif len(groups) > 1 and how != "slot":
        os.rmdir(groups[1])
    return cpu


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tasks", type=int, default=1000)
    p.add_argument("--pg", action="store_true", help="the record on a throwaway PostgreSQL")
    args = p.parse_args()
    with cgroup_bases() as bases:
        return _measure(args.tasks, args.pg, bases)


def _measure(n: int, pg: bool, bases: Bases) -> int:
    if pg:
        with c.postgres("floor_sequence") as url:
            conninfo = url.replace("postgresql+psycopg://", "postgresql://")
            for _ in range(2):
                before = baseline(n)
                ours = floor(n, bases, pg=conninfo)
                base = (before + baseline(n)) / 2
                print(
                    f"PostgreSQL: baseline {base * 1000:.3f} ms, floor {ours * 1000:.3f} ms"
                    f" = {ours / base:.2f}x"
                )
        return 0
    for _ in range(2):
        before = baseline(n)
        ours = floor(n, bases)
        unrecorded = floor(n, bases, record=False)
        others = {how: floor(n, bases, cgroups=how) for how in CGROUPS[1:]}
        base = (before + baseline(n)) / 2
        print(
            f"SQLite: baseline {base * 1000:.3f} ms, floor {ours * 1000:.3f} ms = {ours / base:.2f}x;"
            f" without the transaction {unrecorded / base:.2f}x;"
            f" without the v1 memory cgroup {others['v2-only'] / base:.2f}x;"
            f" without cgroups {others['none'] / base:.2f}x;"
            f" the slot's cgroups reused {others['slot'] / base:.2f}x;"
            f" the v1 memory cgroup renamed {others['v1-renamed'] / base:.2f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
