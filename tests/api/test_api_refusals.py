"""What an outside trial of the admin API found: refusals before a body is read, values
that could forge a line of the audit trail, limits, and the audit trail for a viewer."""

from __future__ import annotations

import json
import socket
import threading
import time
from typing import Any

import httpx
import pytest

import jobcontrol.api.definitions as api_definitions
from jobcontrol.api.server import ApiServer
from jobcontrol.errors import BadUserNameError
from jobcontrol.service.audit import list_entries
from jobcontrol.service.users import add_user
from tests.api.conftest import Api
from tests.integration.helpers import box, poll_until, task

pytestmark = pytest.mark.timeout(60)

V1 = "/api/v1"


def _read_answer(sock: socket.socket, timeout: float) -> bytes:
    """The server's answer: its head, then the length its content-length says."""
    sock.settimeout(timeout)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(4096)
        if not chunk:
            return data
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(4096)
        if not chunk:
            break
        body += chunk
    return head + b"\r\n\r\n" + body


@pytest.mark.parametrize(
    ("path", "role"),
    [(f"{V1}/jobs", "viewer"), (f"{V1}/definitions", "operator"), (f"{V1}/jobs", "operator")],
)
def test_a_role_that_may_not_is_refused_before_the_body_it_never_sends(
    api: Api, path: str, role: str
) -> None:
    """A viewer that announced a body and sent one byte held the connection open for as
    long as it liked: a thousand such filled the API. It is answered 403 at once."""
    before = api.jc.dump()
    server = ApiServer(api.ctx, port=0)
    url = server.start()
    try:
        host, port = url.removeprefix("http://").rsplit(":", 1)
        sock = socket.create_connection((host, int(port)), timeout=10)
        token = api.tokens[role]
        sock.sendall(
            f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n"
            "Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{".encode()
        )
        started = time.monotonic()
        answer = _read_answer(sock, 10)
        assert answer.startswith(b"HTTP/1.1 403 "), answer[:200]
        assert time.monotonic() - started < 8
        message = json.loads(answer.partition(b"\r\n\r\n")[2])["message"]
        assert f"has role {role}, which may not" in message
        sock.close()
    finally:
        server.stop()
    (entry,) = list_entries(api.jc.store, user=f"{role}-user")
    assert (entry.operation, entry.result) == (f"POST {path}", "refused")
    assert api.jc.dump() == before


def test_a_refusal_before_the_body_still_names_the_jobs_the_body_names(api: Api) -> None:
    created = api.jc.create(box("Top"), task("t1", "true", "Top"))
    before = api.jc.dump()
    for path, body in [
        (f"{V1}/jobs/delete", {"jobs": ["Top", created["t1"]]}),
        (f"{V1}/jobs/activate", {"jobs": ["t1"]}),
        (f"{V1}/jobs", {"name": "fresh", "kind": "task", "command": "true"}),
    ]:
        r = api.client.post(path, json=body, headers=api.headers("viewer"))
        assert r.status_code == 403, r.text
    entries = list_entries(api.jc.store, user="viewer-user")
    assert [(e.operation, e.jobs) for e in reversed(entries)] == [
        (f"POST {V1}/jobs/delete", ["Top", "t1"]),
        (f"POST {V1}/jobs/activate", ["t1"]),
        (f"POST {V1}/jobs", ["fresh"]),
    ]
    run = api.client.post(f"{V1}/jobs/t1/run", headers=api.headers("viewer"))
    assert run.status_code == 403
    assert "which may not run jobs" in run.json()["message"]
    assert list_entries(api.jc.store, limit=1)[0].jobs == ["t1"]
    assert api.jc.dump() == before


def test_an_operators_refused_patch_lists_only_the_fields_it_may_not_change(api: Api) -> None:
    api.jc.create(task("t1", "true"))
    changes = [{"job": "t1", "fields": {"active": True, "description": "x"}}]
    r = api.client.patch(f"{V1}/jobs", json={"changes": changes}, headers=api.headers("operator"))
    assert r.status_code == 403
    assert r.json()["message"].endswith(
        "which may not modify jobs or settings (fields: description)"
    )


