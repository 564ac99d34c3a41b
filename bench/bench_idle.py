"""Idle cost: the real daemon with 1,000 hourly trees and nothing to do, against APScheduler.

Engine: 1,000 active top-level boxes, each with timer ``cron 0 * * * *`` and one
active task ``true``, loaded with ``jobcontrol load``; the daemon is started with
``jobcontrol daemon start --port 0`` (a separate process, production defaults:
admin API on, 8 executor slots), which returns once the daemon is ready. After
``--settle`` seconds (5) its CPU is measured over ``--duration`` seconds (120, so
that the window holds two of an idle worker's once-a-minute beats)
from ``/proc/<pid>/stat`` (utime + stime of all its threads / CLK_TCK), as % of
one core; then ``jobcontrol daemon stop --kill``. Nothing of ``jobcontrol`` is
imported. Also shown: the same CPU from the threads' ``schedstat``
(nanoseconds; a clock tick is 1/CLK_TCK s, i.e. 0.008 % of a core over 120 s),
context switches per second (wake-ups) and the number of threads.

Baseline (same run, a child process): APScheduler 3 ``BackgroundScheduler``
with 1,000 ``CronTrigger(minute=0)`` jobs (default ThreadPoolExecutor, memory
job store), the same settle time and measurement.

The measurement is kept clear of the top of the hour (the script waits, at
most about three minutes, if the hour would fall inside a phase); the
daemon's ``run`` table is checked to be empty afterwards.

Target: daemon < 0.1 % of a core. Ratio engine / APScheduler.

    .venv/bin/python bench/bench_idle.py [--trees N] [--settle S] [--duration S] [--pg] [--json]
"""

from __future__ import annotations

import select
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import _daemon as d

HERE = Path(__file__).resolve().parent

TARGET_CPU_PCT = 0.1
START_ALLOWANCE_S = 30.0  # load + start, for the top-of-the-hour guard


def measure(pid: int, settle: float, duration: float) -> dict[str, float]:
    """Wait ``settle`` s, then measure the process over ``duration`` s."""
    time.sleep(settle)
    cpu0, thr0 = d.cpu(pid), d.threads(pid)
    time.sleep(duration)
    cpu1, thr1 = d.cpu(pid), d.threads(pid)
    wall, own, _children = cpu1.since(cpu0)
    return {
        "cpu_pct": 100 * own / wall,
        "ticks": round(own * d.CLK_TCK),
        "sched_pct": 100 * (thr1.cpu_ns - thr0.cpu_ns) / 1e9 / (thr1.at - thr0.at),
        "switches_per_s": (thr1.switches - thr0.switches) / (thr1.at - thr0.at),
        "threads": thr1.count,
        "startup_cpu_s": cpu0.own,  # everything before the window: start-up and settling
    }


def engine(db: str, tmp: Path, trees: int, settle: float, duration: float) -> dict[str, Any]:
    with d.CliDaemon(db, tmp) as daemon:
        print(f"  {daemon.load(d.one_task_trees(trees, 'cron 0 * * * *'), tmp / 'trees.yaml')}")
        d.clear_of_the_hour(START_ALLOWANCE_S + settle + duration)
        t0 = time.monotonic()
        pid = daemon.start()
        start_s = time.monotonic() - t0
        try:
            out: dict[str, Any] = measure(pid, settle, duration)
        except OSError:
            raise SystemExit(f"the daemon died:\n{daemon.log_tail()}") from None
        daemon.stop()
    out["start_s"] = start_s
    out["runs"] = len(d.read_runs(db))
    return out


def apscheduler(trees: int, settle: float, duration: float) -> dict[str, Any]:
    d.clear_of_the_hour(START_ALLOWANCE_S + settle + duration)
    argv = [sys.executable, str(HERE / "_aps_child.py"), "idle", "--jobs", str(trees)]
    t0 = time.monotonic()
    with d.child_process(argv) as proc:
        assert proc.stdout is not None
        assert proc.stdin is not None
        ready, _, _ = select.select([proc.stdout], [], [], 60)
        if not ready or proc.stdout.readline().strip() != "READY":
            raise SystemExit("APScheduler baseline did not get ready within 60 s")
        start_s = time.monotonic() - t0
        out: dict[str, Any] = measure(proc.pid, settle, duration)
        proc.stdin.close()  # the child shuts its scheduler down and exits
        proc.wait(30)
    out["start_s"] = start_s
    return out


