"""The online CLI as a user meets it: the real daemon, driven by the real ``jobcontrol`` commands.

The CLI finds the daemon (its URL file) and the admin token (the config dir) by
itself. Most steps share one daemon: each command start costs ~0.5 s of CPU.
Waits poll the API directly (cheaper than a CLI start) and are all bounded.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
from typing import Any

import httpx
import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write

pytestmark = pytest.mark.timeout(180)

TREE = """\
jobs:
  - name: Nightly
    timer: daily 02:00
    children:
      - name: hello
        command: echo hello from the online cli
      - name: sleeper
        command: sleep 1000
  - name: lone
    command: "true"
"""
DOOMED = """\
jobs:
  - name: Doomed
    children:
      - name: d1
        command: "true"
      - name: d2
        command: "true"
"""
WAIT = 30.0


class Api:
    """The daemon's API, read directly for cheap bounded waits (never to drive the test)."""

    def __init__(self, jc: JobControl) -> None:
        url = (jc.state_dir / next(p.name for p in jc.state_dir.glob("daemon-*.url"))).read_text()
        token = jc.token_file.read_text().strip()
        self.http = httpx.Client(
            base_url=url.strip() + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=10,
        )

    def newest_run(self, job: str) -> dict[str, Any] | None:
        runs: list[dict[str, Any]] = self.http.get(f"/jobs/{job}/runs").json()["runs"]
        return runs[0] if runs else None

    def finished(self, job: str) -> bool:
        run = self.newest_run(job)
        return run is not None and run["state"] not in ("queued", "running", "waiting")


def fails_with(jc: JobControl, *args: str) -> str:
    """Run a refused command: exit status 1, the message on stderr; returns the message."""
    result = jc.fails(*args)
    assert result.returncode == 1, describe(result)
    assert result.stderr.startswith("jobcontrol: "), describe(result)
    return result.stderr


