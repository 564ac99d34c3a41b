"""A worker on "another host": its own network namespace and host name.

The worker runs in a network namespace made by the test (``tests/acceptance/hosts.py``
says how), under a host name of its own: a kill goes through the database, and a
lost network is a real one (the link is taken down). The lane tests
(``test_acc_lane_burst.py``) run their three workers this way too.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write
from tests.acceptance.hosts import Namespace, ip, namespace, relayed
from tests.acceptance.test_acc_remote_worker import ended

pytestmark = [pytest.mark.timeout(300), pytest.mark.postgres]

WAIT = 30.0
HOSTNAME = "build-remote"


@pytest.fixture
def netns() -> Iterator[Namespace]:
    with namespace() as ns:
        yield ns


@pytest.fixture
def remote(jcpg: JobControl, netns: Namespace) -> Iterator[Any]:
    """Start ``jobcontrol worker`` in the namespace, under its own host name."""
    started: list[subprocess.Popen[bytes]] = []
    with relayed(jcpg, netns) as remote_url:

        def start(name: str, *extra: str) -> subprocess.Popen[bytes]:
            state = jcpg.base / f"remote-{name}"
            argv, env = jcpg.argv_env(remote_url, "worker", "--name", name, *extra, state_dir=state)
            out = open(jcpg.base / f"remote-{name}.log", "wb")  # noqa: SIM115 - the child's
            child = subprocess.Popen(
                netns.argv(HOSTNAME, *argv),
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
            started.append(child)
            return child

        yield start
        for child in started:
            if child.poll() is None:
                child.terminate()
                child.send_signal(2)
                try:
                    child.wait(30)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()


def workers(jc: JobControl) -> dict[str, dict[str, Any]]:
    return {w["name"]: w for w in jc.json("workers")}


def test_a_worker_in_another_network_namespace_runs_and_is_killed_through_the_database(
    jcpg: JobControl, remote: Any, netns: Namespace
) -> None:
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    remote("far-1", "--slots", "2")
    assert wait_until(lambda: "far-1" in workers(jc), WAIT), (
        jc.base / "remote-far-1.log"
    ).read_text()
    assert workers(jc)["far-1"]["host"] == HOSTNAME

    jc.ok("run", "hello")
    assert wait_until(lambda: ended(jc, "hello"), WAIT), "hello never ran on the remote worker"
    run = ended(jc, "hello")
    assert run is not None
    assert (run["worker"], run["exit_status"]) == ("far-1", 3)

    jc.ok("run", "sleeper")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT), "sleeper never started"
    jc.ok("kill", "sleeper")
    assert wait_until(lambda: ended(jc, "sleeper"), WAIT), "the kill never reached the remote"
    run = ended(jc, "sleeper")
    assert run is not None
    assert (run["state"], run["exit_status"]) == ("killed", 255)
    jc.assert_no_task_processes()


def test_a_task_that_ends_while_its_worker_is_cut_off_keeps_its_real_outcome(
    jcpg: JobControl, remote: Any, netns: Namespace
) -> None:
    jc = jcpg
    marker = jc.base / "go"
    jc.ok("daemon", "start", "--slots", "0")
    write(
        jc.base / "more.yaml",
        f"""\
jobs:
  - name: waits
    command: "while [ ! -e {marker} ]; do sleep 0.05; done; exit 7"
""",
    )
    jc.load(jc.base / "more.yaml")
    remote("far-2", "--slots", "1")
    assert wait_until(lambda: "far-2" in workers(jc), WAIT), (
        jc.base / "remote-far-2.log"
    ).read_text()
    jc.ok("run", "waits")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="waits"), WAIT), "waits never started"

    ip("link", "set", netns.veth, "down")  # the worker's host loses the network
    try:
        marker.touch()  # the task ends while its worker cannot reach the database
        assert wait_until(lambda: not jc.marked(JOBCONTROL_JOB="waits"), WAIT)
        run = jc.history("waits")[0]
        assert run["state"] == "running", run  # nobody could record it yet
    finally:
        ip("link", "set", netns.veth, "up")
    # Back within the lease (30 s): the worker records what really happened.
    assert wait_until(lambda: ended(jc, "waits"), 60.0), "the outcome never arrived"
    run = ended(jc, "waits")
    assert run is not None
    assert (run["state"], run["exit_status"], run["worker"]) == ("failed", 7, "far-2"), describe(
        jc.run("history", "waits")
    )
