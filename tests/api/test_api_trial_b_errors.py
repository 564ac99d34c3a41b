"""Error answers an outside trial (B) found wrong: a shutdown without a body, the order
of the role and size refusals, the permission a refusal names, echoed values, JSON
error positions, wording, and the answers uvicorn gives itself."""

from __future__ import annotations

import json
import logging
import socket

import httpx
import pytest
from fastapi.testclient import TestClient

from jobcontrol.api.server import ApiServer
from jobcontrol.service.audit import list_entries
from tests.api.conftest import Api
from tests.integration.helpers import task

pytestmark = pytest.mark.timeout(60)

V1 = "/api/v1"


@pytest.mark.parametrize("body", [None, b"null", b""], ids=["none", "null", "empty"])
def test_a_shutdown_without_a_body_is_one_without_force(api: Api, body: bytes | None) -> None:
    headers = {**api.headers(), "Content-Type": "application/json"} if body else api.headers()
    r = api.client.post(f"{V1}/shutdown", content=body, headers=headers)
    assert r.status_code == 202, r.text
    assert r.json() == {"shutting_down": True, "force": False}
    assert api.shutdown_requests == [False]


def test_a_shutdown_without_a_body_is_still_refused_while_a_job_runs(api: Api) -> None:
    api.jc.create(task("sleeper", "sleep 1000"))
    mark = api.jc.rec.mark()
    api.jc.run_now("sleeper")
    api.jc.rec.wait_for(lambda s: s.name == "run_started", since=mark)
    r = api.client.post(f"{V1}/shutdown", headers=api.headers())
    assert r.status_code == 409, r.text
    assert r.json()["jobs"] == ["sleeper"]
    assert api.shutdown_requests == []


def test_a_forbidden_request_announcing_a_huge_body_is_403_and_audited(api: Api) -> None:
    before = api.jc.dump()
    r = api.client.post(
        f"{V1}/jobs",
        content=b"{}",
        headers={
            **api.headers("operator"),
            "Content-Type": "application/json",
            "Content-Length": "20000000",
        },
    )
    assert r.status_code == 403, r.text
    assert "has role operator, which may not create jobs" in r.json()["message"]
    (entry,) = list_entries(api.jc.store, user="operator-user")
    assert (entry.operation, entry.result) == (f"POST {V1}/jobs", "refused")
    assert api.jc.dump() == before


def test_an_operators_shutdown_is_refused_naming_stopping_the_daemon(api: Api) -> None:
    r = api.client.post(f"{V1}/shutdown", headers=api.headers("operator"))
    assert r.status_code == 403, r.text
    message = r.json()["message"]
    assert message == "user 'operator-user' has role operator, which may not stop the daemon"
    (entry,) = list_entries(api.jc.store, user="operator-user")
    assert (entry.operation, entry.result, entry.detail) == (
        f"POST {V1}/shutdown",
        "refused",
        message,
    )
    assert api.shutdown_requests == []


def test_no_refusal_message_runs_past_4000_characters(api: Api) -> None:
    before = api.jc.dump()
    r = api.client.post(f"{V1}/definitions", json={"text": "a" * 20000}, headers=api.headers())
    assert r.status_code == 422, r.text
    body = r.json()
    for key in ("message", "reason"):
        assert len(body[key]) <= 4000, (key, len(body[key]))
        assert body[key].endswith(" more characters)"), body[key][-60:]
    assert api.jc.dump() == before


def test_a_malformed_batch_message_is_at_most_4000_characters(api: Api) -> None:
    changes = [{"job": "t", "fields": {f"unknown_{'x' * 150}_{i}": 1}} for i in range(60)]
    r = api.client.patch(f"{V1}/jobs", json={"changes": changes}, headers=api.headers())
    assert r.status_code == 422, r.text
    message = r.json()["message"]
    assert len(message) <= 4000
    assert message.startswith("changes.0.fields.unknown_")


