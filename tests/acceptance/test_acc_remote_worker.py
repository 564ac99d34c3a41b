"""Remote workers: ``jobcontrol worker`` processes beside a daemon that runs no tasks.

Real PostgreSQL, the real daemon and real worker processes started by the CLI.
The dispatcher and the workers meet only in the database (the run queue), with
LISTEN/NOTIFY for the wake-ups: a task's end reaches its tree at once, not at the
dispatcher's back-up poll.
"""

from __future__ import annotations

import os
import re
import signal
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy import select
from sqlalchemy.engine import make_url

from jobcontrol import procs
from jobcontrol.places import live_pid
from jobcontrol.store import Store
from jobcontrol.store.runqueue import RunQueue, WorkerInfo
from jobcontrol.store.schema import run
from tests.acceptance.harness import JobControl, _cgroups_named, describe, wait_until, write
from tests.acceptance.hosts import TcpRelay
from tests.acceptance.test_acc_full_disk import health, metrics
from tests.pgserver import PostgresServer

pytestmark = [pytest.mark.timeout(240), pytest.mark.postgres]

WAIT = 30.0


def runs_of(jc: JobControl, job: str) -> list[dict[str, Any]]:
    return jc.history(job)


def last_run(jc: JobControl, job: str) -> dict[str, Any] | None:
    runs = runs_of(jc, job)
    return runs[0] if runs else None


def ended(jc: JobControl, job: str) -> dict[str, Any] | None:
    run = last_run(jc, job)
    return run if run is not None and run["ended"] else None


def task_workers(jc: JobControl, names: tuple[str, ...]) -> set[str | None]:
    """Which workers ran these jobs' task runs (from the run rows)."""
    store = Store(jc.url)
    try:
        with store.read() as conn:
            rows = conn.execute(select(run.c.worker).where(run.c.job_name.in_(names)))
            return {r.worker for r in rows}
    finally:
        store.dispose()


def sleeper_on(jc: JobControl, name: str) -> int:
    """Worker ``name`` started with one slot and the job ``sleeper`` running on it: the
    worker's pid."""
    jc.ok("worker", "start", "--name", name, "--slots", "1")
    jc.ok("run", "sleeper")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT), "sleeper never started"
    pid = worker_pid(jc, name)
    assert pid is not None
    return pid


def worker_pid(jc: JobControl, name: str) -> int | None:
    files = list(jc.state_dir.glob(f"worker-{name}-*.pid"))
    return live_pid(files[0]) if files else None


def test_a_remote_worker_runs_the_tasks_of_a_daemon_with_no_slots(jcpg: JobControl) -> None:
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    started = jc.ok(
        "worker", "start", "--name", "build-1", "--slots", "2", "--pass-env", "PATH,JOBCONTROL_DB"
    )
    assert re.search(r"worker build-1 started: pid \d+", started.stdout), describe(started)
    # What its tasks get is in its log, as in the daemon's, and a name never passed is said.
    said = next(jc.state_dir.glob("worker-build-1-*.log")).read_text()
    assert "tasks get these of the worker's variables: PATH,JOBCONTROL_DB" in said, said
    assert "names JOBCONTROL_DB, which is never passed to tasks" in said, said
    workers = {w["name"]: w for w in jc.json("workers")}
    assert (workers["build-1"]["slots"], workers["build-1"]["stopped"]) == (2, None)

    jc.ok("run", "hello")
    assert wait_until(lambda: ended(jc, "hello"), WAIT), "hello never ended"
    run = ended(jc, "hello")
    assert run is not None
    assert (run["state"], run["exit_status"], run["worker"]) == ("failed", 3, "build-1")
    assert "hello from build-1" in jc.ok("logs", "hello").stdout

    # A sequence goes task after task on the worker; its end reaches the tree at once.
    jc.ok("run", "chain")
    assert wait_until(lambda: ended(jc, "chain"), WAIT), "chain never ended"
    box = ended(jc, "chain")
    assert box is not None
    assert box["state"] == "succeeded", box
    took = (
        datetime.fromisoformat(box["ended"]) - datetime.fromisoformat(box["started"])
    ).total_seconds()
    # Three tasks: well under one dispatcher back-up poll (2 s) per task.
    assert took < 2.0, f"a 3-task sequence on a remote worker took {took:.2f}s"
    assert task_workers(jc, ("one", "two", "three")) == {"build-1"}

    status = jc.ok("worker", "status", "--name", "build-1")
    assert re.search(r"worker build-1 running: pid \d+", status.stdout), describe(status)
    # A second start of the same worker is refused here, and writes nothing in its log.
    log_file = next(jc.state_dir.glob("worker-build-1-*.log"))
    logged = log_file.read_bytes()
    again = jc.run("worker", "start", "--name", "build-1", "--slots", "2")
    assert again.returncode == 1, describe(again)
    assert re.fullmatch(
        r"jobcontrol: worker build-1 is running already here \(pid \d+, log .+\)\n", again.stderr
    ), describe(again)
    assert log_file.read_bytes() == logged
    stopped = jc.ok("worker", "stop", "--name", "build-1")
    assert "worker build-1 stopped" in stopped.stdout
    gone = jc.run("worker", "status", "--name", "build-1")
    assert gone.returncode == 3, describe(gone)
    workers = {w["name"]: w for w in jc.json("workers")}
    assert workers["build-1"]["stopped"] is not None


def test_kill_reaches_a_task_on_a_remote_worker(jcpg: JobControl) -> None:
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("worker", "start", "--name", "w1", "--slots", "1")
    jc.ok("run", "sleeper")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT), "sleeper never started"
    pids = jc.marked(JOBCONTROL_JOB="sleeper")
    assert procs.find_marked({"JOBCONTROL_WORKER": "w1", "JOBCONTROL_JOB": "sleeper"}) == pids
    jc.ok("kill", "sleeper")
    assert wait_until(lambda: ended(jc, "sleeper"), WAIT), "the kill never ended the run"
    run = ended(jc, "sleeper")
    assert run is not None
    assert (run["state"], run["exit_status"], run["worker"]) == ("killed", 255, "w1")
    jc.assert_no_task_processes()
    # A dispatcher that only coordinates writes no task log: no log root to call low.
    status, body = health(jc)
    assert (status, body["status"]) == (200, "ok"), body
    assert "log_root" not in body.get("disk", {}), body


