"""Task processes: spawn them, find them through /proc, kill whole trees, notify systemd.

Every task process carries marker variables in its environment (``JOBCONTROL_RUN_ID``,
``JOBCONTROL_INSTANCE``). Descendants inherit them, so a process that left the task's
process group (``setsid``, or reparented to init) is still found by scanning
``/proc/<pid>/environ``.
"""

from __future__ import annotations

import logging
import math
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import IO, NamedTuple

from jobcontrol import cpupin

log = logging.getLogger(__name__)

# Variables a task process carries (``KEY: value``), or must not carry (``KEY: None``).
Marker = Mapping[str, str | None]

_PROC = "/proc"
# Zombies and dead tasks hold no resources we can free: their parent reaps them.
_DEAD_STATES = frozenset("ZXx")
_SETTLE = 0.1  # seconds between the last two scans of a kill
_POLL_FIRST = 0.005
_POLL_MAX = 0.1
# After SIGKILL, how long past the grace period we keep re-scanning for marked processes.
_KILL_EXTRA = 5.0
_ENVIRON_CHUNK = 65536
_PF_KTHREAD = 0x00200000
# The longest single poll(2) wait: its timeout is a C int of milliseconds.
_POLL_MAX_MS = 2**31 - 1

# How long find_marked waits for a process in the middle of execve to get its environment
# back. Microseconds on a quiet host; a loaded one (two cores, a test suite's worth of
# processes) preempted one past 50 ms, and a task missed so escapes kill_tree's scan.
_EXEC_WAIT = 0.5


@dataclass(frozen=True)
class KillReport:
    """What kill_tree did: pids sent SIGTERM, pids sent SIGKILL, pids still alive at the end."""

    termed: list[int]
    killed: list[int]
    survivors: list[int]


class _ProcStat(NamedTuple):
    ppid: int
    pgrp: int
    state: str


_devnull: int | None = None
_DEVNULL_LOCK = threading.Lock()


def _stdin() -> int:
    """``/dev/null`` for every task's stdin, opened once by the process (close-on-exec:
    a task gets it as its fd 0 only), read-write as ``subprocess.DEVNULL`` opens it.

    ``stdin=DEVNULL`` made each ``Popen`` open ``/dev/null`` and close it again, two more
    system calls on every task's start, each of which lets go of the interpreter lock,
    and a ``contextlib.ExitStack`` callback for the close. ``Popen._close_pipe_fds``
    fell from 5.5 to 3.7 % of a busy daemon's lock-holding samples (bench/README.md,
    thirtieth round)."""
    global _devnull
    fd = _devnull
    if fd is None:
        with _DEVNULL_LOCK:
            if _devnull is None:
                _devnull = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
            fd = _devnull
    return fd


def spawn(
    command: str,
    *,
    stdout: int | IO[bytes],
    cwd: str | None,
    env: Mapping[str, str],
    prelude: str = "",
) -> subprocess.Popen[bytes]:
    """Run ``/bin/sh -c command`` in a new session, stdout and stderr both to ``stdout``.

    ``env`` is the complete environment; ``prelude`` is shell text run first, on the
    command's line (a cgroup's join script). OSError (a missing ``cwd``, ...) propagates.
    """
    # No preexec_fn and nothing else that would stop CPython from using vfork: the
    # benchmark compares this against a bare subprocess.run of /bin/sh. The task gets
    # every CPU of the process's set, even while its threads are kept on one.
    leave = cpupin.enter_spawn()
    try:
        return subprocess.Popen(
            ["/bin/sh", "-c", prelude + command],
            stdin=_stdin(),
            stdout=stdout,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=env,
            start_new_session=True,
            close_fds=True,
        )
    finally:
        if leave:
            cpupin.leave_spawn()


