"""The API as the daemon serves it: uvicorn on a real socket, plain HTTP and TLS."""

from __future__ import annotations

import socket
import ssl
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
from tests.tlscert import self_signed

pytestmark = pytest.mark.timeout(60)


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
    cert, key = self_signed(tmp_path)
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


# ------------------------------------------------- the bounds over TLS (issue 9, item 2)


def _tls_server(api: Api, tmp_path: Path, max_connections: int) -> tuple[ApiServer, Path, str]:
    """A started TLS server with a 0.5 s header timeout; its certificate, and its
    address as plain http:// (for raw TCP connections)."""
    cert, key = self_signed(tmp_path)
    server = ApiServer(
        api.ctx,
        port=0,
        certfile=cert,
        keyfile=key,
        max_connections=max_connections,
        header_timeout=0.5,
    )
    return server, cert, server.start().replace("https://", "http://")


def _tls_get(url: str, cert: Path) -> int:
    trusted = ssl.create_default_context(cafile=str(cert))
    return httpx.get(f"{url}/healthz", verify=trusted, timeout=10).status_code


def test_tls_connections_count_and_time_out_from_before_their_handshake(
    api: Api, tmp_path: Path
) -> None:
    """A flood of TCP connections that never begin their handshake is bounded as plain
    HTTP's is: counted from the moment each opens, refused over the limit, closed after
    the header timeout (asyncio's own TLS server held them uncounted for 60 s)."""
    server, cert, plain = _tls_server(api, tmp_path, max_connections=3)
    url = server.url
    try:
        assert _tls_get(url, cert) == 200
        held = [_connect(plain) for _ in range(3)]
        poll_until(
            "the server to count the silent connections", lambda: api.ctx.connections.open == 3
        )
        over = _connect(plain)
        assert _read_until_closed(over, 10) == b""  # no HTTP before TLS: just closed
        assert api.ctx.connections.refused == 1
        opened = time.monotonic()
        for sock in held:
            assert _read_until_closed(sock, 10) == b""
        assert time.monotonic() - opened < 5  # the header timeout, not asyncio's 60 s
        assert api.ctx.connections.header_timeouts == 3
        poll_until("the server to see them gone", lambda: api.ctx.connections.open == 0)
        assert _tls_get(url, cert) == 200  # room again
    finally:
        server.stop()


def test_a_failed_handshake_frees_its_place_and_a_kept_alive_tls_connection_is_timed(
    api: Api, tmp_path: Path
) -> None:
    server, cert, plain = _tls_server(api, tmp_path, max_connections=2)
    try:
        for _ in range(3):  # not TLS at all: the handshake fails, the place is given back
            sock = _connect(plain)
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            _read_until_closed(sock, 10)
            sock.close()
        poll_until("the failed handshakes to be let go", lambda: api.ctx.connections.open == 0)
        assert api.ctx.connections.refused == 0

        trusted = ssl.create_default_context(cafile=str(cert))
        host, port = plain.removeprefix("http://").rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as raw:
            with trusted.wrap_socket(raw, server_hostname=host) as tls:
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
                answer = b""
                while not answer.endswith(b'"ok"}'):
                    answer += tls.recv(4096)
                assert answer.startswith(b"HTTP/1.1 200 ")
                assert api.ctx.connections.open == 1
                tls.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never the blank line
                tls.settimeout(10)
                rest = b""
                while chunk := tls.recv(4096):
                    rest += chunk
                assert rest.startswith(b"HTTP/1.1 408 ")  # answered over TLS
        poll_until("the server to see it closed", lambda: api.ctx.connections.open == 0)
    finally:
        server.stop()


def test_a_certificate_that_cannot_be_loaded_is_refused_before_serving(
    api: Api, tmp_path: Path
) -> None:
    cert, key = self_signed(tmp_path)
    with pytest.raises(JobControlError, match=r"key .*missing\.pem could not be read"):
        ApiServer(api.ctx, port=0, certfile=cert, keyfile=tmp_path / "missing.pem")
    with pytest.raises(JobControlError, match="not a PEM certificate and its private key"):
        ApiServer(api.ctx, port=0, certfile=key, keyfile=key)
