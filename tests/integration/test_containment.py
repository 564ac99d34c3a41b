"""The worker never runs a task uncontained when its cgroups are in force: a run whose cgroup
cannot be made, or whose shell cannot join it, is refused with the reason and its command
never runs. With cgroups, a run records its CPU time and peak memory."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command

from jobcontrol.cgroups import Containment, RunCgroup
from jobcontrol.store import alembic_config
from tests.integration.helpers import JC, box, task

pytestmark = pytest.mark.timeout(60)


def _worker_containment(jc: JC) -> Containment:
    worker = jc.runtime.worker
    assert worker is not None
    return worker.containment


class _Unjoinable(Containment):
    """Hands out cgroups in a directory that does not exist: the shell's write fails."""

    def __init__(self, where: Path) -> None:
        super().__init__(base=where)

    def create(self, run_id: int) -> RunCgroup | None:
        return RunCgroup(self.base / "missing" / f"run-{run_id}")  # type: ignore[operator]


def test_a_run_whose_cgroup_cannot_be_made_is_refused_and_never_runs(
    jc_sqlite: JC, tmp_path: Path
) -> None:
    jc = jc_sqlite
    worker = jc.runtime.worker
    assert worker is not None
    worker.containment = Containment(base=tmp_path / "no-such-hierarchy")
    ran = tmp_path / "ran"
    jc.create(task("t", f"touch {ran}", active=True))
    mark = jc.rec.mark()
    run_id = jc.run_now("t")
    done = jc.rec.run_finished("t", since=mark)
    assert done["exit_status"] == 125
    row = jc.run(run_id)
    assert row.state == "failed"
    assert row.reason == (
        f"cannot create cgroup {tmp_path}/no-such-hierarchy/run-{run_id}: No such file or directory"
    )
    assert not ran.exists()
    assert row.log_path is not None
    assert "jobcontrol: not started: cannot create cgroup" in Path(row.log_path).read_text()


def test_a_run_whose_shell_cannot_join_its_cgroup_is_refused_and_never_runs(
    jc_sqlite: JC, tmp_path: Path
) -> None:
    jc = jc_sqlite
    worker = jc.runtime.worker
    assert worker is not None
    worker.containment = _Unjoinable(tmp_path)
    ran = tmp_path / "ran"
    jc.create(task("t", f"touch {ran}", active=True))
    mark = jc.rec.mark()
    run_id = jc.run_now("t")
    jc.rec.run_finished("t", since=mark)
    row = jc.run(run_id)
    assert (row.state, row.exit_status) == ("failed", 125)
    assert row.reason is not None
    assert row.reason.startswith(
        "not started: cannot join its cgroup: /bin/sh: 1: cannot create "
    ), row.reason
    assert "Directory nonexistent" in row.reason
    assert not ran.exists()
    assert (row.cpu_us, row.mem_peak_bytes) == (None, None)


def test_a_task_exiting_125_by_itself_is_not_taken_for_a_refusal(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    jc.create(task("t", "echo fine; exit 125", active=True))
    mark = jc.rec.mark()
    run_id = jc.run_now("t")
    jc.rec.run_finished("t", since=mark)
    row = jc.run(run_id)
    assert (row.state, row.exit_status, row.reason) == ("failed", 125, None)


def test_a_contained_run_records_its_cpu_time_and_peak_memory(jc_sqlite: JC) -> None:
    jc = jc_sqlite
    containment = _worker_containment(jc)
    if not containment.enabled:
        pytest.skip(f"no cgroups here: {containment.describe()}")
    jc.create(task("t", "head -c 20000000 /dev/zero | od >/dev/null", active=True))
    mark = jc.rec.mark()
    run_id = jc.run_now("t")
    finished = jc.rec.run_finished("t", since=mark)
    row = jc.run(run_id)
    assert row.state == "succeeded"
    assert row.cpu_us is not None
    assert row.cpu_us > 0
    assert row.mem_peak_bytes is not None
    assert row.mem_peak_bytes > 0
    # The finished event carries them too (the Qt client's history updates from it).
    assert (finished["cpu_us"], finished["mem_peak_bytes"]) == (row.cpu_us, row.mem_peak_bytes)
    assert containment.base is not None
    assert not (containment.base / f"run-{run_id}").exists(), "removed after reading"


def test_migration_0004_adds_usage_and_containment_and_keeps_the_runs(db_url: str) -> None:
    engine = sa.create_engine(db_url, poolclass=sa.pool.NullPool)
    cfg = alembic_config(db_url)
    try:
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0003")
        with engine.begin() as conn:
            assert "cpu_us" not in {c["name"] for c in sa.inspect(conn).get_columns("run")}
            conn.execute(
                sa.text(
                    "INSERT INTO run (job_id, job_name, kind, trigger, state, queue, priority,"
                    " created, exit_status, kill_requested)"
                    " VALUES (1, 'old', 'task', 'manual', 'succeeded', 'default', 0,"
                    " CURRENT_TIMESTAMP, 0, false)"
                )
            )
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "0004")
        with engine.begin() as conn:
            old = conn.execute(sa.text("SELECT job_name, cpu_us, mem_peak_bytes FROM run")).one()
            assert tuple(old) == ("old", None, None)
            workers = {c["name"] for c in sa.inspect(conn).get_columns("worker")}
            assert "containment" in workers
        with engine.begin() as conn:
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0003")
        with engine.begin() as conn:
            assert "cpu_us" not in {c["name"] for c in sa.inspect(conn).get_columns("run")}
            assert conn.execute(sa.text("SELECT job_name FROM run")).scalar_one() == "old"
    finally:
        engine.dispose()


def test_a_task_that_cannot_start_leaves_no_cgroup_behind(jc_sqlite: JC, tmp_path: Path) -> None:
    jc = jc_sqlite
    containment = _worker_containment(jc)
    if not containment.enabled:
        pytest.skip(f"no cgroups here: {containment.describe()}")
    jc.create(task("t", "true", active=True, cwd=str(tmp_path / "no-such-dir")))
    mark = jc.rec.mark()
    run_id = jc.run_now("t")
    jc.rec.run_finished("t", since=mark)
    assert jc.run(run_id).exit_status == 127
    assert containment.base is not None
    assert not (containment.base / f"run-{run_id}").exists()


def test_a_sequence_leaves_no_cgroup_behind_and_records_each_tasks_usage(jc_sqlite: JC) -> None:
    """A sequence's task hands its cgroup on to be removed once the next task started;
    the last one's goes with its end. Each task's CPU time is still its own."""
    jc = jc_sqlite
    containment = _worker_containment(jc)
    if not containment.enabled:
        pytest.skip(f"no cgroups here: {containment.describe()}")
    assert containment.base is not None
    seen = jc.tmp_path / "seen"
    # Each task notes the run cgroups there are while it runs: its own, and at most the
    # one of the task before it (removed while this one runs, never left for later).
    look = f"ls -d {containment.base}/run-* | wc -l >> {seen}"
    jc.create(
        box("Seq", timer="every 10s", active=True),
        *(task(f"t{i}", look, "Seq", active=True) for i in range(1, 6)),
    )
    mark = jc.rec.mark()
    jc.advance(10)
    assert jc.rec.run_finished("Seq", since=mark)["exit_status"] == 0
    assert all(int(n) in (1, 2) for n in seen.read_text().split()), seen.read_text()
    runs = [jc.runs(f"t{i}")[0] for i in range(1, 6)]
    assert all(r.state == "succeeded" and r.cpu_us is not None for r in runs), runs
    assert sorted(containment.base.glob("run-*")) == []