def test_kill_says_killed_only_once_the_run_is_and_names_a_worker_that_does_not_hear(
    jcpg: JobControl,
) -> None:
    """`kill` is a request the task's worker carries out: the CLI waits for the run's
    end, and a worker that does not hear (stopped, cut off) is named, with exit 1."""
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    pid = sleeper_on(jc, "deaf")
    os.kill(pid, signal.SIGSTOP)
    try:
        asked = jc.run("kill", "sleeper", "--wait", "1")
        assert asked.returncode == 1, describe(asked)
        assert re.fullmatch(
            r"asked to kill run \d+ of sleeper: not ended after 1 s; its worker deaf kills it "
            r"on hearing the request \(`jobcontrol history sleeper` shows the end\)\n",
            asked.stdout,
        ), describe(asked)
        assert last_run(jc, "sleeper")["state"] == "running"  # type: ignore[index]
        assert jc.marked(JOBCONTROL_JOB="sleeper"), "killed though its worker was stopped"
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_until(lambda: ended(jc, "sleeper"), WAIT), "the worker never carried out the kill"
    assert (ended(jc, "sleeper") or {}).get("state") == "killed"
    jc.assert_no_task_processes()
    # A worker that hears: the CLI returns once the run is recorded killed.
    jc.ok("run", "sleeper")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT), "sleeper never started"
    killed = jc.ok("kill", "sleeper")
    assert re.fullmatch(r"killed run \d+ of sleeper\n", killed.stdout), describe(killed)
    assert (last_run(jc, "sleeper") or {}).get("state") == "killed"  # no wait: it is recorded
    jc.assert_no_task_processes()


def test_a_daemon_stopped_by_sigterm_leaves_a_remote_workers_task_running(
    jcpg: JobControl,
) -> None:
    """A service manager's stop or restart (SIGTERM: an upgrade) stops the dispatcher,
    not the work of the workers of their own: their task goes on, and the next start
    reacts to its end. `daemon stop --kill` kills it, as the operator asked."""
    jc = jcpg
    gate = jc.base / "far.gate"
    jc.load(
        write(
            jc.base / "far.yaml",
            f"""\
jobs:
  - name: far
    command: "while [ ! -f {gate} ]; do sleep 0.05; done; exit 0"
""",
        )
    )
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("worker", "start", "--name", "w6", "--slots", "1")
    jc.ok("run", "far")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="far"), WAIT), "far never started"
    (daemon,) = jc.live_daemons()
    os.kill(daemon, signal.SIGTERM)
    assert wait_until(lambda: not jc.live_daemons(), WAIT), "the daemon did not stop"
    assert jc.marked(JOBCONTROL_JOB="far"), "the remote worker's task was killed by the stop"
    assert (last_run(jc, "far") or {}).get("state") == "running", last_run(jc, "far")
    assert "leaving 1 tree run(s) running on other workers or queued (far)" in jc.daemon_log(200)
    gate.touch()
    assert wait_until(lambda: ended(jc, "far"), WAIT), "its worker never recorded its end"

    jc.ok("daemon", "start", "--slots", "0")
    assert wait_until(
        lambda: {j["name"]: j for j in jc.json("ls")}["far"]["exit_status"] == 0, WAIT
    ), "the next start did not take its end up"
    (run_,) = runs_of(jc, "far")
    assert (run_["state"], run_["exit_status"]) == ("succeeded", 0), run_

    # Asked to kill, the stop kills it wherever it runs, and says why.
    gate.unlink()
    jc.ok("run", "far")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="far"), WAIT), "far never started again"
    jc.ok("daemon", "stop", "--kill")
    assert wait_until(lambda: ended(jc, "far"), WAIT), (runs_of(jc, "far"), jc.daemon_log(40))
    killed = last_run(jc, "far")
    assert killed is not None
    assert (killed["state"], killed["exit_status"]) == ("killed", 255), killed
    assert killed["reason"] == "killed: the daemon stopped", killed
    jc.assert_no_task_processes()


def test_a_worker_killed_with_sigkill_loses_its_runs_when_the_lease_expires(
    jcpg: JobControl,
) -> None:
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("lane", "set", "default", "stale=3s")
    pid = sleeper_on(jc, "w2")
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: ended(jc, "sleeper"), WAIT), "the lease never ran out"
    run = ended(jc, "sleeper")
    assert run is not None
    assert (run["state"], run["exit_status"]) == ("lost", 255), run
    assert "worker w2 stopped renewing its lease" in run["reason"], run
    assert f"its process {pid} is gone" in run["reason"], run  # what is known of it, said
    # The worker was on this host: what it left running is killed with the lost run,
    # and the run's cgroup removed (the worker may never come back to remove it).
    jc.assert_no_task_processes()
    instance = jc.instance()
    assert instance is not None
    left = [
        p
        for base in _cgroups_named(f"jobcontrol-{instance}")
        if base.name.endswith("w2") and "memory" not in base.parts
        for p in base.glob(f"run-{run['id']}")
    ]
    assert left == [], left
    # It comes back under its name: the tree runs again on it.
    jc.ok("worker", "start", "--name", "w2", "--slots", "1")
    jc.ok("run", "hello")
    assert wait_until(lambda: ended(jc, "hello"), WAIT)


