"""Kill that really kills: each task run in a cgroup of its own (the real daemon and CLI).

A task that starts ``(env -i setsid ... &)`` leaves a process that dropped the environment
marker and left the task's session: only its cgroup still knows it belongs to the run.
These tests need a writable cgroup v2 hierarchy (root, as in CI); without one they are
skipped, saying why, and the fallback tests still run.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobcontrol import procs
from jobcontrol.cgroups import Containment
from tests.acceptance.harness import JobControl, describe, pid_from, wait_until, write
from tests.acceptance.test_acc_full_disk import metrics

START_WAIT = 30.0


def _cgroups_here() -> str:
    probe = Containment.setup("acceptance-probe")
    probe.close()
    return "" if probe.enabled else probe.describe()


_WHY_NOT = _cgroups_here()
needs_cgroups = pytest.mark.skipif(bool(_WHY_NOT), reason=f"no cgroups here: {_WHY_NOT}")


def escaper_yaml(pid_file: Path, *, timeout: str | None = None) -> str:
    """A task whose child drops the marker (``env -i``) and its session (``setsid``), then
    writes its pid and lingers; the task itself sleeps."""
    escape = f"(env -i setsid sh -c 'echo $$ >{pid_file}; exec sleep 305' &); sleep 300"
    lines = [
        "jobs:",
        "  - name: Escape",
        "    active: true",
        f"    command: {json.dumps(escape)}",
    ]
    if timeout:
        lines.append(f"    timeout: {timeout}")
    return "\n".join(lines) + "\n"


USAGE = """\
jobs:
  - name: Hungry
    active: true
    command: >-
      python3 -c "import time; x = b'x' * (64 << 20);
      t = time.process_time();
      exec('while time.process_time() - t < 0.3: pass')"
