"""The APScheduler 3 baselines of bench_many_trees and bench_idle, run as a child process.

    python bench/_aps_child.py interval --jobs 500 --duration 60
        A BackgroundScheduler with ``--jobs`` IntervalTrigger(seconds=1) jobs, all
        starting at the same instant S (1 s ahead), each running
        ``subprocess.Popen(["true"]).wait()``. Prints one JSON line: per run due in
        [S, S + duration), its due time and its lateness (the time just before
        ``Popen`` - the scheduled run time APScheduler handed to the executor), and
        this process's CPU over [S, S + duration) from /proc/self/stat.

    python bench/_aps_child.py idle --jobs 1000
        A BackgroundScheduler with ``--jobs`` CronTrigger(minute=0) jobs; prints
        READY once started and idles until its standard input is closed (the
        parent measures its CPU from /proc/<pid>/stat meanwhile).

Production-like defaults: the default ThreadPoolExecutor (10 threads), the
memory job store, ``coalesce=True``, ``max_instances=1``, no misfire grace limit.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _daemon import cpu
from apscheduler.events import EVENT_JOB_MAX_INSTANCES, EVENT_JOB_MISSED, JobEvent
from apscheduler.executors.base import run_job
from apscheduler.executors.pool import ThreadPoolExecutor
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.interval import IntervalTrigger

JOB_DEFAULTS = {"coalesce": True, "max_instances": 1, "misfire_grace_time": None}

_due = threading.local()


class DueRecordingExecutor(ThreadPoolExecutor):
    """APScheduler's ThreadPoolExecutor (10 threads), except that the worker thread
    learns the scheduled time of the run it executes (``_due.value``) before calling
    ``run_job`` exactly as the stock executor does."""

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        def call() -> Any:
            _due.value = run_times[-1]  # coalesce=True: the scheduler submits one time
            return run_job(job, job._jobstore_alias, run_times, self._logger.name)

        def done(f: Future[Any]) -> None:
            exc = f.exception()
            if exc is not None:
                self._run_job_error(job.id, exc, exc.__traceback__)
            else:
                self._run_job_success(job.id, f.result())

        self._pool.submit(call).add_done_callback(done)


def interval(jobs: int, duration: float) -> dict[str, Any]:
    records: list[tuple[float, float]] = []  # (due, popen) epoch seconds
    skipped: list[int] = [0]

    def run_true() -> None:
        records.append((_due.value.timestamp(), time.time()))
        subprocess.Popen(["true"]).wait()

    def on_skip(_event: JobEvent) -> None:
        skipped[0] += 1

    scheduler = BackgroundScheduler(
        timezone=UTC, executors={"default": DueRecordingExecutor()}, job_defaults=JOB_DEFAULTS
    )
    scheduler.add_listener(on_skip, EVENT_JOB_MAX_INSTANCES | EVENT_JOB_MISSED)
    start = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    for i in range(jobs):
        scheduler.add_job(
            run_true, IntervalTrigger(seconds=1, start_date=start, timezone=UTC), id=f"j{i}"
        )
    scheduler.start()
    s = start.timestamp()
    time.sleep(max(0.0, s - time.time()))
    before = cpu()
    time.sleep(max(0.0, s + duration - time.time()))
    after = cpu()
    scheduler.shutdown(wait=True)  # the runs already handed to the pool still run
    wall, own, children = after.since(before)
    runs = [(due - s, (popen - due) * 1000) for due, popen in records if due < s + duration]
    return {
        "jobs": jobs,
        "duration": duration,
        "runs": runs,  # [due - S (s), lateness (ms)]
        "skipped": skipped[0],
        "cpu_wall_s": wall,
        "cpu_own_s": own,
        "cpu_children_s": children,
    }


def idle(jobs: int) -> None:
    def run_true() -> None:
        subprocess.Popen(["true"]).wait()

    scheduler = BackgroundScheduler(job_defaults=JOB_DEFAULTS)  # the local zone, like the daemon
    for i in range(jobs):
        scheduler.add_job(run_true, CronTrigger(minute=0), id=f"j{i}")
    scheduler.start()
    print("READY", flush=True)
    sys.stdin.read()  # until the parent closes the pipe
    scheduler.shutdown(wait=False)


def main() -> int:
    # Skipped runs are counted by a listener; their warnings would only flood stderr.
    logging.getLogger("apscheduler").setLevel(logging.ERROR)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("mode", choices=["interval", "idle"])
    p.add_argument("--jobs", type=int, required=True)
    p.add_argument("--duration", type=float, default=60.0)
    args = p.parse_args()
    if args.mode == "interval":
        print(json.dumps(interval(args.jobs, args.duration)), flush=True)
    else:
        idle(args.jobs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