def wait_child(proc: subprocess.Popen[bytes], timeout: float | None) -> int | None:
    """Wait for a child to exit; its return code, or None if ``timeout`` passed first.

    ``Popen.wait(timeout)`` polls with sleeps (0.5 ms, then doubling), which adds
    up to a millisecond to every short task; a pidfd blocks in ``poll`` instead
    and wakes the moment the child exits.
    """
    if timeout is None:
        return proc.wait()
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # no pidfd (old kernel), or already reaped
        try:
            return proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        # poll(2) takes an int of milliseconds: a timeout of weeks is waited in pieces.
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if poller.poll(max(0, min(_POLL_MAX_MS, math.ceil(left * 1000)))):
                break
            if left <= _POLL_MAX_MS / 1000:
                return None
    finally:
        os.close(pidfd)
    return proc.wait()


def pid_alive(pid: int) -> bool:
    """True when ``pid`` is a live process that is not a zombie."""
    if pid <= 0:
        return False
    stat = _read_stat(pid)
    if stat is not None:
        return stat.state not in _DEAD_STATES
    # /proc may hide other users' processes (hidepid): fall back to the signal probe.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def pid_stopped(pid: int) -> bool:
    """True when ``pid`` is stopped by a signal (SIGSTOP, SIGTSTP: state ``T``) or by a
    debugger (``t``): alive, but it does nothing until continued."""
    stat = _read_stat(pid)
    return stat is not None and stat.state in ("T", "t")


def start_time(pid: int) -> int | None:
    """When the process started (clock ticks since boot), or None if it is gone.

    With the pid it names one process for good: a pid alone may have been reused.
    """
    data = _read_stat_bytes(pid)
    if data is None:
        return None
    fields = _stat_fields(data)
    try:
        return int(fields[19])  # field 22 of stat(5), counted after the ")" of comm
    except (IndexError, ValueError):
        return None


def find_marked(marker: Marker) -> list[int]:
    """Pids of live processes whose environment holds every ``KEY=VALUE`` pair of ``marker``
    and none of its ``KEY: None`` variables, whatever their value (a remote worker's task
    carries ``JOBCONTROL_WORKER``; the embedded worker's does not).

    Zombies, unreadable and vanished processes are skipped; the calling process never
    appears. A marker with no ``KEY=VALUE`` pair is refused (it would match every process,
    or nearly).
    """
    needles, absent = _marker_needles(marker)
    me = os.getpid()
    found: list[int] = []
    for pid in _list_pids():
        if pid == me:
            continue
        environ = _read_environ(pid)
        if environ == b"":
            environ = _reread_after_exec(pid)
        if not environ:
            continue
        # Wrap in separators so each needle matches whole variables only ("ID=7" not "ID=77").
        environ = b"\0" + environ + b"\0"
        if (
            all(needle in environ for needle in needles)
            and not any(var in environ for var in absent)
            and pid_alive(pid)
        ):
            found.append(pid)
    return found


def descendants(pid: int) -> list[int]:
    """Live descendants of ``pid``, found by walking the ppid links in /proc/*/stat."""
    return sorted(_descendants_in(_process_table(), [pid]))


def kill_tree(
    pid: int | None,
    *,
    marker: Marker | None,
    grace: float = 5.0,
    wait_exit: Callable[[float], bool] | None = None,
    members: Callable[[], Iterable[int]] | None = None,
) -> KillReport:
    """Stop the process group of ``pid``, its descendants and every process carrying ``marker``
    or listed by ``members()`` (the processes of the run's cgroup).

    SIGTERM (and SIGCONT, so stopped processes see it) first; after up to ``grace``
    seconds SIGKILL to whatever is left, re-scanning until nothing is left or
    ``grace + 5`` seconds have passed. ``wait_exit(timeout) -> bool`` waits on (and so
    reaps) the caller's own child ``pid``. ``pid`` must lead its process group, as the
    processes from :func:`spawn` do.
    """
    if marker is not None:
        _marker_needles(marker)  # refuse a bad marker before signalling anything
    start = time.monotonic()
    known = _collect(pid, marker, members() if members is not None else ())
    termed = _send(pid, known, signal.SIGTERM)
    _send(pid, known, signal.SIGCONT, quiet=True)
    log.debug("kill_tree pid=%s: SIGTERM to %s", pid, termed)
    known = _wait_gone(pid, marker, known, start + grace, wait_exit)
    killed, survivors = _kill_survivors(pid, marker, known, start + grace + _KILL_EXTRA)
    if wait_exit is not None and pid is not None:
        # Reap the caller's child now that it has been killed; bounded by the same deadline.
        wait_exit(max(0.0, start + grace + _KILL_EXTRA - time.monotonic()))
    if killed:
        log.info("kill_tree pid=%s: SIGKILL to %s after %.1f s", pid, killed, grace)
    if survivors:
        log.warning("kill_tree pid=%s: processes survived SIGKILL: %s", pid, survivors)
    return KillReport(termed=termed, killed=killed, survivors=survivors)


