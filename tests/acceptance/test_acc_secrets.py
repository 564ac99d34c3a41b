"""Secrets stay with the daemon's user: the real daemon and CLI, as an attacker on the
same machine would look at them (``ps``, a task's environment, file modes).

Each test starts its own daemon: what is checked is how it was started.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.acceptance.harness import JobControl, describe, pid_from

MakeJC = Callable[[str], JobControl]

pytestmark = pytest.mark.timeout(180)

PASSWORD = "Pw-only-the-daemon-knows-3141"


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
