"""Drive the real ``jobcontrol`` command as subprocesses, the way a user would.

Every command runs as ``python -m jobcontrol --db URL --state-dir DIR ...`` with a
clean environment (HOME and XDG_STATE_HOME in the test's tmp dir), so nothing
touches the real user's state. ``JobControl.cleanup`` stops whatever daemon the
test left behind and reports task processes still carrying the database's marker.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from jobcontrol import cgroups, procs
from jobcontrol.store import Store

ROOT = Path(__file__).resolve().parents[2]
TESTSETUP = ROOT / "testsetup" / "inq-testsetup.yaml"
DEMO_YAML = ROOT / "testsetup" / "demo.yaml"

POLL = 0.05
# How long a single CLI command may take before the test gives up on it.
COMMAND_TIMEOUT = 60.0
# How long processes get to disappear after the daemon that owned them stopped.
GONE_TIMEOUT = 15.0


def wait_until(predicate: Callable[[], Any], timeout: float, interval: float = POLL) -> bool:
    """Poll ``predicate`` every ``interval`` seconds until it is truthy or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(interval)
    return True


def clean_env(base: Path, **extra: str) -> dict[str, str]:
    """A minimal environment: PATH and locale from ours, HOME and XDG_STATE_HOME in ``base``."""
    home, xdg = base / "home", base / "xdg-state"
    home.mkdir(parents=True, exist_ok=True)
    xdg.mkdir(parents=True, exist_ok=True)
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "XDG_STATE_HOME": str(xdg),
        "LANG": "C.UTF-8",
        "PYTHONUNBUFFERED": "1",
        # Tests run many daemons side by side: each admin API on a free port.
        "JOBCONTROL_PORT": "0",
    }
    # The code under test: a checkout put first on the path (a clone beside an
    # editable install of another) is the one the commands run.
    for name in ("TZ", "PYTHONPATH"):
        if name in os.environ:
            env[name] = os.environ[name]
    env.update(extra)
    return env


def describe(result: subprocess.CompletedProcess[str]) -> str:
    return (
        f"$ {' '.join(map(str, result.args))}\n"
        f"exit status {result.returncode}\n"
        f"--- stdout\n{result.stdout}--- stderr\n{result.stderr}"
    )


def instance_id(url: str) -> str | None:
    """The database's instance id (the marker of its task processes); None without schema."""
    store = Store(url)
    try:
        if store.current_revision() is None:
            return None
        return store.instance_id()
    finally:
        store.dispose()


def pid_from(text: str) -> int:
    match = re.search(r"\bpid (\d+)", text)
    assert match is not None, f"no pid in {text!r}"
    return int(match.group(1))


