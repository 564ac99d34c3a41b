"""Run every benchmark, one after another, and print a summary table.

    .venv/bin/python bench/run_all.py [--pg] [--only NAME ...] [--json]

Each benchmark runs as its own process (``--json``); its full report is shown
as it finishes, then one table sums up every target: the engine's figure, the
baseline measured in the same run, the ratio and whether the target holds.
Exit status 0 when every target holds, 1 otherwise (2 when a benchmark failed).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _common as c  # noqa: E402

BENCHES = [
    "bench_sequence",
    "bench_timer_accuracy",
    "bench_startup",
    "bench_batch_edit",
    "bench_api",
    "bench_gui",
    "bench_many_trees",
    "bench_idle",
    "bench_claims",
]
# Benchmarks without a database (no --pg run).
NO_STORE = {"bench_gui"}
# Benchmarks of PostgreSQL alone: run only with --pg (they start their own server).
PG_ONLY = {"bench_claims"}

# For the table: which figure is the engine's, which is its baseline, which ratio.
SUMMARY: dict[str, list[tuple[str, str, str, str]]] = {
    # (label, engine figure, baseline figure, ratio)
    "bench_claims": [
        (
            "claim + finish, 4 x 4 workers",
            "jobcontrol jobs/s",
            "procrastinate jobs/s",
            "jobs/s jobcontrol / procrastinate",
        ),
    ],
    "bench_sequence": [
        (
            "1,000-task SEQUENCE box",
            "engine: due -> box run_finished",
            "baseline: subprocess loop (mean)",
            "engine / baseline",
        ),
        (
            "  the same, the floor's loop",
            "floor: the least any design does (floor_sequence.py)",
            "baseline: subprocess loop (mean)",
            "floor / baseline",
        ),
    ],
    "bench_timer_accuracy": [
        (
            "timer latency p99",
            "engine: p99",
            "baseline threading.Timer: p99",
            "p99 engine / bare",
        ),
        (
            "timer latency median",
            "engine: median",
            "baseline threading.Timer: median",
            "median engine / bare",
        ),
    ],
    "bench_startup": [
        (
            "start-up, 100k jobs (first)",
            "Dispatcher.start(), first after load",
            "baseline: load_all_jobs alone",
            "start-up / bare load (first)",
        ),
        (
            "start-up, 100k jobs (restart)",
            "Dispatcher.start(), restart",
            "baseline: load_all_jobs alone",
            "start-up / bare load (restart)",
        ),
        (
            "peak RSS, 100k jobs",
            "peak RSS, daemon (first start)",
            "baseline: RSS of import jobcontrol",
            "daemon RSS / import RSS",
        ),
    ],
    "bench_batch_edit": [
        (
            "1,000-job batch: descr+timer",
            "description + timer: engine median",
            "description + timer: bare UPDATE median",
            "description + timer: engine / bare",
        ),
        (
            "1,000-job batch: active",
            "active toggle: engine median",
            "active toggle: bare UPDATE median",
            "active toggle: engine / bare",
        ),
    ],
    "bench_api": [
        (
            "API: GET /tree, 10,000 jobs",
            "GET /tree, 10,000 jobs (median)",
            "baseline: load_all_jobs",
            "snapshot / bare load",
        ),
        (
            "API: PATCH of 1,000 jobs",
            "PATCH of 1,000 jobs (median)",
            "baseline: bare UPDATE of 1,000 rows",
            "batch / bare UPDATE",
        ),
        (
            "API: event latency, 20 clients",
            "event latency, 20 clients (median of 600)",
            "baseline: GET /healthz round trip",
            "event latency / HTTP round trip",
        ),
    ],
    "bench_gui": [
        (
            "GUI: open 10,000 jobs",
            "open: _snapshot + repaint, 10,000 jobs (median)",
            "baseline: QStandardItemModel + QTreeView",
            "open / QStandardItemModel",
        ),
        (
            "GUI: p99 lateness, 1,000 ev/s",
            "streaming: tick lateness p99",
            "baseline idle: tick lateness p99",
            "p99 lateness streaming / idle",
        ),
    ],
    "bench_many_trees": [
        (
            "500 trees every 1s: p99 lateness",
            "engine: lateness p99",
            "baseline APScheduler: lateness p99",
            "p99 engine / APScheduler",
        ),
        (
            "500 trees every 1s: daemon CPU",
            "engine: daemon CPU",
            "baseline APScheduler: process CPU",
            "CPU engine / APScheduler",
        ),
        (
            "  p99 against the floor",
            "engine: lateness p99",
            "floor: lateness p99",
            "p99 engine / floor",
        ),
        (
            "  CPU per tree run, the floor",
            "engine: CPU per tree run",
            "floor: CPU per tree run",
            "CPU per tree run, engine / floor",
        ),
    ],
    "bench_idle": [
        (
            "idle, 1,000 hourly trees: CPU",
            "engine: daemon CPU, idle",
            "baseline APScheduler: process CPU, idle",
            "CPU engine / APScheduler",
        ),
    ],
}


def run(name: str, pg: bool) -> tuple[list[dict[str, Any]], float, int]:
    use_pg = pg and name not in NO_STORE | PG_ONLY
    argv = [sys.executable, str(HERE / f"{name}.py"), "--json"] + (["--pg"] if use_pg else [])
    print(f"\n##### {name}", flush=True)
    t0 = time.perf_counter()
    proc = subprocess.run(argv, stdout=subprocess.PIPE, text=True, check=False)
    elapsed = time.perf_counter() - t0
    reports = []
    for line in proc.stdout.splitlines():
        if line.startswith(c.JSON_PREFIX):
            reports.append(json.loads(line[len(c.JSON_PREFIX) :]))
        else:
            print(line)
    return reports, elapsed, proc.returncode


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--pg", action="store_true", help="also run each benchmark on PostgreSQL")
    p.add_argument("--only", nargs="*", choices=BENCHES, help="run only these benchmarks")
    p.add_argument("--json", action="store_true", help="print every report as one JSON line")
    args = p.parse_args()
    results: list[dict[str, Any]] = []
    failed: list[str] = []
    durations: dict[str, float] = {}
    for name in args.only or BENCHES:
        if name in PG_ONLY and not args.pg:
            print(f"\n##### {name}: PostgreSQL only, skipped (run with --pg)", flush=True)
            continue
        reports, elapsed, rc = run(name, args.pg)
        durations[name] = elapsed
        # Exit 1 is a missed target, which its report says; anything else is a failure to run.
        if rc not in (0, 1) or not reports:
            failed.append(name)
        results += reports

    print(f"\n===== summary ({c.machine()})")
    header = f"{'benchmark':<32} {'store':<10} {'engine':>14} {'baseline':>14} {'ratio':>9}"
    print(header)
    print("-" * len(header))
    for rep in results:
        figures = rep["figures"]
        for label, ours, base, ratio in SUMMARY.get(rep["bench"], []):
            o, b = figures[ours], figures[base]
            print(
                f"{label:<32} {rep['store']:<10} "
                f"{c.fmt(o['value']):>11} {o['unit']:<2} {c.fmt(b['value']):>11} {b['unit']:<2} "
                f"{c.fmt(rep['ratios'][ratio]):>8}x"
            )
    print()
    header = f"{'target':<44} {'store':<10} {'value':>12} {'limit':>12}  verdict"
    print(header)
    print("-" * len(header))
    for rep in results:
        for check in rep["checks"]:
            print(
                f"{check['name']:<44} {rep['store']:<10} "
                f"{c.fmt(check['value']):>9} {check['unit']:<2} "
                f"{check['op']:>2} {c.fmt(check['limit']):>6} {check['unit']:<2}  "
                f"{'holds' if check['holds'] else 'MISSED'}"
            )
    print()
    for name, elapsed in durations.items():
        print(f"{name}: {elapsed:.0f} s")
    if failed:
        print(f"FAILED to run: {', '.join(failed)}")
    if args.json:
        print(c.JSON_PREFIX + json.dumps(results))
    if failed:
        return 2
    return 0 if all(r["holds"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