def test_a_bad_last_event_id_is_echoed_cut_to_200_characters(api: Api) -> None:
    r = api.client.get(f"{V1}/events", headers={**api.headers(), "Last-Event-ID": "x" * 5000})
    assert r.status_code == 422, r.text
    message = r.json()["message"]
    assert "x" * 201 not in message
    assert "... (4802 more characters)" in message, message


@pytest.mark.parametrize("setting", ["max_slots", "enabled", "poll_interval_s"])
def test_a_bad_lane_setting_is_echoed_cut_to_200_characters(api: Api, setting: str) -> None:
    r = api.client.post(
        f"{V1}/lanes", json={"name": "gpu", setting: "y" * 1000}, headers=api.headers()
    )
    assert r.status_code == 422, r.text
    message = r.json()["message"]
    assert "y" * 201 not in message, message
    assert "more characters)" in message, message
    lanes = api.client.get(f"{V1}/lanes", headers=api.headers()).json()["lanes"]
    assert "gpu" not in [lane["name"] for lane in lanes]


def _patch_raw(api: Api, raw: bytes) -> str:
    headers = {**api.headers(), "Content-Type": "application/json"}
    r = api.client.patch(f"{V1}/jobs", content=raw, headers=headers)
    assert r.status_code == 422, r.text
    message: str = r.json()["message"]
    return message


@pytest.mark.parametrize("constant", ["NaN", "-Infinity"])
def test_a_json_nan_is_refused_saying_where_it_is(api: Api, constant: str) -> None:
    api.jc.create(task("t1", "true"))
    before = api.jc.dump()
    text = '{"changes":[{"job":"NaN","fields":{"priority":' + constant + "}}]}"
    message = _patch_raw(api, text.encode())
    at = text.index(constant, text.index("priority"))
    assert message == (
        f"body: not valid JSON at character {at}: "
        f"{constant} is not JSON (RFC 8259 has no such number)"
    )
    assert api.jc.dump() == before


def test_invalid_utf8_is_refused_saying_where_it_is(api: Api) -> None:
    raw = '{"changes":[{"job":"é'.encode() + b"\xff" + b'","fields":{}}]}'
    message = _patch_raw(api, raw)
    assert message == "body: not valid JSON at character 21: not UTF-8 (byte 0xff at byte 22)"


def test_too_deep_a_nesting_is_refused_without_a_made_up_position(api: Api) -> None:
    message = _patch_raw(api, b"[" * 100_000 + b"]" * 100_000)
    assert message == (
        "body: not valid JSON: nested too deeply (arrays and objects inside each other)"
    )


def _patch_json(api: Api, body: object) -> str:
    return _patch_raw(api, json.dumps(body).encode())


def test_a_lone_surrogate_as_a_job_is_refused_without_pydantic_internals(api: Api) -> None:
    message = _patch_json(api, {"changes": [{"job": "\ud800", "fields": {}}]})
    assert message == (
        "changes.0.job: Input should be a valid integer or must be text: "
        "a lone UTF-16 surrogate (\\u escape) is not a character"
    )


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (
            {"changes": [{"job": [1], "fields": {"timeout": [1]}}]},
            "changes.0.job: Input should be a valid integer or a valid string; "
            "changes.0.fields.timeout: Input should be a valid number or a valid string",
        ),
        (
            {"changes": [{"job": 0, "fields": {"env": {"A-B": 1}}}]},
            "changes.0.job: Input should be greater than or equal to 1 or a valid string; "
            "changes.0.fields.env.A-B: Input should be a valid string",
        ),
    ],
)
def test_a_value_no_member_of_a_union_takes_is_one_problem_in_words(
    api: Api, body: object, message: str
) -> None:
    assert _patch_json(api, body) == message


def test_an_unknown_route_is_a_404_naming_its_path(api: Api) -> None:
    r = api.client.get(f"{V1}/nowhere", headers=api.headers("viewer"))
    assert r.status_code == 404
    assert r.json()["error"] == "NotFound"
    assert r.json()["message"] == (
        "no route /api/v1/nowhere in this API (its routes: /api/v1/openapi.json)"
    )


