"""The real daemon, started and stopped through the CLI, on the real clock."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from jobcontrol import places, procs
from tests.acceptance.harness import JobControl, describe, pid_from, wait_until, write

# Generous bounds: on a loaded 2-core machine a CLI command alone takes ~0.5 s.
START_WAIT = 30.0

LONG_AND_TICK = """\
jobs:
  - name: Long
    timer: every 1s
    active: true
    children:
      - name: sleeper
        active: true
        command: sleep 1000
  - name: Tick
    timer: every 1s
    active: true
    children:
      - name: tick
        active: true
        command: echo tick
"""

CRASH = """\
jobs:
  - name: Crash
    timer: every 1s
    active: true
    children:
      - name: escaper
        active: true
        command: setsid sleep 1000 & sleep 1000
"""

SLEEPER = """\
jobs:
  - name: Long
    timer: every 1s
    active: true
    children:
      - name: sleeper
        active: true
        command: sleep 1000
"""


def runs(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The runs of a ``history --json`` command, newest first."""
    assert result.returncode == 0, describe(result)
    found: list[dict[str, Any]] = json.loads(result.stdout)
    return found


def tick_logs(jc: JobControl) -> list[Path]:
    """Task logs of Tick's runs: each run of ``echo tick`` leaves one in the state dir."""
    found = []
    for path in (jc.state_dir / "logs").glob("*/*.log"):
        try:
            if path.read_bytes() == b"tick\n":
                found.append(path)
        except FileNotFoundError:
            pass  # pruned meanwhile: the daemon keeps the newest few
    return found


@pytest.mark.timeout(150)
def test_daemon_life_cycle(jc: JobControl) -> None:
    jc.upgraded().load(write(jc.base / "jobs.yaml", LONG_AND_TICK))

    started = jc.ok("daemon", "start")
    assert started.stdout.startswith("daemon started: pid "), describe(started)
    pid = pid_from(started.stdout)
    assert procs.pid_alive(pid)
    assert jc.live_daemons() == [pid], "the pid file must name the daemon"
    # `start` returned once the daemon was ready: it holds the database and its timers
    # are armed (a tree whose run is under way may show no next run meanwhile).
    ready = jc.ok("daemon", "status")
    assert ready.stdout.startswith(f"daemon running: pid {pid}, "), describe(ready)
    assert re.search(r"trees scheduled: [12]\b", ready.stdout), describe(ready)

    # Periodic on the real clock: Tick runs again a second after each run ends; and the
    # long job runs meanwhile. Wait on their processes and logs, then ask the CLI.
    assert wait_until(lambda: len(tick_logs(jc)) >= 3, START_WAIT), tick_logs(jc)
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), START_WAIT)
    ticks, status, listing, sleeper = jc.run_all(
        jc.argv("history", "Tick", "--json"),
        jc.argv("daemon", "status"),
        jc.argv("ls", "--json"),
        jc.argv("history", "sleeper", "--json"),
    )
    tick_runs = runs(ticks)
    assert len(tick_runs) >= 3, tick_runs
    ids = [run["id"] for run in tick_runs]
    assert ids == sorted(ids, reverse=True), "history must list the newest run first"
    starts = [run["started"] for run in tick_runs]
    assert starts == sorted(starts, reverse=True), starts
    assert {run["trigger"] for run in tick_runs} == {"timer"}
    finished = [run for run in tick_runs if run["state"] != "running"]
    assert len(finished) >= 2, tick_runs
    assert {(run["state"], run["exit_status"]) for run in finished} == {("succeeded", 0)}

    assert status.returncode == 0, describe(status)
    assert status.stdout.startswith(f"daemon running: pid {pid}"), describe(status)
    assert "Long (box, running)" in status.stdout, describe(status)
    assert "sleeper (task, running)" in status.stdout, describe(status)
    states = {job["name"]: job["state"] for job in json.loads(listing.stdout)}
    assert (states["Long"], states["sleeper"]) == ("running", "running"), states
    assert runs(sleeper)[0]["state"] == "running"

    # One daemon per database, whatever the state dir; a load goes through it (the
    # admin API), never behind its back; and no stop while jobs run.
    elsewhere = jc.base / "other-state"
    second, start_elsewhere, run_elsewhere, load, stop = jc.run_all(
        jc.argv("daemon", "start"),
        jc.argv("daemon", "start", state_dir=elsewhere),
        jc.argv("daemon", "run", state_dir=elsewhere),
        jc.argv("load", str(jc.base / "jobs.yaml")),
        jc.argv("daemon", "stop"),
    )
    for refused in (second, start_elsewhere, run_elsewhere):
        assert refused.returncode != 0, describe(refused)
        assert "another Job Control daemon" in refused.stderr, describe(refused)
        assert "is running on" in refused.stderr, describe(refused)
    # `start` says why its daemon did not start, not what the running one logged.
    assert "the daemon did not start: another Job Control daemon" in second.stderr, second.stderr
    assert "Dispatcher initialising" not in second.stderr, second.stderr
    assert load.returncode == 0, describe(load)
    assert "0 created, 0 changed, 0 deleted" in load.stdout, describe(load)
    assert stop.returncode != 0, describe(stop)
    assert "jobs are running (Long" in stop.stderr, describe(stop)
    # Asked for the port its own daemon listens on: told that daemon runs, not to pick
    # another port (which would only lead to the same refusal).
    port = int(places.url_file(jc.state_dir, jc.url).read_text().rsplit(":", 1)[1].strip("/ \n"))
    same_port = jc.run("daemon", "start", "--port", str(port))
    assert same_port.returncode != 0, describe(same_port)
    assert "a daemon is already running for" in same_port.stderr, describe(same_port)
    assert "another database" not in same_port.stderr, describe(same_port)
    assert jc.live_daemons() == [pid], "refused commands must leave the daemon alone"
    assert jc.marked(JOBCONTROL_JOB="sleeper"), "a refused stop must not kill the job"

    stopped = jc.ok("daemon", "stop", "--kill")
    assert stopped.stdout == f"daemon stopped (pid {pid})\n", describe(stopped)
    assert not procs.pid_alive(pid)
    jc.assert_no_task_processes()

    sleeper, box, listing, after = jc.run_all(
        jc.argv("history", "sleeper", "--json"),
        jc.argv("history", "Long", "--json"),
        jc.argv("ls", "--json"),
        jc.argv("daemon", "status"),
    )
    killed = runs(sleeper)[0]
    assert (killed["state"], killed["exit_status"]) == ("killed", 255), killed
    killed_box = runs(box)[0]
    assert (killed_box["state"], killed_box["exit_status"]) == ("killed", 255), killed_box
    assert {job["state"] for job in json.loads(listing.stdout)} == {"idle"}
    assert after.returncode == 3, describe(after)
    assert "no daemon is running" in after.stdout, describe(after)


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """An AF_UNIX datagram socket standing in for systemd's $NOTIFY_SOCKET."""
    with tempfile.TemporaryDirectory(prefix="jc-notify-") as tmp:  # short: sun_path is 108 bytes
        address = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(address)
        try:
            yield sock, address
        finally:
            sock.close()


