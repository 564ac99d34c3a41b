"""Dispatch latency: a run queued on PostgreSQL to its claim by an idle remote worker.

Setup: a throwaway PostgreSQL server, ``jobcontrol db upgrade``, one real
``jobcontrol worker`` process (4 slots, every queue) started as a user would. The
bench process plays the dispatcher's part: it inserts a queued task run (``true``)
and announces it the way the dispatcher does (``events.runs_queued`` sent through
this process's ``Relay`` in the daemon's role, i.e. NOTIFY after commit, once the
worker said hello); then it waits for the run's
end before queueing the next, so the worker is idle each time. Latency is the
run row's ``started`` (set by the claim, the worker's clock) minus its
``created`` (set by the insert, this process's clock: the same host).

Three measurements in the same run:

* **baseline**: the bare LISTEN/NOTIFY round trip on this server (psycopg,
  NOTIFY from one connection to a listener in another process's place: another
  connection of this one) — the floor any NOTIFY-driven claim sits on;
* **with NOTIFY**: the target: median < 5 ms, p99 < 20 ms;
* **NOTIFY lost, listener cut**: a thread of this process terminates the
  worker's LISTEN connection (``pg_terminate_backend``) whenever it appears,
  and the runs are inserted without a notification (none could arrive). The
  worker knows its listener is down: it polls at the lane's poll interval (0.5 s
  here) without backing off, and its relay wakes every group each time it
  listens again. Target: within the poll interval (+ 0.1 s).
* **no NOTIFY sent, listener up** (for information): the worker cannot know a
  push was lost, so its back-off poll finds the run: the seed's back-off starts
  at 1 s, which bounds this case while runs keep coming (up to 10 s once idle).

    .venv/bin/python bench/bench_dispatch_latency.py [--runs N] [--json]
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import psycopg
from sqlalchemy import select, update

from jobcontrol import events
from jobcontrol.store import Store, queries
from jobcontrol.store.relay import Relay
from jobcontrol.store.schema import lane, run

POLL_S = 0.5


def notify_round_trip(url: str, n: int) -> list[float]:
    """Seconds from NOTIFY to its delivery on another connection, n times."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    out: list[float] = []
    with (
        psycopg.connect(conninfo, autocommit=True) as listener,
        psycopg.connect(conninfo, autocommit=True) as sender,
    ):
        listener.execute("LISTEN bench")
        for _ in range(n):
            t0 = time.perf_counter()
            sender.execute("SELECT pg_notify('bench', 'x')")
            for _note in listener.notifies(timeout=5.0, stop_after=1):
                pass
            out.append(time.perf_counter() - t0)
    return out


def queue_one(store: Store, *, announce: bool) -> int:
    now = datetime.now(UTC)
    with store.write() as conn:
        run_id = queries.insert_run(
            conn,
            {
                "job_name": "bench-latency",
                "kind": "task",
                "trigger": "manual",
                "state": "queued",
                "queue": "default",
                "priority": 0,
                "created": now,
                "command": "true",
                "requested_by": "bench",
            },
        )
    if announce:
        events.runs_queued.send(store, run_ids=[run_id])
    return run_id


def wait_ended(store: Store, run_id: int, timeout: float = 30.0) -> tuple[datetime, datetime]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with store.read() as conn:
            row = conn.execute(
                select(run.c.created, run.c.started, run.c.ended).where(run.c.id == run_id)
            ).one()
        if row.ended is not None:
            return row.created, row.started
        time.sleep(0.005)
    raise SystemExit(f"run {run_id} did not end within {timeout:g}s")


def cut_listeners(url: str, stop: threading.Event, cuts: list[int]) -> None:
    """Terminate every LISTEN connection (the worker's) as soon as it appears, until stop."""
    conninfo = url.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        while not stop.wait(0.005):
            row = conn.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
                " WHERE query LIKE 'LISTEN%' AND pid <> pg_backend_pid()"
            ).fetchone()
            cuts[0] += int(row[0]) if row else 0


def latencies(store: Store, n: int, *, announce: bool) -> list[float]:
    out = []
    for _ in range(n):
        run_id = queue_one(store, announce=announce)
        created, started = wait_ended(store, run_id)
        out.append((started - created).total_seconds())
    return out


