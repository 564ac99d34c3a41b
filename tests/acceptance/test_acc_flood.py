"""An unauthenticated slow-header flood against the real daemon (issue 9, item 2).

Hundreds of connections that send part of a request and never finish it used
to exhaust the daemon's file descriptors: timer runs then failed with "Too many
open files" and an ABORT tree stayed unscheduled. Now the API holds at most a
bounded number of connections (below the descriptor limit, keeping what task
runs need in reserve), closes one whose headers do not arrive in time, and the
daemon raises its soft descriptor limit to the hard one at start.
"""

from __future__ import annotations

import re
import resource
import socket
import sqlite3
import ssl
import subprocess
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.acceptance.harness import JobControl, describe, wait_until, write
from tests.tlscert import self_signed

pytestmark = pytest.mark.timeout(240)

SOFT, HARD = 128, 256  # the daemon starts with these; it raises its soft limit to HARD
FLOOD = 400  # well over HARD
HEADER_TIMEOUT = 3  # seconds (--api-header-timeout; the default is 10)

TREE = """\
jobs:
  - name: Ticker
    timer: every 1s
    active: true
    on_error: abort
    children:
      - name: tick
        active: true
        command: echo tick
"""


def _limited(soft: int, hard: int) -> Callable[[], None]:
    def preexec() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return preexec


def _open_files_limit(pid: int) -> tuple[int, int]:
    text = Path(f"/proc/{pid}/limits").read_text()
    match = re.search(r"Max open files\s+(\d+)\s+(\d+)", text)
    assert match, text
    return int(match.group(1)), int(match.group(2))


def _runs(db: str, after: int) -> list[tuple[int, str, str | None]]:
    with sqlite3.connect(db) as conn:
        rows = conn.execute(
            "SELECT id, state, reason FROM run WHERE job_name = 'tick' AND id > ? ORDER BY id",
            (after,),
        ).fetchall()
    return [(int(i), str(s), r) for i, s, r in rows]


def _flood(host: str, port: int, count: int, start: bytes) -> list[socket.socket]:
    """``count`` connections, each sending ``start`` and never the rest."""
    held = []
    for _ in range(count):
        sock = socket.create_connection((host, port), timeout=10)
        sock.sendall(start)
        held.append(sock)
    return held


# Half a request's headers; over TLS, the first bytes of a ClientHello record.
HALF_REQUEST = b"GET /api/v1/tree HTTP/1.1\r\nHost: flood\r\nX-Slow: "
HALF_HELLO = b"\x16\x03\x01\x02\x00\x01"


def _closed_by_server(sock: socket.socket) -> bool:
    """True once the server has closed this connection (EOF, maybe after an error answer)."""
    sock.settimeout(0.01)
    try:
        while data := sock.recv(4096):
            del data
    except TimeoutError:
        return False
    except OSError:
        return True  # reset
    return True


