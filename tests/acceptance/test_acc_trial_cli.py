"""What outside trials found the CLI telling a user wrongly, each as the user meets it:
refusals in one line that change nothing, names resolved alike by every command,
and labels that say what they show."""

from __future__ import annotations

import getpass
import json
import re
import socket
from pathlib import Path

import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write

pytestmark = pytest.mark.timeout(180)

TREE = """\
jobs:
  - name: flaky
    command: "true"
"""


def _files(*dirs: Path) -> list[Path]:
    return sorted(p for d in dirs for p in d.rglob("*"))


@pytest.mark.parametrize("online", [False, True], ids=["offline", "online"])
def test_export_to_a_file_that_cannot_be_written_is_refused_in_one_line(
    jc_sqlite: JobControl, online: bool
) -> None:
    jc = jc_sqlite.upgraded()
    jc.load(write(jc.base / "tree.yaml", TREE))
    if online:
        jc.ok("daemon", "start")
    target = jc.base / "out"
    target.mkdir()
    before = _files(target)
    for output, reason in (
        (target / "missing" / "x.yaml", "No such file or directory"),
        (target, "Is a directory"),
    ):
        result = jc.fails("export", "-o", str(output))
        assert result.stderr == f"jobcontrol: cannot write {output}: {reason}\n", describe(result)
    assert _files(target) == before
    written = target / "ok.yaml"
    jc.ok("export", "-o", str(written))
    assert "name: flaky" in written.read_text()


NAMED = ["show", "run", "kill", "restart", "history", "logs", "rm", "activate", "set"]


