"""Crash recovery: a daemon killed with SIGKILL mid-run leaves nothing behind once restarted.

The crashed daemon is real: a separate Python process runs a dispatcher on the
test's database, starts a long task (with a grandchild that left the task's
session) and is then killed with SIGKILL, so nothing of it gets to clean up.
A new dispatcher on the same database must find the runs it left active, mark
them lost (255), kill their processes, and carry on with every job intact.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from jobcontrol import JobState, RunState
from jobcontrol.procs import find_marked, pid_alive
from tests.integration.conftest import MakeJC
from tests.integration.helpers import JC, T0, WAIT, box, poll_until, task

pytestmark = pytest.mark.timeout(90)

# The daemon to crash: start a dispatcher, run the job now, say the run id, block.
CRASHING_DAEMON = """\
import sys, threading
from datetime import UTC
from pathlib import Path
from jobcontrol import DispatcherConfig, Engine, Store
from jobcontrol.runtime import Runtime
from jobcontrol.clock import ManualClock, ManualTimers
from tests.integration.conftest import MakeJC
from tests.integration.helpers import T0

url, log_root, job = sys.argv[1:4]
store = Store(url)
clock = ManualClock(T0)
config = DispatcherConfig(log_root=Path(log_root), default_tz=UTC)
dispatcher = Runtime(store, config, clock=clock, timers=ManualTimers(clock)).start()
print(Engine(store, dispatcher).run_now(job, user="doomed"), flush=True)
threading.Event().wait()
"""

# The same, running several jobs: one run id a line.
CRASHING_DAEMON_MANY = CRASHING_DAEMON.replace(
    "url, log_root, job = sys.argv[1:4]", "url, log_root, *jobs = sys.argv[1:]"
).replace(
    'print(Engine(store, dispatcher).run_now(job, user="doomed"), flush=True)',
    'for job in jobs:\n    print(Engine(store, dispatcher).run_now(job, user="doomed"), flush=True)',
)

# The daemon to crash while a TIMED box waits: its timers moved on, so the tree's timer
# fires; says "waiting" once the box waits for a later child, then blocks.
CRASHING_TIMER_DAEMON = """\
import sys, threading
from datetime import UTC, timedelta
from pathlib import Path
from jobcontrol import DispatcherConfig, JobState, Store, events
from jobcontrol.runtime import Runtime
from jobcontrol.clock import ManualClock, ManualTimers
from tests.integration.helpers import T0

url, log_root, box, seconds = sys.argv[1:5]
store = Store(url)
clock = ManualClock(T0)
timers = ManualTimers(clock)
config = DispatcherConfig(log_root=Path(log_root), default_tz=UTC)
dispatcher = Runtime(store, config, clock=clock, timers=timers).start()
waits = threading.Event()


def on_state(sender, name, state, **_):
    if name == box and state is JobState.WAITING:
        waits.set()


events.state_changed.connect(on_state, weak=False)
timers.advance(timedelta(seconds=float(seconds)))
print("waiting" if waits.wait(30) else "not waiting", flush=True)
threading.Event().wait()
"""

ESCAPE = "setsid sh -c 'echo $$ > \"$PIDFILE\"; exec sleep 1000' & sleep 1000"

DEFINITION_COLUMNS = (
    "id",
    "name",
    "description",
    "parent_id",
    "kind",
    "job_order",
    "command",
    "timer",
    "active",
    "on_error",
    "box_type",
    "version",
    "queue",
    "priority",
    "timeout_s",
    "max_log_files",
    "misfire",
    "cwd",
    "env",
)


def definitions(jc: JC, *, order: bool = True) -> list[dict[str, Any]]:
    """Every job's definition; ``order=False`` leaves out the job order, which a
    starting dispatcher renumbers when it sorts the top level (spec 4.2, 4.5)."""
    columns = [c for c in DEFINITION_COLUMNS if order or c != "job_order"]
    return [{k: row[k] for k in columns} for row in jc.dump()["job"]]


def read_line(proc: subprocess.Popen[str], timeout: float) -> str:
    assert proc.stdout is not None
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError(f"the daemon said nothing within {timeout:g}s")
    return proc.stdout.readline()


def crashing_daemon(
    jc: JC, tmp_path: Path, logs: Path, tree: str
) -> tuple[subprocess.Popen[str], int]:
    """A daemon process on ``jc``'s database that runs ``tree`` and waits to be killed
    (``crash``), and the tree's root run, once it says it started."""
    daemon = subprocess.Popen(
        [sys.executable, "-c", CRASHING_DAEMON, jc.url, str(logs), tree],
        cwd=Path(__file__).resolve().parents[2],
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "daemon.err").open("w"),
        text=True,
    )
    try:
        line = read_line(daemon, 30)
        assert line.strip().isdigit(), (line, (tmp_path / "daemon.err").read_text())
    except BaseException:
        crash(daemon)
        raise
    return daemon, int(line)