class JobControl:
    """One user's view of one database: runs ``jobcontrol`` against it."""

    def __init__(self, url: str, base: Path) -> None:
        self.url = url
        self.base = base
        self.base.mkdir(parents=True, exist_ok=True)
        self.env = clean_env(base)
        self.state_dir = base / "state"
        self.state_dirs: set[Path] = {self.state_dir}
        self.children: list[subprocess.Popen[bytes]] = []
        self._instance: str | None = None

    # ------------------------------------------------------------ commands

    def argv(self, *args: str, state_dir: Path | None = None) -> list[str]:
        state = state_dir or self.state_dir
        self.state_dirs.add(state)
        return [sys.executable, "-m", "jobcontrol", "--db", self.url, "--state-dir", str(state)] + [
            str(a) for a in args
        ]

    def run(
        self,
        *args: str,
        state_dir: Path | None = None,
        env: dict[str, str] | None = None,
        timeout: float = COMMAND_TIMEOUT,
        input: str | None = None,
        umask: int = -1,
    ) -> subprocess.CompletedProcess[str]:
        """``umask``: the command's (and so a daemon's it starts); -1 keeps the test's."""
        return subprocess.run(
            self.argv(*args, state_dir=state_dir),
            cwd=self.base,
            env=env or self.env,
            input=input,
            stdin=subprocess.DEVNULL if input is None else None,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            umask=umask,
        )

    def bare(
        self, *args: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """``jobcontrol ARGS`` exactly as given: no ``--db`` or ``--state-dir`` put in front."""
        return subprocess.run(
            [sys.executable, "-m", "jobcontrol", *map(str, args)],
            cwd=self.base,
            env=env or self.env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT,
            check=False,
        )

    def ok(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a command that must succeed (exit 0)."""
        result = self.run(*args, **kwargs)
        assert result.returncode == 0, describe(result)
        return result

    def fails(self, *args: str, **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run a command that must be refused: non-zero exit, a message on stderr, no traceback."""
        result = self.run(*args, **kwargs)
        assert result.returncode != 0, describe(result)
        assert result.stderr.strip(), describe(result)
        assert "Traceback" not in result.stderr, describe(result)
        return result

    def json(self, *args: str) -> Any:
        return json.loads(self.ok(*args, "--json").stdout)

    def popen(
        self,
        *args: str,
        output: Path,
        errors: Path | None = None,
        env: dict[str, str] | None = None,
    ) -> subprocess.Popen[bytes]:
        """Start a long-running command, stdout to ``output`` (a full pipe would block it),
        stderr to ``errors`` or also to ``output``; cleanup ends it if the test did not."""
        with open(output, "wb") as out, open(errors or os.devnull, "wb") as err:
            child = subprocess.Popen(
                self.argv(*args),
                cwd=self.base,
                env=env or self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err if errors else subprocess.STDOUT,
            )
        self.children.append(child)
        return child

    def argv_env(
        self, url: str, *args: str, state_dir: Path | None = None
    ) -> tuple[list[str], dict[str, str]]:
        """``jobcontrol ARGS`` on the database ``url`` given in its environment
        (``JOBCONTROL_DB``), never on its command line: as a worker on a host that reaches
        the database at an address of its own."""
        state = state_dir or self.state_dir
        self.state_dirs.add(state)
        argv = [sys.executable, "-m", "jobcontrol", "--state-dir", str(state)]
        return argv + [str(a) for a in args], dict(self.env, JOBCONTROL_DB=url)

    def run_all(
        self,
        *argvs: list[str],
        envs: Sequence[dict[str, str]] = (),
        timeout: float = COMMAND_TIMEOUT,
    ) -> list[subprocess.CompletedProcess[str]]:
        """Run independent commands (from ``argv``) at the same time: each ``jobcontrol``
        start costs ~0.5 s of CPU. ``envs``: each command's environment (default: the
        test's)."""
        children = [
            subprocess.Popen(
                argv,
                cwd=self.base,
                env=envs[i] if envs else self.env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for i, argv in enumerate(argvs)
        ]
        results = []
        try:
            for argv, child in zip(argvs, children, strict=True):
                out, err = child.communicate(timeout=timeout)
                results.append(subprocess.CompletedProcess(argv, child.returncode, out, err))
        finally:
            for child in children:
                if child.poll() is None:
                    child.kill()
                    child.communicate()
        return results

    def upgraded(self) -> JobControl:
        self.ok("db", "upgrade")
        return self

    def load(self, path: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        return self.ok("load", str(path), *extra)

    def history(self, job: str) -> list[dict[str, Any]]:
        runs: list[dict[str, Any]] = self.json("history", job)
        return runs

    def live_daemons(self, state_dir: Path | None = None) -> list[int]:
        """Pids of live daemons named by pid files in ``state_dir`` (default: every state
        dir this test used)."""
        from jobcontrol.places import live_pid

        pids = []
        for state in [state_dir] if state_dir else sorted(self.state_dirs):
            for pid_file in state.glob("daemon-*.pid"):
                pid = live_pid(pid_file)
                if pid is not None and procs.pid_alive(pid):
                    pids.append(pid)
        return pids

    def live_workers(self) -> list[int]:
        """Pids of live ``jobcontrol worker`` processes named by pid files in this test's
        state dirs."""
        from jobcontrol.places import live_pid

        pids = []
        for state in sorted(self.state_dirs):
            for pid_file in state.glob("worker-*.pid"):
                pid = live_pid(pid_file)
                if pid is not None and procs.pid_alive(pid):
                    pids.append(pid)
        return pids

    def stop_worker(self, pid: int) -> list[str]:
        """SIGTERM, then SIGINT (kill its runs); SIGKILL and a problem if it ignores both."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return []
        # Its runs' kills take their grace (5 s) and more on a loaded machine.
        if wait_until(lambda: not procs.pid_alive(pid), 3 * GONE_TIMEOUT):
            return []
        os.kill(pid, signal.SIGKILL)
        return [f"worker pid {pid} survived SIGTERM and SIGINT"]

    @property
    def token_file(self) -> Path:
        """Where the daemon of this database leaves its first-start admin token."""
        from jobcontrol.places import token_file

        return token_file(self.base / "home" / ".config" / "jobcontrol", self.url)

    def instance(self) -> str | None:
        """The database's instance id, once it has a schema (it never changes after)."""
        if self._instance is None:
            self._instance = instance_id(self.url)
        return self._instance

    def marked(self, **marker: str) -> list[int]:
        """Live processes of this database's runs, optionally narrowed (``JOBCONTROL_JOB=...``).

        Reading /proc is cheap, so tests wait on this and then check with the CLI.
        """
        instance = self.instance()
        if instance is None:
            return []
        return procs.find_marked({"JOBCONTROL_INSTANCE": instance, **marker})

    def assert_no_task_processes(self, timeout: float = GONE_TIMEOUT, **marker: str) -> None:
        assert wait_until(
            lambda: not self.marked(**marker), timeout
        ), f"task processes left running: {self.marked(**marker)}"

    # ------------------------------------------------------------ cleanup

    def daemon_log(self, lines: int = 80) -> str:
        """The last ``lines`` of this test's daemon logs: what a failed wait reports."""
        text = []
        for path in sorted(self.state_dir.glob("daemon-*.log")):
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            text.append(f"--- {path.name}\n" + "\n".join(tail))
        return "\n".join(text) or "(no daemon log)"

    def cleanup(self) -> list[str]:
        """Stop everything this test started; return what was found still running."""
        problems: list[str] = []
        for child in self.children:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    child.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
                    problems.append(f"foreground command {child.args} ignored SIGTERM")
        for pid in self.live_workers():
            # Workers first (warm stop: the daemon's kill reaches their runs meanwhile).
            problems += self.stop_worker(pid)
        for state in sorted(self.state_dirs):
            if self.live_daemons(state):
                self.run("daemon", "stop", "--kill", "--timeout", "30", state_dir=state)
        for pid in self.live_daemons():
            # Last resort: the daemon did not stop when asked.
            problems.append(f"daemon pid {pid} survived `daemon stop --kill`")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        instance = self.instance() if self._has_db() else None
        if instance is not None:
            marker = {"JOBCONTROL_INSTANCE": instance}
            if not wait_until(lambda: not procs.find_marked(marker), GONE_TIMEOUT):
                left = procs.find_marked(marker)
                procs.kill_tree(None, marker=marker, grace=1.0)
                problems.append(f"task processes of {self.url} left running: {left}")
            problems += remove_cgroups_of(instance)
        return problems

    def _has_db(self) -> bool:
        if self._instance is not None:
            return True
        if self.url.startswith("sqlite:///"):
            return Path(self.url.removeprefix("sqlite:///")).exists()
        try:  # a PostgreSQL database the test already dropped has nothing left to clean
            instance_id(self.url)
        except Exception:
            return False
        return True


def remove_cgroups_of(instance: str) -> list[str]:
    """Remove the cgroups of this database's daemons and workers that a process killed
    with SIGKILL left behind (a restart under the same name would have cleared them);
    the problems: a cgroup that still holds a process once everything was stopped."""
    problems = []
    for base in _cgroups_named(f"jobcontrol-{instance}"):
        for path in sorted(base.glob("**/"), key=lambda p: len(p.parts), reverse=True):
            # A process reaped a moment ago may keep its cgroup busy for a little while.
            if not wait_until(lambda p=path: _rmdir(p), GONE_TIMEOUT):
                held = (path / "cgroup.procs").read_text().split()
                problems.append(f"cgroup {path} left with processes {held}")
    return problems


def _cgroups_named(prefix: str) -> list[Path]:
    """The cgroups whose name starts with ``prefix``, in any cgroup hierarchy mounted here
    (v2, and v1 memory), at most four levels down."""
    points = [
        point
        for point, _root, fstype, options in cgroups._mounts()
        if fstype == "cgroup2" or (fstype == "cgroup" and "memory" in options)
    ]
    found = []
    for point in points:
        for top, dirs, _files in os.walk(point):
            depth = len(Path(top).relative_to(point).parts)
            found += [Path(top) / d for d in dirs if d.startswith(prefix)]
            dirs[:] = [d for d in dirs if not d.startswith(prefix)] if depth < 3 else []
    return found


def _rmdir(path: Path) -> bool:
    try:
        path.rmdir()
    except FileNotFoundError:
        return True
    except OSError:
        return False
    return True


def normalised_defs(text: str) -> list[tuple[Any, ...]]:
    """The definitions a YAML file means, without line numbers: (name, kind, parent, fields)."""
    from jobcontrol.definitions.parse import iter_defs, parse_definitions

    return [
        (d.name, str(d.kind), p.name if p else None, d.fields)
        for d, p in iter_defs(parse_definitions(text))
    ]


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path