@pytest.mark.timeout(90)
def test_daemon_run_notifies_systemd_and_stops_cleanly_on_sigterm(
    jc_sqlite: JobControl, notify_socket: tuple[socket.socket, str]
) -> None:
    jc = jc_sqlite
    sock, address = notify_socket
    jc.upgraded().load(write(jc.base / "jobs.yaml", SLEEPER))

    output = jc.base / "daemon-run.out"
    daemon = jc.popen("daemon", "run", output=output, env={**jc.env, "NOTIFY_SOCKET": address})
    sock.settimeout(START_WAIT)
    assert sock.recv(4096) == b"READY=1", output.read_text()
    assert daemon.poll() is None

    status = jc.ok("daemon", "status")
    assert pid_from(status.stdout) == daemon.pid, describe(status)
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), START_WAIT)

    daemon.send_signal(signal.SIGTERM)
    assert daemon.wait(timeout=60) == 0, output.read_text()
    sock.settimeout(5)
    assert sock.recv(4096) == b"STOPPING=1"
    log = output.read_text()
    assert "Traceback" not in log, log
    assert "JobControl terminated." in log, log

    # SIGTERM is a clean stop: the running job is killed and recorded as such.
    run = jc.history("sleeper")[0]
    assert (run["state"], run["exit_status"]) == ("killed", 255), run
    jc.assert_no_task_processes()
    assert jc.run("daemon", "status").returncode == 3


def sessions(pids: list[int]) -> set[int]:
    found = set()
    for pid in pids:
        try:
            found.add(os.getsid(pid))
        except ProcessLookupError:
            pass
    return found


