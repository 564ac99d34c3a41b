"""Task logs kept in the database (a remote worker's, ``log_store="database"``), read
through the real API exactly as a log file is: range, tail, follow, end detection.

The daemon here runs no worker of its own (``slots=0``); the worker is built as
``runtime.py`` builds the embedded one, with ``log_store="database"``.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import stat
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from jobcontrol.clock import Clock, SystemClock
from jobcontrol.model import DB_LOG, RunState
from jobcontrol.store import Store
from jobcontrol.store.runqueue import RunQueue
from jobcontrol.store.schema import run_log
from jobcontrol.worker import Worker, dblog
from jobcontrol.worker.dblog import LEFTOVER_GRACE
from tests.api.conftest import Api, _api
from tests.api.test_api_system import parse_metrics
from tests.conftest import MakeJC
from tests.integration.helpers import JC, poll_until, task
from tests.pgserver import PostgresServer

pytestmark = pytest.mark.timeout(90)

V1 = "/api/v1"
# For what the store does not change (the spool, the worker's checks); SQLite's lock
# stands for an outage here, PostgreSQL's is stopped in its own test below.
SQLITE_ONLY = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
# The test's lock waits for a worker's or the dispatcher's short write to end before it
# is held (with no wait, BEGIN IMMEDIATE fails whenever one is under way).
LOCK_WAIT = 10.0


@contextlib.contextmanager
def _db_log_worker(
    jc: JC, tmp_path: Path, name: str, *, slots: int, clock: Clock | None = None
) -> Iterator[Worker]:
    """A started worker that keeps its tasks' output in the database, as a remote one
    does; killed and stopped at the end."""
    worker = Worker(
        RunQueue(jc.store),
        clock=clock or jc.clock,
        log_root=tmp_path / "remote-logs",
        instance_id=jc.instance_id,
        name=name,
        slots=slots,
        kill_grace=2.0,
        poll_interval=0.2,
        heartbeat_interval=0.2,
        log_store="database",
        spool_dir=tmp_path / "remote-spool",
    )
    worker.start()
    worker.wake()
    try:
        yield worker
    finally:
        worker.kill_all("test over")
        worker.stop(30)


@pytest.fixture
def remote(api_db: Api, tmp_path: Path) -> Iterator[Worker]:
    """A worker that keeps its tasks' output in the database, as a remote one does."""
    with _db_log_worker(api_db.jc, tmp_path, "remote-1", slots=2) as worker:
        yield worker


@pytest.fixture
def api_db(db_url: str, make_jc: MakeJC) -> Iterator[Api]:
    """The API over a dispatcher with no embedded worker, on each store in turn."""
    yield from _api(
        db_url,
        lambda u, **kw: make_jc(u, slots=0, busy_timeout=0.3, lease=2.0, poll_interval=0.2, **kw),
    )


def _chunks(api_db: Api, run_id: int) -> int:
    return _count(api_db.jc.store, run_id)


def _read_until(chunks: Iterator[bytes], seen: bytearray, want: bytes) -> None:
    while not seen.endswith(want):
        seen += next(chunks)


