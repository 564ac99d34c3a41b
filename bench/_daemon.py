"""The real daemon as a separate process, driven through its CLI only.

Used by the benchmarks that must keep working while the engine's internals
change (``bench_many_trees``, ``bench_idle``): they never import ``jobcontrol``.
Everything goes through ``jobcontrol --db DB --state-dir DIR ...`` (``db
upgrade``, ``load FILE``, ``daemon start --port 0``, ``daemon stop --kill``);
results are read from the ``run`` table with plain SQL afterwards, and CPU use
from ``/proc/<pid>/stat``.

Also here: the CPU reading shared with the APScheduler baselines
(``_aps_child.py``) and the guard that keeps an hourly timer out of a
measurement window.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any

CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- CPU from /proc


@dataclass(frozen=True)
class Cpu:
    """One reading of ``/proc/<pid>/stat``: the process's own CPU (all its threads,
    utime + stime) and that of its children it has reaped (cutime + cstime), in s."""

    at: float  # time.monotonic() of the reading
    own: float
    children: float
    system: float = 0.0  # of ``own``, the part spent in the kernel (stime)

    def since(self, before: Cpu) -> tuple[float, float, float]:
        """(wall seconds, own CPU seconds, children's CPU seconds) between two readings."""
        return self.at - before.at, self.own - before.own, self.children - before.children


def cpu(pid: int | str = "self") -> Cpu:
    text = Path(f"/proc/{pid}/stat").read_text()
    # Field 2 (comm) is in parentheses and may contain spaces: split after the last ')'.
    fields = text[text.rindex(")") + 2 :].split()
    # fields[0] is field 3 (state); utime, stime, cutime, cstime are fields 14..17.
    utime, stime, cutime, cstime = (int(v) for v in fields[11:15])
    return Cpu(
        time.monotonic(),
        (utime + stime) / CLK_TCK,
        (cutime + cstime) / CLK_TCK,
        stime / CLK_TCK,
    )


@dataclass(frozen=True)
class Threads:
    """The live threads of a process, summed: CPU time from ``schedstat`` (nanoseconds,
    finer than the clock ticks of ``stat``) and context switches (each one a wake-up or
    a preemption). Threads that ended between two readings are missing from the second."""

    at: float
    count: int
    cpu_ns: int
    switches: int


def threads(pid: int) -> Threads:
    count = cpu_ns = switches = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            cpu_ns += int((task / "schedstat").read_text().split()[0])
            for line in (task / "status").read_text().splitlines():
                if "ctxt_switches:" in line:
                    switches += int(line.split(":")[1])
        except (OSError, ValueError, IndexError):
            continue  # the thread ended meanwhile
        count += 1
    return Threads(time.monotonic(), count, cpu_ns, switches)


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return state[state.rindex(")") + 2] != "Z"


# ---------------------------------------------------------------- the CLI


def cli_command() -> list[str]:
    """The ``jobcontrol`` console script beside this interpreter (``.venv/bin/jobcontrol``)."""
    script = Path(sys.executable).with_name("jobcontrol")
    if script.exists():
        return [str(script)]
    return [sys.executable, "-m", "jobcontrol"]


def cli_env(tmp: Path) -> dict[str, str]:
    """The environment for the CLI and the daemon: no ``JOBCONTROL_*`` from the caller
    (no other daemon's URL, token, port or database), config and state under ``tmp``
    (the admin token the daemon writes on its first start lands there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("JOBCONTROL_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "config")
    env["XDG_STATE_HOME"] = str(tmp / "xdg-state")
    return env


class CliDaemon:
    """One database and state directory; the daemon started and stopped through the CLI.

    A context manager: on exit a daemon still running is stopped with ``daemon stop
    --kill``, and if that fails the pid ``daemon start`` printed gets SIGKILL.
    """

    def __init__(self, db: str, tmp: Path, env: dict[str, str] | None = None) -> None:
        """``env``: settings for the daemon on top of ``cli_env`` (``JOBCONTROL_*``)."""
        self.db = db
        self.state_dir = tmp / "state"
        self.env = cli_env(tmp) | (env or {})
        self.pid: int | None = None
        self.workers: dict[str, int] = {}  # worker processes started: name -> pid

    def jc(self, *args: str, timeout: float = 120.0) -> str:
        argv = [*cli_command(), "--db", self.db, "--state-dir", str(self.state_dir), *args]
        proc = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=self.env,
            stdin=subprocess.DEVNULL,
            timeout=timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise SystemExit(
                f"`jobcontrol {' '.join(args)}` exited {proc.returncode}:\n"
                f"{proc.stdout}{proc.stderr}"
            )
        return proc.stdout

    def load(self, definitions: dict[str, Any], path: Path) -> str:
        """Write ``definitions`` (JSON, which the loader accepts as YAML) and load them."""
        path.write_text(json.dumps(definitions, indent=1))
        self.jc("db", "upgrade")
        return self.jc("load", str(path), timeout=300).strip()

    def start(self, *extra: str) -> int:
        """``daemon start --port 0`` (and ``extra`` options): returns once the daemon is
        ready; its pid."""
        out = self.jc("daemon", "start", "--port", "0", *extra, timeout=120)
        m = re.search(r"pid (\d+)", out)
        if m:
            self.pid = int(m.group(1))
        else:  # the pid file: daemon-<tag>.pid under the state dir
            pid_files = sorted(self.state_dir.glob("daemon-*.pid"))
            if not pid_files:
                raise SystemExit(f"`daemon start` printed no pid and left no pid file: {out!r}")
            self.pid = int(pid_files[0].read_text().split()[0])
        if not alive(self.pid):
            raise SystemExit(f"daemon pid {self.pid} is not running after `daemon start`")
        return self.pid

    def start_worker(self, name: str, slots: int) -> int:
        """``worker start``: a worker process of its own (PostgreSQL); its pid. Stopped
        with ``worker stop --kill`` before the daemon."""
        out = self.jc("worker", "start", "--name", name, "--slots", str(slots), timeout=120)
        m = re.search(r"pid (\d+)", out)
        if m is None:
            raise SystemExit(f"`worker start` printed no pid: {out!r}")
        self.workers[name] = int(m.group(1))
        return self.workers[name]

    def stop(self) -> None:
        for name, pid in list(self.workers.items()):
            del self.workers[name]
            try:
                self.jc("worker", "stop", "--name", name, "--kill", "--timeout", "60", timeout=90)
            finally:
                if alive(pid):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
        if self.pid is None:
            return
        pid, self.pid = self.pid, None
        try:
            self.jc("daemon", "stop", "--kill", "--timeout", "60", timeout=90)
        finally:
            # Bounded: the CLI waited up to 60 s already; make sure nothing is left behind.
            deadline = time.monotonic() + 5
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

    def log_lines(self, containing: str) -> list[str]:
        """The daemon log's lines that contain ``containing``."""
        return [
            line
            for log in sorted(self.state_dir.glob("daemon-*.log"))
            for line in log.read_text(errors="replace").splitlines()
            if containing in line
        ]

    def log_tail(self, lines: int = 15) -> str:
        logs = sorted(self.state_dir.glob("daemon-*.log"))
        if not logs:
            return ""
        return "\n".join(logs[0].read_text(errors="replace").splitlines()[-lines:])

    def __enter__(self) -> CliDaemon:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self.pid is not None or self.workers:
            try:
                self.stop()
            except (SystemExit, subprocess.SubprocessError) as err:
                print(f"  (stopping the daemon: {err})", file=sys.stderr)


def one_task_trees(n: int, timer: str, prefix: str = "tree") -> dict[str, Any]:
    """``n`` active top-level boxes with ``timer``, each with one active task ``true``."""
    return {
        "jobs": [
            {
                "name": f"{prefix}-{i:04d}",
                "timer": timer,
                "active": True,
                "children": [{"name": f"{prefix}-{i:04d}-task", "active": True, "command": "true"}],
            }
            for i in range(n)
        ]
    }


# ---------------------------------------------------------------- the run table


@dataclass(frozen=True)
class RunRow:
    id: int
    job_name: str
    kind: str
    trigger: str
    state: str
    parent_run_id: int | None
    root_run_id: int | None
    created: datetime | None
    started: datetime | None
    ended: datetime | None


def _utc(value: Any) -> datetime | None:
    """A timestamp column read with plain SQL: naive UTC (a string on SQLite)."""
    if value is None:
        return None
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


def read_runs(db: str) -> list[RunRow]:
    """Every row of the ``run`` table, oldest first (plain SQL, no ``jobcontrol`` import)."""
    from sqlalchemy import create_engine, text

    url = db if "://" in db else f"sqlite:///{db}"
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT id, job_name, kind, trigger, state, parent_run_id, root_run_id,"
                    " created, started, ended FROM run ORDER BY id"
                )
            ).all()
    finally:
        engine.dispose()
    return [
        RunRow(
            r.id,
            r.job_name,
            r.kind,
            r.trigger,
            r.state,
            r.parent_run_id,
            r.root_run_id,
            _utc(r.created),
            _utc(r.started),
            _utc(r.ended),
        )
        for r in rows
    ]


# ---------------------------------------------------------------- hourly timers


def clear_of_the_hour(span_s: float, margin_s: float = 20.0) -> None:
    """Wait (bounded) if the next local whole hour falls within the next ``span_s``
    seconds, so that hourly timers (``cron 0 * * * *``, ``CronTrigger(minute=0)``)
    stay out of the measurement; resumes ``margin_s`` after that hour."""
    now = datetime.now().astimezone()
    next_hour = now.replace(minute=0, second=0, microsecond=0) + timedelta(hours=1)
    until = (next_hour - now).total_seconds()
    if until < span_s + margin_s:
        wait = until + margin_s
        print(f"  (waiting {wait:.0f} s: the hourly timers fire at {next_hour:%H:%M})", flush=True)
        time.sleep(wait)


@contextlib.contextmanager
def child_process(argv: list[str]) -> Iterator[subprocess.Popen[str]]:
    """A child with pipes on stdin/stdout; killed (and reaped) on exit if still running."""
    proc = subprocess.Popen(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait(10)
        for pipe in (proc.stdin, proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
