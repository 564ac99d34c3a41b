"""Workers on "other hosts": each in a network namespace made by the test.

A namespace reaches PostgreSQL over a veth pair, through a TCP relay on the host
side of the pair (the test server listens on loopback only), under a host name of
its own (a UTS namespace). So the dispatcher cannot see a worker's processes as its
own: a kill goes through the database, and a lost network is a real one (the link
is taken down).

Needs root and ip(8); skipped otherwise, and never skipped in CI.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import threading
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import pytest
from sqlalchemy.engine import make_url

from tests.acceptance.harness import JobControl, describe


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


def need_namespaces() -> None:
    """Skip unless this machine can make network namespaces (fail instead in CI)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        if os.environ.get("CI", "").lower() in {"1", "true", "yes"}:
            pytest.fail("CI runs as root with ip(8): the namespace tests must run")
        pytest.skip("network namespaces need root and ip(8)")


@dataclass
class Namespace:
    name: str
    host_ip: str
    veth: str  # the host side

    def argv(self, hostname: str, *argv: str) -> list[str]:
        """``argv`` run in this namespace under host name ``hostname``."""
        script = f'hostname {hostname} && exec "$@"'
        return ["ip", "netns", "exec", self.name, "unshare", "--uts", "sh", "-c", script, "sh"] + [
            *argv
        ]


@contextmanager
def namespace() -> Iterator[Namespace]:
    """A network namespace joined to this one by a veth pair (a /30 of 10.231.0.0/16)."""
    need_namespaces()
    tag = secrets.token_hex(3)
    name, host_if, ns_if = f"jc-{tag}", f"jcv{tag}a", f"jcv{tag}b"
    octet = int(tag[:2], 16) % 250 + 1
    quad = int(tag[2:4], 16) % 63 * 4  # a /30 of its own: 10.231.octet.quad+1 and +2
    host_ip, ns_ip = f"10.231.{octet}.{quad + 1}", f"10.231.{octet}.{quad + 2}"
    ip("netns", "add", name)
    try:
        ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        ip("link", "set", ns_if, "netns", name)
        ip("addr", "add", f"{host_ip}/30", "dev", host_if)
        ip("link", "set", host_if, "up")
        ip("-n", name, "addr", "add", f"{ns_ip}/30", "dev", ns_if)
        ip("-n", name, "link", "set", ns_if, "up")
        ip("-n", name, "link", "set", "lo", "up")
        yield Namespace(name, host_ip, host_if)
    finally:
        subprocess.run(["ip", "link", "del", host_if], capture_output=True, check=False)
        subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


class TcpRelay:
    """host_ip:port -> 127.0.0.1:target, one pair of threads per connection.

    ``cut_on``: answers from the server to look for, in order; the one that holds the
    last is never delivered: the connection is cut instead (once), as a network that
    fails just after the server sent it. ``(b"job", b"COMMIT")``: the COMMIT of a
    transaction that touched the row of ``job``. What the server did is done; the
    client cannot know.
    """

    def __init__(self, host: str, target: int, *, cut_on: Sequence[bytes] = ()) -> None:
        self.target = target
        self.cut_on = list(cut_on)
        self.cut = threading.Event()
        self.server = socket.create_server((host, 0))
        self.port = self.server.getsockname()[1]
        self.conns: list[socket.socket] = []
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, url: str) -> str:
        """``url`` (on 127.0.0.1:target) through this relay."""
        host = self.server.getsockname()[0]
        return make_url(url).set(host=host, port=self.port).render_as_string(False)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target))
            self.conns += [client, upstream]
            for a, b, answers in ((client, upstream, False), (upstream, client, True)):
                threading.Thread(target=self._pipe, args=(a, b, answers), daemon=True).start()

    def _cuts(self, data: bytes) -> bool:
        with self._lock:
            if not self.cut_on or self.cut_on[0] not in data:
                return False
            self.cut_on.pop(0)
            if self.cut_on:
                return False
        self.cut.set()
        return True

    def _pipe(self, src: socket.socket, dst: socket.socket, answers: bool) -> None:
        try:
            while data := src.recv(65536):
                if answers and self._cuts(data):
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def drop(self) -> None:
        """Destroy every accepted connection in the kernel (``ss -K``: one RST each, never
        sent again), as a server that fails over drops its clients: a client whose RST is
        lost (its link is down) never hears of it, unless it probes."""
        subprocess.run(
            ["ss", "-K", "state", "established", f"( sport = :{self.port} )"],
            check=True,
            capture_output=True,
        )

    def close(self) -> None:
        self.server.close()
        for s in self.conns:
            s.close()


@contextmanager
def relayed(jc: JobControl, ns: Namespace) -> Iterator[str]:
    """The database URL as seen from ``ns``: a relay on the host side of its veth pair."""
    relay = TcpRelay(ns.host_ip, int(make_url(jc.url).port or 5432))
    try:
        yield relay.url(jc.url)
    finally:
        relay.close()


class Hosts:
    """Where a test's workers run: ``here`` (``jobcontrol worker start`` on this host,
    distinct processes) or ``netns`` (each worker on a host of its own: its own network
    namespace and host name, started with the same command from inside it). Either way
    the worker's pid file is in the test's state dir, so the harness finds and stops it.
    """

    def __init__(self, jc: JobControl, place: str) -> None:
        self.jc, self.place = jc, place
        self._stack = ExitStack()
        self.placed: dict[str, tuple[Namespace, str]] = {}  # worker -> its host and URL

    def host_of(self, name: str) -> str:
        return f"host-{name}" if self.place == "netns" else os.uname().nodename

    def start_argv(self, name: str, *extra: str) -> tuple[list[str], dict[str, str]]:
        """The command that starts worker ``name`` where this test places it, and its
        environment (the URL goes in the environment, never on a command line)."""
        jc = self.jc
        if self.place == "here":
            return jc.argv("worker", "start", "--name", name, *extra), jc.env
        if name not in self.placed:
            ns = self._stack.enter_context(namespace())
            self.placed[name] = (ns, self._stack.enter_context(relayed(jc, ns)))
        ns, url = self.placed[name]
        argv, env = jc.argv_env(url, "worker", "start", "--name", name, *extra)
        return ns.argv(self.host_of(name), *argv), env

    def start(self, *names: str, slots: int) -> None:
        """Start the workers side by side (each start costs ~0.5 s of CPU) and wait
        until each is up."""
        started = [self.start_argv(n, "--slots", str(slots)) for n in names]
        argvs, envs = [a for a, _ in started], [e for _, e in started]
        for result in self.jc.run_all(*argvs, envs=envs, timeout=120):
            assert result.returncode == 0, describe(result)

    def close(self) -> None:
        """Stop the workers before their links go (a worker cut off would wait for the
        database), then take the namespaces down."""
        if self.placed:
            for pid in self.jc.live_workers():
                self.jc.stop_worker(pid)
        self._stack.close()
