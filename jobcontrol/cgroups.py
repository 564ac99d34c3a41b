"""Task runs in cgroups: each run its own cgroup, killed whole, its CPU time and peak memory read.

Where the machine allows it (a writable cgroup v2 hierarchy: root, or a systemd unit with
``Delegate=yes``), every task run gets a cgroup of its own,
``<the daemon's cgroup>/jobcontrol-<instance>/run-<id>``. The task's shell puts itself
there before it runs the command (``echo $$ > .../cgroup.procs``, a builtin: no extra
fork or exec, nothing that stops ``subprocess`` from using vfork), so everything the task
starts is in it, whatever it does to its session or environment. Kill ends with
``cgroup.kill``, which no process escapes. At the run's end its CPU time (``cpu.stat``)
and peak memory (``memory.peak``) are read and the cgroup is removed.

Memory is a controller, which a cgroup passes down only while it holds no process of its
own: a daemon alone in its cgroup (a systemd unit with ``Delegate=yes``) moves itself into
the leaf ``supervisor`` first. When the cgroup v2 hierarchy does not have it (a hybrid layout
keeps the controllers on cgroup v1), the run also joins a cgroup of its own in the v1
``memory`` hierarchy, read from ``memory.max_usage_in_bytes``. Without either, the peak is
not recorded.

When cgroups cannot be used (no cgroup2 mount, not writable, no ``cgroup.kill``), or
``$JOBCONTROL_CGROUPS=off``, nothing here is used: kill falls back to the process group
and the environment marker (``procs``), and ``Containment.describe`` says why.
"""

from __future__ import annotations

import errno
import heapq
import itertools
import logging
import os
import re
import shlex
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from jobcontrol.errors import OptionError

log = logging.getLogger(__name__)

# The daemon's setting: "auto" (cgroups where they work, else the fallback) or "off".
ENV_VAR = "JOBCONTROL_CGROUPS"
MODES = ("auto", "off")
# The exit status, and the line in the task's log, of a task whose shell could not join
# its cgroup: it stops before the command, and the worker records the run as refused.
JOIN_FAILED_STATUS = 125
JOIN_FAILED_LINE = "jobcontrol: not started: the task could not join its cgroup"
FALLBACK = "process group + environment marker"

_MOUNTINFO = "/proc/self/mountinfo"
_FEATURES = "/sys/kernel/cgroup/features"
_RCU_EXPEDITED = "/sys/kernel/rcu_expedited"
_SELF_CGROUP = "/proc/self/cgroup"
_EMPTY_WAIT = 5.0  # how long kill waits for a killed cgroup to empty before giving up on it
_SAFE = re.compile(r"[^A-Za-z0-9_.-]")


class ContainmentError(RuntimeError):
    """A run's cgroup could not be made: the run is refused rather than run uncontained."""


@dataclass(frozen=True)
class RunUsage:
    """What a run used, from its cgroup: CPU time (user + system) and peak memory."""

    cpu_us: int | None = None
    mem_peak_bytes: int | None = None


_JOIN_FAIL = f"{{ echo {shlex.quote(JOIN_FAILED_LINE)} >&2; exit {JOIN_FAILED_STATUS}; }}"


