"""Timer accuracy: 200 timer firings, due time -> task process start, against bare timers.

Engine: 200 top-level trees, each a single active task ``date +%s%N`` with
timer ``every 1h``. Each task's history is seeded (``last_ran = due - 1h``,
``last_duration_ms = 0``, a bare UPDATE before the daemon starts) so that the
dispatcher itself evaluates ``next_runs = last end + 1h = due``: 200 distinct
due instants 40 ms apart, the first 3 s ahead, exactly the re-arm an ``every``
timer gets after a run. The dispatcher is started with the production
defaults (SystemClock, APScheduler timers, embedded executor); the due time of
each firing is the ``next_runs`` the dispatcher armed (checked against its
armed timers). The task writes the wall-clock time it started to its log file;
the log is found through the run's ``log_path`` in the run table.

    latency = time ``date`` ran - due time

Baseline (same run, same due-time pattern): one ``threading.Timer`` per firing
posting to a queue that one thread reads and runs
``subprocess.Popen(["/bin/sh", "-c", "date +%s%N"])`` with output to a file.
For information, also APScheduler alone (a ``DateTrigger`` job per firing
posting to the same kind of queue).

Target: p99 latency < 10 ms. Ratios are ours / bare for the median and p99.

With ``--pg --worker-process`` the dispatcher runs no task (0 slots) and a ``jobcontrol
worker`` process (8 slots) runs them, as a site with workers of its own does (the task's
time is then read from its output kept in the database).

    .venv/bin/python bench/bench_timer_accuracy.py [--firings N] [--spacing-ms MS]
        [--pg [--worker-process]] [--cgroups auto|off] [--json]
"""

from __future__ import annotations

import dataclasses
import json
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import _daemon as d
from sqlalchemy import bindparam, select, update

from jobcontrol import Batch, DispatcherConfig, Engine, Kind, NewJob, Store, events
from jobcontrol.runtime import Runtime
from jobcontrol.store.schema import job, run, run_log

TARGET_P99_MS = 10.0
COMMAND = "date +%s%N"
LEAD_S = 3.0


def due_times(n: int, spacing_ms: float, lead_s: float) -> list[datetime]:
    first = datetime.now(UTC) + timedelta(seconds=lead_s)
    return [first + timedelta(milliseconds=spacing_ms * i) for i in range(n)]


def ns(when: datetime) -> int:
    # Exact integer arithmetic: float timestamps lose the microseconds' last digits.
    delta = when - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * 10**9 + delta.microseconds * 1000


# ---------------------------------------------------------------- the engine


# What the engine's runtime said about its containment (status's ``containment``).
seen_containment: list[str] = []


