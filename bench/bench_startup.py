"""Daemon start-up with 100,000 jobs in 1,000 trees: time and resident memory.

Set-up: 1,000 trees of 100 jobs each (``_common.tree_rows``: a top-level box
with timer ``every 1h`` or ``cron 0 * * * *``, nested SEQUENCE boxes, a TIMED
box whose every 4th task has its own ``daily HH:MM`` timer), inserted with one
executemany ``insert(job)`` in one transaction.

Measured, each in a FRESH subprocess (so its memory is the daemon's alone):

* ``Dispatcher.start()`` with the production defaults: recover, load, build the
  tree, evaluate every timer, write the evaluation, arm one APScheduler timer per
  top-level tree, start the executor ("...JobControl startup complete"). Run
  twice: the first start after the load (writes every evaluated ``next_runs``
  and ``job_order``) and a restart.
* Peak resident memory of that process (``VmHWM``; ``ru_maxrss`` agrees).

Baselines (same run, fresh subprocesses): a process that only reads the 100,000
rows with ``queries.load_all_jobs`` (time; ratio start-up / bare load), and the
memory of a process that only imports ``jobcontrol``.

Targets: start-up < 3 s, peak RSS < 300 MB.

    .venv/bin/python bench/bench_startup.py [--trees N] [--pg] [--json]
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c

TARGET_START_S = 3.0
TARGET_RSS_MB = 300.0


def _rss() -> dict[str, float]:
    import resource

    status = Path("/proc/self/status").read_text()
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {
        "vmhwm_mb": int(fields["VmHWM"].split()[0]) / 1024,
        "vmrss_mb": int(fields["VmRSS"].split()[0]) / 1024,
        "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def child(mode: str, url: str, logs: str) -> dict[str, Any]:
    """One measurement in this (fresh) process."""
    t0 = time.perf_counter()
    import jobcontrol  # noqa: F401
    from jobcontrol import DispatcherConfig, Store
    from jobcontrol.runtime import Runtime
    from jobcontrol.store import queries

    out: dict[str, Any] = {"import_s": time.perf_counter() - t0}
    if mode == "import":
        return out | _rss()
    store = Store(url)
    if mode == "load":
        t0 = time.perf_counter()
        with store.read() as conn:
            jobs = queries.load_all_jobs(conn)
        out["seconds"] = time.perf_counter() - t0
        out["jobs"] = len(jobs)
        return out | _rss()
    t0 = time.perf_counter()
    runtime = Runtime(store, DispatcherConfig(log_root=Path(logs)))
    dispatcher = runtime.dispatcher
    out["construct_s"] = time.perf_counter() - t0
    t0 = time.perf_counter()
    runtime.start()
    out["seconds"] = time.perf_counter() - t0
    out |= _rss()
    out["jobs"] = len(dispatcher.tree.nodes)
    out["armed"] = len(dispatcher.timers.armed())
    runtime.stop(kill_running=True, timeout=10)
    return out


def run_child(mode: str, url: str, logs: Path) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, __file__, "--child", mode, url, str(logs)],
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    if proc.returncode != 0:
        raise SystemExit(f"child {mode} failed:\n{proc.stdout}\n{proc.stderr}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def bench(store_name: str, url: str, logs: Path, trees: int) -> c.Report:
    n = trees * c.JOBS_PER_TREE
    print(f"[{store_name}] bulk insert of {n:,} jobs in {trees:,} trees ...", flush=True)
    insert_s = c.bulk_load(url, trees)
    print(f"[{store_name}] fresh processes: start, restart, bare load, bare import ...", flush=True)
    first = run_child("start", url, logs)
    second = run_child("start", url, logs)
    load = run_child("load", url, logs)
    bare = run_child("import", url, logs)
    for r in (first, second, load):
        if r["jobs"] != n:
            raise SystemExit(f"expected {n} jobs, a child saw {r['jobs']}")
    if first["armed"] != trees or second["armed"] != trees:
        raise SystemExit(f"expected {trees} armed timers, got {first['armed']}, {second['armed']}")
    rep = c.Report("bench_startup", store_name)
    rep.add("jobs", n, "")
    rep.add("bulk insert (setup)", insert_s, "s")
    rep.add("Dispatcher.start(), first after load", first["seconds"], "s")
    rep.add("Dispatcher.start(), restart", second["seconds"], "s")
    rep.add("Dispatcher(...) construction", first["construct_s"], "s")
    rep.add("baseline: load_all_jobs alone", load["seconds"], "s")
    rep.add("peak RSS, daemon (first start)", first["vmhwm_mb"], "MB")
    rep.add("peak RSS, daemon (restart)", second["vmhwm_mb"], "MB")
    rep.add("peak RSS, load_all_jobs alone", load["vmhwm_mb"], "MB")
    rep.add("baseline: RSS of import jobcontrol", bare["vmhwm_mb"], "MB")
    rep.ratios["start-up / bare load (first)"] = c.ratio(first["seconds"], load["seconds"])
    rep.ratios["start-up / bare load (restart)"] = c.ratio(second["seconds"], load["seconds"])
    rep.ratios["daemon RSS / import RSS"] = c.ratio(first["vmhwm_mb"], bare["vmhwm_mb"])
    worst = max(first["seconds"], second["seconds"])
    rep.checks.append(c.Check("start-up (worst of two)", worst, TARGET_START_S, "s"))
    peak = max(first["vmhwm_mb"], second["vmhwm_mb"])
    rep.checks.append(c.Check("peak RSS", peak, TARGET_RSS_MB, "MB"))
    return rep


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(*sys.argv[2:5])))
        return 0
    p = c.parser(__doc__.splitlines()[0])
    p.add_argument("--trees", type=int, default=1000)
    args = p.parse_args()
    reports = []
    with c.temp_dir("startup") as tmp:
        reports.append(bench("sqlite", c.sqlite_url(tmp), tmp / "logs", args.trees))
        if args.pg:
            with c.postgres("bench_startup") as url:
                reports.append(bench("postgresql", url, tmp / "pg-logs", args.trees))
    for rep in reports:
        rep.print(as_json=args.json)
    return 0


if __name__ == "__main__":
    sys.exit(main())
