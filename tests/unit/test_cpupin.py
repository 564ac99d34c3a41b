"""When a busy process's threads are kept on one CPU, moved, or let go (``cpupin``); and the
monitor acting on it in a real process with real threads and a real task."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from jobcontrol import cpupin
from jobcontrol.cpupin import CROWDED_AT, PIN_AT, UNPIN_AT, check_mode, cpu_list, decide
from jobcontrol.errors import OptionError

TWO = frozenset({0, 1})
FOUR = frozenset({0, 1, 2, 3})


def test_a_process_using_most_of_a_cpu_is_kept_on_the_least_busy_one() -> None:
    busy = {0: 0.9, 1: 0.4, 2: 0.2, 3: 0.5}
    assert decide(None, PIN_AT, busy, FOUR) == 2


def test_of_equally_busy_cpus_the_highest_numbered_is_chosen() -> None:
    assert decide(None, 0.95, {0: 0.5, 1: 0.5}, TWO) == 1


def test_a_process_not_that_busy_stays_free() -> None:
    assert decide(None, PIN_AT - 0.01, {0: 0.5, 1: 0.5}, TWO) is None


def test_a_single_cpu_leaves_nothing_to_choose() -> None:
    assert decide(None, 1.0, {0: 1.0}, frozenset({0})) is None


def test_a_kept_process_stays_while_busy_and_alone_on_its_cpu() -> None:
    # Between the two thresholds: kept on (no flapping at the edge).
    own = (PIN_AT + UNPIN_AT) / 2
    assert decide(1, own, {0: 0.2, 1: own + CROWDED_AT}, TWO) == 1


def test_a_kept_process_whose_use_falls_is_let_go() -> None:
    assert decide(1, UNPIN_AT - 0.01, {0: 0.1, 1: 0.6}, TWO) is None


def test_a_kept_process_crowded_on_its_cpu_moves_to_a_clearly_less_busy_one() -> None:
    assert decide(1, 0.7, {0: 0.1, 1: 1.0, 2: 0.9, 3: 0.95}, FOUR) == 0


def test_a_crowded_process_with_nowhere_better_is_let_go() -> None:
    # Other work takes half of CPU 1, and CPU 0 is as busy: the kernel spreads best.
    assert decide(1, 0.5 + 0.2, {0: 0.5, 1: 1.0}, TWO) is None
    assert decide(1, 0.7, {0: 0.5, 1: 1.2}, TWO) is None


def test_a_cpu_gone_from_the_set_is_chosen_again() -> None:
    assert decide(7, 0.95, {0: 0.9, 1: 0.1}, TWO) == 1


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("fast", "expected auto, off or a CPU number"),
        ("-1", "expected auto, off or a CPU number"),
        ("2", "CPU 2 is not one this process may run on (0-1)"),
    ],
)
def test_a_setting_that_cannot_be_is_refused_with_the_reason(mode: str, said: str) -> None:
    with pytest.raises(OptionError, match=r"\$JOBCONTROL_CPU_PIN=") as err:
        check_mode(mode, TWO)
    assert said in str(err.value)


def test_settings_that_can_be() -> None:
    assert [check_mode(m, TWO) for m in ("auto", "off", "1", "01")] == ["auto", "off", "1", "1"]
    assert cpupin.resolve_mode({}) == "auto"
    assert cpupin.resolve_mode({"JOBCONTROL_CPU_PIN": " OFF "}) == "off"


def test_cpu_sets_are_written_as_the_kernel_writes_them() -> None:
    assert cpu_list(frozenset({0, 1, 2, 3, 6, 8, 9})) == "0-3,6,8-9"
    assert cpu_list(frozenset({5})) == "5"


def test_usage_reads_each_cpu_of_the_host() -> None:
    now, own, busy = cpupin.Usage().read()
    assert own > 0
    assert set(busy) >= set(os.sched_getaffinity(0))
    assert all(v > 0 for v in busy.values())


def in_a_process(code: str, *args: str) -> tuple[subprocess.CompletedProcess[str], Any]:
    """Run ``code`` in a Python process of its own; it and the JSON it printed."""
    done = subprocess.run(
        [sys.executable, "-c", code, *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=Path(__file__).parents[2],
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done, json.loads(done.stdout)


# The monitor in a process of its own (it sets that process's threads' CPUs): readings
# scripted as a test scripts a clock, threads, sets and the task real.
MONITOR = textwrap.dedent(
    """
    import json, os, subprocess, sys, threading
    from jobcontrol import cpupin, procs

    readings = iter(json.loads(sys.argv[1]))
    pin = cpupin.CpuPin("auto", usage=lambda: tuple(next(readings)))
    stop = threading.Event()
    threads = [threading.Thread(target=stop.wait) for _ in range(3)]
    for t in threads:
        t.start()

    def cpus(tid="self"):
        path = f"/proc/self/task/{tid}/status" if tid != "self" else "/proc/self/status"
        for line in open(path):
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()

    def task_cpus():
        p = procs.spawn("grep Cpus_allowed_list /proc/self/status", stdout=subprocess.PIPE,
                        cwd=None, env={"PATH": os.environ["PATH"]})
        out = p.communicate()[0].decode()
        return out.split(":", 1)[1].strip()

    pin._last = tuple(next(readings))
    cpupin._monitor = pin
    steps = []
    for _ in range(3):
        kept = pin.look()
        steps.append({
            "kept": kept,
            "threads": sorted({cpus(t) for t in os.listdir("/proc/self/task")}),
            "task": task_cpus(),
            "after_spawn": cpus(threading.get_native_id()),
        })
    stop.set()
    print(json.dumps({"steps": steps, "changes": pin.changes, "errors": pin.errors}))
    """
)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to keep on")
def test_the_monitor_keeps_every_thread_on_one_cpu_while_busy_and_lets_go_after() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    low, high = allowed[0], allowed[-1]
    others = [c for c in allowed if c not in (low, high)]

    def reading(t: float, own: float, busy: dict[int, float]) -> list[object]:
        return [t, own, {str(c): busy.get(c, 0.0) for c in allowed}]

    # Over each 2 s look: busy at 95 % of a CPU with CPU `high` the least busy; then kept
    # (94 %); then down to 20 %.
    base = {c: 10.0 for c in allowed}
    script = [
        reading(0.0, 0.0, base),
        reading(2.0, 1.9, {**base, low: 11.5, high: 10.9, **{c: 12.0 for c in others}}),
        reading(4.0, 3.78, {**base, low: 11.7, high: 12.8, **{c: 12.1 for c in others}}),
        reading(6.0, 4.18, {**base, low: 11.9, high: 13.3, **{c: 12.2 for c in others}}),
    ]
    # JSON keys are text: the monitor's reader gives ints.
    code = MONITOR.replace(
        "tuple(next(readings))",
        "(lambda r: (r[0], r[1], {int(k): v for k, v in r[2].items()}))(next(readings))",
    )
    done, result = in_a_process(code, json.dumps(script))
    every = cpu_list(frozenset(allowed))
    first, second, third = result["steps"]
    assert first == {"kept": high, "threads": [str(high)], "task": every, "after_spawn": str(high)}
    assert second == first
    assert third == {"kept": None, "threads": [every], "task": every, "after_spawn": every}
    assert (result["changes"], result["errors"]) == (2, 0)


FAULT = textwrap.dedent(
    """
    import json, logging, os, sys
    from jobcontrol import cpupin

    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    allowed = frozenset(os.sched_getaffinity(0)) | {4095}  # a CPU this host has not got
    busy = {c: 0.9 for c in allowed}
    busy[4095] = 0.0  # the least busy: chosen, and refused by the kernel
    t = [0.0]

    def usage():
        t[0] += 2.0
        return t[0], t[0], {c: v * t[0] for c, v in busy.items()}

    pin = cpupin.CpuPin("auto", allowed=allowed, usage=usage)
    cpupin._monitor = pin
    pin._last = usage()
    kept = pin.look()
    threads = sorted({
        line.split(":", 1)[1].strip()
        for tid in os.listdir("/proc/self/task")
        for line in open(f"/proc/self/task/{tid}/status")
        if line.startswith("Cpus_allowed_list:")
    })
    print(json.dumps({"kept": kept, "errors": pin.errors, "threads": threads}))
    """
)


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="one CPU: nothing to keep on")
def test_a_cpu_the_kernel_refuses_is_counted_and_said_and_the_threads_stay_free() -> None:
    done, result = in_a_process(FAULT)
    every = cpu_list(frozenset(os.sched_getaffinity(0)))
    assert result == {"kept": None, "errors": 1, "threads": [every]}
    assert "WARNING threads could not be kept on CPU 4095" in done.stderr, done.stderr


class _Waits:
    """The monitor's stop event, recording each wait; it stops the loop after ``looks``."""

    def __init__(self, looks: int) -> None:
        self.timeouts: list[float] = []
        self.looks = looks

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        return len(self.timeouts) > self.looks


