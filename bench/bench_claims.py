"""Claim throughput on PostgreSQL: Job Control's run queue against procrastinate (issue 10).

Both sides drain the same number of queued no-op jobs (10,000 by default) from their own
database on one throwaway PostgreSQL server (tests/pgserver.py), with the same number of
worker processes (4) and slots per process (4):

* **Job Control**: ``jobcontrol db upgrade``, then the runs are queued with the store's
  own ``queries.insert_run`` (the dispatcher's insert, state ``queued``, one transaction).
  Each worker process registers (``RunQueue.register``) and runs one claim loop (the slot
  group's workloop): ``RunQueue.claim(limit=<free slots>)`` hands the runs to its slot
  threads, each of which records the end with ``RunQueue.finish`` (compare-and-set, the
  next task of a sequence taken along, as the local worker does) and frees its slot.
  The no-op: **no process is spawned**, no log file is written: what is measured is the
  run queue (claim + finish), the same thing procrastinate's side measures.
* **procrastinate** (pinned version, installed in the benchmark's own virtualenv, never
  in the project's): the schema, ``batch_defer`` of the jobs, 4 ``procrastinate``
  workers of ``concurrency=4`` running an ``async`` no-op task, ``wait=False`` so each
  stops once the queue is empty. Its code is ``_procrastinate_child.py``.

Jobs per second = jobs / (first claim -> last finish), both read from the database: on
our side ``min(run.started)`` -> ``max(run.ended)`` (the times the workers stamp just
before their claim and finish transactions), on procrastinate's ``min(at)`` of its
``started`` events -> ``max(at)`` of its ``succeeded`` events (``now()`` of the fetch
and finish transactions). CPU per job: the worker processes' own CPU (from the go signal
to their exit), and the PostgreSQL server's (every server process, the ended ones
included, from ``/proc``) over the same span.

    .venv/bin/python bench/bench_claims.py                 # 10,000 jobs, 4 x 4
    .venv/bin/python bench/bench_claims.py --runs 2000 --rounds 3
    .venv/bin/python bench/bench_claims.py --self-check    # tiny, checks correctness only

``--self-check`` (the test's mode) drains a few hundred runs on each side and fails
unless every run was finished exactly once and no worker ever held more runs than its
slots; it does not judge the 2x target, which a tiny run cannot measure.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import _common  # noqa: E402

PROCRASTINATE_PIN = "procrastinate==3.10.0"
PSYCOPG_PIN = "psycopg[binary]==3.3.9"
DEFAULT_VENV = HERE / ".venv-procrastinate"
TARGET_RATIO = 2.0
WAIT_S = 600.0  # the longest a side may take to drain (bounded, then the run fails)


# ------------------------------------------------------------------ the Job Control worker


class _EngineOps:
    """Claim and finish through the run queue (``RunQueue``), as a worker does."""

    def __init__(self, url: str, name: str, slots: int) -> None:
        from jobcontrol.clock import SystemClock
        from jobcontrol.model import RunState
        from jobcontrol.store import Store
        from jobcontrol.store.runqueue import RunQueue, WorkerInfo

        self.name, self.host, self.clock = name, socket.gethostname(), SystemClock()
        self.succeeded = RunState.SUCCEEDED
        self.store = Store(url, pool_size=slots + 2)
        self.rq = RunQueue(self.store)
        # Not counted here: claim and finish run on the driver, under SQLAlchemy's events;
        # in autocommit each is one transaction, which pg_stat_database counts.
        self.statements = 0
        now = self.clock.now()
        self.rq.register(WorkerInfo(name, self.host, os.getpid(), slots, "bench", now), now)

    def session(self) -> Any:
        return self.store.pinned()  # each thread keeps its connection, as the worker's do

    def claim(self, limit: int) -> list[tuple[int, datetime]]:
        runs = self.rq.claim(self.name, self.host, self.clock.now(), limit=limit)
        return [(r.id, r.started or self.clock.now()) for r in runs]

    def finish(self, run_id: int, started: datetime) -> bool:
        ended = self.clock.now()
        values = {  # the columns the local worker writes (worker/local.py ``_finish``)
            "state": self.succeeded,
            "exit_status": 0,
            "signal": None,
            "reason": None,
            "ended": ended,
            "duration_ms": max(0, int((ended - started).total_seconds() * 1000)),
            "log_path": None,
            "pid": None,
            "lease_until": None,
            "cpu_us": None,
            "mem_peak_bytes": None,
        }
        done = self.rq.finish(run_id, self.name, values, 50, take_next=(self.host, lambda: ended))
        return done.recorded

    def close(self) -> None:
        self.rq.deregister(self.name, self.clock.now())
        self.store.dispose()


# The floor: one autocommit statement per claim and per finish on the same schema, with
# plain psycopg (no lanes: what the table allows when no lane needs a count).
_FLOOR_CLAIM = """
UPDATE run SET state = 'running', started = %(now)s, worker = %(w)s, host = %(h)s,
       lease_until = %(lease)s
 WHERE id IN (SELECT id FROM run WHERE state = 'queued' ORDER BY priority DESC, id
              LIMIT %(n)s FOR UPDATE SKIP LOCKED)