def report(
    store_name: str,
    trees: int,
    settle: float,
    duration: float,
    eng: dict[str, Any],
    base: dict[str, Any],
) -> c.Report:
    rep = c.Report("bench_idle", store_name)
    rep.add("trees (timer cron 0 * * * *, one task `true`)", trees, "")
    rep.add("settle after ready", settle, "s")
    rep.add("measured window", duration, "s")
    for label, res, what in (
        ("engine", eng, "daemon"),
        ("baseline APScheduler", base, "process"),
    ):
        rep.add(f"{label}: start until ready", res["start_s"], "s")
        rep.add(f"{label}: CPU to start and settle", res["startup_cpu_s"], "s")
        rep.add(f"{label}: {what} CPU, idle", res["cpu_pct"], "%")
        rep.add(f"{label}: clock ticks in the window", res["ticks"], "")
        rep.add(f"{label}: {what} CPU, idle (schedstat)", res["sched_pct"], "%")
        rep.add(f"{label}: context switches", res["switches_per_s"], "/s")
        rep.add(f"{label}: threads", res["threads"], "")
    rep.ratios["CPU engine / APScheduler"] = c.ratio(eng["cpu_pct"], base["cpu_pct"])
    rep.ratios["CPU engine / APScheduler (schedstat)"] = c.ratio(
        eng["sched_pct"], base["sched_pct"]
    )
    rep.ratios["context switches engine / APScheduler"] = c.ratio(
        eng["switches_per_s"], base["switches_per_s"]
    )
    rep.notes.append(
        "CPU figures are % of one core over the window; /proc/PID/stat counts whole "
        f"clock ticks (1/{d.CLK_TCK} s), schedstat nanoseconds of the live threads"
    )
    if base["sched_pct"] == 0 and base["switches_per_s"] == 0:
        rep.notes.append(
            "the baseline did not run at all in the window (no CPU, no context switch: "
            "APScheduler sleeps until its next due time), so the ratios are infinite"
        )
    elif base["ticks"] == 0:
        rep.notes.append(
            "the baseline used no whole clock tick in the window: the stat ratio is "
            "infinite, see the schedstat ratio"
        )
    if eng["runs"]:
        rep.notes.append(
            f"the daemon recorded {eng['runs']} runs: timers fired, the idle figure is not idle"
        )
    rep.checks.append(
        c.Check("engine daemon CPU, idle, 1,000 hourly trees", eng["cpu_pct"], TARGET_CPU_PCT, "%")
    )
    return rep


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--trees", type=int, default=1000)
    p.add_argument("--settle", type=float, default=5.0, help="seconds after ready (default 5)")
    p.add_argument(
        "--duration",
        type=float,
        default=120.0,
        help="measured seconds (default 120: two of an idle worker's beats)",
    )
    args = p.parse_args()
    if args.duration <= 0 or args.trees <= 0 or args.settle < 0:
        p.error("--trees and --duration must be positive, --settle not negative")
    print(f"baseline APScheduler: {args.trees} cron jobs, {args.duration:g} s idle ...", flush=True)
    base = apscheduler(args.trees, args.settle, args.duration)
    reports = []
    with c.temp_dir("idle") as tmp:
        print(f"[sqlite] daemon: {args.trees} trees, {args.duration:g} s idle ...", flush=True)
        (tmp / "sqlite").mkdir()
        db = str(tmp / "sqlite" / "jobcontrol.db")
        eng = engine(db, tmp / "sqlite", args.trees, args.settle, args.duration)
        reports.append(report("sqlite", args.trees, args.settle, args.duration, eng, base))
        if args.pg:
            with c.postgres("bench_idle") as url:
                print(
                    f"[postgresql] daemon: {args.trees} trees, {args.duration:g} s idle ...",
                    flush=True,
                )
                (tmp / "pg").mkdir()
                eng = engine(url, tmp / "pg", args.trees, args.settle, args.duration)
                reports.append(
                    report("postgresql", args.trees, args.settle, args.duration, eng, base)
                )
    for rep in reports:
        rep.print(as_json=args.json)
    return 0 if all(r.holds for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