def test_the_first_look_is_soon_then_busy_and_quiet_spells_set_the_pace() -> None:
    # A daemon that starts with a backlog of runs due is kept on one CPU within a
    # second, not after the first busy-pace look.
    own_per_s = iter([0.1, 0.9, 0.9, 0.1])  # over each look: quiet, busy, busy, quiet
    clock = {"t": 0.0, "own": 0.0}

    def usage() -> tuple[float, float, dict[int, float]]:
        clock["t"] += 1.0
        clock["own"] += next(own_per_s, 0.0)
        return clock["t"], clock["own"], {0: clock["t"]}

    pin = cpupin.CpuPin("auto", allowed=frozenset({0}), usage=usage)  # one CPU: no moves
    pin._last = (0.0, 0.0, {0: 0.0})
    waits = _Waits(looks=4)
    pin._stop = waits  # type: ignore[assignment]
    pin._run()
    paces = [cpupin.FIRST_S, cpupin.QUIET_S, cpupin.BUSY_S, cpupin.BUSY_S, cpupin.QUIET_S]
    assert len(waits.timeouts) == len(paces)
    jitter = waits.timeouts[0] / cpupin.FIRST_S - 1
    assert 0.0 <= jitter <= 0.25
    assert waits.timeouts == pytest.approx([p * (1 + jitter) for p in paces])
    assert cpupin.FIRST_S < cpupin.BUSY_S
