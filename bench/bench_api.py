"""The admin API under load: a 10,000-job snapshot, a 1,000-job batch, event latency to 20 clients.

Set-up: 10,000 jobs in 100 trees (``_common.tree_rows``), bulk-inserted; the
dispatcher started on them with the production defaults, the event log, and
the API served by uvicorn on a free loopback port, exactly as the daemon does.
Clients talk HTTP with httpx.

* ``GET /api/v1/tree`` (10 times). Baseline: reading the same rows with
  ``queries.load_all_jobs`` in-process. Target: < 200 ms (median).
* ``PATCH /api/v1/jobs`` of 1,000 jobs' descriptions (3 rounds; one
  transaction and one dispatcher reaction each). Baseline: a bare executemany
  ``UPDATE`` of the same rows. Target: < 0.5 s (median).
* 20 clients on ``GET /api/v1/events``; 30 single-job edits; for each edit and
  client, the time from sending the edit to the client reading its event.
  Baseline: a bare HTTP round trip to ``/healthz`` on the same server.
  Target: < 50 ms (median).

    .venv/bin/python bench/bench_api.py [--pg] [--json]
"""

from __future__ import annotations

import json
import sys
import threading
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _common as c
import httpx
from sqlalchemy import bindparam, update

from jobcontrol import DispatcherConfig, Engine, Store, __version__
from jobcontrol.api.deps import ApiContext
from jobcontrol.api.server import ApiServer
from jobcontrol.runtime import Runtime
from jobcontrol.service.eventlog import EventLog
from jobcontrol.service.metrics import RunMetrics
from jobcontrol.service.users import Role, add_user
from jobcontrol.store import queries
from jobcontrol.store.schema import job

TREES = 100
CLIENTS = 20
EDITS = 30


def snapshot(http: httpx.Client, store: Store) -> tuple[float, float]:
    ours, base = [], []
    for _ in range(10):
        t = time.perf_counter()
        tree = http.get("/tree").raise_for_status().json()
        ours.append(time.perf_counter() - t)
        assert len(tree["jobs"]) == TREES * c.JOBS_PER_TREE
        t = time.perf_counter()
        with store.read() as conn:
            queries.load_all_jobs(conn)
        base.append(time.perf_counter() - t)
    return c.median(ours), c.median(base)


def batch(
    http: httpx.Client, store: Store, names: list[str], ids: list[int]
) -> tuple[float, float]:
    ours, base = [], []
    for r in range(3):
        changes = [{"job": n, "fields": {"description": f"round {r} {n}"}} for n in names]
        t = time.perf_counter()
        http.patch("/jobs", json={"changes": changes}).raise_for_status()
        ours.append(time.perf_counter() - t)
        stmt = update(job).where(job.c.id == bindparam("b_id")).values(description=bindparam("b_d"))
        t = time.perf_counter()
        with store.write() as conn:
            conn.execute(stmt, [{"b_id": i, "b_d": f"bare {r}"} for i in ids])
        base.append(time.perf_counter() - t)
    return c.median(ours), c.median(base)


class Listener(threading.Thread):
    """One SSE client: notes when it read each version of the watched job."""

    def __init__(self, url: str, token: str, after: int, job_id: int) -> None:
        super().__init__(daemon=True)
        self.url, self.token, self.after, self.job_id = url, token, after, job_id
        self.seen: dict[int, float] = {}
        self.connected = threading.Event()

    def run(self) -> None:
        headers = {"Authorization": f"Bearer {self.token}", "Last-Event-ID": str(self.after)}
        with (
            httpx.Client(timeout=httpx.Timeout(60, read=None)) as http,
            http.stream("GET", f"{self.url}/events", headers=headers) as stream,
        ):
            self.connected.set()
            for line in stream.iter_lines():
                if not line.startswith("data:"):
                    continue
                now = time.perf_counter()
                for view in json.loads(line[5:]).get("jobs", []):
                    if view.get("id") == self.job_id:
                        self.seen.setdefault(view["version"], now)