@dataclass(frozen=True)
class RunCgroup:
    """One run's cgroup (v2), and its v1 memory cgroup in a hybrid layout.

    Its directories are also kept as text (``dirs``): the files a run's start and end
    touch are named by joining text, not ``Path`` objects, on every task's path
    (bench/README.md, twenty-third round)."""

    path: Path
    memory_v1: Path | None = None
    # ``path`` and ``memory_v1`` as text, the v2 one first.
    dirs: tuple[str, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        dirs = (
            (str(self.path),) if self.memory_v1 is None else (str(self.path), str(self.memory_v1))
        )
        object.__setattr__(self, "dirs", dirs)

    def join_script(self) -> str:
        """Shell text that puts the shell into the cgroup(s), or stops it with a reason."""
        writes = " && ".join(f"echo $$ >{shlex.quote(d + '/cgroup.procs')}" for d in self.dirs)
        return f"{{ {writes}; }} || {_JOIN_FAIL}; "

    def pids(self) -> list[int]:
        """The processes in the run's cgroup now (none once it is gone)."""
        try:
            text = (self.path / "cgroup.procs").read_text()
        except OSError:
            return []
        return [int(line) for line in text.split()]

    def populated(self) -> bool:
        try:
            text = (self.path / "cgroup.events").read_text()
        except FileNotFoundError:
            return False
        return "populated 1" in text

    def kill(self, wait: float = _EMPTY_WAIT) -> bool:
        """SIGKILL every process in the cgroup at once; True once it is empty."""
        try:
            (self.path / "cgroup.kill").write_text("1")
        except FileNotFoundError:
            return True  # removed already: nothing is left in it
        deadline = time.monotonic() + wait
        while self.populated():
            if time.monotonic() > deadline:
                log.warning(
                    "cgroup %s still has processes %.1f s after cgroup.kill", self.path, wait
                )
                return False
            time.sleep(0.005)
        return True

    def usage(self) -> RunUsage:
        """CPU time and peak memory so far; a figure that cannot be read is None (logged)."""
        dirs = self.dirs
        try:
            cpu = _read_key(f"{dirs[0]}/cpu.stat", "usage_usec", gone=FileNotFoundError)
        except FileNotFoundError:
            # Removed by whoever collected the run: the dispatcher settled it (its worker
            # was stopped past its lease) and killed what it left. Not a fault of reading.
            log.info("cgroup %s is gone (its run was collected meanwhile): no usage", dirs[0])
            return RunUsage()
        peak: int | None = None
        if len(dirs) > 1:
            peak = _read_int(f"{dirs[1]}/memory.max_usage_in_bytes")
        elif os.path.exists(f"{dirs[0]}/memory.peak"):
            peak = _read_int(f"{dirs[0]}/memory.peak")
        return RunUsage(cpu_us=cpu, mem_peak_bytes=peak)

    def remove(self) -> bool:
        """Remove the cgroup(s); False while processes remain (they are left running)."""
        done = True
        for path in self.dirs:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno != errno.EBUSY:
                    log.warning("cannot remove cgroup %s: %s", path, exc)
                done = False
        return done


@dataclass
class Containment:
    """How a worker contains its task runs: cgroups under ``base``, or the fallback."""

    base: Path | None
    memory_base: Path | None = None
    reason: str = ""  # why the fallback is in force, or what is missing (memory)
    advice: str = ""  # what the host could change to start runs sooner (``join_advice``)
    # Keeps joins cheap ahead of timers where the kernel would make them wait (``JoinWarmer``).
    warmer: JoinWarmer | None = None
    _lingering: dict[int, RunCgroup] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def enabled(self) -> bool:
        return self.base is not None

    @classmethod
    def fallback(cls, reason: str) -> Containment:
        return cls(base=None, reason=reason)

    @classmethod
    def setup(cls, instance_id: str, mode: str = "auto") -> Containment:
        """Cgroups for this database's runs if this machine lets us, else the fallback."""
        check_mode(mode)
        if mode == "off":
            return cls.fallback(f"cgroups turned off by ${ENV_VAR}=off")
        try:
            containment = _setup(f"jobcontrol-{_SAFE.sub('_', instance_id)}")
        except _Unavailable as exc:
            return cls.fallback(str(exc))
        assert containment.base is not None
        for left in containment.base.glob("warm-*"):  # an earlier daemon's, killed
            _rmdir_quietly(left)  # (a live one's holds its helper and stays)
        return containment

    def describe(self) -> str:
        """One line for status: which mechanism kills task runs, and why."""
        if self.base is None:
            return f"{FALLBACK} ({self.reason})"
        if self.memory_base is not None:
            memory = f"memory from cgroup v1 {self.memory_base}"
        elif self.reason:
            memory = f"no peak memory: {self.reason}"
        else:
            memory = "memory.peak"
        warm = f"; {self.warmer.describe()}" if self.warmer is not None else ""
        return f"cgroup {self.base} (cgroup.kill; {memory}){warm}"

    def create(self, run_id: int) -> RunCgroup | None:
        """A fresh cgroup for ``run_id`` (None under the fallback); ContainmentError if
        it cannot be made, so the run is refused rather than run uncontained."""
        if self.base is None:
            return None
        if self.warmer is not None:
            self.warmer.joining()
        name = f"run-{run_id}"
        memory = self.memory_base
        cg = RunCgroup(self.base / name, None if memory is None else memory / name)
        for i, path in enumerate(cg.dirs):
            try:
                os.mkdir(path)
            except FileExistsError:
                # Left by an earlier try of the same run (a crash): reuse it if empty.
                if i == 0 and cg.populated():
                    raise ContainmentError(f"cgroup {path} already holds processes") from None
            except OSError as exc:
                cg.remove()
                raise ContainmentError(f"cannot create cgroup {path}: {exc.strerror}") from exc
        return cg

    def release(self, cg: RunCgroup) -> None:
        """The run ended: remove its cgroup, or keep it until the processes it left end."""
        if not cg.remove():
            with self._lock:
                self._lingering[id(cg)] = cg

    def sweep(self) -> None:
        """Remove the cgroups of ended runs whose background processes have ended since."""
        with self._lock:
            for key, cg in list(self._lingering.items()):
                if cg.remove():
                    del self._lingering[key]

    def close(self) -> None:
        """The worker stops: remove what is empty, the base included (if it is empty)."""
        if self.warmer is not None:
            self.warmer.close()
        self.sweep()
        for path in (self.base, self.memory_base):
            if path is None:
                continue
            try:
                path.rmdir()
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOENT, errno.ENOTEMPTY):
                    log.warning("cannot remove cgroup %s: %s", path, exc)

    def joins_wait(self) -> bool:
        """Whether a run's join may wait for an RCU grace period here: cgroups in use, the
        mount without ``favordynmods`` and grace periods not expedited host-wide."""
        if self.base is None:
            return False
        try:
            mount = _find_mount("cgroup2")
        except OSError:
            mount = None
        if mount is not None and "favordynmods" in _mount_options(mount[0]):
            return False
        try:
            return Path(_RCU_EXPEDITED).read_text().strip() != "1"
        except OSError:
            return True

    def run_ids(self) -> list[int]:
        """The runs that have a cgroup under ``base`` now (this daemon's or an earlier one's)."""
        if self.base is None:
            return []
        found = []
        for path in self.base.glob("run-*"):
            suffix = path.name.removeprefix("run-")
            if suffix.isdigit():
                found.append(int(suffix))
        return sorted(found)

    def kill_leftovers(self, run_ids: Iterable[int] | None) -> list[int]:
        """Kill whatever is left in the cgroups of ``run_ids`` (None: of every run) that an
        earlier daemon of this database left behind; the pids that were in them."""
        if self.base is None:
            return []
        if run_ids is None:
            paths = sorted(self.base.glob("run-*"))
        else:
            paths = [self.base / f"run-{i}" for i in run_ids]
        found: list[int] = []
        for path in paths:
            if not path.is_dir():
                continue
            cg = RunCgroup(path, self.memory_base / path.name if self.memory_base else None)
            found += cg.pids()
            cg.kill()
            cg.remove()
        return found