def test_a_body_announced_over_the_limit_is_a_json_413(api: Api) -> None:
    r = api.client.post(
        f"{V1}/jobs",
        content=b"{}",
        headers={**api.headers(), "Content-Length": str(11 * 1024 * 1024)},
    )
    assert r.status_code == 413
    body = r.json()
    assert body["error"] == "RequestEntityTooLarge"
    assert "the request body is 11534336 bytes; the API takes at most 10485760" in body["message"]


@pytest.mark.parametrize(
    "source",
    ["evil.yaml\n999  admin  user.add  ok", "x\x1b[2J.yaml", "tab\there"],
    ids=["line-break", "escape", "tab"],
)
def test_a_file_name_that_could_forge_an_audit_line_is_refused(api: Api, source: str) -> None:
    before = api.jc.dump()
    text = "jobs:\n  - name: inj\n    command: 'true'\n"
    r = api.client.post(
        f"{V1}/definitions", json={"text": text, "source": source}, headers=api.headers()
    )
    assert r.status_code == 422, r.text
    assert "must not contain control or line-break characters" in r.text
    assert api.jc.dump() == before


@pytest.mark.parametrize("name", [".", "..", "ln\x1b[31mRED", "a\u2028b"])
def test_a_lane_name_a_url_or_a_table_cannot_carry_is_refused(api: Api, name: str) -> None:
    r = api.client.post(f"{V1}/lanes", json={"name": name}, headers=api.headers())
    assert r.status_code == 422, r.text
    assert "a lane's name is a queue's" in r.json()["message"]
    lanes = api.client.get(f"{V1}/lanes", headers=api.headers()).json()["lanes"]
    assert [lane["name"] for lane in lanes] == ["default"]


def test_a_job_queue_no_lane_could_have_is_refused(api: Api) -> None:
    api.jc.create(task("t1", "true"))
    before = api.jc.dump()
    changes = [{"job": "t1", "fields": {"queue": "a/b"}}]
    r = api.client.patch(f"{V1}/jobs", json={"changes": changes}, headers=api.headers())
    assert r.status_code == 422
    assert "queue 'a/b': a queue name has no spaces, control characters or '/'" in r.text
    assert api.jc.dump() == before


@pytest.mark.parametrize("name", ["timer", "Timer", "jobdispatcher", "jobcontrol", "system"])
def test_a_user_may_not_take_a_name_job_control_writes_itself(api: Api, name: str) -> None:
    with pytest.raises(BadUserNameError, match="the name is Job Control's own"):
        add_user(api.jc.store, name, "admin")


def test_a_viewer_reads_the_audit_trail_a_page_at_a_time(api: Api) -> None:
    api.jc.create(task("t1", "true"))
    for description in ("a", "b", "c"):
        changes = [{"job": "t1", "fields": {"description": description}}]
        assert api.client.patch(
            f"{V1}/jobs", json={"changes": changes}, headers=api.headers()
        ).is_success
    everything = [e.as_dict() for e in list_entries(api.jc.store, limit=100)]
    first = api.client.get(f"{V1}/audit", params={"limit": 2}, headers=api.headers("viewer"))
    assert first.status_code == 200, first.text
    page = first.json()
    assert page["entries"] == everything[:2]
    rest = api.client.get(
        f"{V1}/audit", params={"limit": 50, "before": page["next"]}, headers=api.headers("viewer")
    ).json()
    assert rest["entries"] == everything[2:]
    assert rest["next"] is None
    mine = api.client.get(
        f"{V1}/audit", params={"user": "admin-user", "job": "t1"}, headers=api.headers("viewer")
    ).json()["entries"]
    assert [e["operation"] for e in mine] == ["jobs.modify"] * 3
    bad = api.client.get(f"{V1}/audit", params={"limit": 0}, headers=api.headers("viewer"))
    assert bad.status_code == 422


