"""Secrets stay with the daemon's user: the real daemon and CLI, as an attacker on the
same machine would look at them (``ps``, a task's environment, file modes).

Each test starts its own daemon: what is checked is how it was started.
"""

from __future__ import annotations

import grp
import os
import pwd
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from jobcontrol.errors import OptionError
from jobcontrol.filemodes import LogAccess
from tests.acceptance.harness import JobControl, describe, pid_from, wait_until, write

MakeJC = Callable[[str], JobControl]

pytestmark = pytest.mark.timeout(180)

WAIT = 30.0
PASSWORD = "Pw-only-the-daemon-knows-3141"
TOKEN = "jc_the_daemons_token_never_for_tasks"

PRINTENV = """\
jobs:
  - name: printenv
    active: true
    env:
      GREETING: hello from the job
    command: env; echo password=hunter2; echo END-OF-TASK
"""


def task_log(jc: JobControl, job: str) -> Path:
    """Run ``job`` now through the daemon; the log of that run once the task has ended."""
    jc.ok("run", job)

    def finished() -> Path | None:
        for path in (jc.state_dir / "logs").glob("job-*/*.log"):
            if path.read_text().endswith("END-OF-TASK\n"):
                return path
        return None

    assert wait_until(finished, WAIT), f"no finished log of {job} in {jc.state_dir / 'logs'}"
    found = finished()
    assert found is not None
    return found


def task_env(jc: JobControl) -> dict[str, str]:
    """The environment the ``printenv`` task saw, from its log."""
    lines = task_log(jc, "printenv").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if "=" in line)


def mode(path: Path) -> int:
    return path.stat().st_mode & 0o777


# ---------------------------------------------------------------- ps