class JoinWarmer:
    """Keeps cgroup joins cheap around the instants timers are due.

    A process changes cgroups under a lock that the kernel hands out at once only while
    such a change happened a few milliseconds ago: after a quiet spell the first change
    waits for an RCU grace period (5 to 14 ms on the machine we measure on), so a timer's
    task, whose shell joins its cgroup, started that much late (bench/README.md). Unless
    the host mounts cgroup2 with ``favordynmods``, this keeps the lock's fast path open
    from ``lead`` before each due instant until ``tail`` after it by moving a parked
    helper process (``/bin/sh`` waiting on a pipe) between two cgroups of its own under
    ``base`` every ``period``; a run's own join (``joining``) counts as one. The first
    move of a window may itself wait the grace period: ``lead`` covers it.

    Fed with the dispatcher's timers (``timer_changed``, the timer service's listener).
    ``announce`` (PostgreSQL: the relay) tells worker processes, which do not know the
    timers, as each window opens how long to keep their own joins warm; theirs hear it
    as ``keep_warm_for``. With ``base`` None it only announces (a daemon that runs no
    task, or whose joins never wait). The helper ends with its process, even a killed
    one (end of file on its pipe), and its cgroups go with ``close`` or with the next
    ``Containment.setup``. A move that fails is logged once, counted in ``failures``
    and ``problem``, and tried again after ``retry_every`` with a new helper.
    """

    LEAD = 0.030
    TAIL = 0.050
    PERIOD = 0.005
    RETRY_EVERY = 30.0  # seconds between attempts to start a helper after a failure
    HORIZON = 0.1  # an announcement covers this much past the window it was made for

    def __init__(
        self,
        base: Path | None,
        *,
        announce: Callable[[float], None] | None = None,
        lead: float = LEAD,
        tail: float = TAIL,
        period: float = PERIOD,
        retry_every: float = RETRY_EVERY,
    ) -> None:
        self.base = base
        self.announce = announce
        self.lead, self.tail, self.period = lead, tail, period
        self.retry_every = retry_every
        self.moves = 0  # helper moves made
        self.recent_moves: deque[float] = deque(maxlen=64)  # when (epoch seconds), newest last
        self.announced = 0  # announcements made
        self.failures = 0  # moves or helper starts that failed
        self.problem = ""  # why warming is off now ("" while it works)
        # Windows (start, end) in epoch seconds, by timer key; the heap holds them by
        # start, with entries of windows replaced or cancelled since left to drop lazily.
        self._windows: dict[Hashable, tuple[float, float]] = {}
        self._heap: list[tuple[float, float, int, Hashable]] = []
        self._seq = itertools.count()
        self._cond = threading.Condition()
        self._wake_at = float("inf")  # when the thread wakes next (epoch seconds)
        self._stopping = False
        self._last_move = 0.0  # monotonic, a move or a run's join
        self._told_until = 0.0  # the end of the last announcement (epoch seconds)
        self._helper: subprocess.Popen[bytes] | None = None
        self._targets: list[int] = []  # open cgroup.procs of the two cgroups
        self._pid = b""
        self._flip = 0
        self._retry_at = 0.0
        self._thread = threading.Thread(target=self._run, name="cgroup-warmer", daemon=True)

    def start(self) -> JoinWarmer:
        if self.base is not None:
            self._start_helper()
        self._thread.start()
        return self

    def timer_changed(self, key: Hashable, when: datetime | None) -> None:
        """A timer was armed for ``when`` (None: cancelled); the timer service's listener."""
        if when is None:
            with self._cond:
                self._windows.pop(key, None)  # its heap entry goes when it comes up
            return
        due = when.timestamp()
        self._add(key, due - self.lead, due + self.tail)

    def keep_warm_for(self, seconds: float, **_: Any) -> None:
        """Runs are due within ``seconds`` (another process's timers): warm until then."""
        now = time.time()
        self._add(("announced", next(self._seq)), now, now + min(max(seconds, 0.0), 10.0))

    @property
    def helper_pid(self) -> int | None:
        helper = self._helper
        return helper.pid if helper is not None else None

    def upcoming(self) -> tuple[float, float] | None:
        """The earliest window (start, end; epoch seconds) that has not ended, if any."""
        with self._cond:
            return self._next_window(time.time())

    def joining(self) -> None:
        """A run's shell is about to join its cgroup: that keeps the fast path open too."""
        self._last_move = time.monotonic()

    def describe(self) -> str:
        if self.problem:
            return f"cgroup joins not kept warm ({self.problem})"
        return "cgroup joins kept warm around timers"

    def close(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(5.0)
        self._stop_helper()
        if self.base is not None:
            for name in self._names():
                _rmdir_quietly(self.base / name)

    # ------------------------------------------------------------ the thread

    def _add(self, key: Hashable, start: float, end: float) -> None:
        with self._cond:
            self._windows[key] = (start, end)
            heapq.heappush(self._heap, (start, end, next(self._seq), key))
            if len(self._heap) > 2 * len(self._windows) + 64:
                self._heap = [(s, e, next(self._seq), k) for k, (s, e) in self._windows.items()]
                heapq.heapify(self._heap)
            if start < self._wake_at:
                self._cond.notify()

    def _run(self) -> None:
        while True:
            with self._cond:
                while True:
                    if self._stopping:
                        return
                    now = time.time()
                    window = self._next_window(now)
                    if window is None:
                        self._wake_at = float("inf")
                        self._cond.wait()
                        continue
                    if now < window[0]:
                        self._wake_at = window[0]
                        self._cond.wait(window[0] - now)
                        continue
                    break
            if self.announce is not None and window[1] > self._told_until:
                self._announce(now, window[1])
            pause = self.period
            if self.base is None:  # it only announces: next when what it told runs out
                pause = max(pause, self._told_until - self.lead - time.time())
            elif time.monotonic() - self._last_move >= self.period * 0.8:
                self._move()
            with self._cond:
                self._wake_at = time.time() + pause
                if not self._stopping:
                    self._cond.wait(pause)

    def _next_window(self, now: float) -> tuple[float, float] | None:
        """The window with the earliest start that has not ended (ended ones are dropped)."""
        heap = self._heap
        while heap:
            start, end, _, key = heap[0]
            if self._windows.get(key) != (start, end):
                heapq.heappop(heap)  # cancelled or re-armed since
            elif end < now:
                heapq.heappop(heap)
                del self._windows[key]
            else:
                return start, end
        return None

    def _announce(self, now: float, end: float) -> None:
        assert self.announce is not None
        seconds = end - now + self.HORIZON
        self._told_until = now + seconds
        try:
            self.announce(seconds)
        except Exception:  # a hint only: the workers' joins may wait, nothing else
            log.exception("cannot tell worker processes that timers are due")
            self.failures += 1  # last: a reader that sees the count sees the rest
            return
        self.announced += 1

    def _move(self) -> None:
        if not self._targets:
            if time.monotonic() < self._retry_at:
                return
            self._start_helper()
            if not self._targets:
                return
        helper = self._helper
        if helper is not None and helper.poll() is not None:  # a dead one would "move" fine
            self._fail(f"the helper (pid {helper.pid}) ended: {helper.returncode}")
            return
        self._flip ^= 1
        try:
            os.write(self._targets[self._flip], self._pid)
        except OSError as exc:
            self._fail(f"cannot move the helper into {self._dirs()[self._flip]}: {exc.strerror}")
            return
        self._last_move = time.monotonic()
        self.recent_moves.append(time.time())
        self.moves += 1

    # ------------------------------------------------------------ the helper

    def _names(self) -> tuple[str, str]:
        return (f"warm-{os.getpid()}-a", f"warm-{os.getpid()}-b")

    def _dirs(self) -> list[Path]:
        assert self.base is not None
        return [self.base / name for name in self._names()]

    def _start_helper(self) -> None:
        self._stop_helper()
        try:
            for path in self._dirs():
                path.mkdir(exist_ok=True)
            # It waits for the end of its pipe: its parent's exit, however it exits.
            self._helper = subprocess.Popen(
                ["/bin/sh", "-c", "read -r _", "jobcontrol-cgroup-warmer"],  # $0, for ps
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env={"PATH": "/usr/bin:/bin"},
                start_new_session=True,
            )
            self._pid = str(self._helper.pid).encode()
            for path in self._dirs():
                self._targets.append(os.open(path / "cgroup.procs", os.O_WRONLY | os.O_CLOEXEC))
            os.write(self._targets[0], self._pid)
        except (OSError, subprocess.SubprocessError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
            self._fail(f"cannot start the helper in {self.base}: {reason}")
            return
        if self.problem:
            log.info("cgroup joins are kept warm again around timers")
        self.problem = ""

    def _stop_helper(self) -> None:
        for fd in self._targets:
            os.close(fd)
        self._targets = []
        helper, self._helper = self._helper, None
        if helper is None:
            return
        if helper.stdin is not None:
            helper.stdin.close()
        helper.kill()  # it holds nothing; stopped (SIGSTOP) or not, it goes now
        helper.wait()

    def _fail(self, problem: str) -> None:
        if not self.problem:
            log.warning("%s; runs due by timers may start milliseconds late (retrying)", problem)
        self.problem = problem
        self._retry_at = time.monotonic() + self.retry_every
        self._stop_helper()
        self.failures += 1  # last: a reader that sees the count sees the rest


def resolve_mode(environ: Mapping[str, str]) -> str:
    """The daemon's cgroups setting from ``$JOBCONTROL_CGROUPS`` (default ``auto``)."""
    return check_mode(environ.get(ENV_VAR, "auto").strip().lower() or "auto")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise OptionError(f"${ENV_VAR}={mode!r}: expected one of {', '.join(MODES)}")
    return mode


class _Unavailable(Exception):
    """Why cgroups cannot contain task runs here."""


def kill_run_cgroups(instance_id: str, run_ids: Iterable[int]) -> list[int]:
    """Kill what is left in the cgroups of the task runs ``run_ids`` of any worker of
    this database on this host (the daemon's embedded one, or ``jobcontrol worker``
    processes, each with a subtree of its own named after the database's instance):
    a process that dropped a run's marker cannot leave it. The pids that were in
    them. Each cgroup emptied is removed too: its worker may never come back to remove
    it (one that does finds it gone, and reads no usage for the run it lost)."""
    try:
        mount = _cgroup2_mount()
    except _Unavailable:
        return []
    prefix = f"jobcontrol-{_SAFE.sub('_', instance_id)}"
    names = [f"run-{i}" for i in run_ids]
    found: set[int] = set()
    for base in mount[0].glob(f"**/{prefix}*"):  # "**" takes the mount's own level too
        if base.name != prefix and not base.name.startswith(f"{prefix}_"):
            continue  # another database's whose instance begins the same
        for name in names:
            if (base / name).is_dir():
                cg = RunCgroup(base / name, None)
                found.update(cg.pids())
                if cg.kill():
                    cg.remove()
    return sorted(found)


def _setup(name: str) -> Containment:
    mount = _cgroup2_mount()
    own = _own_cgroup(mount)
    base = own / name
    try:
        base.mkdir(exist_ok=True)
    except OSError as exc:
        raise _Unavailable(f"cannot create cgroup {base}: {exc.strerror}") from exc
    try:
        if not (base / "cgroup.kill").exists():
            raise _Unavailable("the kernel has no cgroup.kill (it needs Linux 5.14)")
        _probe(base)
    except _Unavailable:
        _rmdir_quietly(base)
        raise
    memory_reason = enable_for_runs(own, base, "memory")
    memory_base: Path | None = None
    if memory_reason:
        memory_base, v1_reason = _memory_v1(name)
        memory_reason = "" if memory_base is not None else f"{memory_reason}; {v1_reason}"
    return Containment(
        base=base,
        memory_base=memory_base,
        reason=memory_reason,
        advice=join_advice(mount[0], _mount_options(mount[0])),
    )


def join_advice(point: Path, options: list[str], features: str | None = None) -> str:
    """Empty, or the advice to mount cgroup2 with ``favordynmods``.

    A run's shell joins its cgroup by writing to ``cgroup.procs``; the kernel lets a
    process change cgroups only once every CPU has passed a quiescent state (an RCU
    grace period) since the last such move, unless the hierarchy favours dynamic
    changes. Joins back to back cost about 0.3 ms; the first after a quiet spell of
    20 ms or more waited 6 to 14 ms on the machine we measure on (bench/README.md), so
    a timer's task started that much late. ``favordynmods`` (Linux 6.0, listed in
    ``/sys/kernel/cgroup/features``) keeps every join at the fast cost, for slightly
    dearer forks and exits host-wide: the host's choice, so the daemon only says so.
    """
    if "favordynmods" in options:
        return ""
    if features is None:
        try:
            features = Path(_FEATURES).read_text()
        except OSError:
            return ""
    if "favordynmods" not in features.split():
        return ""
    return (
        f"cgroup2 at {point} is mounted without favordynmods: a run that starts after a "
        "quiet spell waits for an RCU grace period (milliseconds) to join its cgroup; "
        f"`mount -o remount,favordynmods {point}` removes that wait"
    )


def _mount_options(point: Path) -> list[str]:
    """The super options of the mount at ``point``."""
    try:
        return next((opts for p, _, _, opts in _mounts() if p == point), [])
    except OSError:
        return []


def _cgroup2_mount() -> tuple[Path, str]:
    """The cgroup2 mount point and the hierarchy path it shows (its root)."""
    try:
        mount = _find_mount("cgroup2")
    except OSError as exc:
        raise _Unavailable(f"cannot read {_MOUNTINFO}: {exc.strerror}") from exc
    if mount is None:
        raise _Unavailable("no cgroup2 file system is mounted")
    return mount


def _find_mount(fstype: str, option: str | None = None) -> tuple[Path, str] | None:
    """The first mount of ``fstype`` (with ``option`` among its super options, e.g. a
    cgroup v1 controller): its mount point and the hierarchy path it shows."""
    for point, root, kind, options in _mounts():
        if kind == fstype and (option is None or option in options):
            return point, root
    return None


def _mounts() -> Iterator[tuple[Path, str, str, list[str]]]:
    """Each mount in mountinfo: its point, the hierarchy path it shows, its file system
    type and its super options. ``OSError`` when mountinfo cannot be read."""
    for line in Path(_MOUNTINFO).read_text().splitlines():
        fields, _, rest = line.partition(" - ")
        f, parts = fields.split(), rest.split()
        if len(f) < 5 or not parts:
            continue
        options = parts[2].split(",") if len(parts) >= 3 else []
        yield Path(_unescape(f[4])), _unescape(f[3]), parts[0], options


def _in_mount(mount: tuple[Path, str], path: str) -> Path | None:
    """The directory of the cgroup ``path`` (as /proc/self/cgroup shows it) under
    ``mount``; None when the mount does not show it."""
    point, root = mount
    rel = os.path.relpath(path, root) if root != "/" else path.lstrip("/")
    if rel.startswith(".."):
        return None
    return point / rel if rel not in (".", "") else point


def _own_cgroup(mount: tuple[Path, str]) -> Path:
    """The directory of the daemon's own cgroup v2 ("0::/path" in /proc/self/cgroup)."""
    for line in _self_cgroup_lines():
        hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hid == "0" and controllers == "":
            own = _in_mount(mount, path)
            if own is None:
                raise _Unavailable(f"the daemon's cgroup {path} is outside the cgroup2 mount")
            return own
    raise _Unavailable("the daemon is in no cgroup v2 (no 0:: line in /proc/self/cgroup)")


def _self_cgroup_lines() -> list[str]:
    try:
        return Path(_SELF_CGROUP).read_text().splitlines()
    except OSError as exc:
        raise _Unavailable(f"cannot read {_SELF_CGROUP}: {exc.strerror}") from exc


def _probe(base: Path) -> None:
    """Check, once, that a task's shell can join a cgroup under ``base`` (permissions on
    the source and target, delegation): what the worker will do for every run."""
    probe = RunCgroup(base / f"probe-{os.getpid()}")
    try:
        probe.path.mkdir(exist_ok=True)
    except OSError as exc:
        raise _Unavailable(f"cannot create cgroup {probe.path}: {exc.strerror}") from exc
    try:
        done = subprocess.run(
            ["/bin/sh", "-c", probe.join_script() + "exit 0"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _Unavailable(f"cannot test joining cgroup {probe.path}: {exc}") from exc
    finally:
        probe.kill(wait=1.0)
        probe.remove()
    if done.returncode != 0:
        error = done.stderr.decode(errors="replace").strip().splitlines()
        raise _Unavailable(f"a task cannot join cgroup {probe.path}: {error[0] if error else ''}")


# The leaf the daemon moves itself into, inside a cgroup it has to itself, so that the
# cgroup may pass controllers down (cgroup v2 lets a cgroup with processes of its own
# enable none for its children: "no internal processes").
SUPERVISOR = "supervisor"


def enable_for_runs(own: Path, base: Path, controller: str) -> str:
    """Turn on ``controller`` in ``own`` and ``base`` (the runs' parent) for the runs'
    cgroups; "" when on, else why not.

    Under a systemd unit with ``Delegate=yes`` the daemon starts alone in the service's
    cgroup, which therefore cannot pass controllers down. When the daemon is the only
    process there, it moves itself into ``own/supervisor`` (as systemd's delegation
    rules ask) and enables the controller; a cgroup it shares with other processes (a
    login shell's, say) is left as it is, with the reason.
    """
    try:
        available = (own / "cgroup.controllers").read_text().split()
    except OSError as exc:
        return f"cannot read {own / 'cgroup.controllers'}: {exc.strerror}"
    if controller not in available:
        return f"the cgroup2 hierarchy has no {controller} controller"
    for path in (own, base):
        error = _enable(path, controller)
        if error is not None and path == own and error.errno == errno.EBUSY:
            why = _into_supervisor(own)
            if why:
                return f"cannot enable {controller} in {path}: {error.strerror} ({why})"
            error = _enable(path, controller)
        if error is not None:
            return f"cannot enable {controller} in {path}: {error.strerror}"
    return ""


def _enable(path: Path, controller: str) -> OSError | None:
    """Pass ``controller`` down from ``path``; the error when the kernel refuses."""
    control = path / "cgroup.subtree_control"
    try:
        if controller not in control.read_text().split():
            control.write_text(f"+{controller}")
    except OSError as exc:
        return exc
    return None


def _into_supervisor(own: Path) -> str:
    """Move this process from ``own`` into ``own/supervisor``; "" when moved, else why not."""
    try:
        members = (own / "cgroup.procs").read_text().split()
    except OSError as exc:
        return f"cannot read {own / 'cgroup.procs'}: {exc.strerror}"
    me = str(os.getpid())
    if members != [me]:
        others = len([m for m in members if m != me])
        return f"the daemon shares {own} with {others} other process(es)"
    leaf = own / SUPERVISOR
    try:
        leaf.mkdir(exist_ok=True)
        (leaf / "cgroup.procs").write_text(me)
    except OSError as exc:
        return f"cannot move the daemon into {leaf}: {exc.strerror}"
    log.info("moved the daemon into cgroup %s: its parent can now divide controllers", leaf)
    return ""


def _memory_v1(name: str) -> tuple[Path | None, str]:
    """A hybrid layout's cgroup v1 memory hierarchy for the runs: (base, why not)."""
    try:
        mount = _find_mount("cgroup", "memory")
    except OSError as exc:
        return None, f"cannot read {_MOUNTINFO}: {exc.strerror}"
    if mount is None:
        return None, "no cgroup v1 memory hierarchy either"
    own: Path | None = None
    for line in _self_cgroup_lines():
        _hid, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if "memory" in controllers.split(","):
            own = _in_mount(mount, path) or own
    if own is None:
        return None, "the daemon's cgroup v1 memory cgroup is unknown"
    base = own / name
    try:
        base.mkdir(exist_ok=True)
    except OSError as exc:
        return None, f"cannot create {base}: {exc.strerror}"
    return base, ""


def _rmdir_quietly(path: Path) -> None:
    try:
        path.rmdir()
    except OSError:
        log.debug("left %s in place", path)


def _unescape(text: str) -> str:
    """mountinfo escapes space, tab, newline and backslash as octal (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), text)


def _read(path: Path | str) -> str:
    """A cgroup file's text: one read on a raw descriptor, three times cheaper than
    ``Path.read_text`` (it runs twice per task run, on the worker's hot path)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 65536).decode()
    finally:
        os.close(fd)


def _read_int(path: Path | str) -> int | None:
    try:
        return int(_read(path).strip())
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None


def _read_key(path: Path | str, key: str, *, gone: type[OSError] | tuple[()] = ()) -> int | None:
    """``key``'s value in a flat-keyed file (None, logged, when it cannot be read);
    ``gone``: an error raised to the caller instead."""
    try:
        for line in _read(path).splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except gone:
        raise
    except (OSError, ValueError) as exc:
        log.warning("cannot read %s: %s", path, exc)
        return None
    log.warning("%s has no %s", path, key)
    return None


def join_failure(log_path: Path | str | None) -> str | None:
    """Why a task's shell could not join its cgroup, from the head of its log (or None)."""
    if log_path is None:
        return None
    try:
        with open(log_path, "rb") as f:
            head = f.read(4096).decode(errors="replace").splitlines()
    except OSError:
        return None
    if JOIN_FAILED_LINE not in head:
        return None
    before = head[: head.index(JOIN_FAILED_LINE)]
    return f"not started: cannot join its cgroup: {before[-1] if before else 'unknown error'}"