def test_runs_of_a_crashed_daemon_are_lost_and_their_processes_killed(
    db_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    jc = make_jc(db_url, start=False)  # the crashing daemon owns the store first
    pidfile = tmp_path / "escaped.pid"
    jc.create(  # offline edits: no dispatcher runs yet
        box("Crashy", timer="every 1h", active=True),
        task("long", ESCAPE, "Crashy", active=True, env={"PIDFILE": str(pidfile)}),
        task("never", "true", "Crashy", active=True),
        box("Ticker", timer="every 10s", active=True),
        task("tick", "true", "Ticker", active=True),
        box("Dormant", timer="every 10s", active=False),
    )
    created = definitions(jc, order=False)

    daemon, root_run = crashing_daemon(jc, tmp_path, tmp_path / "crash-logs", "Crashy")
    try:
        run_marker = {"JOBCONTROL_INSTANCE": jc.instance_id}

        def escaped_sleep() -> int | None:
            try:
                text = pidfile.read_text()
                pid = int(text) if text.endswith("\n") else 0
                comm = Path(f"/proc/{pid}/comm").read_text().strip() if pid else ""
            except (OSError, ValueError):
                return None
            return pid if comm == "sleep" else None

        escaped: int = poll_until("the task's setsid grandchild", escaped_sleep, timeout=WAIT)
        task_pids = poll_until(
            "the task's processes",
            lambda: len(find_marked(run_marker)) >= 3 and find_marked(run_marker),
        )
        assert escaped in task_pids
    finally:
        daemon.send_signal(signal.SIGKILL)  # the crash: no stop, no finally, nothing
        daemon.wait(WAIT)
        if daemon.stdout is not None:
            daemon.stdout.close()
    assert daemon.returncode == -signal.SIGKILL

    # The crash left the task running, orphaned, and its runs active in the store.
    assert set(find_marked(run_marker)) >= {escaped}
    left = jc.tree_run(root_run)
    assert {n: r.state for n, r in left.items()} == {"Crashy": "running", "long": "running"}
    before = definitions(jc)
    # A task of a `jobcontrol worker` process on this host, of the same database: not
    # the daemon's to kill (that worker's runs are settled by their leases).
    others = {**run_marker, "JOBCONTROL_WORKER": "w-beside", "JOBCONTROL_RUN_ID": "999"}
    beside = subprocess.Popen(["sleep", "1000"], env={**os.environ, **others})

    try:
        jc.start()  # the new daemon on the same database
        poll_until("the lost run's escapee to be gone", lambda: not pid_alive(escaped))
        assert beside.poll() is None, "the daemon's recovery killed another worker's task"
        assert find_marked(others) == [beside.pid]
        embedded = {**run_marker, "JOBCONTROL_WORKER": None}
        poll_until("every process of the lost run to be gone", lambda: not find_marked(embedded))
    finally:
        beside.kill()
        beside.wait(WAIT)

    runs = jc.tree_run(root_run)
    assert set(runs) == {"Crashy", "long"}
    for name, run in runs.items():
        assert run.state is RunState.LOST, name
        assert run.exit_status == 255, name
        assert run.ended is not None, name
        assert "lost" in (run.reason or ""), name
        assert jc.job(name).exit_status == 255, name

    assert definitions(jc) == before  # every job definition intact
    assert definitions(jc, order=False) == created
    assert jc.view("Crashy")["state"] == "idle"
    assert jc.armed_at("Ticker") == T0 + timedelta(seconds=10)
    assert jc.armed_at("Crashy") == T0 + timedelta(hours=1)
    assert jc.armed_at("Dormant") is None
    assert jc.job("never").last_ran is None

    # And it goes on working: the next firing runs normally.
    mark = jc.rec.mark()
    jc.advance(10)
    assert jc.rec.run_finished("Ticker", since=mark)["exit_status"] == 0
    assert os.path.exists(jc.log_root)


RETRIED_ONCE = 'if [ -e "$DONE" ]; then echo retried; else : > "$DONE"; exec sleep 1000; fi'


def test_a_crash_lost_run_is_retried_and_a_kill_asked_before_it_is_recorded_killed(
    db_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    """README "Retries": a lost run is retried, ``kill -9`` of the daemon included; it was
    retried only when a lease ran out. A run whose kill was asked when the daemon died
    is recorded killed (its processes are killed at the start), not lost."""
    jc = make_jc(db_url, start=False)
    done = tmp_path / "first-attempt"
    jc.create(
        box("Crashy", timer="every 1h", active=True),
        task("long", RETRIED_ONCE, "Crashy", active=True, retries=1, env={"DONE": str(done)}),
        task("after", "true", "Crashy", active=True),
        task("Alone", RETRIED_ONCE, active=True, retries=2, env={"DONE": str(done) + "-alone"}),
        box("Doomed", active=True),
        task("held", "exec sleep 1000", "Doomed", active=True, retries=3),
    )
    root_dir = Path(__file__).resolve().parents[2]
    jobs = ("Crashy", "Alone", "Doomed")
    daemon = subprocess.Popen(
        [sys.executable, "-c", CRASHING_DAEMON_MANY, jc.url, str(tmp_path / "logs"), *jobs],
        cwd=root_dir,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "daemon.err").open("w"),
        text=True,
    )
    roots: dict[str, int] = {}
    try:
        for job in jobs:
            line = read_line(daemon, 30)
            assert line.strip().isdigit(), (line, (tmp_path / "daemon.err").read_text())
            roots[job] = int(line)
        # Each first attempt has made its mark (not only been claimed) when the daemon dies.
        for mark in (done, Path(f"{done}-alone")):
            poll_until(f"{mark.name} to be made", mark.exists)
        poll_until(
            "held to run",
            lambda: jc.runs("held") and jc.runs("held")[0].state is RunState.RUNNING,
        )
    finally:
        daemon.send_signal(signal.SIGKILL)
        daemon.wait(WAIT)
        if daemon.stdout is not None:
            daemon.stdout.close()
    # The kill of `held` was asked, then the daemon died before its worker did it.
    with jc.store.write() as conn:
        from sqlalchemy import update

        from jobcontrol.store.schema import run

        held = jc.runs("held")[0].id
        conn.execute(update(run).where(run.c.id == held).values(kill_requested=True))

    jc.start()
    crashy = jc.rec.run_finished("Crashy", since=0, timeout=30)
    assert crashy["exit_status"] == 0, jc.runs("long")
    attempts = sorted(jc.runs("long"), key=lambda r: r.id)
    assert [(r.attempt, r.state, r.exit_status) for r in attempts] == [
        (1, RunState.LOST, 255),
        (2, RunState.SUCCEEDED, 0),
    ]
    assert jc.runs("after")[0].state is RunState.SUCCEEDED
    alone = poll_until(
        "the lone task's retry",
        lambda: [r for r in jc.runs("Alone") if r.state is RunState.SUCCEEDED],
    )
    assert alone[0].attempt == 2
    (held_run,) = jc.runs("held")
    assert (held_run.state, held_run.exit_status) == (RunState.KILLED, 255)
    assert "kill" in (held_run.reason or "")
    assert jc.run(roots["Doomed"]).exit_status == 255
    poll_until(
        "no process of the lost runs",
        lambda: not find_marked({"JOBCONTROL_INSTANCE": jc.instance_id, "JOBCONTROL_WORKER": None}),
    )


def test_a_worker_killed_but_not_yet_reaped_cannot_vouch_for_its_runs() -> None:
    """A zombie keeps its /proc entry and start time: recovery must still count it dead."""
    import socket

    from jobcontrol.dispatch.recovery import worker_alive
    from jobcontrol.procs import start_time

    host = socket.gethostname()
    child = subprocess.Popen(["sleep", "100"])
    try:
        row = {"host": host, "pid": child.pid, "proc_start": start_time(child.pid), "stopped": None}
        assert worker_alive(row, host)
        child.kill()
        poll_until("the worker to be a zombie", lambda: not pid_alive(child.pid))
        assert start_time(child.pid) is not None  # still in /proc, unreaped
        assert not worker_alive(row, host)
    finally:
        child.kill()
        child.wait(WAIT)


def test_a_start_marks_this_hosts_workers_whose_process_is_gone_as_stopped(
    sqlite_url: str,
) -> None:
    """A worker killed with -9, or stopped while the database did not answer, never said
    it stopped: the next daemon's start marks it (as of its last heartbeat), so that
    ``workers`` and health stop counting it. A live one, and another host's, stay."""
    import socket

    from jobcontrol.clock import ManualClock
    from jobcontrol.dispatch.recovery import recover_lost_runs
    from jobcontrol.procs import start_time
    from jobcontrol.store import Store
    from jobcontrol.store.runqueue import RunQueue, WorkerInfo, list_workers

    host = socket.gethostname()
    store = Store(sqlite_url)
    store.upgrade()
    rq = RunQueue(store)
    dead = subprocess.Popen(["true"])
    dead.wait(WAIT)
    beat = T0 - timedelta(minutes=3)
    live = os.getpid()
    for name, on, pid in (("gone", host, dead.pid), ("live", host, live), ("far", "b", 7)):
        rq.register(WorkerInfo(name, on, pid, 1, "test", beat, proc_start=start_time(pid)), beat)
    recover_lost_runs(store, ManualClock(T0), host)
    with store.read() as conn:
        stopped = {w["name"]: w["stopped"] for w in list_workers(conn, T0)}
    assert stopped == {"gone": beat, "live": None, "far": None}
    store.engine.dispose()


def test_a_run_started_by_a_clock_ahead_of_the_daemons_is_lost_with_no_negative_duration(
    db_url: str,
) -> None:
    """A worker on a host whose clock runs ahead stamps a start later than the recovering
    daemon's now: the run is still lost, with a duration of 0, never below it (as a lease
    that runs out or a worker's own restart records it)."""
    from jobcontrol.clock import ManualClock
    from jobcontrol.dispatch.recovery import recover_lost_runs
    from jobcontrol.model import Kind, Trigger
    from jobcontrol.store import Store, queries

    store = Store(db_url)
    store.upgrade()
    try:
        with store.write() as conn:
            run_id = queries.insert_run(
                conn,
                {
                    "job_name": "skewed",
                    "kind": Kind.TASK,
                    "trigger": Trigger.MANUAL,
                    "state": RunState.RUNNING,
                    "created": T0,
                    "started": T0 + timedelta(minutes=5),
                    "worker": "gone-worker",
                    "host": "elsewhere",
                    "command": "true",
                },
            )
        recovery = recover_lost_runs(store, ManualClock(T0), "here")
        assert [r.id for r in recovery.lost] == [run_id]
        with store.read() as conn:
            row = queries.get_run(conn, run_id)
        assert row is not None
        assert (row.state, row.exit_status, row.duration_ms) == (RunState.LOST, 255, 0)
        assert row.reason == "lost: its worker gone-worker is gone"
    finally:
        store.dispose()


def crash(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)  # no stop, no finally, nothing
    proc.wait(WAIT)
    if proc.stdout is not None:
        proc.stdout.close()


def test_a_timed_box_waiting_when_the_daemon_died_is_armed_from_its_lost_runs_end(
    db_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    """``kill -9`` while a TIMED box waits for bar, and a start a minute later: foo, which
    ran in the lost run, counted its ``every 3s`` from its own end, and showed (and fired
    at) a time a minute past, before its last run; the tree ran again at once as if it
    had missed it. The lost run's end counts as any end: foo 3 s after it, and bar keeps
    the time it was armed for, not reached."""
    jc = make_jc(db_url, start=False)
    jc.create(
        box("TW", box_type="timed", active=True),
        task("foo", "true", "TW", timer="every 3s", active=True),
        task("bar", "true", "TW", timer="every 2m", active=True),
    )
    root_dir = Path(__file__).resolve().parents[2]
    daemon = subprocess.Popen(
        [sys.executable, "-c", CRASHING_TIMER_DAEMON, jc.url, str(tmp_path / "logs"), "TW", "3"],
        cwd=root_dir,
        stdout=subprocess.PIPE,
        stderr=(tmp_path / "daemon.err").open("w"),
        text=True,
    )
    try:
        line = read_line(daemon, 30)
        assert line.strip() == "waiting", (line, (tmp_path / "daemon.err").read_text())
    finally:
        crash(daemon)
    assert [r.state for r in jc.runs("foo")] == [RunState.SUCCEEDED]
    bar_at = T0 + timedelta(minutes=2)
    assert jc.job("bar").next_runs == bar_at

    restart = T0 + timedelta(minutes=1)
    jc.clock.set(restart)
    jc.start()
    (lost,) = jc.runs("TW")
    assert lost.state is RunState.LOST
    foo_at = restart + timedelta(seconds=3)
    shown = {n: jc.job(n).next_runs for n in ("TW", "foo", "bar")}
    assert shown == {"TW": foo_at, "foo": foo_at, "bar": bar_at}
    assert all(when is not None and when > restart for when in shown.values())
    assert jc.armed_at("TW") == foo_at
    assert jc.advance(0) == 0, "nothing was missed: the tree does not run at once"

    mark = jc.rec.mark()
    jc.advance(3)
    jc.rec.run_finished("foo", since=mark)
    jc.rec.wait_for(
        lambda s: s.name == "state_changed"
        and s.data["name"] == "TW"
        and s.data["state"] is JobState.WAITING,
        since=mark,
    )
    assert jc.job("foo").last_ran == foo_at
    jc.advance(to=bar_at)
    assert jc.rec.run_finished("TW", since=mark)["exit_status"] == 0
    assert [r.started for r in jc.runs("bar")] == [bar_at]


def test_a_manual_run_lost_to_a_crash_arms_its_every_from_the_lost_end(
    db_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    """README: ``every`` is at least its interval after the tree's run completed, after a
    manual run too. A manual run that start-up recovery ended lost left the time the
    tree was armed for before it (at the load), as if it had not run."""
    jc = make_jc(db_url)
    jc.create(
        box("Crashy", timer="every 10m", on_error="continue", active=True),
        task("long", "exec sleep 1000", "Crashy", active=True),
    )
    assert jc.armed_at("Crashy") == T0 + timedelta(minutes=10)
    jc.close()

    daemon, root_run = crashing_daemon(jc, tmp_path, tmp_path / "logs", "Crashy")
    try:
        poll_until("long to run", lambda: jc.runs("long") and jc.runs("long")[0].pid)
    finally:
        crash(daemon)

    again = make_jc(db_url, start=False)
    restart = T0 + timedelta(minutes=1)
    again.clock.set(restart)
    again.start()
    assert again.run(root_run).state is RunState.LOST
    assert again.armed_at("Crashy") == restart + timedelta(minutes=10)
    assert again.job("Crashy").next_runs == restart + timedelta(minutes=10)
    assert again.advance(0) == 0
