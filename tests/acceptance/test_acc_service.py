"""Running Job Control as a service: the detached daemon's log, JSON logs, the systemd unit."""

from __future__ import annotations

import os
import socket
import tempfile
from collections.abc import Iterator

import pytest

from tests.acceptance.harness import JobControl, describe, pid_from


@pytest.fixture
def notify_socket() -> Iterator[tuple[socket.socket, str]]:
    """An AF_UNIX datagram socket standing in for systemd's $NOTIFY_SOCKET."""
    with tempfile.TemporaryDirectory(prefix="jc-notify-") as tmp:  # short: sun_path is 108 bytes
        address = os.path.join(tmp, "notify")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(address)
        sock.setblocking(False)
        try:
            yield sock, address
        finally:
            sock.close()


@pytest.mark.timeout(120)
def test_daemon_start_and_stop_leave_no_notify_warning_in_the_log(
    jc_sqlite: JobControl, notify_socket: tuple[socket.socket, str]
) -> None:
    jc = jc_sqlite
    sock, address = notify_socket
    # `daemon start` run by a service manager: the detached daemon is not that service.
    started = jc.ok("daemon", "start", env={**jc.env, "NOTIFY_SOCKET": address})
    pid = pid_from(started.stdout)
    stopped = jc.ok("daemon", "stop")
    assert stopped.stdout == f"daemon stopped (pid {pid})\n", describe(stopped)
    with pytest.raises(BlockingIOError):
        sock.recv(4096)  # nothing was sent to the caller's notify socket

    (log_file,) = jc.state_dir.glob("daemon-*.log")
    log = log_file.read_text()
    assert "JobControl terminated." in log, log
    # `start` listened for READY=1 on a socket of its own, gone once it returned: the
    # daemon must not try to tell it STOPPING=1 (or anything else) at the end.
    assert "sd_notify" not in log, log
    assert "STOPPING" not in log, log
    assert "jobcontrol.procs" not in log, log
