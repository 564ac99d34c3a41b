"""A daemon's threads kept on one CPU, its tasks on every CPU it was given (the real daemon
and CLI; README "A busy daemon keeps its threads on one CPU")."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.acceptance.harness import JobControl, describe, pid_from, wait_until, write
from tests.acceptance.test_acc_full_disk import metrics, run_and_wait

CPUS = sorted(os.sched_getaffinity(0))
needs_two = pytest.mark.skipif(len(CPUS) < 2, reason="this process may run on one CPU only")


def cpus_of(status: Path) -> str:
    for line in status.read_text().splitlines():
        if line.startswith("Cpus_allowed_list:"):
            return line.split(":", 1)[1].strip()
    raise AssertionError(f"no Cpus_allowed_list in {status}")


def thread_cpus(pid: int) -> dict[str, str]:
    """Each thread of ``pid``: its name and its CPU set."""
    found = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            found[f"{task.name} {name}"] = cpus_of(task / "status")
        except FileNotFoundError:
            continue  # the thread ended meanwhile
    return found


def as_list(cpus: list[int]) -> str:
    from jobcontrol.cpupin import cpu_list

    return cpu_list(frozenset(cpus))


@needs_two
@pytest.mark.timeout(120)
def test_a_daemon_told_a_cpu_keeps_its_threads_there_and_its_tasks_get_every_cpu(
    jc_sqlite: JobControl,
) -> None:
    jc = jc_sqlite
    kept = CPUS[-1]
    out = jc.base / "task-cpus.txt"
    jc.upgraded().load(
        write(
            jc.base / "cpus.yaml",
            "jobs:\n  - name: WhereAmI\n    active: true\n"
            f"    command: grep Cpus_allowed_list /proc/self/status > {out}\n",
        )
    )
    env = dict(jc.env, JOBCONTROL_CPU_PIN=str(kept))
    pid = pid_from(jc.ok("daemon", "start", env=env).stdout)

    threads = thread_cpus(pid)
    assert len(threads) > 5, threads
    assert set(threads.values()) == {str(kept)}, threads

    run = run_and_wait(jc, "WhereAmI")
    assert run["state"] == "succeeded", run
    assert out.read_text().split(":", 1)[1].strip() == as_list(CPUS)
    # The slot thread that started it went back to the daemon's CPU.
    assert set(thread_cpus(pid).values()) == {str(kept)}, thread_cpus(pid)
    assert metrics(jc)["jobcontrol_cpu_kept_on"] == kept


@needs_two
@pytest.mark.timeout(120)
def test_a_daemon_told_off_leaves_its_threads_on_every_cpu(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    jc.upgraded()
    env = dict(jc.env, JOBCONTROL_CPU_PIN="off")
    pid = pid_from(jc.ok("daemon", "start", env=env).stdout)
    assert set(thread_cpus(pid).values()) == {as_list(CPUS)}
    assert metrics(jc)["jobcontrol_cpu_kept_on"] == -1


@pytest.mark.parametrize(
    ("value", "said"),
    [
        ("4096", "CPU 4096 is not one this process may run on"),
        ("fast", "expected auto, off or a CPU number"),
    ],
)
@pytest.mark.timeout(120)
def test_a_cpu_setting_that_cannot_be_is_refused_and_nothing_starts(
    jc_sqlite: JobControl, value: str, said: str
) -> None:
    jc = jc_sqlite
    jc.upgraded()
    env = dict(jc.env, JOBCONTROL_CPU_PIN=value)
    failed = jc.fails("daemon", "start", env=env)
    assert f"$JOBCONTROL_CPU_PIN={value!r}" in failed.stderr, describe(failed)
    assert said in failed.stderr, describe(failed)
    assert jc.live_daemons() == []
    assert not list(jc.base.rglob("daemon-*.pid")), "a refused start left a pid file"
    worker = jc.fails("worker", "start", "--name", "w1", env=env)
    assert said in worker.stderr, describe(worker)
    assert wait_until(lambda: jc.live_workers() == [], 5)
