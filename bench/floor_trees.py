"""The floor of ``bench_many_trees`` on this host: not the engine, but the least any
design does for N trees ``every 1s`` (one task ``true`` each) that keeps the engine's
promises, in one process with one thread and no Python between the steps but theirs.

Per tree run:
- its start committed before its task starts: a box run and a task run inserted (the
  starts due together share one transaction, as the engine's batched events do);
- the log file created, the run's cgroups made (v2, and the v1 memory one where the
  layout is hybrid), ``Popen`` of ``/bin/sh -c`` with the join script;
- its end seen by a pidfd in one ``epoll`` (no thread per task), the cgroup's CPU and
  peak read, the cgroups and the empty log removed;
- its end committed: the task run, the box run and the job's last result (the ends seen
  together share one transaction), and the tree re-armed 1 s after its end.

At most ``--slots`` tasks run at once (8, the daemon's default). The lateness of a
tree run is the time just before ``Popen`` less its due time (its last end + 1 s), as
``bench_many_trees`` measures the engine's; a tree's first run is not counted. Also
printed: tree runs per second, this process's CPU (user + system, its children apart)
as % of one core and per tree run. ``--cgroups none`` leaves the cgroups out. It needs
root (it makes cgroups). It measures no code of Job Control; ``bench_many_trees.py``
runs it beside the engine.

    .venv/bin/python bench/floor_trees.py [--trees 500] [--duration 20] [--cgroups none]
"""

from __future__ import annotations

import argparse
import heapq
import os
import select
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c  # noqa: E402
from floor_sequence import (  # noqa: E402
    Bases,
    bases_for,
    enter_cgroups,
    leave_cgroups,
    open_log,
    start_task,
)

_SCHEMA = (
    "CREATE TABLE job (id INTEGER PRIMARY KEY, last_ran FLOAT, next_runs FLOAT,"
    " exit_status INTEGER)",
    "CREATE TABLE run (id INTEGER PRIMARY KEY, parent_id INTEGER, job_id INTEGER,"
    " state TEXT, started FLOAT, ended FLOAT, exit_status INTEGER, cpu BIGINT)",
    "CREATE INDEX run_job ON run (job_id, id)",
    "CREATE INDEX run_state ON run (state)",
)
_BOX = "INSERT INTO run (job_id, state, started) VALUES (?, 'running', ?)"
_TASK = "INSERT INTO run (parent_id, job_id, state, started) VALUES (?, ?, 'running', ?)"
_END = "UPDATE run SET state = ?, ended = ?, exit_status = ?, cpu = ? WHERE id = ? AND state = 'running'"
_JOB = "UPDATE job SET last_ran = ?, next_runs = ?, exit_status = ? WHERE id = ?"


def run(trees: int, duration: float, slots: int = 8, cgroups: str = "per-run") -> dict[str, Any]:
    """The floor for ``duration`` s: tree runs counted, per second, lateness p50 and p99
    (ms), this process's CPU (% of a core, ms per tree run)."""
    with bases_for(cgroups) as bases:
        return _run(trees, duration, slots, bases)