def start_worker(url: str, state: Path) -> subprocess.Popen[bytes]:
    env = dict(os.environ, JOBCONTROL_DB=url, JOBCONTROL_CGROUPS="off")
    log = open(state / "worker.out", "wb")  # noqa: SIM115 - the child holds it
    proc = subprocess.Popen(
        [sys.executable, "-m", "jobcontrol", "--state-dir", str(state), "worker"]
        + ["--name", "bench", "--slots", "4"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    return proc


def wait_registered(store: Store, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with store.read() as conn:
            from jobcontrol.store.runqueue import get_worker

            w: dict[str, Any] | None = get_worker(conn, "bench")
        if w is not None and w["stopped"] is None:
            time.sleep(1.0)  # its relay listens right after it registers
            return
        time.sleep(0.05)
    raise SystemExit("the worker did not register")


def main() -> int:
    p = c.parser(__doc__ or "", pg=False)
    p.add_argument("--runs", type=int, default=200)
    args = p.parse_args()
    report = c.Report("dispatch latency (queue -> claim, idle remote worker)", "postgresql")
    with c.postgres("bench_latency") as url, c.temp_dir("latency") as state:
        subprocess.run(
            [sys.executable, "-m", "jobcontrol", "--db", url, "db", "upgrade"], check=True
        )
        store = Store(url)
        with store.write() as conn:
            conn.execute(
                update(lane).where(lane.c.name == "default").values(poll_interval_s=POLL_S)
            )
        relay = Relay(store, name="bench", role="daemon")  # sends once it hears the worker
        relay.start()
        worker = start_worker(url, state)
        try:
            wait_registered(store)
            deadline = time.monotonic() + 10
            while not relay.peers and time.monotonic() < deadline:
                time.sleep(0.01)
            if not relay.peers:
                raise SystemExit("the worker's relay never said hello to this one")
            base = notify_round_trip(url, args.runs)
            latencies(store, 20, announce=True)  # warm-up
            with_notify = latencies(store, args.runs, announce=True)
            unsent = latencies(store, max(10, args.runs // 10), announce=False)
            relay.stop()  # from here on, the only LISTEN connection is the worker's
            stop, cuts = threading.Event(), [0]
            cutter = threading.Thread(target=cut_listeners, args=(url, stop, cuts), daemon=True)
            cutter.start()
            try:
                time.sleep(0.5)  # the first cut is made
                lost = latencies(store, max(10, args.runs // 10), announce=False)
            finally:
                stop.set()
                cutter.join(10)
        finally:
            worker.terminate()
            worker.wait(30)
            relay.stop()
            store.dispose()
    ms = 1000.0
    report.add("baseline NOTIFY round trip, median", c.median(base) * ms, "ms")
    report.add("baseline NOTIFY round trip, p99", c.percentile(base, 99) * ms, "ms")
    report.add("queue -> claim with NOTIFY, median", c.median(with_notify) * ms, "ms")
    report.add("queue -> claim with NOTIFY, p99", c.percentile(with_notify, 99) * ms, "ms")
    report.add("queue -> claim, NOTIFY lost (listener cut), median", c.median(lost) * ms, "ms")
    report.add("queue -> claim, NOTIFY lost (listener cut), max", max(lost) * ms, "ms")
    report.add("queue -> claim, no NOTIFY sent (listener up), median", c.median(unsent) * ms, "ms")
    report.add("queue -> claim, no NOTIFY sent (listener up), max", max(unsent) * ms, "ms")
    report.ratios["claim median / NOTIFY round trip median"] = c.ratio(
        c.median(with_notify), c.median(base)
    )
    report.checks.append(Check("median with NOTIFY", c.median(with_notify) * ms, 5.0, "ms"))
    report.checks.append(Check("p99 with NOTIFY", c.percentile(with_notify, 99) * ms, 20.0, "ms"))
    report.checks.append(
        Check(
            "max with NOTIFY lost, listener cut (poll interval + 0.1 s)",
            max(lost) * ms,
            POLL_S * ms + 100,
            "ms",
        )
    )
    report.notes.append(f"{args.runs} runs, one at a time; the lane's poll interval {POLL_S:g} s")
    report.notes.append(f"the worker's LISTEN connection was cut {cuts[0]} times")
    report.print(as_json=args.json)
    return 0 if report.holds else 1


Check = c.Check

if __name__ == "__main__":
    threading.current_thread().name = "bench"
    raise SystemExit(main())
