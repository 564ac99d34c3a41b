"""The API as the daemon serves it: uvicorn on a real socket, plain HTTP and TLS."""

from __future__ import annotations

import shutil
import socket
import ssl
import subprocess
import time
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx
import pytest

from jobcontrol.api.server import ApiServer, connection_limit, fd_reserve
from jobcontrol.errors import JobControlError
from tests.api.conftest import Api
from tests.integration.helpers import poll_until

pytestmark = pytest.mark.timeout(60)


def _self_signed(directory: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = directory / "cert.pem", directory / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"]
        + ["-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"]
        + ["-addext", "subjectAltName=IP:127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


def test_plain_http_on_loopback_with_a_free_port(api: Api) -> None:
    server = ApiServer(api.ctx, port=0)
    url = server.start()
    try:
        assert url.startswith("http://127.0.0.1:")
        answer = httpx.get(f"{url}/api/v1/tree", headers=api.headers("viewer"), timeout=10)
        assert answer.status_code == 200
        assert httpx.get(f"{url}/healthz", timeout=10).json() == {"status": "ok"}
    finally:
        server.stop()


def test_responses_are_dated_and_the_idle_server_stops_when_asked(api: Api) -> None:
    server = ApiServer(api.ctx, port=0)
    url = server.start()
    try:
        answer = httpx.get(f"{url}/healthz", timeout=10)
        sent = parsedate_to_datetime(answer.headers["date"])  # the tick it no longer has did this
        assert abs((sent - datetime.now(UTC)).total_seconds()) < 60
    finally:
        server.stop(timeout=10)
    assert not server.running, "the server's thread was still running 10 s after stop()"
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/healthz", timeout=5)


def test_tls_when_given_a_certificate_and_key(api: Api, tmp_path: Path) -> None:
    cert, key = _self_signed(tmp_path)
    server = ApiServer(api.ctx, port=0, certfile=cert, keyfile=key)
    url = server.start()
    try:
        assert url.startswith("https://127.0.0.1:")
        trusted = ssl.create_default_context(cafile=str(cert))
        answer = httpx.get(f"{url}/api/v1/tree", headers=api.headers("viewer"), verify=trusted)
        assert answer.status_code == 200
        with pytest.raises(httpx.HTTPError):  # the port speaks TLS only
            httpx.get(url.replace("https://", "http://") + "/healthz", timeout=5)
    finally:
        server.stop()


def test_tls_needs_both_the_certificate_and_the_key(api: Api, tmp_path: Path) -> None:
    with pytest.raises(JobControlError, match="both a certificate"):
        ApiServer(api.ctx, port=0, certfile=tmp_path / "cert.pem")


# ---------------------------------------------------------------- bounds (issue 9, item 2)


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    """What the server sends before it closes the connection (fails if it does not in time)."""
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def test_a_connection_whose_headers_never_finish_is_closed_after_the_timeout(api: Api) -> None:
    server = ApiServer(api.ctx, port=0, header_timeout=0.5)
    url = server.start()
    try:
        silent, partial = _connect(url), _connect(url)
        partial.sendall(b"GET /api/v1/tree HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        opened = time.monotonic()
        assert _read_until_closed(partial, 10).startswith(b"HTTP/1.1 408 ")
        assert _read_until_closed(silent, 10) == b""  # sent nothing: closed, no answer
        assert time.monotonic() - opened >= 0.4
        assert api.ctx.connections.header_timeouts == 2

        # The timeout starts again with the next request on a kept-alive connection.
        kept = _connect(url)
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        kept.settimeout(10)
        first = b""
        while not first.endswith(b'"ok"}'):  # the whole answer, headers and body
            first += kept.recv(4096)
        assert first.startswith(b"HTTP/1.1 200 ")
        kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # ... and never the blank line
        assert _read_until_closed(kept, 10).startswith(b"HTTP/1.1 408 ")
        assert api.ctx.connections.header_timeouts == 3
    finally:
        server.stop()


def test_a_request_whose_headers_are_in_is_not_cut_by_the_header_timeout(api: Api) -> None:
    server = ApiServer(api.ctx, port=0, header_timeout=0.3)
    url = server.start()
    api.ctx.event_heartbeat = 0.1
    try:
        with httpx.stream(
            "GET", f"{url}/api/v1/events", headers=api.headers("viewer"), timeout=10
        ) as events:
            assert events.status_code == 200
            deadline = time.monotonic() + 1.5  # five header timeouts
            keepalives = 0
            for line in events.iter_lines():
                keepalives += line == ": keepalive"
                if time.monotonic() > deadline:
                    break
            assert keepalives >= 5
        assert api.ctx.connections.header_timeouts == 0
    finally:
        server.stop()


def test_connections_over_the_limit_are_refused_with_503_and_counted(api: Api) -> None:
    server = ApiServer(api.ctx, port=0, max_connections=3, header_timeout=30)
    url = server.start()
    held = [_connect(url) for _ in range(3)]
    try:
        for sock in held:  # each is seen by the server before the next one arrives
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            sock.settimeout(10)
            answer = b""
            while not answer.endswith(b'"ok"}'):
                answer += sock.recv(4096)
            assert answer.startswith(b"HTTP/1.1 200 ")
        over = _connect(url)
        answer = _read_until_closed(over, 10)
        assert answer.startswith(b"HTTP/1.1 503 ")
        assert b"limit of 3 connections" in answer
        assert api.ctx.connections.refused == 1
        assert api.ctx.connections.open == 3
        held.pop().close()
        poll_until("the server to see the close", lambda: api.ctx.connections.open == 2)
        assert httpx.get(f"{url}/healthz", timeout=10).status_code == 200  # room again
    finally:
        for sock in held:
            sock.close()
        server.stop()


def test_bad_bounds_are_refused(api: Api) -> None:
    with pytest.raises(JobControlError, match="--api-max-connections must be at least 1"):
        ApiServer(api.ctx, port=0, max_connections=0)
    with pytest.raises(JobControlError, match="--api-header-timeout must be a positive"):
        ApiServer(api.ctx, port=0, header_timeout=0)


def test_the_default_limit_keeps_files_back_for_task_runs() -> None:
    assert connection_limit(256, 8) == 256 - fd_reserve(8)
    assert connection_limit(1024, 8) == 1024 - fd_reserve(8)
    assert connection_limit(1 << 20, 8) == 1000
    assert connection_limit(100, 8) == 8  # the least it serves (the daemon warns)
