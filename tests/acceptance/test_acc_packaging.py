"""Packaging as a user meets it: PostgreSQL's driver is an extra that SQLite users go
without; the sdist and wheel build without a warning and describe themselves."""

from __future__ import annotations

import email.parser
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.acceptance.harness import ROOT, JobControl, describe, pid_from, write

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


def source_tree(dest: Path) -> Path:
    """The repository's files as git sees them (tracked, and new ones not ignored), copied
    to ``dest``: a build there leaves the working tree alone and sees no stale egg-info."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = ROOT / name
        if source.is_file():  # a file deleted but not yet committed is listed too
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, dest / name)
    return dest


def warnings_in(output: str) -> list[str]:
    return [line for line in output.splitlines() if re.search(r"warn|deprecat", line, re.I)]


@pytest.mark.timeout(120)
def test_sdist_and_wheel_build_without_warnings_and_render_on_their_own(tmp_path: Path) -> None:
    tree = source_tree(tmp_path / "src")
    dist = tmp_path / "dist"
    # Bytecode compiling off makes setuptools warn that it skips it: not the project's.
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    built = subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(tree)],
        capture_output=True,
        text=True,
        env=env,
        timeout=100,
        check=False,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    assert warnings_in(output) == [], output
    sdist, wheel = sorted(dist.glob("*.tar.gz")), sorted(dist.glob("*.whl"))
    assert (len(sdist), len(wheel)) == (1, 1), list(dist.iterdir())

    checked = subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, sdist + wheel)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert warnings_in(checked.stdout + checked.stderr) == [], checked.stdout + checked.stderr

    with zipfile.ZipFile(wheel[0]) as archive:
        names = archive.namelist()
        (metadata_name,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = email.parser.Parser().parsestr(archive.read(metadata_name).decode())
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), names
    assert metadata["License-Expression"] == "MIT", metadata.items()
    urls = dict(u.split(", ", 1) for u in metadata.get_all("Project-URL") or [])
    assert urls["Inq Job Control (the original)"].endswith("/examples/jobcontrol/index.html")
    assert all(re.fullmatch(r"https?://[^ ]+", u) for u in urls.values()), urls
    classifiers = metadata.get_all("Classifier") or []
    assert "Operating System :: POSIX :: Linux" in classifiers, classifiers
    extras = metadata.get_all("Provides-Extra") or []
    assert {"postgresql", "gui"} <= set(extras), extras
    requires = metadata.get_all("Requires-Dist") or []
    assert [r for r in requires if r.startswith("psycopg")] == [
        'psycopg[binary]<4,>=3.2; extra == "postgresql"'
    ], requires
    assert "croniter==6.0.0" in requires, requires
    (tzdata,) = [r for r in requires if r.startswith("tzdata")]
    assert re.fullmatch(r"tzdata(<[\d.]+,>=[\d.]+|>=[\d.]+,<[\d.]+)", tzdata), tzdata

    # The long description stands on its own: no link or image into the repository.
    description = metadata.get_payload()
    assert metadata["Description-Content-Type"] == "text/markdown", metadata.items()
    assert "jobcontrol[postgresql]" in description
    targets = re.findall(r"\]\(([^)]*)\)", description)
    relative = [t for t in targets if not re.match(r"https?://", t)]
    assert relative == [], relative
    assert "../" not in description