def latency(http: httpx.Client, url: str, token: str, name: str) -> tuple[float, float, int]:
    after = http.get("/tree").json()["seq"]
    watched = http.get(f"/jobs/{name}").json()
    listeners = [Listener(url, token, after, watched["id"]) for _ in range(CLIENTS)]
    for listener in listeners:
        listener.start()
    for listener in listeners:
        listener.connected.wait(10)
    sent: dict[int, float] = {}
    for i in range(EDITS):
        version = watched["version"] + i + 1  # each edit bumps the version by one
        sent[version] = time.perf_counter()
        change = {"job": name, "fields": {"description": f"latency {i}"}}
        http.patch("/jobs", json={"changes": [change]}).raise_for_status()
        time.sleep(
            0.02
        )  # a change every ~20 ms, not a flood: this measures latency, not throughput
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(len(lst.seen) < EDITS for lst in listeners):
        time.sleep(0.05)
    samples = [lst.seen[v] - t for lst in listeners for v, t in sent.items() if v in lst.seen]
    rtts = []
    for _ in range(50):
        t = time.perf_counter()
        http.get(url.replace("/api/v1", "") + "/healthz")
        rtts.append(time.perf_counter() - t)
    return c.median(samples), c.median(rtts), len(samples)


def run(url: str, tmp: Path, store_name: str) -> c.Report:
    c.bulk_load(url, TREES)
    store = Store(url)
    runtime = Runtime(store, DispatcherConfig(log_root=tmp / "logs"))
    dispatcher = runtime.dispatcher
    runtime.start()
    log = EventLog(dispatcher)
    log.start()
    _, token = add_user(store, "bench", Role.ADMIN)
    ctx = ApiContext(
        store=store,
        engine=Engine(store, dispatcher),
        eventlog=log,
        version=__version__,
        started=datetime.now(UTC),
        metrics=RunMetrics(dispatcher),
    )
    server = ApiServer(ctx, port=0)
    base = server.start() + "/api/v1"
    rep = c.Report("bench_api", store_name)
    try:
        with httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60
        ) as http:
            jobs = http.get("/tree").json()["jobs"]
            tasks = [j for j in jobs if j["kind"] == "task"][:1000]
            snap, snap_base = snapshot(http, store)
            edit, edit_base = batch(
                http, store, [j["name"] for j in tasks], [j["id"] for j in tasks]
            )
            lat, rtt, n = latency(http, base, token, tasks[0]["name"])
    finally:
        server.stop()
        log.stop()
        runtime.stop(kill_running=True)
        store.dispose()
    rep.add("GET /tree, 10,000 jobs (median)", snap * 1000, "ms")
    rep.add("baseline: load_all_jobs", snap_base * 1000, "ms")
    rep.add("PATCH of 1,000 jobs (median)", edit, "s")
    rep.add("baseline: bare UPDATE of 1,000 rows", edit_base, "s")
    rep.add(f"event latency, {CLIENTS} clients (median of {n})", lat * 1000, "ms")
    rep.add("baseline: GET /healthz round trip", rtt * 1000, "ms")
    rep.ratios["snapshot / bare load"] = c.ratio(snap, snap_base)
    rep.ratios["batch / bare UPDATE"] = c.ratio(edit, edit_base)
    rep.ratios["event latency / HTTP round trip"] = c.ratio(lat, rtt)
    if n < CLIENTS * EDITS:
        rep.notes.append(f"only {n} of {CLIENTS * EDITS} events arrived within the wait")
    rep.checks += [
        c.Check("snapshot", snap * 1000, 200, "ms"),
        c.Check("1,000-job batch", edit, 0.5, "s"),
        c.Check("event latency (median)", lat * 1000, 50, "ms"),
    ]
    rep.checks.append(c.Check("events lost", CLIENTS * EDITS - n, 1, "events"))
    return rep


def main() -> int:
    args = c.parser((__doc__ or "").splitlines()[0]).parse_args()
    reports = []
    with c.temp_dir("api") as tmp:
        reports.append(run(c.sqlite_url(tmp), tmp / "sqlite", "sqlite"))
        if args.pg:
            with c.postgres("bench_api") as url:
                reports.append(run(url, tmp / "pg", "postgresql"))
    for rep in reports:
        rep.print(as_json=args.json)
    return 0 if all(rep.holds for rep in reports) else 1


if __name__ == "__main__":
    sys.exit(main())