def engine_latencies(
    url: str,
    logs: Path,
    n: int,
    spacing_ms: float,
    cgroups: str = "auto",
    worker_process: bool = False,
) -> dict[str, list[float]]:
    """Per firing, in ms after its due time: run row created (the dispatcher handled the
    timer), run claimed by an executor slot, and the task's process started.

    ``worker_process`` (PostgreSQL): the dispatcher runs no task (0 slots) and a
    ``jobcontrol worker`` process of its own, 8 slots, runs them; their output is kept
    in the database (``run_log``), where the task's time is read from."""
    store = Store(url)
    store.upgrade()
    names = [f"timer-{i:04d}" for i in range(n)]
    Engine(store).apply_batch(
        Batch(
            creates=[
                NewJob(
                    name, Kind.TASK, None, {"active": True, "timer": "every 1h", "command": COMMAND}
                )
                for name in names
            ]
        ),
        user="bench",
    )
    dues = due_times(n, spacing_ms, LEAD_S)
    with store.write() as conn:
        ids = {r.name: r.id for r in conn.execute(select(job.c.id, job.c.name))}
        conn.execute(
            update(job)
            .where(job.c.id == bindparam("b_id"))
            .values(last_ran=bindparam("b_ran"), last_duration_ms=0),
            [
                {"b_id": ids[name], "b_ran": due - timedelta(hours=1)}
                for name, due in zip(names, dues, strict=False)
            ],
        )
    done = threading.Event()
    finished: list[int] = []

    def on_finished(_sender: Any, *, run: dict[str, Any]) -> None:
        finished.append(run["job_id"])
        if len(finished) >= n:
            done.set()

    events.run_finished.connect(on_finished, weak=False)
    config = DispatcherConfig(log_root=logs)  # the production defaults
    if worker_process:
        config = dataclasses.replace(config, slots=0)  # the worker process runs the tasks
    runtime = Runtime(store, config, cgroups=cgroups)
    dispatcher = runtime.dispatcher
    workers = d.CliDaemon(url, logs.parent / "worker-cli")
    if worker_process:
        workers.env["JOBCONTROL_CGROUPS"] = cgroups
    try:
        if worker_process:
            workers.start_worker("bench-worker", 8)
        runtime.start()
        armed = {top_id: a.when for top_id, a in dispatcher.tree_timers.armed.items()}
        with store.read() as conn:
            next_runs = {r.id: r.next_runs for r in conn.execute(select(job.c.id, job.c.next_runs))}
        for name, due in zip(names, dues, strict=False):
            if next_runs[ids[name]] != due or armed.get(ids[name]) != due:
                raise SystemExit(f"{name}: armed {armed.get(ids[name])}, expected {due}")
        if datetime.now(UTC) >= dues[0]:
            raise SystemExit("start-up took longer than the lead time; raise LEAD_S")
        wait = (dues[-1] - datetime.now(UTC)).total_seconds() + 30
        if not done.wait(wait):
            raise SystemExit(f"only {len(finished)} of {n} firings finished")
        with store.read() as conn:
            rows = conn.execute(
                select(
                    run.c.id,
                    run.c.job_id,
                    run.c.log_path,
                    run.c.exit_status,
                    run.c.created,
                    run.c.started,
                ).where(run.c.kind == "task")
            ).all()
            kept = {r.run_id: bytes(r.data) for r in conn.execute(select(run_log)) if r.seq == 0}
        seen_containment.append(runtime.containment_view())
        if worker_process:
            listed = json.loads(workers.jc("workers", "--json"))
            seen_containment.extend(
                f"worker process: {w['containment']}" for w in listed if w["name"] == "bench-worker"
            )
    finally:
        events.run_finished.disconnect(on_finished)
        workers.stop()
        runtime.stop(timeout=30)
        store.dispose()
    due_ns = {ids[name]: ns(due) for name, due in zip(names, dues, strict=False)}
    out: dict[str, list[float]] = {"created": [], "claimed": [], "process": []}
    for r in rows:
        if r.exit_status != 0 or not (r.log_path or r.id in kept):
            raise SystemExit(f"job {r.job_id}: exit {r.exit_status}, log {r.log_path}")
        text = kept[r.id].decode() if r.id in kept else Path(r.log_path).read_text()
        started = int(text.split()[0])
        due = due_ns[r.job_id]
        out["process"].append((started - due) / 1e6)
        out["created"].append((ns(r.created) - due) / 1e6)
        out["claimed"].append((ns(r.started) - due) / 1e6)
    if len(out["process"]) != n:
        raise SystemExit(f"{len(out['process'])} task runs, expected {n}")
    return out


# ---------------------------------------------------------------- baselines


class _Spawner:
    """The bare consumer: one thread reads the queue and starts the process."""

    def __init__(self, outdir: Path, n: int) -> None:
        self.outdir = outdir
        self.queue: queue.SimpleQueue[int] = queue.SimpleQueue()
        self.procs: list[subprocess.Popen[bytes]] = []
        self.n = n
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        for _ in range(self.n):
            i = self.queue.get()
            with open(self.outdir / f"{i}.out", "wb") as out:
                self.procs.append(
                    subprocess.Popen(
                        ["/bin/sh", "-c", COMMAND], stdout=out, stderr=subprocess.STDOUT
                    )
                )

    def latencies(self, dues: list[datetime]) -> list[float]:
        self.thread.join(60)
        for p in self.procs:
            p.wait()
        return [
            (int((self.outdir / f"{i}.out").read_text().split()[0]) - ns(due)) / 1e6
            for i, due in enumerate(dues)
        ]


def bare_threading_timer(outdir: Path, n: int, spacing_ms: float) -> list[float]:
    outdir.mkdir()
    spawner = _Spawner(outdir, n)
    dues = due_times(n, spacing_ms, 1.0)
    timers = []
    for i, due in enumerate(dues):
        delay = (due - datetime.now(UTC)).total_seconds()
        t = threading.Timer(delay, spawner.queue.put, args=(i,))
        t.daemon = True
        t.start()
        timers.append(t)
    return spawner.latencies(dues)