def test_follow_shows_a_remote_tasks_lines_while_it_runs(
    api_db: Api, remote: Worker, tmp_path: Path
) -> None:
    jc = api_db.jc
    one, two = jc.gate("one"), jc.gate("two")
    jc.create(
        task("talker", f"echo first; {one.command}; echo second >&2; {two.command}; echo third")
    )
    mark = jc.rec.mark()
    run_id = jc.run_now("talker")
    poll_until(
        "the run to say its log is in the database", lambda: jc.run(run_id).log_path == DB_LOG
    )
    h = api_db.headers("viewer")
    seen = bytearray()
    with api_db.client.stream("GET", f"{V1}/runs/{run_id}/log?follow=true", headers=h) as r:
        assert r.status_code == 200
        chunks = r.iter_bytes()
        _read_until(chunks, seen, b"first\n")  # while the task waits on the first gate
        assert jc.run(run_id).state == RunState.RUNNING
        one.open()
        _read_until(chunks, seen, b"second\n")  # stderr too, while it waits on the second
        assert jc.run(run_id).state == RunState.RUNNING
        two.open()
        seen += b"".join(chunks)  # the stream ends by itself once the run is final
    assert bytes(seen) == b"first\nsecond\nthird\n"
    assert jc.rec.run_finished("talker", since=mark)["state"] == "succeeded"
    done = jc.run(run_id)
    assert (done.log_path, done.worker) == (DB_LOG, "remote-1")
    # A range, a tail and the whole log as a file's would be answered.
    r = api_db.client.get(f"{V1}/runs/{run_id}/log?offset=6&length=7", headers=h)
    assert (r.content, r.headers["X-Log-Size"], r.headers["X-Log-Offset"]) == (
        b"second\n",
        "19",
        "6",
    )
    r = api_db.client.get(f"{V1}/runs/{run_id}/log?tail=6", headers=h)
    assert (r.content, r.headers["X-Log-Offset"]) == (b"third\n", "13")
    r = api_db.client.get(f"{V1}/runs/{run_id}/log?follow=true&tail=6", headers=h)
    assert r.content == b"third\n"
    # Nothing of it stays on the worker's host.
    assert list((tmp_path / "remote-spool").iterdir()) == []
    assert not (tmp_path / "remote-logs").exists() or not any(
        (tmp_path / "remote-logs").glob("job-*")
    )


def test_binary_output_round_trips_in_many_chunks(api_db: Api, remote: Worker) -> None:
    jc = api_db.jc
    # Every byte value, then 200 KiB of arbitrary bytes: several 64 KiB chunks.
    data = bytes(range(256)) + os.urandom(200 * 1024) + b"\xff\xfe not utf-8 \xc3\x28"
    source = jc.tmp_path / "blob.bin"
    source.write_bytes(data)
    jc.create(task("blob", f'cat "{source}"'))
    mark = jc.rec.mark()
    run_id = jc.run_now("blob")
    assert jc.rec.run_finished("blob", since=mark)["state"] == "succeeded"
    h = api_db.headers("viewer")
    r = api_db.client.get(f"{V1}/runs/{run_id}/log?length=4194304", headers=h)
    assert r.headers["X-Log-Size"] == str(len(data))
    assert r.content == data
    r = api_db.client.get(f"{V1}/runs/{run_id}/log?follow=true", headers=h)
    assert r.content == data
    assert _chunks(api_db, run_id) >= 4
    r = api_db.client.get(f"{V1}/runs/{run_id}/log?offset=70000&length=100000", headers=h)
    assert r.content == data[70000:170000]


def test_a_run_with_no_output_has_no_log(api_db: Api, remote: Worker) -> None:
    jc = api_db.jc
    jc.create(task("quiet", "true"))
    mark = jc.rec.mark()
    run_id = jc.run_now("quiet")
    assert jc.rec.run_finished("quiet", since=mark)["state"] == "succeeded"
    assert jc.run(run_id).log_path is None
    assert _chunks(api_db, run_id) == 0
    r = api_db.client.get(f"{V1}/runs/{run_id}/log", headers=api_db.headers("viewer"))
    assert r.status_code == 404
    assert "output was empty" in r.json()["detail"]


def test_pruning_deletes_the_chunks_of_pruned_runs(api_db: Api, remote: Worker) -> None:
    jc = api_db.jc
    jc.create(task("chatty", "echo run $JOBCONTROL_RUN_ID", max_log_files=2))
    run_ids = []
    for _ in range(4):
        mark = jc.rec.mark()
        run_ids.append(jc.run_now("chatty"))
        assert jc.rec.run_finished("chatty", since=mark)["state"] == "succeeded"
    assert [jc.run(r).log_path for r in run_ids] == [None, None, DB_LOG, DB_LOG]
    assert [_chunks(api_db, r) for r in run_ids] == [0, 0, 1, 1]
    h = api_db.headers("viewer")
    r = api_db.client.get(f"{V1}/runs/{run_ids[0]}/log", headers=h)
    assert r.status_code == 404
    assert "pruned" in r.json()["detail"]
    r = api_db.client.get(f"{V1}/runs/{run_ids[3]}/log", headers=h)
    assert r.content == f"run {run_ids[3]}\n".encode()