def test_a_worker_restarted_at_once_settles_what_its_killed_process_held(
    jcpg: JobControl,
) -> None:
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    pid = sleeper_on(jc, "w3")
    task = jc.marked(JOBCONTROL_JOB="sleeper")[0]
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not procs.pid_alive(pid), WAIT)
    assert procs.pid_alive(task), "the task outlives its worker's kill -9"
    # Within the lease (30 s by default): the new process kills the task and says why.
    jc.ok("worker", "start", "--name", "w3", "--slots", "1")
    assert wait_until(lambda: ended(jc, "sleeper"), 10.0), "not settled at the restart"
    run = ended(jc, "sleeper")
    assert run is not None
    assert (run["state"], run["exit_status"]) == ("lost", 255)
    assert "its worker w3 restarted" in run["reason"], run
    jc.assert_no_task_processes()


def test_a_host_crash_that_takes_daemon_and_worker_leaves_no_task_running(
    jcpg: JobControl,
) -> None:
    """The daemon and a worker of its host killed together (an OOM killer, ``systemctl
    kill``): the daemon's start found the worker gone and its run lost, but left the
    task running, orphaned, for good; a new run of the tree then ran beside it."""
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    pid = sleeper_on(jc, "w9")
    task = jc.marked(JOBCONTROL_JOB="sleeper")[0]
    (daemon,) = jc.live_daemons()
    os.kill(daemon, signal.SIGKILL)
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not jc.live_daemons() and not procs.pid_alive(pid), WAIT)
    assert procs.pid_alive(task), "the task outlives both"
    jc.ok("daemon", "start", "--slots", "0")
    assert wait_until(lambda: ended(jc, "sleeper"), WAIT), "not settled at the start"
    run = ended(jc, "sleeper")
    assert run is not None
    assert (run["state"], run["exit_status"]) == ("lost", 255), run
    assert "its worker w9 is gone" in run["reason"], run
    assert wait_until(lambda: not procs.pid_alive(task), WAIT), "the lost run's task still runs"
    jc.assert_no_task_processes()


def outlive_the_dispatcher(
    jc: JobControl, worker: str, held: tuple[str, str], ends: tuple[str, str], gate: Path
) -> None:
    """A daemon with no slots and ``worker`` (two slots) run the jobs ``held[0]`` and
    ``ends[0]`` until their tasks ``held[1]`` and ``ends[1]`` run; the daemon is killed
    with -9; then ``gate`` lets ``ends[1]`` end, and its worker records that end while
    no dispatcher runs."""
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("worker", "start", "--name", worker, "--slots", "2")
    jc.ok("run", held[0])
    jc.ok("run", ends[0])
    assert wait_until(
        lambda: jc.marked(JOBCONTROL_JOB=held[1]) and jc.marked(JOBCONTROL_JOB=ends[1]), WAIT
    ), "the tasks never started"
    (daemon,) = jc.live_daemons()
    os.kill(daemon, signal.SIGKILL)
    assert wait_until(lambda: not jc.live_daemons(), WAIT)
    gate.touch()
    assert wait_until(lambda: ended(jc, ends[1]), WAIT), "the worker never recorded its end"


def test_a_task_that_outlives_its_dispatcher_keeps_its_tree_busy_and_its_end_counts(
    jcpg: JobControl,
) -> None:
    """The dispatcher is killed while top-level tasks run on a live remote worker. Started
    again, it takes up the one still running (its tree is busy, its end is the job's
    result) and reacts to the one that ended while it was gone (retried, as allowed)."""
    jc = jcpg
    gates = {name: jc.base / f"{name}.gate" for name in ("long", "flaky")}
    second = jc.base / "second-try"
    jc.load(
        write(
            jc.base / "outlive.yaml",
            f"""\
jobs:
  - name: long
    command: "while [ ! -f {gates['long']} ]; do sleep 0.05; done; exit 6"
  - name: flaky
    retries: 1
    command: >-
      while [ ! -f {gates['flaky']} ]; do sleep 0.05; done;
      if [ -f {second} ]; then exit 0; fi; touch {second}; exit 4
""",
        )
    )
    outlive_the_dispatcher(jc, "w5", ("long", "long"), ("flaky", "flaky"), gates["flaky"])
    assert (ended(jc, "flaky") or {}).get("exit_status") == 4

    jc.ok("daemon", "start", "--slots", "0")
    # Its retry was due: the dispatcher reacts to the end it missed.
    assert wait_until(lambda: len(runs_of(jc, "flaky")) == 2 and ended(jc, "flaky"), WAIT), runs_of(
        jc, "flaky"
    )
    retried = ended(jc, "flaky")
    assert retried is not None
    assert (retried["state"], retried["exit_status"], retried["attempt"]) == ("succeeded", 0, 2)
    # The task still running is its tree's run in flight: not started twice.
    listed = {j["name"]: j for j in jc.json("ls")}
    assert listed["long"]["state"] == "running", listed["long"]
    busy = jc.fails("run", "long")
    assert "tree busy" in busy.stderr, describe(busy)
    gates["long"].touch()
    assert wait_until(lambda: jc.json("ls") and ended(jc, "long"), WAIT)
    (first,) = runs_of(jc, "long")
    assert wait_until(
        lambda: {j["name"]: j for j in jc.json("ls")}["long"]["exit_status"] == 6, WAIT
    ), "its end is the job's result"
    assert {j["name"]: j for j in jc.json("ls")}["long"]["state"] == "idle"
    assert first["exit_status"] == 6

    # Ends reacted to once are not reacted to again at the next start.
    before = {j["name"]: j for j in jc.json("ls")}
    jc.ok("daemon", "stop")
    jc.ok("daemon", "start", "--slots", "0")
    after = {j["name"]: j for j in jc.json("ls")}
    for name in ("long", "flaky"):
        assert (after[name]["last_ran"], after[name]["exit_status"]) == (
            before[name]["last_ran"],
            before[name]["exit_status"],
        ), name
    assert (len(runs_of(jc, "long")), len(runs_of(jc, "flaky"))) == (1, 2)