@pytest.mark.parametrize("tls", [False, True], ids=["http", "tls"])
def test_a_slow_header_flood_stops_neither_the_runs_nor_the_api(
    jc_sqlite: JobControl, tls: bool
) -> None:
    """Over TLS the flood never finishes its handshake: it is bounded the same way
    (asyncio's own TLS server held such connections uncounted for 60 s)."""
    jc = jc_sqlite.upgraded()
    jc.load(write(jc.base / "ticker.yaml", TREE))
    db = jc.url.removeprefix("sqlite:///")
    cert = self_signed(jc.base) if tls else None
    served = ["--tls-cert", str(cert[0]), "--tls-key", str(cert[1])] if cert else []

    started = subprocess.run(
        jc.argv("daemon", "start", "--api-header-timeout", str(HEADER_TIMEOUT), *served),
        cwd=jc.base,
        env=jc.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited(SOFT, HARD),
        check=False,
    )
    assert started.returncode == 0, describe(started)
    (pid,) = jc.live_daemons()
    assert _open_files_limit(pid) == (HARD, HARD), "the soft limit is raised to the hard one"
    url = next(jc.state_dir.glob("daemon-*.url")).read_text().strip()
    assert url.startswith("https://" if tls else "http://")
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    token = jc.token_file.read_text().strip()
    auth = {"Authorization": f"Bearer {token}"}

    assert wait_until(lambda: _runs(db, 0), 30), "the timer runs before the flood"
    before = _runs(db, 0)[-1][0]
    flood = _flood(host, int(port), FLOOD, HALF_HELLO if tls else HALF_REQUEST)
    try:
        # Runs go on while the flood is held: every one succeeds, none is refused a file.
        assert wait_until(lambda: len(_runs(db, before)) >= 4, 60), _runs(db, before)
        failed = [r for r in _runs(db, before) if r[1] not in ("succeeded", "running", "queued")]
        assert not failed, failed

        # The server closes what never finished its headers, and answers again.
        assert wait_until(lambda: all(_closed_by_server(s) for s in flood), 30)
        verify = ssl.create_default_context(cafile=str(cert[0])) if cert else True
        with httpx.Client(base_url=url, timeout=10, verify=verify) as http:
            assert http.get("/healthz").json()["status"] == "ok"
            assert http.get("/api/v1/tree", headers=auth).status_code == 200
            metrics = http.get("/metrics", headers=auth).text
        refused = re.search(r"^jobcontrol_api_connections_refused_total (\d+)", metrics, re.M)
        timed_out = re.search(r"^jobcontrol_api_header_timeouts_total (\d+)", metrics, re.M)
        limit = re.search(r"^jobcontrol_api_connections_limit (\d+)", metrics, re.M)
        assert refused, metrics
        assert timed_out, metrics
        assert limit, metrics
        assert int(limit.group(1)) < HARD
        assert int(refused.group(1)) + int(timed_out.group(1)) >= FLOOD
        assert int(timed_out.group(1)) >= 1
    finally:
        for sock in flood:
            sock.close()

    # The ABORT tree is still scheduled, and its runs went on all along.
    with sqlite3.connect(db) as conn:
        (next_runs,) = conn.execute("SELECT next_runs FROM job WHERE name = 'Ticker'").fetchone()
    assert next_runs is not None
    assert all(r[1] in ("succeeded", "running", "queued") for r in _runs(db, before))
    log = next(jc.state_dir.glob("daemon-*.log")).read_text()
    assert "Too many open files" not in log
    assert "refused connections" in log


def test_api_bounds_that_cannot_hold_are_refused_at_start(jc_sqlite: JobControl) -> None:
    jc = jc_sqlite.upgraded()
    zero = jc.fails("daemon", "start", "--api-max-connections", "0")
    assert "--api-max-connections must be at least 1, not 0" in zero.stderr
    never = jc.fails("daemon", "start", "--api-header-timeout", "0")
    assert "--api-header-timeout must be a positive number of seconds" in never.stderr
    # More connections than the open-files limit leaves once task runs get their share.
    too_many = subprocess.run(
        jc.argv("daemon", "start", "--api-max-connections", "200"),
        cwd=jc.base,
        env=jc.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited(HARD, HARD),
        check=False,
    )
    assert too_many.returncode != 0, describe(too_many)
    assert "--api-max-connections 200 is more than the open-files limit (256)" in too_many.stderr
    assert jc.live_daemons() == []
    assert not jc.token_file.exists()  # nothing made
    (jc.base / "junk.pem").write_text("not a certificate\n")
    junk = str(jc.base / "junk.pem")
    bad_cert = jc.fails("daemon", "start", "--tls-cert", junk, "--tls-key", junk)
    assert "not a PEM certificate and its private key" in bad_cert.stderr
    assert jc.live_daemons() == []
    assert not jc.token_file.exists()


def test_tasks_get_the_open_files_limit_the_daemon_was_given(jc_sqlite: JobControl) -> None:
    """The daemon raises its own soft limit for the API; its tasks get the one it had, as
    under systemd (select() breaks past 1024), and can still raise it to the hard one."""
    jc = jc_sqlite.upgraded()
    jc.load(
        write(
            jc.base / "limits.yaml",
            "jobs:\n  - name: limits\n    active: true\n"
            "    command: echo soft=$(ulimit -S -n) hard=$(ulimit -H -n)\n",
        )
    )
    started = subprocess.run(
        jc.argv("daemon", "start"),
        cwd=jc.base,
        env=jc.env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=_limited(SOFT, HARD),
        check=False,
    )
    assert started.returncode == 0, describe(started)
    (pid,) = jc.live_daemons()
    assert _open_files_limit(pid) == (HARD, HARD)
    run = jc.ok("run", "limits")
    run_id = re.search(r"started run (\d+)", run.stdout)
    assert run_id, run.stdout
    followed = jc.ok("logs", "limits", "--run", run_id.group(1), "-f")
    assert followed.stdout == f"soft={SOFT} hard={HARD}\n", describe(followed)