def _run(trees: int, duration: float, slots: int, bases: Bases) -> dict[str, Any]:
    v2, v1 = bases
    per_run = bool(v2)
    with tempfile.TemporaryDirectory() as directory:
        db = sqlite3.connect(os.path.join(directory, "floor.db"), isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        for stmt in _SCHEMA:
            db.execute(stmt)
        db.executemany("INSERT INTO job (id) VALUES (?)", [(t,) for t in range(trees)])
        poll = select.epoll()
        start = time.time() + 0.5
        due: list[tuple[float, int]] = [(start, t) for t in range(trees)]
        heapq.heapify(due)
        running: dict[int, tuple[int, subprocess.Popen[bytes], list[str], str, int, int]] = {}
        first = set(range(trees))  # a tree's first run is not counted
        window = (start + 2.0, start + 2.0 + duration)  # the burst of first runs left out
        late: list[float] = []
        counted = 0
        cpu_at: list[float] = []
        while True:
            now = time.time()
            if not cpu_at and now >= window[0]:
                t = os.times()
                cpu_at.append(t.user + t.system)
            if now >= window[1]:
                break
            starts: list[tuple[int, float]] = []
            while due and due[0][0] <= now and len(running) + len(starts) < slots:
                when, tree = heapq.heappop(due)
                starts.append((tree, when))
            if starts:
                db.execute("BEGIN IMMEDIATE")
                ids: list[tuple[int, int]] = []
                for tree, _when in starts:
                    box = db.execute(_BOX, (tree, now)).lastrowid
                    task = db.execute(_TASK, (box, tree, now)).lastrowid
                    assert box is not None
                    assert task is not None
                    ids.append((box, task))
                db.execute("COMMIT")
                for (tree, when), (box, task) in zip(starts, ids, strict=True):
                    groups, _ = enter_cgroups("per-run" if per_run else "none", v2, v1, task)
                    log = os.path.join(directory, f"run{task}.log")
                    out = open_log(log)
                    popen = time.time()
                    if tree not in first and window[0] <= when < window[1]:
                        late.append(popen - when)
                    first.discard(tree)
                    proc = start_task(groups, "true", out)
                    fd = os.pidfd_open(proc.pid)
                    poll.register(fd, select.EPOLLIN)
                    running[fd] = (tree, proc, groups, log, box, task)
            if due and len(running) < slots:
                timeout = max(0.0, min(due[0][0], window[1]) - time.time())
            else:
                timeout = max(0.0, window[1] - time.time())
            events = poll.poll(timeout)
            if not events:
                continue
            ends = []
            for fd, _mask in events:
                tree, proc, groups, log, box, task = running.pop(fd)
                poll.unregister(fd)
                os.close(fd)
                rc = proc.wait()
                cpu = leave_cgroups("per-run", groups, v1) if groups else 0
                if os.stat(log).st_size == 0:
                    os.unlink(log)
                ends.append((tree, rc, cpu, box, task))
            ended = time.time()
            db.execute("BEGIN IMMEDIATE")
            for tree, rc, cpu, box, task in ends:
                state = "succeeded" if rc == 0 else "failed"
                db.execute(_END, (state, ended, rc, cpu, task))
                db.execute(_END, (state, ended, rc, None, box))
                db.execute(_JOB, (ended, ended + 1.0, rc, tree))
            db.execute("COMMIT")
            for tree, *_ in ends:
                heapq.heappush(due, (ended + 1.0, tree))
                if window[0] <= ended < window[1]:
                    counted += 1
        t = os.times()
        cpu_s = t.user + t.system - cpu_at[0]
        for fd, (_tree, proc, groups, _log, _box, _task) in running.items():
            proc.wait()
            if groups:
                leave_cgroups("per-run", groups, v1)
            os.close(fd)
        poll.close()
        db.close()
    late.sort()
    return {
        "runs": counted,
        "per_s": counted / duration,
        "p50": c.percentile(late, 50) * 1000,
        "p99": c.percentile(late, 99) * 1000,
        "cpu_pct": 100 * cpu_s / duration,
        "cpu_per_run_ms": 1000 * cpu_s / max(1, counted),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", type=int, default=500)
    p.add_argument("--duration", type=float, default=20.0)
    p.add_argument("--slots", type=int, default=8)
    p.add_argument("--cgroups", choices=("per-run", "none"), default="per-run")
    args = p.parse_args()
    r = run(args.trees, args.duration, args.slots, args.cgroups)
    print(
        f"floor, {args.trees} trees every 1s, {args.slots} slots, cgroups {args.cgroups},"
        f" {args.duration:g} s: {r['per_s']:.0f} tree runs/s, lateness p50 {r['p50']:.1f} ms,"
        f" p99 {r['p99']:.1f} ms; CPU {r['cpu_pct']:.1f} % of a core,"
        f" {r['cpu_per_run_ms']:.3f} ms per tree run"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