def test_boxes_whose_tasks_outlive_their_dispatcher_go_on_from_where_they_were(
    jcpg: JobControl,
) -> None:
    """The dispatcher is killed while two boxes each run a task on a live remote worker.
    Started again, it does not end the boxes with it: the box whose task still runs is
    its tree's run in flight (busy, and it goes on to its next child when the task ends);
    the box whose task ended while no dispatcher ran goes on from that end at once."""
    jc = jcpg
    gates = {name: jc.base / f"{name}.gate" for name in ("held", "done")}
    jc.load(
        write(
            jc.base / "boxes.yaml",
            f"""\
jobs:
  - name: Pipe
    children:
      - name: held
        active: true
        command: "while [ ! -f {gates['held']} ]; do sleep 0.05; done"
      - name: held-next
        active: true
        command: "true"
  - name: Seq
    children:
      - name: done
        active: true
        command: "while [ ! -f {gates['done']} ]; do sleep 0.05; done; exit 3"
      - name: done-next
        active: true
        command: "true"
""",
        )
    )
    outlive_the_dispatcher(jc, "w6", ("Pipe", "held"), ("Seq", "done"), gates["done"])

    jc.ok("daemon", "start", "--slots", "0")
    # Seq goes on from the end it missed: its next child runs, the box ends with the
    # first non-zero status of its children, as if no dispatcher had been away.
    assert wait_until(lambda: ended(jc, "Seq"), WAIT), runs_of(jc, "Seq")
    (seq,) = runs_of(jc, "Seq")
    assert (seq["state"], seq["exit_status"]) == ("failed", 3), seq
    assert [r["state"] for r in runs_of(jc, "done-next")] == ["succeeded"]
    # Pipe is in flight still: busy, not started twice, and not lost.
    listed = {j["name"]: j for j in jc.json("ls")}
    assert (listed["Pipe"]["state"], listed["held"]["state"]) == ("running", "running"), listed
    busy = jc.fails("run", "Pipe")
    assert "tree busy" in busy.stderr, describe(busy)
    assert runs_of(jc, "held-next") == []
    gates["held"].touch()
    assert wait_until(lambda: ended(jc, "Pipe"), WAIT), runs_of(jc, "Pipe")
    (pipe,) = runs_of(jc, "Pipe")
    assert (pipe["state"], pipe["exit_status"]) == ("succeeded", 0), pipe
    assert [r["state"] for r in runs_of(jc, "held")] == ["succeeded"]
    assert [r["state"] for r in runs_of(jc, "held-next")] == ["succeeded"]
    assert wait_until(
        lambda: {j["name"]: j["state"] for j in jc.json("ls")}["Pipe"] == "idle", WAIT
    )


def test_a_chain_run_two_ahead_while_no_dispatcher_ran_goes_on_from_its_last_end(
    jcpg: JobControl,
) -> None:
    """The dispatcher is killed while a CONTINUE sequence's first task runs on a remote
    worker. The worker goes on through the two tasks queued ahead (the second failing)
    and stops there, with nothing more released. Started again, the dispatcher goes on
    from the last end: every task runs once, in order, and the box ends with the
    failure it missed."""
    jc = jcpg
    gate, out = jc.base / "first.gate", jc.base / "order"
    steps = "\n".join(
        f"""      - name: c{i}
        active: true
        command: "echo {i} >> {out}{'; exit 4' if i == 2 else ''}\""""
        for i in range(2, 6)
    )
    jc.load(
        write(
            jc.base / "chain.yaml",
            f"""\
jobs:
  - name: Chain
    box_type: sequence
    on_error: continue
    children:
      - name: c1
        active: true
        command: "while [ ! -f {gate} ]; do sleep 0.05; done; echo 1 >> {out}"
{steps}
""",
        )
    )
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("worker", "start", "--name", "w7", "--slots", "1")
    jc.ok("run", "Chain")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="c1"), WAIT), "c1 never started"
    (daemon,) = jc.live_daemons()
    os.kill(daemon, signal.SIGKILL)
    assert wait_until(lambda: not jc.live_daemons(), WAIT)
    gate.touch()
    assert wait_until(lambda: ended(jc, "c3"), WAIT), "the worker did not take c2 and c3"
    assert out.read_text().split() == ["1", "2", "3"]
    assert runs_of(jc, "c4") == [], "only two were queued ahead"

    jc.ok("daemon", "start", "--slots", "0")
    assert wait_until(lambda: ended(jc, "Chain"), WAIT), runs_of(jc, "Chain")
    (chain,) = runs_of(jc, "Chain")
    assert (chain["state"], chain["exit_status"]) == ("failed", 4), chain
    runs = {f"c{i}": runs_of(jc, f"c{i}") for i in range(1, 6)}
    assert out.read_text().split() == ["1", "2", "3", "4", "5"], runs
    assert [len(runs[f"c{i}"]) for i in range(1, 6)] == [1] * 5, runs
    assert [r["exit_status"] for r in runs["c2"]] == [4]
    # Each job's last result is its run's, those that ended while no dispatcher ran too.
    for i in range(1, 6):
        job, (run,) = jc.json("show", f"c{i}"), runs[f"c{i}"]
        assert (job["exit_status"], job["last_ran"] is not None) == (run["exit_status"], True), (
            job,
            run,
        )


@contextmanager
def worker_through(jc: JobControl, name: str, cut_on: tuple[bytes, ...]) -> Iterator[TcpRelay]:
    """Worker ``name`` (one slot) reaching PostgreSQL through a relay that cuts the
    connection instead of passing on the answer ``cut_on`` says (``TcpRelay``). A lane
    of a 3 s lease: a beat each second."""
    jc.ok("lane", "add", "lossy", "stale=3s", "poll=0.5s")
    relay = TcpRelay("127.0.0.1", int(make_url(jc.url).port or 5432), cut_on=cut_on)
    argv, env = jc.argv_env(relay.url(jc.url), "worker", "start", "--name", name, "--slots", "1")
    (started,) = jc.run_all(argv, envs=[env], timeout=120)
    try:
        assert started.returncode == 0, describe(started)
        yield relay
    finally:
        for pid in jc.live_workers():  # before the relay goes: cut off, it would wait
            jc.stop_worker(pid)
        relay.close()