def test_a_method_a_route_does_not_take_is_a_405_naming_it(api: Api) -> None:
    r = api.client.delete(f"{V1}/status", headers=api.headers())
    assert r.status_code == 405
    assert r.json()["error"] == "MethodNotAllowed"
    assert r.json()["message"] == "method DELETE is not allowed on /api/v1/status; it takes GET"


@pytest.mark.parametrize("value", ["abc", "-5"])
def test_a_bad_last_event_id_is_an_invalid_request_as_every_422(api: Api, value: str) -> None:
    r = api.client.get(f"{V1}/events", headers={**api.headers(), "Last-Event-ID": value})
    assert r.status_code == 422
    assert r.json()["error"] == "InvalidRequest"
    assert "Last-Event-ID" in r.json()["message"]


def _connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return socket.create_connection((host, int(port)), timeout=10)


def _read_until_closed(sock: socket.socket, timeout: float) -> bytes:
    sock.settimeout(timeout)
    data = b""
    while chunk := sock.recv(4096):
        data += chunk
    return data


def _json_answer(answer: bytes, status: int) -> dict[str, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 %d " % status), answer[:300]
    assert b"content-type: application/json" in head.lower(), head
    parsed: dict[str, str] = json.loads(body)
    return parsed


MALFORMED = [
    b"NOT A REQUEST LINE\r\n\r\n",
    b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: abc\r\n\r\n",
    b"POST /api/v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
    b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\nBad Header: y\r\n\r\n",
]


def test_malformed_http_is_a_json_400_logged_at_most_once_a_minute(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    server = ApiServer(api.ctx, port=0)
    url = server.start()
    caplog.set_level(logging.WARNING)
    try:
        for raw in MALFORMED * 3:
            sock = _connect(url)
            sock.sendall(raw)
            body = _json_answer(_read_until_closed(sock, 10), 400)
            assert body["error"] == "BadRequest"
            assert body["message"].startswith("the request is not valid HTTP/1.1")
            sock.close()
    finally:
        server.stop()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "Invalid HTTP request received." not in lines
    said = [line for line in lines if "Invalid HTTP request received." in line]
    assert said == [
        "the admin API: Invalid HTTP request received. (1 so far; said at most once a minute)"
    ]


def test_an_unsupported_upgrade_is_logged_at_most_once_a_minute(
    api: Api, caplog: pytest.LogCaptureFixture
) -> None:
    server = ApiServer(api.ctx, port=0)
    url = server.start()
    caplog.set_level(logging.WARNING)
    try:
        for _ in range(5):
            r = httpx.get(
                f"{url}/healthz", headers={"Connection": "upgrade", "Upgrade": "h2c"}, timeout=10
            )
            assert r.status_code in (200, 503)
    finally:
        server.stop()
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert [line for line in lines if "upgrade" in line.lower() or "WebSocket" in line] == [
        "the admin API: Unsupported upgrade request. (1 so far; said at most once a minute)"
    ]


def test_a_header_timeout_is_a_json_408(api: Api) -> None:
    server = ApiServer(api.ctx, port=0, header_timeout=0.5)
    url = server.start()
    try:
        sock = _connect(url)
        sock.sendall(b"GET /api/v1/status HTTP/1.1\r\nHost: x\r\n")
        body = _json_answer(_read_until_closed(sock, 10), 408)
        assert body == {
            "error": "RequestTimeout",
            "message": "the request line and headers did not all arrive within 0.5s "
            "(the server's --api-header-timeout)",
        }
        sock.close()
    finally:
        server.stop()


def test_a_bug_is_a_json_500_and_changes_nothing(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> set[str]:
        raise RuntimeError("injected")

    monkeypatch.setattr(api.ctx.engine, "trees_a_stop_ends", broken)
    client = TestClient(api.client.app, raise_server_exceptions=False)
    r = client.post(f"{V1}/shutdown", headers=api.headers())
    assert r.status_code == 500
    assert r.headers["content-type"] == "application/json"
    assert r.json() == {
        "error": "InternalServerError",
        "message": "the daemon failed to answer POST /api/v1/shutdown: RuntimeError "
        "(a bug; the daemon's log has the traceback)",
    }
    assert api.shutdown_requests == []
