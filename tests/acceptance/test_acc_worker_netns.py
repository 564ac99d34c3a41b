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
from sqlalchemy.engine import make_url

from tests.acceptance.harness import JobControl, describe, wait_until, write
from tests.acceptance.hosts import Namespace, TcpRelay, ip, namespace, relayed
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


def test_a_worker_cut_off_by_a_silent_partition_stops_without_waiting_for_the_link(
    jcpg: JobControl, remote: Any, netns: Namespace
) -> None:
    """A link that goes down says nothing: without TCP keepalives the worker's database
    connections look alive for as long as the partition lasts, and its stop waited for
    the link to come back. It notices the dead path within seconds and stops."""
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    worker = remote("far-3", "--slots", "1")
    log = jc.base / "remote-far-3.log"
    assert wait_until(lambda: "far-3" in workers(jc), WAIT), log.read_text()
    ip("link", "set", netns.veth, "down")
    try:
        worker.terminate()
        try:
            worker.wait(60)  # its patience with the database (10 s) after ~11 s of probes
        except subprocess.TimeoutExpired:
            raise AssertionError(f"its stop waited for the link:\n{log.read_text()}") from None
        assert "does not answer" in log.read_text(), log.read_text()
    finally:
        ip("link", "set", netns.veth, "up")


def test_a_listener_the_server_dropped_during_a_partition_is_noticed_and_reopened(
    jcpg: JobControl, netns: Namespace
) -> None:
    """The server drops a remote worker's connections while the link is down (a failover,
    a firewall's idle drop): their resets never arrive. An idle listener sends nothing,
    so without keepalives it waited forever for notifications that went elsewhere, and
    each run then waited for the worker's back-off poll (45 s, seen from outside). Its
    probes meet the reset once the link is back: it listens again, and runs start at once."""
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("lane", "set", "default", "poll=60s")  # no back-up poll within the test
    relay = TcpRelay(netns.host_ip, int(make_url(jc.url).port or 5432))
    state = jc.base / "remote-far-4"
    argv, env = jc.argv_env(
        relay.url(jc.url), "worker", "--name", "far-4", "--slots", "1", state_dir=state
    )
    log = jc.base / "remote-far-4.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            netns.argv(HOSTNAME, *argv), env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        assert wait_until(lambda: "far-4" in workers(jc), WAIT), log.read_text()
        jc.ok("run", "hello")  # the listener works: at once
        assert wait_until(lambda: ended(jc, "hello"), 10.0), log.read_text()
        ip("link", "set", netns.veth, "down")
        try:
            relay.drop()  # each connection reset: lost on the link that is down
        finally:
            ip("link", "set", netns.veth, "up")
        # Its probes met the reset: said once, and it listens again.
        assert wait_until(lambda: "does not answer" in log.read_text(), WAIT), log.read_text()
        before = len(jc.history("hello"))
        jc.ok("run", "hello")
        assert wait_until(
            lambda: len(jc.history("hello")) > before and ended(jc, "hello"), 10.0
        ), f"the run waited for the worker's poll:\n{log.read_text()}"
    finally:
        worker.terminate()
        try:
            worker.wait(60)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        relay.close()


def test_a_worker_killed_and_stopped_during_a_partition_keeps_the_end_for_its_next_start(
    jcpg: JobControl, remote: Any, netns: Namespace
) -> None:
    """``stop --kill`` (SIGTERM, SIGINT) while the link is down and a run is in hand: the
    task is killed at once, the worker gives up on the database within its patience
    (the dead path noticed by keepalives) and exits, keeping the end on disk; its next
    start records it, as killed, not lost."""
    jc = jcpg
    jc.ok("daemon", "start", "--slots", "0")
    jc.ok("lane", "set", "default", "stale=5m")  # the lease outlasts the test's partition
    worker = remote("far-5", "--slots", "1")
    log = jc.base / "remote-far-5.log"
    assert wait_until(lambda: "far-5" in workers(jc), WAIT), log.read_text()
    jc.ok("run", "sleeper")
    assert wait_until(lambda: jc.marked(JOBCONTROL_JOB="sleeper"), WAIT), log.read_text()
    ip("link", "set", netns.veth, "down")
    try:
        worker.terminate()
        worker.send_signal(2)
        try:
            worker.wait(90)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"its stop waited for the link:\n{log.read_text()}") from None
        assert not jc.marked(JOBCONTROL_JOB="sleeper"), "the task was killed at once"
        kept = list((jc.base / "remote-far-5").rglob("ends.jsonl"))
        assert kept, log.read_text()
        assert jc.history("sleeper")[0]["state"] == "running"  # nobody could record it
    finally:
        ip("link", "set", netns.veth, "up")
    remote("far-5", "--slots", "1")  # its next start records what it kept
    assert wait_until(lambda: ended(jc, "sleeper"), WAIT), log.read_text()
    run = ended(jc, "sleeper")
    assert run is not None
    assert (run["state"], run["exit_status"]) == ("killed", 255), run