@SQLITE_ONLY
def test_a_sqlite_outage_mid_task_loses_no_output(api_db: Api, remote: Worker) -> None:
    jc = api_db.jc
    gate = jc.gate()
    # Output before, during and after the outage: the middle part while SQLite is
    # locked, far more than one chunk and more than a pipe holds.
    lines = 'for i in $(seq 1 20000); do echo "line $i of the outage"; done'
    jc.create(task("through", f"echo before; {gate.command}; {lines}; echo after"))
    mark = jc.rec.mark()
    run_id = jc.run_now("through")
    poll_until("the first line stored", lambda: _chunks(api_db, run_id) >= 1)
    path = jc.store.sqlite_file or ""
    blocker = sqlite3.connect(path, timeout=LOCK_WAIT)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock, held past the busy timeout
    try:
        gate.open()
        poll_until("the worker to meet the locked database", lambda: remote.outage.down)
        spool = remote.spool_dir / f"run{run_id}.out"
        # The task is not held up: it ends while the database is away, its output spooled.
        poll_until(
            "the whole output in the spool",
            lambda: spool.stat().st_size > 20000 * 20 and spool.read_bytes().endswith(b"after\n"),
        )
        assert stat.S_IMODE(spool.stat().st_mode) == 0o600
        assert jc.run(run_id).state == RunState.RUNNING  # its end is not recorded yet
    finally:
        blocker.rollback()
        blocker.close()
    assert jc.rec.run_finished("through", since=mark, timeout=60)["state"] == "succeeded"
    expected = (
        b"before\n"
        + "".join(f"line {i} of the outage\n" for i in range(1, 20001)).encode()
        + b"after\n"
    )
    r = api_db.client.get(
        f"{V1}/runs/{run_id}/log?length=4194304", headers=api_db.headers("viewer")
    )
    assert r.content == expected
    assert jc.run(run_id).reason is None
    assert not spool.exists()
    poll_until("the worker to see the database again", lambda: not remote.outage.down)


@SQLITE_ONLY
def test_a_task_that_ends_in_an_outage_is_recorded_with_its_own_end(
    api_db: Api, remote: Worker
) -> None:
    """Its output waits for the database, and its end is recorded only after that; the
    end and the duration recorded are still when the task ended, not when the database
    came back."""
    jc = api_db.jc
    gate = jc.gate()
    jc.create(task("ends-away", f"echo before; {gate.command}; echo after"))
    mark = jc.rec.mark()
    run_id = jc.run_now("ends-away")
    poll_until("the first line stored", lambda: _chunks(api_db, run_id) >= 1)
    ended_at = jc.clock.now()
    blocker = sqlite3.connect(jc.store.sqlite_file or "", timeout=LOCK_WAIT)
    blocker.execute("BEGIN IMMEDIATE")  # the write lock, held past the busy timeout
    try:
        gate.open()
        poll_until("the worker to meet the locked database", lambda: remote.outage.down)
        # The worker has seen the process end; its output and its end wait for the
        # database, and the outage goes on (within the run's lease).
        poll_until("the task's end seen by its worker", lambda: _end_seen(remote, run_id))
        jc.clock.set(ended_at + timedelta(seconds=1.5))
        assert jc.run(run_id).state == RunState.RUNNING
    finally:
        blocker.rollback()
        blocker.close()
    assert jc.rec.run_finished("ends-away", since=mark, timeout=60)["state"] == "succeeded"
    run = jc.run(run_id)
    assert run.ended == ended_at
    assert run.duration_ms == 0
    r = api_db.client.get(f"{V1}/runs/{run_id}/log", headers=api_db.headers("viewer"))
    assert r.content == b"before\nafter\n"


def _end_seen(worker: Worker, run_id: int) -> bool:
    """The worker has stamped the run's end (its process is gone), not yet recorded it."""
    active = worker._active.get(run_id)
    return active is not None and active.ended is not None