def worker_said(jc: JobControl, name: str) -> str:
    return "".join(p.read_text() for p in jc.state_dir.glob(f"worker-{name}-*.log"))


def test_a_claim_whose_answer_is_lost_with_its_connection_goes_back_to_the_queue(
    jcpg: JobControl,
) -> None:
    """The worker's claim commits, then its connection is cut before the answer arrives
    (a relay between worker and PostgreSQL drops the answer to the COMMIT of the claim).
    The database says the worker holds the run; the worker never heard of it and runs
    nothing. Its heartbeats find the stranger and put it back in the queue, where it is
    claimed again and runs: the tree does not hang as running forever."""
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    yaml = "jobs:\n  - name: answer-lost\n    command: exit 5\n    queue: lossy\n"
    jc.load(write(jc.base / "lossy.yaml", yaml))
    with worker_through(jc, "w7", (b"answer-lost", b"COMMIT")) as relay:
        jc.ok("run", "answer-lost")
        assert relay.cut.wait(WAIT), "the claim's answer never passed the relay"
        assert wait_until(lambda: ended(jc, "answer-lost"), WAIT), runs_of(jc, "answer-lost")
        (done,) = runs_of(jc, "answer-lost")  # the same run, claimed again: not a retry
        assert (done["state"], done["exit_status"], done["attempt"], done["worker"]) == (
            "failed",
            5,
            1,
            "w7",
        ), done
        said = worker_said(jc, "w7")
        assert f"task run(s) {done['id']} were claimed for it by a transaction" in said, said
        assert {j["name"]: j for j in jc.json("ls")}["answer-lost"]["state"] == "idle"


def test_an_end_whose_answer_is_lost_is_recorded_once_and_its_sequence_goes_on(
    jcpg: JobControl,
) -> None:
    """A task of a sequence ends; the statement that records its end and takes the next
    task commits, but its answer is cut on the way back. The worker records the end
    again (it cannot know): the row has it already, once. The next task it took without
    hearing so goes back to the queue, runs, and the sequence ends."""
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    yaml = """\
jobs:
  - name: Steps
    box_type: sequence
    queue: lossy
    children:
      - name: first-step
        command: "exit 0"
        queue: lossy
        active: true
      - name: next-step
        command: "exit 0"
        queue: lossy
        active: true
"""
    jc.load(write(jc.base / "steps.yaml", yaml))
    # The end's answer carries the row of the task it took next (``n_job_name``).
    with worker_through(jc, "w8", (b"next-step",)) as relay:
        jc.ok("run", "Steps")
        assert relay.cut.wait(WAIT), "the end's answer never passed the relay"
        assert wait_until(lambda: ended(jc, "Steps"), WAIT), runs_of(jc, "next-step")
        (box,) = runs_of(jc, "Steps")
        assert (box["state"], box["exit_status"]) == ("succeeded", 0), box
        for step in ("first-step", "next-step"):
            (done,) = runs_of(jc, step)
            assert (done["state"], done["attempt"], done["worker"]) == ("succeeded", 1, "w8")
        said = worker_said(jc, "w8")
        (first,) = runs_of(jc, "first-step")
        assert f"task run {first['id']}: its end was recorded by an earlier try" in said, said
        assert "after it had been settled" not in said, said
        (taken,) = runs_of(jc, "next-step")
        assert f"task run(s) {taken['id']} were claimed for it by a transaction" in said, said


def test_a_stopped_worker_kills_what_outlasts_its_drain_timeout_and_records_it(
    jcpg: JobControl,
) -> None:
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("worker", "start", "--name", "wd", "--slots", "1", "--drain-timeout", "1s")
    jc.ok("run", "sleeper")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT), "sleeper never started"
    # SIGTERM: no new claims, the run in hand may end; a second later it is killed, its
    # end recorded by the worker itself (not left to its lease), and the worker exits.
    stopped = jc.ok("worker", "stop", "--name", "wd", "--timeout", "30")
    assert "worker wd stopped" in stopped.stdout, describe(stopped)
    run = ended(jc, "sleeper")
    assert run is not None, "recorded before the worker exited"
    assert (run["state"], run["exit_status"], run["worker"]) == ("killed", 255, "wd"), run
    assert "its worker's stop outlasted --drain-timeout 1s" in run["reason"], run
    jc.assert_no_task_processes()
    log = next(jc.state_dir.glob("worker-wd-*.log")).read_text()
    assert "worker wd: 1 run(s) still in hand: killed" in log, log

    # Without a drain timeout a stop waits for the run (here: until the stop's own timeout).
    jc.ok("worker", "start", "--name", "wd", "--slots", "1")
    jc.ok("run", "sleeper")
    assert wait_until(
        lambda: (r := last_run(jc, "sleeper")) is not None
        and r["id"] != run["id"]
        and jc.marked(JOBCONTROL_JOB="sleeper"),
        WAIT,
    ), "sleeper never started again"
    waited = jc.fails("worker", "stop", "--name", "wd", "--timeout", "2")
    assert "did not stop within 2s" in waited.stderr, describe(waited)
    assert jc.marked(JOBCONTROL_JOB="sleeper"), "the run in hand goes on"
    jc.ok("worker", "stop", "--name", "wd", "--kill")
    jc.assert_no_task_processes()