def test_the_online_cli_drives_a_running_daemon(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    jc.ok("daemon", "start")
    api = Api(jc)

    # load: the whole file in ONE batch, through the daemon, in the token's user's name.
    loaded = jc.ok("load", str(write(jc.base / "tree.yaml", TREE)))
    assert "4 created" in loaded.stdout, describe(loaded)
    loads = [e for e in jc.json("audit") if e["operation"] == "definitions.load"]
    assert [(e["user"], e["result"]) for e in loads] == [("admin", "ok")]

    # ls and show
    listing = jc.json("ls")
    assert [j["name"] for j in listing] == ["Nightly", "hello", "sleeper", "lone"]
    table = jc.ok("ls").stdout
    assert table.splitlines()[0].split()[:4] == ["NAME", "KIND", "ACTIVE", "STATE"]
    assert "  hello" in table, table
    before = jc.json("show", "hello")
    assert (before["command"], before["state"]) == ("echo hello from the online cli", "idle")
    shown = jc.ok("show", "hello").stdout
    assert re.search(r"^parent: +Nightly$", shown, re.M), shown
    assert re.search(r"^state: +idle$", shown, re.M), shown
    # Only a top-level job's misfire counts: show says so of one inside a box.
    assert re.search(r"^misfire: +run-once \(no effect inside a box\)$", shown, re.M), shown
    assert re.search(r"^misfire: +run-once$", jc.ok("show", "Nightly").stdout, re.M)

    # set: two fields in one batch, one version step.
    edited = jc.ok("set", "hello", "description=says hello", "priority=5")
    assert f"version {before['version']} -> {before['version'] + 1}" in edited.stdout
    after = jc.json("show", "hello")
    assert (after["description"], after["priority"]) == ("says hello", 5)
    assert after["version"] == before["version"] + 1
    assert after["updated_by"] == "admin"
    # A set that changes nothing says so (nothing written); max_log_files= clears it.
    same = jc.ok("set", "hello", "priority=5")
    assert same.stdout == "hello: nothing changed (already so)\n", describe(same)
    assert jc.json("show", "hello")["version"] == after["version"]
    jc.ok("set", "hello", "max_log_files=9")
    jc.ok("set", "hello", "max_log_files=")
    assert jc.json("show", "hello")["max_log_files"] is None
    # A field that cannot be empty goes back to a new job's value.
    jc.ok("set", "hello", "queue=nightly", "retries=2", "misfire=skip")
    jc.ok("set", "hello", "queue=", "priority=", "retries=", "misfire=")
    shown = jc.json("show", "hello")
    assert [shown[k] for k in ("queue", "priority", "retries", "misfire")] == [
        "default",
        0,
        0,
        "run-once",
    ], shown

    # A refused edit: exit 1, the server's message, nothing written.
    refused = fails_with(jc, "set", "lone", "timer=every fortnight")
    assert "job 'lone'" in refused, refused
    assert "invalid schedule 'every fortnight'" in refused, refused
    assert jc.json("show", "lone")["timer"] is None

    # activate / deactivate, one batch each
    jc.ok("activate", "Nightly", "lone")
    jc.ok("deactivate", "lone")
    active = {j["name"]: j["active"] for j in jc.json("ls")}
    assert (active["Nightly"], active["lone"], active["hello"]) == (True, False, False)

    # run a task: history and its log
    started = jc.ok("run", "hello")
    run_id = int(re.search(r"started run (\d+)", started.stdout).group(1))  # type: ignore[union-attr]
    # -f follows the run from its start until it ends: the whole output, then exit 0.
    followed = jc.ok("logs", "hello", "--run", str(run_id), "-f")
    assert followed.stdout == "hello from the online cli\n", describe(followed)
    assert api.finished("hello")
    history = jc.json("history", "hello")
    assert (history[0]["id"], history[0]["state"]) == (run_id, "succeeded")
    assert "succeeded" in jc.ok("history", "hello", "--limit", "1").stdout
    assert jc.ok("logs", "hello").stdout == "hello from the online cli\n"

    # kill a long task: its run records 255
    jc.ok("run", "sleeper")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT)
    killed = jc.ok("kill", "sleeper")
    assert re.fullmatch(r"killed run \d+ of sleeper\n", killed.stdout), describe(killed)
    assert wait_until(lambda: api.finished("sleeper"), WAIT)
    assert jc.json("history", "sleeper")[0]["exit_status"] == 255
    jc.assert_no_task_processes(JOBCONTROL_JOB="sleeper")
    # Renamed while it runs: the kill names the job as it is called now.
    jc.ok("run", "sleeper")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT)
    jc.ok("set", "sleeper", "name=dozer")
    killed = jc.ok("kill", "dozer")
    assert re.fullmatch(r"killed run \d+ of dozer\n", killed.stdout), describe(killed)
    assert wait_until(lambda: api.finished("dozer"), WAIT)
    jc.assert_no_task_processes(JOBCONTROL_JOB="sleeper")
    jc.ok("set", "dozer", "name=sleeper")
    # A task of a running tree: the tree's run is the one killed, and the CLI says whose.
    jc.ok("activate", "sleeper")  # a manual run of a tree skips its inactive jobs
    tree_run = int(re.search(r"started run (\d+)", jc.ok("run", "Nightly").stdout).group(1))  # type: ignore[union-attr]
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT)
    killed = jc.ok("kill", "sleeper")
    assert killed.stdout == (
        f"killed run {tree_run} of Nightly (the run sleeper is part of)\n"
    ), describe(killed)
    assert wait_until(lambda: api.finished("Nightly"), WAIT)
    jc.assert_no_task_processes(JOBCONTROL_JOB="sleeper")
    jc.ok("deactivate", "sleeper")
    hello_newest = api.newest_run("hello")["id"]  # type: ignore[index]  # skipped in Nightly's run

    # restart, pause / resume seen in status
    assert "re-armed Nightly: next run " in jc.ok("restart", "Nightly").stdout
    # An inactive tree: nothing is armed, and the CLI says so; as in Inq its next runs
    # (shown while it is inactive) are cleared.
    jc.ok("deactivate", "Nightly")
    assert jc.json("show", "Nightly")["next_runs"] is not None
    idle = jc.ok("restart", "Nightly")
    assert (
        idle.stdout == "Nightly not armed: it is inactive; activate it to schedule it\n"
    ), describe(idle)
    assert jc.json("show", "Nightly")["next_runs"] is None
    jc.ok("activate", "Nightly")
    jc.ok("pause")
    assert jc.json("status")["paused"] is True
    assert "timers: paused" in jc.ok("status").stdout
    # The daemon's own status says so too, from the database.
    assert jc.json("daemon", "status")["timers_paused_since"] is not None
    said = jc.ok("daemon", "status").stdout
    assert "timers: PAUSED since " in said, said
    assert "nothing fires until `jobcontrol resume`" in said, said
    jc.ok("resume")
    assert jc.json("status")["paused"] is False
    assert jc.json("daemon", "status")["timers_paused_since"] is None
    assert "PAUSED" not in jc.ok("daemon", "status").stdout

    # rm
    assert jc.ok("rm", "lone").stdout.strip() == "deleted 1 job"
    assert "lone" not in [j["name"] for j in jc.json("ls")]

    # export through the daemon
    exported = jc.ok("export", "Nightly").stdout
    assert "says hello" in exported, exported
    assert "lone" not in exported, exported

    # events from the start: at least the edits above, as `seq type json` lines
    _check_events(jc)

    # A viewer may read but not run; the message says which token was used.
    added = jc.ok("user", "add", "v", "--role", "viewer").stdout.splitlines()
    viewer_token = added[1].strip()
    assert json.loads(jc.ok("--token", viewer_token, "ls", "--json").stdout)
    denied = fails_with(jc, "--token", viewer_token, "run", "hello")
    assert "role viewer, which may not run" in denied, denied
    assert "(HTTP 403, using the token given with --token)" in denied, denied
    assert viewer_token not in denied
    bogus = dict(jc.env, JOBCONTROL_TOKEN="jc_not_a_token")
    unknown = jc.run("status", env=bogus)
    assert unknown.returncode == 1, describe(unknown)
    assert "(HTTP 401, using the token in $JOBCONTROL_TOKEN)" in unknown.stderr, describe(unknown)
    assert "jc_not_a_token" not in unknown.stderr
    assert api.newest_run("hello")["id"] == hello_newest  # type: ignore[index]

    # A number from an earlier run of the daemon (each numbers on from its start's
    # microseconds), or one not reached: the daemon's reason, and a fresh start.
    before = fails_with(jc, "events", "--after", "999999")
    assert "events after 999999 are no longer kept" in before, before
    assert "take a fresh `jobcontrol ls`" in before, before
    ahead = fails_with(jc, "events", "--after", str(10**17))
    assert f"event {10**17} has not happened yet" in ahead, ahead
    assert "take a fresh `jobcontrol ls`" in ahead, ahead
    # A box goes with its children, and the count says so.
    jc.ok("load", str(write(jc.base / "doomed.yaml", DOOMED)))
    assert jc.ok("rm", "Doomed").stdout.strip() == "deleted 3 jobs"
    assert "Doomed" not in [j["name"] for j in jc.json("ls")]
    # A follower is told when the daemon stops: the stream has no end of its own.
    follower_out = jc.base / "follower.out"
    follower = jc.popen("events", "--after", "0", output=follower_out, errors=jc.base / "f.err")
    assert wait_until(lambda: follower_out.read_text().strip() != "", WAIT)
    jc.ok("daemon", "stop")
    assert follower.wait(timeout=WAIT) == 1
    assert "ended the event stream: it stopped" in (jc.base / "f.err").read_text()
    # Without a daemon: reading falls back to the database, the rest says what is missing.
    assert [j["name"] for j in jc.json("ls")] == ["Nightly", "hello", "sleeper"]
    missing = fails_with(jc, "run", "hello")
    assert "no daemon is running" in missing, missing
    assert "no --url was given" in missing, missing