"""


@pytest.fixture
def escapees() -> Iterator[list[int]]:
    """Pids of escaped processes the test saw; any still alive afterwards are killed."""
    found: list[int] = []
    yield found
    for pid in found:
        if procs.pid_alive(pid):
            os.kill(pid, signal.SIGKILL)


def read_escapee(jc: JobControl, pid_file: Path, escapees: list[int]) -> int:
    assert wait_until(
        lambda: pid_file.exists() and pid_file.read_text().endswith("\n"), START_WAIT
    ), f"the escaping child never wrote {pid_file}"
    pid = int(pid_file.read_text())
    escapees.append(pid)
    assert procs.pid_alive(pid)
    assert pid not in jc.marked(), "it dropped the environment marker"
    assert os.getsid(pid) == pid, "it left the task's session"
    return pid


def last_run(jc: JobControl, job: str, state: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    def ended() -> bool:
        runs = jc.history(job)
        found[:] = runs[:1]
        return bool(runs) and runs[0]["state"] == state

    assert wait_until(ended, START_WAIT), found
    return found[0]


@needs_cgroups
@pytest.mark.timeout(180)
def test_kill_ends_a_child_that_left_the_session_and_dropped_the_marker(
    jc_sqlite: JobControl, escapees: list[int]
) -> None:
    jc = jc_sqlite
    pid_file = jc.base / "escaped.pid"
    jc.upgraded().load(write(jc.base / "escape.yaml", escaper_yaml(pid_file)))
    jc.ok("daemon", "start")

    jc.ok("run", "Escape")
    escaped = read_escapee(jc, pid_file, escapees)
    jc.ok("kill", "Escape")

    run = last_run(jc, "Escape", "killed")
    assert run["exit_status"] == 255, run
    assert wait_until(
        lambda: not procs.pid_alive(escaped), START_WAIT
    ), f"pid {escaped} survived the kill"
    status = jc.ok("daemon", "status").stdout
    assert "task containment: cgroup /" in status, status
    assert "cgroup.kill" in status, status


@needs_cgroups
@pytest.mark.timeout(180)
def test_timeout_ends_a_child_that_left_the_session_and_dropped_the_marker(
    jc_sqlite: JobControl, escapees: list[int]
) -> None:
    jc = jc_sqlite
    pid_file = jc.base / "escaped.pid"
    jc.upgraded().load(write(jc.base / "escape.yaml", escaper_yaml(pid_file, timeout="3s")))
    jc.ok("daemon", "start")
    jc.ok("run", "Escape")
    escaped = read_escapee(jc, pid_file, escapees)

    run = last_run(jc, "Escape", "failed")
    assert run["exit_status"] == 124, run
    assert run["reason"] == "timed out after 3s", run
    assert wait_until(
        lambda: not procs.pid_alive(escaped), START_WAIT
    ), f"pid {escaped} survived the timeout"


@needs_cgroups
@pytest.mark.timeout(180)
def test_crash_recovery_ends_a_child_that_left_the_session_and_dropped_the_marker(
    jc_sqlite: JobControl, escapees: list[int]
) -> None:
    jc = jc_sqlite
    pid_file = jc.base / "escaped.pid"
    jc.upgraded().load(write(jc.base / "escape.yaml", escaper_yaml(pid_file)))
    first = pid_from(jc.ok("daemon", "start").stdout)
    jc.ok("run", "Escape")
    escaped = read_escapee(jc, pid_file, escapees)
    lost_id = last_run(jc, "Escape", "running")["id"]

    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: not procs.pid_alive(first), START_WAIT)
    assert procs.pid_alive(escaped), "kill -9 of the daemon leaves its tasks running"

    jc.ok("daemon", "start")
    assert wait_until(
        lambda: not procs.pid_alive(escaped), START_WAIT
    ), f"pid {escaped} of lost run {lost_id} survived the recovery"
    lost = next(r for r in jc.history("Escape") if r["id"] == lost_id)
    assert (lost["state"], lost["exit_status"]) == ("lost", 255), lost


@needs_cgroups
@pytest.mark.timeout(180)
def test_cpu_time_and_peak_memory_are_recorded_and_shown(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    jc.upgraded().load(write(jc.base / "usage.yaml", USAGE))
    jc.ok("daemon", "start")
    online = jc.ok("status", "--json")
    containment = json.loads(online.stdout)["containment"]
    assert containment.startswith("cgroup /"), describe(online)
    # Where the kernel offers favordynmods and the cgroup2 mount lacks it, status and the
    # log say how to remove the wait of a run's first join (README, Containment).
    probe = Containment.setup("acc-advice-probe")
    probe.close()
    if probe.advice:
        assert containment.endswith(probe.advice), containment
        warned = [line for line in jc.daemon_log(400).splitlines() if probe.advice in line]
        assert warned, jc.daemon_log()
        assert " WARNING " in warned[0], warned
    else:
        assert "favordynmods" not in containment, containment
    jc.ok("run", "Hungry")
    run = last_run(jc, "Hungry", "succeeded")  # through the daemon's API
    assert run["cpu_us"] >= 300_000, run
    assert run["mem_peak_bytes"] >= 64 << 20, run
    table = jc.ok("history", "Hungry").stdout
    header, row = table.splitlines()[:2]
    assert "CPU" in header, table
    assert "MEM PEAK" in header, table
    cpu = row[header.index("CPU") :].split()[0]
    mem = row[header.index("MEM PEAK") :].split()[0]
    assert float(cpu.removesuffix("s")) >= 0.3, table
    assert mem.endswith("M"), table
    assert float(mem[:-1]) >= 64, table

    jc.ok("daemon", "stop")
    stored = jc.history("Hungry")[0]  # from the database, no daemon
    assert (stored["cpu_us"], stored["mem_peak_bytes"]) == (run["cpu_us"], run["mem_peak_bytes"])


FALLBACK_ESCAPER = """\
jobs:
  - name: Marked
    active: true
    command: setsid sleep 1000 & sleep 1000
"""


@pytest.mark.timeout(180)
def test_with_cgroups_off_kill_still_ends_what_the_marker_finds(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    jc.env["JOBCONTROL_CGROUPS"] = "off"
    jc.upgraded().load(write(jc.base / "marked.yaml", FALLBACK_ESCAPER))
    jc.ok("daemon", "start")
    status = jc.ok("daemon", "status").stdout
    assert (
        "task containment: process group + environment marker "
        "(cgroups turned off by $JOBCONTROL_CGROUPS=off)"
    ) in status, status
    jc.ok("run", "Marked")
    assert wait_until(lambda: len({os.getsid(p) for p in jc.marked()}) >= 2, START_WAIT)
    jc.ok("kill", "Marked")
    run = last_run(jc, "Marked", "killed")
    assert (run["cpu_us"], run["mem_peak_bytes"]) == (None, None), run
    jc.assert_no_task_processes()


def test_an_unknown_cgroups_setting_is_refused_before_anything_starts(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite
    jc.upgraded()
    jc.env["JOBCONTROL_CGROUPS"] = "maybe"
    refused = jc.fails("daemon", "start")
    assert "$JOBCONTROL_CGROUPS='maybe': expected one of auto, off" in refused.stderr, describe(
        refused
    )
    assert jc.live_daemons() == []
    assert list(jc.state_dir.glob("daemon-*.pid")) == []


TICK = """\
jobs:
  - name: Tick
    timer: every 1s
    active: true
    children:
      - name: tick
        active: true
        command: "true"
