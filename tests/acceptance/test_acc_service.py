"""Running Job Control as a service: the detached daemon's log, JSON logs, the systemd unit."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from datetime import datetime, timedelta
from pathlib import Path

import pytest

from jobcontrol import procs
from tests.acceptance.harness import ROOT, JobControl, describe, pid_from, wait_until, write

TICK = """\
jobs:
  - name: Tick
    active: true
    children:
      - name: tick
        active: true
        command: echo tick
"""


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """An AF_UNIX datagram socket standing in for systemd's $NOTIFY_SOCKET."""
    with tempfile.TemporaryDirectory(prefix="jc-notify-") as tmp:  # short: sun_path is 108 bytes
        address = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(address)
        sock.setblocking(False)
        try:
            yield sock, address
        finally:
            sock.close()


@pytest.mark.timeout(120)
def test_daemon_start_and_stop_leave_no_notify_warning_in_the_log(
    jc_sqlite: JobControl, notify_socket: tuple[socket.socket, str]
) -> None:
    jc = jc_sqlite
    sock, address = notify_socket
    # `daemon start` run by a service manager: the detached daemon is not that service.
    started = jc.ok("daemon", "start", env={**jc.env, "NOTIFY_SOCKET": address})
    pid = pid_from(started.stdout)
    stopped = jc.ok("daemon", "stop")
    assert stopped.stdout == f"daemon stopped (pid {pid})\n", describe(stopped)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)  # nothing was sent to the caller's notify socket

    (log_file,) = jc.state_dir.glob("daemon-*.log")
    log = log_file.read_text()
    assert "JobControl terminated." in log, log
    # `start` listened for READY=1 on a socket of its own, gone once it returned: the
    # daemon must not try to tell it STOPPING=1 (or anything else) at the end.
    assert "sd_notify" not in log, log
    assert "STOPPING" not in log, log
    assert "jobcontrol.procs" not in log, log