def test_a_name_with_a_line_break_or_bytes_not_utf8_is_no_such_job_for_every_command(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite.upgraded()
    jc.load(write(jc.base / "tree.yaml", TREE))
    # Offline first (history reads the database itself), then through the daemon.
    offline = jc.fails("history", "\udcff")
    assert offline.stderr == "jobcontrol: job '\\xff': no such job\n", describe(offline)
    jc.ok("daemon", "start")
    before = jc.ok("export").stdout
    cases = [
        (command, name, shown)
        for command in NAMED
        for name, shown in (("\udcff", "'\\xff'"), ("a\nb", "'a\\nb'"), ("flaky\n", "'flaky\\n'"))
    ]
    argvs = [
        jc.argv(command, name, *(["retries=1"] if command == "set" else []))
        for command, name, _ in cases
    ]
    for (_, _, shown), result in zip(cases, jc.run_all(*argvs), strict=True):
        assert result.returncode == 1, describe(result)
        assert result.stderr == f"jobcontrol: job {shown}: no such job\n", describe(result)
    # `flaky\n` never meant `flaky`: nothing ran, nothing changed.
    assert jc.history("flaky") == []
    assert jc.ok("export").stdout == before


TIMED = (
    "jobs:\n"
    + "".join(
        f"  - name: t{i}\n    active: true\n    timer: every 1h\n    command: 'true'\n"
        for i in range(8)
    )
    + """\
  - name: quiet
    active: true
    command: "true"
  - name: box
    active: true
    children:
      - name: inner
        command: "true"
"""
)


def test_status_show_and_restart_say_what_they_show(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    jc.load(write(jc.base / "tree.yaml", TIMED))
    jc.ok("daemon", "start")
    # status lists 5 of 8 armed timers and says so
    status = jc.ok("status").stdout.splitlines()
    armed = status.index("timers: running, 8 armed")
    assert len([line for line in status if re.fullmatch(r"  t\d at .*", line)]) == 5, status
    assert status[armed + 6] == "  ... and 3 more", status
    # show: a duration in seconds is not labelled _ms; a cleared max_log_files is the default
    jc.ok("run", "quiet")
    assert wait_until(lambda: [r["state"] for r in jc.history("quiet")] == ["succeeded"], 30, 0.5)
    jc.ok("set", "quiet", "max_log_files=3")
    jc.ok("set", "quiet", "max_log_files=")
    show = jc.ok("show", "quiet").stdout.splitlines()
    assert "max_log_files: 5 (default)" in show, show
    assert any(re.fullmatch(r"last_duration: +\d+\.\ds", line) for line in show), show
    assert not [line for line in show if "_ms" in line], show
    assert jc.json("show", "quiet")["max_log_files"] is None
    # restart of a tree with no timer says so
    assert jc.ok("restart", "quiet").stdout == "quiet not armed: it has no timer\n"
    assert jc.ok("restart", "box").stdout == "box not armed: no job of its tree has a timer\n"


def test_load_caps_what_it_reads_and_cuts_what_it_repeats(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    jc.load(write(jc.base / "tree.yaml", TREE))
    before = jc.ok("export").stdout
    big = jc.base / "big.yaml"
    big.write_bytes(b"a" * (10 * 1024 * 1024 + 1))
    for source, shown in ((str(big), str(big)), ("/dev/zero", "/dev/zero")):
        result = jc.fails("load", source)
        assert result.stderr == (
            f"jobcontrol: {shown} is larger than 10485760 bytes (10 MiB), the most a definition "
            "file may hold (as a request to the admin API): nothing was loaded\n"
        ), describe(result)
    result = jc.fails("load", "-", input="a" * 10_000)
    assert result.stderr == (
        "jobcontrol: <stdin>:1: expected a mapping with a 'jobs' list at the top level, got "
        f"'{'a' * 199}... (9802 more characters)\n"
    ), describe(result)
    unknown = jc.fails(
        "load", str(write(jc.base / "k.yaml", f"jobs:\n  - name: x\n    {'k' * 500}: 1\n"))
    )
    assert f"'{'k' * 199}... (302 more characters)" in unknown.stderr, describe(unknown)
    assert len(unknown.stderr) < 1000, describe(unknown)
    assert jc.ok("export").stdout == before


def test_user_token_write_does_not_take_the_token_file_of_another_user(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite.upgraded()
    jc.ok("daemon", "start")  # its first start writes the admin's token file
    jc.ok("daemon", "stop")
    admin_token = jc.token_file.read_text()
    jc.ok("user", "add", "v3", "--role", "viewer")
    audit_before = jc.json("audit")
    refused = jc.fails("user", "token", "v3", "--write")
    assert refused.stderr == (
        f"jobcontrol: the token file {jc.token_file} holds the token of user 'admin' (admin): "
        "writing 'v3''s there would leave that token working but held by nobody; drop --write "
        "to be shown the new token, or give --overwrite to replace the file's\n"
    ), describe(refused)
    assert jc.token_file.read_text() == admin_token
    assert jc.json("audit") == audit_before  # no new token was made
    jc.ok("user", "token", "admin", "--write")  # its own: fine
    jc.ok("user", "token", "v3", "--write", "--overwrite")
    assert jc.token_file.read_text() not in (admin_token, "")


def test_the_daemon_log_says_which_pass_env_patterns_cover_variables_never_passed(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite.upgraded()
    jc.ok("daemon", "start", "--pass-env", "PATH,JOBCONTROL_*,WATCHDOG*,J*,NOTIFY_SOCKET")
    log = next(jc.state_dir.glob("daemon-*.log")).read_text()
    for line in (
        "the pass-through list's JOBCONTROL_* does not pass JOBCONTROL_*: never passed to tasks",
        "the pass-through list's WATCHDOG* does not pass WATCHDOG_PID, WATCHDOG_USEC: never "
        "passed to tasks",
        "the pass-through list's J* does not pass JOBCONTROL_*: never passed to tasks",
        "the pass-through list names NOTIFY_SOCKET, which is never passed to tasks",
    ):
        assert line in log, log


def test_a_daemon_of_another_state_directory_is_not_said_to_be_down(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite.upgraded()
    jc.load(write(jc.base / "tree.yaml", TREE))
    started = jc.ok("daemon", "start").stdout
    pid = int(re.search(r"pid (\d+)", started)[1])  # type: ignore[index]
    other = jc.base / "other-state"
    db = jc.url
    status = jc.run("daemon", "status", state_dir=other)
    assert status.returncode == 0, describe(status)
    assert status.stdout.startswith(f"daemon running: pid {pid} on "), describe(status)
    assert f"but not from state directory {other} (no pid file of it there)" in status.stdout
    reply = json.loads(jc.run("daemon", "status", "--json", state_dir=other).stdout)
    assert (reply["running"], reply["pid"], reply["state_dir_differs"]) == (True, pid, True)
    said = f"another holds {db} (pid {pid} on "
    stop = jc.fails("daemon", "stop", state_dir=other)
    assert stop.stderr.startswith(
        f"jobcontrol: no daemon of state directory {other} is running, but {said}"
    ), describe(stop)
    run = jc.fails("run", "flaky", state_dir=other)
    assert said in run.stderr, describe(run)
    start = jc.fails("daemon", "start", state_dir=other)
    assert start.stderr == (
        f"jobcontrol: the daemon did not start: another Job Control daemon is running on "
        f"{db} (pid {pid} on {socket.gethostname()}); its state directory is not {other} "
        "(nothing was created)\n"
    ), describe(start)
    assert not other.exists()
    extra = write(jc.base / "extra.yaml", 'jobs:\n  - name: extra\n    command: "true"\n')
    load = jc.fails("load", str(extra), state_dir=other)
    assert f"a daemon is running on {db} (pid {pid} on " in load.stderr, describe(load)
    assert "load through its admin API (give its --state-dir, or --url)" in load.stderr
    assert "no such job" in jc.fails("show", "extra").stderr  # nothing was loaded
    assert jc.live_daemons(jc.state_dir) == [pid]  # nothing stopped it
    assert jc.history("flaky") == []  # nor ran anything


def test_daemon_stop_is_audited_refused_or_killing(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    jc.load(write(jc.base / "tree.yaml", 'jobs:\n  - name: sleeper\n    command: "sleep 1000"\n'))
    jc.ok("daemon", "start")
    jc.ok("run", "sleeper")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), 30)
    refused = jc.fails("daemon", "stop")
    assert "jobs are running (sleeper); stop refused" in refused.stderr, describe(refused)
    jc.ok("daemon", "stop", "--kill")
    me = f"local:{getpass.getuser()}"
    entries = jc.json("audit", "--limit", "2")
    assert [(e["user"], e["operation"], e["jobs"], e["result"], e["detail"]) for e in entries] == [
        (
            me,
            "daemon.shutdown",
            ["sleeper"],
            "ok",
            "forced, killing running jobs (jobcontrol daemon stop --kill)",
        ),
        (
            me,
            "daemon.shutdown",
            ["sleeper"],
            "refused",
            "jobs are running (sleeper); stop refused — use --kill to kill them",
        ),
    ], entries
    jc.ok("daemon", "start")
    jc.ok("daemon", "stop")
    last = jc.json("audit", "--limit", "1")[0]
    assert (last["user"], last["operation"], last["jobs"], last["result"]) == (
        me,
        "daemon.shutdown",
        [],
        "ok",
    ), last


def test_user_token_write_for_an_unknown_user_says_no_such_user(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    jc.ok("daemon", "start")
    jc.ok("daemon", "stop")
    admin_token = jc.token_file.read_text()
    refused = jc.fails("user", "token", "nobody", "--write")
    assert refused.stderr == "jobcontrol: user 'nobody': no such user\n", describe(refused)
    assert jc.token_file.read_text() == admin_token
