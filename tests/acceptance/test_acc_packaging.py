"""Packaging as a user meets it: PostgreSQL's driver is an extra that SQLite users go without."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.acceptance.harness import JobControl, describe, pid_from, write

# Imported first by every Python the test starts (PYTHONPATH): psycopg is not there.
WITHOUT_PSYCOPG = """\
import sys

sys.modules["psycopg"] = None  # `import psycopg` now fails as if it were not installed
"""

JOBS = """\
jobs:
  - name: Tick
    active: true
    children:
      - name: tick
        active: true
        command: echo tick
"""

PG_URL = "postgresql+psycopg://jc@127.0.0.1:1/jobcontrol"


def without_psycopg(jc: JobControl, tmp_path: Path) -> dict[str, str]:
    site = tmp_path / "no-psycopg"
    site.mkdir()
    (site / "sitecustomize.py").write_text(WITHOUT_PSYCOPG)
    return {**jc.env, "PYTHONPATH": str(site)}


@pytest.mark.timeout(120)
def test_sqlite_needs_no_psycopg(jc_sqlite: JobControl, tmp_path: Path) -> None:
    jc = jc_sqlite
    env = without_psycopg(jc, tmp_path)
    probe = jc.bare("--version", env=env)
    assert probe.returncode == 0, describe(probe)
    # The blocker works: the same interpreter cannot import the driver.
    blocked = jc.bare("--db", PG_URL, "ls", env=env)
    assert "psycopg" in blocked.stderr, describe(blocked)

    assert jc.run("db", "upgrade", env=env).returncode == 0
    jobs = write(jc.base / "jobs.yaml", JOBS)
    loaded = jc.run("load", str(jobs), env=env)
    assert loaded.returncode == 0, describe(loaded)
    started = jc.run("daemon", "start", env=env)
    assert started.returncode == 0, describe(started)
    pid = pid_from(started.stdout)
    listing = jc.run("ls", env=env)
    assert listing.returncode == 0, describe(listing)
    assert "Tick" in listing.stdout, describe(listing)
    stopped = jc.run("daemon", "stop", env=env)
    assert stopped.stdout == f"daemon stopped (pid {pid})\n", describe(stopped)


@pytest.mark.timeout(120)
def test_postgresql_without_psycopg_says_how_to_install_it(
    jc_sqlite: JobControl, tmp_path: Path
) -> None:
    jc = jc_sqlite
    env = without_psycopg(jc, tmp_path)
    state = tmp_path / "pg-state"
    for command in (["ls"], ["db", "upgrade"], ["daemon", "run"], ["daemon", "start"]):
        result = jc.bare("--db", PG_URL, "--state-dir", state, *command, env=env)
        assert result.returncode == 1, describe(result)
        assert result.stderr.count("\n") == 1, describe(result)  # one line
        assert "Traceback" not in result.stderr, describe(result)
        assert "psycopg" in result.stderr, describe(result)
        assert "pip install 'jobcontrol[postgresql]'" in result.stderr, describe(result)
        assert not state.exists(), f"{command}: refused, yet it made the state directory"

    # A URL without the driver's name is SQLAlchemy's default PostgreSQL driver's.
    other = jc.bare("--db", "postgresql://jc@127.0.0.1:1/jobcontrol", "ls", env=env)
    assert other.returncode == 1, describe(other)
    assert "Traceback" not in other.stderr, describe(other)
    assert "pip install 'jobcontrol[postgresql]'" in other.stderr, describe(other)
