"""A thread per slot against one thread waiting on every task's pidfd: what each costs
the process per task, outside the engine, for ``bench_many_trees``'s target.

The engine's embedded worker runs each slot in a thread of its own: it starts the task,
waits on its pidfd and records its end. The sixth and seventeenth rounds of
``bench/README.md`` put a sixth of the daemon's CPU in the interpreter lock's hand-offs
between those threads. This prototype measures whether one thread for all slots (an
``epoll`` on the tasks' pidfds and a wake-up fd) would take a worthwhile share of that
away, before anyone rebuilds the worker around it.

Both designs do the same per task, in one process, closed loop:
- a "dispatcher" thread takes each end from a queue, records it in one SQLite
  transaction (the tree run's end and the next task run queued: an UPDATE and an
  INSERT) and hands the new run to the worker;
- the worker opens the run's log file, starts ``/bin/sh -c true`` with ``Popen`` (vfork),
  waits for it on a pidfd, removes the empty log and records the end in a transaction
  of its own (an UPDATE) on its own connection;
- ``--trees`` runs are in flight at any time (each end queues the next);
- with ``--pin N`` every thread is kept on CPU N, and a task's process is started on
  every CPU, as a saturated daemon does (``jobcontrol/cpupin.py``).

Printed: tasks a second, the process's CPU per task (user + system, from
``getrusage``), its kernel share and its context switches per task, for each design, in
alternating rounds. It measures no code of Job Control and is not part of ``run_all.py``.

    .venv/bin/python bench/floor_slots.py [--seconds S] [--rounds N] [--slots K] [--trees M] [--pin N]
"""

from __future__ import annotations

import argparse
import os
import queue
import resource
import select
import sqlite3
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_SCHEMA = (
    "CREATE TABLE run (id INTEGER PRIMARY KEY, tree INTEGER, state TEXT, queued FLOAT,"
    " started FLOAT, ended FLOAT, exit_status INTEGER)"
)
_QUEUE = "INSERT INTO run (tree, state, queued) VALUES (?, 'queued', ?)"
_TREE_END = "UPDATE run SET state = 'done' WHERE id = ?"
_END = "UPDATE run SET state = 'succeeded', started = ?, ended = ?, exit_status = ? WHERE id = ?"
_ARGV = ["/bin/sh", "-c", "true"]


def _connect(path: str) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=5000")
    return conn


class _Run:
    __slots__ = ("id", "tree", "log", "out", "proc", "pidfd", "started")

    def __init__(self, run_id: int, tree: int, log: str) -> None:
        self.id = run_id
        self.tree = tree
        self.log = log
        self.out: Any = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.pidfd = -1
        self.started = 0.0


