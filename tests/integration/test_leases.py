"""Leases: a worker that stops vouching for its runs has them settled, once.

The worker is a real separate process on the same database (the dispatcher
has no embedded worker: ``slots=0``), so everything between them goes through
the run queue. It is frozen with SIGSTOP while its task runs: the dispatcher
settles the run as lost (255) when the lease runs out, kills what is left of
it on this host, and the tree goes on as after a failure. When the worker is
thawed it cannot overwrite the settled row, and it goes on claiming work.

The dispatcher's clock is the test's; the worker's runs at real speed from T0.
When the test moves the dispatcher's clock past a lease, it moves the worker's
clock there too (a floor in a file), as real time would have moved both: else
a run the thawed worker claims would carry a lease already out of date on the
dispatcher's clock, and be settled as lost.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from jobcontrol import RunState
from jobcontrol.procs import pid_alive
from tests.integration.conftest import MakeJC
from tests.integration.helpers import JC, T0, USER, box, poll_until, task

pytestmark = [pytest.mark.postgres, pytest.mark.timeout(90)]

# A worker in its own process. Its clock runs from the test's T0 at real speed.
WORKER = """\
import logging, sys, threading, time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from jobcontrol.store import Store
from jobcontrol.store.runqueue import RunQueue
from jobcontrol.worker import Worker

logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
url, log_root, name, instance, t0, floor_file = sys.argv[1:7]
T0, START = datetime.fromisoformat(t0), time.monotonic()

class Clock:
    def now(self):
        real = T0 + timedelta(seconds=time.monotonic() - START)
        try:  # a time the test has moved this clock to: never earlier than that
            return max(real, datetime.fromisoformat(Path(floor_file).read_text()))
        except (FileNotFoundError, ValueError):
            return real

