"""The worker's finish alone, on PostgreSQL: one task run's end recorded and the next of
its chain taken, in a loop, with and without a log to record (and prune).

A probe for ``bench/README.md`` (twentieth round), not a benchmark with a target: no
engine, no process, no baseline. A chain of runs of one job is queued (each pending
after the one before it, as a sequence queues ahead), the table analysed, the first run
claimed; then each ``RunQueue.finish`` records the end and takes the next, on one
pinned connection as the worker's slot thread does. With a log, every finish past the
job's fifth prunes one (``max_log_files``). Printed per finish: median wall time, and
the mean wall and thread CPU.

    .venv/bin/python bench/probe_finish.py [--finishes N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

from jobcontrol.store import Store, queries
from jobcontrol.store.runqueue import RunQueue

WARM = 100


def queue_chain(store: Store, n: int) -> list[int]:
    now = datetime.now(UTC)
    ids: list[int] = []
    with store.write() as conn:
        for i in range(n):
            values: dict[str, Any] = {
                "job_id": 1,
                "job_name": f"probe-{i}",
                "kind": "task",
                "trigger": "manual",
                "state": "pending" if ids else "queued",
                "queue": "default",
                "priority": 0,
                "created": now,
                "command": "true",
                "requested_by": "probe",
            }
            if ids:
                values.update(after_run_id=ids[-1], after_ok_only=False)
            ids.append(queries.insert_run(conn, values))
    with store.write() as conn:
        conn.exec_driver_sql("ANALYZE run")  # planned for the rows there are (see README)
    return ids


def probe(url: str, finishes: int, logged: bool) -> tuple[float, float, float]:
    store = Store(url)
    store.upgrade()
    rq = RunQueue(store)
    first = queue_chain(store, WARM + finishes + 1)[0]
    with store.pinned():
        (run,) = rq.claim("probe", "host", datetime.now(UTC), run_id=first)
        walls: list[float] = []
        cpu = 0.0
        for i in range(WARM + finishes):
            ended = datetime.now(UTC)
            values = {
                "state": "succeeded",
                "exit_status": 0,
                "signal": None,
                "reason": None,
                "ended": ended,
                "duration_ms": 1,
                "log_path": f"/nonexistent/run{run.id}.log" if logged else None,
                "pid": 1,
                "lease_until": None,
                "cpu_us": 10,
                "mem_peak_bytes": 100,
            }
            t0, c0 = time.perf_counter(), time.thread_time()
            done = rq.finish(
                run.id, "probe", values, 5, take_next=("host", lambda ended=ended: ended)
            )
            if i >= WARM:
                walls.append(time.perf_counter() - t0)
                cpu += time.thread_time() - c0
            if not done.recorded or done.next is None:
                raise SystemExit(f"finish {i}: not recorded, or no next run taken")
            run = done.next
    store.dispose()
    return statistics.median(walls), statistics.mean(walls), cpu / finishes


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--finishes", type=int, default=800)
    args = p.parse_args()
    for logged in (True, False):
        what = "with a log" if logged else "without a log"
        name = f"probe_finish_{'log' if logged else 'quiet'}"
        with c.postgres(name) as url:
            median, mean, cpu = probe(url, args.finishes, logged)
        print(
            f"finish {what}: wall median {median * 1e3:.3f} ms, mean {mean * 1e3:.3f} ms,"
            f" CPU mean {cpu * 1e3:.3f} ms ({args.finishes} finishes)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