class _Loop:
    """What both designs share: the dispatcher's thread and the per-task steps."""

    def __init__(self, db: str, logs: str, trees: int, pin: int | None) -> None:
        self.pin = None if pin is None else {pin}
        self.every_cpu = os.sched_getaffinity(0)
        self.db = db
        self.logs = logs
        self.trees = trees
        self.ends: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
        self.done = 0
        self.stop = False
        self.give: Callable[[_Run], None] = lambda run: None
        self.stop_worker: Callable[[], None] = lambda: None

    def _new_run(self, conn: sqlite3.Connection, tree: int, ended: _Run | None) -> _Run:
        conn.execute("BEGIN IMMEDIATE")
        if ended is not None:
            conn.execute(_TREE_END, (ended.id,))
        run_id = conn.execute(_QUEUE, (tree, time.time())).lastrowid
        conn.execute("COMMIT")
        assert run_id is not None
        return _Run(run_id, tree, f"{self.logs}/run{run_id}.log")

    def pinned(self) -> None:
        """The calling thread on the one CPU, as the engine keeps a saturated daemon's."""
        if self.pin is not None:
            os.sched_setaffinity(0, self.pin)

    def dispatcher(self) -> None:
        self.pinned()
        conn = _connect(self.db)
        for tree in range(self.trees):
            self.give(self._new_run(conn, tree, None))
        while True:
            ended = self.ends.get()
            if ended is None:
                return
            self.done += 1
            if not self.stop:
                self.give(self._new_run(conn, ended.tree, ended))

    def spawn(self, run: _Run) -> None:
        fd = os.open(run.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        run.out = fd
        run.started = time.time()
        if self.pin is not None:  # the task gets every CPU (``cpupin.enter_spawn``)
            os.sched_setaffinity(0, self.every_cpu)
        run.proc = subprocess.Popen(_ARGV, stdout=fd, stderr=subprocess.STDOUT, close_fds=True)
        self.pinned()
        run.pidfd = os.pidfd_open(run.proc.pid)

    def finish(self, run: _Run, conn: sqlite3.Connection) -> None:
        assert run.proc is not None
        rc = run.proc.wait()
        os.close(run.pidfd)
        os.close(run.out)
        if os.stat(run.log).st_size == 0:
            os.unlink(run.log)
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(_END, (run.started, time.time(), rc, run.id))
        conn.execute("COMMIT")
        self.ends.put(run)


def _threads(loop: _Loop, slots: int) -> list[threading.Thread]:
    """The engine's design: a thread per slot, each waiting on its own task's pidfd."""
    work: queue.SimpleQueue[_Run | None] = queue.SimpleQueue()
    loop.give = work.put

    def slot() -> None:
        loop.pinned()
        conn = _connect(loop.db)
        poller = select.poll()
        while True:
            run = work.get()
            if run is None:
                return
            loop.spawn(run)
            poller.register(run.pidfd, select.POLLIN)
            poller.poll()
            poller.unregister(run.pidfd)
            loop.finish(run, conn)

    def stop() -> None:
        for _ in range(slots):
            work.put(None)

    loop.stop_worker = stop
    return [threading.Thread(target=slot, daemon=True) for _ in range(slots)]


def _one_thread(loop: _Loop, slots: int) -> list[threading.Thread]:
    """One thread for every slot: an epoll on the pidfds and a wake-up eventfd."""
    ready: list[_Run | None] = []
    lock = threading.Lock()
    bell = os.eventfd(0, os.EFD_CLOEXEC | os.EFD_NONBLOCK)

    def give(run: _Run | None) -> None:
        with lock:
            ready.append(run)
        os.eventfd_write(bell, 1)

    loop.give = give

    def worker() -> None:
        loop.pinned()
        conn = _connect(loop.db)
        ep = select.epoll()
        ep.register(bell, select.EPOLLIN)
        waiting: dict[int, _Run] = {}
        backlog: list[_Run] = []
        while True:
            for fd, _ in ep.poll():
                if fd == bell:
                    os.eventfd_read(bell)
                    with lock:
                        got, ready[:] = list(ready), []
                    if None in got:
                        return
                    backlog.extend(r for r in got if r is not None)
                    continue
                run = waiting.pop(fd)
                ep.unregister(fd)
                loop.finish(run, conn)
            while backlog and len(waiting) < slots:
                run = backlog.pop(0)
                loop.spawn(run)
                waiting[run.pidfd] = run
                ep.register(run.pidfd, select.EPOLLIN)

    loop.stop_worker = lambda: give(None)
    return [threading.Thread(target=worker, daemon=True)]


def _measure(
    design: str, seconds: float, slots: int, trees: int, pin: int | None
) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="floor-slots-") as tmp:
        db = f"{tmp}/runs.db"
        conn = _connect(db)
        conn.execute(_SCHEMA)
        conn.close()
        Path(f"{tmp}/logs").mkdir()
        loop = _Loop(db, f"{tmp}/logs", trees, pin)
        workers = (_threads if design == "threads" else _one_thread)(loop, slots)
        for t in workers:
            t.start()
        disp = threading.Thread(target=loop.dispatcher, daemon=True)
        disp.start()
        time.sleep(1.0)  # warm: the first runs and the files' first pages
        r0, n0, t0 = resource.getrusage(resource.RUSAGE_SELF), loop.done, time.monotonic()
        time.sleep(seconds)
        r1, n1, t1 = resource.getrusage(resource.RUSAGE_SELF), loop.done, time.monotonic()
        loop.stop = True
        time.sleep(0.2)
        loop.stop_worker()
        loop.ends.put(None)
        for t in [*workers, disp]:
            t.join(10)
    n = n1 - n0
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    switches = (r1.ru_nvcsw - r0.ru_nvcsw) + (r1.ru_nivcsw - r0.ru_nivcsw)
    return {
        "tasks_per_s": n / (t1 - t0),
        "cpu_ms_per_task": (user + system) / n * 1000,
        "kernel_share": system / (user + system),
        "switches_per_task": switches / n,
        "cpu_share": (user + system) / (t1 - t0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--slots", type=int, default=8)
    ap.add_argument("--trees", type=int, default=8, help="runs in flight at any time")
    ap.add_argument(
        "--pin", type=int, default=None, help="keep the threads on this CPU (tasks on every one)"
    )
    args = ap.parse_args()
    results: dict[str, list[dict[str, float]]] = {"threads": [], "one thread": []}
    for i in range(args.rounds):
        order = ["threads", "one thread"] if i % 2 == 0 else ["one thread", "threads"]
        for design in order:
            r = _measure(design, args.seconds, args.slots, args.trees, args.pin)
            results[design].append(r)
            print(
                f"round {i + 1} {design:>10}: {r['tasks_per_s']:7.1f} tasks/s, "
                f"{r['cpu_ms_per_task']:.3f} ms CPU a task ({r['kernel_share']:.0%} kernel), "
                f"{r['switches_per_task']:.1f} switches a task, {r['cpu_share']:.0%} of a core",
                flush=True,
            )
    for key in ("tasks_per_s", "cpu_ms_per_task", "switches_per_task"):
        a = sorted(r[key] for r in results["one thread"])
        b = sorted(r[key] for r in results["threads"])
        ratio = a[len(a) // 2] / b[len(b) // 2]
        print(f"median {key}: one thread / threads = {ratio:.3f}x")


if __name__ == "__main__":
    main()
