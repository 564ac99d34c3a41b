"""jobcontrol.procs against real processes: spawn, find by marker, kill trees, sd_notify.

Every wait is on a condition (a file the child writes, a /proc state) with a bounded
deadline; every test checks that nothing carrying its marker is left running.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from jobcontrol.procs import (
    descendants,
    find_marked,
    kill_tree,
    pid_alive,
    sd_notify,
    spawn,
)

pytestmark = pytest.mark.timeout(60)

WAIT = 10.0

# The escaping child: leaves the task's session, tells the test its pid, lingers.
ESCAPER = """\
import os, signal, sys, time
os.setsid()
if sys.argv[2] == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
with open(sys.argv[1], "w") as f:
    f.write(f"{os.getpid()}\\n")
time.sleep(1000)
"""


def wait_until(predicate: Callable[[], bool], timeout: float = WAIT) -> bool:
    """Poll ``predicate`` every 10 ms until it holds or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def read_pid(path: Path) -> int:
    """The pid a child wrote (one line) to ``path``, once the whole line is there."""
    assert wait_until(lambda: path.exists() and path.read_text().endswith("\n")), path
    return int(path.read_text())


def waiter(proc: subprocess.Popen[bytes]) -> Callable[[float], bool]:
    def wait_exit(timeout: float) -> bool:
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return False
        return True

    return wait_exit


def proc_state(pid: int) -> str | None:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    return data[data.rfind(b")") + 2 :].split(b" ", 1)[0].decode()


def nothing_marked(marker: dict[str, str]) -> bool:
    return find_marked(marker) == []


def assert_none_left(marker: dict[str, str]) -> None:
    assert wait_until(functools.partial(nothing_marked, marker)), find_marked(marker)


