"""A worker on "another host": its own network namespace and host name.

The worker runs in a network namespace made by the test, reaching PostgreSQL
over a veth pair (through a TCP relay on the host side of the pair, since the
test server listens on loopback only), under a host name of its own (a UTS
namespace). So the dispatcher cannot see its processes as its own: a kill goes
through the database, and a lost network is a real one (the link is taken down).

Needs root (``ip netns``); skipped otherwise, and not skippable in CI.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from tests.acceptance.harness import JobControl, describe, wait_until, write
from tests.acceptance.test_acc_remote_worker import ended

pytestmark = [pytest.mark.timeout(300), pytest.mark.postgres]

WAIT = 30.0
HOSTNAME = "build-remote"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


@dataclass
class Namespace:
    name: str
    host_ip: str
    veth: str  # the host side


@pytest.fixture
def netns() -> Iterator[Namespace]:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail("CI runs as root with ip(8): the namespace test must run")
        pytest.skip("network namespaces need root and ip(8)")
    tag = secrets.token_hex(3)
    name, host_if, ns_if = f"jc-{tag}", f"jcv{tag}a", f"jcv{tag}b"
    octet = int(tag[:2], 16) % 250 + 1
    host_ip, ns_ip = f"10.231.{octet}.1", f"10.231.{octet}.2"
    _ip("netns", "add", name)
    try:
        _ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        _ip("link", "set", ns_if, "netns", name)
        _ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        _ip("link", "set", host_if, "up")
        _ip("-n", name, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        _ip("-n", name, "link", "set", ns_if, "up")
        _ip("-n", name, "link", "set", "lo", "up")
        yield Namespace(name, host_ip, host_if)
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


class TcpRelay:
    """host_ip:port -> 127.0.0.1:target, one pair of threads per connection."""

    def __init__(self, host: str, target: int) -> None:
        self.target = target
        self.server = socket.create_server((host, 0))
        self.port = self.server.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self.server.close()
        for s in self.conns:
            s.close()


@pytest.fixture
def remote(jcpg: JobControl, netns: Namespace) -> Iterator[Any]:
    """Start ``jobcontrol worker`` in the namespace, under its own host name."""
    url = make_url(jcpg.url)
    relay = TcpRelay(netns.host_ip, int(url.port or 5432))
    remote_url = url.set(host=netns.host_ip, port=relay.port).render_as_string(False)
    started: list[subprocess.Popen[bytes]] = []

    def start(name: str, *extra: str) -> subprocess.Popen[bytes]:
        state = jcpg.base / f"remote-{name}"
        script = f'hostname {HOSTNAME} && exec "$@"'
        argv = ["ip", "netns", "exec", netns.name, "unshare", "--uts", "sh", "-c", script, "sh"]
        argv += [sys.executable, "-m", "jobcontrol", "--state-dir", str(state), "worker"]
        argv += ["--name", name, *extra]
        out = open(jcpg.base / f"remote-{name}.log", "wb")  # noqa: SIM115 - the child's
        child = subprocess.Popen(
            argv,
            env=dict(jcpg.env, JOBCONTROL_DB=remote_url),
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
    relay.close()


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

    _ip("link", "set", netns.veth, "down")  # the worker's host loses the network
    try:
        marker.touch()  # the task ends while its worker cannot reach the database
        assert wait_until(lambda: not jc.marked(JOBCONTROL_JOB="waits"), WAIT)
        run = jc.history("waits")[0]
        assert run["state"] == "running", run  # nobody could record it yet
    finally:
        _ip("link", "set", netns.veth, "up")
    # Back within the lease (30 s): the worker records what really happened.
    assert wait_until(lambda: ended(jc, "waits"), 60.0), "the outcome never arrived"
    run = ended(jc, "waits")
    assert run is not None
    assert (run["state"], run["exit_status"], run["worker"]) == ("failed", 7, "far-2"), describe(
        jc.run("history", "waits")
    )
