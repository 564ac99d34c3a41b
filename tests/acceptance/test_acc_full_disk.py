"""The state directory on a full filesystem: a real 1 MiB tmpfs under the real daemon.

A task whose log cannot be written does not run: its run is recorded failed with the
reason, the daemon goes on, and /healthz and /metrics say the space is low. Once space
is freed, runs succeed again.
"""

from __future__ import annotations

import errno
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write
from tests.tmpfs import tmpfs

pytestmark = pytest.mark.timeout(180)

MakeJC = Callable[[str], JobControl]
RUN_WAIT = 30.0


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs, unmounted after the test (ask for it before ``make_jc``, so the
    daemon on it is stopped first)."""
    with tmpfs(tmp_path / "small", "1m") as mount:
        yield mount


@pytest.fixture
def db_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """An 8 MiB tmpfs for a SQLite database, unmounted after the test. Room for the WAL
    between two of the daemon's checkpoints (every 64 commits): a ticking tree's WAL
    grows about 80 KB a tick and reached 0.9 MB in this test. On 1 MiB the WAL itself
    filled the disk again a few ticks after the filler had gone (CI, 28 Nov)."""
    with tmpfs(tmp_path / "db", "8m") as mount:
        yield mount


def fill(mount: Path) -> Path:
    """Write a file until the filesystem is full."""
    filler = mount / "filler"
    chunk = b"\0" * 65536
    with open(filler, "wb", buffering=0) as out:
        error = None
        while error is None:
            try:
                out.write(chunk)
            except OSError as exc:
                error = exc
    assert error.errno == errno.ENOSPC, error
    return filler


def api_base(jc: JobControl) -> str:
    return next(jc.state_dir.glob("daemon-*.url")).read_text().strip()


def health(jc: JobControl) -> tuple[int, dict[str, Any]]:
    answer = httpx.get(f"{api_base(jc)}/healthz", timeout=10)
    return answer.status_code, answer.json()


def metrics(jc: JobControl) -> dict[str, float]:
    token = jc.token_file.read_text().strip()
    answer = httpx.get(
        f"{api_base(jc)}/metrics", headers={"Authorization": f"Bearer {token}"}, timeout=10
    )
    assert answer.status_code == 200, answer.text
    found = {}
    for line in answer.text.splitlines():
        if line.startswith("jobcontrol_") and "{" not in line:
            name, value = line.split()
            found[name] = float(value)
    return found


def run_and_wait(jc: JobControl, job: str) -> dict[str, Any]:
    """Run ``job`` now and return its run once it has ended."""
    before = len(jc.history(job))
    jc.ok("run", job)

    def ended() -> dict[str, Any] | None:
        runs = jc.history(job)
        if len(runs) > before and runs[0]["ended"] is not None:
            return runs[0]
        return None

    assert wait_until(ended, RUN_WAIT, interval=0.3), jc.history(job)
    run = ended()
    assert run is not None
    return run


def test_a_full_state_directory_fails_runs_with_the_reason_and_the_daemon_goes_on(
    small_tmpfs: Path, sqlite_url: str, make_jc: MakeJC, tmp_path: Path
) -> None:
    jc = make_jc(sqlite_url)  # the database elsewhere: only the state directory is full
    jc.state_dir = small_tmpfs / "state"
    jc.state_dirs = {jc.state_dir}
    marker = tmp_path / "the-task-ran"
    jobs = f"""\
jobs:
  - name: Disk
    children:
      - name: writer
        active: true
        command: touch {marker} && echo wrote
"""
    jc.upgraded().load(write(jc.base / "jobs.yaml", jobs))
    jc.ok("daemon", "start", "--disk-low", "256K")

    status, body = health(jc)
    assert (status, body["status"]) == (200, "ok"), body
    assert body["disk"]["state_dir"]["low_below_bytes"] == 256 * 1024
    assert body["disk"]["log_root"]["low"] is False

    filler = fill(small_tmpfs)
    failed = run_and_wait(jc, "writer")
    assert (failed["state"], failed["exit_status"]) == ("failed", 127), failed
    assert failed["reason"].startswith("log file: No space left on device"), failed
    assert failed["log_path"] is None
    assert not marker.exists(), "a task must not run without its log"

    status, body = health(jc)
    assert (status, body["status"]) == (200, "low disk space"), body
    assert f"state directory {jc.state_dir}: 0 bytes free" in body["reason"], body
    assert body["disk"]["log_root"]["low"] is True
    seen = metrics(jc)
    assert seen["jobcontrol_state_dir_disk_low"] == 1
    assert seen["jobcontrol_state_dir_free_bytes"] == 0
    assert seen["jobcontrol_log_root_disk_low"] == 1
    assert len(jc.live_daemons()) == 1, "the daemon goes on"

    # The daemon's own log is on the full disk too: once the page it has is used up, its
    # lines are counted as lost, and said in health, status and metrics.
    for _ in range(60):
        if metrics(jc)["jobcontrol_log_losing"] == 1:
            break
        run_and_wait(jc, "writer")  # four lines or so in the daemon's log
    seen = metrics(jc)
    assert seen["jobcontrol_log_losing"] == 1, seen
    assert seen["jobcontrol_log_lines_lost_total"] >= 1, seen
    status, body = health(jc)
    assert (status, body["status"]) == (200, "low disk space"), body
    assert "the daemon's log: " in body["reason"], body
    assert "No space left on device" in body["reason"], body
    shown = jc.ok("status").stdout
    assert "daemon log: NOT WRITTEN since " in shown, shown
    lost = int(seen["jobcontrol_log_lines_lost_total"])

    filler.unlink()
    ran = run_and_wait(jc, "writer")
    assert (ran["state"], ran["exit_status"], ran["reason"]) == ("succeeded", 0, None), ran
    assert Path(ran["log_path"]).read_text() == "wrote\n"
    assert marker.exists()
    status, body = health(jc)
    assert (status, body["status"]) == (200, "ok"), body
    seen = metrics(jc)
    assert seen["jobcontrol_state_dir_disk_low"] == 0
    assert seen["jobcontrol_log_losing"] == 0
    said = [line for line in jc.daemon_log(10_000).splitlines() if "could not be written" in line]
    assert len(said) == 1, said
    counted = re.search(
        r" WARNING jobcontrol\.logbatch: (\d+) log lines could not be written", said[0]
    )
    assert counted, said
    assert int(counted.group(1)) >= lost, said  # (more may have been lost since)


def test_a_bad_disk_low_mark_starts_nothing(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    refused = jc.fails("daemon", "start", "--disk-low", "lots")
    assert "jobcontrol: --disk-low 'lots': not a size" in refused.stderr, refused.stderr
    assert jc.live_daemons() == []
    assert not jc.state_dir.exists(), "nothing is created for a refused start"


TICKER = """\
jobs:
  - name: Ticker
    timer: every 1s
    active: true
    children:
      - {name: tick, active: true, command: "true"}
  - name: Once
    children:
      - {name: once, active: true, command: "echo once"}