@pytest.mark.timeout(120)
def test_daemon_logs_one_json_object_per_line(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    refused = jc.fails("daemon", "start", "--log-format", "xml")
    assert "--log-format" in refused.stderr, describe(refused)
    assert not jc.state_dir.exists(), "a refused start must make nothing"

    jc.upgraded().load(write(jc.base / "jobs.yaml", TICK))
    started = jc.ok("daemon", "start", "--log-format", "json")
    pid = pid_from(started.stdout)
    jc.ok("run", "Tick")
    # A malformed request: uvicorn's own warning must come out as JSON too.
    match = re.search(r"admin API: http://([\d.]+):(\d+)/", started.stdout)
    assert match is not None, describe(started)
    with socket.create_connection((match[1], int(match[2])), timeout=10) as client:
        client.sendall(b"GARBAGE \x00 nonsense\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 400")
    assert wait_until(
        lambda: jc.history("tick") and jc.history("tick")[0]["state"] != "running", 30
    )
    jc.ok("daemon", "stop")
    assert not procs.pid_alive(pid)

    (log_file,) = jc.state_dir.glob("daemon-*.log")
    lines = log_file.read_text().splitlines()
    assert len(lines) > 5, lines
    entries = [json.loads(line) for line in lines]  # every line, nothing but JSON
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
        when = datetime.fromisoformat(entry["time"])
        assert when.utcoffset() == timedelta(0), entry
        assert entry["pid"] == pid, entry
    messages = {entry["message"] for entry in entries}
    assert "JobControl terminated." in messages, messages
    loggers = {entry["logger"] for entry in entries}
    assert {"jobcontrol.daemon", "jobcontrol.api.server", "uvicorn.error"} <= loggers, loggers
    levels = {entry["level"] for entry in entries}
    assert levels <= {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}, levels


CONTRIB_UNIT = ROOT / "contrib" / "systemd" / "jobcontrol.service"


def verify_unit(path: Path) -> None:
    """``systemd-analyze verify``: the unit parses, every key is known, ExecStart exists."""
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is not installed (.ci/run installs it as root)")
    checked = subprocess.run(
        [analyze, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    assert (checked.returncode, checked.stderr) == (0, ""), path.read_text() + checked.stderr


# What the daemon's and a worker's units both set (each adds its own).
SERVICE = {
    "Type": "notify",
    "NotifyAccess": "main",
    "KillMode": "mixed",
    "Delegate": "yes",
    "User": "jobcontrol",
    "StateDirectory": "jobcontrol",
    "Restart": "on-failure",
}


def verified_settings(text: str, path: Path) -> dict[str, list[str]]:
    """The unit ``text``, written to ``path`` and verified: its settings."""
    path.write_text(text)
    verify_unit(path)
    return unit_settings(text)


def assert_settings(settings: dict[str, list[str]], expected: dict[str, str], text: str) -> None:
    """Each of ``expected`` is set once, to its value."""
    for key, value in expected.items():
        assert settings.get(key) == [value], (key, text)


def unit_settings(text: str) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        if "=" in line and not line.startswith("#"):
            key, value = line.split("=", 1)
            found.setdefault(key, []).append(value)
    return found


@pytest.mark.timeout(60)
def test_daemon_unit_prints_a_unit_systemd_accepts(jc_sqlite: JobControl, tmp_path: Path) -> None:
    jc = jc_sqlite
    made = jc.bare("daemon", "unit")
    assert made.returncode == 0, describe(made)
    assert made.stderr == "", describe(made)
    settings = verified_settings(made.stdout, tmp_path / "jobcontrol-test.service")
    assert_settings(
        settings,
        {
            **SERVICE,
            "Group": "jobcontrol",
            "StateDirectoryMode": "0700",
            "NoNewPrivileges": "yes",
            "ProtectSystem": "full",
        },
        made.stdout,
    )
    # Nothing that would break tasks: /tmp is the machine's, the cgroup tree is writable.
    for key in ("PrivateTmp", "ProtectControlGroups", "DynamicUser", "PrivateDevices"):
        assert key not in settings, (key, made.stdout)
    (exec_start,) = settings["ExecStart"]
    words = shlex.split(exec_start)
    assert Path(words[0]).resolve() == (Path(sys.executable).parent / "jobcontrol").resolve()
    assert words[1:] == [
        "--state-dir",
        "/var/lib/jobcontrol",
        "--db",
        "/var/lib/jobcontrol/jobcontrol.db",
        "daemon",
        "run",
    ], words
    assert settings["Environment"] == ["XDG_CONFIG_HOME=/var/lib/jobcontrol"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql+psycopg://jc:s3cret@db.example:5432/jobs",
            "postgresql+psycopg://jc:***@db.example:5432/jobs",
        ),
        # libpq takes the password from the query too.
        (
            "postgresql+psycopg://jc@db.example:5432/jobs?password=s3cret",
            "postgresql+psycopg://jc@db.example:5432/jobs?password=***",
        ),
    ],
    ids=["before-the-host", "in-the-query"],
)
def test_daemon_unit_keeps_the_database_password_out_of_the_unit(
    jc_sqlite: JobControl, tmp_path: Path, url: str, shown: str
) -> None:
    jc = jc_sqlite
    state = tmp_path / "state dir %d"
    env = {**jc.env, "JOBCONTROL_DB": url}
    made = jc.bare("--state-dir", state, "daemon", "unit", "--user", "batch", env=env)
    assert made.returncode == 0, describe(made)
    assert "s3cret" not in made.stdout + made.stderr, describe(made)
    assert f"JOBCONTROL_DB={shown}" in made.stderr
    assert "/etc/jobcontrol/jobcontrol.env" in made.stderr, describe(made)
    settings = verified_settings(made.stdout, tmp_path / "jobcontrol-pg.service")
    assert settings["User"] == ["batch"]
    # Required, not optional ('-'): without it the daemon ran on a new default SQLite
    # database, and systemd said the service was active.
    assert settings["EnvironmentFile"] == ["/etc/jobcontrol/jobcontrol.env"]
    assert "postgresql.service" in settings["After"][0]
    assert "StateDirectory" not in settings, "a state directory of the user's own is theirs"
    (exec_start,) = settings["ExecStart"]
    assert "--db" not in exec_start, exec_start
    # systemd expands % (and $ in ExecStart): a path holding them is written escaped.
    assert shlex.split(exec_start)[1:3] == ["--state-dir", f"{tmp_path}/state dir %%d"]
    assert settings["Environment"] == [f'"XDG_CONFIG_HOME={tmp_path}/state dir %%d"']
    assert not state.exists(), "printing a unit makes nothing"


def test_a_unit_for_a_user_name_systemd_cannot_take_is_refused(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    for command in (
        ["daemon", "unit"],
        ["--db", "postgresql+psycopg://w@db.example/jobs", "worker", "unit", "--name", "b1"],
    ):
        for user in ("bad user;x", "x y", "-rf", "1abc", "a" * 32):
            made = jc.bare(*command, f"--user={user}")
            assert made.returncode == 1, describe(made)
            assert made.stdout == "", describe(made)
            assert made.stderr.startswith(
                f"jobcontrol: --user {user!r}: not a user name systemd takes"
            ), describe(made)
        for user in ("batch", "svc.jobs", "_jc", "1001"):
            made = jc.bare(*command, "--user", user)
            assert made.returncode == 0, describe(made)
            assert f"\nUser={user}\n" in made.stdout, describe(made)


def test_the_shipped_unit_is_what_daemon_unit_prints(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    made = jc.bare("daemon", "unit", "--command", "/usr/local/bin/jobcontrol")
    assert made.returncode == 0, describe(made)
    assert CONTRIB_UNIT.read_text() == made.stdout, (
        "contrib/systemd/jobcontrol.service is out of date: regenerate it with "
        "`jobcontrol daemon unit --command /usr/local/bin/jobcontrol`"
    )


@pytest.mark.timeout(60)
def test_worker_unit_prints_a_unit_that_drains_then_kills_and_keeps_the_password_out(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    jc = jc_sqlite
    env = {**jc.env, "JOBCONTROL_DB": "postgresql+psycopg://w_b1:s3cret@db.example:5432/jobs"}
    made = jc.bare(
        "worker",
        "unit",
        "--name",
        "build-1",
        "--queues",
        "fast_lane:1 manual,*:4",
        "--drain-timeout",
        "10m",
        "--pass-env",
        "PATH,LC_*",
        env=env,
    )
    assert made.returncode == 0, describe(made)
    assert "s3cret" not in made.stdout + made.stderr, describe(made)
    assert "JOBCONTROL_DB=postgresql+psycopg://w_b1:***@db.example:5432/jobs" in made.stderr
    assert "/etc/jobcontrol/worker.env" in made.stderr, describe(made)
    settings = verified_settings(made.stdout, tmp_path / "jobcontrol-worker.service")
    assert_settings(
        settings,
        {
            **SERVICE,
            "EnvironmentFile": "/etc/jobcontrol/worker.env",  # holds the database: needed
            "TimeoutStartSec": "infinity",
            # The drain, then the kill's grace and the recording, before systemd's SIGKILL.
            "TimeoutStopSec": "660",
        },
        made.stdout,
    )
    (exec_start,) = settings["ExecStart"]
    words = shlex.split(exec_start)
    assert Path(words[0]).resolve() == (Path(sys.executable).parent / "jobcontrol").resolve()
    assert words[1:] == [
        "--state-dir",
        "/var/lib/jobcontrol",
        "worker",
        "run",
        "--name",
        "build-1",
        "--queues",
        "fast_lane:1 manual,*:4",
        "--drain-timeout",
        "600",
        "--pass-env",
        "PATH,LC_*",
    ], words

    # Without a password the URL may go in the unit; the default drain is five minutes.
    plain = jc.bare(
        "--db", "postgresql+psycopg://w_b2@db.example/jobs", "worker", "unit", "--name", "b2"
    )
    assert (plain.returncode, plain.stderr) == (0, ""), describe(plain)
    (exec_start,) = unit_settings(plain.stdout)["ExecStart"]
    assert shlex.split(exec_start)[1:] == [
        "--state-dir",
        "/var/lib/jobcontrol",
        "--db",
        "postgresql+psycopg://w_b2@db.example/jobs",
        "worker",
        "run",
        "--name",
        "b2",
        "--queues",
        "*:8",
        "--drain-timeout",
        "300",
    ]
    assert unit_settings(plain.stdout)["TimeoutStopSec"] == ["360"]


def test_worker_unit_refuses_what_a_worker_would_refuse_and_makes_nothing(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    jc = jc_sqlite
    state = tmp_path / "state"
    pg = {**jc.env, "JOBCONTROL_DB": "postgresql+psycopg://w@db.example/jobs"}
    for args, env, why in (
        ((), jc.env, "a worker process needs a PostgreSQL database, not sqlite:///"),
        (("--queues", "fast"), pg, "has no slot count"),
        (("--drain-timeout", "0s"), pg, "--drain-timeout '0s': a duration must be a positive"),
        (("--drain-timeout", "soon"), pg, "cannot read 'soon' as a duration"),
        (("--name", "a b"), pg, "worker name 'a b'"),
    ):
        refused = jc.bare("--state-dir", state, "worker", "unit", *args, env=env)
        assert refused.returncode != 0, describe(refused)
        assert why in refused.stderr, describe(refused)
        assert (refused.stdout, "Traceback" in refused.stderr) == ("", False), describe(refused)
    misplaced = jc.bare("worker", "run", "--user", "batch", env=pg)
    assert "--user and --command are options of `worker unit`" in misplaced.stderr
    assert not state.exists(), "a refused unit makes nothing"
