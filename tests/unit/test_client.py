"""The API client without a server: URLs, the token, error messages, the SSE parser."""

from __future__ import annotations

import socket

import httpx
import pytest

from jobcontrol.client import (
    ApiError,
    Client,
    DaemonTimeoutError,
    DaemonUnreachableError,
    Event,
    base_url,
    parse_sse,
)

pytestmark = pytest.mark.timeout(30)


def test_the_base_url_is_taken_with_or_without_the_api_prefix() -> None:
    assert base_url("http://h:1/api/v1/") == "http://h:1"
    assert base_url(" http://h:1\n") == "http://h:1"


def test_requests_carry_the_token_and_url_encoded_job_names() -> None:
    seen: list[httpx.Request] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(202, json={"run_id": 7})

    with Client("http://h:1", "jc_x", transport=httpx.MockTransport(answer)) as client:
        assert client.run_now("a/b c") == 7
    assert seen[0].url.raw_path == b"/api/v1/jobs/a%2Fb%20c/run"
    assert seen[0].headers["Authorization"] == "Bearer jc_x"


def test_a_refusal_carries_the_servers_message_and_status() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/status"):
            return httpx.Response(502, text="<html>bad gateway</html>")
        return httpx.Response(409, json={"error": "ConflictError", "message": "job 'a': stale"})

    with Client("http://h:1", None, transport=httpx.MockTransport(answer)) as client:
        with pytest.raises(ApiError, match=r"^job 'a': stale$") as conflict:
            client.modify([{"job": "a", "version": 1, "fields": {"priority": 2}}])
        assert conflict.value.status == 409
        with pytest.raises(ApiError, match="HTTP 502: <html>bad gateway"):
            client.status()


def test_a_read_the_daemon_does_not_answer_is_not_said_to_have_maybe_taken_effect() -> None:
    """``jobcontrol status`` (or ``ls``, ``history``) of a daemon that does not answer (its
    database locked, or the daemon stopped by SIGSTOP): a read changes nothing, so the
    message must not ask the user to look whether it took effect, nor send them to
    ``jobcontrol status``, the very command that waited. A real socket that accepts and
    never answers."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with Client(f"http://127.0.0.1:{port}", None, timeout=0.3) as client:
            with pytest.raises(DaemonTimeoutError) as slow:
                client.status()
    message = str(slow.value)
    assert f"the daemon at http://127.0.0.1:{port} took the request" in message, message
    assert "did not answer within 0.3 s" in message, message
    assert "`jobcontrol daemon status` reads the database without it" in message, message
    assert "took effect" not in message, message
    assert "see `jobcontrol status`" not in message, message


def test_a_daemon_that_takes_a_request_and_does_not_answer_is_not_called_unreachable() -> None:
    """A daemon waiting on a locked database: it took the request, so whether the request
    took effect is unknown, and the message must not send the user looking for a daemon
    that is not running. A real socket that accepts and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        with Client(f"http://127.0.0.1:{port}", None, timeout=0.3) as client:
            with pytest.raises(DaemonTimeoutError) as slow:
                client.run_now("nap")
    message = str(slow.value)
    assert f"the daemon at http://127.0.0.1:{port} took the request" in message, message
    assert "did not answer within 0.3 s" in message, message
    assert "whether it took effect is not known" in message, message
    assert "cannot reach" not in message, message
    # Not sent to `jobcontrol status`, which asks the same daemon and waits as long.
    assert "`jobcontrol daemon status` reads the database without it" in message, message
    assert "see `jobcontrol status`" not in message, message

    # Nothing listening at all: that is unreachable, and says so.
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
    with Client(f"http://127.0.0.1:{port}", None, timeout=0.3) as client:
        with pytest.raises(DaemonUnreachableError, match="cannot reach the daemon") as gone:
            client.run_now("nap")
    assert not isinstance(gone.value, DaemonTimeoutError)


def test_server_sent_events_are_parsed_keepalives_skipped() -> None:
    text = (
        ": keepalive\n\n"
        'id: 3\nevent: job.created\ndata: {"jobs": [1]}\n\n'
        'event: resync\ndata: {"reason": "gap"}\n\n'
    )
    assert list(parse_sse(iter(text.splitlines()))) == [
        Event(3, "job.created", {"jobs": [1]}),
        Event(None, "resync", {"reason": "gap"}),
    ]


def test_a_database_keeps_its_token_file_whatever_its_password() -> None:
    from pathlib import Path

    from jobcontrol import places

    config = Path("/cfg")
    a = "postgresql+psycopg://jc:old@db.example:5432/jobs"
    assert places.database_identity(a) == "postgresql+psycopg://jc@db.example:5432/jobs"
    same = places.token_file(config, a)
    assert same == places.token_file(config, "postgresql+psycopg://jc:n%40w@db.example:5432/jobs")
    assert same == places.token_file(config, "postgresql+psycopg://jc@db.example:5432/jobs")
    others = {
        places.token_file(config, url)
        for url in (
            "postgresql+psycopg://jc:old@db.example:5432/other",
            "postgresql+psycopg://jc:old@db2.example:5432/jobs",
            "postgresql+psycopg://ops:old@db.example:5432/jobs",
            "sqlite:////var/lib/jobcontrol/jobs.db",
        )
    }
    assert same not in others
    assert len(others) == 4
    assert places.token_file(config, places.normalise_url("/tmp/x/../jobs.db")) == (
        places.token_file(config, "sqlite:////tmp/jobs.db")
    )