worker = Worker(
    RunQueue(Store(url), timedelta(seconds=2)), clock=Clock(), log_root=Path(log_root),
    instance_id=instance, name=name, slots=2, poll_interval=0.2, heartbeat_interval=0.3,
)
worker.start()
print("ready", flush=True)
threading.Event().wait()
"""


def _in_transaction(url: str, pid_marker: str) -> bool:
    """Whether a session of the worker is inside a transaction (holding row locks)."""
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            states = conn.execute(
                sa.text(
                    "SELECT state FROM pg_stat_activity WHERE datname = current_database() "
                    "AND pid <> pg_backend_pid() AND application_name = :app"
                ),
                {"app": pid_marker},
            ).scalars()
            return any(s and s.startswith("idle in transaction") or s == "active" for s in states)
    finally:
        engine.dispose()


@contextmanager
def _worker_process(postgres_url: str, jc: JC, tmp_path: Path) -> Iterator[_Remote]:
    """A worker ``remote-1`` in a process of its own, ready; killed at the end."""
    app = f"jc-test-worker-{os.getpid()}"
    worker_url = f"{postgres_url}?application_name={app}"
    root_dir = Path(__file__).resolve().parents[2]
    err = tmp_path / "worker.err"
    argv = [sys.executable, "-c", WORKER, worker_url, str(tmp_path / "wlogs")]
    floor = tmp_path / "worker-clock-floor"
    argv += ["remote-1", jc.instance_id, T0.isoformat(), str(floor)]
    worker = subprocess.Popen(
        argv, cwd=root_dir, stdout=subprocess.PIPE, stderr=err.open("w"), text=True
    )
    try:
        assert worker.stdout is not None
        assert select.select([worker.stdout], [], [], 30)[0], err.read_text()
        assert worker.stdout.readline().strip() == "ready", err.read_text()
        yield _Remote(worker, err, app, floor)
    finally:
        worker.send_signal(signal.SIGCONT)
        worker.kill()
        worker.wait(10)
        if worker.stdout is not None:
            worker.stdout.close()


@dataclass
class _Remote:
    proc: subprocess.Popen[str]
    err: Path
    app: str  # its connections' application_name
    floor: Path  # a time its clock reads at least

    def clock_at_least(self, when: datetime) -> None:
        tmp = self.floor.with_suffix(".tmp")
        tmp.write_text(when.isoformat())
        tmp.replace(self.floor)  # never read half-written

    def freeze(self, postgres_url: str) -> None:
        """SIGSTOP between two transactions (a frozen open transaction would hold locks)."""
        for _ in range(50):
            self.proc.send_signal(signal.SIGSTOP)
            if not _in_transaction(postgres_url, self.app):
                return
            self.proc.send_signal(signal.SIGCONT)
        pytest.fail("could not freeze the worker outside a transaction")


def _held_run(jc: JC, mark: int) -> int:
    """The run of ``held`` once the worker runs its process."""
    held: int = jc.rec.wait_for(
        lambda s: s.name == "run_started" and s.run["job_name"] == "held", since=mark
    ).run["id"]
    poll_until("the worker to run the task", lambda: jc.run(held).pid is not None)
    assert jc.run(held).worker == "remote-1"
    return held


@dataclass
class _Held:
    mark: int
    root: int  # the run of Box
    held: int  # the run of its task `held`, on the frozen worker
    task_pids: list[int]
    lease: datetime  # when its lease runs out


@contextmanager
def _frozen_while_held(
    postgres_url: str, jc: JC, tmp_path: Path
) -> Iterator[tuple[_Remote, _Held]]:
    """Box (`held`, then `next`) run by a worker process, frozen while `held` runs."""
    gate = jc.gate()
    jc.create(
        box("Box", active=True),
        task("held", gate.command, "Box", active=True),
        task("next", "echo next", "Box", active=True),
    )
    with _worker_process(postgres_url, jc, tmp_path) as worker:
        mark = jc.rec.mark()
        root = jc.run_now("Box")
        held = _held_run(jc, mark)
        task_pids = jc.wait_task_process(held)
        worker.freeze(postgres_url)
        lease = jc.run(held).lease_until
        assert lease is not None
        yield worker, _Held(mark, root, held, task_pids, lease)


def test_a_frozen_worker_has_its_run_settled_once_and_the_tree_goes_on(
    postgres_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    jc = make_jc(postgres_url, slots=0, lease=2.0, poll_interval=0.2)
    with _frozen_while_held(postgres_url, jc, tmp_path) as (worker, f):
        mark, root, held, task_pids, lease = f.mark, f.root, f.held, f.task_pids, f.lease

        jc.clock.set(lease - timedelta(milliseconds=500))  # still vouched for
        jc.sync()
        jc.dispatcher.post((jc.dispatcher._poll, None))
        jc.sync()
        assert jc.run(held).state is RunState.RUNNING

        jc.clock.set(lease + timedelta(seconds=1))  # the lease has run out
        settled = jc.rec.run_finished("held", since=mark, timeout=10)
        assert (settled["state"], settled["exit_status"]) == ("lost", 255)
        row = jc.run(held)
        assert row.state is RunState.LOST
        assert "stopped renewing its lease" in (row.reason or "")
        # Collected: nothing of the lost run keeps running on this host.
        poll_until("the lost task's processes to be killed", lambda: not jc.task_pids(held))
        assert not any(pid_alive(pid) for pid in task_pids)  # a zombie of the frozen worker at most
        # The tree goes on as after a failure: `next` is queued for a worker.
        nxt = jc.rec.wait_for(
            lambda s: s.name == "run_started" and s.run["job_name"] == "next", since=mark
        ).run["id"]

        worker.clock_at_least(jc.clock.now())  # time went by for it too
        worker.proc.send_signal(signal.SIGCONT)  # back, late
        done = jc.rec.run_finished("Box", since=mark, timeout=30)
        assert (done["id"], done["exit_status"]) == (root, 255)
        assert jc.run(nxt).state is RunState.SUCCEEDED
        after = jc.run(held)
        assert (after.state, after.exit_status, after.reason) == (row.state, 255, row.reason)
        poll_until(
            "the worker to say it could not record the settled run",
            lambda: "after it had been settled" in worker.err.read_text()
            or "was settled while worker" in worker.err.read_text(),
        )


def test_a_kill_its_frozen_worker_never_carried_out_is_recorded_as_the_kill_it_was(
    postgres_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    """An operator kills a tree whose task's worker (on this host) is frozen: the kill is
    asked of the worker, which cannot act. When the lease runs out the dispatcher kills
    what is left on this host, and the run says killed, not lost; the tree stops there."""
    jc = make_jc(postgres_url, slots=0, lease=2.0, poll_interval=0.2)
    with _frozen_while_held(postgres_url, jc, tmp_path) as (worker, f):
        mark, root, held, task_pids, lease = f.mark, f.root, f.held, f.task_pids, f.lease

        jc.engine.kill("Box", user=USER)
        jc.sync()
        assert jc.run(held).state is RunState.RUNNING  # asked of its worker, which is frozen
        assert jc.run(held).kill_requested

        jc.clock.set(lease + timedelta(seconds=1))  # the lease has run out
        settled = jc.rec.run_finished("held", since=mark, timeout=10)
        assert (settled["state"], settled["exit_status"]) == ("killed", 255)
        row = jc.run(held)
        assert row.state is RunState.KILLED
        assert "before it carried out the kill" in (row.reason or ""), row.reason
        poll_until("the killed task's processes to end", lambda: not jc.task_pids(held))
        assert not any(pid_alive(pid) for pid in task_pids)
        done = jc.rec.run_finished("Box", since=mark, timeout=10)
        assert (done["id"], done["state"], done["exit_status"]) == (root, "killed", 255)
        assert jc.runs("next") == [], "a killed tree runs nothing after the kill"