def bare_apscheduler(outdir: Path, n: int, spacing_ms: float) -> list[float]:
    from apscheduler.executors.pool import ThreadPoolExecutor
    from apscheduler.schedulers.background import BackgroundScheduler
    from apscheduler.triggers.date import DateTrigger

    outdir.mkdir()
    spawner = _Spawner(outdir, n)
    scheduler = BackgroundScheduler(
        timezone=UTC,
        executors={"default": ThreadPoolExecutor(4)},
        job_defaults={"misfire_grace_time": None, "coalesce": True, "max_instances": 1},
    )
    scheduler.start()
    dues = due_times(n, spacing_ms, 1.0)
    post: Callable[[int], None] = spawner.queue.put
    for i, due in enumerate(dues):
        scheduler.add_job(post, DateTrigger(run_date=due, timezone=UTC), args=(i,), id=str(i))
    try:
        return spawner.latencies(dues)
    finally:
        scheduler.shutdown(wait=False)


# ---------------------------------------------------------------- the report


def bench(
    store_name: str,
    url: str,
    tmp: Path,
    n: int,
    spacing_ms: float,
    cgroups: str = "auto",
    worker_process: bool = False,
) -> c.Report:
    print(
        f"[{store_name}] bare threading.Timer: {n} firings {spacing_ms:g} ms apart ...", flush=True
    )
    bare = bare_threading_timer(tmp / f"{store_name}-bare", n, spacing_ms)
    print(f"[{store_name}] bare APScheduler: {n} firings ...", flush=True)
    aps = bare_apscheduler(tmp / f"{store_name}-aps", n, spacing_ms)
    print(f"[{store_name}] engine: {n} trees, one firing each ...", flush=True)
    phases = engine_latencies(
        url, tmp / f"{store_name}-logs", n, spacing_ms, cgroups, worker_process
    )
    ours = phases["process"]
    rep = c.Report("bench_timer_accuracy", store_name)
    rep.notes.append(f"cgroup per task run: {cgroups}")
    if worker_process:
        rep.notes.append("the daemon ran no task: a `jobcontrol worker` process (8 slots) did")
    rep.notes += [f"containment: {line}" for line in seen_containment]
    seen_containment.clear()
    rep.add("firings", n, "")
    for label, values in (
        ("engine", ours),
        ("baseline threading.Timer", bare),
        ("APScheduler alone", aps),
    ):
        rep.add(f"{label}: median", c.median(values), "ms")
        rep.add(f"{label}: p99", c.percentile(values, 99), "ms")
        rep.add(f"{label}: max", max(values), "ms")
    rep.add("engine: due -> run row created, median", c.median(phases["created"]), "ms")
    rep.add("engine: due -> run claimed by a slot, median", c.median(phases["claimed"]), "ms")
    if min(ours) < 0:
        rep.notes.append(f"a task started {-min(ours):.3f} ms BEFORE its due time")
    rep.ratios["median engine / bare"] = c.ratio(c.median(ours), c.median(bare))
    rep.ratios["p99 engine / bare"] = c.ratio(c.percentile(ours, 99), c.percentile(bare, 99))
    rep.checks.append(c.Check("engine p99 latency", c.percentile(ours, 99), TARGET_P99_MS, "ms"))
    return rep


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--firings", type=int, default=200)
    p.add_argument("--spacing-ms", type=float, default=40.0)
    p.add_argument(
        "--cgroups",
        choices=("auto", "off"),
        default="auto",
        help="a cgroup per task run where the machine allows (the daemon's default), or off",
    )
    p.add_argument(
        "--worker-process",
        action="store_true",
        help="PostgreSQL only: the daemon runs no task; a `jobcontrol worker` process does",
    )
    args = p.parse_args()
    if args.worker_process and not args.pg:
        p.error("--worker-process needs --pg: a worker process of its own is PostgreSQL's")
    more = (args.firings, args.spacing_ms, args.cgroups)
    reports = []
    with c.temp_dir("timer") as tmp:
        if not args.worker_process:
            reports.append(bench("sqlite", c.sqlite_url(tmp), tmp, *more))
        if args.pg:
            with c.postgres("bench_timer") as url:
                reports.append(bench("postgresql", url, tmp, *more, args.worker_process))
    for rep in reports:
        rep.print(as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