"""


def test_a_full_disk_under_the_database_is_an_outage_ridden_out(
    db_tmpfs: Path, make_jc: MakeJC
) -> None:
    """The SQLite file's filesystem fills up (its WAL cannot grow): the daemon stays up,
    says why in health and status (which still answer), refuses what would write, and
    goes on where it was once space is freed."""
    jc = make_jc(f"sqlite:///{db_tmpfs}/jobcontrol.db")  # the state directory elsewhere
    jc.upgraded().load(write(jc.base / "jobs.yaml", TICKER))
    jc.ok("daemon", "start")
    assert wait_until(lambda: len(jc.history("tick")) >= 2, RUN_WAIT), jc.history("tick")

    filler = fill(db_tmpfs)
    try:
        # The ticker's next writes need room the file does not have.
        assert wait_until(lambda: health(jc)[0] == 503, RUN_WAIT), health(jc)
        status, body = health(jc)
        assert body["status"] == "database unavailable", body
        assert "database or disk is full" in body["reason"], body
        shown = jc.run("status")
        assert shown.returncode == 0, shown.stderr
        assert "database: UNAVAILABLE since " in shown.stdout, shown.stdout
        assert "database or disk is full" in shown.stdout, shown.stdout
        refused = jc.run("run", "Once")
        assert refused.returncode != 0, refused.stdout
        assert "database or disk is full" in refused.stderr, refused.stderr
        assert metrics(jc)["jobcontrol_database_up"] == 0
    finally:
        filler.unlink()

    assert wait_until(lambda: health(jc)[0] == 200, RUN_WAIT), health(jc)
    ticks = len(jc.history("tick"))
    assert wait_until(lambda: len(jc.history("tick")) >= ticks + 2, RUN_WAIT), "no ticks"
    assert jc.history("once") == [], "the refused run must not have happened"
    ran = run_and_wait(jc, "once")
    assert (ran["state"], ran["exit_status"]) == ("succeeded", 0), ran
    assert all(r["state"] == "succeeded" for r in jc.history("tick")), jc.history("tick")
    assert "database:" not in jc.ok("status").stdout
    assert len(jc.live_daemons()) == 1, "the daemon went on"


def test_a_daemon_started_on_a_full_state_directory_says_why_it_did_not_start(
    small_tmpfs: Path, sqlite_url: str, make_jc: MakeJC
) -> None:
    """Neither its log nor its pid file can be written: ``daemon start`` says the disk is
    full (it used to point at an empty log), ``daemon run`` says it in one line (it used
    to end in a traceback), and no empty pid file is left behind."""
    jc = make_jc(sqlite_url)  # the database elsewhere: only the state directory is full
    jc.upgraded()
    jc.state_dir = small_tmpfs / "state"
    jc.state_dirs = {jc.state_dir}
    jc.state_dir.mkdir(mode=0o700)
    filler = fill(small_tmpfs)

    started = jc.fails("daemon", "start")
    assert "its disk is full" in started.stderr, describe(started)
    assert "Traceback" not in started.stderr, describe(started)
    ran = jc.fails("daemon", "run")
    assert "Traceback" not in ran.stderr, describe(ran)
    assert "No space left on device" in ran.stderr, describe(ran)
    assert [p for p in jc.state_dir.iterdir() if p.suffix == ".pid"] == []
    assert jc.live_daemons() == []

    filler.unlink()  # room again: it starts
    jc.ok("daemon", "start")
    assert len(jc.live_daemons()) == 1
    jc.ok("daemon", "stop")
