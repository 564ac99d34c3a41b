"""Many trees: 500 trees with timer ``every 1s``, the real daemon for 60 s, against APScheduler.

Engine: 500 active top-level boxes, each with timer ``every 1s`` and one active
task ``true``, loaded with ``jobcontrol load``; the daemon is started with
``jobcontrol daemon start --port 0`` (a separate process, production defaults)
and runs for ``--duration`` seconds (the measured window), plus a few seconds of
grace so that runs due just before the end of the window can start; then
``jobcontrol daemon stop --kill``. Nothing of ``jobcontrol`` is imported: the
figures come from the ``run`` table afterwards (plain SQL) and from
``/proc/<daemon pid>/stat``.

Lateness of a tree run: ``every 1s`` is due 1 s after the END of the tree's
previous run, so the due time of root run n+1 is ``ended`` of root run n + 1 s,
and

    lateness = ``started`` of the task run under root run n+1 - that due time

(``started`` is set when an executor slot claims the run, just before it
spawns the process). The first run of each tree has no previous run and is not
counted; runs due in the window that had not started when the daemon stopped
count with ``stop - due``, a lower bound.

Also: tree runs per second (at most 500/s: each tree at most once a second),
lateness in the first and the last third of the time from the first measured
due time to the end of the window (does a backlog grow?),
and the daemon's CPU over the window (utime + stime of its threads; the
reaped ``true`` processes separately).

Baseline (same run, a child process): APScheduler 3 ``BackgroundScheduler``
with 500 ``IntervalTrigger(seconds=1)`` jobs (its ThreadPoolExecutor of 10
threads, coalesce, max_instances 1) each running
``subprocess.Popen(["true"]).wait()``; lateness = the time just before ``Popen``
- the scheduled run time APScheduler handed to its executor. Its intervals are
fixed (every whole second from a common start), so its 500 jobs come due in one
burst every second, where ``every 1s`` drifts by each tree's own run.

Floor (same run, in this process): ``floor_trees.py``, the least any design does for
the same trees on this host (one thread, raw ``sqlite3``, a cgroup per run where this
process may make one, the daemon's eight slots at once), for at most ``FLOOR_S`` s: its
p99 and its CPU per tree run against the engine's. A floor that misses the target would
mean no design can meet it here.

Targets: p99 lateness < 100 ms; no growing backlog (the last third's median
lateness at most 10 ms above the first third's). Ratios engine / APScheduler.

    .venv/bin/python bench/bench_many_trees.py [--trees N] [--duration S] [--pg
        [--worker-process]] [--json]
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import _daemon as d
import floor_trees
from floor_sequence import cgroups_possible

HERE = Path(__file__).resolve().parent

TARGET_P99_MS = 100.0
TARGET_GROWTH_MS = 10.0
SETTLED_S = 10.0  # a figure from here on: past the backlog of all trees due at start
GRACE_S = 3.0  # after the window, before the stop: runs due late in the window can start
INTERVAL = timedelta(seconds=1)
FLOOR_S = 20.0  # the floor's window at most: it holds steady well within that


def _thirds(samples: list[tuple[float, float]], window_s: float) -> list[list[float]]:
    """Lateness values of (due offset in s, lateness in ms) samples, by third of the time
    from the first measured due time to the end of the window."""
    first = min(offset for offset, _ in samples)
    span = max(window_s - first, 1e-9)
    out: list[list[float]] = [[], [], []]
    for offset, late in samples:
        out[min(2, max(0, int(3 * (offset - first) / span)))].append(late)
    return out


def _seconds(
    samples: list[tuple[float, float]], readings: list[tuple[d.Cpu, d.Threads]]
) -> list[dict[str, float]]:
    """Per second of the window (by due time): runs, p50 and p99 lateness; and, over
    the same second, the daemon's CPU (its kernel's share), CPU per run and context
    switches per run."""
    by_second: dict[int, list[float]] = defaultdict(list)
    for due, late in samples:
        by_second[int(due)].append(late)
    w0 = readings[0][0].at
    out = []
    for (c0, t0), (c1, t1) in zip(readings, readings[1:], strict=False):
        second = round(c0.at - w0)
        lates = by_second.get(second, [])
        wall, own, _ = c1.since(c0)
        runs = len(lates)
        out.append(
            {
                "second": second,
                "runs": runs,
                "p50": c.median(lates) if lates else 0.0,
                "p99": c.percentile(lates, 99) if lates else 0.0,
                "cpu_pct": 100 * own / wall if wall else 0.0,
                "kernel_pct": 100 * (c1.system - c0.system) / own if own else 0.0,
                "cpu_ms_per_run": 1000 * own / runs if runs else 0.0,
                "switches_per_run": (t1.switches - t0.switches) / runs if runs else 0.0,
            }
        )
    return out


def _print_seconds(label: str, seconds: list[dict[str, float]]) -> None:
    print(f"\n  {label}: second by second (runs by due time; CPU over that second)")
    print("    s   runs  p50 ms  p99 ms  CPU %  kernel %  CPU ms/run  switches/run")
    for r in seconds:
        print(
            f"  {r['second']:3.0f}  {r['runs']:5.0f}  {r['p50']:6.1f}  {r['p99']:6.1f}  "
            f"{r['cpu_pct']:5.1f}  {r['kernel_pct']:8.1f}  {r['cpu_ms_per_run']:10.2f}  "
            f"{r['switches_per_run']:12.1f}"
        )


def _trend(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of lateness against due time, in ms per minute."""
    if len({x for x, _ in samples}) < 2:
        return 0.0
    xs, ys = zip(*samples, strict=True)
    return statistics.linear_regression(xs, ys).slope * 60


