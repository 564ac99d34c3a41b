"""What the admin client's Workers & Lanes panel needs of the API besides the lane routes.

``GET /whoami`` says the token's role and what it may do (the panel disables what the
role may not use); a lane change is a ``lane.changed`` event on the live stream (the
panel follows other clients' drains without polling for them).
"""

from __future__ import annotations

import pytest

from tests.api.conftest import Api

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize(
    ("role", "may", "may_not"),
    [
        ("viewer", {"read", "workers:view"}, {"workers:manage", "lanes:configure", "run"}),
        ("operator", {"workers:view", "workers:manage", "kill"}, {"lanes:configure", "modify"}),
        ("admin", {"workers:manage", "lanes:configure", "manage_users"}, set()),
    ],
)
def test_whoami_names_the_role_and_its_permissions(
    api: Api, role: str, may: set[str], may_not: set[str]
) -> None:
    r = api.client.get("/api/v1/whoami", headers=api.headers(role))
    assert r.status_code == 200, r.text
    body = r.json()
    assert (body["name"], body["role"]) == (f"{role}-user", role)
    assert may <= set(body["permissions"])
    assert not may_not & set(body["permissions"])


def test_whoami_without_a_token_is_refused(api: Api) -> None:
    r = api.client.get("/api/v1/whoami")
    assert r.status_code == 401, r.text


def test_lane_changes_are_events_on_the_stream(api: Api) -> None:
    log = api.ctx.eventlog
    seq0 = log.last_seq
    h = api.headers("admin")
    assert api.client.post("/api/v1/lanes", json={"name": "gpu"}, headers=h).status_code == 201
    assert api.client.post("/api/v1/lanes/gpu/drain", headers=h).status_code == 200
    assert api.client.post("/api/v1/lanes/gpu/resume", headers=h).status_code == 200
    patched = api.client.patch("/api/v1/lanes/gpu", json={"max_slots": 2}, headers=h)
    assert patched.status_code == 200, patched.text
    assert api.client.delete("/api/v1/lanes/gpu", headers=h).status_code == 200
    # A refused change is no change: no event.
    bad = api.client.patch("/api/v1/lanes/gpu", json={"max_slots": 1}, headers=h)
    assert bad.status_code == 404, bad.text
    lane_events = [e for e in log.since(seq0) if e.type == "lane.changed"]
    assert [e.data for e in lane_events] == [{"names": ["gpu"]}] * 5
