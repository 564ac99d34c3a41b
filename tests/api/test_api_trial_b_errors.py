"""Error answers an outside trial (B) found wrong: a shutdown without a body, the order
of the role and size refusals, the permission a refusal names, echoed values, JSON
error positions, wording, and the answers uvicorn gives itself."""

from __future__ import annotations

import pytest

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