def sd_notify(message: str, address: str | None = None) -> bool:
    """Send ``message`` (e.g. ``"READY=1"``) to systemd's $NOTIFY_SOCKET, or to ``address``.

    Returns True when sent, False when there is no address or sending failed
    (failures are logged, never raised).
    """
    if address is None:
        address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    where = address
    if where.startswith("@"):
        where = "\0" + where[1:]
    elif not where.startswith("/"):
        log.warning("notify socket %r is not an AF_UNIX address; %r not sent", address, message)
        return False
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.sendto(message.encode(), where)
    except OSError as exc:
        log.warning("sd_notify %r to %r failed: %s", message, address, exc)
        return False
    return True


def _marker_needles(marker: Marker) -> tuple[list[bytes], list[bytes]]:
    """The whole variables a marked environment holds, and the names it must not hold."""
    if not any(value is not None for value in marker.values()):
        raise ValueError("a process marker with no KEY=VALUE would match every process")
    needles, absent = [], []
    for key, value in marker.items():
        if not key or "=" in key or "\0" in key or (value is not None and "\0" in value):
            raise ValueError(f"invalid process marker variable {key!r}={value!r}")
        if value is None:
            absent.append(b"\0" + os.fsencode(key) + b"=")
        else:
            needles.append(b"\0" + os.fsencode(f"{key}={value}") + b"\0")
    return needles, absent


def _list_pids() -> list[int]:
    with os.scandir(_PROC) as entries:
        return [int(entry.name) for entry in entries if entry.name.isdigit()]