def _check_events(jc: JobControl) -> None:
    output = jc.base / "events.out"
    child = jc.popen("events", "--after", "0", output=output, errors=jc.base / "events.err")

    def lines() -> list[list[str]]:
        return [line.split(" ", 2) for line in output.read_text().splitlines()]

    def seen_deletion() -> bool:
        return any(kind == "job.deleted" for _, kind, _ in lines())

    try:
        assert wait_until(seen_deletion, WAIT), output.read_text()
    finally:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
    assert child.returncode == 130, (jc.base / "events.err").read_text()
    events = lines()
    seqs = [int(seq) for seq, _, _ in events]
    assert seqs == sorted(seqs)
    assert seqs[0] >= 1
    kinds = {kind for _, kind, _ in events}
    assert {"job.created", "job.modified", "job.deleted", "run.started", "run.finished"} <= kinds
    for _, _, data in events:
        json.loads(data)


def test_online_commands_without_a_daemon_say_so(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    for args in (["status"], ["pause"], ["show", "x"], ["events"]):
        message = fails_with(jc, *args)
        assert "no daemon is running" in message, message
    # A --url where nothing listens: the URL and where it came from.
    unreachable = fails_with(jc, "--url", "http://127.0.0.1:9", "status")
    assert "cannot reach the daemon at http://127.0.0.1:9" in unreachable, unreachable
    assert "--url" in unreachable
    # A daemon without its admin API: reading works on the database; a load is still
    # refused (it would write behind the daemon's back); the rest says why it cannot go on.
    jc.ok("daemon", "start", "--no-api")
    assert jc.json("ls") == []
    load = fails_with(jc, "load", str(write(jc.base / "tree.yaml", TREE)))
    assert "a daemon is running" in load, load
    no_api = fails_with(jc, "status")
    assert "runs without its admin API" in no_api, no_api
    jc.ok("daemon", "stop")
