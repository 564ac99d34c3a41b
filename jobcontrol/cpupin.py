"""A busy daemon's threads kept on one CPU; its tasks keep every CPU it was given.

The interpreter runs one thread at a time. When the daemon is busy its threads hand
the interpreter lock to each other thousands of times a second, and a hand-over to a
thread asleep on another CPU costs a wake-up across CPUs (an interrupt to that CPU,
and on a virtual machine an exit to the hypervisor). On this project's 2-CPU
benchmark host, 500 trees every second: the daemon spent 2.3-2.4 ms of CPU per tree
run free to move, 1.9-2.0 ms with its threads on one CPU, and ran 8-17 % more tree
runs a second (bench/README.md, twenty-fourth round). A daemon that is not busy loses by it: a task's end and the
dispatcher's reaction to it then run side by side on two CPUs, and a sequence of short
tasks ran 5-9 % slower kept on one.

So, by default (``auto``), a monitor thread looks at the process's CPU use and keeps
its threads on one CPU only while they use most of one:

- **Kept on one** once the process used at least ``PIN_AT`` of a CPU over a look: the
  CPU of its set that was least busy, the highest-numbered of equals (CPU 0 often
  takes the host's interrupts).
- **Moved** when other work takes more than ``CROWDED_AT`` of that CPU and another CPU
  of the set is clearly less busy; **let go** when none is, or when the process's own
  use falls under ``UNPIN_AT``.
- **Looks** every ``BUSY_S`` while kept or busy, every ``QUIET_S`` otherwise: an idle
  daemon wakes for it once in ``QUIET_S``. The first look is ``FIRST_S`` after the
  start, for a daemon that starts with a backlog of runs due.

A task's process gets the CPU set the daemon started with, whatever its threads are
kept on: the thread that starts it takes that set for the ``Popen`` (a child takes
the set of the thread that forks it), then goes back (``enter_spawn``,
``leave_spawn``, called by ``procs.spawn``).

``$JOBCONTROL_CPU_PIN``: ``auto`` (the default), ``off``, or a CPU number to keep the
threads on always (a host whose operator sets CPUs aside). A process whose CPU set
has a single CPU has nothing to choose: ``auto`` does nothing there.
"""

from __future__ import annotations

import functools
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from jobcontrol.errors import OptionError

log = logging.getLogger(__name__)

ENV_VAR = "JOBCONTROL_CPU_PIN"
PIN_AT = 0.85  # of one CPU, over a look: the interpreter is what the daemon waits on
UNPIN_AT = 0.6  # below it, two CPUs serve the daemon better than one
CROWDED_AT = 0.3  # other work's share of the CPU the threads are kept on
MARGIN = 0.15  # how much less busy another CPU must be to move there
FIRST_S = 0.5
BUSY_S = 2.0
QUIET_S = 5.0

# The CPU the process's threads are kept on (None: every CPU of its set), as the
# threads that start tasks read it (under ``_LOCK``).
_kept_on: int | None = None


def resolve_mode(environ: Mapping[str, str]) -> str:
    """The setting from ``$JOBCONTROL_CPU_PIN``: ``auto``, ``off`` or a CPU number,
    checked against the CPUs this process may run on."""
    mode = environ.get(ENV_VAR, "auto").strip().lower() or "auto"
    return check_mode(mode, frozenset(os.sched_getaffinity(0)))


def check_mode(mode: str, allowed: frozenset[int]) -> str:
    if mode in ("auto", "off"):
        return mode
    if not mode.isdigit():
        raise OptionError(f"${ENV_VAR}={mode!r}: expected auto, off or a CPU number")
    if int(mode) not in allowed:
        raise OptionError(
            f"${ENV_VAR}={mode!r}: CPU {int(mode)} is not one this process may run on "
            f"({cpu_list(allowed)})"
        )
    return str(int(mode))


def cpu_list(cpus: frozenset[int]) -> str:
    """``0-3,6``: a CPU set as the kernel writes one."""
    spans: list[str] = []
    ordered = sorted(cpus)
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        spans.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(spans)


