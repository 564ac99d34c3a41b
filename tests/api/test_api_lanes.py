"""Lanes and the queue through the admin API, over a real dispatcher and its embedded worker.

Viewers see lanes and the queue; operators drain, resume and reprioritize;
admins add, change and remove lanes. Bad input is refused naming the lane (or
run) and the setting, changes nothing, and is audited like every change.
"""

from __future__ import annotations

from typing import Any

import pytest

from jobcontrol.model import RunState
from jobcontrol.service import audit
from tests.api.conftest import Api
from tests.integration.helpers import poll_until, task

pytestmark = pytest.mark.timeout(90)

LANES = "/api/v1/lanes"


def lanes(api: Api) -> dict[str, dict[str, Any]]:
    response = api.client.get(LANES, headers=api.headers("viewer"))
    assert response.status_code == 200, response.text
    return {x["name"]: x for x in response.json()["lanes"]}


def newest_audit(api: Api) -> audit.AuditEntry:
    return audit.list_entries(api.jc.store, limit=1)[0]


def test_admin_adds_and_sets_a_lane_and_the_viewer_sees_it(api_any: Api) -> None:
    api = api_any
    added = api.client.post(
        LANES, json={"name": "gpu", "max_slots": 2, "poll_interval_s": "1s"}, headers=api.headers()
    )
    assert added.status_code == 201, added.text
    assert (added.json()["max_slots"], added.json()["poll_interval_s"]) == (2, 1.0)
    changed = api.client.patch(
        f"{LANES}/gpu",
        json={"max_slots": None, "stale_timeout_s": "30m", "enabled": False},
        headers=api.headers(),
    )
    assert changed.status_code == 200, changed.text
    gpu = lanes(api)["gpu"]
    assert (gpu["max_slots"], gpu["stale_timeout_s"], gpu["state"]) == (None, 1800.0, "draining")
    assert gpu["updated_by"] == "admin-user"
    entry = newest_audit(api)
    assert (entry.user, entry.operation, entry.result, entry.jobs) == (
        "admin-user",
        "lane.set",
        "ok",
        ["gpu"],
    )


BAD = [
    ("PATCH", f"{LANES}/nope", {"max_slots": 1}, 404, "lane 'nope': no such lane"),
    ("PATCH", f"{LANES}/default", {"max_slots": 0}, 422, "max_slots must be at least 1, not 0"),
    ("PATCH", f"{LANES}/default", {"max_slots": -2}, 422, "max_slots must be at least 1, not -2"),
    ("PATCH", f"{LANES}/default", {"stale_timeout_s": "3x"}, 422, "cannot read '3x' as a duration"),
    ("PATCH", f"{LANES}/default", {"poll": "2s", "colour": "red"}, 422, "unknown setting 'colour'"),
    ("DELETE", f"{LANES}/default", None, 409, "the default lane cannot be removed"),
    ("POST", LANES, {"name": "bad name"}, 422, "a queue name has no spaces"),
    ("POST", LANES, {"name": "x" * 65}, 422, "a queue name has at most 64 characters"),
    ("PATCH", f"{LANES}/default", {"poll_interval_s": "9" * 100}, 422, "poll_interval_s"),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "message"), BAD)
def test_bad_input_is_refused_naming_the_lane_and_changes_nothing(
    api: Api, method: str, path: str, body: Any, status: int, message: str
) -> None:
    before = lanes(api)
    response = api.client.request(method, path, json=body, headers=api.headers())
    assert response.status_code == status, response.text
    assert message in response.json()["message"]
    assert lanes(api) == before, "nothing changed"
    entry = newest_audit(api)
    assert (entry.user, entry.result) == ("admin-user", "refused")
    assert message in entry.detail