def test_a_detached_daemon_keeps_the_database_url_off_its_command_line(
    db_url: str, make_jc: MakeJC
) -> None:
    postgres = db_url.startswith("postgresql")
    # A real server under `trust` takes any password, so the URL can carry one as in production.
    url = (
        make_url(db_url).set(password=PASSWORD).render_as_string(hide_password=False)
        if postgres
        else db_url
    )
    jc = make_jc(url)
    started = jc.ok("daemon", "start")
    pid = pid_from(started.stdout)
    cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    assert "daemon run" in cmdline, cmdline
    assert "--db" not in cmdline, cmdline
    assert url not in cmdline, cmdline
    assert PASSWORD not in cmdline, cmdline
    if postgres:
        # The user's own command line showed it too (they typed it there): they are told.
        assert "--db puts the database password on the command line" in started.stderr
        assert "$JOBCONTROL_DB instead" in started.stderr

    # The daemon serves that database: found through it, with the password hidden.
    status = jc.ok("daemon", "status")
    assert status.stdout.startswith(f"daemon running: pid {pid}, "), describe(status)
    assert PASSWORD not in status.stdout
    # The safe way: the URL in $JOBCONTROL_DB, no warning, the same daemon.
    by_env = subprocess.run(
        [sys.executable, "-m", "jobcontrol", "--state-dir", str(jc.state_dir), "daemon", "status"],
        env={**jc.env, "JOBCONTROL_DB": url},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert by_env.returncode == 0, describe(by_env)
    assert by_env.stdout.startswith(f"daemon running: pid {pid}, "), describe(by_env)
    assert by_env.stderr == "", describe(by_env)


# ---------------------------------------------------------------- the tasks' environment


def test_tasks_get_a_clean_environment(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    daemon_env = {
        **jc.env,
        "JOBCONTROL_TOKEN": TOKEN,
        "NOTIFY_SOCKET": "/run/systemd/notify",
        "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI-the-daemons-secret",
    }
    jc.ok("daemon", "start", env=daemon_env)
    jc.ok("load", str(write(jc.base / "jobs.yaml", PRINTENV)))
    seen = task_env(jc)

    # Nothing of the daemon's own: not its database, token, systemd socket or other secrets.
    for name in ("JOBCONTROL_DB", "JOBCONTROL_TOKEN", "JOBCONTROL_PORT", "NOTIFY_SOCKET"):
        assert name not in seen, (name, seen)
    assert "AWS_SECRET_ACCESS_KEY" not in seen, seen
    assert "XDG_STATE_HOME" not in seen, seen
    assert "PYTHONUNBUFFERED" not in seen, seen
    assert TOKEN not in str(seen)
    assert "wJalrXUtnFEMI" not in str(seen)
    # The pass-through list, the job's env, and what Job Control sets for the run.
    assert seen["PATH"] == jc.env["PATH"]
    assert seen["HOME"] == jc.env["HOME"]
    assert seen["LANG"] == "C.UTF-8"
    assert seen["GREETING"] == "hello from the job"
    assert seen["JOBCONTROL_JOB"] == "printenv"
    assert seen["JOBCONTROL_RUN_ID"].isdigit()
    assert seen["JOBCONTROL_INSTANCE"] == jc.instance()  # the marker kill relies on
    assert seen["JOBCONTROL_LOG"].endswith(f"-run{seen['JOBCONTROL_RUN_ID']}.log")


@pytest.mark.parametrize("how", ["--pass-env", "JOBCONTROL_PASS_ENV"])
def test_the_pass_through_list_is_the_operators_to_choose(jc_sqlite: JobControl, how: str) -> None:
    jc = jc_sqlite
    listed = ["PATH,ORACLE_*", "JOBCONTROL_TOKEN,NOTIFY_SOCKET"]
    daemon_env = {
        **jc.env,
        "ORACLE_HOME": "/opt/oracle",
        "ORACLE_SID": "PROD",
        "OTHER": "not listed",
        "JOBCONTROL_TOKEN": TOKEN,
    }
    if how == "--pass-env":
        jc.ok("daemon", "start", "--pass-env", listed[0], "--pass-env", listed[1], env=daemon_env)
    else:
        jc.ok("daemon", "start", env={**daemon_env, "JOBCONTROL_PASS_ENV": ",".join(listed)})
    jc.ok("load", str(write(jc.base / "jobs.yaml", PRINTENV)))
    seen = task_env(jc)

    assert seen["ORACLE_HOME"] == "/opt/oracle", seen
    assert seen["ORACLE_SID"] == "PROD", seen
    assert seen["PATH"] == jc.env["PATH"]
    # The list replaces the default; the daemon's own never pass, even when listed.
    for name in (
        "HOME",
        "LANG",
        "OTHER",
        "JOBCONTROL_TOKEN",
        "NOTIFY_SOCKET",
        "JOBCONTROL_PASS_ENV",
    ):
        assert name not in seen, (name, seen)
    daemon_log = next(jc.state_dir.glob("daemon-*.log")).read_text()
    assert "the pass-through list names JOBCONTROL_TOKEN, which is never passed" in daemon_log


def test_a_bad_pass_through_list_or_log_group_starts_nothing(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    option = jc.fails("daemon", "start", "--pass-env", "PATH,FOO-BAR")
    assert (
        "jobcontrol: --pass-env: 'FOO-BAR' is neither a variable name nor a PREFIX* pattern"
        in option.stderr
    ), describe(option)
    variable = jc.fails("daemon", "start", env={**jc.env, "JOBCONTROL_PASS_ENV": "PATH HOME"})
    assert "jobcontrol: JOBCONTROL_PASS_ENV: 'PATH HOME' is neither" in variable.stderr
    group = jc.fails("daemon", "start", "--log-group", "no-such-group-jc")
    assert "jobcontrol: --log-group 'no-such-group-jc': no such group" in group.stderr
    assert jc.live_daemons() == []


# ---------------------------------------------------------------- file modes


def test_what_the_daemon_writes_is_private_under_umask_022(tmp_path: Path, make_jc: MakeJC) -> None:
    db = tmp_path / "data" / "jobcontrol.db"  # nor the file nor its directory exist yet
    jc = make_jc(f"sqlite:///{db}")
    jc.ok("daemon", "start", umask=0o022)
    jc.ok("load", str(write(jc.base / "jobs.yaml", PRINTENV)))
    log = task_log(jc, "printenv")
    assert "password=hunter2" in log.read_text()

    state = jc.state_dir
    found = {
        "database directory": (db.parent, 0o700),
        "database": (db, 0o600),
        "its WAL": (Path(f"{db}-wal"), 0o600),
        "its shared memory": (Path(f"{db}-shm"), 0o600),
        "its daemon lock": (Path(f"{db}.daemon.lock"), 0o600),
        "state directory": (state, 0o700),
        "daemon log": (next(state.glob("daemon-*.log")), 0o600),
        "pid file": (next(state.glob("daemon-*.pid")), 0o600),
        "URL file": (next(state.glob("daemon-*.url")), 0o600),
        "log root": (state / "logs", 0o700),
        "job log directory": (log.parent, 0o700),
        "task log": (log, 0o600),
    }
    modes = {what: oct(mode(path)) for what, (path, _) in found.items()}
    assert modes == {what: oct(want) for what, (_, want) in found.items()}

    # The offline CLI creates a database as privately.
    other = make_jc(f"sqlite:///{tmp_path / 'offline' / 'other.db'}")
    other.ok("db", "upgrade", umask=0o022)
    assert oct(mode(tmp_path / "offline" / "other.db")) == oct(0o600)
    assert oct(mode(tmp_path / "offline")) == oct(0o700)


def _a_group_of_ours() -> grp.struct_group:
    """A group the daemon's user may give files to, other than its own if it can."""
    primary = os.getgid()
    if os.geteuid() == 0:
        others = [g for g in grp.getgrall() if g.gr_gid != primary]
        return others[0] if others else grp.getgrgid(primary)
    extra = [gid for gid in os.getgroups() if gid != primary]
    return grp.getgrgid(extra[0] if extra else primary)


def test_log_group_lets_one_group_read_the_task_logs(sqlite_url: str, make_jc: MakeJC) -> None:
    group = _a_group_of_ours()
    jc = make_jc(sqlite_url)
    # Even under a umask that would take the group's bits away.
    jc.ok("daemon", "start", "--log-group", group.gr_name, umask=0o077)
    jc.ok("load", str(write(jc.base / "jobs.yaml", PRINTENV)))
    log = task_log(jc, "printenv")

    state = jc.state_dir
    shared = {
        "state directory (passed through, not listed)": (state, 0o710),
        "log root": (state / "logs", 0o750),
        "job log directory": (log.parent, 0o750),
        "task log": (log, 0o640),
    }
    seen = {what: (oct(mode(p)), p.stat().st_gid) for what, (p, _) in shared.items()}
    assert seen == {what: (oct(want), group.gr_gid) for what, (_, want) in shared.items()}
    # Nothing else is the group's.
    db = Path(make_url(sqlite_url).database or "")
    assert oct(mode(db)) == oct(0o600)
    assert oct(mode(next(state.glob("daemon-*.log")))) == oct(0o600)


def test_what_exists_keeps_its_mode_and_the_daemon_says_so(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    group = _a_group_of_ours()
    db = Path(make_url(jc.url).database or "")
    state, logs = jc.state_dir, jc.state_dir / "logs"
    job_dir = logs / "job-1"  # the first job's, from an older daemon
    job_dir.mkdir(parents=True)
    for path, was in ((db, 0o644), (state, 0o755), (logs, 0o700), (job_dir, 0o755)):
        path.chmod(was)
    old_log = job_dir / "20261201-120000-run1.log"  # written before --log-group
    old_log.write_text("older output\n")
    old_log.chmod(0o600)
    elsewhere = jc.base / "not-a-log"
    elsewhere.write_text("someone's file\n")
    elsewhere.chmod(0o600)
    (job_dir / "20261201-120001-run2.log").symlink_to(elsewhere)  # never followed

    started = jc.ok("daemon", "start", "--log-group", group.gr_name)
    warnings = started.stderr
    assert f"{db} is mode 0644, open to its group and all users: `chmod 600 {db}`" in warnings
    assert f"{state} is mode 0755, open to its group and all users: `chmod 710 {state}`" in warnings
    assert f"members of group {group.gr_name} cannot reach the task logs: {logs} is mode 0700" in (
        warnings
    )
    daemon_log = next(state.glob("daemon-*.log")).read_text()
    assert f"{db} is mode 0644" in daemon_log
    # Someone may share those on purpose: left as they were. The job log directory is
    # Job Control's own: it follows --log-group.
    kept = {path: oct(mode(path)) for path in (db, state, logs)}
    assert kept == {db: oct(0o644), state: oct(0o755), logs: oct(0o700)}
    assert (oct(mode(job_dir)), job_dir.stat().st_gid) == (oct(0o750), group.gr_gid)
    # ...and so do the logs already in it: the group reads them too.
    assert (oct(mode(old_log)), old_log.stat().st_gid) == (oct(0o640), group.gr_gid)
    assert (oct(mode(elsewhere)), elsewhere.stat().st_gid) == (oct(0o600), os.getgid())
    # Without --log-group again, they are the daemon's user's alone again.
    jc.ok("daemon", "stop")
    jc.ok("daemon", "start")
    assert oct(mode(old_log)) == oct(0o600)
    assert oct(mode(job_dir)) == oct(0o700)
    jc.ok("daemon", "stop")


def test_a_log_root_elsewhere_behind_a_closed_directory_is_warned_about(
    jc_sqlite: JobControl,
) -> None:
    """The group could not pass a private directory above a --log-root elsewhere, and no
    start said so (the state directory's own case was said)."""
    jc = jc_sqlite.upgraded()
    group = _a_group_of_ours()
    closed = jc.base / "closed"
    closed.mkdir(mode=0o700)
    closed.chmod(0o700)
    root = closed / "sub"
    started = jc.ok("daemon", "start", "--log-group", group.gr_name, "--log-root", str(root))
    assert (
        f"members of group {group.gr_name} cannot reach the task logs: {closed} is mode 0700"
        in started.stderr
    ), describe(started)
    assert f"{closed} is mode 0700" in next(jc.state_dir.glob("daemon-*.log")).read_text()
    jc.ok("daemon", "stop")


# ---------------------------------------------------------------- the CLI's --token


def test_a_token_on_the_command_line_draws_a_warning(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    token = "jc_" + "t" * 43
    given = jc.ok("--token", token, "ls")
    token_file = jc.token_file
    assert "warning: --token puts the token on the command line" in given.stderr
    assert "$JOBCONTROL_TOKEN" in given.stderr
    assert str(token_file) in given.stderr
    assert token not in given.stderr
    quiet = jc.ok("ls", env={**jc.env, "JOBCONTROL_TOKEN": token})
    assert quiet.stderr == "", describe(quiet)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_log_group_the_daemons_user_is_not_in_is_refused() -> None:
    """A user who is not in the group cannot give it the logs: refused with a reason.

    The check runs in a forked child that became ``nobody`` for real (setgroups, setgid,
    setuid); the interpreter cannot be exec'd as nobody here (it lives under /root).
    """
    nobody = pwd.getpwnam("nobody")
    if nobody.pw_name in grp.getgrnam("root").gr_mem or nobody.pw_gid == 0:
        pytest.skip("nobody is in the root group here")
    read, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: become nobody, try, report, exit without cleanup
        code = 1
        try:
            os.close(read)
            os.setgroups([])
            os.setgid(nobody.pw_gid)
            os.setuid(nobody.pw_uid)
            try:
                LogAccess.for_group("root")
                message = "accepted"
            except OptionError as exc:
                message = str(exc)
            os.write(write_end, message.encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    with os.fdopen(read, "rb") as f:
        said = f.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, said
    assert said == (
        "--log-group 'root': the daemon's user (nobody) is not a member of that group, "
        "so it cannot give the logs to it"
    )


# ---------------------------------------------------------------- the CLI's --db


@pytest.mark.parametrize(
    "url",
    [
        "postgresql+psycopg://jc:Qs3cret@127.0.0.1:1/jobs?connect_timeout=2",
        "postgresql+psycopg://jc@127.0.0.1:1/jobs?password=Qs3cret&connect_timeout=2",
        "postgresql+psycopg:///jobs?host=127.0.0.1&port=1&user=jc&password=Qs3cret",
    ],
    ids=["before-the-host", "in-the-query", "all-in-the-query"],
)
def test_a_password_in_db_draws_a_warning_and_never_shows(jc_sqlite: JobControl, url: str) -> None:
    """libpq takes a password before the host or as ``password=``: either is a secret
    on the command line, and neither is printed back (no server answers on port 1)."""
    jc = jc_sqlite
    refused = jc.bare("--db", url, "--state-dir", jc.state_dir, "ls")
    assert refused.returncode != 0, describe(refused)
    assert "warning: --db puts the database password on the command line" in refused.stderr
    assert "cannot reach the database postgresql+psycopg://" in refused.stderr, describe(refused)
    assert "Qs3cret" not in refused.stdout + refused.stderr, describe(refused)