def decide(
    kept_on: int | None, own: float, busy: Mapping[int, float], allowed: frozenset[int]
) -> int | None:
    """The CPU to keep the threads on after a look, or None to let them go anywhere.

    ``own``: the process's CPU use over the look, in CPUs (1.0 = all of one);
    ``busy``: each CPU's use by everything over the look, the process included."""
    use = {cpu: busy.get(cpu, 0.0) for cpu in allowed}

    def least_busy(cpus: list[int]) -> int | None:
        return min(cpus, key=lambda c: (use[c], -c), default=None)

    if kept_on is None or kept_on not in use:
        return least_busy(list(use)) if own >= PIN_AT and len(use) > 1 else None
    if own < UNPIN_AT:
        return None
    others = use[kept_on] - own
    if others <= CROWDED_AT:
        return kept_on
    elsewhere = least_busy([c for c in use if c != kept_on])
    if elsewhere is not None and use[elsewhere] + MARGIN < others:
        return elsewhere
    return None  # crowded everywhere: the kernel spreads the threads best


class Usage:
    """The process's CPU time and each CPU's busy time (``/proc/stat``), in seconds."""

    def __init__(self, stat_path: str = "/proc/stat") -> None:
        self.stat_path = stat_path
        self.tick = 1.0 / os.sysconf("SC_CLK_TCK")

    def read(self) -> tuple[float, float, dict[int, float]]:
        """(monotonic now, the process's CPU seconds, {cpu: busy seconds})."""
        now = time.monotonic()
        t = os.times()
        busy: dict[int, float] = {}
        with open(self.stat_path, "rb") as f:
            for line in f:
                if not line.startswith(b"cpu") or line[3:4] == b" ":
                    continue
                name, *fields = line.split()
                # user nice system idle iowait irq softirq ...: idle and iowait are not busy
                numbers = [int(x) for x in fields[:7]]
                ticks = sum(numbers) - numbers[3] - numbers[4]
                busy[int(name[3:])] = ticks * self.tick
        return now, t.user + t.system, busy