"""


def _helpers(base: Path, daemon: int) -> list[int]:
    """The processes in the daemon's two warm-up cgroups (its helper).

    The two files are read one after the other while the helper may move between them
    (a timer coming due), so a read can miss it: read until it is seen, within a bound."""

    def read() -> list[int]:
        pids: list[int] = []
        for half in "ab":
            procs_file = base / f"warm-{daemon}-{half}" / "cgroup.procs"
            if procs_file.exists():
                pids += [int(p) for p in procs_file.read_text().split()]
        return pids

    found: list[int] = []

    def seen() -> bool:
        found[:] = read()
        return bool(found)

    wait_until(seen, START_WAIT)
    return found


def _warm_moves(jc: JobControl) -> int:
    found = metrics(jc)
    assert found["jobcontrol_cgroup_warm_failures_total"] == 0, found
    return int(found["jobcontrol_cgroup_warm_moves_total"])


@needs_cgroups
@pytest.mark.timeout(180)
def test_cgroup_joins_are_kept_warm_around_timers_by_a_helper_that_dies_with_the_daemon(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite
    probe = Containment.setup("acc-warm-probe")
    probe.close()
    jc.upgraded().load(write(jc.base / "tick.yaml", TICK))
    first = pid_from(jc.ok("daemon", "start").stdout)
    containment = json.loads(jc.ok("status", "--json").stdout)["containment"]
    if not probe.joins_wait():  # favordynmods, or expedited grace periods: nothing to do
        assert "kept warm" not in containment, containment
        return
    assert "; cgroup joins kept warm around timers" in containment, containment
    base = Path(containment.split()[1])
    (helper,) = _helpers(base, first)
    assert procs.pid_alive(helper)

    # The helper moves around each of Tick's due instants, and Tick's runs succeed.
    assert wait_until(lambda: _warm_moves(jc) > 0, START_WAIT)
    assert wait_until(
        lambda: sum(r["state"] == "succeeded" for r in jc.history("tick")) >= 2, START_WAIT
    ), jc.history("tick")

    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: not procs.pid_alive(helper), START_WAIT), "the helper outlived it"

    second = pid_from(jc.ok("daemon", "start").stdout)
    left = sorted(p.name for p in base.glob("warm-*"))
    assert left == [f"warm-{second}-a", f"warm-{second}-b"], "the killed daemon's are gone"
    (new_helper,) = _helpers(base, second)
    # --kill: Tick runs every second, and a plain stop is refused while it runs.
    jc.ok("daemon", "stop", "--kill")
    assert wait_until(lambda: not procs.pid_alive(new_helper), START_WAIT)
    assert list(base.glob("warm-*")) == []


def _cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            return line.split(":", 2)[2]
    return ""


@needs_cgroups
@pytest.mark.postgres
@pytest.mark.timeout(180)
def test_a_worker_process_keeps_its_joins_warm_when_the_daemons_timers_come_due(
    jcpg: JobControl,
) -> None:
    """The worker knows no timer: the daemon tells it, through PostgreSQL, as each comes due."""
    jc = jcpg
    probe = Containment.setup("acc-warm-probe")
    probe.close()
    if not probe.joins_wait():
        pytest.skip("cgroup joins never wait here (favordynmods, or expedited grace periods)")
    jc.load(write(jc.base / "tick.yaml", TICK))
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("worker", "start", "--name", "w1", "--slots", "2")
    (pid_file,) = jc.state_dir.glob("worker-w1-*.pid")
    worker = int(pid_file.read_text().split()[0])
    (w1,) = [w for w in jc.json("workers") if w["name"] == "w1"]
    assert w1["containment"].endswith("; cgroup joins kept warm around timers"), w1
    base = Path(w1["containment"].split()[1])
    (helper,) = _helpers(base, worker)

    # Tick comes due every second: the daemon announces it, the worker's helper moves.
    assert wait_until(
        lambda: _cgroup_of(helper).endswith(f"/warm-{worker}-b"), START_WAIT
    ), _cgroup_of(helper)
    assert wait_until(
        lambda: sum(r["state"] == "succeeded" for r in jc.history("tick")) >= 2, START_WAIT
    ), jc.history("tick")
    assert {r["worker"] for r in jc.history("tick")} == {"w1"}
    found = metrics(jc)
    assert found["jobcontrol_cgroup_warm_announcements_total"] >= 1, found
    assert found["jobcontrol_cgroup_warm_moves_total"] == 0, "the daemon runs no task here"
    assert found["jobcontrol_cgroup_warm_failures_total"] == 0, found

    jc.ok("worker", "stop", "--name", "w1")
    assert wait_until(lambda: not procs.pid_alive(helper), START_WAIT)
    assert list(base.glob("warm-*")) == []