# ---------------------------------------------------------------- the engine


def engine(
    db: str,
    tmp: Path,
    trees: int,
    duration: float,
    worker_process: bool = False,
    cpu_pin: str | None = None,
) -> dict[str, Any]:
    """The daemon over a window of ``duration`` s; lateness samples and CPU.

    ``worker_process``: the daemon only dispatches (``--slots 0``) and a worker process
    of its own (``jobcontrol worker start``, 8 slots) runs the tasks (PostgreSQL).
    ``cpu_pin``: the daemon's ``$JOBCONTROL_CPU_PIN`` (None: its default)."""
    env = {"JOBCONTROL_CPU_PIN": cpu_pin} if cpu_pin else None
    with d.CliDaemon(db, tmp, env) as daemon:
        print(f"  {daemon.load(d.one_task_trees(trees, 'every 1s'), tmp / 'trees.yaml')}")
        pid = daemon.start("--slots", "0") if worker_process else daemon.start()
        wpid = daemon.start_worker("bench-worker", 8) if worker_process else None
        w0, cpu0, thr0 = datetime.now(UTC), d.cpu(pid), d.threads(pid)
        wcpu0 = d.cpu(wpid) if wpid is not None else None
        # The daemon's CPU and its threads' context switches, second by second: where
        # the window's p99 was made (a start-up backlog, an episode later on).
        readings: list[tuple[d.Cpu, d.Threads]] = [(cpu0, thr0)]
        end = time.monotonic() + duration
        while (left := end - time.monotonic()) > 0:
            time.sleep(min(1.0, left))
            try:
                readings.append((d.cpu(pid), d.threads(pid)))
            except OSError:
                break  # died: said below
        try:
            cpu1, thr1 = d.cpu(pid), d.threads(pid)
            wcpu1 = d.cpu(wpid) if wpid is not None else None
        except OSError:
            raise SystemExit(f"the daemon died during the run:\n{daemon.log_tail()}") from None
        w1 = datetime.now(UTC)
        time.sleep(GRACE_S)
        stop_at = datetime.now(UTC)
        daemon.stop()
        pinned = daemon.log_lines(" jobcontrol.cpupin: ")  # what the monitor did, in order
    wall, own, children = cpu1.since(cpu0)
    system = cpu1.system - cpu0.system
    switches = thr1.switches - thr0.switches
    worker_own = 0.0
    if wcpu0 is not None and wcpu1 is not None:
        _, worker_own, worker_children = wcpu1.since(wcpu0)
        children += worker_children
    runs = d.read_runs(db)

    roots: dict[str, list[d.RunRow]] = defaultdict(list)
    task_of: dict[int, d.RunRow] = {}
    for r in runs:
        if r.parent_run_id is None and r.kind == "box":
            roots[r.job_name].append(r)
        elif r.kind == "task" and r.parent_run_id is not None:
            task_of[r.root_run_id or r.parent_run_id] = r
    window_s = (w1 - w0).total_seconds()
    samples: list[tuple[float, float]] = []  # (due - w0 in s, lateness in ms)
    pending = skipped = failed = 0
    min_late = float("inf")

    def sample(due: datetime, started: datetime) -> None:
        nonlocal min_late
        late = (started - due).total_seconds() * 1000
        min_late = min(min_late, late)
        samples.append(((due - w0).total_seconds(), late))

    for tree_runs in roots.values():
        prev: d.RunRow | None = None
        for cur in [*tree_runs, None]:
            if cur is not None and cur.state == "skipped":
                skipped += 1
                continue
            if prev is not None and prev.ended is not None:
                due = prev.ended + INTERVAL
                if w0 <= due < w1:
                    task = task_of.get(cur.id) if cur is not None else None
                    if task is not None and task.started is not None:
                        sample(due, task.started)
                        if (
                            task.ended is not None
                            and task.ended <= w1
                            and task.state != "succeeded"
                        ):
                            failed += 1
                    else:  # due in the window, not started by the stop: a lower bound
                        pending += 1
                        sample(due, stop_at)
            prev = cur
    tree_runs_in_window = sum(
        1
        for rs in roots.values()
        for r in rs
        if r.state != "skipped" and w0 <= (r.started or r.created or w0 - INTERVAL) < w1
    )
    if not samples:
        raise SystemExit(f"no tree run was measured ({len(runs)} runs in the table)")
    firsts = [rs[0].started or rs[0].created for rs in roots.values() if rs]
    last_first_s = max((f - w0).total_seconds() for f in firsts if f is not None)
    return {
        "samples": samples,
        "seconds": _seconds(samples, readings),
        "window_s": window_s,
        "pending": pending,
        "skipped": skipped,
        "failed": failed,
        "min_ms": min_late,
        "never_ran": trees - len(firsts),
        "last_first_s": last_first_s,
        "tree_runs_per_s": tree_runs_in_window / window_s,
        "cpu_pct": 100 * own / wall,
        "kernel_pct": 100 * system / own if own else 0.0,
        "switches_per_run": switches / tree_runs_in_window if tree_runs_in_window else 0.0,
        "worker_cpu_pct": 100 * worker_own / wall if worker_process else None,
        "children_cpu_pct": 100 * children / wall,
        "cpu_pin": [line.split(" jobcontrol.cpupin: ", 1)[1] for line in pinned],
    }