class CpuPin:
    """The monitor (``auto``) or the fixed CPU (a number) of one process."""

    def __init__(
        self,
        mode: str,
        allowed: frozenset[int] | None = None,
        usage: Callable[[], tuple[float, float, dict[int, float]]] | None = None,
    ) -> None:
        self.mode = mode
        self.allowed = allowed if allowed is not None else frozenset(os.sched_getaffinity(0))
        self._usage = usage or Usage().read
        self.changes = 0
        self.errors = 0
        self.last_own = 0.0
        self._last: tuple[float, float, dict[int, float]] | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def kept_on(self) -> int | None:
        """The CPU the threads are kept on, or None (the record the spawns read)."""
        return _kept_on

    @property
    def active(self) -> bool:
        return self.mode != "off" and len(self.allowed) > 1

    def start(self) -> None:
        global _monitor
        _monitor = self
        if not self.active:
            return
        if self.mode.isdigit():
            self._keep(int(self.mode), f"${ENV_VAR}={self.mode}")
            return
        self._last = self._usage()
        self._thread = threading.Thread(target=self._run, name="jc-cpu-pin", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)

    def _run(self) -> None:
        # Processes started together look at different instants, so two of them on one
        # host do not both move at once.
        jitter = random.uniform(0.0, 0.25)
        # A daemon often starts as runs come due (every tree whose timer passed while it
        # was down): its first look is soon, so that a start-up backlog drains on one CPU.
        wait = FIRST_S
        failing = False
        while True:
            if self._stop.wait(wait * (1 + jitter)):
                return
            try:
                self.look()
            except OSError as exc:  # /proc unreadable, a CPU taken out of the set
                self.errors += 1
                if not failing:  # said once, not at every look
                    log.warning(
                        "threads let go on every CPU: CPU use or sets not to be had (%s); "
                        "looking again every %gs",
                        exc,
                        BUSY_S,
                    )
                failing = True
                self._let_go("an error")
            else:
                if failing:
                    log.info("CPU use and sets to be had again")
                failing = False
            busy = failing or self.kept_on is not None or self.last_own >= UNPIN_AT
            wait = BUSY_S if busy else QUIET_S

    def look(self) -> int | None:
        """Measure since the last look and act on ``decide``; the CPU kept on after."""
        now, own_s, busy_s = self._usage()
        last, self._last = self._last, (now, own_s, busy_s)
        if last is None or now <= last[0]:
            return self.kept_on
        span = now - last[0]
        own = (own_s - last[1]) / span
        busy = {cpu: (s - last[2].get(cpu, s)) / span for cpu, s in busy_s.items()}
        self.last_own = own
        target = decide(self.kept_on, own, busy, self.allowed)
        if target is None:
            if self.kept_on is not None:
                self._let_go(f"{own:.0%} of a CPU, other work {self._others(busy, own)}")
        elif target != self.kept_on:
            was = self.kept_on
            why = (
                f"busy at {own:.0%} of a CPU"
                if was is None
                else f"other work took {busy.get(was, 0.0) - own:.0%} of CPU {was}"
            )
            self._keep(target, why)
        else:
            self._apply({target}, target)  # threads started since, and any that strayed
        return self.kept_on

    def _others(self, busy: Mapping[int, float], own: float) -> str:
        if self.kept_on is None:
            return "-"
        return f"{max(0.0, busy.get(self.kept_on, 0.0) - own):.0%} of CPU {self.kept_on}"

    def _keep(self, cpu: int, why: str) -> None:
        was = self.kept_on
        try:
            self._apply({cpu}, cpu)
        except OSError as exc:
            self.errors += 1
            log.warning("threads could not be kept on CPU %s: %s", cpu, exc)
            self._let_go("an error")
            return
        self.changes += 1
        log.info(
            "%s: threads kept on CPU %s%s (tasks run on CPUs %s)",
            why,
            cpu,
            "" if was is None else f" instead of CPU {was}",
            cpu_list(self.allowed),
        )

    def _let_go(self, why: str) -> None:
        global _kept_on
        was = self.kept_on
        try:
            self._apply(self.allowed, None)
        except OSError as exc:
            self.errors += 1
            log.warning("threads could not be let go on CPUs %s: %s", cpu_list(self.allowed), exc)
            with _LOCK:
                _kept_on = None  # the spawns widen no thread for a CPU it may not be on
        if was is not None:
            self.changes += 1
            log.info(
                "threads free on CPUs %s again (were kept on CPU %s): %s",
                cpu_list(self.allowed),
                was,
                why,
            )

    def _apply(self, cpus: set[int] | frozenset[int], kept_on: int | None) -> None:
        """Every thread of the process (but those starting a task) onto ``cpus``, then
        ``kept_on`` recorded for the threads that start tasks (``kept_on``). OSError:
        the threads moved so far stay moved, the record stays as it was, and the
        caller lets them all go."""
        global _kept_on
        with _LOCK:
            for tid in os.listdir("/proc/self/task"):
                if int(tid) in _SPAWNING:
                    continue
                try:
                    _setaffinity_nogil(frozenset(cpus), int(tid))
                except ProcessLookupError:
                    pass  # the thread ended meanwhile
            _kept_on = kept_on

    def gauges(self) -> dict[str, tuple[str, float]]:
        """The series for ``/metrics`` (name -> (help, value))."""
        return {
            "jobcontrol_cpu_kept_on": (
                "The CPU this process's threads are kept on while it is busy (-1: none).",
                -1 if self.kept_on is None else self.kept_on,
            ),
            "jobcontrol_cpu_pin_changes_total": (
                "Times the threads were kept on a CPU, moved, or let go.",
                self.changes,
            ),
            "jobcontrol_cpu_pin_errors_total": (
                "Errors reading CPU use or setting the threads' CPUs.",
                self.errors,
            ),
        }