class Tasks:
    """Spawns marked task processes and makes sure none outlives the test."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.markers: list[dict[str, str]] = []
        self.procs: list[subprocess.Popen[bytes]] = []
        self.output = tmp_path / "output"

    def marker(self, run_id: str | None = None, instance: str | None = None) -> dict[str, str]:
        marker = {
            "JOBCONTROL_RUN_ID": run_id or uuid.uuid4().hex,
            "JOBCONTROL_INSTANCE": instance or str(uuid.uuid4()),
        }
        self.markers.append(marker)
        return marker

    def spawn(self, command: str, marker: dict[str, str], **extra: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, **marker, **extra}
        with self.output.open("ab") as out:
            proc = spawn(command, stdout=out, cwd=str(self.tmp_path), env=env)
        self.procs.append(proc)
        return proc

    def cleanup(self) -> list[int]:
        """Kill and reap whatever is left; return the marked pids that were still alive."""
        deadline = time.monotonic() + WAIT
        leftovers: list[int] = []
        for marker in self.markers:
            remaining = max(0.0, deadline - time.monotonic())
            wait_until(functools.partial(nothing_marked, marker), remaining)
            leftovers += find_marked(marker)
            kill_tree(None, marker=marker, grace=0.0)
        for proc in self.procs:
            if proc.poll() is None:
                kill_tree(proc.pid, marker=None, grace=0.0, wait_exit=waiter(proc))
            proc.wait(timeout=WAIT)
        return leftovers


@pytest.fixture
def tasks(tmp_path: Path) -> Iterator[Tasks]:
    tasks = Tasks(tmp_path)
    yield tasks
    leftovers = tasks.cleanup()
    if leftovers:
        pytest.fail(f"test left marked processes behind: {leftovers}")


def test_spawn_runs_command_with_given_env_cwd_and_status(tmp_path: Path) -> None:
    workdir = tmp_path / "work"
    workdir.mkdir()
    output = tmp_path / "out.log"
    env = {"PATH": os.environ["PATH"], "GREETING": "hello"}
    command = 'echo "$GREETING from $(pwd)"; echo "home=${HOME-unset}"; echo oops >&2; exit 3'
    with output.open("wb") as out:
        proc = spawn(command, stdout=out, cwd=str(workdir), env=env)
    assert proc.wait(timeout=WAIT) == 3
    # env is the whole environment: HOME from the test process must not leak in.
    assert output.read_text() == f"hello from {workdir}\nhome=unset\noops\n"


def test_spawn_puts_task_in_its_own_session(tasks: Tasks) -> None:
    marker = tasks.marker()
    proc = tasks.spawn("exec sleep 1000", marker)
    assert os.getsid(proc.pid) == proc.pid
    assert os.getpgid(proc.pid) == proc.pid
    assert os.getsid(proc.pid) != os.getsid(0)
    stdin = Path(f"/proc/{proc.pid}/fd/0").resolve()
    assert stdin == Path(os.devnull)
    kill_tree(proc.pid, marker=marker, grace=5.0, wait_exit=waiter(proc))
    assert proc.returncode == -signal.SIGTERM
    assert_none_left(marker)


def test_spawn_missing_cwd_raises_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        spawn("true", stdout=subprocess.DEVNULL, cwd=str(tmp_path / "nope"), env={})


def test_kill_tree_kills_shell_and_its_background_and_foreground_children(tasks: Tasks) -> None:
    marker = tasks.marker()
    proc = tasks.spawn("sleep 1000 & sleep 1000; wait", marker)
    assert wait_until(lambda: len(descendants(proc.pid)) == 2)
    children = descendants(proc.pid)

    report = kill_tree(proc.pid, marker=marker, grace=5.0, wait_exit=waiter(proc))

    assert proc.returncode == -signal.SIGTERM
    assert {proc.pid, *children} <= set(report.termed)
    assert report.killed == []
    assert report.survivors == []
    assert not any(pid_alive(child) for child in children)
    assert_none_left(marker)


def test_kill_tree_without_marker_or_waiter_uses_group_and_ppid_links(tasks: Tasks) -> None:
    marker = tasks.marker()
    proc = tasks.spawn("sleep 1000 & sleep 1000; wait", marker)
    assert wait_until(lambda: len(descendants(proc.pid)) == 2)
    children = descendants(proc.pid)

    report = kill_tree(proc.pid, marker=None, grace=5.0)

    assert report.survivors == []
    assert proc.wait(timeout=WAIT) == -signal.SIGTERM
    assert not any(pid_alive(child) for child in children)
    assert_none_left(marker)


def _escape_command(tasks: Tasks, how: str, term: str) -> str:
    if how == "setsid-utility":
        if shutil.which("setsid") is None:
            pytest.skip("setsid (util-linux) is not installed")
        trap = 'trap "" TERM; ' if term == "ignore-term" else ""
        inner = f'{trap}echo $$ > "$1"; exec sleep 1000'
        return f"setsid sh -c '{inner}' escaper \"$PIDFILE\" & exit 0"
    (tasks.tmp_path / "escaper.py").write_text(ESCAPER)
    return f'"$PY" escaper.py "$PIDFILE" {term} & exit 0'


@pytest.mark.parametrize("how", ["setsid-utility", "python-os-setsid"])
def test_escaped_child_is_found_by_marker_and_killed(tasks: Tasks, how: str) -> None:
    marker = tasks.marker()
    pidfile = tasks.tmp_path / "escaped.pid"
    command = _escape_command(tasks, how, "default")
    proc = tasks.spawn(command, marker, PY=sys.executable, PIDFILE=str(pidfile))
    escaped = read_pid(pidfile)
    assert proc.wait(timeout=WAIT) == 0  # the parent is gone: the child was reparented
    assert os.getsid(escaped) == escaped != proc.pid
    assert escaped in find_marked(marker)

    report = kill_tree(proc.pid, marker=marker, grace=5.0, wait_exit=waiter(proc))

    assert escaped in report.termed
    assert report.survivors == []
    assert wait_until(lambda: not pid_alive(escaped))
    assert_none_left(marker)


def test_term_ignoring_shell_is_killed_after_grace(tasks: Tasks) -> None:
    marker = tasks.marker()
    ready = tasks.tmp_path / "ready"
    proc = tasks.spawn('trap "" TERM; echo $$ > "$READY"; sleep 1000', marker, READY=str(ready))
    read_pid(ready)
    assert wait_until(lambda: len(descendants(proc.pid)) == 1)
    sleeper = descendants(proc.pid)[0]

    started = time.monotonic()
    report = kill_tree(proc.pid, marker=marker, grace=0.3, wait_exit=waiter(proc))
    elapsed = time.monotonic() - started

    assert elapsed >= 0.3
    assert proc.returncode == -signal.SIGKILL
    assert {proc.pid, sleeper} <= set(report.termed)
    assert {proc.pid, sleeper} <= set(report.killed)
    assert report.survivors == []
    assert_none_left(marker)


@pytest.mark.parametrize("how", ["setsid-utility", "python-os-setsid"])
def test_term_ignoring_escapee_is_killed_by_marker_alone(tasks: Tasks, how: str) -> None:
    marker = tasks.marker()
    pidfile = tasks.tmp_path / "escaped.pid"
    command = _escape_command(tasks, how, "ignore-term")
    proc = tasks.spawn(command, marker, PY=sys.executable, PIDFILE=str(pidfile))
    escaped = read_pid(pidfile)
    assert proc.wait(timeout=WAIT) == 0

    report = kill_tree(None, marker=marker, grace=0.3)

    assert escaped in report.killed
    assert report.survivors == []
    assert wait_until(lambda: not pid_alive(escaped))
    assert_none_left(marker)


def test_find_marked_matches_exact_marker_only(tasks: Tasks) -> None:
    marker = tasks.marker()
    # Same instance, run id that merely starts with ours; same run id, other instance.
    longer_run = tasks.marker(
        run_id=marker["JOBCONTROL_RUN_ID"] + "0", instance=marker["JOBCONTROL_INSTANCE"]
    )
    other_instance = tasks.marker(run_id=marker["JOBCONTROL_RUN_ID"])
    ours = tasks.spawn("exec sleep 1000", marker)
    theirs = [tasks.spawn("exec sleep 1000", m) for m in (longer_run, other_instance)]

    assert find_marked(marker) == [ours.pid]
    assert find_marked(longer_run) == [theirs[0].pid]
    same_run = find_marked({"JOBCONTROL_RUN_ID": marker["JOBCONTROL_RUN_ID"]})
    assert sorted(same_run) == sorted([ours.pid, theirs[1].pid])

    kill_tree(ours.pid, marker=marker, grace=5.0, wait_exit=waiter(ours))
    assert_none_left(marker)
    assert all(proc.poll() is None for proc in theirs)  # untouched by our kill
    for proc, other in zip(theirs, (longer_run, other_instance), strict=True):
        kill_tree(proc.pid, marker=other, grace=5.0, wait_exit=waiter(proc))
        assert_none_left(other)


def test_find_marked_sees_a_task_that_is_in_the_middle_of_exec(tasks: Tasks) -> None:
    # Right after spawn the shell is exec'ing sleep; for a moment its /proc environ reads
    # empty. A task missed in that window would escape kill_tree's final scan.
    for _ in range(20):
        marker = tasks.marker()
        proc = tasks.spawn("exec sleep 1000", marker)
        assert find_marked(marker) == [proc.pid]
        kill_tree(proc.pid, marker=marker, grace=5.0, wait_exit=waiter(proc))
        assert_none_left(marker)


def test_find_marked_never_returns_the_calling_process(tasks: Tasks) -> None:
    marker = tasks.marker()
    code = (
        "import json, os, sys\n"
        "from jobcontrol.procs import find_marked\n"
        "print(json.dumps([os.getpid(), find_marked(json.loads(sys.argv[1]))]))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, json.dumps(marker)],
        env={**os.environ, **marker},
        capture_output=True,
        check=True,
        timeout=WAIT * 3,
    )
    own_pid, found = json.loads(result.stdout)
    assert own_pid not in found
    assert_none_left(marker)


def test_find_marked_passes_over_a_process_carrying_a_variable_the_marker_rules_out(
    tasks: Tasks,
) -> None:
    """The daemon's recovery looks for its embedded worker's tasks: those of its instance
    that carry no JOBCONTROL_WORKER (a worker process's task on the same host does)."""
    marker = tasks.marker()
    instance = {"JOBCONTROL_INSTANCE": marker["JOBCONTROL_INSTANCE"]}
    embedded = tasks.spawn("exec sleep 1000", marker)
    remote = tasks.spawn("exec sleep 1000", {**marker, "JOBCONTROL_WORKER": "w1"})
    named_empty = tasks.spawn("exec sleep 1000", {**marker, "JOBCONTROL_WORKER": ""})

    embedded_only = {**instance, "JOBCONTROL_WORKER": None}
    assert find_marked(embedded_only) == [embedded.pid]
    assert find_marked({**instance, "JOBCONTROL_WORKER": "w1"}) == [remote.pid]

    report = kill_tree(None, marker=embedded_only, grace=5.0)
    assert report.termed == [embedded.pid]
    assert waiter(embedded)(5.0)
    assert remote.poll() is None  # untouched
    assert named_empty.poll() is None
    for proc in (remote, named_empty):
        kill_tree(proc.pid, marker=None, grace=5.0, wait_exit=waiter(proc))
    assert_none_left(marker)


def test_find_marked_refuses_a_marker_that_would_match_every_process() -> None:
    for marker in ({}, {"JOBCONTROL_WORKER": None}):
        with pytest.raises(ValueError, match="match every process"):
            find_marked(marker)
        with pytest.raises(ValueError, match="match every process"):
            kill_tree(None, marker=marker, grace=0.0)


def test_pid_alive_is_false_for_zombies_and_true_for_live_processes(tmp_path: Path) -> None:
    assert pid_alive(os.getpid())
    proc = spawn("exit 0", stdout=subprocess.DEVNULL, cwd=None, env={})
    try:
        # Not reaped yet: the exited child stays a zombie until we wait for it.
        assert wait_until(lambda: proc_state(proc.pid) == "Z")
        assert not pid_alive(proc.pid)
    finally:
        proc.wait(timeout=WAIT)
    assert not pid_alive(0)
    assert not pid_alive(-1)


@pytest.mark.parametrize("kind", ["path", "abstract"])
def test_sd_notify_sends_ready_datagram(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str
) -> None:
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as server:
        if kind == "path":
            address = str(tmp_path / "notify")
            server.bind(address)
        else:
            address = f"@jobcontrol-test-{uuid.uuid4().hex}"
            server.bind("\0" + address[1:])
        server.settimeout(WAIT)
        monkeypatch.setenv("NOTIFY_SOCKET", address)
        assert sd_notify("READY=1") is True
        assert server.recv(4096) == b"READY=1"


def test_sd_notify_without_socket_variable_returns_false(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert sd_notify("READY=1") is False


def test_sd_notify_logs_instead_of_raising_when_nobody_listens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(tmp_path / "missing"))
    with caplog.at_level(logging.WARNING, logger="jobcontrol.procs"):
        assert sd_notify("READY=1") is False
    assert "READY=1" in caplog.text


def test_spawned_tasks_read_end_of_file_on_stdin_and_leak_no_descriptor(tmp_path: Path) -> None:
    # Every task's stdin is one /dev/null the process opened once: a task reads end of
    # file at once, can write to it as to subprocess.DEVNULL, holds nothing else of the
    # spawning process, and starting tasks leaves no descriptor open behind them.
    env = {"PATH": os.environ["PATH"]}
    command = 'read line; echo "read=$?"; echo x >&0 && echo "write=ok"; ls /proc/$$/fd'
    before = len(os.listdir("/proc/self/fd"))
    outputs = []
    for n in range(5):
        output = tmp_path / f"out{n}.log"
        with output.open("wb") as out:
            proc = spawn(command, stdout=out, cwd=None, env=env)
        assert proc.wait(timeout=WAIT) == 0
        outputs.append(output.read_text().split())
    assert len(os.listdir("/proc/self/fd")) <= before + 1  # (the one /dev/null, kept)
    for words in outputs:
        assert words[:2] == ["read=1", "write=ok"]
        assert {"0", "1", "2"} <= set(words[2:]) <= {"0", "1", "2", "255"}
