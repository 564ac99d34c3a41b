"""``jobcontrol db copy`` and ``db backup`` as an operator uses them, with the real daemon."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.harness import (
    JobControl,
    describe,
    instance_id,
    pid_from,
    wait_until,
    write,
)

WAIT = 30.0

JOBS = """\
jobs:
  - name: Nightly
    active: true
    on_error: continue
    children:
      - name: Prepare
        active: true
        children:
          - name: ok
            active: true
            command: echo fine
      - name: broken
        active: true
        command: echo failing >&2; exit 3
        env:
          SECRET: hunter2
  - name: Weekly
    timer: cron 0 3 * * 0
    children:
      - name: later
        command: "true"
"""

# Moved under a box made after it: its parent's id is larger than its own.
LONG_TASK = """\
jobs:
  - name: Long
    active: true
    children:
      - {name: long, active: true, command: "sleep 300"}
"""

MOVED = """\
jobs:
  - name: Late
    active: true
    children:
      - name: Prepare
        active: true
        children:
          - name: ok
            active: true
            command: echo fine
"""


def finished(jc: JobControl, job: str, count: int) -> bool:
    runs = jc.history(job)
    return len(runs) >= count and all(run["state"] != "running" for run in runs)


def snapshot(jc: JobControl, url: str) -> dict[str, Any]:
    """What the database holds, as the offline CLI shows it (no daemon running)."""
    found: dict[str, Any] = {}
    for name, args in {
        "export": ["export"],
        "ls": ["ls", "--json"],
        "nightly": ["history", "Nightly", "--json", "--limit", "100"],
        "broken": ["history", "broken", "--json", "--limit", "100"],
        "ok": ["history", "ok", "--json", "--limit", "100"],
        "users": ["user", "list", "--json"],
        "audit": ["audit", "--json", "--limit", "1000"],
        "workers": ["workers", "--json"],
        "lanes": ["lanes", "--json"],
    }.items():
        result = jc.bare("--db", url, "--state-dir", jc.state_dir, *args)
        assert result.returncode == 0, describe(result)
        found[name] = result.stdout if name == "export" else json.loads(result.stdout)
    for worker in found["workers"]:
        worker.pop("heartbeat_age_s")  # counted from now
    for lane in found["lanes"]:
        lane.pop("oldest_wait_s")  # counted from now
    return found


@pytest.fixture
def history_db(jc_sqlite: JobControl) -> JobControl:
    """A SQLite database with trees, a second user, runs that succeeded and failed (with
    logs), an audit trail and a worker: everything a copy must carry."""
    jc = jc_sqlite
    jc.upgraded().load(write(jc.base / "jobs.yaml", JOBS))
    jc.ok("daemon", "start")  # first start: user admin, its token in the token file
    jc.ok("user", "add", "olivia", "--role", "operator")
    for count in (1, 2):
        jc.ok("run", "Nightly")
        assert wait_until(lambda n=count: finished(jc, "Nightly", n), WAIT)
    jc.ok("set", "Weekly", "description=weekly work")
    jc.ok("lane", "add", "batch", "max_slots=2", "poll=5s")
    jc.ok("lane", "set", "default", "stale=2m")
    jc.ok("daemon", "stop")
    return jc


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def target_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/copy/jobcontrol.db"  # not there yet: the copy makes it
    url: str = request.getfixturevalue("postgres_url")  # made by createdb, no tables
    return url


@pytest.fixture
def beside(history_db: JobControl) -> Iterator[Callable[[str], JobControl]]:
    """``beside(url)``: the same user (HOME, state dir) on another database."""
    made: list[JobControl] = []

    def make(url: str) -> JobControl:
        other = JobControl(url, history_db.base)
        other.state_dir = history_db.state_dir
        made.append(other)
        return other

    yield make
    problems = [problem for other in made for problem in other.cleanup()]
    assert not problems, "\n".join(problems)


@pytest.mark.timeout(240)
def test_copy_carries_the_whole_history_and_the_target_runs_on(
    history_db: JobControl, target_url: str, beside: Callable[[str], JobControl]
) -> None:
    jc = history_db
    before = snapshot(jc, jc.url)
    assert len(before["nightly"]) == 2, before["nightly"]
    assert {run["exit_status"] for run in before["broken"]} == {3}

    copied = jc.ok("db", "copy", "--to", target_url)
    assert "2 app_user" in copied.stdout, describe(copied)
    assert "the token in" in copied.stdout, describe(copied)
    after = snapshot(jc, target_url)
    for name, value in before.items():
        assert after[name] == value, name  # same ids, times, states, users, audit
    assert snapshot(jc, jc.url) == before, "the source is left as it was"

    # The copy is a working database: its daemon starts, the old token file's token is
    # valid there, and new runs get ids after the copied ones (sequences moved on).
    target = beside(target_url)
    last = max(run["id"] for name in ("nightly", "broken", "ok") for run in before[name])
    pid_from(target.ok("daemon", "start").stdout)
    target.ok("run", "Nightly")
    assert wait_until(lambda: finished(target, "Nightly", 3), WAIT)
    listing = target.ok("ls")  # online: through the daemon, with the copied token file
    assert "Nightly" in listing.stdout, describe(listing)
    runs = target.history("Nightly")
    assert runs[1:] == before["nightly"], runs
    assert runs[0]["id"] > last, (runs[0], last)
    olivia = target.ok("user", "add", "peter", "--role", "viewer")
    assert "added user 'peter'" in olivia.stdout, describe(olivia)
    target.ok("daemon", "stop")


@pytest.mark.timeout(120)
def test_copy_keeps_a_job_moved_under_a_newer_box(jc_sqlite: JobControl, tmp_path: Path) -> None:
    jc = jc_sqlite
    jc.upgraded().load(write(jc.base / "jobs.yaml", JOBS))
    jc.load(write(jc.base / "moved.yaml", MOVED))  # Prepare moves under the new box Late
    target = f"sqlite:///{tmp_path}/moved.db"
    prepared = jc.bare("--db", target, "db", "upgrade")  # an empty, upgraded target
    assert prepared.returncode == 0, describe(prepared)
    jc.ok("db", "copy", "--to", target)
    exported = jc.bare("--db", target, "export")
    assert exported.stdout == jc.ok("export").stdout, describe(exported)
    # The copy is a database of its own: its instance id (its processes' marker, its
    # cgroups' name) is not the source's, so neither daemon takes the other's tasks for
    # its own leftovers.
    assert instance_id(target) not in (None, jc.instance())


@pytest.mark.timeout(120)
def test_a_copy_and_its_source_each_run_their_own_tasks(
    history_db: JobControl, tmp_path: Path, beside: Callable[[str], JobControl]
) -> None:
    """A copy that kept its source's instance id shared its cgroup and marker: a daemon
    starting on the source killed a task running on the copy as its own leftover."""
    jc = history_db
    jc.load(write(jc.base / "long.yaml", LONG_TASK))
    target_url = f"sqlite:///{tmp_path}/copy.db"
    jc.ok("db", "copy", "--to", target_url)
    copy = beside(target_url)
    copy.ok("daemon", "start")
    try:
        copy.ok("run", "Long")
        assert wait_until(lambda: [r["state"] for r in copy.history("long")] == ["running"], WAIT)
        jc.ok("daemon", "start")  # the source's daemon: its start-up recovery runs
        jc.ok("daemon", "stop")
        assert [r["state"] for r in copy.history("long")] == ["running"], copy.history("long")
        assert copy.marked(), "the copy's task still runs"
    finally:
        copy.ok("daemon", "stop", "--kill")


def files_of(url: str) -> tuple[str, list[str]]:
    """A SQLite database as it is on disk: its file's digest and every row it holds
    (reading a WAL database makes its -wal and -shm files, empty of changes)."""
    path = Path(url.removeprefix("sqlite:///"))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    with contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)) as conn:
        return digest, list(conn.iterdump())


@pytest.mark.timeout(180)
def test_copy_refusals_change_nothing(
    history_db: JobControl, tmp_path: Path, beside: Callable[[str], JobControl]
) -> None:
    jc = history_db
    # A target that holds a job already.
    used = beside(f"sqlite:///{tmp_path}/used.db")
    used.upgraded().load(write(tmp_path / "one.yaml", MOVED))
    kept = files_of(used.url)
    refused = jc.fails("db", "copy", "--to", used.url)
    assert "is not empty (1 in audit, 3 in job)" in refused.stderr, describe(refused)
    assert "nothing was copied" in refused.stderr, describe(refused)
    assert files_of(used.url) == kept

    # Someone else's database.
    foreign = tmp_path / "foreign.db"
    with sqlite3.connect(foreign) as conn:
        conn.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY)")
    kept = files_of(f"sqlite:///{foreign}")
    refused = jc.fails("db", "copy", "--to", str(foreign))
    assert "tables that are not Job Control's (invoices)" in refused.stderr, describe(refused)
    assert files_of(f"sqlite:///{foreign}") == kept

    # The same database, and a source whose daemon runs: the target is not even made.
    same = jc.fails("db", "copy", "--to", jc.url)
    assert "same database" in same.stderr, describe(same)
    fresh = tmp_path / "fresh" / "jobcontrol.db"
    jc.ok("daemon", "start")
    running = jc.fails("db", "copy", "--to", str(fresh))
    assert "a daemon is running on the source" in running.stderr, describe(running)
    assert "nothing was copied" in running.stderr, describe(running)
    assert not fresh.parent.exists(), "a refused copy must make nothing"

    # A target whose daemon runs.
    target = beside(f"sqlite:///{tmp_path}/busy.db")
    target.ok("daemon", "start", state_dir=tmp_path / "busy-state")
    jc.ok("daemon", "stop")
    busy = jc.fails("db", "copy", "--to", target.url)
    assert "a daemon is running on the target" in busy.stderr, describe(busy)
    target.ok("daemon", "stop", state_dir=tmp_path / "busy-state")
    assert target.json("ls") == [], "the target stayed empty"


@pytest.mark.timeout(120)
def test_backup_while_the_daemon_runs(history_db: JobControl, tmp_path: Path) -> None:
    jc = history_db
    jc.ok("daemon", "start")
    jc.ok("run", "Nightly")
    assert wait_until(lambda: finished(jc, "Nightly", 3), WAIT)
    dest = tmp_path / "backups" / "jc.db"
    dest.parent.mkdir()
    made = jc.ok("db", "backup", str(dest))
    assert f"to {dest}" in made.stdout, describe(made)
    assert stat.S_IMODE(dest.stat().st_mode) == 0o600, oct(dest.stat().st_mode)
    online = jc.ok("history", "Nightly", "--json")  # through the daemon
    jc.ok("daemon", "stop")
    offline = jc.bare("--db", str(dest), "history", "Nightly", "--json")
    assert offline.returncode == 0, describe(offline)
    assert json.loads(offline.stdout) == json.loads(online.stdout)

    # A file that is there is never overwritten.
    kept = dest.read_bytes()
    again = jc.fails("db", "backup", str(dest))
    assert f"{dest} exists" in again.stderr, describe(again)
    assert dest.read_bytes() == kept


@pytest.mark.timeout(60)
def test_a_backup_is_never_written_through_a_link_or_where_another_user_can_redirect_it(
    history_db: JobControl, tmp_path: Path
) -> None:
    """Another local user planted a link that points nowhere yet where the backup is to
    go: followed, it wrote the database (every job's env, every token hash) to a file
    of theirs, world-readable."""
    jc = history_db
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o755)
    planted = tmp_path / "backups" / "jc.db"
    planted.parent.mkdir()
    planted.symlink_to(theirs / "stolen.db")
    refused = jc.fails("db", "backup", str(planted))
    assert f"{planted} is a symbolic link" in refused.stderr, describe(refused)
    assert not (theirs / "stolen.db").exists()

    # A directory another user owns (or may write to without the sticky bit): they could
    # swap the new file for such a link while it is written.
    other = tmp_path / "other"
    other.mkdir(mode=0o755)
    os.chown(other, 54321, 54321)
    refused = jc.fails("db", "backup", str(other / "jc.db"))
    assert "belongs to another user (uid 54321)" in refused.stderr, describe(refused)
    assert list(other.iterdir()) == []
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    refused = jc.fails("db", "backup", str(shared / "jc.db"))
    assert "may be written by others (mode 0777) and has no sticky bit" in refused.stderr
    assert list(shared.iterdir()) == []
    shared.chmod(0o1777)  # as /tmp: only a file's owner may rename or remove it
    made = jc.ok("db", "backup", str(shared / "jc.db"))
    assert stat.S_IMODE((shared / "jc.db").stat().st_mode) == 0o600, describe(made)

    # A copy's target likewise.
    link = tmp_path / "copy.db"
    link.symlink_to(theirs / "copied.db")
    copy = jc.fails("db", "copy", "--to", f"sqlite:///{link}")
    assert f"{link} is a symbolic link" in copy.stderr, describe(copy)
    assert not (theirs / "copied.db").exists()


@pytest.mark.postgres
@pytest.mark.timeout(60)
def test_backup_of_postgresql_points_to_pg_dump(
    postgres_url: str, make_jc: Callable[[str], JobControl], tmp_path: Path
) -> None:
    jc = make_jc(postgres_url).upgraded()
    refused = jc.fails("db", "backup", str(tmp_path / "pg.db"))
    assert "pg_dump" in refused.stderr, describe(refused)
    assert not (tmp_path / "pg.db").exists()


@pytest.mark.timeout(120)
def test_upgrade_waits_for_the_daemon_of_an_older_schema_to_stop(jc_sqlite: JobControl) -> None:
    from alembic import command

    from jobcontrol.daemon import DatabaseLease
    from jobcontrol.service.dbcopy import head_revision
    from jobcontrol.store import Store, alembic_config

    head = head_revision()
    jc = jc_sqlite.upgraded()
    store = Store(jc.url)
    try:
        with store.engine.begin() as conn:  # as an older version left it
            cfg = alembic_config(jc.url)
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0003")  # any revision before the newest
        # An offline read of the older schema says what it is, not a missing column.
        for command_line in (("ls",), ("history", "x"), ("export",)):
            stale = jc.fails(*command_line)
            assert "is at schema revision 0003" in stale.stderr, describe(stale)
            assert "run `jobcontrol db upgrade`" in stale.stderr, describe(stale)
            assert "no such column" not in stale.stderr
        daemon = DatabaseLease(store)  # what an older daemon holds while it runs
        daemon.acquire()
        try:
            refused = jc.fails("db", "upgrade")
            assert "a daemon is running on" in refused.stderr, describe(refused)
            assert "at revision 0003" in refused.stderr, describe(refused)
            assert store.current_revision() == "0003", "a refused upgrade changes nothing"
        finally:
            daemon.release()
        upgraded = jc.ok("db", "upgrade")
        assert upgraded.stdout.rstrip().endswith(f"is at revision {head}"), describe(upgraded)
        # At the newest revision, running it again with a daemon up is harmless.
        pid_from(jc.ok("daemon", "start").stdout)
        again = jc.ok("db", "upgrade")
        assert again.stdout.rstrip().endswith(f"is at revision {head}"), describe(again)
        jc.ok("daemon", "stop")
    finally:
        store.dispose()
