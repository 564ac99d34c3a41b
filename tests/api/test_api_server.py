"""The API as the daemon serves it: uvicorn on a real socket, plain HTTP and TLS."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from pathlib import Path

import httpx
import pytest

from jobcontrol.api.server import ApiServer
from jobcontrol.errors import JobControlError
from tests.api.conftest import Api

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