def _read_environ(pid: int) -> bytes | None:
    # os.open/os.read: a file object per process costs more than the read itself.
    try:
        fd = os.open(f"{_PROC}/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, _ENVIRON_CHUNK):
            chunks.append(chunk)
        return b"".join(chunks)
    except OSError:  # ESRCH when the process exits between open and read
        return None
    finally:
        os.close(fd)


def _read_stat_bytes(pid: int) -> bytes | None:
    try:
        fd = os.open(f"{_PROC}/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)


def _stat_fields(data: bytes) -> list[bytes]:
    # "pid (comm) state ppid pgrp ...": comm may contain spaces and parentheses.
    return data[data.rfind(b")") + 2 :].split()


def _read_stat(pid: int) -> _ProcStat | None:
    data = _read_stat_bytes(pid)
    if data is None:
        return None
    fields = _stat_fields(data)
    try:
        return _ProcStat(ppid=int(fields[1]), pgrp=int(fields[2]), state=fields[0].decode())
    except (IndexError, ValueError):
        return None


def _exec_in_progress(pid: int) -> bool:
    """True while execve has installed the new memory map but not yet its environment.

    In that window /proc/<pid>/environ reads empty, so a marked process would be missed.
    Kernel threads, zombies and processes started with an empty environment (whose
    env_end is set) do not count.
    """
    data = _read_stat_bytes(pid)
    if data is None:
        return False
    fields = _stat_fields(data)
    try:
        state, flags, env_end = fields[0].decode(), int(fields[6]), int(fields[48])
    except (IndexError, ValueError):  # kernels before 3.5 have no env_end field
        return False
    return state not in _DEAD_STATES and not flags & _PF_KTHREAD and env_end == 0


def _reread_after_exec(pid: int) -> bytes | None:
    deadline = time.monotonic() + _EXEC_WAIT
    while _exec_in_progress(pid):
        if time.monotonic() > deadline:
            log.debug(
                "pid %d still in execve after %.2f s; its environment is unread", pid, _EXEC_WAIT
            )
            return None
        time.sleep(0.0005)
    return _read_environ(pid)


def _process_table() -> dict[int, _ProcStat]:
    """Live (non-zombie) processes; zombies have no children left to walk to."""
    table: dict[int, _ProcStat] = {}
    for pid in _list_pids():
        stat = _read_stat(pid)
        if stat is not None and stat.state not in _DEAD_STATES:
            table[pid] = stat
    return table


def _descendants_in(table: Mapping[int, _ProcStat], roots: Iterable[int]) -> set[int]:
    children: dict[int, list[int]] = {}
    for child, stat in table.items():
        children.setdefault(stat.ppid, []).append(child)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _collect(pid: int | None, marker: Marker | None, known: Iterable[int]) -> set[int]:
    """Everything that belongs to the run and is still alive."""
    table = _process_table()
    found = {p for p in known if p in table}
    if pid is not None:
        if pid in table:
            found.add(pid)
        found.update(p for p, stat in table.items() if stat.pgrp == pid)
    if marker is not None:
        found.update(p for p in find_marked(marker) if p in table)
    # Children of any member belong to the run too, even ones that reset their environment.
    found |= _descendants_in(table, found)
    found.discard(os.getpid())
    return found


def _send(pid: int | None, targets: Iterable[int], sig: int, *, quiet: bool = False) -> list[int]:
    """Signal each target, then the process group of ``pid``; return the pids signalled."""
    # Individual pids first: signalling the group first could let a member die and be
    # reaped before its own kill, and it would then be missing from the report.
    sent: list[int] = []
    for target in sorted(targets):
        try:
            os.kill(target, sig)
        except ProcessLookupError:
            continue  # exited meanwhile: that is what we wanted
        except PermissionError:
            if not quiet:
                log.warning("not permitted to send signal %d to pid %d", sig, target)
            continue
        sent.append(target)
    # The group catches members /proc did not show us. Never signal our own group: a
    # pid that is not a group leader must not take us down.
    if pid is not None and pid > 0 and pid != os.getpgrp():
        try:
            os.killpg(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass  # the group is gone already, or holds nothing we may signal
    return sent


def _wait_gone(
    pid: int | None,
    marker: Marker | None,
    known: set[int],
    deadline: float,
    wait_exit: Callable[[float], bool] | None,
) -> set[int]:
    """Wait until nothing of the run is left or ``deadline``; return what is still alive."""
    if wait_exit is not None and pid is not None:
        wait_exit(max(0.0, deadline - time.monotonic()))
    delay = _POLL_FIRST
    confirmed = False
    while True:
        alive = _collect(pid, marker, known)
        if not alive:
            if confirmed or marker is None:
                return set()
            # One more look after a pause: a marked process caught in the middle of an
            # exec reads as unmarked, and an orphan has no parent to lead us to it.
            confirmed = True
            time.sleep(_SETTLE)
            continue
        confirmed = False
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return alive
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _POLL_MAX)


def _kill_survivors(
    pid: int | None, marker: Marker | None, known: set[int], deadline: float
) -> tuple[list[int], list[int]]:
    """SIGKILL until nothing of the run is left or ``deadline``; return (killed, survivors)."""
    killed: set[int] = set()
    alive = known
    delay = _POLL_FIRST
    while alive:
        killed.update(_send(pid, alive, signal.SIGKILL))
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            alive = _collect(pid, marker, alive)  # what the last SIGKILL left standing
            break
        time.sleep(min(delay, remaining))
        delay = min(delay * 2, _POLL_MAX)
        # Re-scan: a marked process may have forked between our scan and its death.
        alive = _collect(pid, marker, alive)
    return sorted(killed), sorted(alive)