# The process's monitor, once ``daemon.serve`` started it (the daemon, a worker process).
_monitor: CpuPin | None = None
# Threads starting a task (their native ids): their CPU set is the tasks' until they
# leave, and the monitor leaves them alone meanwhile. Both sides change sets under
# ``_LOCK``, so a task never starts with the set of a thread kept on one CPU.
_SPAWNING: set[int] = set()
_LOCK = threading.Lock()


def monitor() -> CpuPin | None:
    return _monitor


def enter_spawn() -> bool:
    """Before a task's process is started: the calling thread takes the CPU set tasks
    get. True when ``leave_spawn`` must follow (a monitor is at work)."""
    m = _monitor
    if m is None or not m.active:
        return False
    with _LOCK:
        _SPAWNING.add(threading.get_native_id())  # the monitor leaves it alone from now
        kept = _kept_on
    if kept is not None:  # (else it is on every CPU of the set already)
        _set_own(m, m.allowed)
    return True


def leave_spawn() -> None:
    """After it started: the calling thread goes back to where the process's threads are
    kept now (every CPU of the set, if they were let go meanwhile)."""
    m = _monitor
    assert m is not None
    me = threading.get_native_id()
    while True:
        kept = _kept_on
        # While it started the task it was on every CPU of the set: it only has to go
        # back to one. Outside the lock: that may wait for the kernel to move the
        # thread there, and other threads start tasks meanwhile.
        if kept is not None:
            _set_own(m, frozenset({kept}))
        with _LOCK:
            if _kept_on == kept:  # (else the monitor moved the others meanwhile: again)
                _SPAWNING.discard(me)
                return


def _set_own(m: CpuPin, cpus: frozenset[int]) -> None:
    """The calling thread onto ``cpus``, without holding the interpreter lock: narrowing
    a thread's set makes the kernel move it when it runs elsewhere, and
    ``os.sched_setaffinity`` holds the lock while it waits for that (a profile of 500
    trees found 6.5 % of the lock's time there)."""
    try:
        _setaffinity_nogil(cpus)
    except OSError as exc:
        m.errors += 1
        log.warning("a thread could not be put on CPUs %s: %s", cpu_list(cpus), exc)


# Per CPU set: the C function, and its size and mask arguments (``ctypes`` objects).
_CALLS: dict[frozenset[int], tuple[Any, Any, Any]] = {}


def _setaffinity_nogil(cpus: frozenset[int], tid: int = 0) -> None:
    """``os.sched_setaffinity(tid, cpus)`` (0: the calling thread) without the lock.

    Twice on every task's start: the arguments are ``ctypes`` objects made once per set
    and the function has no ``argtypes`` to convert through, 9 -> 5.3 us a pair of calls
    (bench/README.md, thirtieth round)."""
    call = _CALLS.get(cpus)
    if call is None:
        call = _CALLS[cpus] = (_setaffinity(), *_mask(cpus))
    function, size, mask = call
    # A function of ``ctypes.CDLL`` gives up the interpreter lock for the call.
    if function(tid, size, mask) != 0:
        import ctypes

        err = ctypes.get_errno()
        raise OSError(err, os.strerror(err))


def _mask(cpus: frozenset[int]) -> tuple[Any, Any]:
    import ctypes  # here: only a process whose threads are kept on a CPU needs it

    bits = ctypes.sizeof(ctypes.c_ulong) * 8
    mask = (ctypes.c_ulong * (max(cpus) // bits + 1))()
    for cpu in cpus:
        mask[cpu // bits] |= 1 << (cpu % bits)
    return ctypes.c_size_t(ctypes.sizeof(mask)), mask


@functools.cache
def _setaffinity() -> Any:
    """libc's ``sched_setaffinity(pid_t, size_t, cpu_set_t *)``: called with a Python int
    for the thread (a C int) and ``ctypes`` objects for the rest (``_mask``)."""
    import ctypes

    return ctypes.CDLL(None, use_errno=True).sched_setaffinity