def test_a_worker_is_refused_on_sqlite_or_a_bad_spec_and_nothing_changes(
    jc_sqlite: JobControl, jcpg: JobControl
) -> None:
    jc_sqlite.upgraded()
    refused = jc_sqlite.fails("worker", "--name", "w")
    assert "a worker process needs a PostgreSQL database" in refused.stderr, describe(refused)
    assert jc_sqlite.json("workers") == []
    assert not list(jc_sqlite.state_dir.glob("worker-*"))

    for spec, why in (
        ("fast:0", "the slot count must be a whole number"),
        ("fast", "has no slot count"),
        ("*,fast:2", "fast"),
    ):
        bad = jcpg.fails("worker", "--name", "w", "--queues", spec)
        assert "--queues" in bad.stderr, describe(bad)
        assert why in bad.stderr, describe(bad)
    both = jcpg.fails("worker", "--name", "w", "--queues", "*:2", "--slots", "2")
    assert "--queues or --slots, not both" in both.stderr
    named = jcpg.fails("worker", "--name", "-bad name")
    assert "worker name '-bad name'" in named.stderr, describe(named)
    empty = jcpg.fails("worker", "--name", "")  # an unset shell variable: not the host's
    assert "worker name ''" in empty.stderr, describe(empty)
    assert jcpg.json("workers") == []

    # A name a live worker holds is refused.
    jcpg.ok("worker", "start", "--name", "dup", "--slots", "1")
    again = jcpg.fails("worker", "--name", "dup", "--slots", "1")
    assert "another worker of this name" in again.stderr, describe(again)
    assert [w["name"] for w in jcpg.json("workers")] == ["dup"]
    jcpg.ok("worker", "stop", "--name", "dup")


def test_a_worker_without_its_database_says_so_in_one_line_and_a_stop_ends_its_wait(
    jcpg: JobControl, make_jc: Any, postgres_server: PostgresServer
) -> None:
    # No server at all: refused at once, in one line, as the daemon says it.
    nowhere = make_jc("postgresql+psycopg://postgres@127.0.0.1:1/nothing")
    down = nowhere.fails("worker", "--name", "w", "--slots", "1")
    assert "cannot reach the database postgresql+psycopg://postgres@127.0.0.1:1/nothing" in (
        down.stderr
    ), describe(down)
    assert "Traceback" not in down.stderr, describe(down)
    assert not list(nowhere.state_dir.glob("worker-*.pid")), "no pid file left behind"

    # URLs of a form no database has: named in one line (the password hidden), not a trace.
    for url, why in (
        ("postgres://postgres@127.0.0.1:1/nothing", "names no kind of database"),
        ("postgresql+psycopg://u:hush@127.0.0.1:notaport/x", "is not a database URL"),
    ):
        odd = make_jc(url)
        for argv in (("worker", "--name", "w", "--slots", "1"), ("workers",), ("ls",)):
            refused = odd.fails(*argv)
            assert why in refused.stderr, describe(refused)
            assert "postgresql+psycopg://USER@HOST:PORT/NAME" in refused.stderr
            assert "hush" not in refused.stderr, "the password is hidden"
            assert len(refused.stderr.strip().splitlines()) == 1, describe(refused)
        assert not list(odd.state_dir.glob("worker-*.pid")), "no pid file left behind"

    # The database answers reads but not the registry's write (its table held by another
    # transaction; each try fails on lock_timeout, as in an outage): the worker waits for
    # it, and SIGTERM ends that wait instead of being ignored until the database is back.
    dbname = jcpg.url.rsplit("/", 1)[1]
    with postgres_server.connect(dbname, autocommit=True) as admin:
        admin.execute(f"ALTER DATABASE \"{dbname}\" SET lock_timeout = '200ms'")
    holder = postgres_server.connect(dbname)
    try:
        holder.execute("LOCK TABLE worker IN EXCLUSIVE MODE")  # reads pass, writes wait
        out = jcpg.base / "waiting.out"
        child = jcpg.popen("worker", "--name", "w", "--slots", "1", output=out)
        assert wait_until(
            lambda: "the database does not answer" in out.read_text(errors="replace"), 60
        ), out.read_text(errors="replace")
        child.send_signal(signal.SIGTERM)
        try:
            rc = child.wait(timeout=30)
        except Exception:
            child.kill()
            raise AssertionError("SIGTERM did not end the wait: " + out.read_text()) from None
        assert rc == 0, out.read_text()
    finally:
        holder.rollback()
        holder.close()
    assert jcpg.json("workers") == [], "it never joined"
    assert not list(jcpg.state_dir.glob("worker-*.pid")), "its pid file is gone"


def _scram_for_workers(server: PostgresServer, group: str) -> None:
    """Make the server check this group's passwords (the test server trusts everyone)."""
    hba = server.datadir / "pg_hba.conf"
    lines = hba.read_text()
    rule = f"host all +{group} 127.0.0.1/32 scram-sha-256\n"
    if rule not in lines:
        hba.write_text(rule + lines)
    with server.connect(autocommit=True) as conn:
        conn.execute("SELECT pg_reload_conf()")