@SQLITE_ONLY
def test_a_spool_that_cannot_be_written_is_reported_not_swallowed(
    api_db: Api, remote: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    jc = api_db.jc

    def full(fd: int, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dblog, "_write_all", full)
    jc.create(task("full", "echo still here; echo and here"))
    mark = jc.rec.mark()
    run_id = jc.run_now("full")
    finished = jc.rec.run_finished("full", since=mark)
    assert finished["state"] == "succeeded"  # the task itself was not harmed
    done = jc.run(run_id)
    assert done.reason is not None
    assert "No space left on device" in done.reason
    assert remote.log_problems == 1
    assert "No space left" in (remote.log_problem or "")
    # The database was there: what the spool could not take went by memory, whole.
    r = api_db.client.get(f"{V1}/runs/{run_id}/log", headers=api_db.headers("viewer"))
    assert r.content == b"still here\nand here\n"
    # The worker's health says so too, wherever it runs: its row, by its heartbeat.

    def reported() -> dict[str, Any] | None:
        workers = api_db.client.get(f"{V1}/workers", headers=api_db.headers("viewer"))
        row = next(w for w in workers.json()["workers"] if w["name"] == "remote-1")
        return row if row["log_problems"] == 1 else None

    row = poll_until("the worker to report the spool's problem", reported)
    assert "No space left on device" in row["log_problem"]
    # ... and the daemon's health and metrics, which a monitor watches (still 200: it runs).
    health = api_db.client.get("/healthz")
    assert health.status_code == 200, health.text
    assert health.json()["status"] == "worker log problems"
    assert "worker remote-1: 1 task runs' output met a problem" in health.json()["reason"]
    assert "No space left on device" in health.json()["reason"]
    gauges = parse_metrics(api_db.client.get("/metrics", headers=api_db.headers("viewer")).text)
    assert gauges["jobcontrol_worker_log_problems"] == 1
    assert gauges["jobcontrol_workers"] == 1
    jc.errors.records.clear()  # the spool's failure is logged as an error, as it should be


@SQLITE_ONLY
def test_memory_is_bounded_when_neither_spool_nor_database_takes_output(
    api_db: Api, remote: Worker, monkeypatch: pytest.MonkeyPatch
) -> None:
    jc = api_db.jc

    def full(fd: int, data: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(dblog, "_write_all", full)
    monkeypatch.setattr(dblog, "MEMORY_LIMIT", 8192)
    gate = jc.gate()
    jc.create(task("flood", f"{gate.command}; head -c 100000 /dev/zero | tr '\\0' a; echo end"))
    mark = jc.rec.mark()
    run_id = jc.run_now("flood")
    jc.wait_task_process(run_id)
    blocker = sqlite3.connect(jc.store.sqlite_file or "", timeout=LOCK_WAIT)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        gate.open()
        # The task is never blocked: it ends while neither the spool nor the database
        # takes its output.
        poll_until("the task to end", lambda: not jc.task_pids(run_id))
        poll_until("the worker to meet the locked database", lambda: remote.outage.down)
        assert jc.run(run_id).state == RunState.RUNNING  # its end waits for its output
    finally:
        blocker.rollback()
        blocker.close()
    assert jc.rec.run_finished("flood", since=mark, timeout=60)["state"] == "succeeded"
    r = api_db.client.get(f"{V1}/runs/{run_id}/log", headers=api_db.headers("viewer"))
    # Each place where bytes were dropped says how many, and the rest is whole.
    marker = re.compile(
        rb"\n\[jobcontrol: (\d+) bytes of output lost here: the spool could not be written "
        rb"\(spool [^)]*: No space left on device\) and the database did not take them in "
        rb"time\]\n"
    )
    lost = sum(int(n) for n in marker.findall(r.content))
    rest = marker.sub(b"", r.content)
    assert re.fullmatch(rb"a*(end\n)?", rest), rest[-100:]
    assert lost > 0
    assert len(rest) + lost == 100000 + len(b"end\n")
    reason = jc.run(run_id).reason or ""
    assert f"{lost} bytes of output lost" in reason
    jc.errors.records.clear()  # the spool's failure is logged as an error, as it should be


@SQLITE_ONLY
def test_a_killed_task_keeps_its_output_and_leftovers_do_not_hold_its_end(
    api_db: Api, remote: Worker
) -> None:
    jc = api_db.jc
    jc.create(task("killed", "echo started; sleep 1000"))
    mark = jc.rec.mark()
    run_id = jc.run_now("killed")
    poll_until("its first line stored", lambda: _chunks(api_db, run_id) >= 1)
    jc.engine.kill("killed", user="tester")
    finished = jc.rec.run_finished("killed", since=mark)
    assert (finished["state"], finished["exit_status"]) == ("killed", 255)
    h = api_db.headers("viewer")
    assert api_db.client.get(f"{V1}/runs/{run_id}/log", headers=h).content == b"started\n"

    # A process the task left behind holds the pipe: the run ends anyway (within
    # dblog.LEFTOVER_GRACE), with what was written before.
    gate = jc.gate()
    jc.create(task("parent", f"({gate.command}; echo late) & echo done"))
    mark = jc.rec.mark()
    run_id = jc.run_now("parent")
    assert jc.rec.run_finished("parent", since=mark)["state"] == "succeeded"
    assert jc.task_pids(run_id)  # the leftover still waits on its gate
    gate.open()
    poll_until("the leftover to end", lambda: not jc.task_pids(run_id))
    assert api_db.client.get(f"{V1}/runs/{run_id}/log", headers=h).content == b"done\n"


def _worker(api_db: Api, tmp_path: Path, name: str) -> Worker:
    jc = api_db.jc
    return Worker(
        RunQueue(jc.store),
        clock=jc.clock,
        log_root=tmp_path / "remote-logs",
        instance_id=jc.instance_id,
        name=name,
        slots=1,
        poll_interval=0.2,
        heartbeat_interval=0.2,
        log_store="database",
        spool_dir=tmp_path / "kept-spool",
    )


@SQLITE_ONLY
def test_output_kept_by_a_worker_stopped_in_an_outage_is_stored_by_its_next_start(
    api_db: Api, tmp_path: Path
) -> None:
    jc = api_db.jc
    first = _worker(api_db, tmp_path, "remote-first")
    first.start()
    gate = jc.gate()
    jc.create(task("late", f"echo before; {gate.command}; echo during the outage"))
    run_id = jc.run_now("late")
    poll_until("the first line stored", lambda: _count(jc.store, run_id) >= 1)
    spool = first.spool_dir / f"run{run_id}.out"
    blocker = sqlite3.connect(jc.store.sqlite_file or "", timeout=LOCK_WAIT)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        gate.open()
        poll_until("the rest in the spool", lambda: spool.read_bytes().endswith(b"outage\n"))
        first.stop(timeout=0.5)  # gives up on storing the output and the end: both wait
        poll_until(
            "the worker to say it gave up",
            lambda: any("stopped before it could" in m for m in jc.errors.messages()),
        )
        # Said before it is kept: the end is written to disk just after.
        kept = first.spool_dir / "ends.jsonl"
        poll_until("the end kept on disk", lambda: kept.exists() and b"\n" in kept.read_bytes())
    finally:
        blocker.rollback()
        blocker.close()
    assert spool.exists()
    assert jc.run(run_id).state == RunState.RUNNING  # its end is kept on disk too
    assert (first.spool_dir / "ends.jsonl").exists()
    jc.errors.records.clear()  # that error is the point here

    mark = jc.rec.mark()
    second = _worker(api_db, tmp_path, "remote-second")
    second.start()  # records the kept end and stores the kept output before new work
    try:
        assert not spool.exists()
        r = api_db.client.get(f"{V1}/runs/{run_id}/log", headers=api_db.headers("viewer"))
        assert r.content == b"before\nduring the outage\n"
        # The run keeps its real outcome, not lost by its lease, and its log.
        finished = jc.rec.run_finished("late", since=mark)
        assert (finished["state"], finished["exit_status"]) == ("succeeded", 0)
        assert (jc.run(run_id).worker, jc.run(run_id).log_path) == ("remote-first", DB_LOG)
        # Its reason no longer sends anyone to the spool file, which is gone.
        reason = jc.run(run_id).reason or ""
        assert "not yet stored" not in reason, reason
        assert f"the output kept in {spool} was stored at " in reason, reason
    finally:
        second.stop(30)


@SQLITE_ONLY
def test_unknown_log_store_is_refused(api_db: Api, tmp_path: Path) -> None:
    jc = api_db.jc
    with pytest.raises(ValueError, match="log_store 'nfs': not one of file, database"):
        Worker(
            RunQueue(jc.store),
            clock=jc.clock,
            log_root=tmp_path / "x",
            instance_id=jc.instance_id,
            log_store="nfs",
        )
    assert not (tmp_path / "x").exists()


@pytest.mark.postgres
def test_a_postgresql_outage_mid_task_loses_no_output(
    own_server: PostgresServer, make_jc: MakeJC, tmp_path: Path
) -> None:
    own_server.create_database("db_logs_outage")
    url = own_server.url("db_logs_outage")
    with contextlib.contextmanager(_api)(url, lambda u, **kw: make_jc(u, slots=0, **kw)) as api:
        jc = api.jc
        worker = Worker(
            RunQueue(jc.store),
            clock=jc.clock,
            log_root=tmp_path / "remote-logs",
            instance_id=jc.instance_id,
            name="remote-pg",
            slots=1,
            poll_interval=0.2,
            log_store="database",
            spool_dir=tmp_path / "remote-spool",
        )
        worker.start()
        try:
            gate, again = jc.gate(), jc.gate("again")
            lines = 'for i in $(seq 1 20000); do echo "line $i of the outage"; done'
            jc.create(task("through", f"echo before; {gate.command}; {lines}; {again.command}"))
            mark = jc.rec.mark()
            run_id = jc.run_now("through")
            poll_until("the first line stored", lambda: _count(jc.store, run_id) >= 1)
            own_server.halt()
            try:
                gate.open()
                spool = worker.spool_dir / f"run{run_id}.out"
                poll_until(
                    "the output of the outage in the spool",
                    lambda: spool.stat().st_size
                    >= 7 + sum(len(f"line {i} of the outage\n") for i in range(1, 20001)),
                )
                poll_until("the worker to meet the stopped server", lambda: worker.outage.down)
            finally:
                own_server.resume()
            again.open()  # the task ends once the server is back; its output is all stored
            finished = jc.rec.run_finished("through", since=mark, timeout=60)
            assert finished["state"] == "succeeded"
            expected = (
                b"before\n" + "".join(f"line {i} of the outage\n" for i in range(1, 20001)).encode()
            )
            r = api.client.get(
                f"{V1}/runs/{run_id}/log?length=4194304", headers=api.headers("viewer")
            )
            assert r.content == expected
            assert not spool.exists()
        finally:
            worker.kill_all("test over")
            worker.stop(30)


def _count(store: Store, run_id: int) -> int:
    with store.read() as conn:
        stmt = select(func.count()).select_from(run_log).where(run_log.c.run_id == run_id)
        return int(conn.execute(stmt).scalar_one())


def test_output_a_background_process_holds_does_not_lengthen_the_run(
    api_db: Api, tmp_path: Path
) -> None:
    """The worker waits ``LEFTOVER_GRACE`` (1 s) for output a process the task left in the
    background still holds; that wait was counted in the run's duration: a task whose
    shell ended at once was recorded as having run a second."""
    jc = api_db.jc
    jc.create(task("leaves", "echo main; (sleep 30; echo late) & echo after"))
    mark = jc.rec.mark()
    # A run's start and end both stamped by the worker, on the real clock.
    with _db_log_worker(jc, tmp_path, "remote-2", slots=1, clock=SystemClock()):
        run_id = jc.run_now("leaves")
        try:
            assert jc.rec.run_finished("leaves", since=mark)["state"] == "succeeded"
            ran = jc.run(run_id)
            assert ran.duration_ms is not None
            assert ran.duration_ms < LEFTOVER_GRACE * 1000  # its shell's time, not the grace
            log = api_db.client.get(f"{V1}/runs/{run_id}/log", headers=api_db.headers("viewer"))
            assert log.content == b"main\nafter\n"
        finally:
            for pid in jc.task_pids(run_id):  # the background sleep: left, as tasks may
                os.kill(pid, signal.SIGKILL)