def test_a_load_with_replace_names_what_it_deleted_in_the_audit_trail(api: Api) -> None:
    first = "jobs:\n  - name: T\n    children:\n      - name: S1\n        children:\n" + (
        "          - {name: k1, command: 'true'}\n          - {name: k2, command: 'true'}\n"
    )
    assert api.client.post(
        f"{V1}/definitions", json={"text": first, "source": "t.yaml"}, headers=api.headers()
    ).is_success
    second = "jobs:\n  - name: T\n    children:\n      - name: S1\n        children:\n" + (
        "          - {name: k1, command: 'true'}\n"
    )
    r = api.client.post(
        f"{V1}/definitions",
        json={"text": second, "source": "t.yaml", "replace": True},
        headers=api.headers(),
    )
    assert r.json()["deleted"], r.text
    entry = list_entries(api.jc.store, limit=1)[0]
    assert "k2" in entry.jobs, entry
    assert [e.operation for e in list_entries(api.jc.store, job="k2")][0] == "definitions.load"


def test_exports_wait_their_turn_two_at_a_time(api: Api, monkeypatch: pytest.MonkeyPatch) -> None:
    """An export is Python end to end: forty at once kept the dispatcher from the
    interpreter for seconds. At most EXPORTS_AT_ONCE run together; the rest wait."""
    api.jc.create(box("Top"), *(task(f"t{i}", "true", "Top") for i in range(20)))
    real = api_definitions.export_definitions
    lock = threading.Lock()
    release = threading.Event()
    running, most = 0, 0

    def held(*args: Any, **kwargs: Any) -> str:
        """An export that waits for the test's word, so that all twelve are asked at once."""
        nonlocal running, most
        with lock:
            running += 1
            most = max(most, running)
        try:
            release.wait(30)
            return real(*args, **kwargs)
        finally:
            with lock:
                running -= 1

    monkeypatch.setattr(api_definitions, "export_definitions", held)
    server = ApiServer(api.ctx, port=0)
    url = server.start()
    try:
        answers: list[int] = []

        def one() -> None:
            r = httpx.get(f"{url}{V1}/definitions", headers=api.headers("viewer"), timeout=30)
            answers.append(r.status_code)

        threads = [threading.Thread(target=one) for _ in range(12)]
        for t in threads:
            t.start()

        def all_asked() -> bool:
            limiter = api.ctx.export_limiter
            return limiter is not None and limiter.statistics().tasks_waiting == 10

        poll_until("ten exports waiting for the two running", all_asked)
        assert (running, most) == (api_definitions.EXPORTS_AT_ONCE,) * 2
        release.set()
        for t in threads:
            t.join(30)
    finally:
        release.set()
        server.stop()
    assert answers == [200] * 12
    assert most == api_definitions.EXPORTS_AT_ONCE


def test_a_refused_request_with_a_long_path_is_audited_as_it_came(api_any: Api) -> None:
    """PostgreSQL kept the operation in 32 characters: a viewer's refused run of a job
    named ten characters or more, or any lane route, went unaudited."""
    api = api_any
    api.jc.create(task("nightly-backup", "true"))
    viewer = api.headers("viewer")
    for path in (f"{V1}/jobs/nightly-backup/run", f"{V1}/lanes/default/resume"):
        answer = api.client.post(path, headers=viewer)
        assert answer.status_code == 403, answer.text
    operations = [e.operation for e in list_entries(api.jc.store, user="viewer-user")]
    assert operations == [f"POST {V1}/lanes/default/resume", f"POST {V1}/jobs/nightly-backup/run"]