@pytest.mark.timeout(150)
def test_crash_recovery_with_the_real_daemon(jc: JobControl) -> None:
    jc.upgraded().load(write(jc.base / "crash.yaml", CRASH))
    exported = jc.ok("export").stdout
    first_pid = pid_from(jc.ok("daemon", "start").stdout)

    # The task runs, and its `setsid sleep` has escaped into a session of its own.
    assert wait_until(lambda: len(sessions(jc.marked())) >= 2, START_WAIT), jc.marked()
    escaper, box, listing, status = jc.run_all(
        jc.argv("history", "escaper", "--json"),
        jc.argv("history", "Crash", "--json"),
        jc.argv("ls", "--json"),
        jc.argv("daemon", "status"),
    )
    lost = runs(escaper)[0]
    assert lost["state"] == "running", lost
    lost_id, task_pid = str(lost["id"]), int(lost["pid"])
    lost_box_id = runs(box)[0]["id"]
    states = {job["name"]: job["state"] for job in json.loads(listing.stdout)}
    assert states == {"Crash": "running", "escaper": "running"}
    escaped = sessions(jc.marked(JOBCONTROL_RUN_ID=lost_id)) - {task_pid}
    assert escaped, "the escaping child belongs to the run"
    assert pid_from(status.stdout) == first_pid, describe(status)

    os.kill(first_pid, signal.SIGKILL)
    assert wait_until(lambda: not procs.pid_alive(first_pid), START_WAIT)
    dead = jc.run("daemon", "status")
    assert dead.returncode == 3, describe(dead)
    assert jc.marked(JOBCONTROL_RUN_ID=lost_id), "kill -9 of the daemon leaves its tasks running"

    second_pid = pid_from(jc.ok("daemon", "start").stdout)
    assert second_pid != first_pid
    # Recovery happens before the daemon reports ready: nothing of the lost run is left.
    assert jc.marked(JOBCONTROL_RUN_ID=lost_id) == []

    escaper, box, after = jc.run_all(
        jc.argv("history", "escaper", "--json"),
        jc.argv("history", "Crash", "--json"),
        jc.argv("export"),
    )
    run = next(r for r in runs(escaper) if str(r["id"]) == lost_id)
    assert (run["state"], run["exit_status"]) == ("lost", 255), run
    lost_box = next(r for r in runs(box) if r["id"] == lost_box_id)
    assert (lost_box["state"], lost_box["exit_status"]) == ("lost", 255), lost_box
    assert after.stdout == exported, "recovery must not change the definitions"

    # The tree's timer is armed again: a new timer run starts its task.
    assert wait_until(lambda: jc.marked(), START_WAIT), "the timer was not re-armed"
    newest = runs(jc.run("history", "Crash", "--json"))[0]
    assert newest["id"] > lost_box_id, newest
    assert (newest["trigger"], newest["state"]) == ("timer", "running"), newest

    jc.ok("daemon", "stop", "--kill")
    jc.assert_no_task_processes()


