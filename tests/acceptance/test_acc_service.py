"""Running Job Control as a service: the detached daemon's log, JSON logs, the systemd unit."""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
from collections.abc import Iterator
from datetime import datetime, timedelta

import pytest

from jobcontrol import procs
from tests.acceptance.harness import JobControl, describe, pid_from, wait_until, write

TICK = """\
jobs:
  - name: Tick
    active: true
    children:
      - name: tick
        active: true
        command: echo tick
"""


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


@pytest.mark.timeout(120)
def test_daemon_logs_one_json_object_per_line(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite
    refused = jc.fails("daemon", "start", "--log-format", "xml")
    assert "--log-format" in refused.stderr, describe(refused)
    assert not jc.state_dir.exists(), "a refused start must make nothing"

    jc.upgraded().load(write(jc.base / "jobs.yaml", TICK))
    started = jc.ok("daemon", "start", "--log-format", "json")
    pid = pid_from(started.stdout)
    jc.ok("run", "Tick")
    # A malformed request: uvicorn's own warning must come out as JSON too.
    match = re.search(r"admin API: http://([\d.]+):(\d+)/", started.stdout)
    assert match is not None, describe(started)
    with socket.create_connection((match[1], int(match[2])), timeout=10) as client:
        client.sendall(b"GARBAGE \x00 nonsense\r\n\r\n")
        assert client.recv(4096).startswith(b"HTTP/1.1 400")
    assert wait_until(
        lambda: jc.history("tick") and jc.history("tick")[0]["state"] != "running", 30
    )
    jc.ok("daemon", "stop")
    assert not procs.pid_alive(pid)

    (log_file,) = jc.state_dir.glob("daemon-*.log")
    lines = log_file.read_text().splitlines()
    assert len(lines) > 5, lines
    entries = [json.loads(line) for line in lines]  # every line, nothing but JSON
    for entry in entries:
        assert {"time", "level", "logger", "message"} <= entry.keys(), entry
        when = datetime.fromisoformat(entry["time"])
        assert when.utcoffset() == timedelta(0), entry
        assert entry["pid"] == pid, entry
    messages = {entry["message"] for entry in entries}
    assert "JobControl terminated." in messages, messages
    loggers = {entry["logger"] for entry in entries}
    assert {"jobcontrol.daemon", "jobcontrol.api.server", "uvicorn.error"} <= loggers, loggers
    levels = {entry["level"] for entry in entries}
    assert levels <= {"DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"}, levels