def test_a_viewer_may_not_drain_nor_an_operator_set_a_lane(api: Api) -> None:
    before = lanes(api)
    drain = api.client.post(f"{LANES}/default/drain", headers=api.headers("viewer"))
    assert drain.status_code == 403
    assert "viewer" in drain.json()["message"]
    entry = newest_audit(api)
    assert (entry.user, entry.operation, entry.result) == (
        "viewer-user",
        "POST /api/v1/lanes/default/drain",
        "refused",
    )
    patch = api.client.patch(
        f"{LANES}/default", json={"max_slots": 3}, headers=api.headers("operator")
    )
    assert patch.status_code == 403
    assert newest_audit(api).user == "operator-user"
    assert lanes(api) == before


def test_drain_holds_a_run_queued_reprioritize_reorders_and_resume_runs_them(
    api_any: Api,
) -> None:
    api = api_any
    jc = api.jc
    op = api.headers("operator")
    jc.create(task("first", "true"), task("second", "true"))
    assert api.client.post(f"{LANES}/default/drain", headers=op).status_code == 200

    mark = jc.rec.mark()
    first, second = jc.run_now("first"), jc.run_now("second")
    queued = api.client.get("/api/v1/queue", headers=api.headers("viewer")).json()["lanes"]
    [default] = [x for x in queued if x["lane"] == "default"]
    assert [(r["run_id"], r["position"]) for r in default["runs"]] == [(first, 1), (second, 2)]
    assert lanes(api)["default"]["queued"] == 2

    moved = api.client.patch(f"/api/v1/runs/{second}/priority", json={"priority": 5}, headers=op)
    assert moved.status_code == 200, moved.text
    queued = api.client.get("/api/v1/queue?lane=default", headers=op).json()["lanes"]
    assert [r["run_id"] for r in queued[0]["runs"]] == [second, first]
    assert jc.run(first).state is RunState.QUEUED, "drained: still queued"

    assert api.client.post(f"{LANES}/default/resume", headers=op).status_code == 200
    jc.rec.run_finished("first", since=mark)
    jc.rec.run_finished("second", since=mark)
    assert jc.run(second).started is not None
    assert jc.run(first).state is RunState.SUCCEEDED

    again = api.client.patch(f"/api/v1/runs/{first}/priority", json={"priority": 1}, headers=op)
    assert again.status_code == 409
    assert f"run {first}: only a queued run can be reprioritized" in again.json()["message"]
    entry = newest_audit(api)
    assert (entry.operation, entry.result, entry.jobs) == ("run.reprioritize", "refused", ["first"])
    assert jc.run(first).priority == 0, "nothing changed"
    poll_until("the worker to hold nothing", lambda: not jc.engine.workers()[0]["runs"])


def test_removing_a_drained_lane_with_queued_runs_says_how_to_get_there(api_any: Api) -> None:
    """A drained lane's queued runs never start, so "remove it once they have ended"
    would never come: the refusal says what does end them."""
    api = api_any
    jc = api.jc
    added = api.client.post(LANES, json={"name": "gpu"}, headers=api.headers())
    assert added.status_code == 201, added.text
    jc.create(task("render", "true", queue="gpu"))
    assert api.client.post(f"{LANES}/gpu/drain", headers=api.headers()).status_code == 200
    mark = jc.rec.mark()
    queued = jc.run_now("render")
    before = lanes(api)

    refused = api.client.delete(f"{LANES}/gpu", headers=api.headers())
    assert refused.status_code == 409, refused.text
    said = refused.json()["message"]
    assert "it has 1 queued task run: it is drained, so its queued runs never start" in said
    assert "`jobcontrol queue --lane gpu`" in said, said
    assert "`jobcontrol lane resume gpu`" in said, said
    assert lanes(api) == before, "nothing changed"
    assert jc.run(queued).state is RunState.QUEUED

    # As it says: resumed, the run ends, and the lane goes.
    assert api.client.post(f"{LANES}/gpu/resume", headers=api.headers()).status_code == 200
    jc.rec.run_finished("render", since=mark)
    poll_until("the worker to hold nothing", lambda: not jc.engine.workers()[0]["runs"])
    removed = api.client.delete(f"{LANES}/gpu", headers=api.headers())
    assert removed.status_code in (200, 204), removed.text
    assert "gpu" not in lanes(api)