@pytest.mark.timeout(60)
def test_daemon_stop_and_status_without_a_daemon(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    status = jc.run("daemon", "status")
    assert status.returncode == 3, describe(status)
    assert "no daemon is running" in status.stdout
    refused = jc.fails("daemon", "stop")
    assert "no daemon is running" in refused.stderr, describe(refused)


ENDED = """\
jobs:
  - name: solo
    command: "exit 5"
  - name: flaky
    retries: 1
    command: "if [ -f second ]; then exit 0; fi; touch second; exit 3"
  - name: Box
    children:
      - name: inner
        active: true
        command: "true"
"""


@pytest.mark.timeout(150)
def test_a_restart_reacts_to_no_end_twice(jc: JobControl) -> None:
    """Ends the dispatcher reacted to (a plain one, a retried one, one inside a box) are
    the jobs' results still after a restart: nothing is retried, re-recorded or re-run."""
    jc.upgraded().load(write(jc.base / "ended.yaml", ENDED))
    jc.ok("daemon", "start")
    for name in ("solo", "flaky", "Box"):
        jc.ok("run", name)

    def settled() -> bool:
        listed = {j["name"]: j for j in jc.json("ls")}
        return all(listed[n]["state"] == "idle" and listed[n]["last_ran"] for n in listed)

    assert wait_until(settled, START_WAIT), jc.ok("ls").stdout
    assert wait_until(lambda: len(runs(jc.run("history", "flaky", "--json"))) == 2, START_WAIT)
    before = jc.json("ls")
    counts = {n: len(runs(jc.run("history", n, "--json"))) for n in ("solo", "flaky", "inner")}
    assert counts == {"solo": 1, "flaky": 2, "inner": 1}, counts
    jc.ok("daemon", "stop")
    jc.ok("daemon", "start")
    assert jc.json("ls") == before
    again = {n: len(runs(jc.run("history", n, "--json"))) for n in ("solo", "flaky", "inner")}
    assert again == counts
    assert "ended while no dispatcher ran" not in jc.daemon_log(400)
    jc.ok("daemon", "stop")


def test_a_stop_with_an_event_stream_open_starts_and_kills_nothing(jc_sqlite: JobControl) -> None:
    """``daemon stop`` (no --kill) found no job running, while a client (the admin
    client always has one) held the event stream open. Closing the API waited up to
    10 s for that stream, the timers fired meanwhile, and the stop then killed the run
    they started. Now nothing starts once the stop begins, and the stream ends at once."""
    import threading

    import httpx

    jc = jc_sqlite.upgraded()
    jc.load(
        write(
            jc.base / "soon.yaml",
            """\
jobs:
  - name: Soon
    timer: every 6s
    active: true
    children:
      - {name: soon-task, active: true, command: "sleep 30"}
""",
        )
    )
    jc.ok("daemon", "start")
    base = next(jc.state_dir.glob("daemon-*.url")).read_text().strip()
    token = jc.token_file.read_text().strip()
    opened = threading.Event()

    def follow() -> None:
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.stream("GET", f"{base}/api/v1/events", headers=headers, timeout=60) as r:
            opened.set()
            for _ in r.iter_bytes():
                pass

    reader = threading.Thread(target=follow, daemon=True)
    reader.start()
    assert opened.wait(10), "the event stream did not open"
    assert jc.history("Soon") == [], "the stop must begin before the first firing"
    stopped = jc.run("daemon", "stop")
    assert stopped.returncode == 0, describe(stopped)
    assert jc.live_daemons() == []
    reader.join(10)
    assert not reader.is_alive(), "the event stream was not ended by the stop"
    assert [r["state"] for r in jc.history("Soon")] == [], "a run started during the stop"
    jc.assert_no_task_processes()


def _api(jc: JobControl) -> tuple[str, dict[str, str]]:
    base = next(jc.state_dir.glob("daemon-*.url")).read_text().strip()
    return base, {"Authorization": f"Bearer {jc.token_file.read_text().strip()}"}


def test_a_client_resuming_the_events_of_the_daemon_before_is_told_to_take_a_snapshot(
    jc_sqlite: JobControl,
) -> None:
    """A client (the admin client) that resumes the event stream after a daemon restart
    with the last number the daemon before gave it must be told to take a fresh
    snapshot. The numbers began at 0 at every start: once the new daemon had given as
    many events, the client was sent the new daemon's later events on top of the tree it
    held from before, and missed what changed meanwhile."""
    import httpx

    jc = jc_sqlite.upgraded()
    jc.load(
        write(
            jc.base / "quick.yaml",
            """\
jobs:
  - name: Quick
    active: true
    children:
      - {name: quick-task, active: true, command: "true"}
""",
        )
    )
    jc.ok("daemon", "start")
    base, headers = _api(jc)
    seen = httpx.get(f"{base}/api/v1/tree", headers=headers, timeout=10).json()["seq"]
    jc.ok("daemon", "stop")
    jc.ok("daemon", "start")
    base, headers = _api(jc)
    for n in range(1, 4):
        jc.ok("run", "Quick")
        assert wait_until(
            lambda n=n: [r["state"] for r in jc.history("quick-task")] == ["succeeded"] * n, 10
        ), jc.history("quick-task")
    now = httpx.get(f"{base}/api/v1/tree", headers=headers, timeout=10).json()["seq"]
    assert now > seen, (seen, now)
    with httpx.stream(
        "GET",
        f"{base}/api/v1/events",
        headers={**headers, "Last-Event-ID": str(seen)},
        timeout=10,
    ) as reply:
        first = ""
        for line in reply.iter_lines():
            if not line:
                break
            first += line + "\n"
    assert first.startswith("event: resync"), first
    jc.ok("daemon", "stop")


@pytest.mark.timeout(120)
def test_a_timer_run_a_crash_cut_off_is_not_run_again_for_the_same_time(
    jc_sqlite: JobControl,
) -> None:
    """The daemon is killed (-9) while the run its timer started runs: start-up recovery
    ends that run lost, and the tree is armed from that run, as after any end (`every`:
    its interval after that end). It was armed again for the time it had already run
    for, which was past, so the misfire rule ran it a second time at once: twice for one
    schedule time, with no retries allowed (found by an outside trial)."""
    jc = jc_sqlite.upgraded()
    jc.load(
        write(
            jc.base / "every.yaml",
            """\
jobs:
  - name: Every
    timer: every 20s
    active: true
    children:
      - {name: every-task, active: true, command: "sleep 1000"}
""",
        )
    )
    first = pid_from(jc.ok("daemon", "start").stdout)
    assert wait_until(lambda: [r["state"] for r in jc.history("Every")] == ["running"], 60)
    os.kill(first, signal.SIGKILL)
    assert wait_until(lambda: not procs.pid_alive(first), START_WAIT)
    jc.ok("daemon", "start")
    shown = json.loads(jc.ok("show", "Every", "--json").stdout)
    history = jc.history("Every")
    assert [(r["trigger"], r["state"]) for r in history] == [("timer", "lost")], history
    # 20 s after the lost run's end (its recovery), not the time it had run for.
    from datetime import datetime

    armed = datetime.fromisoformat(shown["next_runs"])
    assert armed > datetime.fromisoformat(history[0]["ended"]), (shown, history)
    jc.ok("daemon", "stop", "--kill")
    jc.assert_no_task_processes()