# ---------------------------------------------------------------- the baseline


def apscheduler(trees: int, duration: float) -> dict[str, Any]:
    argv = [
        sys.executable,
        str(HERE / "_aps_child.py"),
        "interval",
        "--jobs",
        str(trees),
        "--duration",
        str(duration),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=duration + 120, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"APScheduler baseline exited {proc.returncode}:\n{proc.stderr}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    samples = [(offset, late) for offset, late in out["runs"]]
    if not samples:
        raise SystemExit("APScheduler baseline: no run")
    wall = out["cpu_wall_s"]
    return {
        "samples": samples,
        "window_s": duration,
        "skipped": out["skipped"],
        "min_ms": min(late for _, late in samples),
        "tree_runs_per_s": len(samples) / duration,
        "cpu_pct": 100 * out["cpu_own_s"] / wall,
        "children_cpu_pct": 100 * out["cpu_children_s"] / wall,
    }


# ---------------------------------------------------------------- the report


def _figures(rep: c.Report, label: str, res: dict[str, Any]) -> dict[str, float]:
    lates = [late for _, late in res["samples"]]
    first, middle, last = _thirds(res["samples"], res["window_s"])
    p50, p99 = c.median(lates), c.percentile(lates, 99)
    rep.add(f"{label}: runs measured", len(lates), "")
    rep.add(f"{label}: lateness p50", p50, "ms")
    rep.add(f"{label}: lateness p99", p99, "ms")
    rep.add(f"{label}: lateness max", max(lates), "ms")
    rep.add(f"{label}: tree runs per second", res["tree_runs_per_s"], "/s")
    for name, part in (("first", first), ("middle", middle), ("last", last)):
        rep.add(f"{label}: p50, {name} third", c.median(part), "ms")
        rep.add(f"{label}: p99, {name} third", c.percentile(part, 99), "ms")
    rep.add(f"{label}: lateness trend", _trend(res["samples"]), "ms/min")
    settled = [late for due, late in res["samples"] if due >= SETTLED_S]
    if settled and res["window_s"] > 2 * SETTLED_S:
        # Not a target: where the window's p99 comes from, beside a start-up backlog.
        rep.add(f"{label}: p99, from {SETTLED_S:g} s on", c.percentile(settled, 99), "ms")
    if res["min_ms"] < 0:
        rep.notes.append(
            f"{label}: a run started {-res['min_ms']:.3f} ms before its due time "
            "(the due time is a proxy from the previous run's end)"
            if label == "engine"
            else f"{label}: a run started {-res['min_ms']:.3f} ms before its scheduled time"
        )
    if not first or not last:
        rep.notes.append(f"{label}: too few runs to compare the first and the last third")
    return {
        "p50": p50,
        "p99": p99,
        "growth": c.median(last) - c.median(first),
        "cpu": res["cpu_pct"] + (res.get("worker_cpu_pct") or 0.0),  # with a worker process
        "rate": res["tree_runs_per_s"],
    }


def floor(trees: int, duration: float) -> dict[str, Any]:
    """``floor_trees``'s loop for the same trees, cgroups per run where this process may
    make them (as the daemon does), else none."""
    how = "per-run" if cgroups_possible() else "none"
    res = floor_trees.run(trees, min(duration, FLOOR_S), cgroups=how)
    return {**res, "cgroups": how, "window_s": min(duration, FLOOR_S)}


def report(
    store_name: str,
    trees: int,
    eng: dict[str, Any],
    base: dict[str, Any],
    flo: dict[str, Any],
    duration: float,
) -> c.Report:
    rep = c.Report("bench_many_trees", store_name)
    rep.add("trees (timer every 1s, one task `true`)", trees, "")
    rep.add("measured window", eng["window_s"], "s")
    e = _figures(rep, "engine", eng)
    engine_ms = 10 * e["cpu"] / max(e["rate"], 1e-9)  # % of a core / (runs/s), in ms
    rep.add("engine: runs due, not started by the stop", eng["pending"], "")
    rep.add("engine: last tree's first run, after ready", eng["last_first_s"], "s")
    rep.add("engine: daemon CPU", eng["cpu_pct"], "%")
    # Where that CPU goes: the kernel's share (spawns, cgroups, files, the database's
    # I/O, and the thread switches of the one interpreter lock), and how many context
    # switches the daemon's threads made per tree run.
    rep.add("engine: daemon CPU, kernel's share", eng["kernel_pct"], "%")
    rep.add("engine: daemon context switches per tree run", eng["switches_per_run"], "")
    if eng.get("worker_cpu_pct") is not None:
        rep.add("engine: worker process CPU", eng["worker_cpu_pct"], "%")
        rep.notes.append(
            "engine: the daemon only dispatched (--slots 0); a worker process of its own "
            "(`jobcontrol worker start`, 8 slots) ran the tasks"
        )
    rep.add("engine: reaped children's CPU", eng["children_cpu_pct"], "%")
    rep.add("engine: CPU per tree run", engine_ms, "ms")
    rep.add("floor: lateness p50", flo["p50"], "ms")
    rep.add("floor: lateness p99", flo["p99"], "ms")
    rep.add("floor: tree runs per second", flo["per_s"], "/s")
    rep.add("floor: CPU", flo["cpu_pct"], "%")
    rep.add("floor: CPU per tree run", flo["cpu_per_run_ms"], "ms")
    b = _figures(rep, "baseline APScheduler", base)
    rep.add("baseline APScheduler: runs skipped", base["skipped"], "")
    rep.add("baseline APScheduler: process CPU", base["cpu_pct"], "%")
    rep.add("baseline APScheduler: reaped children's CPU", base["children_cpu_pct"], "%")
    rep.ratios["p99 engine / APScheduler"] = c.ratio(e["p99"], b["p99"])
    rep.ratios["p50 engine / APScheduler"] = c.ratio(e["p50"], b["p50"])
    rep.ratios["CPU engine / APScheduler"] = c.ratio(e["cpu"], b["cpu"])
    rep.ratios["tree runs/s engine / APScheduler"] = c.ratio(e["rate"], b["rate"])
    rep.ratios["p99 engine / floor"] = c.ratio(e["p99"], flo["p99"])
    rep.ratios["CPU per tree run, engine / floor"] = c.ratio(engine_ms, flo["cpu_per_run_ms"])
    rep.notes.append(
        f"floor: bench/floor_trees.py for {flo['window_s']:g} s, one thread and no engine,"
        f" cgroups {flo['cgroups']}, on SQLite whatever the engine's store; no design that"
        " keeps the engine's promises does less per tree run"
    )
    rep.notes.append(
        "CPU figures are % of one core over the window (utime + stime from /proc/PID/stat)"
    )
    if e["rate"] < 0.9 * trees:
        rep.notes.append(
            f"engine: {e['rate']:.0f} tree runs/s of the up to {trees}/s asked for; `every` "
            "counts from the end of a run, so a daemon that cannot keep up runs each tree "
            "less often and its lateness levels off instead of growing without bound"
        )
    if eng["pending"]:
        rep.notes.append(
            f"engine: {eng['pending']} runs due in the window had not started "
            f"{GRACE_S:g} s after it: counted with lateness = stop - due (a lower bound)"
        )
    if eng["skipped"]:
        rep.notes.append(f"engine: {eng['skipped']} skipped tree runs (not counted)")
    if eng["never_ran"]:
        rep.notes.append(f"engine: {eng['never_ran']} trees never ran")
    if eng["failed"]:
        rep.notes.append(f"engine: {eng['failed']} task runs did not succeed")
    for line in eng["cpu_pin"]:
        rep.notes.append(f"engine: {line}")
    if duration < 60:
        rep.notes.append(f"a short run ({duration:g} s; the benchmark's default is 60 s)")
    rep.checks.append(
        c.Check("engine p99 lateness, 500 trees every 1s", e["p99"], TARGET_P99_MS, "ms")
    )
    rep.checks.append(
        c.Check(
            "engine backlog growth, p50 last - first 3rd",
            e["growth"],
            TARGET_GROWTH_MS,
            "ms",
            inclusive=True,
        )
    )
    return rep


def main() -> int:
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--trees", type=int, default=500)
    p.add_argument("--duration", type=float, default=60.0, help="measured seconds (default 60)")
    p.add_argument(
        "--worker-process",
        action="store_true",
        help="PostgreSQL: the daemon only dispatches (--slots 0) and a worker process "
        "of its own runs the tasks (with --pg; SQLite keeps its embedded worker)",
    )
    p.add_argument(
        "--cpu-pin",
        metavar="MODE",
        help="the daemon's $JOBCONTROL_CPU_PIN: auto (its default), off, or a CPU number",
    )
    p.add_argument(
        "--per-second",
        action="store_true",
        help="also print the engine's lateness, CPU and context switches second by second",
    )
    args = p.parse_args()
    if args.duration <= 0 or args.trees <= 0:
        p.error("--trees and --duration must be positive")
    if args.worker_process and not args.pg:
        p.error("--worker-process needs --pg: a worker process of its own is PostgreSQL's")
    print(
        f"baseline APScheduler: {args.trees} interval jobs for {args.duration:g} s ...", flush=True
    )
    base = apscheduler(args.trees, args.duration)
    print(f"floor: {args.trees} trees for {min(args.duration, FLOOR_S):g} s ...", flush=True)
    flo = floor(args.trees, args.duration)
    reports = []
    with c.temp_dir("many-trees") as tmp:
        print(f"[sqlite] daemon: {args.trees} trees for {args.duration:g} s ...", flush=True)
        (tmp / "sqlite").mkdir()
        eng = engine(
            str(tmp / "sqlite" / "jobcontrol.db"),
            tmp / "sqlite",
            args.trees,
            args.duration,
            cpu_pin=args.cpu_pin,
        )
        reports.append(report("sqlite", args.trees, eng, base, flo, args.duration))
        per_second = [("sqlite", eng)]
        if args.pg:
            with c.postgres("bench_many_trees") as url:
                print(
                    f"[postgresql] daemon: {args.trees} trees for {args.duration:g} s ...",
                    flush=True,
                )
                (tmp / "pg").mkdir()
                eng = engine(
                    url, tmp / "pg", args.trees, args.duration, args.worker_process, args.cpu_pin
                )
                reports.append(report("postgresql", args.trees, eng, base, flo, args.duration))
                per_second.append(("postgresql", eng))
    for rep in reports:
        rep.print(as_json=args.json)
    if args.per_second:
        for name, eng in per_second:
            _print_seconds(f"engine [{name}]", eng["seconds"])
    return 0 if all(r.holds for r in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