def test_worker_credentials_work_the_queue_and_nothing_else(
    jcpg: JobControl, postgres_server: PostgresServer, tmp_path: Path
) -> None:
    jc = jcpg
    bad = jc.fails("worker-credentials", "add", "Bad-Name")
    assert "use 1 to 40 lower-case letters" in bad.stderr, describe(bad)

    url_file = tmp_path / "w-url"
    made = jc.ok("worker-credentials", "add", "ci1", "--output", str(url_file))
    assert "jcw_ci1 created" in made.stdout
    assert stat.S_IMODE(url_file.stat().st_mode) == 0o600
    url = url_file.read_text().strip()
    password = re.search(r"jcw_ci1:([^@]+)@", url).group(1)  # type: ignore[union-attr]
    assert password not in made.stdout + made.stderr
    assert jc.ok("worker-credentials", "list").stdout.split() == ["jcw_ci1"]
    dbname = url.rsplit("/", 1)[1]
    _scram_for_workers(postgres_server, f"jc_workers_{dbname}"[:63])
    libpq = url.replace("postgresql+psycopg://", "postgresql://")
    wrong = libpq.replace(password, "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(wrong, connect_timeout=5).close()

    with psycopg.connect(libpq, autocommit=True, connect_timeout=5) as conn:
        for statement in (
            "UPDATE job SET command = 'rm -rf /' WHERE name = 'hello'",
            "SELECT * FROM job",
            "SELECT * FROM app_user",
            "SELECT * FROM audit",
            "INSERT INTO run (job_name, kind, trigger, state, created) "
            "VALUES ('x', 'task', 'manual', 'queued', now())",
            "UPDATE run SET command = 'evil'",
            "UPDATE lane SET max_slots = 99",
            "DELETE FROM run",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(statement)
    # The job is as it was.
    [hello] = [j for j in jc.json("ls") if j["name"] == "hello"]
    assert "rm -rf" not in str(hello)

    # With those credentials alone, a worker runs the daemon's tasks.
    jc.ok("daemon", "start", "--slots", "0")
    env = dict(jc.env, JOBCONTROL_DB=url)
    start = jc.bare(
        "--state-dir",
        str(jc.state_dir),
        "worker",
        "start",
        "--name",
        "ci1",
        # A queue no lane is named after: the login may not read the jobs to tell
        # whether one runs in it, and the worker starts all the same (it did not).
        "--queues",
        "nightly:1 *:1",
        env=env,
    )
    assert start.returncode == 0, describe(start)
    cmdline = Path(f"/proc/{worker_pid(jc, 'ci1')}/cmdline").read_bytes()
    assert password.encode() not in cmdline
    jc.ok("set", "hello", "max_log_files=1")  # each finish prunes the one before
    for _ in range(2):
        jc.ok("run", "hello")
        assert wait_until(lambda: ended(jc, "hello"), WAIT), "hello never ran on the ci1 worker"
    run = ended(jc, "hello")
    assert run is not None
    assert (run["worker"], run["exit_status"]) == ("ci1", 3)
    first, second = sorted(r["id"] for r in jc.history("hello"))
    with psycopg.connect(jc.url.replace("postgresql+psycopg://", "postgresql://")) as owner:
        kept = owner.execute("SELECT DISTINCT run_id FROM run_log ORDER BY 1").fetchall()
        paths = dict(owner.execute("SELECT id, log_path FROM run WHERE job_name = 'hello'"))
    assert kept == [(second,)], "the worker login pruned the first run's log"
    assert (paths[first], paths[second]) == (None, "db:")
    stop = jc.bare("--state-dir", str(jc.state_dir), "worker", "stop", "--name", "ci1", env=env)
    assert stop.returncode == 0, describe(stop)

    # Another worker login changes nothing of ci1's: not its settled run, not its
    # registry row, not its runs' stored output; nor may it take ci1's name.
    other_file = tmp_path / "w2-url"
    jc.ok("worker-credentials", "add", "ci2", "--output", str(other_file))
    other = other_file.read_text().strip()
    with psycopg.connect(jc.url.replace("postgresql+psycopg://", "postgresql://")) as owner:
        before = owner.execute("SELECT * FROM run ORDER BY id").fetchall()
        logs = owner.execute("SELECT count(*) FROM run_log").fetchone()
        row = owner.execute("SELECT * FROM worker WHERE name = 'ci1'").fetchone()
    assert logs is not None
    assert logs[0] > 0  # hello's output, kept in the database
    libpq2 = other.replace("postgresql+psycopg://", "postgresql://")
    with psycopg.connect(libpq2, autocommit=True, connect_timeout=5) as conn:
        for statement in (
            f"UPDATE run SET state = 'succeeded', exit_status = 0 WHERE id = {run['id']}",
            f"UPDATE run SET worker = 'ci2', state = 'running' WHERE id = {run['id']}",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="settled"):
                conn.execute(statement)
        for statement in (
            "UPDATE worker SET stopped = NULL, heartbeat = now() + interval '1 day'",
            "DELETE FROM run_log",
        ):
            assert conn.execute(statement).rowcount == 0, statement
    with psycopg.connect(jc.url.replace("postgresql+psycopg://", "postgresql://")) as owner:
        assert owner.execute("SELECT * FROM run ORDER BY id").fetchall() == before
        assert owner.execute("SELECT count(*) FROM run_log").fetchone() == logs
        assert owner.execute("SELECT * FROM worker WHERE name = 'ci1'").fetchone() == row
    taken = jc.bare(
        "--state-dir", str(tmp_path / "w2"), "worker", "--name", "ci1", "--slots", "1",
        env=dict(jc.env, JOBCONTROL_DB=other),
    )  # fmt: skip
    assert taken.returncode != 0, describe(taken)
    assert "worker name 'ci1' belongs to another worker login" in taken.stderr, describe(taken)
    jc.ok("worker-credentials", "remove", "ci2")
    jc.ok("daemon", "stop")
    jc.ok("worker-credentials", "remove", "ci1")
    assert jc.ok("worker-credentials", "list").stdout.split() == []
    trail = [(e["operation"], e["result"], e["detail"]) for e in jc.json("audit")]
    assert any(op == "worker-credentials.add" and r == "refused" for op, r, _ in trail), trail
    assert ("worker-credentials.add", "ok", "login jcw_ci1") in trail, trail
    assert ("worker-credentials.remove", "ok", "login jcw_ci1") in trail, trail
    assert password not in str(trail)


def _unserved(jc: JobControl) -> list[dict[str, Any]] | None:
    code, body = health(jc)
    assert code == 200, body  # the daemon is well: its runs wait for a worker
    return body.get("unserved_queues")


def test_runs_that_no_live_worker_serves_are_said_in_health_status_and_metrics(
    jcpg: JobControl,
) -> None:
    """A daemon that runs no tasks, with no live worker: its queued runs would wait
    unseen. /healthz, /metrics and `status` say which queue waits, since when, and who
    served it last; once a worker serves it again they are back to ok."""
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    assert health(jc)[1]["status"] == "ok"
    assert metrics(jc)["jobcontrol_queue_unserved"] == 0

    jc.ok("run", "hello")
    assert wait_until(lambda: _unserved(jc), WAIT), "the run was never said to wait"
    waiting = _unserved(jc)
    assert waiting is not None
    assert [(u["queue"], u["runs"], u["last_worker"]) for u in waiting] == [("default", 1, None)]
    code, body = health(jc)
    assert body["status"] == "runs waiting for a worker"
    assert "queue default: 1 run waits (since " in body["reason"], body
    assert "no live worker serves it; no worker has served it" in body["reason"], body
    assert metrics(jc)["jobcontrol_queue_unserved"] == 1
    said = jc.ok("status").stdout
    assert re.search(
        r"queue default: 1 run\(s\) waiting since .*, no live worker serves it "
        r"\(no worker has served it\)",
        said,
    ), said

    jc.ok("worker", "start", "--name", "build-1", "--slots", "1")
    assert wait_until(lambda: ended(jc, "hello"), WAIT), "hello never ended"
    assert wait_until(lambda: health(jc)[1]["status"] == "ok", WAIT), health(jc)
    assert metrics(jc)["jobcontrol_queue_unserved"] == 0
    assert "no live worker" not in jc.ok("status").stdout

    # Its worker killed (kill -9, on this host: its process is gone), a new run waits
    # again, and health names the worker last heard of.
    pid = worker_pid(jc, "build-1")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_until(lambda: not procs.pid_alive(pid), WAIT)
    jc.ok("run", "hello")
    assert wait_until(lambda: _unserved(jc), WAIT), "the run after its death never waited"
    waiting = _unserved(jc)
    assert waiting is not None
    assert [(u["queue"], u["runs"]) for u in waiting] == [("default", 1)]
    assert waiting[0]["last_worker"]["name"] == "build-1"
    assert "its last worker build-1 was last heard of at " in health(jc)[1]["reason"]


def test_the_daemon_notifies_only_while_a_worker_process_listens(jcpg: JobControl) -> None:
    """Alone, the daemon sends no NOTIFY for its own tasks' ends (/metrics counts them
    as not sent); a worker process makes itself known, and is told of work at once
    even when the daemon restarted after it (the daemon asks who listens)."""
    jc = jcpg
    jc.ok("daemon", "start")  # its own slots: runs hello itself
    jc.ok("run", "hello")
    assert wait_until(lambda: ended(jc, "hello"), WAIT), "hello never ended"
    alone = metrics(jc)
    assert alone["jobcontrol_notification_peers"] == 0, alone
    assert alone["jobcontrol_notifications_sent_total"] == 0, alone
    assert alone["jobcontrol_notifications_skipped_total"] >= 1, alone

    jc.ok("worker", "start", "--name", "late-1", "--slots", "1")
    assert wait_until(lambda: metrics(jc)["jobcontrol_notification_peers"] == 1, WAIT), metrics(jc)
    jc.ok("daemon", "stop")
    jc.ok("daemon", "start", "--slots", "0")  # after the worker: it must ask
    assert wait_until(lambda: metrics(jc)["jobcontrol_notification_peers"] == 1, WAIT), metrics(jc)
    before = len(runs_of(jc, "hello"))
    jc.ok("run", "hello")
    # Told at once: without the push the idle worker would find it at its next beat
    # (a minute) or look (its back-off).
    assert wait_until(
        lambda: len(runs_of(jc, "hello")) > before and ended(jc, "hello"), 10
    ), "the worker was not told of the run"
    run = ended(jc, "hello")
    assert run is not None
    assert run["worker"] == "late-1", run
    assert metrics(jc)["jobcontrol_notifications_sent_total"] >= 1

    jc.ok("worker", "stop", "--name", "late-1")
    assert wait_until(lambda: metrics(jc)["jobcontrol_notification_peers"] == 0, WAIT), metrics(jc)


def test_a_name_held_on_another_host_is_refused_while_its_lanes_lease_holds(
    jcpg: JobControl,
) -> None:
    """A worker named like one on another host is refused while that one was heard of
    within the lease of the lanes it serves: with a 5 s lane, a namesake silent for 10 s
    is dead, and its name may be taken; one heard of 1 s ago may not."""
    jc = jcpg.upgraded()
    jc.ok("lane", "add", "quick", "stale=5s")
    store = Store(jc.url)
    try:
        queue = RunQueue(store, None)
        now = datetime.now(UTC)
        for name, age in (("gone-quiet", 10.0), ("alive", 1.0)):
            info = WorkerInfo(
                name=name,
                host="elsewhere",
                pid=4242,
                slots=1,
                version="1",
                started=now,
                queues=["quick"],
            )
            queue.register(info, now - timedelta(seconds=age))
            queue.heartbeat(name, now - timedelta(seconds=age), every=5.0 / 3)
    finally:
        store.dispose()
    refused = jc.fails("worker", "--name", "alive", "--queues", "quick:1")
    assert "worker alive is running on host elsewhere" in refused.stderr, describe(refused)
    jc.ok("worker", "start", "--name", "gone-quiet", "--queues", "quick:1")
    assert wait_until(lambda: worker_pid(jc, "gone-quiet") is not None, WAIT)
    mine = [w for w in jc.json("workers") if w["name"] == "gone-quiet"]
    assert [w["host"] for w in mine] != ["elsewhere"], mine
    jc.ok("worker", "stop", "--name", "gone-quiet")


def test_a_worker_stopped_with_its_run_killed_leaves_no_run_of_the_task_after_it(
    jcpg: JobControl,
) -> None:
    """The run killed by its worker's stop releases the next task of its sequence, which
    the stopping worker does not take; the box then stops before it. That run never was
    one: it shows in no history, as after a kill of the tree."""
    jc = jcpg
    pair = "jobs:\n  - name: Pair\n    children:\n"
    pair += "      - {name: first, command: sleep 1000, active: true}\n"
    pair += "      - {name: then, command: 'true', active: true}\n"
    jc.load(write(jc.base / "pair.yaml", pair))
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("worker", "start", "--name", "wp", "--slots", "1", "--drain-timeout", "1s")
    jc.ok("run", "Pair")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="first"), WAIT), "first never started"
    stopped = jc.ok("worker", "stop", "--name", "wp", "--timeout", "30")
    assert "worker wp stopped" in stopped.stdout, describe(stopped)
    assert wait_until(lambda: ended(jc, "Pair"), WAIT), jc.history("Pair")
    assert [(r["state"], r["exit_status"]) for r in jc.history("first")] == [("killed", 255)]
    assert jc.history("then") == [], jc.history("then")