def test_a_lone_surrogate_is_refused_in_json_and_cannot_break_the_audit_pages(api: Api) -> None:
    """JSON may carry half of a surrogate pair escaped (``\\ud800``), which UTF-8 cannot
    encode: the 422 that repeated it answered a plain-text 500, and a viewer's refused
    request that named such a job made every audit page holding it a 500."""
    api.jc.create(task("t1", "true"))
    before = api.jc.dump()
    json_headers = {"Content-Type": "application/json"}
    refused = api.client.post(
        f"{V1}/jobs",
        content=b'{"name": "\\ud800x", "kind": "box"}',
        headers={**api.headers("viewer"), **json_headers},
    )
    assert refused.status_code == 403, refused.text
    invalid = api.client.patch(
        f"{V1}/jobs",
        content=b'{"changes": [{"job": "t1", "fields": {"description": "\\ud800"}}]}',
        headers={**api.headers(), **json_headers},
    )
    assert invalid.status_code == 422, invalid.text
    assert invalid.json()["error"] == "InvalidRequest"
    assert "description" in invalid.json()["message"]
    assert api.jc.dump() == before

    page = api.client.get(f"{V1}/audit", headers=api.headers("viewer"))
    assert page.status_code == 200, page.text
    entries = page.json()["entries"]
    assert [e["result"] for e in entries[:2]] == ["refused", "refused"]
    assert entries[1]["jobs"] == ["\\ud800x"]  # written out, as text


def test_run_kill_and_restart_of_an_unknown_job_are_audited_as_refused(api: Api) -> None:
    """Modify and delete of a job that is not there were audited; run, kill and restart
    were refused before their audit scope and left no entry."""
    for action in ("run", "kill", "restart"):
        answer = api.client.post(f"{V1}/jobs/nosuch/{action}", headers=api.headers())
        assert answer.status_code == 404, answer.text
        assert "nosuch" in answer.json()["message"]
    entries = list_entries(api.jc.store, user="admin-user")
    assert [(e.operation, e.jobs, e.result) for e in entries] == [
        ("job.restart", ["nosuch"], "refused"),
        ("job.kill", ["nosuch"], "refused"),
        ("job.run", ["nosuch"], "refused"),
    ]


@pytest.mark.parametrize(
    ("body", "words"),
    [
        (b'{"changes": [{"job": "t1", "fields": {"description": "\xff\xfe"}}]}', "not UTF-8"),
        (b"[" * 100_000, "nested too deeply"),
    ],
    ids=["not utf-8", "deep"],
)
def test_a_body_that_is_not_json_is_a_422_that_says_why(api: Api, body: bytes, words: str) -> None:
    api.jc.create(task("t1", "true"))
    before = api.jc.dump()
    answer = api.client.patch(
        f"{V1}/jobs", content=body, headers={**api.headers(), "Content-Type": "application/json"}
    )
    assert answer.status_code == 422, answer.text
    assert words in answer.json()["message"]
    assert api.jc.dump() == before


def test_a_chunked_body_past_the_limit_is_told_the_limit(api: Api) -> None:
    """Without a Content-Length the body is stopped at the limit as it comes: the 413 said
    only "Content Too Large"."""

    def chunks() -> Any:
        piece = b" " * (1024 * 1024)
        for _ in range(11):
            yield piece

    answer = api.client.patch(
        f"{V1}/jobs",
        content=chunks(),
        headers={**api.headers(), "Content-Type": "application/json"},
    )
    assert answer.status_code == 413, answer.text
    assert "the API takes at most 10485760 (10 MiB)" in answer.json()["message"]


def test_a_refused_lane_request_names_no_job(api: Api) -> None:
    """A refused POST /lanes recorded its lane among the trail's jobs; other lane routes
    did not: the path names the lane, the jobs are jobs."""
    body = {"name": "gpu", "cap": 2}
    answer = api.client.post(f"{V1}/lanes", json=body, headers=api.headers("viewer"))
    assert answer.status_code == 403, answer.text
    [entry] = list_entries(api.jc.store, user="viewer-user")
    assert (entry.operation, entry.jobs) == (f"POST {V1}/lanes", [])