RETURNING id, started"""
_FLOOR_FINISH = """
WITH fin AS (
  UPDATE run SET state = 'succeeded', exit_status = 0, ended = %(now)s,
         duration_ms = %(ms)s, lease_until = NULL
   WHERE id = %(id)s AND worker = %(w)s AND state = 'running' RETURNING id),
nxt AS (
  UPDATE run SET state = 'queued'
   WHERE after_run_id IN (SELECT id FROM fin) AND state = 'pending' RETURNING id)
SELECT count(*) FROM fin"""


def _naive_utc() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)  # how the schema stores times (UTCDateTime)


class _FloorOps:
    def __init__(self, conninfo: str, name: str) -> None:
        import psycopg

        self.psycopg, self.conninfo = psycopg, conninfo
        self.name, self.host = name, socket.gethostname()
        self.local = threading.local()
        self.statements = 0

    @contextlib.contextmanager
    def session(self) -> Iterator[None]:
        with self.psycopg.connect(self.conninfo, autocommit=True) as conn:
            self.local.conn = conn
            yield

    def claim(self, limit: int) -> list[tuple[int, datetime]]:
        self.statements += 1
        now = _naive_utc()
        lease = now + timedelta(seconds=30)
        params = {"now": now, "w": self.name, "h": self.host, "lease": lease, "n": limit}
        return list(self.local.conn.execute(_FLOOR_CLAIM, params, prepare=True).fetchall())

    def finish(self, run_id: int, started: datetime) -> bool:
        self.statements += 1
        now = _naive_utc()
        ms = int((now - started).total_seconds() * 1000)
        params = {"now": now, "ms": ms, "id": run_id, "w": self.name}
        row = self.local.conn.execute(_FLOOR_FINISH, params, prepare=True).fetchone()
        return bool(row and row[0] == 1)

    def close(self) -> None:
        pass


def jc_worker(name: str, slots: int, floor: bool) -> None:
    """One worker process: say "ready", wait for a line on stdin, drain the queue.

    One claim loop (the group's workloop) claims up to the free slots; each slot thread
    records its run's end. Prints one JSON line: CPU, claims, time in claim and finish,
    statements, and the largest number of runs it ever held at once.
    """
    ops: _EngineOps | _FloorOps
    if floor:
        ops = _FloorOps(os.environ["BENCH_PG_CONNINFO"], name)
    else:
        ops = _EngineOps(os.environ["BENCH_JC_URL"], name, slots)
    print("ready", flush=True)
    if not sys.stdin.readline():
        raise SystemExit("no go line on stdin")
    cpu0, wall0 = time.process_time(), time.monotonic()
    ops.statements = 0
    finish_s = [0.0]
    claim_s = 0.0

    cond = threading.Condition()
    held = 0
    most_held = 0
    unrecorded: list[int] = []
    errors: list[str] = []
    work: queue.SimpleQueue[tuple[int, datetime] | None] = queue.SimpleQueue()

    def slot() -> None:
        nonlocal held
        with ops.session():
            while (run := work.get()) is not None:
                try:
                    t = time.perf_counter()
                    recorded = ops.finish(*run)
                    finish_s[0] += time.perf_counter() - t
                    if not recorded:
                        unrecorded.append(run[0])
                except Exception as exc:  # reported in the JSON line; the run fails
                    errors.append(f"finish {run[0]}: {exc!r}")
                with cond:
                    held -= 1
                    cond.notify()

    threads = [threading.Thread(target=slot, name=f"slot-{i}") for i in range(slots)]
    for t in threads:
        t.start()
    claims = 0
    try:
        with ops.session():
            while True:
                with cond:
                    while held >= slots:
                        cond.wait()
                    free = slots - held
                t = time.perf_counter()
                claimed = ops.claim(free)
                claim_s += time.perf_counter() - t
                claims += 1
                if len(claimed) > free:
                    errors.append(f"claim returned {len(claimed)} runs for {free} free slots")
                if not claimed:
                    break  # every run was queued before the start: an empty queue is the end
                with cond:
                    held += len(claimed)
                    most_held = max(most_held, held)
                for run in claimed:
                    work.put(run)
    except Exception as exc:
        errors.append(f"claim: {exc!r}")
    finally:
        for _ in threads:
            work.put(None)
        for t in threads:
            t.join()
    ops.close()
    out = {
        "name": name,
        "cpu_s": time.process_time() - cpu0,
        "wall_s": time.monotonic() - wall0,
        "claims": claims,
        "claim_s": claim_s,
        "finish_s": finish_s[0],
        "statements": ops.statements,
        "most_held": most_held,
        "unrecorded": unrecorded,
        "errors": errors,
    }
    print(json.dumps(out), flush=True)


# ------------------------------------------------------------------ processes and CPU


def _start(argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )


def _read_line(proc: subprocess.Popen[str], what: str, timeout: float) -> str:
    """The next line the process prints, within ``timeout`` s (else it is killed)."""
    assert proc.stdout is not None
    box: list[str] = []
    reader = threading.Thread(target=lambda: box.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout)
    if not box or not box[0]:
        proc.kill()
        _, err = proc.communicate(timeout=10)
        raise SystemExit(f"{what}: no line within {timeout:.0f} s; stderr:\n{err[-3000:]}")
    return box[0].strip()


def _kill(procs: Sequence[subprocess.Popen[str]]) -> None:
    """End the workers this run started (after one failed), and reap them."""
    for q in procs:
        if q.poll() is None:
            q.kill()
            q.wait(timeout=10)


_DB_STATS = ("xact_commit", "tup_fetched", "tup_inserted", "tup_updated")


def _db_stats(server: Any, dbname: str) -> dict[str, int]:
    """The database's counters in ``pg_stat_database`` (transactions, rows touched)."""
    with server.connect(autocommit=True) as conn:
        row = conn.execute(
            f"SELECT {', '.join(_DB_STATS)} FROM pg_stat_database WHERE datname = %s", (dbname,)
        ).fetchone()
    return dict(zip(_DB_STATS, row or (0,) * len(_DB_STATS), strict=True))


def _run_workers(
    procs: Sequence[subprocess.Popen[str]], server: Any, dbname: str
) -> tuple[list[dict[str, Any]], float, float, dict[str, int]]:
    """Wait for every worker's "ready", start them together, wait for their reports.

    Returns the reports, the wall time from go to the last exit, the PostgreSQL
    server's CPU seconds over that span and the database's counters' growth."""
    for i, p in enumerate(procs):
        line = _read_line(p, f"worker {i}", 120)
        if line != "ready":
            raise SystemExit(f"worker {i} said {line!r} instead of ready")
    stats0 = _db_stats(server, dbname)
    cpu0 = _server_cpu(server)
    t0 = time.monotonic()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    reports = []
    for i, p in enumerate(procs):
        try:
            out, err = p.communicate(timeout=WAIT_S)
        except subprocess.TimeoutExpired:
            _kill(procs)
            raise SystemExit(f"worker {i} did not finish within {WAIT_S:.0f} s") from None
        if p.returncode != 0:
            _kill(procs)
            raise SystemExit(f"worker {i} exited {p.returncode}; stderr:\n{err[-3000:]}")
        reports.append(json.loads(out.strip().splitlines()[-1]))
    wall = time.monotonic() - t0
    _wait_disconnected(server, dbname)
    cpu = _server_cpu(server) - cpu0
    stats = _db_stats(server, dbname)
    return reports, wall, cpu, {k: stats[k] - stats0[k] for k in _DB_STATS}


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def _stat_fields(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def _server_cpu(server: Any) -> float:
    """CPU seconds of the whole PostgreSQL server so far: the postmaster, its live children,
    and (through the postmaster's cutime/cstime) the children it has reaped."""
    pid = server._postmaster_pid(server.datadir)
    if pid is None:
        return float("nan")
    f = _stat_fields(pid)  # fields after the name: [0] is state; utime is [11]
    ticks = sum(int(x) for x in f[11:15])
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            cf = _stat_fields(int(entry.name))
        except OSError:
            continue
        if cf[1] == str(pid):
            ticks += int(cf[11]) + int(cf[12])
    return ticks / _CLK_TCK


def _wait_disconnected(server: Any, dbname: str) -> None:
    """Until the workers' server processes have gone (their CPU is then the postmaster's)."""
    deadline = time.monotonic() + 10
    with server.connect(autocommit=True) as conn:
        while time.monotonic() < deadline:
            row = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = %s", (dbname,)
            ).fetchone()
            if row is not None and row[0] == 0:
                return
            time.sleep(0.02)


# ------------------------------------------------------------------ the two sides


@dataclass
class Side:
    name: str
    jobs: int
    span_s: float  # first claim -> last finish
    wall_s: float  # go -> the last worker exited
    worker_cpu_s: float
    server_cpu_s: float
    stats: dict[str, int]
    notes: list[str] = field(default_factory=list)

    @property
    def per_s(self) -> float:
        return self.jobs / self.span_s if self.span_s > 0 else float("inf")

    def cpu_ms_per_job(self, which: str) -> float:
        cpu = self.worker_cpu_s if which == "workers" else self.server_cpu_s
        return cpu * 1000 / self.jobs


def jobcontrol_side(
    server: Any, args: Any, round_no: int, errors: list[str], *, floor: bool = False
) -> Side:
    """Job Control's side; with ``floor``, the same database and rows drained by one plain
    statement per claim and per finish (the SQL floor, a diagnostic)."""
    from jobcontrol.model import Kind, RunState, Trigger
    from jobcontrol.store import Store, queries

    label = "sql-floor" if floor else "jobcontrol"
    dbname = f"{'fl' if floor else 'jc'}_claims_{round_no}"
    server.create_database(dbname)
    url = server.url(dbname)
    env = {**os.environ, "JOBCONTROL_DB": url}
    jc = Path(sys.executable).with_name("jobcontrol")
    subprocess.run([str(jc), "db", "upgrade"], env=env, check=True, capture_output=True)

    store = Store(url)
    now = datetime.now(UTC)
    with store.write() as conn:  # as the dispatcher queues a task run (dispatch/runs.py)
        for i in range(args.runs):
            queries.insert_run(
                conn,
                {
                    "job_id": i + 1,
                    "job_name": f"noop-{i}",
                    "kind": Kind.TASK,
                    "trigger": Trigger.MANUAL,
                    "state": RunState.QUEUED,
                    "parent_run_id": None,
                    "root_run_id": None,
                    "queue": "default",
                    "priority": 0,
                    "created": now,
                    "requested_by": "bench",
                    "reason": None,
                    "command": "true",
                    "cwd": None,
                    "env": {},
                    "timeout_s": None,
                    "max_log_files": None,
                },
            )
    with store.write() as conn:
        conn.exec_driver_sql("ANALYZE run")
    store.dispose()

    script = str(Path(__file__).resolve())
    procs = [
        _start(
            [sys.executable, script, "--jc-worker", f"bench-{i}", str(args.slots)]
            + (["--floor"] if floor else []),
            {**os.environ, "BENCH_JC_URL": url, "BENCH_PG_CONNINFO": server.conninfo(dbname)},
        )
        for i in range(args.workers)
    ]
    reports, wall, server_cpu, stats = _run_workers(procs, server, dbname)

    for r in reports:
        errors += [f"{r['name']}: {e}" for e in r["errors"]]
        if r["unrecorded"]:
            errors.append(f"{r['name']}: ends not recorded for runs {r['unrecorded'][:10]}")
        if r["most_held"] > args.slots:
            errors.append(f"{r['name']} held {r['most_held']} runs with {args.slots} slots")
    with server.connect(dbname) as conn:
        states = dict(conn.execute("SELECT state, count(*) FROM run GROUP BY state").fetchall())
        if states != {"succeeded": args.runs}:
            errors.append(f"{label}: run states after the drain {states}")
        first, last = conn.execute("SELECT min(started), max(ended) FROM run").fetchone() or (
            None,
            None,
        )
        errors += _held_at_once(conn, "SELECT worker, started, ended FROM run", args.slots)
    span = (last - first).total_seconds() if first and last else float("nan")
    side = Side(
        label,
        args.runs,
        span,
        wall,
        sum(r["cpu_s"] for r in reports),
        server_cpu,
        stats,
    )
    claims = sum(r["claims"] for r in reports)
    n = args.runs
    side.notes.append(
        f"{label}: {claims} claims for {n} runs; per run: claim"
        f" {sum(r['claim_s'] for r in reports) * 1000 / n:.3f} ms, finish"
        f" {sum(r['finish_s'] for r in reports) * 1000 / n:.3f} ms (wall, summed over"
        f" workers)"
        + (
            f", {sum(r['statements'] for r in reports) / n:.2f} statements"
            if floor
            else "; statements: xact_commit below (each runs in autocommit)"
        )
    )
    server.drop_database(dbname)
    return side


def _held_at_once(conn: Any, query: str, slots: int) -> list[str]:
    """Each worker's most runs held at one instant, from the rows' claim intervals."""
    per_worker: dict[str, list[tuple[datetime, int]]] = {}
    for who, start, end in conn.execute(query):
        if start is None or end is None:
            continue  # not claimed or not ended: the state check reports it
        per_worker.setdefault(str(who), []).extend([(start, 1), (end, -1)])
    errors = []
    for who, points in per_worker.items():
        level = most = 0
        for _, step in sorted(points, key=lambda p: (p[0], p[1])):  # ends before starts
            level += step
            most = max(most, level)
        if most > slots:
            errors.append(f"{who} held {most} runs at once with {slots} slots")
    return errors


def procrastinate_python(venv: Path) -> Path:
    """The benchmark venv's interpreter, with the pinned procrastinate (created if needed)."""
    python = venv / "bin" / "python"
    want = PROCRASTINATE_PIN.split("==")[1]
    if python.exists():
        got = subprocess.run(
            [str(python), "-c", "import procrastinate; print(procrastinate.__version__)"],
            capture_output=True,
            text=True,
        ).stdout.strip()
        if got == want:
            return python
    print(f"creating {venv} with {PROCRASTINATE_PIN} (once)", flush=True)
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
    pip = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", PROCRASTINATE_PIN, PSYCOPG_PIN],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        raise SystemExit(f"pip install {PROCRASTINATE_PIN} into {venv} failed:\n{pip.stderr}")
    return python


def procrastinate_side(
    server: Any, args: Any, round_no: int, python: Path, errors: list[str]
) -> Side:
    dbname = f"pr_claims_{round_no}"
    server.create_database(dbname)
    env = {**os.environ, "BENCH_PG_CONNINFO": server.conninfo(dbname)}
    child = str(HERE / "_procrastinate_child.py")
    setup = subprocess.run(
        [str(python), child, "setup", str(args.runs)], env=env, capture_output=True, text=True
    )
    if setup.returncode != 0:
        raise SystemExit(f"procrastinate setup failed:\n{setup.stderr[-3000:]}")
    with server.connect(dbname, autocommit=True) as conn:
        conn.execute("ANALYZE procrastinate_jobs")
    procs = [
        _start([str(python), child, "worker", f"bench-{i}", str(args.slots)], env)
        for i in range(args.workers)
    ]
    reports, wall, server_cpu, stats = _run_workers(procs, server, dbname)
    with server.connect(dbname) as conn:
        states = dict(
            conn.execute(
                "SELECT status::text, count(*) FROM procrastinate_jobs GROUP BY status"
            ).fetchall()
        )
        if states != {"succeeded": args.runs}:
            errors.append(f"procrastinate: job states after the drain {states}")
        first, last = conn.execute(
            "SELECT min(at) FILTER (WHERE type = 'started'),"
            " max(at) FILTER (WHERE type = 'succeeded') FROM procrastinate_events"
        ).fetchone() or (None, None)
        (twice,) = conn.execute(
            "SELECT count(*) FROM procrastinate_jobs WHERE attempts <> 1"
        ).fetchone() or (0,)
        if twice:
            errors.append(f"procrastinate: {twice} jobs not run exactly once")
    span = (last - first).total_seconds() if first and last else float("nan")
    side = Side(
        "procrastinate",
        args.runs,
        span,
        wall,
        sum(r["cpu_s"] for r in reports),
        server_cpu,
        stats,
    )
    server.drop_database(dbname)
    return side


# ------------------------------------------------------------------ main


def main(argv: list[str] | None = None) -> int:
    p = _common.parser("Claim throughput: Job Control's run queue against procrastinate", pg=False)
    p.add_argument("--runs", type=int, default=10_000, help="jobs queued per side (10,000)")
    p.add_argument("--workers", type=int, default=4, help="worker processes per side (4)")
    p.add_argument("--slots", type=int, default=4, help="slots (concurrency) per worker (4)")
    p.add_argument("--rounds", type=int, default=1, help="rounds of both sides (alternating)")
    p.add_argument(
        "--procrastinate-venv",
        type=Path,
        default=DEFAULT_VENV,
        help=f"the virtualenv procrastinate runs in (default {DEFAULT_VENV.relative_to(HERE.parent)})",
    )
    p.add_argument(
        "--self-check",
        action="store_true",
        help="a tiny run (300 jobs, 2 x 2) that checks correctness, not the target",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="also drain with one plain SQL statement per claim and per finish on our"
        " schema (a diagnostic: what the engine costs above the SQL)",
    )
    p.add_argument("--jc-worker", nargs=2, metavar=("NAME", "SLOTS"), help=argparse_hidden())
    args = p.parse_args(argv)
    if args.jc_worker:
        jc_worker(args.jc_worker[0], int(args.jc_worker[1]), args.floor)
        return 0
    if args.self_check:
        args.runs, args.workers, args.slots, args.rounds = 300, 2, 2, 1
    for opt in ("runs", "workers", "slots", "rounds"):
        if getattr(args, opt) < 1:
            p.error(f"--{opt} must be at least 1, not {getattr(args, opt)}")

    from tests.pgserver import PostgresServer

    python = procrastinate_python(args.procrastinate_venv)
    bindir = PostgresServer.available()
    if bindir is None:
        raise SystemExit("no PostgreSQL server binaries found (tests/pgserver.py)")
    errors: list[str] = []
    ours: list[Side] = []
    theirs: list[Side] = []
    floors: list[Side] = []
    with PostgresServer(bindir) as server:
        for n in range(args.rounds):
            # Alternate which side goes first, so neither always gets the warmer server.
            if n % 2 == 0:
                ours.append(jobcontrol_side(server, args, n, errors))
                theirs.append(procrastinate_side(server, args, n, python, errors))
            else:
                theirs.append(procrastinate_side(server, args, n, python, errors))
                ours.append(jobcontrol_side(server, args, n, errors))
            if args.floor:
                floors.append(jobcontrol_side(server, args, n, errors, floor=True))

    report = _common.Report("bench_claims", "postgresql")
    best = _median_side(ours)
    base = _median_side(theirs)
    floor = _median_side(floors) if floors else None
    for side in (best, base, *([floor] if floor else [])):
        report.add(f"{side.name} jobs/s", side.per_s, "jobs/s")
        report.add(f"{side.name} first claim -> last finish", side.span_s, "s")
        report.add(f"{side.name} go -> last worker exit", side.wall_s, "s")
        report.add(f"{side.name} worker CPU per job", side.cpu_ms_per_job("workers"), "ms")
        report.add(f"{side.name} server CPU per job", side.cpu_ms_per_job("server"), "ms")
    if args.rounds > 1:
        report.notes.append(
            "jobs/s per round: Job Control "
            + ", ".join(f"{s.per_s:,.0f}" for s in ours)
            + "; procrastinate "
            + ", ".join(f"{s.per_s:,.0f}" for s in theirs)
            + " (the figures above are the medians)"
        )
    ratio = _common.ratio(best.per_s, base.per_s)
    report.ratios["jobs/s jobcontrol / procrastinate"] = ratio
    report.ratios["worker CPU per job jobcontrol / procrastinate"] = _common.ratio(
        best.cpu_ms_per_job("workers"), base.cpu_ms_per_job("workers")
    )
    report.ratios["server CPU per job jobcontrol / procrastinate"] = _common.ratio(
        best.cpu_ms_per_job("server"), base.cpu_ms_per_job("server")
    )
    report.notes.append(
        f"{args.runs:,} no-op jobs per side, {args.workers} worker processes x {args.slots}"
        f" slots, {PROCRASTINATE_PIN}; our side spawns no process (claim + finish only)"
    )
    report.notes += best.notes
    if floor is not None:
        report.notes += floor.notes
        report.ratios["jobs/s jobcontrol / sql-floor"] = _common.ratio(best.per_s, floor.per_s)
    for side in (best, base, *([floor] if floor else [])):
        report.notes.append(
            f"{side.name} per job (pg_stat_database): "
            + ", ".join(f"{k} {v / side.jobs:.2f}" for k, v in side.stats.items())
        )
    if args.self_check:
        report.notes.append("self-check: a tiny run; the 2x target is not judged")
    else:
        report.checks.append(
            _common.Check(
                "jobs/s jobcontrol / procrastinate", ratio, TARGET_RATIO, "x", at_least=True
            )
        )
    for e in errors[:20]:
        report.notes.append(f"ERROR: {e}")
    if len(errors) > 20:
        report.notes.append(f"ERROR: ... and {len(errors) - 20} more")
    report.print(as_json=args.json)
    if errors:
        return 2
    return 0 if report.holds else 1


def _median_side(sides: list[Side]) -> Side:
    return sorted(sides, key=lambda s: s.per_s)[len(sides) // 2]


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    raise SystemExit(main())
